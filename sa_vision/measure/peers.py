""" timm's attention classifiers at the size of the ``cpu`` profile's narrow SA models: the peers of ``--compare``

A user who wants attention on 32x32 images in timm would pick ``VisionTransformer`` or ``ConVit`` (d'Ascoli et al.,
2021: gated positional self-attention initialised as a convolution, the follow-up of Cordonnier et al., whose
Theorem 1 (Sec. 3) shows such an initialisation exists). Both run here at patch 2, a 16x16 grid of tokens like the
2x2 space-to-depth embedding of the SA models (paper Sec. 4), with the paper's 6 layers of 9 heads, no class token
(average pooling, as ours) and about as many parameters as the ``cpu`` profile's narrow ``sa_quadratic_cifar``
(``embed_dim=64, mlp_hidden_dim=128``: 0.35 M):

* ``vit_peer``: ``VisionTransformer(embed_dim=72, num_heads=9, mlp_ratio=2)``, 273,826 parameters;
* ``convit_peer``: ``ConVit(embed_dim=8, num_heads=9, mlp_ratio=2, local_up_to_layer=5)`` (timm multiplies
  ``embed_dim`` by the heads: width 72), 5 gated (GPSA) layers then 1 plain one, 272,827 parameters.

The peers' token width is 72 (8 per head: timm's heads split the width, ConViT multiplies its ``embed_dim`` by the
heads), ours 64 with every head attending over all 64 channels (head dimension = embedding dimension, paper
Sec. 2 and Eq. 2: the Value reads the 9 concatenated heads, ``9*64 -> 64``). The peers are matched on
grid, depth, heads and MLP ratio (2, ours 128/64) and come out at 0.27 M parameters against our 0.35 M. Parameter
counts are at ``img_size=32``; the peers' learned position embeddings grow with the grid (``tokens x 72``).
"""
from typing import Any, Dict, Tuple, Union

from torch import nn

from ..errors import UserError

__all__ = ['PEERS', 'PEER_CLASSES', 'is_peer', 'peer_kwargs', 'build_peer']

# name -> the timm class's constructor arguments (the one place the peers are configured)
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
    """The constructor arguments of peer ``name`` for ``in_chans x img_size`` input (patch 2 whatever the size, so
    the grid is ``img_size / 2``), updated by ``overrides``."""
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
