""" Theorem 1 of Cordonnier, Loukas & Jaggi, made executable: a convolution as multi-head self-attention

Paper: `On the Relationship between Self-Attention and Convolutional Layers` (ICLR 2020),
https://arxiv.org/abs/1911.03584, Theorem 1 with Lemmas 1-2 (Sec. 3).

A ``K x K`` convolution is a sum over the ``K*K`` kernel shifts ``Delta`` of a linear map applied to the
input pixel at ``query + Delta``. A multi-head self-attention layer with ``K*K`` heads computes it exactly
when head ``h`` attends to the single pixel ``query + Delta_h`` (hard attention) and its slice of the
output projection holds the kernel slice at ``Delta_h``. The quadratic (isotropic Gaussian) encoding,
``A_h(delta) = -alpha_h ||delta - Delta_h||^2``, reaches hard attention as ``alpha_h`` grows.

:func:`attention_from_conv` builds that layer from an ``nn.Conv2d`` with this package's own
:class:`~sa_vision.layers.PositionalAttention` (``quadratic`` kind): every head attends over the raw
input (head dimension = ``C_in``), centres sit on the kernel shifts (times the dilation), spreads give
``alpha``, and an output ``Linear(K*K*C_in -> C_out)`` holds the kernel and bias. No embedding (such as
the classifier's 2x2 space-to-depth) is involved: the layer works on the convolution's own input pixels.
:func:`min_hard_attention_alpha` gives the smallest ``alpha`` at which the soft attention is hard to the
precision of a float dtype.
"""
import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import PositionalAttention

__all__ = ['ConvAsAttention', 'attention_from_conv', 'min_hard_attention_alpha', 'off_center_mass', 'DEFAULT_ALPHA']

# large enough for float64 (needs ~41 for a 5x5 kernel) with a wide margin, small enough that the
# largest score on a 64x64 grid (alpha * 2 * 63^2 ~ 8e5) is far from float32 overflow (3.4e38)
DEFAULT_ALPHA = 100.0


def off_center_mass(alpha: float, terms: int = 64) -> float:
    """Upper bound on the attention a head with integer centre leaves off its centre pixel, at ``alpha``.

    With scores ``-alpha ||delta - Delta||^2`` the probability of the centre pixel is ``1 / (1 + eps)`` with
    ``eps = sum_{v in grid - Delta, v != 0} exp(-alpha ||v||^2)``, summed over the integer offsets ``v``
    from the centre that exist on the grid. Extending the sum to all of ``Z^2`` bounds it for every grid and
    query, and it factorises over the two axes: ``eps <= theta(alpha)^2 - 1`` with
    ``theta(alpha) = sum_{n in Z} exp(-alpha n^2) = 1 + 2 exp(-alpha) + 2 exp(-4 alpha) + ...``,
    so ``eps ~ 4 exp(-alpha)`` for large ``alpha`` (the four nearest neighbours dominate).
    """
    tail = sum(math.exp(-alpha * n * n) for n in range(1, terms + 1))
    return 2.0 * (2.0 * tail) + (2.0 * tail) ** 2  # theta^2 - 1 with theta = 1 + 2 * tail


