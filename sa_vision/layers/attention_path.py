""" The one choice of how a positional attention layer and its Value run (measurements: ``docs/attention.md``,
"Why each path"): :func:`choose_path` and what it depends on

The fused Triton kernel (``triton_mixing.mix_and_project``: mixing and Value in one kernel, forward and backward,
never storing the heads-sized tensor whose memory traffic bounds a GPU training step) is opt-in
(:func:`fused_mix_and_project`): on an H100 one layer's training step through it ran 0.41x as fast as the batched
products at full width (docs/attention.md), and the whole model, which decides, trained 1.114x as fast without it on
an H200 at the narrow width with CUDA graphs and 2.240x at full size eager (docs/probes/gpu/device_check.md, section
8, "What the results decide"), so it stays opt-in. It takes over from the other Functions and mixes by the probabilities
the ``dense`` choice makes, dropout included. Never in a captured graph: TorchScript and its tracer cannot record
a Triton launch, and an exported or ONNX graph holding the custom operator would run only where sa_vision and
triton are (FX keeps the blocks whole, so they run it as in eager; ``torch.compile`` keeps it as a custom operator
in its graph). Asked for where triton cannot run, it raises rather than falling back: a benchmark
would compare a model with itself.
"""
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from .autocast import has_autocast
from .tracing import is_capturing

__all__ = ['CUDA_DENSE_MIXING', 'CUDA_DENSE_MAX_TOKENS', 'CUDA_PROJECT_FIRST', 'AttentionPath', 'choose_path',
           'current_path', 'cuda_dense_mixing']

CUDA_DENSE_MIXING = True
"""Whether the separable kinds mix through the dense (Kronecker) ``(h*w) x (h*w)`` probabilities on CUDA by default.

Measured on one NVIDIA H100 (torch 2.11, bf16 autocast, batch 128, training compiled with CUDA graphs, the same
weights in both forms; docs/probes/gpu/h100_2026-11-26.log, section 2): the separable form ran 0.779x as fast as
the dense one at full size (6,958 against 8,937 img/s) and 0.985x at the narrow width, so dense it is, by the rule
written before the run (docs/probes/gpu/device_check.md, "What the results decide"). The dense form does 8x the
mixing MACs as one large GEMM; in the separable form's profile one GEMM of the per-axis mixing, with a side of
16, took 14 % of the step's GPU time. Eager, dense was as fast or faster too (0.98x and 1.00x training, 0.86x and 0.73x
inference). ``dense_attention(model, False)`` forces the separable form."""

CUDA_DENSE_MAX_TOKENS = 256
"""The largest grid (tokens ``h*w``) that :data:`CUDA_DENSE_MIXING` mixes densely: the 16x16 grids of 32x32 images,
where it was measured. The dense probabilities grow with the tokens squared, the separable factors with
``h*w*(h+w)``: at 64x64 images (a 32x32 grid) one training step of the narrow model at batch 1 held 1,473 MiB dense
against 43 MiB separable (a CPU measurement of the two forms); larger grids mix separably."""


class AttentionPath(NamedTuple):
    """How one attention layer and its Value run; :func:`choose_path` picks it."""
    batched: bool  # every head in one product, the heads concatenated, one Value GEMM; else one head at a time
    dense: bool  # mix by (h*w) x (h*w) probabilities (a separable kind: the Kronecker product of its factors)
    recompute_mixing: bool  # batched: the separable_mixing Function, recomputing the row-mixed heads in backward
    attend_then_project: bool  # per head: _AttendThenProject, each head mixed and projected, recomputed in backward
    cache_probs: bool  # eval without autograd: reuse the probabilities while the positional parameters are unchanged
    fused_kernel: bool  # triton_mixing.mix_and_project: mixing + Value in one Triton kernel, no heads-sized tensor
    project_first: bool  # dense batched content-free: attention.project_then_mix, Value per head, then one mixing


CUDA_PROJECT_FIRST = False
"""Whether the dense, batched content-free path on CUDA projects first by default (``attention.project_then_mix``:
the Value's products per head, then one mixing GEMM, no copy of the heads-sized tensor).

Measured on one NVIDIA H100 (torch 2.11, bf16 autocast, batch 128, training compiled with CUDA graphs, the same
weights; docs/probes/gpu/h100_2026-11-26b_speed.log, section 2): the dense path ran 1.124x as fast as itself
projected first at full size (8,971 against 7,984 img/s; at the narrow width 1.070x, within the rounds' noise), so
not by default, by the rule written before the run (docs/probes/gpu/device_check.md, "What the results decide"). It
removes two copies of the heads-sized tensor into the Value's layout and back (165 us each per layer in an H100
profile of the full-size step) and adds a Value product per head in their place, which cost more there (no profile
of it says by how much)."""


