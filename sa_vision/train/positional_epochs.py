""" The centres and precision factors a model had after each epoch of its training: how the heads moved (paper
Fig. 3), kept by a run in one small file (``--save-epoch-positions``) or read from its ``epoch-*.safetensors``
(``--save-epoch-weights``), and kept beside exported weights in that small file """
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..errors import UserError
from ..io import atomic_write
from ..models.sa_state_dict import CENTERS, PRECISION_FACTORS, rename_old_keys
from .checkpoint import RUN_CHECKPOINT, CheckpointError, read_checkpoint

__all__ = [
    'POSITIONAL_EPOCHS_FILE', 'positional_params', 'run_epochs', 'positional_trajectory', 'save_positional_trajectory',
    'load_positional_trajectory', 'models_at_epochs', 'epoch_label', 'record_epoch_positions', 'initial_positions',
    'weights_epochs', 'check_run_positions',
]

# per-epoch centres and precision factors of a model, kept beside its weights (Fig. 3 of the paper: how the heads moved)
POSITIONAL_EPOCHS_FILE = 'positional_epochs.safetensors'
_POSITIONAL_SUFFIXES = ('.' + CENTERS, '.' + PRECISION_FACTORS)


def positional_params(state_dict: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """The Gaussian centres and precision factors of a state dict (what moves the heads, paper Fig. 3)."""
    return {k: v.detach().float().cpu() for k, v in state_dict.items() if k.endswith(_POSITIONAL_SUFFIXES)}


def positional_trajectory(epochs: Dict[str, Dict[str, Tensor]]) -> Dict[str, Tensor]:
    """Per-epoch positional parameters stacked along a first axis, ``{key: (epochs, ...)}``."""
    labels = list(epochs)
    keys = list(positional_params(epochs[labels[0]]))
    return {key: torch.stack([epochs[label][key].float() for label in labels]) for key in keys}


def save_positional_trajectory(epochs: Dict[str, Dict[str, Tensor]], path) -> Path:
    """Write ``{label: state dict}`` as one small safetensors file of the centres and precision factors (labels in
    metadata)."""
    stacked = positional_trajectory({label: positional_params(sd) for label, sd in epochs.items()})
    if not stacked:
        raise UserError('these weights have no Gaussian centres or precision factors: only the quadratic and '
                        'generalized kinds have a trajectory to keep')
    with atomic_write(path) as tmp:
        save_file({k: v.contiguous() for k, v in stacked.items()}, str(tmp),
                  metadata={'epochs': json.dumps(list(epochs))})
    return Path(path)


def models_at_epochs(model: nn.Module, epochs: Dict[str, Dict[str, Tensor]]) -> List[nn.Module]:
    """Copies of ``model`` with each kept epoch's centres and precision factors (for the trajectory figure)."""
    copies = []
    for params in epochs.values():
        epoch_model = copy.deepcopy(model)
        epoch_model.load_state_dict(params, strict=False)  # only the positional parameters change
        copies.append(epoch_model)
    return copies


def load_positional_trajectory(path) -> Dict[str, Dict[str, Tensor]]:
    """The ``{label: positional state dict}`` written by :func:`save_positional_trajectory` (old key names renamed,
    :data:`~sa_vision.models.sa_state_dict.RENAMED_KEYS`)."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), 'pt') as f:
            labels = json.loads((f.metadata() or {}).get('epochs', '[]'))
        stacked = rename_old_keys(load_file(str(path)))
    except (SafetensorError, json.JSONDecodeError) as e:
        problem = f'it cannot be read ({e})'
    else:
        problem = _trajectory_problem(labels, stacked)
    if problem:  # an optional file, of a run, an exported folder or a Hub repository
        if _in_run_folder(Path(path)):
            raise CheckpointError(f'{path} is not a file of epochs as sa-vision-train --save-epoch-positions writes '
                                  f'it: {problem}. {_RUN_FILE_ADVICE.format(folder=Path(path).parent)}')
        raise CheckpointError(f'{path} is not a file of epochs as an export writes it: {problem}. The model does '
                              f'not need it: delete it, or export the run again')
    return {label: {k: v[i] for k, v in stacked.items()} for i, label in enumerate(labels)}


# what record_epoch_positions does without the file: it starts a new one at the epoch it adds (a resume's first)
_RUN_FILE_ADVICE = ('The run\'s checkpoints do not need it: move it out of {folder} (or delete it); resumed with '
                    '--save-epoch-positions, the run then keeps the centres and precision factors from the epoch it '
                    'resumes from on, without those of the epochs before')


def _in_run_folder(path: Path) -> bool:
    """Whether ``path`` is in the folder of a sa-vision-train run (which writes ``args.yaml`` first), not an
    exported one."""
    return (path.parent / RUN_CHECKPOINT).is_file() or (path.parent / 'args.yaml').is_file()


def check_run_positions(run_dir: Path, model: nn.Module) -> None:
    """Read the :data:`POSITIONAL_EPOCHS_FILE` of the run resumed in ``run_dir``, where it has one, and match its
    epochs with ``model``'s centres and precision factors, before an epoch trains: each epoch's end adds to the file
    before writing its checkpoint, so a file it cannot add to would fail only then, and lose that epoch."""
    path = run_dir / POSITIONAL_EPOCHS_FILE
    if not path.is_file():
        return
    shapes = {key: tuple(value.shape) for key, value in positional_params(model.state_dict()).items()}
    for label, params in load_positional_trajectory(path).items():
        kept = {key: tuple(value.shape) for key, value in params.items()}
        odd = sorted(set(kept) ^ set(shapes)) or [key for key in sorted(shapes) if kept[key] != shapes[key]]
        if odd:
            key = odd[0]
            raise CheckpointError(f'{path} does not fit the model of its run: {key} is {_shape(kept, key)} in its '
                                  f'{label}, {_shape(shapes, key)} in the model. '
                                  f'{_RUN_FILE_ADVICE.format(folder=run_dir)}')


def _shape(shapes: Dict[str, Tuple[int, ...]], key: str) -> str:
    return f'of shape {shapes[key]}' if key in shapes else 'missing'


def _trajectory_problem(labels: Any, stacked: Dict[str, Tensor]) -> Optional[str]:
    """What is wrong with the epoch labels and stacked tensors of a positional epochs file, if anything."""
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        return f'its "epochs" metadata must be a list of names, got {labels!r:.60}'
    if len(set(labels)) != len(labels):
        return f'its "epochs" name an epoch twice ({labels!r:.60})'
    odd = next((k for k, v in stacked.items() if v.dim() == 0 or v.shape[0] != len(labels)), None)
    if odd:
        stacks = stacked[odd].shape[0] if stacked[odd].dim() else 'no'
        return f'{odd} stacks {stacks} epochs, its metadata names {len(labels)}'
    return None


def epoch_label(epochs_done: int) -> str:
    """The name of what a run keeps after ``epochs_done`` epochs (``epoch-000``: the initialisation): the stem of its
    ``epoch-NNN.safetensors`` and its entry in :data:`POSITIONAL_EPOCHS_FILE`."""
    return f'epoch-{epochs_done:03d}'


def record_epoch_positions(model: nn.Module, run_dir: Path, epochs_done: int) -> None:
    """Add ``model``'s centres and precision factors after ``epochs_done`` epochs to the run's
    :data:`POSITIONAL_EPOCHS_FILE` (``--save-epoch-positions``), in place of what it held of that epoch and later:
    a run resumed from an earlier checkpoint trains those again. A few KiB an epoch, where the whole weights of
    ``--save-epoch-weights`` take 48 MB an epoch at the paper's size."""
    path = run_dir / POSITIONAL_EPOCHS_FILE
    kept = load_positional_trajectory(path) if path.is_file() else {}
    epochs = {label: params for label, params in kept.items() if _epoch_order(label) < (epochs_done, '')}
    epochs[epoch_label(epochs_done)] = positional_params(model.state_dict())
    save_positional_trajectory(epochs, path)


def run_epochs(folder: Path, done: Optional[int] = None) -> Dict[str, Dict[str, Tensor]]:
    """The centres and precision factors a run kept after every epoch (``epoch-000`` is the initialisation), in the
    epochs' order: its :data:`POSITIONAL_EPOCHS_FILE` (``--save-epoch-positions``) and the positional part of its
    ``epoch-NNN.safetensors`` (``--save-epoch-weights``); none after ``done`` epochs, by default its
    ``last.pth.tar``'s (they are written before it: a run stopped between them, or running, holds one more)."""
    epochs = {path.stem: positional_params(read_checkpoint(path).state_dict)
              for path in folder.glob('epoch-*.safetensors')}
    if (folder / POSITIONAL_EPOCHS_FILE).is_file():
        epochs.update(load_positional_trajectory(folder / POSITIONAL_EPOCHS_FILE))
    if done is None and (folder / RUN_CHECKPOINT).is_file():
        done = read_checkpoint(folder / RUN_CHECKPOINT).meta['epoch']
    return {label: epochs[label] for label in sorted(epochs, key=_epoch_order)
            if done is None or _epoch_order(label) <= (done, '')}


def weights_epochs(ckpt) -> Dict[str, Dict[str, Tensor]]:
    """What the run that saved the checkpoint ``ckpt`` (a :class:`~sa_vision.train.checkpoint.Checkpoint`) kept of
    its epochs up to the weights' own, where the file is in its run folder; a Hub folder's
    :data:`POSITIONAL_EPOCHS_FILE` (an export keeps them up to its weights' epoch); else none."""
    path = Path(ckpt.source)
    folder = path if path.is_dir() else path.parent
    if ckpt.format == 'hub_folder' or (folder / 'config.json').is_file():  # an export (or its model.safetensors)
        kept = folder / POSITIONAL_EPOCHS_FILE
        return load_positional_trajectory(kept) if kept.is_file() else {}
    kept_epoch = re.fullmatch(r'epoch-(\d+)', path.stem)  # a run's --save-epoch-weights file: its name's epoch
    if ckpt.format == 'safetensors' and kept_epoch and (folder / RUN_CHECKPOINT).is_file():
        return run_epochs(folder, int(kept_epoch.group(1)))
    if ckpt.format != 'sa_vision' or not (folder / RUN_CHECKPOINT).is_file():
        return {}
    return run_epochs(folder, ckpt.meta.get('epoch'))


def initial_positions(folder: Path) -> Optional[Dict[str, Tensor]]:
    """The centres and precision factors a run started from (``epoch-000``); None where it kept none."""
    first = epoch_label(0)
    if (folder / POSITIONAL_EPOCHS_FILE).is_file():
        initial = load_positional_trajectory(folder / POSITIONAL_EPOCHS_FILE).get(first)
        if initial is not None:
            return initial
    path = folder / f'{first}.safetensors'
    return positional_params(read_checkpoint(path).state_dict) if path.is_file() else None


def _epoch_order(label: str) -> Tuple[int, str]:
    """By the number of epochs done, not by name: the run pads it to three digits, so epoch-1000 comes after
    epoch-999 (a name that is no number comes last)."""
    done = label[len('epoch-'):]
    return (int(done), '') if done.isascii() and done.isdigit() else (sys.maxsize, done)  # not '²'
