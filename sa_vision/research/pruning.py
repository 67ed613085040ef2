""" Pruning degenerate attention heads (how ``sa_gen_pruned`` is made; paper App. A.1)

A head with precision ``M_h = S_h S_h^T`` is degenerate when it attends almost uniformly (largest eigenvalue
``< 1e-5``) or to a thin stripe (condition number ``> 1000``). App. A.1 says a condition number greater than 1e5;
1000 is the bound of the authors' training script as a public copy of it shows (unchecked against their final
code). On the cpu zoo's ``sa_gen_cifar`` both prune the same single head (condition number 1.86e6); on the gpu-long
zoo's, 1000 prunes five heads and 1e5 two (docs/research.md).
Dropping it removes its parameters and Value input columns; fine-tune afterwards (paper App. A.1). """
import copy
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..models import DEFAULT_MODEL_OF_KIND
from ..models.sa_state_dict import (
    CENTERS,
    COL_KEYS,
    CONTENT_KEY_BIAS,
    CONTENT_KEY_WEIGHT,
    CONTENT_QUERY_BIAS,
    CONTENT_QUERY_WEIGHT,
    PRECISION_FACTORS,
    ROW_KEYS,
    VALUE_WEIGHT,
    block_key,
)
from .analysis import GAUSSIAN_KINDS, attention_layers, head_precisions

__all__ = ['PRUNED_ARCH', 'PruningError', 'save_pruned', 'pruned_arch', 'pruned_model_args', 'head_eigenvalues',
           'check_thresholds', 'find_degenerate_heads', 'select_heads_to_prune', 'prune_state_dict', 'prune_heads',
           'numbered_heads', 'head_indices']

MAX_EIGENVALUE_BELOW = 1e-5  # App. A.1 and the authors' script: prune if M_h's largest eigenvalue is below this
MAX_CONDITION = 1000.  # the authors' script (App. A.1: 1e5): prune if M_h's condition number is above this
PRUNED_ARCH = 'sa_gen_pruned'  # the registered model of pruned generalized weights (any kept heads via heads_per_layer)


class PruningError(UserError):
    """Heads that cannot be pruned as asked (an unknown head or layer, a layer left without heads, another kind)."""


# What a person reads and types (the figures, the explorer, the tables, sa-vision-prune, pruning.json) numbers layers
# and heads from 1, as the paper's figures number layers; Python's lists of head indices count from 0.
def numbered_heads(heads: Sequence[Sequence[int]]) -> List[List[int]]:
    """Per layer, head indices as the outputs number them: from 1."""
    return [[int(h) + 1 for h in layer] for layer in heads]


def head_indices(numbers: Sequence[Sequence[int]], heads_per_layer: Sequence[int]) -> List[List[int]]:
    """Per layer, the indices of the heads numbered ``numbers`` (from 1, as :func:`numbered_heads` gives them); a
    :class:`PruningError` names a number the layer does not have."""
    if len(numbers) != len(heads_per_layer):
        raise PruningError(f'{len(numbers)} list(s) of heads but the model has {len(heads_per_layer)} layers: one '
                           f'list per layer, an empty one for a layer kept whole')
    for layer, (layer_numbers, num_heads) in enumerate(zip(numbers, heads_per_layer), start=1):
        unknown = sorted({h for h in layer_numbers if not 1 <= h <= num_heads})
        if unknown:
            raise PruningError(f'layer {layer} has heads 1-{num_heads} (numbered from 1, as the figures, the '
                               f'explorer and the tables number them), not {unknown}')
        repeated = sorted({h for h in layer_numbers if list(layer_numbers).count(h) > 1})
        if repeated:
            raise PruningError(f'layer {layer}: head(s) {repeated} named more than once; name each head to prune '
                               f'once')
    return [[h - 1 for h in layer_numbers] for layer_numbers in numbers]


def head_eigenvalues(model: nn.Module) -> List[Tensor]:
    """Per layer, the eigenvalues ``(heads, 2)`` (ascending) of every head's precision ``M_h``."""
    return [torch.linalg.eigvalsh(precisions) for precisions in head_precisions(model)]


def check_thresholds(max_eigenvalue_below: float, max_condition: float) -> None:
    """A :class:`PruningError` for a threshold that cannot be meant: a negative eigenvalue bound (0 already turns
    that test off: no largest eigenvalue of ``M_h`` is below it), a condition bound below 1 (every condition number
    is at least 1: every head would be degenerate)."""
    if not max_eigenvalue_below >= 0:
        raise PruningError(f'--max-eigenvalue-below is {max_eigenvalue_below:g}: no eigenvalue of M_h is below a '
                           f'negative bound; give a positive one (default {MAX_EIGENVALUE_BELOW:g}), or 0 to turn '
                           f'that test off')
    if not max_condition >= 1:
        raise PruningError(f'--max-condition is {max_condition:g}: every condition number is at least 1, so every '
                           f'head would be degenerate; give a bound of at least 1 (default {MAX_CONDITION:g})')


