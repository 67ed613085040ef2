""" Reading a weights file without trusting it: ``torch.load`` that unpickles no arbitrary object, safetensors and
the JSON stored beside weights, each failure a :class:`CheckpointError` that names the file and what to do; and
what keeps weights from fitting a model, in one line """
import argparse
import json
import re
import zipfile
from pathlib import Path
from typing import Any, Callable, Collection, Dict, List, Tuple

import torch
from torch import nn

from ..errors import UserError

__all__ = ['RUN_CHECKPOINT', 'BEST_CHECKPOINT', 'WEIGHT_SUFFIXES', 'CheckpointError', 'torch_load', 'read_json',
           'check_config_fields', 'read_safetensors', 'nonfinite_tensors', 'weights_misfit']

RUN_CHECKPOINT = 'last.pth.tar'  # what a run folder of sa-vision-train holds, kept current every epoch
BEST_CHECKPOINT = 'model_best.pth.tar'  # the epoch best by --eval-metric, named as timm's CheckpointSaver names it
WEIGHT_SUFFIXES = ('.pth', '.pt', '.bin', '.tar', '.ckpt', '.safetensors')  # weights_path reads, prune writes
# the object torch's weights_only unpickler refused ('Unsupported global: GLOBAL x.y' or 'unsupported GLOBAL x.y')
_BLOCKED_GLOBAL = re.compile(r'GLOBAL ([\w.]+)')
# what torch's weights_only unpickler says broke, in its message's 'WeightsUnpickler error: <reason>'
_UNPICKLER_ERROR = re.compile(r'WeightsUnpickler error:\s*(.+)')


class CheckpointError(UserError):
    """Weights that are missing, unreadable, incomplete, or do not fit the architecture they claim."""


def torch_load(path: Path, map_location) -> Any:
    """``torch.load(weights_only=True)`` that also allows ``argparse.Namespace`` (timm train.py's ``args``)."""
    _check_archive(path)  # first: changed pickle bytes read as a refused object, or as no checkpoint
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001  torch.load raises many kinds on a bad file: all become CheckpointError
        text = str(e)
        blocked = _BLOCKED_GLOBAL.search(text)
        if blocked or 'Unsupported global' in text:
            # torch's message advises weights_only=False, which would run whatever the pickle names: only the
            # blocked name is passed on
            what = f'the Python object {blocked.group(1)}' if blocked else 'a Python object'
            raise CheckpointError(
                f'{path} holds {what}, pickled, which sa_vision refuses to load: unpickling an object from a '
                f'file of unknown origin can run any code. Checkpoints of sa-vision-train and timm train.py, '
                f'state dicts and safetensors files load; re-save weights you trust as a state dict or '
                f'.safetensors') from None
        # any file torch cannot unpickle under weights_only is "Weights only load failed": the unpickler's own words
        # say what broke, without torch's advice to load it unsafely
        detail = _UNPICKLER_ERROR.search(text)
        reason = detail.group(1).strip() if detail else (text.strip().splitlines() or [''])[0]
        if path.stat().st_size == 0:
            raise CheckpointError(f'{path} is empty: a save or a copy of it was cut short (a full disk, a killed '
                                  f'copy). Use a checkpoint of a finished epoch (last.pth.tar) or retrain') from None
        if not _looks_saved_by_torch(path):
            raise CheckpointError(
                f'{path} is not a PyTorch checkpoint (torch.save writes a zip archive or a pickle; this file is '
                f'neither): pass a checkpoint (last.pth.tar, model_best.pth.tar, a state dict), a .safetensors '
                f'file, a run folder or a Hub folder (local-dir:<folder>)') from None
        raise CheckpointError(
            f'{path} cannot be read ({type(e).__name__}: {reason[:300]}): the file is corrupted or truncated, or '
            f'not a PyTorch checkpoint. Use a checkpoint of a finished epoch (last.pth.tar) or retrain') from None


def _check_archive(path: Path) -> None:
    """A CheckpointError where a part of torch's zip archive fails its CRC-32: torch reads changed bytes (a faulty
    disk or copy) as weights, which then score at chance without a word. One more read of the file. A part saved
    without a CRC (0: ``torch.serialization.set_crc32_options(False)``) is not checked, and an archive Python's
    reader cannot open is left to torch."""
    if not zipfile.is_zipfile(path):  # the legacy pickle format has no checksums
        return
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError):
        return
    with archive:
        for part in archive.infolist():
            if not part.CRC:
                continue
            try:
                with archive.open(part) as f:
                    while f.read(1 << 24):  # the CRC is compared at the end of the part
                        pass
            except (zipfile.BadZipFile, OSError, EOFError):
                raise CheckpointError(f'{path} is corrupted: its part {part.filename} does not match the checksum '
                                      f'torch.save wrote with it (a faulty disk or copy). Copy it again from where '
                                      f'it was saved, or use another checkpoint') from None


