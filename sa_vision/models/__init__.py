""" The models: importing this package registers them with timm (``sa_*_cifar``, ``resnet18_cifar``) """
from .param_groups import param_groups_pos_lr, positional_parameter_names
from .resnet_cifar import CifarResNet
from .sa_cifar import SA_MODEL_ARGS, SelfAttentionBlock, SelfAttentionNet, check_image_shape

__all__ = ['param_groups_pos_lr', 'positional_parameter_names', 'CifarResNet', 'SA_MODEL_ARGS', 'SelfAttentionBlock',
           'SelfAttentionNet', 'check_image_shape']
