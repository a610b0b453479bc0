from plugins.schedulers import classic, collaborative, sl  # noqa: F401
