"""Dataset plugins: importing this package registers every built-in dataset."""

from plugins.datasets import fashion_mnist, synthetic  # noqa: F401  (registration side effects)
