""" A border the model adds to its own input: weights trained on zero-padded images (Fashion-MNIST's 28x28, padded
to the paper's 32x32) then take the dataset's own images through timm's standard transform

timm's transforms cannot pad with black: ``crop_mode='border'`` fills with the mean's grey, and resizing 28 -> 32
stretches the image. The model pads instead, after the normalisation, with the value black has there
(``-mean / std`` per channel).
"""
from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UserError

__all__ = ['InputPad', 'create_input_pad', 'black_after_normalization', 'model_input_padding']


def black_after_normalization(mean: Sequence[float], std: Sequence[float]) -> list:
    """The value a black pixel (0) has after ``Normalize(mean, std)``, per channel, rounded as torchvision's
    float32 ``(x - mean) / std`` rounds it (so the border equals a zero-padded image's, bit for bit)."""
    mean32, std32 = torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)
    return ((torch.zeros_like(mean32) - mean32) / std32).tolist()


class InputPad(nn.Module):
    """Pad a ``B x C x H x W`` batch by ``padding`` pixels on every side with a constant per channel."""

    def __init__(self, padding: int, value: Union[float, Sequence[float]], in_chans: int, device=None, dtype=None):
        """
        Args:
            padding: Pixels added on every side.
            value: The border's value, one number or one per channel, in the units of the normalised input
                (black is :func:`black_after_normalization`).
            in_chans: Input channels C (``value`` as a sequence has C entries, or equal ones: a grey dataset's
                border fits any C).
        """
        super().__init__()
        values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
        if len(set(values)) == 1:
            # one value (or as many equal ones as a grey dataset's channels): any in_chans, as timm's in_chans=1
            # adapts the stem of weights saved with three
            values = values[:1] * in_chans
        if len(values) != in_chans:
            raise UserError(
                f'input_pad_value has {len(values)} values {values} for {in_chans} input channels (only equal values '
                f'fit any channel count): pass input_pad_value=<black after your normalisation>, one value or one '
                f'per channel, e.g. black_after_normalization(mean, std) of sa_vision.models.input_pad with the mean '
                f'and std you normalise with')
        self.padding, self.values = int(padding), values
        # not in the state dict: the weights stay those of the unpadded model
        self.register_buffer('value', torch.tensor(values, device=device, dtype=dtype).view(-1, 1, 1),
                             persistent=False)

    def init_non_persistent_buffers(self) -> None:
        """The border value again, on its buffer's device and dtype: a model made on the meta device and moved with
        ``to_empty`` holds no value there, and no state dict brings it (timm's ``reinit_non_persistent_buffers``
        calls this, as for its own computed buffers)."""
        device = None if self.value.is_meta else self.value.device
        self.value = torch.tensor(self.values, device=device, dtype=self.value.dtype).view(-1, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        pad = [self.padding] * 4
        # x + 0 inside and 0 + value on the border: both exact, so the inside is the input bit for bit. In place, so
        # that a wrong channel count fails here rather than broadcasting to the border's (also in graphs, which
        # keep no input check)
        border = F.pad(torch.zeros_like(x[:, :1]), pad, value=1.)
        return F.pad(x, pad).add_(border * self.value.to(x.dtype))

    def extra_repr(self) -> str:
        return f'padding={self.padding}, value={self.value.flatten().tolist()}'


def create_input_pad(padding: int, value: Union[float, Sequence[float]], in_chans: int, device=None,
                     dtype=None) -> nn.Module:
    """:class:`InputPad`, or ``nn.Identity`` for ``padding=0`` (the registered models: nothing added to trace)."""
    if padding < 0:
        raise ValueError(f'input_padding must be 0 or more pixels, got {padding}')
    return InputPad(padding, value, in_chans, device=device, dtype=dtype) if padding else nn.Identity()


def model_input_padding(model: nn.Module) -> int:
    """The border ``model`` adds to its input itself (0 for a model without one): a tool that feeds it images
    already padded the dataset's way crops this much off, and its token grid is that much larger than its input."""
    return max((m.padding for m in model.modules() if isinstance(m, InputPad)), default=0)
