"""Built-in model zoo, declared (framework.registry.declare): the code is imported when a model
is built.

Each factory is `f(cfg, input_shape, num_classes) -> [(unit_name, nn.Module)]`: one entry per
partitionable unit, in the granularity the papers split at.
"""

from framework.registry import declare
from plugins.models.schemas import ConvNetConfig, HARCNNConfig, LeNetConfig, MLPConfig, MobileNetV2Config, MobileNetV3SmallConfig, ResNet18Config, ResNet50Config, VGG5Config

declare("model", "convnet", "plugins.models.convnet:convnet", schema=ConvNetConfig, doc="ConvNet (AdaLearner; Caffe cifar10_full): three 5x5 convs with pooling and LRN, fc-X.")
declare("model", "har_cnn", "plugins.models.har_cnn:har_cnn", schema=HARCNNConfig, doc="HAR CNN (AccEPT): two 1-D convs, max-pool, two dense layers.")
declare("model", "lenet", "plugins.models.lenet:lenet", schema=LeNetConfig, doc="LeNet-5: conv6-5, conv16-5, fc120, fc84, fc-X.")
declare("model", "mlp", "plugins.models.mlp:mlp", schema=MLPConfig, doc="MLP: fc0 (flatten + Linear + ReLU), fc1..fc{depth-2}, head.")
declare("model", "mobilenetv2", "plugins.models.mobilenet:mobilenetv2", schema=MobileNetV2Config,
        doc="MobileNetV2 (AccEPT): stem, 17 inverted residuals, conv1x1-1280, classifier; 20 units.")
declare("model", "mobilenetv3_small", "plugins.models.mobilenet:mobilenetv3_small", schema=MobileNetV3SmallConfig,
        doc="MobileNetV3-Small (PiPar): CONV-3-16, 11 bnecks, CONV-1-576, CONV-1-1024, FC-X; 15 units.")
declare("model", "resnet18", "plugins.models.resnet:resnet18", schema=ResNet18Config,
        doc="ResNet-18 (PiPar): stem, 8 BasicBlocks (64, 64, 128, 128, 256, 256, 512, 512), FC-X.")
declare("model", "resnet50", "plugins.models.resnet:resnet50", schema=ResNet50Config,
        doc="ResNet-50 (feature replay): stem, 16 Bottlenecks, average pool, FC-X; 19 units.")
declare("model", "vgg5", "plugins.models.vgg:vgg5", schema=VGG5Config, doc="VGG-5 (PiPar): three 3x3 convs and two dense layers, 5 units.")
