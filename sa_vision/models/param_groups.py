""" Optimizer parameter groups with a separate learning rate for the positional parameters

They are coordinates in grid units: with Adam at the weight matrices' lr a centre needs hundreds of steps per grid
unit, so in a short run the heads never leave their random start (paper Figs. 3-4). Their groups carry timm's
``lr_scale``, which timm's schedulers apply on every step (docs/training.md, "Positional parameters"). """
from typing import Any, Collection, Dict, List, Optional, Set

from torch import nn

from ..errors import UserError
from ..layers import PositionalAttention

__all__ = ['positional_parameter_names', 'check_pos_lr_scale', 'param_groups_pos_lr']


def positional_parameter_names(model: nn.Module) -> Set[str]:
    """Names of the parameters of every :class:`PositionalAttention`'s scores (its ``position``); not the
    ``content`` kind's query / key projections."""
    positional = {id(p) for module in model.modules() if isinstance(module, PositionalAttention)
                  for p in module.position.parameters()}
    return {name for name, p in model.named_parameters() if id(p) in positional}


def check_pos_lr_scale(pos_lr_scale: float) -> None:
    if not pos_lr_scale > 0:
        raise UserError(f'pos_lr_scale must be > 0 (a multiplier of the learning rate), got {pos_lr_scale}')


def param_groups_pos_lr(
        model: nn.Module,
        weight_decay: float = 1e-5,
        pos_lr_scale: float = 1.0,
        no_weight_decay_list: Optional[Collection[str]] = None,
) -> List[Dict[str, Any]]:
    """timm's weight-decay groups with the positional parameters split off, carrying ``lr_scale = pos_lr_scale``;
    at 1 exactly timm's groups, so optimizer states saved before this option existed still load."""
    # imported here: importing timm.optim sets process-wide torch options (timm's kron.py raises dynamo's
    # recompile limit), which `import sa_vision` must leave as a timm user has them
    from timm.optim import param_groups_weight_decay
    check_pos_lr_scale(pos_lr_scale)
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
