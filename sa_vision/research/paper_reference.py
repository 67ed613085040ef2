""" The paper's dense formulation, as a reference: the released implementation's way of computing the models

Paper: https://arxiv.org/abs/1911.03584, Sec. 2.3, 4.1-4.3 and App. A.1, A.4. Kept plain and independent of
:mod:`sa_vision.layers` (torch only; the key names from :mod:`sa_vision.models.sa_state_dict`), to check our fast
models and as the baseline of ``sa-vision-benchmark --compare paper``. Gaussian kinds score a shift through
``r_delta = (d1, d2, d1^2, d2^2, d1*d2)``, an ``(h, w, h, w, 5)`` buffer, and per-head ``v_n = ((M mu)_1, (M mu)_2,
-M_11 / 2, -M_22 / 2, -M_12)`` (Eq. 9, App. A.1): the expansion of ``-1/2 (delta - mu)^T M (delta - mu)`` without
the constant the softmax ignores. Nothing is separable, cached or chunked: memory and time grow with ``(h*w)^2``, as
in the original. Parameters keep our names and shapes except the embedding, the original's ``Linear(4*C -> D)``
(:func:`paper_state_dict` converts).
"""
from typing import Dict, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.sa_state_dict import (
    CONTENT_QUERY_WEIGHT,
    EMBED_BIAS,
    EMBED_WEIGHT,
    HEAD_WEIGHT,
    MLP_FC1_WEIGHT,
    PRECISION_FACTORS,
    ROW_SHIFT_TABLE,
    VALUE_WEIGHT,
    block_key,
    layer_indices,
    rename_old_keys,
)

__all__ = ['PAPER_ATTENTION_KINDS', 'PaperDenseSA', 'PaperLayer', 'PaperAttention', 'relative_encoding',
           'paper_state_dict', 'kind_of_state_dict']

PAPER_ATTENTION_KINDS = ('quadratic', 'generalized', 'learned')
# the reference's own Linear(4*C -> D) embedding, named as in the released code; its other weights have our names
_PAPER_EMBED_WEIGHT, _PAPER_EMBED_BIAS = 'patch_embed.weight', 'patch_embed.bias'


def relative_encoding(grid_h: int, grid_w: int, device=None, dtype=None) -> Tensor:
    """``r[i, j, k, l] = (d1, d2, d1^2, d2^2, d1*d2)`` with ``(d1, d2) = (k - i, l - j)``, ``(h, w, h, w, 5)``."""
    rows = torch.arange(grid_h, device=device, dtype=dtype)
    cols = torch.arange(grid_w, device=device, dtype=dtype)
    d1 = (rows[None, :] - rows[:, None])[:, None, :, None].expand(grid_h, grid_w, grid_h, grid_w)
    d2 = (cols[None, :] - cols[:, None])[None, :, None, :].expand(grid_h, grid_w, grid_h, grid_w)
    return torch.stack([d1, d2, d1 * d1, d2 * d2, d1 * d2], dim=-1)


class _Gaussian(nn.Module):
    """Centres ``mu`` (heads, 2) and precision factors: ``s`` (heads,) quadratic, ``S`` (heads, 2, 2) generalized."""

    def __init__(self, num_heads: int, isotropic: bool):
        super().__init__()
        self.isotropic = isotropic
        self.centers = nn.Parameter(torch.randn(num_heads, 2) * 2.0)
        if isotropic:
            self.precision_factors = nn.Parameter(1.0 + 0.01 * torch.randn(num_heads))
        else:
            self.precision_factors = nn.Parameter(torch.eye(2) + 0.01 * torch.randn(num_heads, 2, 2))

    def target_vectors(self) -> Tensor:
        """``v_n`` of the relative encoding, ``(heads, 5)``."""
        if self.isotropic:
            factors = self.precision_factors
            eye = torch.eye(2, device=factors.device, dtype=factors.dtype)
            precision = factors[:, None, None] ** 2 * eye  # s^2 I: the paper's alpha = s^2 / 2
        else:
            precision = self.precision_factors @ self.precision_factors.transpose(1, 2)
        pulled = torch.einsum('nab,nb->na', precision, self.centers)  # M mu
        return torch.stack([pulled[:, 0], pulled[:, 1], -0.5 * precision[:, 0, 0], -0.5 * precision[:, 1, 1],
                            -precision[:, 0, 1]], dim=-1)


class _Learned(nn.Module):
    """Row and column shift tables ``(2*max_shift + 1, D)`` and their bias-free key maps ``D -> heads``."""

    def __init__(self, dim: int, num_heads: int, max_shift: int):
        super().__init__()
        self.max_shift = max_shift
        self.row_shift_embed = nn.Embedding(2 * max_shift + 1, dim)
        self.col_shift_embed = nn.Embedding(2 * max_shift + 1, dim)
        self.row_keys = nn.Linear(dim, num_heads, bias=False)
        self.col_keys = nn.Linear(dim, num_heads, bias=False)

    def table_index(self, size: int) -> Tensor:
        positions = torch.arange(size, device=self.row_shift_embed.weight.device)
        return (positions[None, :] - positions[:, None]).clamp(-self.max_shift, self.max_shift) + self.max_shift


