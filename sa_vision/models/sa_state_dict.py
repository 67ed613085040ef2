""" The state-dict key names of :class:`~sa_vision.models.SelfAttentionNet`, in one place: the names weights were
saved under before a rename (:data:`RENAMED_KEYS`), the released code's embedding converted (``checkpoint_filter_fn``),
what marks a state dict as one of ours, and the model's arguments read back off its weights' names and shapes. Other
modules name a weight through these constants. """
from typing import Dict, List, Mapping, MutableMapping, Optional

from torch import Tensor, nn

__all__ = [
    'EMBED_WEIGHT', 'EMBED_BIAS', 'HEAD_WEIGHT', 'BLOCKS', 'VALUE_WEIGHT', 'MLP_FC1_WEIGHT', 'CENTERS',
    'PRECISION_FACTORS', 'ROW_SHIFT_TABLE', 'ROW_KEYS', 'COL_KEYS', 'CONTENT_QUERY_WEIGHT', 'CONTENT_QUERY_BIAS',
    'CONTENT_KEY_WEIGHT', 'CONTENT_KEY_BIAS', 'RENAMED_KEYS', 'block_key', 'layer_indices', 'rename_old_keys',
    'checkpoint_filter_fn', 'SA_STATE_DICT_KEYS', 'is_sa_state_dict', 'infer_sa_model_args',
]

EMBED_WEIGHT = 'patch_embed.proj.weight'  # the 2x2 stride-2 conv, (D, C, 2, 2)
EMBED_BIAS = 'patch_embed.proj.bias'
HEAD_WEIGHT = 'head.weight'  # the classifier, (num_classes, D); absent with num_classes=0
BLOCKS = 'blocks'  # layer i's weights are named blocks.<i>.<name>, with <name> one of the names below
VALUE_WEIGHT = 'value.weight'  # (D, heads * D): the heads stacked along its input
MLP_FC1_WEIGHT = 'mlp.fc1.weight'  # (mlp_hidden_dim, D)
# the Gaussian kinds' mu_h, (heads, 2), and the factor of their precision: s_h (heads,) with alpha_h = s_h^2 / 2
# (Eq. 9), or S_h (heads, 2, 2) with M_h = S_h S_h^T (App. A.1)
CENTERS = 'attn.position.centers'
PRECISION_FACTORS = 'attn.position.precision_factors'
# the learned and content kinds' row shift table, (2 * max_rel_shift + 1, D), and key maps, (heads, D)
ROW_SHIFT_TABLE = 'attn.position.row_shift_embed.weight'
ROW_KEYS = 'attn.position.row_keys.weight'
COL_KEYS = 'attn.position.col_keys.weight'
# the content kind's query and key projections, (heads * D, D) and (heads * D,)
CONTENT_QUERY_WEIGHT = 'attn.content.query.weight'
CONTENT_QUERY_BIAS = 'attn.content.query.bias'
CONTENT_KEY_WEIGHT = 'attn.content.key.weight'
CONTENT_KEY_BIAS = 'attn.content.key.bias'

# the released code's Linear(4*C -> D) embedding
_RELEASED_EMBED_WEIGHT = 'patch_embed.weight'
_RELEASED_EMBED_BIAS = 'patch_embed.bias'

# a weight's old name -> its name now, both as the tail of a key; weights saved under an old name still load
# (timm.create_model(pretrained=True), load_state_dict, timm's --resume / --initial-checkpoint / --checkpoint, the
# checkpoint reader, kept trajectories)
RENAMED_KEYS: Dict[str, str] = {
    'attn.position.spreads': PRECISION_FACTORS,
}


def block_key(layer: int, name: str) -> str:
    """The state-dict key of weight ``name`` (e.g. :data:`VALUE_WEIGHT`) of layer ``layer``."""
    return f'{BLOCKS}.{layer}.{name}'


def layer_indices(state_dict: Mapping[str, Tensor]) -> List[int]:
    """The layers that have weights in ``state_dict``, ascending."""
    prefix = BLOCKS + '.'
    return sorted({int(k[len(prefix):].split('.', 1)[0]) for k in state_dict if k.startswith(prefix)})


