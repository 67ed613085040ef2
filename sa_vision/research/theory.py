""" Theorem 1 of Cordonnier, Loukas & Jaggi, made executable: a convolution as multi-head self-attention

Paper: https://arxiv.org/abs/1911.03584, Theorem 1 with Lemmas 1-2 (Sec. 3). A ``K x K`` convolution equals ``K*K``
heads when head ``h`` attends only to pixel ``query + Delta_h`` and its slice of the output projection holds the
kernel at ``Delta_h``; the quadratic encoding ``-alpha_h ||delta - Delta_h||^2`` reaches that hard attention as
``alpha_h`` grows. The layer works on the convolution's own input pixels, with no embedding (docs/research.md).
"""
import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import PositionalAttention

__all__ = ['ConvAsAttention', 'attention_from_conv', 'min_hard_attention_alpha', 'off_center_mass', 'DEFAULT_ALPHA']

# enough for float64 (~41 for a 5x5 kernel) with a wide margin; the largest score on a 64x64 grid
# (alpha * 2 * 63^2 ~ 8e5) stays far from float32 overflow
DEFAULT_ALPHA = 100.0


def off_center_mass(alpha: float, terms: int = 64) -> float:
    """Upper bound on the attention a head with integer centre leaves off its centre pixel: ``theta(alpha)^2 - 1``
    with ``theta(alpha) = sum_{n in Z} exp(-alpha n^2)`` (the sum over ``Z^2`` factorises), ``~ 4 exp(-alpha)``."""
    tail = sum(math.exp(-alpha * n * n) for n in range(1, terms + 1))
    return 2.0 * (2.0 * tail) + (2.0 * tail) ** 2  # theta^2 - 1 with theta = 1 + 2 * tail