def _check_kind(kind: str) -> None:
    if kind not in PAPER_ATTENTION_KINDS:
        raise ValueError(f'the paper formulation has no attention kind {kind!r}; use one of {PAPER_ATTENTION_KINDS}')


class PaperAttention(nn.Module):
    """Content-free multi-head attention, dense over the grid: ``B x h x w x D -> B x h x w x (heads*D)``."""

    def __init__(self, dim: int, num_heads: int, kind: str, attn_drop: float = 0.1, max_shift: int = 15):
        super().__init__()
        _check_kind(kind)
        self.kind = kind
        self.num_heads = num_heads
        self.attn_drop = nn.Dropout(attn_drop)
        if kind == 'learned':
            self.position = _Learned(dim, num_heads, max_shift)
        else:
            self.position = _Gaussian(num_heads, isotropic=kind == 'quadratic')
        # the relative encoding of the last grid size, as the original kept it; not saved
        self.register_buffer('encoding', torch.empty(0), persistent=False)

    def _relative_encoding(self, grid_h: int, grid_w: int, like: Tensor) -> Tensor:
        if self.encoding.shape[:4] != (grid_h, grid_w, grid_h, grid_w) or self.encoding.dtype != like.dtype \
                or self.encoding.device != like.device:
            encoding = relative_encoding(grid_h, grid_w, device=like.device, dtype=like.dtype)
            if torch.compiler.is_compiling():
                # not kept: a tensor a compiled call stores in the module is an output that CUDA graphs
                # (mode 'reduce-overhead') overwrite at the next replay, which would then read it
                return encoding
            self.encoding = encoding
        return self.encoding

    def scores(self, grid_h: int, grid_w: int) -> Tensor:
        """Attention scores ``(h, w, heads, h, w)``: ``[query row, query col, head, key row, key col]``."""
        position = self.position
        if isinstance(position, _Gaussian):
            v = position.target_vectors()
            return torch.einsum('ijkld,nd->ijnkl', self._relative_encoding(grid_h, grid_w, v), v)
        row = position.row_keys(position.row_shift_embed(position.table_index(grid_h)))  # i, k, heads
        col = position.col_keys(position.col_shift_embed(position.table_index(grid_w)))  # j, l, heads
        return row.permute(0, 2, 1)[:, None, :, :, None] + col.permute(0, 2, 1)[None, :, :, None, :]

    def probs(self, grid_h: int, grid_w: int) -> Tensor:
        """Softmax over all keys of each query and head, ``(h, w, heads, h, w)``, no dropout."""
        scores = self.scores(grid_h, grid_w)
        return scores.reshape(grid_h, grid_w, self.num_heads, -1).softmax(dim=-1).reshape(scores.shape)

    def forward(self, x: Tensor) -> Tensor:
        B, H, W, D = x.shape
        probs = self.attn_drop(self.probs(H, W))  # one mask for the whole batch
        heads = torch.einsum('ijnkl,bkld->bijnd', probs.to(x.dtype), x)
        return heads.reshape(B, H, W, self.num_heads * D)


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, drop: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(F.gelu(self.fc1(x))))  # exact (erf) GELU


class PaperLayer(nn.Module):
    """``Y = LN(X + Dropout(proj(Value(attention(X)))))``, ``X' = LN(Y + Dropout(MLP(Y)))`` on ``B x h x w x D``."""

    def __init__(self, dim: int, num_heads: int, kind: str, mlp_hidden_dim: int = 512, proj_drop: float = 0.1,
                 attn_drop: float = 0.1, max_shift: int = 15, norm_eps: float = 1e-12):
        super().__init__()
        self.attn = PaperAttention(dim, num_heads, kind, attn_drop=attn_drop, max_shift=max_shift)
        self.value = nn.Linear(num_heads * dim, dim)
        self.proj = nn.Linear(dim, dim)  # the output projection, the released code's Dense
        self.proj_drop = nn.Dropout(proj_drop)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = _Mlp(dim, mlp_hidden_dim, proj_drop)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm1(x + self.proj_drop(self.proj(self.value(self.attn(x)))))
        return self.norm2(x + self.mlp(x))


