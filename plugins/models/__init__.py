"""Built-in model zoo. Importing this package registers every model family.

Each module registers factories `f(cfg, input_shape, num_classes) -> [(unit_name, nn.Module)]`:
one entry per partitionable unit, in the granularity the papers split at.
"""

from plugins.models import har_cnn, lenet, mlp, mobilenet, resnet, vgg  # noqa: F401  (registration)

__all__ = ["har_cnn", "lenet", "mlp", "mobilenet", "resnet", "vgg"]
