""" Whether a model fits a dataset, checked before the run folder is written: the dataset's labels within the
model's classes, its images of a size the model takes, and the model's own border black in the dataset's
normalisation (:mod:`.data` holds the datasets) """
from typing import Any, Dict, Optional, Sequence

import torch

from ..errors import UserError
from ..layers import check_input_size, has_checked_input_size
from ..models.factory import StoredArgsSource
from .data import dataset_info

__all__ = ['check_model_takes_data', 'classes_problem', 'pad_value_note']


def classes_problem(model_name: str, model: torch.nn.Module, dataset: str) -> Optional[str]:
    """A named dataset's labels that are no class of the model, in words (torch's 'Target 6 is out of bounds' in
    the first batch; more classes than labels are never targets), or None."""
    info, classes = dataset_info(dataset), getattr(model, 'num_classes', None)
    if info.num_classes and classes and classes < info.num_classes:
        return (f'{model_name} has {classes} classes, {info.name} {info.num_classes}: its labels up to '
                f'{info.num_classes - 1} would be no class of the model')
    return None


def check_model_takes_data(model_name: str, model: torch.nn.Module, dataset: str, input_size: Sequence[int],
                           img_size: Optional[int], resumed_from: Optional[str] = None,
                           in_chans_from: str = '--model-kwargs') -> None:
    """A UserError for what would stop the first batch with a traceback: :func:`classes_problem` (a run
    ``resumed_from`` a checkpoint keeps its model), an input size the model's embedding cannot take (an odd
    --img-size), a channel count other than the data's (``in_chans_from``: where the model's came from)."""
    problem = classes_problem(model_name, model, dataset)
    wanted = dataset_info(dataset).num_classes
    if problem and resumed_from:
        raise UserError(f'{problem}. A resumed run keeps its model: start a new run from its weights, '
                        f'--initial-checkpoint {resumed_from} --num-classes {wanted} (the classifier starts anew)')
    if problem:
        raise UserError(f'{problem}. Pass --num-classes {wanted} (from --initial-checkpoint weights of another class '
                        f'count, the classifier starts anew)')
    channels = getattr(model, 'in_chans', input_size[0])
    if channels != input_size[0]:  # every reader gives RGB, grey images repeated, as timm's ImageDataset opens them
        fix = (f'start from weights of {input_size[0]} channels' if isinstance(in_chans_from, StoredArgsSource)
               else f'drop in_chans from {in_chans_from}')
        raise UserError(f'{model_name} was built for {channels}-channel images (in_chans={channels}, from '
                        f'{in_chans_from}), but the datasets feed {input_size[0]}-channel ones (grey images as RGB): '
                        f'{fix} (docs/models.md says where other channel counts serve)')
    try:
        check_input_size(model, input_size)
    except ValueError as e:
        raise UserError(f'{model_name} cannot take {input_size[-2]}x{input_size[-1]} images (--img-size '
                        f'{img_size}): {e}') from None
    if not has_checked_input_size(model):
        _probe_input_size(model_name, model, input_size, img_size)


def _probe_input_size(model_name: str, model: torch.nn.Module, input_size: Sequence[int],
                      img_size: Optional[int]) -> None:
    """A UserError where one image of ``input_size`` stops ``model``'s forward, asked of another package's model
    (a timm ViT built for 224x224 asserts on the first batch, after the run folder was written)."""
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, *input_size))
    except (AssertionError, RuntimeError, ValueError) as e:
        given = f'--img-size {img_size}' if img_size else "its data config's size"
        reason = str(e).rstrip('.')
        raise UserError(f'{model_name} cannot take {"x".join(map(str, input_size))} images ({given}): {reason}. '
                        f'--img-size sizes the data only, as in timm\'s train.py: for a model built for another '
                        f'size, pass --model-kwargs img_size={input_size[-1]} as well, where it takes one') from None
    finally:
        model.train(was_training)


def pad_value_note(pad_value, data_cfg: Dict[str, Any], dataset: str) -> Optional[str]:
    """A note where a model's own border (``input_pad_value``, e.g. the kept Fashion-MNIST weights' black) is not
    black under the normalisation of ``data_cfg``, as when such weights are fine-tuned on another dataset."""
    if pad_value is None:
        return None
    pads = list(pad_value) if isinstance(pad_value, (list, tuple)) else [pad_value] * len(data_cfg['mean'])
    black = [round(-m / s, 4) for m, s in zip(data_cfg['mean'], data_cfg['std'])]
    if all(abs(p - b) < 1e-3 for p, b in zip(pads, black)):
        return None
    return (f'note: the model pads its input with {pads} (its weights\' black), which is not black in the '
            f'normalisation of {dataset or "the image folder"} ({black}): pass --model-kwargs '
            f'"input_pad_value={black}" for a black border')