def min_hard_attention_alpha(dtype: torch.dtype = torch.float32, kernel_size: Union[int, Tuple[int, int]] = 3) -> float:
    """Smallest ``alpha`` at which a ``K x K`` attention-convolution is exact to the resolution of ``dtype``.

    Derivation. Head ``h`` returns ``(x[q + Delta_h] + sum_{v != 0} w_v x[q + Delta_h + v]) / (1 + eps)``
    with ``w_v = exp(-alpha ||v||^2)`` and ``eps = sum w_v``, so it differs from the hard value
    ``x[q + Delta_h]`` by at most ``2 eps max|x|`` (see :func:`off_center_mass` for ``eps``). The convolution
    output is a sum of ``K*K`` such head outputs through the kernel slices, so with inputs of comparable
    size the deviations of the ``K*K`` heads add up to ``~ K*K * eps`` relative to the output. That deviation
    is invisible once it is below the unit roundoff ``u = finfo(dtype).eps / 2``::

        K*K * (theta(alpha)^2 - 1) <= u    i.e.    alpha >~ log(4 K*K / u)

    which gives about 21 (3x3) and 22 (5x5) in float32, 41 and 42 in float64 (the authors quote 46 for
    float32; any larger alpha is as exact). This function solves the inequality by bisection. Larger
    ``alpha`` does no harm: the softmax subtracts the row maximum (the centre, score 0), so the far scores
    only underflow to an exact 0. Only ``alpha * max ||delta - Delta||^2`` must stay finite.

    Args:
        dtype: A floating point dtype.
        kernel_size: ``K`` or ``(K_h, K_w)``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f'dtype must be a floating point dtype such as torch.float32, got {dtype}')
    kh, kw = _pair(kernel_size)
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

    ``B x C_in x H x W -> B x C_out x H x W``. With ``pad=True`` the input is zero padded by
    ``(K // 2) * dilation`` first and the output equals the convolution with ``padding=(K // 2) * dilation``
    everywhere. With ``pad=False`` the attention runs on the unpadded grid: outputs closer than
    ``(K // 2) * dilation`` to a border differ (the heads' softmax is renormalised over the pixels that
    exist, paper Sec. 2.3), every other output equals the convolution's (``output[..., r:-r, r:-r]`` equals a
    ``padding=0`` convolution, see :attr:`border`).
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
            self.attn.position.spreads.fill_(math.sqrt(2.0 * self.alpha))  # alpha = spreads^2 / 2

    def kernel_shifts(self) -> Tensor:
        """``(K_h*K_w, 2)`` (row, col) shift of each head, row-major over the kernel, dilation included."""
        kh, kw = self.kernel_size
        rows = (torch.arange(kh) - kh // 2) * self.dilation[0]
        cols = (torch.arange(kw) - kw // 2) * self.dilation[1]
        return torch.stack(torch.meshgrid(rows, cols, indexing='ij'), dim=-1).reshape(kh * kw, 2)

    @torch.no_grad()
    def load_conv_weight(self, weight: Tensor, bias: Optional[Tensor] = None) -> None:
        """Fill the output Linear from a kernel ``(C_out, C_in, K_h, K_w)``: column ``h*C_in + c`` of the
        Linear is ``weight[:, c, i, j]`` for the head ``h = i * K_w + j`` attending to kernel tap ``(i, j)``."""
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
        out = self.proj(self.attn(x.permute(0, 2, 3, 1)))  # B, H, W, C_out
        out = out.permute(0, 3, 1, 2)
        if self.pad:
            out = out[:, :, rh:out.shape[2] - rh, rw:out.shape[3] - rw]
        return out

    def extra_repr(self) -> str:
        return f'kernel_size={self.kernel_size}, dilation={self.dilation}, alpha={self.alpha}, pad={self.pad}'


def attention_from_conv(conv: nn.Conv2d, alpha: float = DEFAULT_ALPHA, pad: Optional[bool] = None) -> ConvAsAttention:
    """The self-attention layer of Theorem 1 that computes ``conv``.

    Args:
        conv: A ``Conv2d`` with an odd kernel, stride 1, groups 1, zeros padding of ``0`` or
            ``(K // 2) * dilation`` (``'valid'`` / ``'same'`` too).
        alpha: Hard-attention sharpness of every head (the paper's ``alpha = s^2 / 2``); at least
            :func:`min_hard_attention_alpha` for the dtype to be exact. The default suits float32 and float64.
        pad: Zero pad the input so the output equals ``conv`` everywhere (requires ``conv`` to pad by
            ``(K // 2) * dilation``). Default: pad exactly when ``conv`` does. Without padding only outputs
            at least ``(K // 2) * dilation`` from a border are exact.

    Returns:
        A :class:`ConvAsAttention` on the device and dtype of ``conv``, ``B x C_in x H x W -> B x C_out x H x W``.

    On a CUDA GPU compare the two with TF32 off (``torch.backends.cudnn.allow_tf32 = False`` and
    ``torch.backends.cuda.matmul.allow_tf32 = False``): PyTorch's default TF32 convolutions make ``conv`` itself
    differ from exact float32 by ~1e-3.
    """
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
            f'use pad=False (outputs away from the borders are exact) or a conv with padding={border}')
    weight = conv.weight.detach()
    layer = ConvAsAttention(
        conv.in_channels, conv.out_channels, (kh, kw), (dh, dw), bias=conv.bias is not None, alpha=alpha,
        pad=pad, device=weight.device, dtype=weight.dtype)
    layer.load_conv_weight(weight, None if conv.bias is None else conv.bias.detach())
    return layer
