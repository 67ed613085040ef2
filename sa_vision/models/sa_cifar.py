""" Fully-attentional classifiers of Cordonnier, Loukas & Jaggi, ICLR 2020 (https://arxiv.org/abs/1911.03584) """
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
from timm.layers import calculate_drop_path_rates
from timm.models import (
    build_model_with_cfg,
    checkpoint,
    checkpoint_seq,
    generate_default_cfgs,
    register_model,
    register_notrace_module,
)
from timm.models._features import feature_take_indices
from torch import Tensor, nn

from ..layers import (
    CONV_INIT_ALPHA,
    GeluMlp,
    HeadsLinear,
    PositionalAttention,
    SampleDropPath,
    SpaceToDepthEmbed,
    attend_then_project,
    check_image_shape,
)
from ..paper import ARXIV_ID, CIFAR10_CLASSES, CIFAR10_LABEL_NAMES, CIFAR10_MEAN, CIFAR10_STD, PRUNED_HEADS_PER_LAYER
from ._pretrained import PRETRAINED_TAG, explain_unavailable_weights, published_source
from .input_pad import create_input_pad
from .sa_args import check_feature_cls, checked_global_pool, checked_heads_per_layer
from .sa_state_dict import CENTERS, PRECISION_FACTORS, checkpoint_filter_fn, rename_old_keys

__all__ = ['SA_MODEL_ARGS', 'DEFAULT_MODEL_OF_KIND', 'SelfAttentionNet', 'SelfAttentionBlock', 'check_image_shape']


@register_notrace_module  # its attention runs through an autograd Function; FX keeps the block whole
class SelfAttentionBlock(nn.Module):
    """One post-norm layer on grid-major ``h x w x B x D``: attention, Value, proj, residual, LN; MLP, residual, LN."""

    def __init__(
            self,
            dim: int,
            num_heads: int,
            mlp_hidden_dim: int = 512,
            attn_kind: str = 'quadratic',
            proj_drop: float = 0.1,
            attn_drop: float = 0.1,
            drop_path: float = 0.,
            max_rel_shift: int = 15,
            norm_eps: float = 1e-12,
            pos_init: str = 'paper',
            pos_init_alpha: float = CONV_INIT_ALPHA,
            device=None,
            dtype=None,
    ):
        """
        Args:
            dim: Token width D, in and out, and every head's width.
            num_heads: Attention heads N_h of this layer.
            mlp_hidden_dim: As :class:`SelfAttentionNet`'s.
            attn_kind: As :class:`SelfAttentionNet`'s.
            proj_drop: :class:`SelfAttentionNet`'s ``proj_drop_rate``.
            attn_drop: :class:`SelfAttentionNet`'s ``attn_drop_rate``.
            drop_path: Stochastic depth: the probability that a sample skips each residual branch.
            max_rel_shift: As :class:`SelfAttentionNet`'s.
            norm_eps: As :class:`SelfAttentionNet`'s.
            pos_init: As :class:`SelfAttentionNet`'s.
            pos_init_alpha: As :class:`SelfAttentionNet`'s.
        """
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.attn = PositionalAttention(
            dim, num_heads, attn_kind, attn_drop=attn_drop, max_shift=max_rel_shift, grid_major=True,
            pos_init=pos_init, pos_init_alpha=pos_init_alpha, **dd)
        self.value = HeadsLinear(num_heads * dim, dim, **dd)  # reads the heads stacked by the attention
        self.proj = nn.Linear(dim, dim, **dd)  # the output projection, the released code's Dense
        self.proj_drop = nn.Dropout(proj_drop)
        self.drop_path1 = SampleDropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, **dd)
        # exact (erf) GELU; the original drops out only after the second Linear
        self.mlp = GeluMlp(dim, mlp_hidden_dim, drop=proj_drop, **dd)
        self.drop_path2 = SampleDropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps, **dd)

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            attended = self.value(self.attn(x))
        else:
            attended = self._attend(x)
        x = self.norm1(x + self.drop_path1(self.proj_drop(self.proj(attended))))
        x = self.norm2(x + self.drop_path2(self.mlp(x)))
        return x

    @torch.jit.unused
    def _attend(self, x: Tensor) -> Tensor:
        # keeps only x for backward instead of the heads-times larger attention output
        return attend_then_project(self.attn, self.value, x)

    @torch.no_grad()
    def fuse(self) -> 'SelfAttentionBlock':
        """Fold the output projection into Value (two stacked Linear maps -> one) for inference, in place. The
        name is timm's convention: its ``reparameterize_model`` (``--reparam``) replaces every child that has a
        ``fuse()`` with what it returns."""
        if isinstance(self.proj, nn.Identity):
            return self
        fused = HeadsLinear(self.value.in_features, self.proj.out_features,
                            device=self.value.weight.device, dtype=self.value.weight.dtype)
        fused.weight.copy_(self.proj.weight @ self.value.weight)
        fused.bias.copy_(self.proj.weight @ self.value.bias + self.proj.bias)
        self.value, self.proj = fused, nn.Identity()
        return self


