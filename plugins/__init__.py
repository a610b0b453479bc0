"""Built-in plugins. Importing this package registers every built-in model, dataset, cluster,
scheduler, compressor, predictor, transport, runtime and tracker."""

from plugins import compressors, datasets, models, predictors, schedulers, transports  # noqa: F401
