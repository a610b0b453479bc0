"""Tracking and sweeps: a run's MLflow run (`tracker`) written by a recorder process beside it
(`recorder`, `store`), a sweep's parent run and its comparison (`multirun`, `sweep_summary`,
`comparison`, `objective`), and what an interrupted run leaves behind (`faults`).
Light to import: the CLI reaches it before torch."""
