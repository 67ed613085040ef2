""" The attention switches a benchmark times a model against (:mod:`sa_vision.layers.switches`: dense mixing,
separable mixing, the batched path, the fused kernel, the dense path projected first), and the refusals of a
switched copy that would run as the model itself does: a 1.00x that means nothing """
import contextlib
import functools
from typing import Any, Iterator, List, Sequence

from torch import nn

from ..errors import UserError
from ..layers import PositionalAttention, batched_heads, dense_attention, fused_mix_and_project, project_first
from ..layers.attention_path import CUDA_PROJECT_FIRST, choose_path, cuda_dense_mixing
from ..models.input_pad import model_input_padding

__all__ = ['SWITCHES', 'check_switch_changes', 'check_switches_change_paths']


@contextlib.contextmanager
def _dense_projected_first(model: nn.Module) -> Iterator[nn.Module]:
    """Dense mixing projected first: timed against ``dense``, the pair differs only in the projection's order."""
    with dense_attention(model), project_first(model):
        yield model


# 'separable': the other form where the device's default is dense (CUDA, CUDA_DENSE_MIXING)
SWITCHES = {'dense': dense_attention, 'separable': functools.partial(dense_attention, enabled=False),
            'batched': batched_heads,
            'fused': fused_mix_and_project, 'projfirst': _dense_projected_first}

# what each switch changes: a model without such a layer would be timed against itself
_SWITCHED_LAYERS = {
    'dense': ('separable attention layer (the quadratic or learned kinds)', lambda attn: attn.separable),
    'separable': ('separable attention layer (the quadratic or learned kinds)', lambda attn: attn.separable),
    'fused': ('content-free attention layer', lambda attn: attn.content is None),
    'batched': ('attention layer', lambda attn: True),
    'projfirst': ('content-free attention layer', lambda attn: attn.content is None),
}


def check_switch_changes(model: nn.Module, model_name: str, switch: str) -> None:
    """Refuse a switch for a model without the layers it switches (the generalized kind always mixes densely, the
    content kind never takes the kernel, a ResNet has no attention)."""
    what, switched = _SWITCHED_LAYERS[switch]
    if not any(switched(m) for m in model.modules() if isinstance(m, PositionalAttention)):
        raise UserError(f'--compare {switch}: {model_name} has no {what} for it to switch, so it would be timed '
                        f'against itself; leave {switch} out for this model')


def _attention_paths(variant, runner) -> List[Any]:
    """How each attention layer of ``variant`` runs in ``runner``'s training step, then in its inference step
    (:func:`~sa_vision.layers.attention_path.choose_path`, with the runner's device, dtype, autocast and compile)."""
    paths = []
    with variant.context():
        for model, training in ((runner.train_model, True), (runner.infer_model, False)):
            dtype, pad = next(model.parameters()).dtype, model_input_padding(model)
            height, width = runner.x.shape[-2:]
            cuda_dense = cuda_dense_mixing((height + 2 * pad) // 2 * ((width + 2 * pad) // 2))  # the grid's tokens
            paths += [choose_path(runner.device.type, dtype, runner.amp, bool(runner.torchcompile), False, training,
                                  training, m.separable, m.content is not None, m.dense, m.batched_heads,
                                  m.fused_kernel, cuda_dense, m.project_first, CUDA_PROJECT_FIRST)
                      for m in model.modules() if isinstance(m, PositionalAttention)]
    return paths


def check_switches_change_paths(variants: Sequence, runners: Sequence) -> None:
    """Refuse a switched variant whose attention would run exactly as the first variant's in these steps (e.g.
    ``batched`` on CUDA, under autocast or compiled, where every step is batched already): a 1.00x that means
    nothing; and ``projfirst`` where no layer is projected first (it would run as ``dense``).
    :func:`check_switch_changes` refuses a model without the switched layers; this needs the steps' setting."""
    own = None
    for v, r in zip(variants[1:], runners[1:]):  # the first, switched or not, is what the others are timed against
        if v.switch is None:
            continue
        own = own if own is not None else _attention_paths(variants[0], runners[0])
        switched = _attention_paths(v, r)
        if v.switch == 'projfirst' and not any(p.project_first for p in switched):
            raise UserError(f'--compare projfirst: no attention layer of {variants[0].name} runs batched here '
                            f'(float32 / float64 eager on the CPU runs per head), so it would run as dense does; '
                            f'add --amp, --precision bfloat16 or --torchcompile, or leave it out')
        if switched == own:
            setting = ', '.join([r.device.type, f'{r.amp_dtype} autocast'.replace('torch.', '') if r.amp
                                 else str(next(r.train_model.parameters()).dtype).replace('torch.', '')]
                                + (['compiled'] if r.torchcompile else []))
            other = {'dense': ' (on CUDA, compare separable)', 'separable': ' (on the CPU, compare dense)'}
            raise UserError(f'--compare {v.switch}: {variants[0].name} already runs every attention layer that '
                            f'way here ({setting}), so it would be timed against itself; leave {v.switch} out '
                            f'for this setting{other.get(v.switch, "")}')
