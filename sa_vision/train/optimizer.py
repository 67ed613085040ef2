""" The optimizer's implementation on the machine a run trains on: torch's fused step or its default
(``--opt-fused``: docs/training.md) """
import difflib
import inspect
from typing import Tuple

import torch

from ..errors import UserError

__all__ = ['FUSED_OPTIMIZERS', 'resolve_opt_fused']

# timm's names of torch's optimizers with a fused step (SGD, Adam, AdamW, Adagrad), for the messages: the choice
# itself asks each class whether it takes ``fused``
FUSED_OPTIMIZERS = ('sgd', 'nesterov', 'momentum', 'adam', 'adamw', 'adagrad')


def resolve_opt_fused(requested: str, opt: str, device) -> Tuple[bool, str]:
    """(whether the optimizer is built ``fused=True``, why) for ``--opt-fused requested``, timm optimizer ``opt``.

    torch's fused implementation (SGD, Adam, AdamW, Adagrad: timm's sgd, nesterov, momentum, adam, adamw, adagrad,
    also behind ``lookahead_``) updates every parameter of a group in one kernel, where foreach launches about ten
    multi-tensor ones and AdamW reads each parameter's step count on the host; its update equals the others up to
    float32 rounding, not bit for bit: 'auto' fuses SGD, Adam and AdamW with CUDA only (torch's fused Adagrad
    was CPU-only in some versions sa_vision supports), where a small model's step is host-bound, and a CPU run
    keeps its numbers."""
    from timm.optim import get_optimizer_class, list_optimizers  # here: importing timm.optim sets torch options
    # as create_optimizer_v2 reads it: the last part names the optimizer, a 'lookahead' first part wraps it
    prefix, _, name = opt.lower().rpartition('_')
    try:
        optimizer_class = get_optimizer_class(name, bind_defaults=False)
    except ValueError:  # not in timm's registry: create_optimizer_v2 would raise the same, as a traceback
        close = [f'{prefix}_{n}' if prefix else n for n in difflib.get_close_matches(name, list_optimizers(), n=3)]
        raise UserError(f'--opt {opt}: timm has no such optimizer'
                        + (f'; did you mean {", ".join(close)}?' if close else '')
                        + ' (timm.optim.list_optimizers() lists them)') from None
    except (AssertionError, ImportError) as e:  # APEX's without CUDA, bitsandbytes' without the package
        raise UserError(f'--opt {opt}: timm cannot build it here: {e}') from None
    has_fused = 'fused' in inspect.signature(optimizer_class).parameters
    if requested == 'off':
        return False, '--opt-fused off: torch\'s default implementation'
    if requested == 'on':
        if not has_fused:
            raise UserError(f'--opt-fused on: torch has no fused implementation of --opt {opt} (only of '
                            f'{", ".join(FUSED_OPTIMIZERS)}); use --opt-fused auto or off')
        return True, '--opt-fused on asked for'
    if not has_fused or optimizer_class not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        return False, f'--opt-fused auto: not fused for {opt}'
    if torch.device(device).type != 'cuda':
        return False, f'--opt-fused auto: fused only with CUDA ({torch.device(device).type} keeps torch\'s ' \
                      f'default, whose numbers the fused update matches only up to rounding)'
    return True, '--opt-fused auto: fused with CUDA'
