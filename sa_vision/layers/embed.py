""" Space-to-depth 2x2 embedding of Cordonnier, Loukas & Jaggi (ICLR 2020, Sec. 4.1): invertible downsampling + Linear

Stored as the equivalent ``Conv2d(C, embed_dim, 2, stride=2)``, so timm's ``first_conv`` machinery works unchanged.
"""
from typing import List, Sequence

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function, register_notrace_module
from torch import Tensor, nn

__all__ = ['SpaceToDepthEmbed', 'check_image_shape', 'check_image_batch_shape', 'check_input_size',
           'has_checked_input_size']


@register_notrace_function  # data-dependent checks; FX keeps the call whole
def check_image_shape(x: Tensor, in_chans: int, even: bool = True) -> None:
    """Raise a ValueError naming the expected shape unless ``x`` is ``B x in_chans x H x W``, with H and W even
    where ``even`` (skipped while tracing: a traced graph keeps no Python branch). A model that pads its own input
    checks it before the border: that is the shape the user passed, and a border adds an even 2 x its width."""
    if torch.jit.is_tracing():
        return
    check_image_batch_shape(x.shape, in_chans, even)


def check_image_batch_shape(shape: List[int], in_chans: int, even: bool = True) -> None:
    """:func:`check_image_shape` for a batch of this ``shape``, without the tensor (to ask before building one)."""
    size = ' with H and W even' if even else ''
    if len(shape) != 4:
        raise ValueError(
            f'expected an image batch of shape (B, {in_chans}, H, W){size}, '
            f'got a {len(shape)}-D tensor of shape {list(shape)}; add a batch dimension with x.unsqueeze(0)')
    if shape[1] != in_chans:
        raise ValueError(
            f'expected {in_chans} input channels, shape (B, {in_chans}, H, W), got shape {list(shape)}; '
            f'create the model with in_chans={shape[1]} to accept this input')
    if even and (shape[2] % 2 != 0 or shape[3] % 2 != 0):
        raise ValueError(
            f'expected an even height and width (the 2x2 space-to-depth embedding), shape (B, {in_chans}, H, W), '
            f'got shape {list(shape)}; crop or pad the image to an even size')


@register_notrace_module  # shapes drive the reshapes; FX keeps the layer whole
class SpaceToDepthEmbed(nn.Module):
    """Image ``B x C x H x W`` (H, W even) to a grid-major token grid ``H/2 x W/2 x B x embed_dim`` (the layout the
    attention layers work in without copies)."""

    def __init__(self, in_chans: int = 3, embed_dim: int = 400, device=None, dtype=None):
        """
        Args:
            in_chans: Image channels C.
            embed_dim: Token width D, a Linear map of each 2 x 2 block's ``4 * C`` values (the 2 x 2 invertible
                downsampling of Sec. 4.1, then the embedding; D = 400 in App. A.4).
        """
        super().__init__()
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=2, stride=2, device=device, dtype=dtype)

    def linear_weight(self) -> Tensor:
        """The kernel as the original Linear(4*C -> D) weight, ``(D, 4*C)`` with index ``(2*di + dj) * C + c``."""
        return self.proj.weight.permute(0, 2, 3, 1).reshape(self.embed_dim, -1)

    def forward(self, x: Tensor) -> Tensor:
        B, C, H, W = x.shape
        # (B, C, i, di, j, dj) -> (i, j, B, C, di, dj): the kernel's (C, di, dj) order, tokens grid-major
        blocks = x.reshape(B, C, H // 2, 2, W // 2, 2).permute(2, 4, 0, 1, 3, 5).reshape(H // 2, W // 2, B, C * 4)
        return F.linear(blocks, self.proj.weight.reshape(self.embed_dim, C * 4), self.proj.bias)


def has_checked_input_size(model: nn.Module) -> bool:
    """Whether :func:`check_input_size` knows the input sizes ``model`` takes (its embedding is ours)."""
    return isinstance(getattr(model, 'patch_embed', None), SpaceToDepthEmbed)


def check_input_size(model: nn.Module, input_size: Sequence[int]) -> None:
    """The ValueError of :func:`check_image_batch_shape` where ``model`` embeds by :class:`SpaceToDepthEmbed` and
    cannot take ``C x H x W`` images (asked before a batch exists: a run's --img-size, a benchmark's input size)."""
    if has_checked_input_size(model):
        check_image_batch_shape([1, *input_size], model.patch_embed.in_chans)
