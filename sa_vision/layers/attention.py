""" Content-free positional multi-head self-attention of Cordonnier, Loukas & Jaggi (ICLR 2020, Sec. 2-4, Eq. 9)

Paper: https://arxiv.org/abs/1911.03584. How each path computes it exactly and fast: ``docs/attention.md``.
"""
import contextlib
import math
from typing import ContextManager, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_module, use_fused_attn
from torch import Tensor, nn

from .attention_autograd import _AttendThenProject, _HeadsLinearFunction, separable_mixing
from .attention_path import AttentionPath, current_path
from .autocast import autocast_inputs, has_autocast
from .scores import CONV_INIT_ALPHA, ContentScores, GeneralizedScores, LearnedScores, QuadraticScores
from .tracing import is_capturing
from .triton_mixing import mix_and_project

__all__ = [
    'ATTENTION_KINDS', 'PositionalAttention', 'HeadsLinear', 'apply_mixing', 'attend_then_project', 'drop_negligible',
    'negligible_below', 'project_then_mix',
]

ATTENTION_KINDS = ('quadratic', 'generalized', 'learned', 'content')

def negligible_below(dtype: torch.dtype) -> float:
    """``eps**3`` of ``dtype``: a probability this small changes a weighted average by less than its rounding."""
    # torch.finfo(dtype).eps written out: TorchScript (torch.jit.script of the models) cannot compile torch.finfo
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
    """Attention probabilities below :func:`negligible_below` set to exactly zero: far Gaussian probabilities make
    subnormal products, slow on x86 CPUs (docs/attention.md)."""
    return probs.masked_fill(probs < negligible_below(probs.dtype), 0.)


def apply_mixing(x: Tensor, probs: List[Tensor]) -> Tensor:
    """Apply content-free probabilities to a grid-major ``x`` (``h x w x B x D -> heads x h x w x B x D``);
    ``probs``: ``[row (heads, h, h), col (heads, w, w)]`` (separable) or ``[grid (heads, h*w, h*w)]``."""
    H, W, B, D = x.shape
    if len(probs) == 2:
        row_probs, col_probs = probs[0], probs[1]
        heads = row_probs.shape[0]
        # rows of every head at once: (heads*H, H) @ (H, W*B*D) -> (heads*H, W*B*D)
        mixed = torch.mm(row_probs.reshape(heads * H, H), x.reshape(H, W * B * D))
        # columns: (heads*H, W, W) @ (heads*H, W, B*D) -> (heads*H, W, B*D); an explicit bmm on a per-row copy of
        # the probabilities, where matmul's broadcasting would add half a dozen view / expand ops
        col_per_row = col_probs.repeat(1, H, 1).view(heads * H, W, W)
        mixed = torch.bmm(col_per_row, mixed.view(heads * H, W, B * D))
        return mixed.view(heads, H, W, B, D)
    grid_probs = probs[0]
    # every head in one product: (heads, HW, HW) @ (HW, B*D) -> (heads, HW, B*D)
    mixed = torch.matmul(grid_probs, x.reshape(H * W, B * D))
    return mixed.view(grid_probs.shape[0], H, W, B, D)