class PaperDenseSA(nn.Module):
    """The paper's fully-attentional classifier computed the released implementation's (dense) way: image
    ``B x C x H x W`` (H, W even) to logits."""

    def __init__(
            self,
            kind: str = 'quadratic',
            heads_per_layer: Sequence[int] = (9,) * 6,
            embed_dim: int = 400,
            mlp_hidden_dim: int = 512,
            num_classes: int = 10,
            in_chans: int = 3,
            max_shift: int = 15,
            norm_eps: float = 1e-12,
            proj_drop: float = 0.1,
            attn_drop: float = 0.1,
    ):
        super().__init__()
        _check_kind(kind)
        self.kind = kind
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.heads_per_layer = tuple(int(h) for h in heads_per_layer)
        self.num_classes = num_classes
        self.patch_embed = nn.Linear(4 * in_chans, embed_dim)  # index 6*di + 3*dj + c (for C = 3)
        self.blocks = nn.Sequential(*[
            PaperLayer(embed_dim, heads, kind, mlp_hidden_dim=mlp_hidden_dim, proj_drop=proj_drop,
                       attn_drop=attn_drop, max_shift=max_shift, norm_eps=norm_eps)
            for heads in self.heads_per_layer])
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    @staticmethod
    def blocks_of_pixels(x: Tensor) -> Tensor:
        """``B x C x H x W -> B x H/2 x W/2 x 4C``: channel ``(2*di + dj) * C + c`` holds pixel
        ``(2i + di, 2j + dj)``, colour ``c``."""
        B, C, H, W = x.shape
        if H % 2 or W % 2:
            raise ValueError(f'expected an even height and width, got an image batch of shape {list(x.shape)}')
        blocks = torch.cat([x[:, :, di::2, dj::2] for di in (0, 1) for dj in (0, 1)], dim=1)  # B, 4C, h, w
        return blocks.permute(0, 2, 3, 1)

    def forward_features(self, x: Tensor) -> Tensor:
        """``B x h x w x D`` after the last layer."""
        return self.blocks(self.patch_embed(self.blocks_of_pixels(x)))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.forward_features(x).mean(dim=(1, 2)))

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, Tensor], kind: Optional[str] = None,
                        **kwargs) -> 'PaperDenseSA':
        """The reference with the weights of a :class:`sa_vision.models.SelfAttentionNet` state dict (or its own);
        sizes come from the weights, ``kind`` is checked against them. A model's ``input_padding`` (the border of
        the kept Fashion-MNIST models) holds no tensor, so it is not here: pad the input as the model does first."""
        converted = paper_state_dict(state_dict)
        found = kind_of_state_dict(converted)
        if kind is not None and kind != found:
            raise ValueError(f'the state dict holds {found!r} attention, not {kind!r}')
        embed_dim, patch = converted[_PAPER_EMBED_WEIGHT].shape
        heads = [converted[block_key(i, VALUE_WEIGHT)].shape[1] // embed_dim for i in layer_indices(converted)]
        table = converted.get(block_key(0, ROW_SHIFT_TABLE))
        model = cls(
            found, heads, embed_dim=embed_dim,
            mlp_hidden_dim=converted[block_key(0, MLP_FC1_WEIGHT)].shape[0],
            num_classes=converted[HEAD_WEIGHT].shape[0] if HEAD_WEIGHT in converted else 0,
            in_chans=patch // 4,
            max_shift=(table.shape[0] - 1) // 2 if table is not None else 15,
            **kwargs)
        ref = converted[_PAPER_EMBED_WEIGHT]
        model.to(device=ref.device, dtype=ref.dtype)  # first, so that float64 weights load exactly
        model.load_state_dict(converted)
        return model


def kind_of_state_dict(state_dict: Mapping[str, Tensor]) -> str:
    """'quadratic', 'generalized' or 'learned', from the attention parameters of the first layer."""
    if block_key(0, CONTENT_QUERY_WEIGHT) in state_dict:
        raise ValueError('the state dict holds content (query/key) attention, which the paper formulation '
                         f'does not have; kinds: {PAPER_ATTENTION_KINDS}')
    if block_key(0, ROW_SHIFT_TABLE) in state_dict:
        return 'learned'
    factors = state_dict.get(block_key(0, PRECISION_FACTORS))
    if factors is None:
        raise ValueError(f'not a state dict of a fully-attentional model: neither '
                         f'{block_key(0, PRECISION_FACTORS)} nor {block_key(0, ROW_SHIFT_TABLE)}')
    return 'quadratic' if factors.dim() == 1 else 'generalized'


def paper_state_dict(state_dict: Mapping[str, Tensor]) -> Dict[str, Tensor]:
    """A :class:`sa_vision.models.SelfAttentionNet` state dict in the reference's layout: the embedding kernel
    ``(D, C, di, dj)`` becomes the original Linear ``(D, 4C)`` with index ``(2*di + dj) * C + c``; old key names
    become today's (:data:`~sa_vision.models.sa_state_dict.RENAMED_KEYS`)."""
    out = {}
    for key, value in state_dict.items():
        if key == EMBED_WEIGHT:
            out[_PAPER_EMBED_WEIGHT] = value.permute(0, 2, 3, 1).reshape(value.shape[0], -1)
        elif key == EMBED_BIAS:
            out[_PAPER_EMBED_BIAS] = value
        else:
            out[key] = value
    return rename_old_keys(out)
