"""Built-in datasets, declared (framework.registry.declare): the code is imported when a dataset
is built."""

from framework.registry import declare
from plugins.datasets.schemas import FashionMnistConfig, SyntheticCifar10Config, SyntheticHarConfig, SyntheticMnistConfig

declare("dataset", "fashion_mnist", "plugins.datasets.fashion_mnist:fashion_mnist", schema=FashionMnistConfig,
        doc="Real Fashion-MNIST (1x28x28, 10 classes) from IDX files in `root`.")
declare("dataset", "synthetic_cifar10", "plugins.datasets.synthetic:synthetic_cifar10", schema=SyntheticCifar10Config,
        doc="CIFAR10-shaped class-conditional smooth patterns (3x32x32, 10 classes).", keywords=("inputs",))
declare("dataset", "synthetic_har", "plugins.datasets.synthetic:synthetic_har", schema=SyntheticHarConfig,
        doc="HAR-like multichannel sinusoids with class-specific frequency/phase/amplitude (9x128, 6 classes).", keywords=("inputs",))
declare("dataset", "synthetic_mnist", "plugins.datasets.synthetic:synthetic_mnist", schema=SyntheticMnistConfig,
        doc="MNIST-shaped class-conditional smooth patterns (1x28x28, 10 classes).", keywords=("inputs",))
