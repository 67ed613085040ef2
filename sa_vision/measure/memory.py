""" Peak memory of a step: CUDA's allocator, or on the CPU the live tensor storages seen by a dispatch mode """
import contextlib
import weakref
from typing import Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ['LiveTensorMemory']


class LiveTensorMemory(TorchDispatchMode):
    """Tracks the total size of tensor storages created by ATen operators while active, and its peak.

    Storages alive before the mode was entered (parameters, inputs, optimizer state) and kernel-internal scratch
    memory are not counted; a storage leaves the count when freed (a weakref finalizer).
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: Dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def _track(self, t: torch.Tensor) -> None:
        if t.is_sparse or t.device.type == 'meta':
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = st._cdata
        if key in self._sizes:
            return
        size = st.nbytes()
        self._sizes[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


@contextlib.contextmanager
def _peak_memory(device: torch.device):
    """Yields a dict whose 'peak' is set on exit to the peak bytes allocated inside the block."""
    result = {'peak': None}
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result['peak'] = torch.cuda.max_memory_allocated(device) - before
    else:
        tracker = LiveTensorMemory()
        with tracker:
            yield result
        result['peak'] = tracker.peak


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            if st._cdata not in seen:
                seen.add(st._cdata)
                total += st.nbytes()
    return total
