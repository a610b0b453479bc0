"""Built-in plugins. Importing this package declares every built-in model, dataset, scheduler,
compressor, predictor and transport (framework.registry.declare): names, schemas and docs, no
torch; each plugin's code is imported when it is first built."""

from plugins import compressors, datasets, models, predictors, schedulers, transports  # noqa: F401
