""" The models: importing this package registers them with timm (``sa_*_cifar``, ``resnet18_cifar``)

Layering (layers -> models -> tools -> scripts, checked by ``tests/test_structure.py``): models import only
:mod:`sa_vision.layers`, each other and the constants of :mod:`sa_vision.paper`, never a tool (Hub, checkpoints,
training, analysis, ...).
"""
from .param_groups import param_groups_pos_lr, positional_parameter_names
from .resnet_cifar import CifarResNet
from .sa_cifar import SA_MODEL_ARGS, SelfAttentionBlock, SelfAttentionNet, check_image_shape
