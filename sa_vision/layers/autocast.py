""" Mixed precision for the MLP's hand-written autograd Function

(The attention layers need none of this: under autocast they take the batched path, plain autograd; see
:func:`sa_vision.layers.attention.use_batched_heads`.) Imports only torch.

Autocast casts the inputs of ``torch.nn.functional.linear`` and ``torch.mm`` to its lower precision, but
not the operands of products that write into a given tensor (``out=``) and not anything inside a custom
autograd Function's backward. The layers' Functions therefore take their inputs already cast, the way
autocast would cast a Linear's: every floating-point input in the autocast dtype, so that forward and
backward run in one dtype. Outside autocast nothing changes.
"""
from typing import List, Optional

import torch
from torch import Tensor

__all__ = ['autocast_inputs']


def autocast_inputs(*tensors: Optional[Tensor]) -> List[Optional[Tensor]]:
    """``tensors`` in the autocast dtype of their device when autocast is on there, else unchanged."""
    first = next(t for t in tensors if t is not None)
    device_type = first.device.type
    # 'meta' (timm's shape checks) and other devices without autocast: nothing to cast
    if not torch.amp.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return list(tensors)
    dtype = torch.get_autocast_dtype(device_type)
    return [t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors]