def project_then_mix(x: Tensor, probs: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """Dense content-free attention + Value, projected first: ``out[q] = bias + sum_n sum_k probs[n, q, k] x[k]
    W_n^T`` for grid-major ``x`` (``h x w x B x D -> h x w x B x out``), ``probs`` ``(heads, h*w, h*w)``, ``weight``
    the Value's ``(out, heads*D)`` (``W_n``: head n's block), in plain autograd with no copy of a heads-sized tensor.

    Head-major: ``Y[n, k, b, :] = x[k, b] W_n^T`` is one batched product over the heads (``x`` broadcast, no copy)
    whose result is already the mixing's ``(heads*h*w, B*out)`` operand, the reduction index ``(n, k)`` contiguous;
    mixing by ``probs`` side by side, ``(h*w, heads*h*w)``, is one GEMM straight into grid-major. Every GEMM but
    one backward product is a plain 2-D one: ``x``'s gradient is the heads' products summed (one heads-sized
    tensor, as the dense path's backward copies one). Batch-major (``Y`` as ``B x (h*w*heads) x out``) would mix by
    a broadcast ``probs``, whose gradient autograd forms as ``B x h*w x heads*h*w`` before summing: 4x the
    heads-sized tensor at width 64, 0.64x at 400, plus four permutes of the activations."""
    H, W, B, D = x.shape
    heads, out_features = probs.shape[0], weight.shape[0]
    # cast before the broadcast: autocast would cast the expanded operand of bmm, writing it heads times
    x = autocast_inputs(x)[0]
    tokens = x.reshape(1, H * W * B, D).expand(heads, H * W * B, D)
    per_head = weight.view(out_features, heads, D).permute(1, 2, 0)  # heads, D, out (a view)
    projected = torch.bmm(tokens, per_head)  # heads, h*w*B, out
    side_by_side = probs.transpose(0, 1).reshape(H * W, heads * H * W)  # [q, n*h*w + k] = probs[n, q, k]
    out = torch.mm(side_by_side, projected.view(heads * H * W, B * out_features))  # h*w, B*out
    if bias is not None:  # in the products' dtype, as F.linear adds it under autocast
        out = out.view(H * W * B, out_features) + bias.to(out.dtype)
    return out.view(H, W, B, out_features)


def _autocast_off(device_type: str) -> ContextManager:
    """Autocast off for the positional scores and their softmax: in bfloat16 the far shifts' squared differences
    lose whole units (docs/attention.md); the products that apply them still run under autocast."""
    if not has_autocast(device_type):  # 'meta' and the like: no autocast to leave
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def _same_values(seen: List[Tensor], now: List[Tensor]) -> bool:
    """Whether the positional parameters ``now`` hold exactly the values ``seen`` (the eval cache's key): an edit
    through ``.data`` bumps no version counter, so the values themselves are compared."""
    return len(seen) == len(now) and all(
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(seen, now))


@register_notrace_module  # shapes drive the computation; FX keeps the layer whole
class PositionalAttention(nn.Module):
    """Multi-head positional self-attention over a token grid (paper Sec. 2.3; Sec. 3, Eq. 9).

    ``B x h x w x D -> B x h x w x (heads*D)`` (channel ``n * D + d`` is channel ``d`` of head ``n``), or with
    ``grid_major=True`` :meth:`mix`, ``h x w x B x D -> heads x h x w x B x D``."""
    dense: Optional[bool]
    project_first: Optional[bool]
    # eager-only (TorchScript has no tuple keys): a model scripted after an eval forward computes its probabilities
    __jit_ignored_attributes__ = ['_probs_cache']

    def __init__(
            self,
            dim: int,
            num_heads: int,
            kind: str = 'quadratic',
            attn_drop: float = 0.1,
            max_shift: int = 15,
            dense: Optional[bool] = None,
            grid_major: bool = False,
            pos_init: str = 'paper',
            pos_init_alpha: float = CONV_INIT_ALPHA,
            device=None,
            dtype=None,
    ):
        """
        Args:
            dim: Token width D; every head attends over all D channels and returns D (``D_h = D_out``, Sec. 4.3).
            num_heads: Heads N_h (Theorem 1: N_h heads can express a sqrt(N_h) x sqrt(N_h) convolution).
            kind: The scores, one of ``ATTENTION_KINDS``: 'quadratic', the isotropic Gaussian of Eq. 9;
                'generalized', the non-isotropic one of App. A.1 (Eq. 16); 'learned', a learned relative encoding
                without content (Sec. 4.3); 'content', the learned one plus query/key content scores (Eq. 8 without
                its query-position term).
            attn_drop: Dropout probability of the attention probabilities in training (0.1 in App. A.4).
            max_shift: 'learned' and 'content' only: the largest shift per axis, in grid cells, with its own
                embedding; longer shifts share the last one.
            dense: True / False force the dense / separable mixing of the separable kinds ('quadratic',
                'learned'), None leaves it to :func:`choose_path` (docs/attention.md).
            grid_major: Take and return grid-major ``h x w x B x D -> heads x h x w x B x D`` (the models' layers).
            pos_init: 'paper', the paper's random start (Sec. 4.2, App. A.1; PyTorch's for the learned tables),
                or 'conv', the first floor(sqrt(N_h))^2 heads on the shifts of Theorem 1's kernel.
            pos_init_alpha: 'conv' only: those heads' sharpness, Eq. 9's alpha (Lemma 2 takes it to infinity).
        """
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
        init = dict(init=pos_init, init_alpha=pos_init_alpha)  # paper's random init or Theorem 1's kernel
        if kind == 'quadratic':
            self.position = QuadraticScores(num_heads, **init, **dd)
        elif kind == 'generalized':
            self.position = GeneralizedScores(num_heads, **init, **dd)
        else:
            self.position = LearnedScores(dim, num_heads, max_shift=max_shift, **init, **dd)
        self.content = ContentScores(dim, num_heads, **dd) if kind == 'content' else None
        # the content kind: SDPA, or the explicit formula; named as timm's attention modules name this switch
        # (use_fused_attn, TIMM_FUSED_ATTN), so that setting fused_attn = False works on ours as on theirs
        self.fused_attn = use_fused_attn()
        self.separable: bool = self.position.separable and self.content is None
        self.grid_major = grid_major
        # choose_path's overrides (set by batched_heads, fused_mix_and_project, project_first): all heads batched
        # instead of the per-head kernels on the CPU, the fused Triton kernel, projected first (None: its default)
        self.batched_heads, self.fused_kernel, self.project_first = False, False, None
        self._probs_cache: Dict = {}

    def position_probs(self, grid_h: int, grid_w: int) -> Tensor:
        """Content-free probabilities ``(heads, h*w, h*w)`` as ``[head, query, key]``, no dropout (for ``content``
        the positional part alone)."""
        return drop_negligible(self.position.grid_scores(grid_h, grid_w).softmax(dim=-1).to(
            self.position.param_dtype()))

    def forward(self, x: Tensor) -> Tensor:
        if self.grid_major:
            return self.mix(x)
        B, H, W, D = x.shape
        mixed = self.mix(x.permute(1, 2, 0, 3).contiguous())  # heads, H, W, B, D
        return mixed.permute(3, 1, 2, 0, 4).reshape(B, H, W, self.num_heads * D)

    def path(self, x: Tensor, batched: bool = False, tokens: Optional[int] = None) -> AttentionPath:
        """How this layer runs on grid-major ``x`` now (:func:`choose_path`); ``batched``: Value asks for it;
        ``tokens``: the grid's, where ``x`` is no grid-major input (a parameter, of its device and dtype)."""
        return current_path(x, self.training, self.separable, self.content is not None, self.dense,
                             self.batched_heads or batched, self.fused_kernel, self.project_first, tokens)

    def mix(self, x: Tensor, path: Optional[AttentionPath] = None) -> Tensor:
        """Grid-major attention: ``x`` is ``h x w x B x D``, the result ``heads x h x w x B x D``."""
        if self.content is not None:
            return self._mix_content(x)
        if path is None:
            path = self.path(x)
        return apply_mixing(x, self._mixing_probs(x.shape[0], x.shape[1], path))

    @torch.jit.unused
    def mixing_probs(self, grid_h: int, grid_w: int) -> List[Tensor]:
        """What a content-free forward on the parameters' device and dtype applies, dropout included: ``[row,
        col]`` for separable mixing, ``[grid]`` for dense (:func:`apply_mixing`, :func:`choose_path`)."""
        return self._mixing_probs(grid_h, grid_w, self.path(next(self.position.parameters()), tokens=grid_h * grid_w))

    def _mixing_probs(self, grid_h: int, grid_w: int, path: AttentionPath) -> List[Tensor]:
        if torch.jit.is_scripting():
            probs = self._probs(grid_h, grid_w, path.dense)
        else:
            state = [t.detach() for t in (*self.position.parameters(), *self.position.buffers())]
            key = (path.dense, grid_h, grid_w)
            entry = self._probs_cache.get(key) if path.cache_probs else None
            if entry is not None and _same_values(entry[0], state):
                probs = entry[1]
            else:
                with _autocast_off(state[0].device.type):
                    probs = self._probs(grid_h, grid_w, path.dense)
                if path.cache_probs:
                    self._probs_cache = {key: ([t.clone() for t in state], probs)}
        if path.dense:
            if self.training and self.attn_drop > 0.:
                probs = [F.dropout(probs[0], self.attn_drop, True)]
            return probs
        if self.training and self.attn_drop > 0.:
            axis_drop = 1.0 - math.sqrt(1.0 - self.attn_drop)  # separable mask: keeps each entry with 1 - attn_drop
            probs = [F.dropout(p, axis_drop, True) for p in probs]
        if len(probs) == 1:  # square grid: [row; col] stacked, (2, heads, n, n)
            return list(probs[0].unbind(0))
        return probs

    def _probs(self, grid_h: int, grid_w: int, dense: bool) -> List[Tensor]:
        """The content-free probabilities, no dropout: ``[grid]``, ``[row, col]``, or on a square grid
        ``[(2, heads, n, n)]`` (one softmax, threshold and dropout for both axes)."""
        dtype = self.position.param_dtype()  # the scores of 16-bit Gaussian parameters are float32 (scores._exact)
        if dense:
            return [drop_negligible(self.position.grid_scores(grid_h, grid_w).softmax(dim=-1).to(dtype))]
        if torch.jit.is_scripting():
            square = grid_h == grid_w
        else:
            # a captured graph must serve every grid size: even comparing symbolic sizes would fix them by a guard
            square = not is_capturing() and grid_h == grid_w
        if square:
            return [drop_negligible(self.position.square_axis_scores(grid_h).softmax(dim=-1).to(dtype))]
        row_scores, col_scores = self.position.axis_scores(grid_h, grid_w)
        return [drop_negligible(row_scores.softmax(dim=-1).to(dtype)),
                drop_negligible(col_scores.softmax(dim=-1).to(dtype))]

    @torch.jit.unused
    def clear_probs_cache(self) -> None:
        """Forget the cached eval probabilities (the next eval forward computes them, e.g. to count its work)."""
        self._probs_cache = {}

    def _content_inputs(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Tokens ``(B, HW, D)``, queries and keys ``(B, heads, HW, D)`` and positional scores ``(heads, HW, HW)``."""
        H, W, B, D = x.shape
        content = self.content
        assert content is not None
        tokens = x.reshape(H * W, B, D).transpose(0, 1)  # B, HW, D
        q, k = content(tokens)  # B, heads, HW, D
        if torch.jit.is_scripting():
            position_scores = self.position.grid_scores(H, W)  # heads, HW, HW
        else:
            with _autocast_off(next(self.position.parameters()).device.type):
                position_scores = self.position.grid_scores(H, W)
        return tokens, q, k, position_scores

    @torch.jit.unused
    def content_probs(self, x: Tensor) -> Tensor:
        """Probabilities ``(B, heads, h*w, h*w)`` of the ``content`` kind for input ``x``, no dropout."""
        if self.content is None:
            raise ValueError(f'content_probs is for the content kind; this layer is {self.kind!r}: its '
                             f'probabilities do not depend on the input, use position_probs(grid_h, grid_w)')
        if not self.grid_major:
            x = x.permute(1, 2, 0, 3)  # B, h, w, D -> h, w, B, D
        _, q, k, position_scores = self._content_inputs(x)
        scores = q @ k.transpose(-1, -2) / math.sqrt(x.shape[-1]) + position_scores.to(q.dtype)[None]
        return scores.softmax(dim=-1)

    def _mix_content(self, x: Tensor) -> Tensor:
        H, W, B, D = x.shape
        tokens, q, k, position_scores = self._content_inputs(x)
        values = tokens[:, None].expand(B, self.num_heads, H * W, D)
        dropout_p = self.attn_drop if self.training else 0.
        if self.fused_attn:
            out = F.scaled_dot_product_attention(
                q, k, values, attn_mask=position_scores.to(q.dtype)[None], dropout_p=dropout_p)  # B, heads, HW, D
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(D) + position_scores.to(q.dtype)[None]
            out = F.dropout(scores.softmax(dim=-1), dropout_p) @ values  # B, heads, HW, D
        return out.permute(1, 2, 0, 3).reshape(self.num_heads, H, W, B, D)

    def extra_repr(self) -> str:
        return f'dim={self.dim}, num_heads={self.num_heads}, kind={self.kind}, dense={self.dense}'


def attend_then_project(attn: 'PositionalAttention', value: 'HeadsLinear', x: Tensor) -> Tensor:
    """``value(attn(x))`` for grid-major ``x`` (``h x w x B x D -> h x w x B x out``), on the path
    :func:`choose_path` picks."""
    path = attn.path(x, value.batched_heads)
    if path.fused_kernel:  # no heads-sized tensor; raises where triton cannot run rather than falling back
        return mix_and_project(x, attn._mixing_probs(x.shape[0], x.shape[1], path), value.weight, value.bias)
    if path.project_first:
        return project_then_mix(x, attn._mixing_probs(x.shape[0], x.shape[1], path)[0], value.weight, value.bias)
    if path.attend_then_project:
        probs = attn._mixing_probs(x.shape[0], x.shape[1], path)
        return _AttendThenProject.apply(x, value.weight, value.bias, *probs)
    if path.recompute_mixing:
        row_probs, col_probs = attn._mixing_probs(x.shape[0], x.shape[1], path)
        mixed = separable_mixing(*autocast_inputs(x, row_probs, col_probs))
    else:
        mixed = attn.mix(x, path)
    return value.forward_batched(mixed) if path.batched else value.forward_per_head(mixed)


@register_notrace_module  # loops over the stacked heads; FX keeps it whole
class HeadsLinear(nn.Linear):
    """``Linear(heads*D -> out)`` on heads stacked in front, ``heads x ... x D -> ... x out``, with the state dict
    of the Linear over the concatenated heads."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        """
        Args:
            in_features: Width of the concatenated heads, ``heads * D``.
            out_features: Output width.
            bias: Whether to add a learned bias.
        """
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.batched_heads = False  # set by batched_heads(); not in the state dict

    def forward(self, x: Tensor) -> Tensor:
        if current_path(x, self.training, False, False, None, self.batched_heads).batched:
            return self.forward_batched(x)
        return self.forward_per_head(x)

    @torch.jit.unused
    def forward_per_head(self, x: Tensor) -> Tensor:
        """Each head's block of the weight applied where the head lies, accumulated in place (the per-head path)."""
        heads, D = x.shape[0], x.shape[-1]
        rows = x.reshape(heads, -1, D)  # heads, tokens, D
        out = _HeadsLinearFunction.apply(rows, self.weight, self.bias)
        return out.view(list(x.shape[1:-1]) + [self.out_features])

    def forward_batched(self, x: Tensor) -> Tensor:
        """One GEMM over the concatenated heads, in plain autograd (the batched path, TorchScript, export)."""
        heads, D = x.shape[0], x.shape[-1]
        # heads x ... x D -> ... x heads x D -> (tokens, heads*D): channel n*D + d is channel d of head n
        concatenated = x.movedim(0, -2).reshape(-1, heads * D)
        out = F.linear(concatenated, self.weight, self.bias)  # tokens, out
        return out.view(list(x.shape[1:-1]) + [self.out_features])
