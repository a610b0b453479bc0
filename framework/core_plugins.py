"""The core's own plugins: the runtimes, the in-process transport and the trackers.

They are declarations here, as data, which `framework.registry.load_plugins` declares before any
installed plugin's: the modules behind them register nothing themselves, so the registry names
them without importing a module that imports the registry back. Each one's code is imported when
it is first built, as for every declared plugin (`framework.registry.declare`).
"""

from __future__ import annotations

from framework.config.schemas import TrackingConfig, TransportConfig
from framework.runtime.configs import LocalConfig, RemoteConfig, SimConfig

# (group, name, "module:attr", schema, its line in `--plugins`)
CORE_PLUGINS = (
    ("runtime", "sim", "framework.runtime.sim:SimRuntime", SimConfig, "Runs role programs on the virtual clock."),
    ("runtime", "local", "framework.runtime.local:LocalRuntime", LocalConfig, "One OS process per role on this machine, over a real transport (transport=mqtt)."),
    ("runtime", "remote", "framework.runtime.local:RemoteRuntime", RemoteConfig, "Roles join from other machines: `python -m framework.worker role=<name> ...`."),
    ("transport", "inproc", "framework.runtime:InprocTransport", TransportConfig, "In-process delivery: the simulator's link models price every message."),
    ("tracking", "mlflow", "framework.tracking.recorder:mlflow_tracker", TrackingConfig, "MLflow on a SQLite store; metrics batched."),
    ("tracking", "none", "framework.tracking.tracker:NullTracker", TrackingConfig, "No tracking (the run still writes summary.json and its artifacts to the run directory)."),
)
