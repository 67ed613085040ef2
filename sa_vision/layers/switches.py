""" Switches of every attention layer of a model, for checks and speed comparisons: dense mixing
(:func:`dense_attention`), the batched path (:func:`batched_heads`), the fused Triton kernel
(:func:`fused_mix_and_project`) and the dense path projected first (:func:`project_first`); ``docs/attention.md``
explains them """
import contextlib
from typing import ContextManager, Iterator, Tuple

from torch import nn

from .attention import HeadsLinear, PositionalAttention

__all__ = ['dense_attention', 'batched_heads', 'fused_mix_and_project', 'project_first']


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


def fused_mix_and_project(model: nn.Module, enabled: bool = True) -> ContextManager[nn.Module]:
    """Run every content-free :class:`PositionalAttention` of ``model`` and its Value through the fused Triton
    kernel (:func:`~sa_vision.layers.triton_mixing.mix_and_project`) while active, outside captured graphs. Opt-in
    until measured on a GPU (:func:`choose_path`); where triton cannot run, a forward raises ``UserError``."""
    return _switch(model, (PositionalAttention,), 'fused_kernel', enabled)


def project_first(model: nn.Module, enabled: bool = True) -> ContextManager[nn.Module]:
    """Run every :class:`PositionalAttention` of ``model`` and its Value projected first
    (:func:`~sa_vision.layers.attention.project_then_mix`) where its path is dense, batched, content-free and not
    fused, while active (``enabled=False``: never, whatever :data:`CUDA_PROJECT_FIRST` says). With a separable kind
    only together with :func:`dense_attention`."""
    return _switch(model, (PositionalAttention,), 'project_first', enabled)