def choose_path(
        device_type: str,
        dtype: torch.dtype,
        autocast: bool,
        compiling: bool,
        capturing: bool,
        grad: bool,
        training: bool,
        separable: bool,
        content: bool,
        dense: Optional[bool],
        batched: bool,
        fused: bool,
        cuda_dense: bool,
        project_first: Optional[bool] = None,
        cuda_project_first: bool = False,
) -> AttentionPath:
    """The one choice of how attention + Value run (measurements: ``docs/attention.md``, "Why each path").

    ``dense``, ``batched`` and ``fused`` are the overrides of :func:`dense_attention`, :func:`batched_heads` and
    :func:`fused_mix_and_project` (``None`` / ``False``: the default here); ``cuda_dense``: CUDA's default mixing,
    :data:`CUDA_DENSE_MIXING` (an argument: TorchScript reads no module global). Batched unless float32 / float64
    eager on the CPU:

    * ``torch.compile`` cannot trace the per-head Functions, and inductor fuses the plain graph by itself;
    * a captured graph (export, tracing, TorchScript) loses the per-head ``out=`` products into reused buffers;
    * off the CPU each of the per-head path's ~10 small products per head and layer is a kernel launch;
    * under autocast and in low precision the per-head products would round the Value sum after every head,
      where one GEMM over the concatenated heads accumulates in float32 and rounds once;
    * on the CPU the per-head path trained 1.45x as fast as the batched one at 0.35x its peak memory
      (``sa_quadratic_cifar``, batch 32, float32, docs/performance.md, "Two execution paths").

    Separable kinds mix by their row and column factors (``O(h*w*(h+w))`` per head, 8x fewer mixing MACs than
    the dense form at 16x16) except on CUDA when ``cuda_dense`` (:func:`cuda_dense_mixing`) says otherwise. Eager
    training of the separable batched path recomputes the row-mixed heads in backward (``separable_mixing``: 22 %
    less peak memory); compiled graphs choose what to keep by themselves.

    The fused Triton kernel only when ``fused`` asks, for content-free kinds, outside captured graphs (module docs).

    Projected first (``project_then_mix``, plain ops: in graphs too) where dense, batched, content-free and not fused,
    if the ``project_first`` override asks, else on CUDA if ``cuda_project_first`` (:data:`CUDA_PROJECT_FIRST`) does.
    """
    graph = compiling or capturing
    batched = (batched or graph or device_type != 'cpu' or autocast
               or (dtype != torch.float32 and dtype != torch.float64))
    mix_dense = content or not separable or (dense if dense is not None else device_type == 'cuda' and cuda_dense)
    separable_mixing = not mix_dense
    fused_kernel = fused and not content and not capturing
    return AttentionPath(
        batched=batched,
        dense=mix_dense,
        recompute_mixing=batched and grad and separable_mixing and not graph and not fused_kernel,
        attend_then_project=not batched and not content and (not grad or separable_mixing) and not fused_kernel,
        # CPU only: checking the cache compares parameter values (torch.equal), which on a GPU waits for the
        # device; a CUDA forward never waits for the host
        cache_probs=device_type == 'cpu' and not (training or grad or graph or content),
        fused_kernel=fused_kernel,
        project_first=(project_first if project_first is not None else device_type == 'cuda' and cuda_project_first)
        and batched and mix_dense and not content and not fused_kernel,
    )


def current_path(x: Tensor, training: bool, separable: bool, content: bool, dense: Optional[bool],
                  batched: bool, fused: bool = False, project_first: Optional[bool] = None,
                  tokens: Optional[int] = None) -> AttentionPath:
    """:func:`choose_path` for input ``x`` in the current state of autograd, autocast, compilation and capture;
    ``tokens``: the grid's (default: of ``x``, the attention's grid-major input ``h x w x B x D``)."""
    if torch.jit.is_scripting():
        # a scripted model is a captured graph with literal choices: separable on CUDA too (exact, slower there
        # than CUDA_DENSE_MIXING's dense form; a literal True would be a second copy of that constant, which
        # TorchScript cannot read at run time), no Triton launch, not projected first (its blocks call the
        # attention and Value modules)
        return choose_path(x.device.type, x.dtype, False, False, True, False, training, separable, content, dense,
                           batched, False, False, False, False)
    else:
        return _eager_path(x, training, separable, content, dense, batched, fused, project_first, tokens)


@torch.jit.unused
def _eager_path(x: Tensor, training: bool, separable: bool, content: bool, dense: Optional[bool],
                batched: bool, fused: bool, project_first: Optional[bool], tokens: Optional[int]) -> AttentionPath:
    device_type, compiling, capturing = x.device.type, torch.compiler.is_compiling(), is_capturing()
    # a graph is batched whatever autocast says
    autocast = not (compiling or capturing) and has_autocast(device_type) and torch.is_autocast_enabled(device_type)
    if tokens is None:  # only a separable kind's choice counts them
        tokens = x.shape[0] * x.shape[1] if separable else 0
    return choose_path(device_type, x.dtype, autocast, compiling, capturing, torch.is_grad_enabled(), training,
                       separable, content, dense, batched, fused, cuda_dense_mixing(tokens), project_first,
                       CUDA_PROJECT_FIRST)


def cuda_dense_mixing(tokens: int) -> bool:
    """CUDA's default mixing of a separable kind on a grid of ``tokens``: :data:`CUDA_DENSE_MIXING`, up to
    :data:`CUDA_DENSE_MAX_TOKENS`."""
    return CUDA_DENSE_MIXING and tokens <= CUDA_DENSE_MAX_TOKENS
