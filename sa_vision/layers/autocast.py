""" Mixed precision for the MLP's autograd Function: autocast casts neither ``out=`` operands nor anything inside a
custom Function's backward, so the Function takes its inputs already cast, as autocast would a Linear's """
from typing import List, Optional

import torch
from torch import Tensor

__all__ = ['autocast_inputs', 'has_autocast']


def has_autocast(device_type: str) -> bool:
    """Whether ``device_type`` has an autocast to ask about ('meta', timm's shape checks, has none). Under
    ``torch.compile`` the device is always a real one, and dynamo before torch 2.14 cannot trace
    ``torch.amp.is_autocast_available`` (a graph break in every layer; ``fullgraph`` failed on CUDA under torch
    2.11), so it is not asked there."""
    return torch.compiler.is_compiling() or torch.amp.is_autocast_available(device_type)


def autocast_inputs(*tensors: Optional[Tensor]) -> List[Optional[Tensor]]:
    """``tensors`` in the autocast dtype of their device when autocast is on there, else unchanged."""
    first = next(t for t in tensors if t is not None)
    device_type = first.device.type
    if not has_autocast(device_type) or not torch.is_autocast_enabled(device_type):
        return list(tensors)
    dtype = torch.get_autocast_dtype(device_type)
    return [t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors]