def find_degenerate_heads(
        model: nn.Module,
        max_eigenvalue_below: float = MAX_EIGENVALUE_BELOW,
        max_condition: float = MAX_CONDITION,
) -> List[List[int]]:
    """Per layer, the heads whose ``M_h`` has largest eigenvalue ``< max_eigenvalue_below`` or condition number
    (``inf`` when singular) ``> max_condition``."""
    check_thresholds(max_eigenvalue_below, max_condition)
    degenerate = []
    for eigenvalues in head_eigenvalues(model):
        smallest, largest = eigenvalues[:, 0].abs(), eigenvalues[:, 1].abs()
        condition = torch.where(
            smallest > 0, largest / smallest.clamp(min=1e-300), torch.full_like(largest, float('inf')))
        bad = (largest < max_eigenvalue_below) | (condition > max_condition)
        degenerate.append([int(i) for i in torch.nonzero(bad).flatten()])
    return degenerate


def select_heads_to_prune(
        model: nn.Module,
        max_eigenvalue_below: float = MAX_EIGENVALUE_BELOW,
        max_condition: float = MAX_CONDITION,
) -> List[List[int]]:
    """The heads to prune per layer: :func:`find_degenerate_heads`, but a layer keeps at least its least degenerate
    head (largest eigenvalue of ``M_h``): a layer without heads would leave its Value map without input."""
    selected = []
    for drop, eigenvalues, num_heads in zip(find_degenerate_heads(model, max_eigenvalue_below, max_condition),
                                            head_eigenvalues(model), model.heads_per_layer):
        if len(drop) == num_heads:
            keep = int(eigenvalues[:, 1].abs().argmax())
            drop = [h for h in drop if h != keep]
        selected.append(drop)
    return selected


def _per_head_params(kind: str, dim: int) -> Dict[str, Tuple[int, int]]:
    """Parameter suffix within a block -> (dim holding the heads, entries per head)."""
    if kind in GAUSSIAN_KINDS:
        return {CENTERS: (0, 1), PRECISION_FACTORS: (0, 1), VALUE_WEIGHT: (1, dim)}
    params = {ROW_KEYS: (0, 1), COL_KEYS: (0, 1), VALUE_WEIGHT: (1, dim)}
    if kind == 'content':
        params.update({name: (0, dim) for name in (CONTENT_QUERY_WEIGHT, CONTENT_QUERY_BIAS, CONTENT_KEY_WEIGHT,
                                                   CONTENT_KEY_BIAS)})
    return params


def prune_state_dict(
        state_dict: Dict[str, Tensor],
        heads_to_prune: Sequence[Sequence[int]],
        heads_per_layer: Sequence[int],
        embed_dim: int,
        attn_kind: str = 'generalized',
) -> Tuple[Dict[str, Tensor], Tuple[int, ...]]:
    """Remove ``heads_to_prune`` (per layer) from a :class:`~sa_vision.models.SelfAttentionNet` state dict (not
    modified); returns the pruned state dict and the heads per layer it holds."""
    if len(heads_to_prune) != len(heads_per_layer):
        raise PruningError(
            f'heads_to_prune has {len(heads_to_prune)} layers but the model has {len(heads_per_layer)}; '
            f'give one list of head indices per layer (an empty list keeps the layer whole)')
    per_head = _per_head_params(attn_kind, embed_dim)
    pruned = dict(state_dict)
    kept_per_layer = []
    for layer, (drop, num_heads) in enumerate(zip(heads_to_prune, heads_per_layer)):
        drop = sorted({int(h) for h in drop})
        if any(not 0 <= h < num_heads for h in drop):  # indices: the outputs' numbers (numbered_heads) less 1
            raise PruningError(f'layer {layer + 1} has head indices 0-{num_heads - 1} (heads 1-{num_heads}), cannot '
                               f'prune indices {drop}')
        keep = [h for h in range(num_heads) if h not in drop]
        if not keep:
            raise PruningError(f'pruning heads {numbered_heads([drop])[0]} would leave layer {layer + 1} without '
                               f'any head; keep at least one')
        kept_per_layer.append(len(keep))
        for suffix, (dim, width) in per_head.items():
            key = block_key(layer, suffix)
            if key not in state_dict:
                raise PruningError(f'state dict has no {key!r}; is it a {attn_kind!r} self-attention model?')
            index = torch.tensor([h * width + i for h in keep for i in range(width)], dtype=torch.long)
            pruned[key] = state_dict[key].index_select(dim, index.to(state_dict[key].device)).clone()
    return pruned, tuple(kept_per_layer)


