""" What a reproduction folder records of how its results were made, checked before a result is skipped or continued

A folder holds one reproduction (``reproduction.json``: profile, dataset, epochs, the training arguments that the
``sa-vision-train`` arguments added to every stage set, without the runtime ones: a killed reproduction continues on
another device or with other workers); a run folder holds the training arguments it was started with (its
checkpoint's ``args``, as ``args.yaml``), which must be those of the stage that would skip or continue it;
``pruning.json`` holds the SHA-256 of the weights it pruned, so that pruned weights and their fine-tuning are made
again when their source changes.
"""
import hashlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

import yaml

from ..hub import HUB_FOLDER_FILES
from ..io import atomic_write_text, plain_data, remove_stale_temporaries
from ..train.checkpoint import RUN_CHECKPOINT, Checkpoint, strip_runtime_args
from .profiles import ReproductionError

__all__ = ['SETUP_FILE', 'LOCK_FILE', 'training_overrides', 'check_setup', 'reproduction_lock', 'write_setup',
           'stage_arguments', 'check_run_arguments', 'weights_sha256']

SETUP_FILE = 'reproduction.json'
LOCK_FILE = '.reproduction.lock'
# the files that mark sa-vision-train's run folder and a Hub folder (a README alone marks neither): no --out
_OTHER_FOLDERS_FILES = frozenset({'args.yaml', RUN_CHECKPOINT, *(f for f in HUB_FOLDER_FILES if f != 'README.md')})
_UNSET = object()


def training_overrides(argv: Sequence[str]) -> Dict[str, Any]:
    """The training arguments that the ``sa-vision-train`` command line ``argv`` sets, by name, without the runtime
    ones (:data:`~sa_vision.train.args.RUNTIME_ARGS`: the device, workers, compilation, files)."""
    from ..train.args import argument_names, build_parser
    parsed = vars(build_parser({name: _UNSET for name in argument_names()}).parse_args(list(argv)))
    return plain_data(strip_runtime_args({k: v for k, v in sorted(parsed.items()) if v is not _UNSET}))


def _as_options(setup: Dict[str, Any]) -> str:
    """A setup as the options of sa-vision-reproduce that make it."""
    options = f'--profile {setup.get("profile")} --dataset {setup.get("dataset")}'
    if setup.get('epochs') is not None:
        options += f' --epochs {setup["epochs"]}'
    if setup.get('train_args'):
        options += ' --train-args setting ' + ', '.join(f'{k}={v!r}' for k, v in setup['train_args'].items())
    return options


def check_setup(out: Path, setup: Dict[str, Any]) -> bool:
    """A :class:`ReproductionError` where ``out`` holds a reproduction of another ``setup``; whether the setup is
    still to be written (a new folder, or one written before ``train_args`` were recorded: its runs' own arguments
    are checked stage by stage)."""
    path = Path(out) / SETUP_FILE
    if not path.is_file():
        # a run of sa-vision-train, a Hub folder or a kept zoo of them: the reproduction's files would mix with theirs
        # (a folder of runs/ alone is one written before reproduction.json: its runs are checked stage by stage)
        marks = sorted({p.name for p in Path(out).glob('*') if p.name in _OTHER_FOLDERS_FILES} |
                       {f'{p.parent.name}/{p.name}' for p in Path(out).glob('*/config.json')})
        if marks:
            raise ReproductionError(f'{out} is no reproduction\'s folder but holds {", ".join(marks[:4])}: a '
                                    f'reproduction would write its runs and Hub folders among them; give --out a new '
                                    f'folder')
        return True
    saved = json.loads(path.read_text(encoding='utf-8'))
    if isinstance(saved.get('train_args'), list):  # written as the command line by an older sa_vision
        saved['train_args'] = training_overrides(saved['train_args'])
    differ = [key for key in setup if key in saved and saved[key] != setup[key]]
    if differ:
        raise ReproductionError(
            f'{out} holds a reproduction made with {_as_options(saved)}, not {_as_options(setup)} (it differs in '
            f'{", ".join(differ)}). Continue it with its own options, or give these another --out')
    return saved != setup