def _current_name(key: str) -> str:
    for old, new in RENAMED_KEYS.items():
        if key == old or key.endswith('.' + old):
            return key[:len(key) - len(old)] + new
    return key


def rename_old_keys(state_dict: MutableMapping[str, Tensor], prefix: str = '') -> MutableMapping[str, Tensor]:
    """Rename, in place and in order, the keys under ``prefix`` that end in an old name of :data:`RENAMED_KEYS`;
    returns ``state_dict``. A key whose new name is there too is left as it is (a strict load reports it)."""
    renames = {}
    for key in state_dict:
        if key.startswith(prefix):
            new = _current_name(key)
            if new != key and new not in state_dict:
                renames[key] = new
    if renames:
        items = list(state_dict.items())
        state_dict.clear()
        state_dict.update((renames.get(key, key), value) for key, value in items)
    return state_dict


def checkpoint_filter_fn(state_dict: Dict[str, Tensor], model: nn.Module) -> Dict[str, Tensor]:
    """Convert the released code's Linear embedding (``patch_embed.weight``, ``(D, 4*C)``, input index
    ``(2*di + dj) * C + c``) to our 2x2 stride-2 conv ``(D, C, di, dj)`` and old names to the current ones
    (:data:`RENAMED_KEYS`); our own state dicts pass unchanged."""
    out = {}
    for key, value in state_dict.items():
        if key == _RELEASED_EMBED_WEIGHT and value.ndim == 2:
            embed_dim, patch = value.shape
            # (D, 4C) -> (D, di, dj, C) -> (D, C, di, dj)
            out[EMBED_WEIGHT] = value.reshape(embed_dim, 2, 2, patch // 4).permute(0, 3, 1, 2)
        elif key == _RELEASED_EMBED_BIAS:
            out[EMBED_BIAS] = value
        else:
            out[key] = value
    return rename_old_keys(out)


# keys every SelfAttentionNet state dict holds (timm's ViTs have patch_embed.proj.weight too, but no Value map)
SA_STATE_DICT_KEYS = (EMBED_WEIGHT, block_key(0, VALUE_WEIGHT), block_key(0, MLP_FC1_WEIGHT))


def is_sa_state_dict(state_dict: Dict[str, Tensor]) -> bool:
    """Whether ``state_dict`` is of a :class:`SelfAttentionNet` (its shapes give its arguments)."""
    return all(k in state_dict for k in SA_STATE_DICT_KEYS)


def infer_sa_model_args(state_dict: Dict[str, Tensor]) -> Optional[Dict]:
    """The :class:`SelfAttentionNet` arguments (with ``attn_kind``) read off a state dict's key names and shapes,
    or None where it is not of one. Arguments that leave no trace in the weights (dropout, ``input_padding``, ...)
    are not read."""
    if not is_sa_state_dict(state_dict):
        return None
    state_dict = rename_old_keys(dict(state_dict))
    embed_dim, in_chans = state_dict[EMBED_WEIGHT].shape[:2]
    depth = 1 + layer_indices(state_dict)[-1]
    heads = tuple(state_dict[block_key(i, VALUE_WEIGHT)].shape[1] // embed_dim for i in range(depth))
    if block_key(0, CONTENT_QUERY_WEIGHT) in state_dict:
        kind = 'content'
    elif block_key(0, ROW_SHIFT_TABLE) in state_dict:
        kind = 'learned'
    elif state_dict[block_key(0, PRECISION_FACTORS)].dim() == 3:
        kind = 'generalized'
    else:
        kind = 'quadratic'
    args = dict(
        in_chans=int(in_chans), embed_dim=int(embed_dim), depth=depth, heads_per_layer=heads, attn_kind=kind,
        mlp_hidden_dim=int(state_dict[block_key(0, MLP_FC1_WEIGHT)].shape[0]),
        num_classes=int(state_dict[HEAD_WEIGHT].shape[0]) if HEAD_WEIGHT in state_dict else 0,
    )
    if kind in ('learned', 'content'):
        args['max_rel_shift'] = (state_dict[block_key(0, ROW_SHIFT_TABLE)].shape[0] - 1) // 2
    return args
