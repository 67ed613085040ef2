""" ResNet18 for CIFAR (the paper's convolutional baseline, Sec. 4.1; He et al., https://arxiv.org/abs/1512.03385)

timm's ResNet (BasicBlocks 64/128/256/512, strides 1/2/2/2) with the CIFAR stem: 3x3 stride-1 conv, BN, ReLU, no
max-pool.
"""
from typing import Any, Dict, Optional, Sequence, Union

import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.resnet import BasicBlock, ResNet
from torch import Tensor, nn

from ..errors import UserError
from ..layers import check_image_shape
from ..paper import CIFAR10_CLASSES, CIFAR10_LABEL_NAMES, CIFAR10_MEAN, CIFAR10_STD
from ._pretrained import PRETRAINED_TAG, explain_unavailable_weights, published_source
from .input_pad import create_input_pad

__all__ = ['CifarResNet', 'InputPadConv2d', 'infer_cifar_resnet_args']

# plain torch.fx keeps the input check as one call, as timm's FX tracer does (register_notrace_function): its
# branches on the input's shape cannot be traced
torch.fx.wrap('check_image_shape')

# the ImageNet stem (7x7 stride 2 + max-pool) reduces by 4 before the first stage; this one by 1
_IMAGENET_STEM_REDUCTION = 4


class InputPadConv2d(nn.Conv2d):
    """A convolution that first adds the model's input border (``sa_vision.models.input_pad``); its state dict is
    the plain ``nn.Conv2d``'s."""

    def __init__(self, input_pad: nn.Module, *args: Any, **kwargs: Any):
        """
        Args:
            input_pad: The border added to the input first (an ``InputPad``).
            *args: ``nn.Conv2d``'s positional arguments.
            **kwargs: ``nn.Conv2d``'s keyword arguments.
        """
        super().__init__(*args, **kwargs)
        self.input_pad = input_pad

    def forward(self, x: Tensor) -> Tensor:
        # the border would broadcast one channel to in_channels: check the shape passed first
        check_image_shape(x, self.in_channels, even=False)
        return self._conv_forward(self.input_pad(x), self.weight, self.bias)


class CifarResNet(ResNet):
    """timm ResNet whose stem keeps the input resolution: 3x3 stride-1 conv, BN, ReLU, no max-pool.

    The stem has 64 channels whatever ``stem_width`` says: timm's plain stem is 64 channels and its ``stem_width``
    sizes only the deep stems, which this stem replaces (``stem_type`` other than '' is refused). ``stem_width`` is
    accepted for timm compatibility and for old exports whose config.json holds it; ``channels`` sets the stages.

    ``input_padding`` pixels filled with ``input_pad_value`` per channel are added around the (normalised) input
    first, as in :class:`sa_vision.models.SelfAttentionNet` (``sa_vision.models.input_pad``).
    """

    def __init__(self, *, in_chans: int = 3, output_stride: int = 32, stem_type: str = '',
                 replace_stem_pool: bool = False, input_padding: int = 0,
                 input_pad_value: Union[float, Sequence[float]] = 0., device=None, dtype=None, **kwargs: Any):
        """
        Args:
            in_chans: Image channels.
            output_stride: Only 32, timm's default (the network reduces by 8 in all).
            stem_type: Only '', timm's plain stem (the CIFAR stem replaces it; timm's deep stems are refused).
            replace_stem_pool: Only False: the CIFAR stem has no pool for timm to replace with a strided conv.
            input_padding: Pixels added on every side of the (normalised) input before the stem.
            input_pad_value: Their value, one number or one per channel.
            **kwargs: timm ``ResNet``'s arguments (``block``, ``layers``, ``num_classes``, ...).
        """
        if output_stride != 32:
            raise UserError('CifarResNet supports only output_stride=32 (the network reduces by 8 in all)')
        if stem_type:
            raise UserError(f"CifarResNet has no stem_type {stem_type!r}: its CIFAR stem (one 3x3 stride-1 conv of "
                             f"64 channels) replaces timm's stems; leave stem_type at ''")
        if replace_stem_pool:
            raise UserError("CifarResNet has no stem pool to replace (its stem keeps the input resolution, no "
                             "max-pool): leave replace_stem_pool at False")
        super().__init__(in_chans=in_chans, device=device, dtype=dtype, **kwargs)
        stem_width = self.conv1.out_channels
        conv_args = dict(kernel_size=3, stride=1, padding=1, bias=False, device=device, dtype=dtype)
        if input_padding:  # the border goes into the stem: forward_features and forward_intermediates stay timm's
            self.conv1 = InputPadConv2d(
                create_input_pad(input_padding, input_pad_value, in_chans, device=device, dtype=dtype),
                in_chans, stem_width, **conv_args)
        else:
            self.conv1 = nn.Conv2d(in_chans, stem_width, **conv_args)
        nn.init.kaiming_normal_(self.conv1.weight, mode='fan_out', nonlinearity='relu')
        self.maxpool = nn.Identity()
        for info in self.feature_info:
            info['reduction'] = max(1, info['reduction'] // _IMAGENET_STEM_REDUCTION)


def infer_cifar_resnet_args(state_dict: Dict[str, Tensor]) -> Optional[Dict[str, Any]]:
    """``in_chans`` and ``num_classes`` of :class:`CifarResNet` weights, read off the stem and the classifier, or
    None where the state dict is not of a ResNet (no stem ``conv1``, no classifier ``fc``) or not of this one."""
    if 'conv1.weight' not in state_dict or 'fc.weight' not in state_dict:
        return None
    if tuple(state_dict['conv1.weight'].shape[-2:]) != (3, 3):  # timm's ImageNet ResNets: the same names, a 7x7 stem
        return None
    return {'in_chans': int(state_dict['conv1.weight'].shape[1]), 'num_classes': int(state_dict['fc.weight'].shape[0])}


def _create_cifar_resnet(variant: str, pretrained: bool = False, **kwargs) -> CifarResNet:
    with explain_unavailable_weights(variant, pretrained, kwargs.get('pretrained_cfg'),
                                     kwargs.get('pretrained_cfg_overlay'), kwargs.get('cache_dir')):
        return build_model_with_cfg(CifarResNet, variant, pretrained, **kwargs)


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        'num_classes': CIFAR10_CLASSES, 'label_names': CIFAR10_LABEL_NAMES,
        'input_size': (3, 32, 32), 'pool_size': (4, 4),
        'crop_pct': 1.0, 'interpolation': 'bilinear',
        'mean': CIFAR10_MEAN, 'std': CIFAR10_STD,
        'first_conv': 'conv1', 'classifier': 'fc',
        'license': 'apache-2.0', 'paper_ids': 'arXiv:1512.03385',
        **kwargs,
    }


default_cfgs = generate_default_cfgs({
    f'resnet18_cifar.{PRETRAINED_TAG}': _cfg(**published_source('resnet18_cifar')),
})


@register_model
def resnet18_cifar(pretrained: bool = False, **kwargs) -> CifarResNet:
    """ResNet-18 with the CIFAR stem (3x3 stride-1, no max-pool), 11,173,962 parameters at 10 classes."""
    model_args = dict(block=BasicBlock, layers=(2, 2, 2, 2))
    return _create_cifar_resnet('resnet18_cifar', pretrained, **dict(model_args, **kwargs))