@torch.no_grad()
def prune_heads(model: nn.Module, heads_to_prune: Optional[Sequence[Sequence[int]]] = None, **thresholds) -> nn.Module:
    """A copy of ``model`` with the given heads (default: :func:`find_degenerate_heads` with ``thresholds``)
    removed, the remaining weights unchanged."""
    kind = attention_layers(model)[0].kind
    if heads_to_prune is None:
        heads_to_prune = find_degenerate_heads(model, **thresholds)
    state_dict, kept = prune_state_dict(
        model.state_dict(), heads_to_prune, model.heads_per_layer, model.embed_dim, kind)
    pruned = copy.deepcopy(model)
    for block, num_heads in zip(pruned.blocks, kept):
        attn = block.attn
        ref = block.value.weight
        dd = {'device': ref.device, 'dtype': ref.dtype}
        attn.num_heads = num_heads
        attn.position = type(attn.position)(num_heads, **dd) if kind in GAUSSIAN_KINDS else type(attn.position)(
            attn.dim, num_heads, max_shift=attn.position.max_shift, **dd)
        if attn.content is not None:
            attn.content = type(attn.content)(attn.dim, num_heads, **dd)
        attn.clear_probs_cache()
        block.num_heads = num_heads
        # same class as Value (fuse() may have folded the output projection into it)
        block.value = type(block.value)(num_heads * attn.dim, block.value.out_features, **dd)
    pruned.heads_per_layer = kept
    pruned.load_state_dict(state_dict, strict=True)
    return pruned


def pruned_arch(attn_kind: str) -> str:
    """The registered model that pruned weights of ``attn_kind`` load into: ``sa_gen_pruned`` for generalized
    weights, else the kind's own model."""
    return PRUNED_ARCH if attn_kind == 'generalized' else DEFAULT_MODEL_OF_KIND[attn_kind]


def pruned_model_args(pruned: nn.Module, model_args: Optional[Dict] = None) -> Tuple[str, Dict]:
    """(architecture, ``model_args``) of a pruned model as :func:`save_pruned` writes it: what its weights show
    (the kept heads), with ``model_args`` added (arguments its weights do not show)."""
    from ..train.checkpoint import infer_model_args
    args = infer_model_args(pruned.state_dict())
    arch = pruned_arch(args.pop('attn_kind'))  # the registered model of the kind sets the kind itself
    return arch, {**args, **(model_args or {})}


def save_pruned(pruned: nn.Module, path, pruned_heads: Optional[Sequence[Sequence[int]]] = None,
                model_args: Optional[Dict] = None, pretrained_cfg: Optional[Dict] = None) -> Dict:
    """Write a pruned model as a checkpoint of :func:`pruned_arch` with the kept heads in its ``model_args``
    (``.safetensors``: in the metadata), creating the folder; returns the ``model_args``. ``model_args`` adds
    arguments its weights do not show (the border a model adds to its input); ``pretrained_cfg`` is timm's
    preprocessing of the weights (input size, mean / std, tag, label names), which loaders apply."""
    import json
    from pathlib import Path

    from ..io import atomic_torch_save, atomic_write
    from ..train.checkpoint import CHECKPOINT_VERSION
    from ..train.data import dataset_for_tag
    state_dict = {k: v.contiguous() for k, v in pruned.state_dict().items()}
    arch, args = pruned_model_args(pruned, model_args)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # the heads removed, numbered from 1 as the command, the figures and reproduce's pruning.json number them
    removed = {'pruned_heads': numbered_heads(pruned_heads or []), 'heads_numbered_from': 1}
    if str(path).endswith('.safetensors'):
        from safetensors.torch import save_file
        metadata = {'arch': arch, 'model_args': json.dumps(args), **{k: json.dumps(v) for k, v in removed.items()}}
        if pretrained_cfg:
            metadata['pretrained_cfg'] = json.dumps(pretrained_cfg)
        with atomic_write(path) as tmp:
            save_file(state_dict, str(tmp), metadata=metadata)
    else:
        cfg = {'pretrained_cfg': pretrained_cfg, 'dataset': dataset_for_tag(
            pretrained_cfg.get('tag') or '', pretrained_cfg.get('num_classes'))} if pretrained_cfg else {}
        atomic_torch_save({'version': CHECKPOINT_VERSION, 'arch': arch, 'model_args': args, 'state_dict': state_dict,
                           **removed, **cfg}, path)
    return args
