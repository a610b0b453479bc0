from plugins.schedulers import classic  # noqa: F401