@contextmanager
def reproduction_lock(out: Path) -> Iterator[None]:
    """Held while a reproduction runs in ``out``: a second one in the same folder would train into the same run
    folders, and remove one that has no checkpoint yet. A ReproductionError where another holds it. Advisory, Linux and
    macOS (fcntl); elsewhere (Windows) nothing is held, as no run folder is (``sa_vision.train.run_folder``)."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    out = Path(out)
    new, lock_is_new = not out.exists(), not (out / LOCK_FILE).exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with open(out / LOCK_FILE, 'a', encoding='utf-8') as lock:
            try:
                if fcntl is not None:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ReproductionError(f'another sa-vision-reproduce is running in {out}: let it finish or stop '
                                        f'it, then run this command again (it continues where that one stopped)'
                                        ) from None
            for folder in (out, out / 'figures'):  # held now: a killed reproduction's half-written files go
                removed = remove_stale_temporaries(folder, held=True) if folder.is_dir() else []
                if removed:
                    print(f'removed {", ".join(removed)} from {folder}: files a reproduction killed while writing '
                          f'them left behind', file=sys.stderr)
            yield  # the lock goes with the file's closing, also when the process is killed
    finally:
        if lock_is_new and not (out / SETUP_FILE).exists():  # refused before anything was written
            (out / LOCK_FILE).unlink(missing_ok=True)
            if new and not any(out.iterdir()):
                out.rmdir()


def write_setup(out: Path, setup: Dict[str, Any]) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(out) / SETUP_FILE, json.dumps(setup, indent=1))


def stage_arguments(recipe: Dict[str, Any], argv: Sequence[str]) -> Dict[str, Any]:
    """The training arguments a stage's ``sa-vision-train`` run saves (its ``args.yaml``, the runtime ones left
    out) for ``recipe`` with the command line ``argv`` after it; a :class:`~sa_vision.errors.RecipeError` for a value
    the training would refuse (``--epochs 0``), raised here before anything is written or started."""
    from ..train.arg_values import check_scheduler, check_value_bounds
    from ..train.args import argument_names, parse_over
    from ..train.run_setup import num_classes_of_folder
    from ..train.state import args_as_saved, resolve_model_args
    known = argument_names()
    args = parse_over({k: v for k, v in recipe.items() if k in known}, list(argv))
    check_value_bounds(args)
    check_scheduler(args.sched, args.sched_on_updates, args.val_interval, args.warmup_epochs)
    if args.data_dir or os.path.isdir(args.dataset or ''):  # the setup's check names no folder: the stages do
        num_classes_of_folder(args, recipe, lambda _: None)  # an image folder's classes, as the training counts them
    resolve_model_args(args, recipe, None, lambda _: None)  # model_kwargs as saved: the flags', the weights'
    expected = strip_runtime_args(args_as_saved(args))
    if getattr(args, 'label_names', None):  # an image folder's classes by name: renamed ones are other classes
        expected[_FOLDER_CLASSES] = list(args.label_names)
    return expected


# the one resolved argument a stage's run is compared by: the class folders' names, which its label order is of
_FOLDER_CLASSES = 'label_names'


def _differences(saved: Dict[str, Any], expected: Dict[str, Any]) -> List[str]:
    """``key: <run's> in the run, <stage's> here`` for every training argument that differs (model_kwargs by key)."""
    from ..train.timm_args import model_kwargs_as_timm_args

    def flat(args):  # args.yaml and checkpoints of either version: the flags' keywords are the flags'
        args = model_kwargs_as_timm_args(args)
        kwargs = args.get('model_kwargs') or {}
        return {**{k: v for k, v in args.items() if k != 'model_kwargs'},
                **{f'model_kwargs.{k}': v for k, v in kwargs.items()}}
    saved, expected = flat(saved), flat(expected)
    return [f'{key}: {saved.get(key)!r} in the run, {expected.get(key)!r} here'
            for key in sorted(set(saved) | set(expected)) if saved.get(key) != expected.get(key)]


def check_run_arguments(run_dir: Path, ckpt: Checkpoint, expected: Dict[str, Any]) -> None:
    """A :class:`ReproductionError` unless the run in ``run_dir`` (``ckpt``, its last checkpoint) was started with
    the ``expected`` training arguments (:func:`stage_arguments`): a run of another recipe is never skipped as
    finished nor continued."""
    saved = ckpt.meta.get('args')
    if not saved and (run_dir / 'args.yaml').is_file():
        saved = yaml.safe_load((run_dir / 'args.yaml').read_text(encoding='utf-8'))
    what_to_do = (f'Remove {run_dir} to train it with this stage\'s arguments, or continue the reproduction it '
                  f'came from with that one\'s options')
    if not saved:
        raise ReproductionError(f'{run_dir} holds a run without its training arguments (no args.yaml): it cannot '
                                f'be told from another recipe\'s. {what_to_do}')
    kept = {}
    if _FOLDER_CLASSES in expected:  # an earlier version's run recorded them sorted plainly, or not at all
        from ..train.data import timm_label_order
        names = saved.get(_FOLDER_CLASSES)
        kept = {_FOLDER_CLASSES: timm_label_order(names) if names else expected[_FOLDER_CLASSES]}
    differences = _differences({**strip_runtime_args(saved), **kept}, expected)
    if differences:
        # the same options on an image folder whose classes changed since (a folder added, or renamed)
        folder = _FOLDER_CLASSES in expected and any(d.startswith(('num_classes:', f'{_FOLDER_CLASSES}:'))
                                                     for d in differences)
        raise ReproductionError(f'{run_dir} holds a run of other training arguments than this stage\'s '
                                f'({"; ".join(differences)}), so it is neither skipped nor continued. '
                                + (f'The class folders of {saved.get("data_dir") or "the image folder"} are not '
                                   f'those the run trained on: restore them, or remove {run_dir} to train it on '
                                   f'these' if folder else what_to_do))


def weights_sha256(state_dict: Dict[str, Any]) -> str:
    """SHA-256 of a state dict's tensors (names, dtypes, shapes and bytes, in name order): the same weights give
    the same digest in a run's checkpoint or a Hub folder, whatever else the file holds."""
    import torch
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f'{name}:{tensor.dtype}:{tuple(tensor.shape)};'.encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