def _looks_saved_by_torch(path: Path) -> bool:
    """Whether ``path`` starts as a file of ``torch.save`` does: a zip archive (torch's format since 1.6), or a
    pickle of protocol 2 or later (the legacy format); a text file or a picture does not."""
    with open(path, 'rb') as f:
        head = f.read(4)
    return head.startswith(b'PK\x03\x04') or head[:1] == b'\x80'


def read_json(text: str, path: Path, what: str) -> Any:
    """``json.loads(text)``, or a CheckpointError naming the file, the part of it and where the JSON breaks."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f'{path}: {what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); '
                              f'the file was edited or cut short: fix it, or export / save it again') from None
    if what == 'config.json' and not isinstance(value, dict):
        raise CheckpointError(f'{path}: config.json must hold a JSON object, got {type(value).__name__}')
    return value


def _is_size(value: Any) -> bool:
    # (channels, height, width): larger images than 8192 pixels a side would not be a mistake timm could report
    return (isinstance(value, (list, tuple)) and len(value) == 3 and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 8192 for v in value))


def _is_numbers(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)


# the fields of a config.json (and of its pretrained_cfg) that sa_vision reads, as timm writes them
CONFIG_FIELDS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    'architecture': (lambda v: isinstance(v, str), 'a model name'),
    'model_args': (lambda v: isinstance(v, dict), 'an object of create_model keywords'),
    'pretrained_cfg': (lambda v: isinstance(v, dict), "an object of timm's pretrained_cfg keys"),
    'num_classes': (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, 'a whole number'),
    'label_names': (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v), 'a list of names'),
    'tag': (lambda v: isinstance(v, str), 'a name'),
    'input_size': (_is_size, 'three whole numbers [channels, height, width], each 1 to 8192'),
    'mean': (_is_numbers, 'a list of numbers'),
    'std': (lambda v: _is_numbers(v) and all(x > 0 for x in v), 'a list of positive numbers'),
}


def check_config_fields(fields: Dict[str, Any], path: Path, what: str) -> None:
    """The fields of ``fields`` (a config.json, or a ``pretrained_cfg`` in it or in a file's metadata) that
    sa_vision reads are of the types timm writes: another is a CheckpointError naming the file and the field, not
    a traceback far from them (or a 100 TB input)."""
    for key, (fits, wanted) in CONFIG_FIELDS.items():
        value = fields.get(key)
        if value is not None and not fits(value):
            raise CheckpointError(f'{path}: {what} "{key}" must be {wanted}, got {value!r:.80}; the file was edited '
                                  f'or written by another tool: fix it, or export the weights again')
    if isinstance(fields.get('pretrained_cfg'), dict):
        check_config_fields(fields['pretrained_cfg'], path, f'{what} pretrained_cfg')


def read_safetensors(path: Path):
    from safetensors import safe_open
    from safetensors.torch import load_file
    try:
        with safe_open(str(path), 'pt') as f:
            metadata = f.metadata() or {}
        return load_file(str(path)), metadata
    except Exception as e:  # noqa: BLE001  safetensors raises several kinds on a bad file
        raise CheckpointError(f'{path} is not a readable safetensors file ({type(e).__name__}: {e}); it is '
                              f'corrupted or truncated') from None


def nonfinite_tensors(state_dict: Dict[str, Any]) -> List[str]:
    """The names of the floating tensors of ``state_dict`` that hold NaN or inf (weights of a run that diverged)."""
    return [name for name, t in state_dict.items() if t.is_floating_point() and not t.isfinite().all()]


def weights_misfit(model: nn.Module, state_dict: Dict[str, Any], new_keys: Collection[str] = ()) -> str:
    """What keeps ``state_dict`` from loading into ``model`` ('' where nothing does): the first key of another shape
    (else the first missing, else the first unexpected) and how many keys are of each kind, in one line where torch's
    error lists every key; ``new_keys``: the model's keys the weights may lack (a classifier trained anew)."""
    own = model.state_dict()
    # in the model's order, as torch names them (a safetensors file's keys are sorted)
    shapes = [k for k in own if k in state_dict and tuple(getattr(state_dict[k], 'shape', ())) != own[k].shape]
    missing = [k for k in own if k not in state_dict and k not in new_keys]
    unexpected = [k for k in state_dict if k not in own]
    if shapes:
        key = shapes[0]
        first = (f'size mismatch for {key}: {list(state_dict[key].shape)} in the weights, {list(own[key].shape)} in '
                 f'the model')
    elif missing or unexpected:
        first = f'missing key {missing[0]}' if missing else f'unexpected key {unexpected[0]}'
    else:
        return ''
    return f'{first} ({len(shapes)} keys of another shape, {len(missing)} missing, {len(unexpected)} unexpected)'
