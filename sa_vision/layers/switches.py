""" Switches of every attention layer of a model, for checks and speed comparisons: dense mixing
(:func:`dense_attention`) and the batched path (:func:`batched_heads`); ``docs/attention.md`` explains both paths """
import contextlib
from typing import ContextManager, Iterator, Tuple

from torch import nn

from .attention import HeadsLinear, PositionalAttention

__all__ = ['dense_attention', 'batched_heads']


@contextlib.contextmanager
def _switch(model: nn.Module, kinds: Tuple[type, ...], attribute: str, value: bool) -> Iterator[nn.Module]:
    """Set ``attribute`` of every module of ``kinds`` in ``model`` to ``value`` while active, then restore it."""
    modules = [m for m in model.modules() if isinstance(m, kinds)]
    previous = [getattr(m, attribute) for m in modules]
    for m in modules:
        setattr(m, attribute, value)
    try:
        yield model
    finally:
        for m, was in zip(modules, previous):
            setattr(m, attribute, was)


def dense_attention(model: nn.Module, enabled: bool = True) -> ContextManager[nn.Module]:
    """Mix every :class:`PositionalAttention` in ``model`` by the dense ``(h*w) x (h*w)`` probabilities while
    active (``enabled=False``: by the separable factors, whatever the device's default, :data:`CUDA_DENSE_MIXING`)."""
    return _switch(model, (PositionalAttention,), 'dense', enabled)


def batched_heads(model: nn.Module, enabled: bool = True) -> ContextManager[nn.Module]:
    """Run every attention layer and Value of ``model`` on the batched path while active (``enabled=True``)."""
    return _switch(model, (PositionalAttention, HeadsLinear), 'batched_heads', enabled)
