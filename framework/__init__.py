"""pipelab's core: config schemas, registry, runtimes, devices and links, stages, wire format,
tracking and the CLI. It knows no paper; plugins register the concrete components."""

__version__ = "0.1.0"

from framework.config import schemas as _config  # noqa: F401  (stores the base schemas in Hydra's ConfigStore)