def min_hard_attention_alpha(dtype: torch.dtype = torch.float32, kernel_size: Union[int, Tuple[int, int]] = 3) -> float:
    """Smallest ``alpha`` at which a ``K x K`` attention-convolution is exact to the resolution of ``dtype``.

    Each head deviates from its hard value by at most ``2 eps max|x|`` (:func:`off_center_mass`) and the ``K*K``
    heads add up, so solve ``K*K * (theta(alpha)^2 - 1) <= u`` (unit roundoff) by bisection: about 21 (3x3) in
    float32, 41 in float64 (slides presenting the paper quote 46 for float32). Larger ``alpha`` only underflows far
    scores to 0.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f'dtype must be a floating point torch.dtype such as torch.float32, got {dtype!r}')
    kh, kw = _pair(kernel_size)
    if min(kh, kw) < 1:
        raise ValueError(f'kernel_size must be at least 1, got {kernel_size}')
    unit_roundoff = torch.finfo(dtype).eps / 2
    target = unit_roundoff / (kh * kw)
    low, high = 0.0, 1.0
    while off_center_mass(high) > target:
        high *= 2.0
    for _ in range(100):
        mid = 0.5 * (low + high)
        if off_center_mass(mid) > target:
            low = mid
        else:
            high = mid
    return high


def _pair(value: Union[int, Tuple[int, ...]]) -> Tuple[int, int]:
    if isinstance(value, int):
        return value, value
    value = tuple(int(v) for v in value)
    if len(value) != 2:
        raise ValueError(f'expected an int or a pair of ints, got {value}')
    return value[0], value[1]


class ConvAsAttention(nn.Module):
    """A ``K x K`` convolution computed by ``K*K`` hard-attention heads and an output Linear.

    ``pad=True`` zero pads the input by :attr:`border` (the convolution padded by ``(K // 2) * dilation``);
    ``pad=False`` returns the unpadded convolution's output, ``2 * border`` smaller: within :attr:`border` of the
    edges the heads' shifts leave the image and the softmax renormalises over the pixels there (paper Eq. 6), so
    those outputs are not a convolution's and are cropped, as the convolution crops them.
    """

    def __init__(
            self,
            in_chans: int,
            out_chans: int,
            kernel_size: Union[int, Tuple[int, int]] = 3,
            dilation: Union[int, Tuple[int, int]] = 1,
            bias: bool = True,
            alpha: float = DEFAULT_ALPHA,
            pad: bool = True,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        kh, kw = _pair(kernel_size)
        dh, dw = _pair(dilation)
        if kh % 2 == 0 or kw % 2 == 0:
            raise ValueError(f'kernel size must be odd (the kernel needs a centre pixel), got {(kh, kw)}')
        if not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f'alpha must be a finite positive number, got {alpha}')
        self.in_chans = in_chans
        self.out_chans = out_chans
        self.kernel_size = (kh, kw)
        self.dilation = (dh, dw)
        self.border = ((kh // 2) * dh, (kw // 2) * dw)
        self.alpha = float(alpha)
        self.pad = pad
        self.attn = PositionalAttention(in_chans, kh * kw, kind='quadratic', attn_drop=0., **dd)
        self.proj = nn.Linear(kh * kw * in_chans, out_chans, bias=bias, **dd)
        with torch.no_grad():
            self.attn.position.centers.copy_(self.kernel_shifts())
            self.attn.position.precision_factors.fill_(math.sqrt(2.0 * self.alpha))  # alpha = s^2 / 2

    def kernel_shifts(self) -> Tensor:
        """``(K_h*K_w, 2)`` (row, col) shift of each head, row-major over the kernel, dilation included."""
        kh, kw = self.kernel_size
        rows = (torch.arange(kh) - kh // 2) * self.dilation[0]
        cols = (torch.arange(kw) - kw // 2) * self.dilation[1]
        return torch.stack(torch.meshgrid(rows, cols, indexing='ij'), dim=-1).reshape(kh * kw, 2)

    @torch.no_grad()
    def load_conv_weight(self, weight: Tensor, bias: Optional[Tensor] = None) -> None:
        """Fill the output Linear from a kernel ``(C_out, C_in, K_h, K_w)``: column ``h*C_in + c`` is
        ``weight[:, c, i, j]`` for head ``h = i * K_w + j``."""
        expected = (self.out_chans, self.in_chans) + self.kernel_size
        if tuple(weight.shape) != expected:
            raise ValueError(f'kernel of shape {tuple(weight.shape)} does not fit, expected {expected}')
        self.proj.weight.copy_(weight.permute(0, 2, 3, 1).reshape(self.out_chans, -1))
        if bias is not None:
            if self.proj.bias is None:
                raise ValueError('the convolution has a bias but this layer was built with bias=False')
            self.proj.bias.copy_(bias)
        elif self.proj.bias is not None:
            self.proj.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f'expected an input of shape (B, {self.in_chans}, H, W), got {list(x.shape)}')
        rh, rw = self.border
        if self.pad:
            x = F.pad(x, (rw, rw, rh, rh))
        elif x.shape[2] <= 2 * rh or x.shape[3] <= 2 * rw:
            raise ValueError(f'an input of {x.shape[2]}x{x.shape[3]} leaves no output of the unpadded '
                             f'{self.kernel_size} convolution (dilation {self.dilation}): give one larger than '
                             f'{2 * rh}x{2 * rw}, or pad=True')
        out = self.proj(self.attn(x.permute(0, 2, 3, 1)))  # B, H, W, C_out
        return out.permute(0, 3, 1, 2)[:, :, rh:out.shape[1] - rh, rw:out.shape[2] - rw]

    def extra_repr(self) -> str:
        return f'kernel_size={self.kernel_size}, dilation={self.dilation}, alpha={self.alpha}, pad={self.pad}'


def attention_from_conv(conv: nn.Conv2d, alpha: float = DEFAULT_ALPHA, pad: Optional[bool] = None) -> ConvAsAttention:
    """The self-attention layer of Theorem 1 that computes ``conv`` (odd kernel, stride 1, groups 1, zeros padding
    of 0 or ``(K // 2) * dilation``); on a GPU compare with TF32 off (TF32 convolutions differ by ~1e-3)."""
    if not isinstance(conv, nn.Conv2d):
        raise ValueError(f'expected an nn.Conv2d, got {type(conv).__name__}')
    kh, kw = conv.kernel_size
    dh, dw = conv.dilation
    if tuple(conv.stride) != (1, 1):
        raise ValueError(
            f'stride {tuple(conv.stride)} is not covered by the theorem (attention keeps one output per pixel); '
            f'use a stride-1 convolution and subsample its output')
    if conv.groups != 1:
        raise ValueError(f'groups={conv.groups} is not covered by the theorem; only groups=1 convolutions convert')
    if kh % 2 == 0 or kw % 2 == 0:
        raise ValueError(
            f'even kernel size {(kh, kw)} is not covered: the heads sit on the shifts -K//2..K//2 around the '
            f'query pixel, which needs an odd kernel')
    if conv.padding_mode != 'zeros':
        raise ValueError(f"padding_mode={conv.padding_mode!r} is not covered; only 'zeros' padding converts")
    border = ((kh // 2) * dh, (kw // 2) * dw)
    if conv.padding == 'same':
        conv_pads = True
    elif conv.padding == 'valid' or tuple(conv.padding) == (0, 0):
        conv_pads = False
    elif tuple(conv.padding) == border:
        conv_pads = True
    else:
        raise ValueError(
            f'padding {conv.padding} does not match: the attention layer reproduces a convolution padded by '
            f'0 or by (K // 2) * dilation = {border}')
    if pad is None:
        pad = conv_pads
    elif pad and not conv_pads:
        raise ValueError(
            f'pad=True computes a convolution zero padded by {border} but conv has padding {conv.padding}; '
            f'use pad=False (the output of the unpadded convolution) or a conv with padding={border}')
    weight = conv.weight.detach()
    layer = ConvAsAttention(
        conv.in_channels, conv.out_channels, (kh, kw), (dh, dw), bias=conv.bias is not None, alpha=alpha,
        pad=pad, device=weight.device, dtype=weight.dtype)
    layer.load_conv_weight(weight, None if conv.bias is None else conv.bias.detach())
    return layer
