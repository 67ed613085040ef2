""" The checks of the attention models' arguments (``SelfAttentionNet``, ``timm.create_model('sa_*', ...)``): each
raises a ValueError that names the argument and what it takes """
from typing import Any, Dict, Sequence, Tuple, Union

from ..layers import ATTENTION_KINDS

__all__ = ['checked_heads_per_layer', 'checked_global_pool', 'check_feature_cls']


def checked_heads_per_layer(heads_per_layer: Union[int, Sequence[int]], depth: int, attn_kind: str) -> Tuple[int, ...]:
    """The heads of each layer (an int: as many in every layer), after checking the network's arguments."""
    heads = tuple(int(h) for h in ((heads_per_layer,) * depth if isinstance(heads_per_layer, int) else heads_per_layer))
    if len(heads) != depth:
        raise ValueError(f'heads_per_layer has {len(heads)} entries but depth is {depth}')
    if min(heads, default=1) < 1:
        raise ValueError(f'heads_per_layer {heads_per_layer!r}: every layer needs at least one head')
    if attn_kind not in ATTENTION_KINDS:
        raise ValueError(f'attn_kind {attn_kind!r} is not one of {ATTENTION_KINDS}')
    return heads


# the poolings over the grid timm's ViT also takes ('avgmax': the mean of the two, as timm's); no class token to take
GLOBAL_POOLS = ('avg', 'max', 'avgmax', '')


def checked_global_pool(global_pool: str) -> str:
    if global_pool not in GLOBAL_POOLS:
        raise ValueError(f"global_pool must be 'avg', 'max', 'avgmax' or '' (the grid kept), got {global_pool!r}"
                         + ('; these models have no class token' if global_pool == 'token' else ''))
    return global_pool


def check_feature_cls(variant: str, kwargs: Dict[str, Any]) -> None:
    """``features_only`` takes timm's getter (``forward_intermediates``, NCHW) alone: timm's hook, FX and list
    wrappers return what the blocks return, grid-major ``H/2 x W/2 x B x D``, as if it were a feature map."""
    from timm.models._features import FeatureGetterNet
    feature_cls = kwargs.get('feature_cls', 'getter')
    getter = (isinstance(feature_cls, str) and feature_cls.lower() == 'getter'
              or isinstance(feature_cls, type) and issubclass(feature_cls, FeatureGetterNet))  # as timm takes it
    if kwargs.get('features_only') and not getter:
        raise ValueError(f'{variant} gives features through forward_intermediates only (feature_cls=\'getter\', '
                         f'the default), not feature_cls={feature_cls!r}: its blocks work in a grid-major '
                         f'H/2 x W/2 x B x D layout, which hooks and FX would return as it is (docs/models.md, '
                         f'"Layer outputs")')
