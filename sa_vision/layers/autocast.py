""" Mixed precision for the MLP's autograd Function: autocast casts neither ``out=`` operands nor anything inside a
custom Function's backward, so the Function takes its inputs already cast, as autocast would a Linear's """
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
