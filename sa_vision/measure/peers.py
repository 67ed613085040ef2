""" timm's attention classifiers at the size of the ``cpu`` profile's narrow SA models: the peers of ``--compare``

``VisionTransformer`` and ``ConVit`` (d'Ascoli et al., 2021: attention initialised as a convolution, which
Theorem 1 of the paper (Sec. 3) shows exists), at patch 2 (a 16x16 grid like our 2x2 space-to-depth embedding), 6
layers of 9 heads, MLP ratio 2, no class token: width 72 (8 per head; ours 64, every head over all channels,
D_h = D_out, paper Sec. 4.3 (ii)), 0.27 M parameters against our 0.35 M (docs/performance.md, "Against timm's
attention models").
"""
from typing import Any, Dict, Tuple, Union

from torch import nn

from ..errors import UserError

__all__ = ['PEERS', 'PEER_CLASSES', 'is_peer', 'peer_kwargs', 'build_peer']

# name -> the timm class's constructor arguments (ConViT multiplies embed_dim by num_heads: width 72)
PEERS: Dict[str, Dict[str, Any]] = {
    'vit_peer': dict(img_size=32, patch_size=2, embed_dim=72, depth=6, num_heads=9, mlp_ratio=2, class_token=False,
                     global_pool='avg', num_classes=10),
    'convit_peer': dict(img_size=32, patch_size=2, embed_dim=8, num_heads=9, depth=6, mlp_ratio=2,
                        local_up_to_layer=5, global_pool='avg', num_classes=10),
}
# name -> (timm module, class)
PEER_CLASSES: Dict[str, Tuple[str, str]] = {
    'vit_peer': ('timm.models.vision_transformer', 'VisionTransformer'),
    'convit_peer': ('timm.models.convit', 'ConVit'),
}


def is_peer(name: str) -> bool:
    return name in PEERS


def peer_kwargs(name: str, img_size: Union[int, Tuple[int, int]] = 32, in_chans: int = 3,
                **overrides) -> Dict[str, Any]:
    """The constructor arguments of peer ``name`` for ``in_chans x img_size`` input (patch 2: the grid is
    ``img_size / 2``), updated by ``overrides``."""
    if name not in PEERS:
        raise UserError(f'unknown peer {name!r}; the peers are {sorted(PEERS)}')
    if isinstance(img_size, (tuple, list)):
        img_size = tuple(img_size)
        if img_size[0] == img_size[1]:
            img_size = img_size[0]
        elif name == 'convit_peer':
            raise UserError(f'convit_peer needs a square input (ConViT\'s relative positions assume a square grid), '
                            f'got {img_size[0]}x{img_size[1]}')
    return {**PEERS[name], 'img_size': img_size, 'in_chans': in_chans, **overrides}


def build_peer(name: str, img_size: Union[int, Tuple[int, int]] = 32, in_chans: int = 3, **overrides) -> nn.Module:
    """Peer ``name`` (a key of :data:`PEERS`) built by its timm class with :func:`peer_kwargs`."""
    import importlib
    kwargs = peer_kwargs(name, img_size, in_chans, **overrides)
    module, cls = PEER_CLASSES[name]
    return getattr(importlib.import_module(module), cls)(**kwargs)
