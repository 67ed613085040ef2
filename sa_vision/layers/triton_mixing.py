""" Content-free attention and the Value projection in one Triton kernel (paper Sec. 2.3; Sec. 3, Eq. 9), for GPUs

``out = bias + sum_n (P_n x) W_n^T`` without ever storing the mixed heads ``P_n x``: a heads-sized tensor is the
memory traffic that bounds a training step on a GPU. Opt-in: :func:`attend_then_project` calls it inside
``fused_mix_and_project(model)`` (``sa_vision.layers``); why and how it is tested: ``docs/attention.md``. Runs on
the CPU (slowly, for tests) under ``TRITON_INTERPRET=1``. """
from __future__ import annotations  # the kernel's ``tl.constexpr`` annotations stay strings when triton is absent

import functools
import os
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ..errors import UserError
from .autocast import autocast_inputs

try:
    import triton
    import triton.language as tl
except ImportError:  # the module imports without triton; calling the kernel says what is missing
    triton = tl = None

__all__ = ['mix_and_project', 'triton_available', 'interpreting', 'kernel_problem']


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, read by triton when a kernel is
    compiled, so setting it after import still counts here)."""
    return os.environ.get('TRITON_INTERPRET', '0') == '1'


def triton_available() -> bool:
    """Whether :func:`mix_and_project` can run here: triton importable, and a CUDA device or the interpreter."""
    return triton is not None and (interpreting() or torch.cuda.is_available())


def kernel_problem(device: Optional[torch.device] = None) -> Optional[str]:
    """What stops :func:`mix_and_project` from running here (on tensors on ``device``, where given), in words, or
    None: asked by the kernel and by whoever would rather refuse before any work."""
    if not triton_available():
        why = 'triton is not installed' if triton is None else 'there is no CUDA device'
        return (f'mix_and_project needs triton and a CUDA device, or TRITON_INTERPRET=1 to run in the CPU '
                f'interpreter; {why} (pip install triton, or run without the kernel: no fused_mix_and_project, '
                f'no --compare fused)')
    if device is not None and not interpreting() and torch.device(device).type != 'cuda':
        return f'mix_and_project runs on CUDA tensors (x is on {device}); set TRITON_INTERPRET=1 to run it on the CPU'
    return None


def _chain_kernel(
        l_ptr, m_ptr, r_ptr, out_ptr, bias_ptr,
        ROWS, K1, K2, COLS, TERMS,
        l_g, l_s, l_row, l_col,
        m_g, m_s, m_row, m_col,
        r_g, r_s, r_row, r_col,
        out_g, out_row, out_col, out_split,
        HAS_BIAS: tl.constexpr, IN_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr, ACC_DTYPE: tl.constexpr,
        INPUT_PRECISION: tl.constexpr,
        BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, BLOCK_K1: tl.constexpr, BLOCK_K2: tl.constexpr,
):
    """``out[g] = bias + sum_s (L[g, s] @ M[g, s]) @ R[g, s]`` for one (row block, column block) of group ``g``,
    its terms ``s`` split into contiguous chunks along the grid's third axis: chunk ``k`` writes its partial sum
    (no bias then) in the accumulator's dtype to ``out + k * out_split``, and :func:`_chain` sums the chunks.

    Every operand is addressed by four strides (group, term, row, column; 0 where it does not depend on one), so
    the forward pass and all three backward products are this one kernel on views of the same tensors. The
    ``BLOCK_ROWS x BLOCK_K2`` tile ``L @ M`` lives only in registers: it is rounded to the inputs' dtype (as the
    stored heads of the unfused path are) and multiplied straight into the float32 (float64) accumulator.

    Only triton's builtins (``tl.full``, not ``tl.zeros`` or ``tl.cdiv``): the standard library's functions are
    jit-compiled when triton is imported, and the interpreter cannot call them when ``TRITON_INTERPRET`` was set
    later (a test in a process that imported triton before)."""
    col_blocks = (COLS + BLOCK_COLS - 1) // BLOCK_COLS
    pid = tl.program_id(0)
    g = tl.program_id(1)
    rows = (pid // col_blocks) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = (pid % col_blocks) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    row_ok = rows < ROWS
    col_ok = cols < COLS
    split, splits = tl.program_id(2), tl.num_programs(2)
    acc = tl.full((BLOCK_ROWS, BLOCK_COLS), 0, ACC_DTYPE)
    for s in range(split * TERMS // splits, (split + 1) * TERMS // splits):  # chunks differ by at most one term
        l_base = l_ptr + g * l_g + s * l_s
        m_base = m_ptr + g * m_g + s * m_s
        r_base = r_ptr + g * r_g + s * r_s
        for k2_start in range(0, K2, BLOCK_K2):
            k2 = k2_start + tl.arange(0, BLOCK_K2)
            k2_ok = k2 < K2
            inner = tl.full((BLOCK_ROWS, BLOCK_K2), 0, ACC_DTYPE)
            for k1_start in range(0, K1, BLOCK_K1):
                k1 = k1_start + tl.arange(0, BLOCK_K1)
                k1_ok = k1 < K1
                lhs = tl.load(l_base + rows[:, None] * l_row + k1[None, :] * l_col,
                              mask=row_ok[:, None] & k1_ok[None, :], other=0.).to(DOT_DTYPE)
                mid = tl.load(m_base + k1[:, None] * m_row + k2[None, :] * m_col,
                              mask=k1_ok[:, None] & k2_ok[None, :], other=0.).to(DOT_DTYPE)
                inner = tl.dot(lhs, mid, inner, input_precision=INPUT_PRECISION)
            rhs = tl.load(r_base + k2[:, None] * r_row + cols[None, :] * r_col,
                          mask=k2_ok[:, None] & col_ok[None, :], other=0.).to(DOT_DTYPE)
            mixed = inner.to(IN_DTYPE).to(DOT_DTYPE)
            acc = tl.dot(mixed, rhs, acc, input_precision=INPUT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.).to(ACC_DTYPE)[None, :]
    out = out_ptr + split * out_split + g * out_g + rows[:, None] * out_row + cols[None, :] * out_col
    # rounded to the output's dtype by the store: the inputs' one, or the accumulator's for a chunk's partial sum
    tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])


@functools.lru_cache(maxsize=2)
def _compiled_kernel(interpret: bool):
    """The kernel through ``triton.jit``, which picks the interpreter or the compiler when it wraps a function:
    wrapping at first use (per mode) lets a test set ``TRITON_INTERPRET`` after this module was imported."""
    return triton.jit(_chain_kernel)


_TL_DTYPES = {} if tl is None else {
    torch.float64: tl.float64, torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}

# (tensor, (group, term, row, column) strides) of one operand of the kernel
Operand = Tuple[Tensor, Tuple[int, int, int, int]]


def _operand(t: Tensor, group: Optional[int], term: Optional[int], row: int, col: int) -> Operand:
    """``t`` read with its dimension ``group`` / ``term`` / ``row`` / ``col`` as the kernel's (``None``: does not
    vary, stride 0)."""
    return t, tuple(0 if dim is None else t.stride(dim) for dim in (group, term, row, col))


# the largest tile side: bounds the registers of the kernel's two tiles (not tuned on a GPU yet); tests lower it
# to run several blocks of every loop on tiny sizes
MAX_BLOCK = 64


def _block(n: int) -> int:
    return min(MAX_BLOCK, max(16, triton.next_power_of_2(n)))  # 16: tl.dot's smallest tile side


# programs per SM that a launch aims at by splitting its terms (not tuned on a GPU yet), and the SM count assumed
# under the interpreter: small, so that the tests' tiny sizes split their terms too
PROGRAMS_PER_SM = 3
INTERPRETER_SMS = 4


def _term_splits(programs: int, terms: int, sms: int) -> int:
    """Into how many chunks a launch of ``programs`` (tiles x groups) splits its ``terms``: the nearest count to
    ``PROGRAMS_PER_SM`` programs per SM (2 to 4 where it splits and the terms allow), at most one chunk per term,
    1 where the launch has more than 2 per SM already. The weight and probability gradients need it (groups =
    heads, terms = the batch: 9 programs for the narrow model's weight gradient); the forward and the gradient of
    ``x`` have the batch as groups."""
    return max(1, min(terms, (2 * PROGRAMS_PER_SM * sms + programs) // (2 * programs)))


def _constants(dtype: torch.dtype, sizes: Tuple[int, int, int, int], has_bias: bool) -> dict:
    """The kernel's compile-time arguments for inputs of ``dtype`` and ``sizes`` = (rows, k1, k2, columns)."""
    rows, k1, k2, cols = sizes
    in_dtype = _TL_DTYPES[dtype]
    # the interpreter multiplies bfloat16 tiles as their raw uint16 bits: there the products run in float32, which
    # is exact for products of bfloat16 numbers and sums them in float32 as the GPU's bfloat16 dot does
    dot_dtype = tl.float32 if dtype == torch.bfloat16 and interpreting() else in_dtype
    # float32 products in full precision unless torch itself allows TF32 (the unfused path follows that flag);
    # torch's new fp32_precision API reads settings of either API, the legacy allow_tf32 raises after the new one
    matmul = torch.backends.cuda.matmul
    allowed = matmul.fp32_precision == 'tf32' if hasattr(matmul, 'fp32_precision') else matmul.allow_tf32
    tf32 = dtype == torch.float32 and allowed and not interpreting()
    return dict(HAS_BIAS=has_bias, IN_DTYPE=in_dtype, DOT_DTYPE=dot_dtype,
                ACC_DTYPE=tl.float64 if dtype == torch.float64 else tl.float32,
                INPUT_PRECISION='tf32' if tf32 else 'ieee',
                BLOCK_ROWS=_block(rows), BLOCK_COLS=_block(cols), BLOCK_K1=_block(k1), BLOCK_K2=_block(k2))


def _chain(out: Tensor, out_dims: Tuple[int, int, int], lhs: Operand, mid: Operand, rhs: Operand,
           sizes: Tuple[int, int, int, int], terms: int, bias: Optional[Tensor] = None) -> Tensor:
    """Launch :func:`_chain_kernel` writing ``out`` (dimensions ``out_dims`` = group, row, column);
    ``sizes`` = (rows, k1, k2, columns)."""
    rows, k1, k2, cols = sizes
    groups = out.shape[out_dims[0]]
    tiles = triton.cdiv(rows, _block(rows)) * triton.cdiv(cols, _block(cols))
    sms = INTERPRETER_SMS if interpreting() else torch.cuda.get_device_properties(out.device).multi_processor_count
    splits = _term_splits(max(tiles * groups, 1), terms, sms)  # no programs for an empty batch: one split
    # the chunks' partial sums in the accumulator's dtype, summed here and rounded once to the output's
    partial = out.permute(out_dims) if splits == 1 else out.new_empty(
        splits, groups, rows, cols, dtype=torch.float64 if out.dtype == torch.float64 else torch.float32)
    constants = _constants(out.dtype, sizes, bias is not None and splits == 1)
    grid = (tiles, groups, splits)  # CUDA caps the last two at 65,535: groups is the batch or the heads
    _compiled_kernel(interpreting())[grid](
        lhs[0], mid[0], rhs[0], partial, bias if bias is not None else out,
        rows, k1, k2, cols, terms, *lhs[1], *mid[1], *rhs[1], *partial.stride()[-3:],
        partial.stride(0) if splits > 1 else 0, **constants)
    if splits > 1:
        total = partial.sum(0)
        out.permute(out_dims).copy_(total if bias is None else total + bias)
    return out


# The forward and the three backward products are custom operators (``torch.library``), their autograd formula
# registered on the forward: ``torch.compile`` keeps each as one opaque call in its graph (inside CUDA graphs under
# 'reduce-overhead') where dynamo could not trace the launch itself, neither the interpreter's nor the compiled
# kernel's wrapping at first use. A copy of this module without triton (a test) registers nothing.
if triton is not None:
    @torch.library.custom_op('sa_vision::mix_and_project', mutates_args=())
    def _forward(x: Tensor, probs: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        """``x (T, B, D)``, ``probs (heads, T, T)``, ``weight (out, heads*D)``, ``bias (out,)`` of one dtype ->
        ``(T, B, out)``; the backward recomputes the mixed heads tile by tile and stores none."""
        (T, B, D), heads, C = x.shape, probs.shape[0], weight.shape[0]
        w = weight.unflatten(1, (heads, D))  # w[o, n, d] = W[o, n*D + d]
        # group b, term n: out[:, b] = sum_n (P_n @ x[:, b]) @ W_n^T
        return _chain(x.new_empty(T, B, C), (1, 0, 2), _operand(probs, None, 0, 1, 2), _operand(x, 1, None, 0, 2),
                      _operand(w, None, 1, 2, 0), (T, T, D, C), heads, bias)

    @torch.library.custom_op('sa_vision::mix_and_project_grad_x', mutates_args=())
    def _grad_x(g: Tensor, probs: Tensor, weight: Tensor) -> Tensor:
        (T, B, C), heads = g.shape, probs.shape[0]
        D = weight.shape[1] // heads
        # group b, term n: grad_x[:, b] = sum_n (P_n^T @ g[:, b]) @ W_n
        return _chain(g.new_empty(T, B, D), (1, 0, 2), _operand(probs, None, 0, 2, 1), _operand(g, 1, None, 0, 2),
                      _operand(weight.unflatten(1, (heads, D)), None, 1, 0, 2), (T, T, C, D), heads)

    @torch.library.custom_op('sa_vision::mix_and_project_grad_probs', mutates_args=())
    def _grad_probs(g: Tensor, x: Tensor, weight: Tensor) -> Tensor:
        (T, B, D), C = x.shape, weight.shape[0]
        heads = weight.shape[1] // D
        # group n, term b: grad_P[n] = sum_b (g[:, b] @ W_n) @ x[:, b]^T
        return _chain(x.new_empty(heads, T, T), (0, 1, 2), _operand(g, None, 1, 0, 2),
                      _operand(weight.unflatten(1, (heads, D)), 1, None, 0, 2), _operand(x, None, 1, 2, 0),
                      (T, C, D, T), B)

    @torch.library.custom_op('sa_vision::mix_and_project_grad_weight', mutates_args=())
    def _grad_weight(g: Tensor, x: Tensor, probs: Tensor) -> Tensor:
        (T, B, D), heads, C = x.shape, probs.shape[0], g.shape[2]
        # group n, term b: grad_W_n = sum_b (g[:, b]^T @ P_n) @ x[:, b]
        grad_w = _chain(x.new_empty(C, heads, D), (1, 0, 2), _operand(g, None, 1, 2, 0), _operand(probs, 0, None, 1, 2),
                        _operand(x, None, 1, 0, 2), (C, T, T, D), B)
        return grad_w.flatten(1)

    @_forward.register_fake
    def _(x, probs, weight, bias):
        return x.new_empty(x.shape[0], x.shape[1], weight.shape[0])

    @_grad_x.register_fake
    def _(g, probs, weight):
        return g.new_empty(g.shape[0], g.shape[1], weight.shape[1] // probs.shape[0])

    @_grad_probs.register_fake
    def _(g, x, weight):
        return x.new_empty(weight.shape[1] // x.shape[2], x.shape[0], x.shape[0])

    @_grad_weight.register_fake
    def _(g, x, probs):
        return x.new_empty(g.shape[2], probs.shape[0] * x.shape[2])

    def _setup_context(ctx, inputs, output):
        x, probs, weight, bias = inputs
        ctx.save_for_backward(x, probs, weight)
        ctx.has_bias = bias is not None

    def _backward(ctx, grad_out: Tensor):
        x, probs, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        return (_grad_x(grad_out, probs, weight) if needs[0] else None,
                _grad_probs(grad_out, x, weight) if needs[1] else None,
                _grad_weight(grad_out, x, probs) if needs[2] else None,
                grad_out.sum((0, 1)) if ctx.has_bias and needs[3] else None)

    _forward.register_autograd(_backward, setup_context=_setup_context)

    # FlopCounterMode (sa_vision.measure's MAC counts) sees only these calls: each is groups x terms chains
    # (rows x k1) @ (k1 x k2) @ (k2 x cols), with the sizes that _chain is launched with above
    def _chain_flops(groups_x_terms: int, rows: int, k1: int, k2: int, cols: int) -> int:
        return 2 * groups_x_terms * rows * k2 * (k1 + cols)

    @register_flop_formula(torch.ops.sa_vision.mix_and_project)
    def _(x_shape, probs_shape, weight_shape, bias_shape, out_shape=None, **kwargs) -> int:
        (T, B, D), heads, C = x_shape, probs_shape[0], weight_shape[0]
        return _chain_flops(B * heads, T, T, D, C)

    @register_flop_formula(torch.ops.sa_vision.mix_and_project_grad_x)
    def _(g_shape, probs_shape, weight_shape, out_shape=None, **kwargs) -> int:
        (T, B, C), heads, D = g_shape, probs_shape[0], out_shape[2]
        return _chain_flops(B * heads, T, T, C, D)

    @register_flop_formula(torch.ops.sa_vision.mix_and_project_grad_probs)
    def _(g_shape, x_shape, weight_shape, out_shape=None, **kwargs) -> int:
        (T, B, D), heads, C = x_shape, out_shape[0], g_shape[2]
        return _chain_flops(heads * B, T, C, D, T)

    @register_flop_formula(torch.ops.sa_vision.mix_and_project_grad_weight)
    def _(g_shape, x_shape, probs_shape, out_shape=None, **kwargs) -> int:
        (T, B, D), heads, C = x_shape, probs_shape[0], g_shape[2]
        return _chain_flops(heads * B, C, T, T, D)


def _dense(probs: Union[Tensor, Sequence[Tensor]], H: int, W: int) -> Tensor:
    """``(heads, H*W, H*W)`` from a dense tensor or :meth:`PositionalAttention.mixing_probs`' ``[grid]`` or
    ``[row, col]`` (the Kronecker product of the separable factors, a few thousand numbers per head)."""
    if isinstance(probs, Tensor):
        return probs
    if len(probs) == 1:
        return probs[0]
    row, col = probs
    return torch.einsum('nik,njl->nijkl', row, col).reshape(row.shape[0], H * W, H * W)


def mix_and_project(x: Tensor, probs: Union[Tensor, List[Tensor]], weight: Tensor,
                    bias: Optional[Tensor] = None) -> Tensor:
    """``bias + sum_n mix_n(x) @ weight[:, n*D:(n+1)*D]^T`` for grid-major ``x`` (``h x w x B x D -> h x w x B x
    out``) in one Triton kernel, forward and backward, with no heads-sized tensor.

    ``probs``: dense ``(heads, h*w, h*w)`` (``[head, query, key]``), or the ``[grid]`` / ``[row, col]`` list of
    :meth:`PositionalAttention.mixing_probs`. Under autocast every input is cast to its dtype, else ``probs``,
    ``weight`` and ``bias`` to ``x``'s; the products accumulate in float32 (float64 for float64)."""
    problem = kernel_problem(x.device)
    if problem:
        raise UserError(problem)
    H, W, B, D = x.shape
    probs = _dense(probs, H, W)
    heads = probs.shape[0]
    if probs.shape != (heads, H * W, H * W) or weight.dim() != 2 or weight.shape[1] != heads * D:
        raise UserError(f'mix_and_project: probs {tuple(probs.shape)} must be (heads, {H * W}, {H * W}) for the '
                        f'{H}x{W} grid and weight {tuple(weight.shape)} (out, heads*{D})')
    if bias is not None and bias.shape != (weight.shape[0],):
        raise UserError(f'mix_and_project: bias {tuple(bias.shape)} must be ({weight.shape[0]},)')
    x, probs, weight, bias = autocast_inputs(x, probs, weight, bias)  # a Function's inputs escape autocast
    dtype = x.dtype
    out = _forward(x.reshape(H * W, B, D), probs.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    return out.view(H, W, B, weight.shape[0])
