""" Positional multi-head self-attention of Cordonnier, Loukas & Jaggi

Paper: `On the Relationship between Self-Attention and Convolutional Layers` (ICLR 2020),
https://arxiv.org/abs/1911.03584

Every head attends over the raw input ``X`` (head dimension = embedding dimension) and the heads are
concatenated, so a layer maps ``B x h x w x D`` to ``B x h x w x (heads * D)``. The kind of attention is
chosen by an argument; each kind is a small module that owns its parameters and turns the relative shift
``delta = key - query`` (in grid units) into scores:

* ``quadratic``   isotropic Gaussian, ``A_h(delta) = -(s_h^2 / 2) ||delta - mu_h||^2``
* ``generalized`` non-isotropic Gaussian, ``A_h(delta) = -1/2 (delta - mu_h)^T S_h S_h^T (delta - mu_h)``
* ``learned``     relative row / column tables, ``A_h(delta) = k_v(E_v[delta_1])_h + k_u(E_u[delta_2])_h``
* ``content``     ``learned`` plus query/key content scores ``q_h . k_h / sqrt(D)`` (depends on ``X``)

How it is computed (SPEC 3.5). The first three kinds are content-free: their probabilities do not depend
on ``X``, so they are computed once per forward with no batch dimension and applied to the whole batch.
``quadratic`` and ``learned`` scores are a sum of a row term and a column term, so the softmax over the
grid is the Kronecker product of a row softmax (``h x h``) and a column softmax (``w x w``); a head is
applied as two small matrix products and no ``(h*w) x (h*w)`` matrix is built. ``generalized`` has a
cross term and uses one dense ``(h*w) x (h*w)`` matrix per head, all heads applied in one product.
``content`` is ordinary batched attention. Every path equals the plain dense formula (softmax over all
keys, then a weighted sum) to floating point rounding; ``dense=True`` (or :func:`dense_attention`) runs
that plain formula instead, for checks and speed comparisons. Probabilities below ``eps**3`` of the
dtype are set to exactly zero (:func:`drop_negligible`): a Gaussian head's far probabilities would
otherwise be subnormal numbers, which x86 CPUs multiply in slow microcode.

Attention dropout. As in the original code, the content-free probabilities carry no batch dimension, so
one dropout mask is drawn per forward and shared by the whole batch. On the dense path that mask covers
the full ``(h*w) x (h*w)`` probability matrix, exactly as in the original. On the separable path the
mask is itself separable: the row and column factors are each dropped with ``1 - sqrt(1 - p)`` (and
rescaled), so every probability survives with probability ``1 - p`` and the expectation is unchanged,
but the dropped entries are correlated (they come in rows x columns). The ``content`` kind depends on
the input and draws an ordinary per-sample mask.
"""
import contextlib
import math
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from timm.layers import register_notrace_module

from .autocast import autocast_inputs
from .tracing import is_capturing, refuse_capture

__all__ = [
    'ATTENTION_KINDS', 'PositionalAttention', 'HeadsLinear', 'QuadraticScores', 'GeneralizedScores',
    'LearnedScores', 'ContentScores', 'relative_shifts', 'grid_shifts', 'dense_attention', 'apply_mixing',
    'attend_then_project', 'drop_negligible',
]

ATTENTION_KINDS = ('quadratic', 'generalized', 'learned', 'content')


