""" Optimizer parameter groups with a separate learning rate for the positional parameters

The Gaussian centres ``mu_h`` and precision factors of the quadratic / generalized kinds (and the learned kind's
relative tables and key maps) are coordinates in grid units. With Adam every parameter moves by about ``lr`` per
step, so at the learning rate that suits the weight matrices (1e-3 .. 3e-3) a centre crosses one grid unit in
hundreds of steps: in a short run the heads barely leave their random start, and the paper's central picture
(heads moving to a kernel-like grid around the query, Figs. 2-4) never forms. :func:`param_groups_pos_lr` puts
them in groups of their own with ``lr_scale = pos_lr_scale``.

``lr_scale`` is timm's own mechanism (layer-wise lr decay uses it): every timm scheduler sets a group's lr to
``schedule(t) * group['lr_scale']`` on every step (``timm.scheduler.Scheduler.update_groups``), so the positional
groups follow exactly the same warm-up / cosine shape at ``pos_lr_scale`` times the other groups' lr. Use it as
``create_optimizer_v2(model, ..., param_group_fn=partial(param_groups_pos_lr, weight_decay=wd, pos_lr_scale=s))``.
Without a timm scheduler, ``lr_scale`` is ignored by torch: set ``group['lr'] *= group['lr_scale']`` once.
"""
from typing import Any, Collection, Dict, List, Optional, Set

from timm.optim import param_groups_weight_decay
from torch import nn

from ..layers import PositionalAttention

__all__ = ['positional_parameter_names', 'param_groups_pos_lr']


def positional_parameter_names(model: nn.Module) -> Set[str]:
    """Names of the parameters of every :class:`PositionalAttention`'s scores (``<layer>.position.*``): centres
    and precision factors (``spreads``) of the Gaussian kinds, row / column tables and key maps of the learned
    kind. The ``content`` kind's query / key projections are not positional and are not included."""
    names = set()
    for module_name, module in model.named_modules():
        if isinstance(module, PositionalAttention):
            prefix = f'{module_name}.position.' if module_name else 'position.'
            names.update(prefix + name for name, _ in module.position.named_parameters())
    return names


def param_groups_pos_lr(
        model: nn.Module,
        weight_decay: float = 1e-5,
        pos_lr_scale: float = 1.0,
        no_weight_decay_list: Optional[Collection[str]] = None,
) -> List[Dict[str, Any]]:
    """timm's weight-decay groups (``param_groups_weight_decay``) with the positional parameters split off into
    groups of their own carrying ``lr_scale = pos_lr_scale``.

    Weight decay is decided as timm decides it (none for 1-D parameters, biases and ``model.no_weight_decay()``,
    which names the Gaussian centres and spreads), so the positional groups keep what they had. With
    ``pos_lr_scale == 1`` the groups are exactly timm's (the same number and order as before this option existed,
    so optimizer states saved then still load).

    Args:
        model: Any model; those without :class:`PositionalAttention` layers get timm's groups unchanged.
        weight_decay: Weight decay of the decayed groups.
        pos_lr_scale: Learning-rate multiplier of the positional parameters (> 0).
        no_weight_decay_list: Parameter names (fnmatch patterns) without weight decay; default
            ``model.no_weight_decay()``.
    """
    if not pos_lr_scale > 0:
        raise ValueError(f'pos_lr_scale must be > 0 (a multiplier of the learning rate), got {pos_lr_scale}')
    if no_weight_decay_list is None:
        no_weight_decay_list = set(getattr(model, 'no_weight_decay', lambda: set())())
    groups = param_groups_weight_decay(model, weight_decay=weight_decay, no_weight_decay_list=no_weight_decay_list)
    if pos_lr_scale == 1.0:
        return groups
    positional_ids = {id(p) for name, p in model.named_parameters() if name in positional_parameter_names(model)}
    split = []
    for group in groups:
        rest = [p for p in group['params'] if id(p) not in positional_ids]
        positional = [p for p in group['params'] if id(p) in positional_ids]
        if rest:
            split.append({**group, 'params': rest})
        if positional:
            split.append({**group, 'params': positional, 'lr_scale': pos_lr_scale})
    return split
