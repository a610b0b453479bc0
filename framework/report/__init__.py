"""`python -m framework.report <sweep folder | run folder | MLflow experiment>`: a report of runs
as Markdown and PNGs (the runs table, epoch time against the swept params, accuracy per epoch,
bytes per link). See framework/report/cli.py for the command, sources.py for what it reads.
"""
