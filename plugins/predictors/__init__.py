from plugins.predictors import basic  # noqa: F401
