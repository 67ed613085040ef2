"""Device-check section 2's ``batchmajor`` role: the dense attention + Value of every layer computed batch-major, so
that neither the mixed heads nor their gradient is copied into another layout. An experiment patched onto a copy of
the model (no path of the package takes it until a GPU has measured it: device_check.md, "What the results decide").

On CUDA the dense path mixes grid-major tokens, ``(heads*h*w, h*w) @ (h*w, B*D)``, into ``heads x h x w x B x D``;
the Value's GEMM reads each token's heads side by side, so the mixed heads are copied into that layout, and their
gradient back (two permute-and-copy kernels a layer, 167 us each in the H100's profile of the full-size step, 14 % of
its GPU time together; docs/performance.md, "Where the dense full-size step goes"). Batch-major tokens ``B x h*w x
D``, mixed by the probabilities with each query's heads side by side, ``[(q, n), k] = probs[n, q, k]``, in one
batched product whose first operand is the same for every image (stride 0, no copy), come out as ``B x (h*w*heads)
x D``: already the Value's ``(B*h*w, heads*D)``. The backward then forms the probabilities' gradient image by image,
``B x (h*w*heads) x h*w``, before summing over the batch: smaller than the heads-sized tensor where the grid has
fewer tokens than the width (256 against 400 at full size: 0.64x; 4x at the narrow width 64). The tokens' own
layout changes twice a layer (a tokens-sized copy each way, 1/heads of a heads-sized one).
"""
import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sa_vision.layers import HeadsLinear, PositionalAttention
from sa_vision.layers.autocast import autocast_inputs


def batch_major_attend(attn: PositionalAttention, value: HeadsLinear, x: Tensor) -> Tensor:
    """``value(attn(x))`` for grid-major ``x`` (``h x w x B x D -> h x w x B x out``) on the dense batched path's
    probabilities (dropout included), computed batch-major (module docs)."""
    H, W, B, D = x.shape
    path = attn.path(x, batched=True)
    if not path.dense or attn.content is not None:
        raise ValueError('batch-major mixing takes a dense, content-free layer: run it under dense_attention')
    probs = attn._mixing_probs(H, W, path)[0]  # heads, h*w, h*w
    heads, tokens = probs.shape[0], H * W
    # cast before the broadcast: autocast would cast bmm's expanded operand, writing it B times
    x, probs = autocast_inputs(x, probs)
    batch_major = x.permute(2, 0, 1, 3).reshape(B, tokens, D)
    side_by_side = probs.transpose(0, 1).reshape(tokens * heads, tokens)  # [(q, n), k] = probs[n, q, k]
    mixed = torch.bmm(side_by_side.expand(B, -1, -1), batch_major)  # B, h*w*heads, D
    out = F.linear(mixed.view(B * tokens, heads * D), value.weight, value.bias)
    return out.view(B, H, W, -1).permute(1, 2, 0, 3)


def batch_major(model: nn.Module) -> nn.Module:
    """``model`` (a ``SelfAttentionNet``) with every block's attention + Value batch-major, patched on the block
    instances in place (``_attend``; a deep copy binds its copies to its own blocks); returned for chaining."""
    for block in model.blocks:
        block._attend = types.MethodType(lambda self, x: batch_major_attend(self.attn, self.value, x), block)
    return model
