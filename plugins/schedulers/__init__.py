from plugins.schedulers import classic, collaborative  # noqa: F401
