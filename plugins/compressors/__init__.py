from plugins.compressors import none  # noqa: F401
