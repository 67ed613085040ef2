""" Multiply-accumulates of a forward pass: counted (``FlopCounterMode``, ``FLOPs / 2``, matrix products only) and
the unavoidable ones (the Linear layers plus the attention products in their cheapest exact form, paper Sec. 4.2) """
import copy
from typing import Sequence, Tuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_flop_count

from ..errors import UserError
from ..models.input_pad import model_input_padding

__all__ = ['count_macs', 'unavoidable_macs', 'unavoidable_macs_from_config']


def _as_input_size(input_size) -> Tuple[int, int, int]:
    if isinstance(input_size, int):
        return (3, input_size, input_size)
    input_size = tuple(int(s) for s in input_size)
    if len(input_size) == 2:
        return (3,) + input_size
    if len(input_size) != 3:
        raise UserError(f'input_size must be (C, H, W), (H, W) or an int, got {input_size}')
    return input_size


def _sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# fused attention kernels FlopCounterMode does not know (the CPU's flash attention), counted like the GPU's
_UNCOUNTED_ATTENTION = {
    op: _sdpa_flop for name in ('_scaled_dot_product_flash_attention_for_cpu',)
    if (op := getattr(torch.ops.aten, name, None)) is not None and op not in flop_registry}


def count_macs(model: nn.Module, input_size, batch_size: int = 1) -> int:
    """Multiply-accumulates of one forward pass of ``model`` on a ``(batch_size, *input_size)`` input.

    Counted in eval mode without gradients, on the model's device and dtype ('meta' too), on a copy whose cached
    attention probabilities are cleared, so every call counts a full forward pass.
    """
    if isinstance(input_size, int):
        shape = _as_input_size(input_size)
    else:
        shape = tuple(int(s) for s in input_size)
    try:
        param = next(model.parameters())
        device, dtype = param.device, (param.dtype if param.is_floating_point() else torch.float32)
    except StopIteration:
        device, dtype = torch.device('cpu'), torch.float32
    model = copy.deepcopy(model).eval()
    for module in model.modules():  # the copy holds the original's cached probabilities: count computing them
        if hasattr(module, 'clear_probs_cache'):
            module.clear_probs_cache()
    x = torch.zeros((batch_size,) + shape, device=device, dtype=dtype)
    counter = FlopCounterMode(display=False, custom_mapping=_UNCOUNTED_ATTENTION)
    with torch.no_grad(), counter:
        model(x)
    return int(counter.get_total_flops()) // 2


def unavoidable_macs_from_config(
        embed_dim: int,
        heads_per_layer: Sequence[int],
        mlp_hidden_dim: int,
        attn_kind: str,
        grid: Tuple[int, int],
        in_chans: int = 3,
        num_classes: int = 10,
        output_projection: bool = True,
) -> int:
    """Forward MACs per image that an exact implementation cannot avoid (see the module docstring): the Linear
    layers (and the learned kind's key maps on the shift tables) plus the attention products, ``2*(h*w)^2*D`` per
    head for content (scores and weighted sum). ``output_projection=False``: a model whose every layer's output
    projection is folded into its Value (``model.fuse()``), for inference."""
    h, w = grid
    n, d = h * w, embed_dim
    macs = n * 4 * in_chans * d
    for heads in heads_per_layer:
        macs += n * (heads * d * d + (d * d if output_projection else 0) + 2 * d * mlp_hidden_dim)
        if attn_kind in ('quadratic', 'learned'):
            macs += heads * n * (h + w) * d
            if attn_kind == 'learned':
                macs += (h * h + w * w) * d * heads
        elif attn_kind == 'generalized':
            macs += heads * n * n * d
        elif attn_kind == 'content':
            macs += (h * h + w * w) * d * heads  # positional key maps (learned part)
            macs += 2 * n * d * heads * d  # query and key maps
            macs += 2 * heads * n * n * d  # q.k scores and the weighted sum
        else:
            raise UserError(f'unknown attention kind {attn_kind!r}')
    macs += d * num_classes
    return int(macs)


def unavoidable_macs(model: nn.Module, input_size=(3, 32, 32)) -> int:
    """:func:`unavoidable_macs_from_config` read from an ``sa_vision`` SelfAttentionNet's configuration (fused or
    not)."""
    c, H, W = _as_input_size(input_size)
    pad = model_input_padding(model)  # the border it adds itself: its grid is that much larger than its input
    H, W = H + 2 * pad, W + 2 * pad
    blocks = list(model.blocks)
    mlp_hidden = blocks[0].mlp.fc1.out_features if blocks else 0
    head = getattr(model, 'head', None)
    num_classes = head.out_features if isinstance(head, nn.Linear) else 0
    return unavoidable_macs_from_config(
        model.embed_dim, tuple(model.heads_per_layer), mlp_hidden, model.attn_kind,
        (H // 2, W // 2), in_chans=c, num_classes=num_classes,
        output_projection=not all(isinstance(blk.proj, nn.Identity) for blk in blocks))
