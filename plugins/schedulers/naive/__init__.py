"""Naive model parallelism, the baseline of the GPipe paper (Huang et al. 2019, Fig. 2b): the
model is cut into stages on S devices, and one micro-batch at a time goes forward through every
stage and backward again before the next one starts, so only one device works at any moment.

This package is the worked example of docs/tutorial_add_a_system.md: a system is one folder
under plugins/schedulers/ (plugins/schedulers/__init__.py imports every package), one YAML in
conf/scheduler/ and its test. Declaring, rather than importing, keeps `--help`, `--plugins` and
composing a config free of torch: the schedule's module is imported when a run builds it."""

from framework.registry import declare
from plugins.schedulers.naive.schema import NaiveConfig

declare("scheduler", "naive", "plugins.schedulers.naive.schedule:Naive", schema=NaiveConfig,
        doc="Naive model parallelism (GPipe's baseline): one micro-batch at a time through every stage, forward then backward; bubble (S-1)/S.")
