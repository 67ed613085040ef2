""" The state-dict key names of :class:`~sa_vision.models.SelfAttentionNet`, in one place: the released code's
embedding converted (``checkpoint_filter_fn``), what marks a state dict as one of ours, and the model's arguments read
back off its weights' names and shapes """
from typing import Dict, Optional

from torch import Tensor, nn

__all__ = ['checkpoint_filter_fn', 'SA_STATE_DICT_KEYS', 'is_sa_state_dict', 'infer_sa_model_args']


def checkpoint_filter_fn(state_dict: Dict[str, Tensor], model: nn.Module) -> Dict[str, Tensor]:
    """Convert the released code's Linear embedding (``patch_embed.weight``, ``(D, 4*C)``, input index
    ``(2*di + dj) * C + c``) to our 2x2 stride-2 conv ``(D, C, di, dj)``; our own state dicts pass unchanged."""
    out = {}
    for key, value in state_dict.items():
        if key == 'patch_embed.weight' and value.ndim == 2:
            embed_dim, patch = value.shape
            # (D, 4C) -> (D, di, dj, C) -> (D, C, di, dj)
            out['patch_embed.proj.weight'] = value.reshape(embed_dim, 2, 2, patch // 4).permute(0, 3, 1, 2)
        elif key == 'patch_embed.bias':
            out['patch_embed.proj.bias'] = value
        else:
            out[key] = value
    return out


# keys every SelfAttentionNet state dict holds (timm's ViTs have patch_embed.proj.weight too, but no Value map)
SA_STATE_DICT_KEYS = ('patch_embed.proj.weight', 'blocks.0.value.weight', 'blocks.0.mlp.fc1.weight')


def is_sa_state_dict(state_dict: Dict[str, Tensor]) -> bool:
    """Whether ``state_dict`` is of a :class:`SelfAttentionNet` (its shapes give its arguments)."""
    return all(k in state_dict for k in SA_STATE_DICT_KEYS)


def infer_sa_model_args(state_dict: Dict[str, Tensor]) -> Optional[Dict]:
    """The :class:`SelfAttentionNet` arguments (with ``attn_kind``) read off a state dict's key names and shapes,
    or None where it is not of one. Arguments that leave no trace in the weights (dropout, ``input_padding``, ...)
    are not read."""
    if not is_sa_state_dict(state_dict):
        return None
    embed_dim, in_chans = state_dict['patch_embed.proj.weight'].shape[:2]
    depth = 1 + max(int(k.split('.')[1]) for k in state_dict if k.startswith('blocks.'))
    heads = tuple(state_dict[f'blocks.{i}.value.weight'].shape[1] // embed_dim for i in range(depth))
    if 'blocks.0.attn.content.query.weight' in state_dict:
        kind = 'content'
    elif 'blocks.0.attn.position.row_shift_embed.weight' in state_dict:
        kind = 'learned'
    elif state_dict['blocks.0.attn.position.spreads'].dim() == 3:
        kind = 'generalized'
    else:
        kind = 'quadratic'
    args = dict(
        in_chans=int(in_chans), embed_dim=int(embed_dim), depth=depth, heads_per_layer=heads, attn_kind=kind,
        mlp_hidden_dim=int(state_dict['blocks.0.mlp.fc1.weight'].shape[0]),
        num_classes=int(state_dict['head.weight'].shape[0]) if 'head.weight' in state_dict else 0,
    )
    if kind in ('learned', 'content'):
        args['max_rel_shift'] = (state_dict['blocks.0.attn.position.row_shift_embed.weight'].shape[0] - 1) // 2
    return args