class SelfAttentionNet(nn.Module):
    """Fully-attentional classifier (paper Sec. 4.1, App. A.4): a 2x2 space-to-depth embedding, post-norm
    attention layers, the mean over the grid and a linear classifier. Tokens are grid-major ``h x w x B x D``
    inside (``docs/attention.md``). A pruned model has fewer heads in some layers (``heads_per_layer``).

    Args:
        in_chans: Image channels C.
        num_classes: Classes of the linear classifier; 0 leaves it out (``head`` is an identity).
        global_pool: 'avg', the mean over the grid (Sec. 4.1), 'max' or 'avgmax' (timm's), or '' to keep the grid
            (timm's convention).
        embed_dim: Token width D, also the head dimension (every head attends over the raw input; 400 in App. A.4).
        depth: Attention layers (6 in App. A.4).
        heads_per_layer: Heads in every layer (an int, 9 in App. A.4) or in each layer (``depth`` ints).
        mlp_hidden_dim: Hidden width of each layer's MLP (the intermediate dimension, 512 in App. A.4).
        attn_kind: The scores of every layer, one of ``ATTENTION_KINDS`` (:class:`PositionalAttention`).
        max_rel_shift: 'learned' and 'content' only: the largest shift per axis, in grid cells, with its own embedding.
        norm_eps: The LayerNorms' epsilon (1e-12 in App. A.4).
        drop_rate: Dropout probability before the classifier.
        proj_drop_rate: Dropout probability after each output projection and MLP (0.1 in App. A.4).
        attn_drop_rate: Dropout probability of the attention probabilities (0.1 in App. A.4).
        drop_path_rate: Stochastic depth of the last layer, rising linearly from 0 in the first.
        pos_init: 'paper' (the paper's random start, Sec. 4.2) or 'conv' (Theorem 1's kernel, sharpness
            ``pos_init_alpha``, Eq. 9); initial values only (:class:`PositionalAttention`).
        pos_init_alpha: 'conv' only: the kernel heads' sharpness, Eq. 9's alpha.
        input_padding: Pixels the model adds on every side of its (normalised) input, filled with
            ``input_pad_value`` per channel: weights trained on zero-padded images (Fashion-MNIST 28 -> 32)
            then take the unpadded images (``sa_vision.models.input_pad``).
        input_pad_value: The border's value, one number or one per channel.
    """

    def __init__(
            self,
            in_chans: int = 3,
            num_classes: int = CIFAR10_CLASSES,
            global_pool: str = 'avg',
            embed_dim: int = 400,
            depth: int = 6,
            heads_per_layer: Union[int, Sequence[int]] = 9,
            mlp_hidden_dim: int = 512,
            attn_kind: str = 'quadratic',
            max_rel_shift: int = 15,
            norm_eps: float = 1e-12,
            drop_rate: float = 0.,
            proj_drop_rate: float = 0.1,
            attn_drop_rate: float = 0.1,
            drop_path_rate: float = 0.,
            pos_init: str = 'paper',
            pos_init_alpha: float = CONV_INIT_ALPHA,
            input_padding: int = 0,
            input_pad_value: Union[float, Sequence[float]] = 0.,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        heads_per_layer = checked_heads_per_layer(heads_per_layer, depth, attn_kind)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = checked_global_pool(global_pool)
        self.heads_per_layer = heads_per_layer
        self.attn_kind = attn_kind
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.drop_rate = drop_rate
        self.output_fmt = 'NHWC'
        self.grad_checkpointing = False

        self.input_pad = create_input_pad(input_padding, input_pad_value, in_chans, **dd)
        self.patch_embed = SpaceToDepthEmbed(in_chans, embed_dim, **dd)
        dpr = calculate_drop_path_rates(drop_path_rate, depth)
        block_args = dict(mlp_hidden_dim=mlp_hidden_dim, attn_kind=attn_kind, proj_drop=proj_drop_rate,
                          attn_drop=attn_drop_rate, max_rel_shift=max_rel_shift, norm_eps=norm_eps, pos_init=pos_init,
                          pos_init_alpha=pos_init_alpha, **dd)
        self.blocks = nn.Sequential(*[SelfAttentionBlock(embed_dim, num_heads, drop_path=dpr[i], **block_args)
                                      for i, num_heads in enumerate(heads_per_layer)])
        self.feature_info = [
            dict(module=f'blocks.{i}', num_chs=embed_dim, reduction=2) for i in range(depth)]
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """The Gaussian centres and precision factors, trained without weight decay as in the paper's released code
        (App. A.4 lists the decay without exceptions). The learned kinds' shift tables are decayed: the paper names no
        exception for them (timm leaves its relative-position tables undecayed)."""
        return {
            name for name, _ in self.named_parameters()
            if name.endswith((CENTERS, PRECISION_FACTORS))}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # torch's load_state_dict (and so every timm loader) hands this module its part of the state dict, under
        # prefix (e.g. 'module.' in DDP), before its layers': weights saved under an old name load too
        rename_old_keys(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict:
        return dict(stem=r'^patch_embed', blocks=r'^blocks\.(\d+)')

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = checked_global_pool(global_pool)
        if num_classes > 0:
            # keep the new head on the device and dtype of the model
            ref = self.patch_embed.proj.weight
            self.head = nn.Linear(self.embed_dim, num_classes, device=ref.device, dtype=ref.dtype)
        else:
            self.head = nn.Identity()
        self.head.train(self.training)

    def forward_intermediates(
            self,
            x: Tensor,
            indices: Optional[Union[int, List[int]]] = None,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = 'NCHW',
            intermediates_only: bool = False,
    ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """Forward that also returns the outputs of the selected layers (timm API; ``norm`` is unused: the layers
        are post-norm). Intermediates are ``output_fmt`` 'NCHW', 'NHWC' or 'NLC' (as the ViT family's tokens: the
        grid row by row, no class token)."""
        if output_fmt not in ('NCHW', 'NHWC', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW', 'NHWC' or 'NLC', got '{output_fmt}'")
        check_image_shape(x, self.in_chans)  # the shape passed, before the border (which keeps H, W even)
        x = self.input_pad(x)
        intermediates = []
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x = self.patch_embed(x)
        if torch.jit.is_scripting() or not stop_early:
            blocks = self.blocks
        else:
            blocks = self.blocks[:max_index + 1]
        for i, blk in enumerate(blocks):
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x)
            else:
                x = blk(x)
            if i in take_indices:
                # grid-major h x w x B x D -> B x D x h x w (NCHW), B x h x w x D (NHWC) or B x h*w x D (NLC)
                if output_fmt == 'NCHW':
                    intermediates.append(x.permute(2, 3, 0, 1).contiguous())
                else:
                    nhwc = x.permute(2, 0, 1, 3)
                    intermediates.append(nhwc.flatten(1, 2) if output_fmt == 'NLC' else nhwc)
        if intermediates_only:
            return intermediates
        return x.permute(2, 0, 1, 3), intermediates

    def prune_intermediate_layers(
            self,
            indices: Union[int, List[int]] = 1,
            prune_norm: bool = False,
            prune_head: bool = True,
    ) -> List[int]:
        """Drop the layers after the last selected one (and the head if asked)."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:max_index + 1]
        self.heads_per_layer = self.heads_per_layer[:max_index + 1]
        if prune_head:
            self.reset_classifier(0, '')
        return take_indices

    def forward_features(self, x: Tensor) -> Tensor:
        """Image ``B x C x H x W`` (H, W even) to the token grid ``B x H'/2 x W'/2 x D`` (H', W': once padded)."""
        check_image_shape(x, self.in_chans)  # the shape passed, before the border (which keeps H, W even)
        x = self.input_pad(x)
        x = self.patch_embed(x)  # H/2, W/2, B, D: the blocks work grid-major
        if self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_seq(self.blocks, x)
        else:
            x = self.blocks(x)
        return x.permute(2, 0, 1, 3)

    @torch.no_grad()
    def fuse(self) -> 'SelfAttentionNet':
        """Deploy switch: fold every layer's Value and output projection into one Linear. Inference only; the state
        dict then no longer matches the training layout."""
        for blk in self.blocks:
            blk.fuse()
        return self

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        if self.global_pool == 'avg':
            x = x.mean(dim=(1, 2))
        elif self.global_pool == 'max':
            x = x.amax(dim=(1, 2))
        elif self.global_pool == 'avgmax':
            x = 0.5 * (x.mean(dim=(1, 2)) + x.amax(dim=(1, 2)))
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


# the registered attention models and their arguments beyond SelfAttentionNet's defaults (the one list of them)
SA_MODEL_ARGS: Dict[str, Dict] = {
    'sa_quadratic_cifar': dict(attn_kind='quadratic'),
    'sa_gen_cifar': dict(attn_kind='generalized'),
    'sa_gen_pruned': dict(attn_kind='generalized', heads_per_layer=PRUNED_HEADS_PER_LAYER),
    'sa_learned_cifar': dict(attn_kind='learned'),
    'sa_content_cifar': dict(attn_kind='content'),
}

# the paper's model of each attention kind (sa_content_cifar: ours): what bare weights of that kind load as, named
# here so that a variant added to SA_MODEL_ARGS never takes the paper's weights over
DEFAULT_MODEL_OF_KIND: Dict[str, str] = {'quadratic': 'sa_quadratic_cifar', 'generalized': 'sa_gen_cifar',
                                         'learned': 'sa_learned_cifar', 'content': 'sa_content_cifar'}


def _create_sa(variant: str, pretrained: bool = False, **kwargs) -> SelfAttentionNet:
    if 'img_size' in kwargs:  # a ViT's keyword: here the bare TypeError would not say why there is none
        raise TypeError(f"{variant}() got an unexpected keyword argument 'img_size': it takes images of any even "
                        f"size, so it has none; size the data instead (timm's --img-size / --input-size)")
    kwargs = {**SA_MODEL_ARGS[variant], **kwargs}
    check_feature_cls(variant, kwargs)
    out_indices = kwargs.pop('out_indices', 3)
    with explain_unavailable_weights(variant, pretrained, kwargs.get('pretrained_cfg'),
                                     kwargs.get('pretrained_cfg_overlay'), kwargs.get('cache_dir')):
        return build_model_with_cfg(SelfAttentionNet, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
                                    feature_cfg=dict(out_indices=out_indices, feature_cls='getter'), **kwargs)


def _cfg(**kwargs) -> Dict:
    return {
        'num_classes': CIFAR10_CLASSES, 'label_names': CIFAR10_LABEL_NAMES,
        'input_size': (3, 32, 32), 'pool_size': (16, 16),
        'crop_pct': 1.0, 'interpolation': 'bilinear', 'fixed_input_size': False,
        'mean': CIFAR10_MEAN, 'std': CIFAR10_STD,
        'first_conv': 'patch_embed.proj', 'classifier': 'head',
        'license': 'apache-2.0', 'paper_ids': f'arXiv:{ARXIV_ID}',
        'paper_name': 'On the Relationship between Self-Attention and Convolutional Layers',
        'origin_url': 'https://github.com/epfml/attention-cnn',
        **kwargs,
    }


default_cfgs = generate_default_cfgs({
    f'{arch}.{PRETRAINED_TAG}': _cfg(**published_source(arch))
    for arch in SA_MODEL_ARGS
})


@register_model
def sa_quadratic_cifar(pretrained: bool = False, **kwargs) -> SelfAttentionNet:
    """Isotropic Gaussian (quadratic encoding) attention, 9 heads x 6 layers, 12,086,844 parameters."""
    return _create_sa('sa_quadratic_cifar', pretrained=pretrained, **kwargs)


@register_model
def sa_gen_cifar(pretrained: bool = False, **kwargs) -> SelfAttentionNet:
    """Non-isotropic Gaussian (generalized quadratic) attention, 9 heads x 6 layers, 12,087,006 parameters."""
    return _create_sa('sa_gen_cifar', pretrained=pretrained, **kwargs)


@register_model
def sa_gen_pruned(pretrained: bool = False, **kwargs) -> SelfAttentionNet:
    """Non-isotropic Gaussian attention with degenerate heads pruned (7,5,8,7,3,9), 9,686,916 parameters."""
    return _create_sa('sa_gen_pruned', pretrained=pretrained, **kwargs)


@register_model
def sa_learned_cifar(pretrained: bool = False, **kwargs) -> SelfAttentionNet:
    """Learned relative position encoding without content, 9 heads x 6 layers, 12,278,682 parameters."""
    return _create_sa('sa_learned_cifar', pretrained=pretrained, **kwargs)


@register_model
def sa_content_cifar(pretrained: bool = False, **kwargs) -> SelfAttentionNet:
    """Learned relative position encoding with content (query/key) attention, 9 heads x 6 layers (~29.6 M)."""
    return _create_sa('sa_content_cifar', pretrained=pretrained, **kwargs)
