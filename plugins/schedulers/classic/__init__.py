"""The classic pipeline schedules a researcher compares: GPipe, 1F1B, PipeDream, and one device
(the reference loop). Each is a program of forward/backward actions per stage
(framework.pipeline.scheduler); this package declares them."""

from framework.registry import declare
from plugins.schedulers.classic.schema import GPipeConfig, LocalConfig, OneFOneBConfig, PipeDreamConfig

declare("scheduler", "1f1b", "plugins.schedulers.classic.schedules:OneFOneB", schema=OneFOneBConfig,
        doc="1F1B with a flush (PipeDream-flush / DAPPLE): GPipe's bubble, at most S micro-batches alive.")
declare("scheduler", "gpipe", "plugins.schedulers.classic.schedules:GPipe", schema=GPipeConfig,
        doc="GPipe: every forward, then every backward, then one synchronous step (Huang et al. 2019).")
declare("scheduler", "local", "plugins.schedulers.classic.schedules:Local", schema=LocalConfig,
        doc="One device, the reference loop: gradient accumulation over micro-batches, one step.")
declare("scheduler", "pipedream", "plugins.schedulers.classic.schedules:PipeDream", schema=PipeDreamConfig,
        doc="PipeDream: asynchronous 1F1B over whole mini-batches with weight stashing (Narayanan et al. 2019).")
