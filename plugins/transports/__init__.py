"""Network transports for the real runtimes (`runtime=local`, `runtime=remote`)."""

from plugins.transports import mqtt  # noqa: F401