def relative_shifts(size: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``shifts[q, k] = k - q`` along one axis of ``size`` positions, ``(size, size)``."""
    positions = torch.arange(size, device=device, dtype=dtype)
    return positions[None, :] - positions[:, None]


def grid_shifts(grid_h: int, grid_w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``shifts[q, k] = (row_k - row_q, col_k - col_q)`` for row-major grid positions, ``(h*w, h*w, 2)``."""
    # row and column of every position, written as broadcasts (repeat_interleave with a symbolic size
    # exports to a wrong ONNX graph)
    rows = torch.arange(grid_h, device=device, dtype=dtype)[:, None].expand(grid_h, grid_w).reshape(-1)
    cols = torch.arange(grid_w, device=device, dtype=dtype)[None, :].expand(grid_h, grid_w).reshape(-1)
    return torch.stack([rows[None, :] - rows[:, None], cols[None, :] - cols[:, None]], dim=-1)


class QuadraticScores(nn.Module):
    """Isotropic Gaussian scores: a centre ``mu_h`` (row, col) and a spread ``s_h`` per head.

    ``A_h(delta) = -(s_h^2 / 2) ||delta - mu_h||^2``; the paper's ``alpha_h = s_h^2 / 2`` (positive by
    squaring) and ``Delta_h = mu_h``. Separable: the row and column terms are returned apart.
    """
    separable: bool = True

    def __init__(self, num_heads: int, device=None, dtype=None):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.centers = nn.Parameter(torch.empty(num_heads, 2, **dd))
        self.spreads = nn.Parameter(torch.empty(num_heads, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.centers, std=2.0)
        nn.init.normal_(self.spreads, mean=1.0, std=0.01)

    def axis_scores(self, grid_h: int, grid_w: int) -> Tuple[Tensor, Tensor]:
        """Row scores ``(heads, h, h)`` and column scores ``(heads, w, w)``, indexed ``[head, query, key]``."""
        alpha = (0.5 * self.spreads ** 2)[:, None, None]
        dy = relative_shifts(grid_h, self.centers.device, self.centers.dtype)
        dx = relative_shifts(grid_w, self.centers.device, self.centers.dtype)
        row = -alpha * (dy[None] - self.centers[:, 0, None, None]) ** 2
        col = -alpha * (dx[None] - self.centers[:, 1, None, None]) ** 2
        return row, col

    def grid_scores(self, grid_h: int, grid_w: int) -> Tensor:
        """Scores over the whole grid, ``(heads, h*w, h*w)`` indexed ``[head, query, key]``."""
        shifts = grid_shifts(grid_h, grid_w, self.centers.device, self.centers.dtype)
        offsets = shifts[None] - self.centers[:, None, None, :]  # heads, hw, hw, 2
        return -(0.5 * self.spreads ** 2)[:, None, None] * (offsets ** 2).sum(-1)


class GeneralizedScores(nn.Module):
    """Non-isotropic Gaussian scores: a centre ``mu_h`` and a 2x2 matrix ``S_h`` (Sigma^-1/2) per head.

    ``A_h(delta) = -1/2 (delta - mu_h)^T M_h (delta - mu_h)`` with ``M_h = S_h S_h^T`` (positive
    semi-definite by construction). The cross term makes it non-separable.
    """
    separable: bool = False

    def __init__(self, num_heads: int, device=None, dtype=None):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.centers = nn.Parameter(torch.empty(num_heads, 2, **dd))
        self.spreads = nn.Parameter(torch.empty(num_heads, 2, 2, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.centers, std=2.0)
        with torch.no_grad():
            nn.init.normal_(self.spreads, std=0.01)
            self.spreads.add_(torch.eye(2, device=self.spreads.device, dtype=self.spreads.dtype))

    def precisions(self) -> Tensor:
        """``M_h = S_h S_h^T``, ``(heads, 2, 2)``."""
        return self.spreads @ self.spreads.transpose(-1, -2)

    def axis_scores(self, grid_h: int, grid_w: int) -> Tuple[Tensor, Tensor]:
        raise RuntimeError('generalized (non-isotropic) Gaussian scores are not separable')

    def grid_scores(self, grid_h: int, grid_w: int) -> Tensor:
        shifts = grid_shifts(grid_h, grid_w, self.centers.device, self.centers.dtype)
        offsets = shifts[None] - self.centers[:, None, None, :]  # heads, hw, hw, 2
        precisions = self.precisions()
        # quadratic form offsets^T M offsets, written out for the symmetric 2x2 M
        dy, dx = offsets[..., 0], offsets[..., 1]
        m_yy = precisions[:, 0, 0, None, None]
        m_xx = precisions[:, 1, 1, None, None]
        m_yx = precisions[:, 0, 1, None, None]
        return -0.5 * (m_yy * dy * dy + 2.0 * m_yx * dy * dx + m_xx * dx * dx)


class LearnedScores(nn.Module):
    """Learned relative-position scores, no content: one table per axis and a key map per axis.

    ``A_h(delta) = k_v(E_v[delta_row])_h + k_u(E_u[delta_col])_h``; shifts beyond ``max_shift`` are
    clipped, so any grid size works. Separable: the row and column terms are returned apart.
    """
    separable: bool = True

    def __init__(self, dim: int, num_heads: int, max_shift: int = 15, device=None, dtype=None):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.max_shift = max_shift
        self.row_shift_embed = nn.Embedding(2 * max_shift + 1, dim, **dd)
        self.col_shift_embed = nn.Embedding(2 * max_shift + 1, dim, **dd)
        self.row_keys = nn.Linear(dim, num_heads, bias=False, **dd)
        self.col_keys = nn.Linear(dim, num_heads, bias=False, **dd)

    def _table_index(self, size: int) -> Tensor:
        shifts = relative_shifts(size, self.row_shift_embed.weight.device, torch.float32).long()
        return shifts.clamp(-self.max_shift, self.max_shift) + self.max_shift

    def axis_scores(self, grid_h: int, grid_w: int) -> Tuple[Tensor, Tensor]:
        row = self.row_keys(self.row_shift_embed(self._table_index(grid_h)))  # h, h, heads
        col = self.col_keys(self.col_shift_embed(self._table_index(grid_w)))  # w, w, heads
        return row.permute(2, 0, 1), col.permute(2, 0, 1)

    def grid_scores(self, grid_h: int, grid_w: int) -> Tensor:
        row, col = self.axis_scores(grid_h, grid_w)
        # scores[n, (i, j), (k, l)] = row[n, i, k] + col[n, j, l]
        scores = row[:, :, None, :, None] + col[:, None, :, None, :]
        return scores.reshape(self.num_heads, grid_h * grid_w, grid_h * grid_w)


class ContentScores(nn.Module):
    """Query/key content scores ``q_h . k_h / sqrt(D)`` with ``q = X W_q + b``, ``k = X W_k + b``."""

    def __init__(self, dim: int, num_heads: int, device=None, dtype=None):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.query = nn.Linear(dim, num_heads * dim, **dd)
        self.key = nn.Linear(dim, num_heads * dim, **dd)

    def forward(self, tokens: Tensor) -> Tuple[Tensor, Tensor]:
        """Queries and keys ``(B, heads, N, D)`` for tokens ``(B, N, D)``."""
        B, N, D = tokens.shape
        q = self.query(tokens).view(B, N, self.num_heads, D).transpose(1, 2)
        k = self.key(tokens).view(B, N, self.num_heads, D).transpose(1, 2)
        return q, k


def negligible_below(dtype: torch.dtype) -> float:
    """``eps**3`` of ``dtype``: a probability this small changes a weighted average by less than its
    rounding unless the averaged values span more than ``1 / eps**2`` (1e14 in float32)."""
    if dtype == torch.float64:
        eps = 2.220446049250313e-16
    elif dtype == torch.bfloat16:
        eps = 0.0078125
    elif dtype == torch.float16:
        eps = 0.0009765625
    else:
        eps = 1.1920928955078125e-07
    return eps ** 3


def drop_negligible(probs: Tensor) -> Tensor:
    """Attention probabilities below :func:`negligible_below` set to exactly zero.

    Far from its centre a Gaussian head's probabilities are astronomically small (``exp(-200)`` and
    less), and their products with activations or gradients land in the subnormal range, which x86 CPUs
    compute in microcode: every product with the probabilities ran about 3x slower. Zeroing them keeps
    the products normal; the output changes below float rounding (see :func:`negligible_below`) and the
    gradient of a zeroed entry, which is as small as the entry, is dropped with it.
    """
    return torch.where(probs < negligible_below(probs.dtype), torch.zeros_like(probs), probs)


def apply_mixing(x: Tensor, probs: List[Tensor]) -> Tensor:
    """Apply content-free probabilities to a grid-major ``x`` (``h x w x B x D``) for every head at once.

    ``probs`` is ``[row (heads, h, h), col (heads, w, w)]`` (separable: the grid probabilities are their
    Kronecker product) or ``[grid (heads, h*w, h*w)]``; the result is ``heads x h x w x B x D``.
    """
    H, W, B, D = x.shape
    if len(probs) == 2:
        row_probs, col_probs = probs[0], probs[1]
        heads = row_probs.shape[0]
        # rows of every head at once: (heads*H, H) @ (H, W*B*D) -> (heads*H, W*B*D)
        mixed = torch.mm(row_probs.reshape(heads * H, H), x.reshape(H, W * B * D))
        # columns: (heads, 1, W, W) @ (heads, H, W, B*D) -> (heads, H, W, B*D)
        mixed = torch.matmul(col_probs[:, None], mixed.view(heads, H, W, B * D))
        return mixed.view(heads, H, W, B, D)
    grid_probs = probs[0]
    # every head in one product: (heads, HW, HW) @ (HW, B*D) -> (heads, HW, B*D)
    mixed = torch.matmul(grid_probs, x.reshape(H * W, B * D))
    return mixed.view(grid_probs.shape[0], H, W, B, D)


@register_notrace_module  # shapes drive the computation; FX keeps the layer whole
class PositionalAttention(nn.Module):
    """Multi-head positional self-attention over a token grid.

    ``forward``: ``B x h x w x D -> B x h x w x (heads*D)``; output channel ``n * D + d`` is channel ``d`` of
    head ``n``'s weighted average of the input. With ``grid_major=True`` (as the models use it) ``forward``
    is :meth:`mix`: the same on the layout ``h x w x B x D -> heads x h x w x B x D``, where every step is
    one large matrix product and no tensor of the size of the output is ever permuted.

    In eval mode without autograd the probabilities are cached per grid size and recomputed only when a
    parameter changes (in place, e.g. an optimizer step or ``load_state_dict``, or by replacement).
    """

    def __init__(
            self,
            dim: int,
            num_heads: int,
            kind: str = 'quadratic',
            attn_drop: float = 0.1,
            max_shift: int = 15,
            dense: bool = False,
            grid_major: bool = False,
            device=None,
            dtype=None,
    ):
        super().__init__()
        if kind not in ATTENTION_KINDS:
            raise ValueError(f'attention kind {kind!r} is not one of {ATTENTION_KINDS}')
        if num_heads < 1:
            raise ValueError(f'num_heads must be >= 1, got {num_heads}')
        dd = {'device': device, 'dtype': dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.kind = kind
        self.attn_drop = attn_drop
        self.dense = dense
        if kind == 'quadratic':
            self.position = QuadraticScores(num_heads, **dd)
        elif kind == 'generalized':
            self.position = GeneralizedScores(num_heads, **dd)
        else:
            self.position = LearnedScores(dim, num_heads, max_shift=max_shift, **dd)
        self.content = ContentScores(dim, num_heads, **dd) if kind == 'content' else None
        self.separable: bool = self.position.separable and self.content is None
        self.grid_major = grid_major
        self._probs_cache: Dict = {}

    def position_probs(self, grid_h: int, grid_w: int) -> Tensor:
        """Content-free attention probabilities ``(heads, h*w, h*w)`` as ``[head, query, key]``, no dropout.

        For the ``content`` kind this is the positional part alone.
        """
        return drop_negligible(self.position.grid_scores(grid_h, grid_w).softmax(dim=-1))

    def forward(self, x: Tensor) -> Tensor:
        if self.grid_major:
            return self.mix(x)
        B, H, W, D = x.shape
        mixed = self.mix(x.permute(1, 2, 0, 3).contiguous())  # heads, H, W, B, D
        return mixed.permute(3, 1, 2, 0, 4).reshape(B, H, W, self.num_heads * D)

    def mix(self, x: Tensor) -> Tensor:
        """Grid-major attention: ``x`` is ``h x w x B x D``, the result ``heads x h x w x B x D``."""
        if self.content is not None:
            return self._mix_content(x)
        return apply_mixing(x, self.mixing_probs(x.shape[0], x.shape[1]))

    def mixing_probs(self, grid_h: int, grid_w: int) -> List[Tensor]:
        """What a content-free forward applies, dropout included: ``[row (heads, h, h), col (heads, w, w)]``
        on the separable path, ``[grid (heads, h*w, h*w)]`` on the dense one (see :func:`apply_mixing`)."""
        if self.separable and not self.dense:
            row_probs, col_probs = self._axis_probs(grid_h, grid_w)
            if self.training and self.attn_drop > 0.:
                axis_drop = 1.0 - math.sqrt(1.0 - self.attn_drop)
                row_probs = F.dropout(row_probs, axis_drop, True)
                col_probs = F.dropout(col_probs, axis_drop, True)
            return [row_probs, col_probs]
        probs = self._grid_probs(grid_h, grid_w)
        if self.training and self.attn_drop > 0.:
            probs = F.dropout(probs, self.attn_drop, True)
        return [probs]

    def _axis_probs(self, grid_h: int, grid_w: int) -> Tuple[Tensor, Tensor]:
        if torch.jit.is_scripting():
            return self._compute_axis_probs(grid_h, grid_w)
        else:
            return self._cached(self._compute_axis_probs, grid_h, grid_w)

    def _grid_probs(self, grid_h: int, grid_w: int) -> Tensor:
        if torch.jit.is_scripting():
            return self.position_probs(grid_h, grid_w)
        else:
            return self._cached(self.position_probs, grid_h, grid_w)

    def _compute_axis_probs(self, grid_h: int, grid_w: int) -> Tuple[Tensor, Tensor]:
        row_scores, col_scores = self.position.axis_scores(grid_h, grid_w)
        return drop_negligible(row_scores.softmax(dim=-1)), drop_negligible(col_scores.softmax(dim=-1))

    @torch.jit.unused
    def _cached(self, compute: Callable, grid_h: int, grid_w: int):
        """``compute(grid_h, grid_w)``, reused while nothing it depends on has changed (eval, no autograd)."""
        if self.training or torch.is_grad_enabled() or torch.compiler.is_compiling() or is_capturing():
            # a captured graph computes the probabilities from the parameters (and any grid size)
            return compute(grid_h, grid_w)
        # a parameter changes its version when modified in place and its storage when replaced
        key = (compute.__name__, grid_h, grid_w) + tuple(
            (p.data_ptr(), p._version, p.dtype, p.device) for p in self.position.parameters())
        if key not in self._probs_cache:
            self._probs_cache = {key: compute(grid_h, grid_w)}
        return self._probs_cache[key]

    def _mix_content(self, x: Tensor) -> Tensor:
        H, W, B, D = x.shape
        content = self.content
        assert content is not None
        tokens = x.reshape(H * W, B, D).transpose(0, 1)  # B, HW, D
        q, k = content(tokens)  # B, heads, HW, D
        position_scores = self.position.grid_scores(H, W)  # heads, HW, HW
        values = tokens[:, None].expand(B, self.num_heads, H * W, D)
        out = F.scaled_dot_product_attention(
            q, k, values,
            attn_mask=position_scores.to(q.dtype)[None],
            dropout_p=self.attn_drop if self.training else 0.,
        )  # B, heads, HW, D
        return out.permute(1, 2, 0, 3).reshape(self.num_heads, H, W, B, D)

    def extra_repr(self) -> str:
        return f'dim={self.dim}, num_heads={self.num_heads}, kind={self.kind}, dense={self.dense}'


def _project_heads(heads: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``bias + sum_n heads[n] @ weight[:, n*D:(n+1)*D]^T`` for ``heads`` of shape (heads, tokens, D)."""
    num_heads, _, D = heads.shape
    out = torch.mm(heads[0], weight[:, :D].t())
    for n in range(1, num_heads):
        # the out= form accumulates in place and, unlike addmm_, is seen by FLOP counters
        torch.addmm(out, heads[n], weight[:, n * D:(n + 1) * D].t(), out=out)
    if bias is not None:
        out.add_(bias)
    return out


def _project_heads_backward(heads: Tensor, weight: Tensor, grad_out: Tensor, needs: Tuple[bool, bool, bool]):
    """Gradients of :func:`_project_heads`, every head's block written straight into place (autograd's own
    backward of per-head slices would zero-fill and add full-size buffers once per head)."""
    num_heads, _, D = heads.shape
    grad_heads = grad_weight = grad_bias = None
    if needs[0]:
        grad_heads = heads.new_empty(heads.shape)
        for n in range(num_heads):
            torch.mm(grad_out, weight[:, n * D:(n + 1) * D], out=grad_heads[n])
    if needs[1]:
        # row blocks of the transposed gradient are contiguous: fill them in place
        grad_weight_t = weight.new_empty(weight.shape[1], weight.shape[0])
        for n in range(num_heads):
            torch.mm(heads[n].t(), grad_out, out=grad_weight_t[n * D:(n + 1) * D])
        grad_weight = grad_weight_t.t()
    if needs[2]:
        grad_bias = grad_out.sum(0)
    return grad_heads, grad_weight, grad_bias


class _HeadsLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, heads: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        refuse_capture('HeadsLinear\'s autograd Function')
        ctx.save_for_backward(heads, weight)
        ctx.has_bias = bias is not None
        return _project_heads(heads, weight, bias)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        heads, weight = ctx.saved_tensors
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        return _project_heads_backward(heads, weight, grad_out, needs)


# Samples per chunk of _AttendThenProject on the CPU: about this many tokens, so that a chunk of one head
# (1024 tokens x 400 channels = 1.6 MB in float32) and its intermediates stay in the core's L2 cache while
# the head's two small products and its share of Value run; whole-batch intermediates went to DRAM.
CPU_TOKENS_PER_CHUNK = 1024


def _samples_per_chunk(x: Tensor) -> int:
    """Batch samples per chunk for grid-major ``x`` (``h x w x B x D``): the whole batch off the CPU, where
    every extra chunk is another round of kernel launches and bandwidth is plentiful."""
    H, W, B = x.shape[0], x.shape[1], x.shape[2]
    if x.device.type != 'cpu':
        return B
    return max(1, min(B, CPU_TOKENS_PER_CHUNK // (H * W)))


class _HeadMixer:
    """Applies one head's content-free probabilities to a chunk ``h x w x b x D`` into reused buffers."""

    def __init__(self, probs: Sequence[Tensor], x: Tensor, max_samples: int):
        H, W, _, D = x.shape
        self.probs = probs
        self.separable = len(probs) == 2
        size = H * W * max_samples * D
        self.row_buffer = x.new_empty(size) if self.separable else None
        self.head_buffer = x.new_empty(size)

    def __call__(self, chunk: Tensor, n: int) -> Tuple[Optional[Tensor], Tensor]:
        """``(row-mixed chunk (h, w*b*D) or None, head n (h*w*b, D))``; both live in the buffers."""
        H, W, b, D = chunk.shape
        size = chunk.numel()
        head = self.head_buffer[:size]
        if not self.separable:
            torch.mm(self.probs[0][n], chunk.view(H * W, b * D), out=head.view(H * W, b * D))
            return None, head.view(H * W * b, D)
        row = self.row_buffer[:size].view(H, W * b * D)
        torch.mm(self.probs[0][n], chunk.view(H, W * b * D), out=row)
        # columns: (h, w, w) @ (h, w, b*D), the head's (w, w) matrix shared by every row
        torch.bmm(self.probs[1][n].expand(H, W, W), row.view(H, W, b * D), out=head.view(H, W, b * D))
        return row, head.view(H * W * b, D)


def _batch_chunks(x: Tensor) -> List[Tuple[int, int]]:
    B, step = x.shape[2], _samples_per_chunk(x)
    return [(start, min(start + step, B)) for start in range(0, B, step)]


class _AttendThenProject(torch.autograd.Function):
    """``Value(apply_mixing(x, probs))`` one head at a time, keeping only ``x`` and the probabilities.

    The stacked heads are ``heads`` times larger than ``x`` and cheap to recompute (two small products on
    the separable path). Forward mixes one head and immediately adds its share of the projection; backward
    recomputes each head the same way and applies the transposed products by hand. On the CPU the batch is
    processed in chunks of a few samples (the mixing is per sample), so each head's intermediates stay in
    cache. No heads-sized tensor ever exists, in forward or backward.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], *probs: Tensor) -> Tensor:
        refuse_capture('the attention + Value autograd Function')
        H, W, B, D = x.shape
        num_heads, out_features = probs[0].shape[0], weight.shape[0]
        chunks = _batch_chunks(x)
        mix = _HeadMixer(probs, x, chunks[0][1])
        out = x.new_empty(H, W, B, out_features)
        for start, end in chunks:
            chunk = x[:, :, start:end].contiguous()  # h, w, b, D
            out_chunk = out.view(H * W * B, out_features) if len(chunks) == 1 else \
                x.new_empty(H * W * (end - start), out_features)
            for n in range(num_heads):
                _, head = mix(chunk, n)
                # addmm(out=) accumulates in place and, unlike addmm_, is seen by FLOP counters
                torch.addmm(out_chunk, head, weight[:, n * D:(n + 1) * D].t(), beta=0. if n == 0 else 1.,
                            out=out_chunk)
            if bias is not None:
                out_chunk.add_(bias)
            if len(chunks) > 1:
                out[:, :, start:end] = out_chunk.view(H, W, end - start, out_features)
        ctx.save_for_backward(x, weight, *probs)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, *probs = ctx.saved_tensors
        H, W, B, D = x.shape
        num_heads, out_features = probs[0].shape[0], weight.shape[0]
        needs_x, needs_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        needs_probs = ctx.needs_input_grad[3:]
        separable = len(probs) == 2
        grad_x = x.new_empty(x.shape) if needs_x else None  # contiguous, whatever the layout of x
        # row blocks of the transposed weight gradient are contiguous: every head accumulates in place
        grad_weight_t = weight.new_zeros(weight.shape[1], out_features) if needs_weight else None
        grad_probs = [torch.zeros_like(p) if needed else None for p, needed in zip(probs, needs_probs)]
        needs_head_grad = needs_x or any(needs_probs)
        chunks = _batch_chunks(x)
        mix = _HeadMixer(probs, x, chunks[0][1])
        head_grad_buffer = x.new_empty(mix.head_buffer.shape)
        row_grad_buffer = x.new_empty(mix.head_buffer.shape) if separable else None
        for start, end in chunks:
            b = end - start
            chunk = x[:, :, start:end].contiguous()  # h, w, b, D
            grad_chunk = grad_out[:, :, start:end].reshape(H * W * b, out_features)
            grad_x_chunk = grad_x.view(H * W, B * D) if needs_x and len(chunks) == 1 else \
                (x.new_empty(H * W, b * D) if needs_x else None)
            for n in range(num_heads):
                row, head = mix(chunk, n)
                if grad_weight_t is not None:
                    block = grad_weight_t[n * D:(n + 1) * D]
                    torch.addmm(block, head.t(), grad_chunk, out=block)
                if not needs_head_grad:
                    continue
                head_grad = head_grad_buffer[:chunk.numel()].view(H * W * b, D)
                torch.mm(grad_chunk, weight[:, n * D:(n + 1) * D], out=head_grad)
                first = 0. if n == 0 else 1.
                if separable:
                    head_grad = head_grad.view(H, W, b * D)
                    row_probs, col_probs = probs
                    if needs_probs[1]:
                        # d/dcol[j, l] = sum over rows i of head_grad[i, j, :] . row[i, l, :]
                        grad_probs[1][n] += torch.bmm(head_grad, row.view(H, W, b * D).transpose(1, 2)).sum(0)
                    row_grad = row_grad_buffer[:chunk.numel()].view(H, W, b * D)
                    torch.bmm(col_probs[n].t().expand(H, W, W), head_grad, out=row_grad)
                    row_grad = row_grad.view(H, W * b * D)
                    if needs_probs[0]:
                        grad_probs[0][n] += torch.mm(row_grad, chunk.view(H, W * b * D).t())
                    if grad_x_chunk is not None:
                        rows = grad_x_chunk.view(H, -1)
                        torch.addmm(rows, row_probs[n].t(), row_grad, beta=first, out=rows)
                else:
                    head_grad = head_grad.view(H * W, b * D)
                    if needs_probs[0]:
                        grad_probs[0][n] += torch.mm(head_grad, chunk.view(H * W, b * D).t())
                    if grad_x_chunk is not None:
                        torch.addmm(grad_x_chunk, probs[0][n].t(), head_grad, beta=first, out=grad_x_chunk)
            if grad_x is not None and len(chunks) > 1:
                grad_x[:, :, start:end] = grad_x_chunk.view(H, W, b, D)
        grad_weight = grad_weight_t.t() if grad_weight_t is not None else None
        grad_bias = grad_out.reshape(-1, out_features).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return (grad_x, grad_weight, grad_bias, *grad_probs)


def attend_then_project(attn: 'PositionalAttention', value: 'HeadsLinear', x: Tensor) -> Tensor:
    """``value(attn(x))`` for grid-major ``x`` (``h x w x B x D -> h x w x B x out``).

    Content-free kinds run one head at a time without ever building the stacked heads. With autograd that
    means recomputing each head in backward, which only pays on the separable path (two small products);
    the dense path and the content kind run as plain ``value(attn(x))`` when gradients are needed. While a
    graph is captured (export, tracing) it is always the plain ``value(attn(x))``: whole-batch products, no
    autograd Function (see :mod:`sa_vision.layers.tracing`).
    """
    cheap_to_recompute = attn.separable and not attn.dense
    if attn.content is not None or is_capturing() or (torch.is_grad_enabled() and not cheap_to_recompute):
        return value(attn.mix(x))
    probs = attn.mixing_probs(x.shape[0], x.shape[1])
    x, weight, bias, *probs = autocast_inputs(x, value.weight, value.bias, *probs)
    return _AttendThenProject.apply(x, weight, bias, *probs)


@register_notrace_module  # loops over the stacked heads; FX keeps it whole
class HeadsLinear(nn.Linear):
    """``Linear(heads*D -> out)`` applied to heads stacked in front: ``heads x ... x D -> ... x out``.

    Same parameters (and state dict) as the Linear over the concatenated heads, but it reads each head's
    block where it lies, as one accumulated matrix product per head, so the stacked heads are never
    permuted into the concatenated layout.
    """

    def forward(self, x: Tensor) -> Tensor:
        heads, D = x.shape[0], x.shape[-1]
        rows = x.reshape(heads, -1, D)  # heads, tokens, D
        if torch.jit.is_scripting():
            out = self._plain_forward(rows)
        elif is_capturing():
            # export / tracing: out-of-place products, no autograd Function
            out = self._plain_forward(rows)
        else:
            rows, weight, bias = autocast_inputs(rows, self.weight, self.bias)
            out = _HeadsLinearFunction.apply(rows, weight, bias)
        return out.view(list(x.shape[1:-1]) + [self.out_features])

    def _plain_forward(self, rows: Tensor) -> Tensor:
        """The same accumulated per-head products out of place (TorchScript, export, tracing)."""
        D = rows.shape[-1]
        out = torch.mm(rows[0], self.weight[:, :D].t())
        for n in range(1, rows.shape[0]):
            out = torch.addmm(out, rows[n], self.weight[:, n * D:(n + 1) * D].t())
        if self.bias is not None:
            out = out + self.bias
        return out


@contextlib.contextmanager
def dense_attention(model: nn.Module, enabled: bool = True) -> Iterator[nn.Module]:
    """Run every :class:`PositionalAttention` in ``model`` through the plain dense formula while active."""
    layers = [m for m in model.modules() if isinstance(m, PositionalAttention)]
    previous = [m.dense for m in layers]
    for m in layers:
        m.dense = enabled
    try:
        yield model
    finally:
        for m, was_dense in zip(layers, previous):
            m.dense = was_dense
