from plugins.compressors import accept_codecs, ef_codecs, presets  # noqa: F401
