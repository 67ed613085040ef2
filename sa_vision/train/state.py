""" A run's state: its arguments (recipe, resumed run, command line), its model's arguments and initial weights,
and what ``--resume`` restores from the files it writes every epoch (:mod:`.epoch_files`) """
import argparse
import math
import shlex
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch.nn as nn
import yaml
from timm.scheduler import PlateauLRScheduler

from ..errors import RecipeError, UserError, first_launched_process
from ..io import plain_data
from ..models import infer_sa_model_args
from ..models.factory import StoredArgsSource
from .arg_values import FLAG_KWARGS
from .args import PROCESS_ARGS, RESOLVED_ARGS, argument_names, build_config_parser, parse_over
from .checkpoint import (
    HF_HUB_PREFIX,
    LOCAL_DIR_PREFIX,
    Checkpoint,
    CheckpointError,
    read_checkpoint,
    strip_runtime_args,
    weights_path,
)
from .data import timm_label_order
from .recipes import check_recipe_keys, check_recipe_lr, check_recipe_start, ignored_keys_notes, load_recipe
from .timm_args import model_kwargs_as_timm_args, timm_args_as_model_kwargs
from .weights_files import weights_misfit

__all__ = ['parse_run_args', 'args_as_saved', 'run_recipe', 'recipe_of_saved_args',
           'resolve_model_args', 'load_initial_weights', 'restore']

Log = Callable[[str], None]


def parse_run_args(argv=None) -> Tuple[argparse.Namespace, dict, Optional[Checkpoint]]:
    """(args, recipe, resume checkpoint or None) of a command line: the parser's defaults, then the recipe's, then
    with ``--resume`` the run's own, then the command line (its changes to a resumed run in ``args.resume_changes``)."""
    config, remaining = build_config_parser().parse_known_args(argv)
    known = argument_names()
    recipe = {}
    if config.config:
        recipe = load_recipe(config.config)
        if RESOLVED_ARGS & set(recipe):  # what a run decided: a run's args.yaml
            recipe = recipe_of_saved_args(recipe)
            if first_launched_process():
                print(f'note: {config.config} is a run\'s args.yaml: it is read as the recipe.yaml beside it, '
                      f'without where and how that run ran (output, experiment, data_dir, device, ...)',
                      file=sys.stderr)
        modules = recipe.get('device_modules') or []
        new = [str(m) for m in (modules if isinstance(modules, list) else [modules]) if str(m) not in sys.modules]
        if new:  # importing runs a module's code, and a recipe may come from anywhere (sa_vision itself is harmless)
            raise RecipeError(f'recipe {config.config} names device_modules {new}, which sa-vision-train imports '
                              f'only from the command line, since an import runs the module\'s code: remove them '
                              f'from the recipe, and pass --device-modules {" ".join(new)} if you trust them')
        recipe = timm_args_as_model_kwargs(recipe, known)
        ignored = check_recipe_keys(recipe, known, source=f'recipe {config.config}')
        for note in ignored_keys_notes(recipe, ignored, f'recipe {config.config}'):
            if first_launched_process():  # once per run under torchrun
                print(note, file=sys.stderr)
    defaults = {k: v for k, v in recipe.items() if k in known}
    resume_ckpt, run_args = None, {}
    resume = _resume_path(remaining)
    if resume:
        resume_ckpt = read_checkpoint(resume)
        if resume_ckpt.format != 'sa_vision' or 'optimizer' not in resume_ckpt.meta:
            raise CheckpointError(f'{resume} is a {resume_ckpt.format} checkpoint without the run state of '
                                  f'sa-vision-train; --resume continues runs of this script. To start from its '
                                  f'weights use --initial-checkpoint')
        run_args = {k: v for k, v in _saved_run_args(resume_ckpt, resume).items()
                    if k in known and k not in PROCESS_ARGS}
        defaults.update(run_args)
    given_by = [f'recipe {config.config}'] * bool(config.config) + [f'the run resumed, {resume}'] * bool(resume)
    args = parse_over(defaults, remaining, source=' or '.join(given_by) or 'the defaults', resumed=bool(resume))
    args.config = config.config
    check_recipe_start(recipe, args, config.config)
    check_recipe_lr(recipe, args, f'recipe {config.config}')
    args.model_given = None if resume else _model_of_weights_name(args)
    args.label_names = _run_label_names(resume_ckpt) if resume else None  # an image folder's classes
    # what the run had as defaults comes back unchanged: a difference was given on the command line
    args.resume_changes = {k: (v, plain_data(getattr(args, k))) for k, v in sorted(run_args.items())
                           if k != 'model_kwargs' and plain_data(getattr(args, k)) != v}
    return args, recipe, resume_ckpt


def _run_label_names(ckpt: Checkpoint) -> Optional[List[str]]:
    """A run's image folder classes, in timm's label order (an earlier version's run recorded them otherwise)."""
    names = (ckpt.meta.get('args') or {}).get('label_names')
    return timm_label_order(names) if names else None


def _model_of_weights_name(args) -> Optional[str]:
    """``--model local-dir:<folder>``, as timm's train.py takes it, made the folder's architecture with the arguments
    of its config.json, and with ``--pretrained`` its weights, which ``--initial-checkpoint <folder>`` loads: the
    run's checkpoints and export then name an architecture that rebuilds the model, not a folder. Returns the name
    given (None for a model name). ``--initial-checkpoint local-dir:<folder>`` is the folder; ``hf-hub:`` names are
    refused for either, with how to download them."""
    initial = str(args.initial_checkpoint or '')
    for option, name, instead in (('--model', args.model, '--model local-dir:DIR --pretrained'),
                                  ('--initial-checkpoint', initial, '--initial-checkpoint DIR')):
        if name.startswith(HF_HUB_PREFIX):
            raise UserError(f'{option} {name}: sa-vision-train starts from downloaded weights: download the '
                            f'repository (hf download {name[len(HF_HUB_PREFIX):]} --local-dir DIR) and pass {instead}')
    if initial.startswith(LOCAL_DIR_PREFIX):  # timm's name of a Hub folder, which --initial-checkpoint reads as such
        args.initial_checkpoint = str(weights_path(initial))
    folder = weights_path(args.model) if args.model.startswith(LOCAL_DIR_PREFIX) else None
    if folder is None:
        return None
    if args.pretrained and args.initial_checkpoint:
        raise UserError(f'--model {args.model} --pretrained and --initial-checkpoint {args.initial_checkpoint} '
                        f'both give the weights to start from: pass one')
    given, stored = args.model, read_checkpoint(folder)
    args.model = stored.arch
    if args.pretrained:  # loaded and checked against the model as --initial-checkpoint weights are
        args.pretrained, args.initial_checkpoint = False, str(folder)
    else:
        args.model_kwargs = {**stored.model_args, **(args.model_kwargs or {})}
    return given


def _resume_path(argv) -> str:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--resume', default='')
    return parser.parse_known_args(argv)[0].resume


def _saved_run_args(ckpt: Checkpoint, path) -> dict:
    """The arguments a run was started with: its checkpoint's, else the ``args.yaml`` beside it."""
    saved = ckpt.meta.get('args')
    if not saved:
        args_file = Path(path).resolve().parent / 'args.yaml'
        if not args_file.is_file():
            raise CheckpointError(f'{path} holds no training arguments and there is no args.yaml beside it: '
                                  f'--resume cannot tell how the run was configured')
        with open(args_file, encoding='utf-8') as f:
            saved = yaml.safe_load(f) or {}
    return {k: v for k, v in saved.items() if k not in RESOLVED_ARGS}


def args_as_saved(args) -> dict:
    """The training arguments as saved in ``args.yaml`` and in the checkpoint's ``'args'``: plain YAML /
    ``weights_only``-safe values."""
    return plain_data(dict(sorted(vars(args).items())))


def run_recipe(args) -> dict:
    """The run's recipe.yaml: the training arguments as asked (``amp: auto`` stays 'auto'), and the weights a
    fine-tune started from (without them ``-c recipe.yaml`` would train from scratch)."""
    return recipe_of_saved_args(args_as_saved(args))


def recipe_of_saved_args(saved: dict) -> dict:
    """:func:`run_recipe` of a run's saved arguments (its ``args.yaml``, which ``-c`` also reads as a recipe)."""
    recipe = model_kwargs_as_timm_args(strip_runtime_args(saved))
    if saved.get('initial_checkpoint'):
        recipe['initial_checkpoint'] = str(saved['initial_checkpoint'])
    return recipe


def resolve_model_args(args, recipe: dict, resume_ckpt: Optional[Checkpoint],
                       log: Log) -> Tuple[Optional[Checkpoint], Dict[str, str]]:
    """Set ``args.model_kwargs`` to everything ``create_model`` gets (saved in checkpoints and the recipe); returns
    the ``--initial-checkpoint`` to load, if any, and where each keyword came from (the run's ``recipe``, the
    command line, the weights), for the errors that name it. A resumed run keeps its model and optimizer groups."""
    if resume_ckpt is None:
        if getattr(args, 'model_given', None):  # parse_run_args's (the reproduction's stages parse their own)
            log(f'--model {args.model_given}: {args.model} ' + (
                f'from its weights, as --initial-checkpoint {args.initial_checkpoint} loads them'
                if args.initial_checkpoint else 'with the arguments of its config.json, weights initialised anew '
                                                '(--pretrained starts from its weights)'))
        # a timm --model-ema checkpoint's EMA, which timm's train.py --initial-checkpoint starts from
        initial = (read_checkpoint(args.initial_checkpoint, arch=args.model, use_ema=None)
                   if args.initial_checkpoint else None)
        model_kwargs = dict(initial.model_args) if initial else {}  # e.g. the heads a pruning kept
        sources = {key: StoredArgsSource(initial.source) for key in model_kwargs}
        recipe_kwargs = recipe.get('model_kwargs') or {}
        for key, value in args.model_kwargs.items():
            from_recipe = key in recipe_kwargs and recipe_kwargs[key] == value
            sources[key] = f'the model_kwargs of recipe {args.config}' if from_recipe else '--model-kwargs'
        model_kwargs.update(args.model_kwargs)
        for key, name, flag in FLAG_KWARGS:
            if getattr(args, name) is not None:
                model_kwargs[key], sources[key] = getattr(args, name), flag
        args.model_kwargs = model_kwargs
        return initial, sources
    changes = {k: change for k, change in args.resume_changes.items() if k != 'model'}  # ignored: said below
    if changes:
        log('resuming with changed arguments: ' + ', '.join(
            f'{k} {old!r} -> {new!r}' for k, (old, new) in changes.items()))
    if args.config:
        log(f'resuming: the run\'s own arguments take precedence over -c {args.config}')
    if resume_ckpt.arch != args.model:
        log(f'resuming {resume_ckpt.arch} from {args.resume} (ignoring --model {args.model})')
    given = {k: v for k, v in plain_data(args.model_kwargs).items() if resume_ckpt.model_args.get(k) != v}
    if given:
        log(f'resuming {resume_ckpt.arch} as the run built it (ignoring --model-kwargs '
            f'{" ".join(f"{k}={v}" for k, v in given.items())})')
    args.model = resume_ckpt.arch
    args.model_kwargs = dict(resume_ckpt.model_args)
    # the positional groups and their lr_scale are in the saved optimizer state
    saved_scale = (resume_ckpt.meta.get('args') or {}).get('pos_lr_scale', 1.0)
    if saved_scale != args.pos_lr_scale:
        log(f'resuming with the run\'s --pos-lr-scale {saved_scale} (ignoring {args.pos_lr_scale})')
    args.pos_lr_scale = saved_scale
    return None, {key: StoredArgsSource(resume_ckpt.source) for key in args.model_kwargs}


def _changed_architecture(initial: Checkpoint, model_kwargs: dict, sources: Optional[Dict[str, str]]) -> str:
    """What to do about weights that do not fit: the model_kwargs the run gives that differ from those the weights
    were built with, by where they came from (a recipe's model_kwargs, the command line's --model-kwargs)."""
    given: Dict[str, list] = {}
    flags = {flag for _, _, flag in FLAG_KWARGS}  # --num-classes changes only the classifier, a drop rate no shape
    for key, value in model_kwargs.items():
        source = (sources or {}).get(key, '--model-kwargs')
        if isinstance(source, StoredArgsSource) or source in flags:  # the weights' own, or a flag's
            continue
        if key not in initial.model_args or initial.model_args[key] != value:
            given.setdefault(source, []).append(f'{key}={value!r}')
    if not given:
        return 'The file is of another architecture or configuration than --model'
    return '; '.join(
        f'{source[0].upper()}{source[1:]} ({", ".join(items)}) differ from the arguments the weights were built with: '
        + ('drop them' if source == '--model-kwargs' else _weights_own_kwargs(initial, items))
        for source, items in given.items())


def _weights_own_kwargs(initial: Checkpoint, items: List[str]) -> str:
    """The advice for a recipe's model_kwargs that differ from the weights': the command line's --model-kwargs,
    which update the recipe's, with the weights' own values."""
    built = {**(infer_sa_model_args(initial.state_dict) or {}), **initial.model_args}  # shapes, then the record
    own = [shlex.quote(f'{key}={built[key]!r}') for key in (item.split('=')[0] for item in items) if key in built]
    return (f'pass the weights\' own, --model-kwargs {" ".join(own)}, which update the recipe\'s, or '
            if own else '') + 'train without that recipe'


def load_initial_weights(model: nn.Module, initial: Checkpoint, args, log: Log,
                         sources: Optional[Dict[str, str]] = None) -> None:
    """Load ``--initial-checkpoint`` into ``model``; with another ``--num-classes``, all but the classifier, which
    keeps its initialisation (as timm does for pretrained weights). ``sources``: :func:`resolve_model_args`'s."""
    state_dict, model_kwargs = dict(initial.state_dict), args.model_kwargs
    stored_classes = initial.model_args.get('num_classes')
    classifier = (getattr(model, 'pretrained_cfg', None) or {}).get('classifier')
    new_classifier = []  # the model's classifier keys, where it is trained anew
    if stored_classes is not None and stored_classes != model_kwargs.get('num_classes', stored_classes) and classifier:
        dropped = [k for k in state_dict if k.startswith(classifier + '.')]
        for key in dropped:
            del state_dict[key]
        log(f'--num-classes {model_kwargs["num_classes"]}: {args.initial_checkpoint} was trained for '
            f'{stored_classes} classes; its classifier ({", ".join(dropped)}) is left out and trained from its '
            f'initialisation')
        new_classifier = [k for k in model.state_dict() if k.startswith(classifier + '.')]
    problem = weights_misfit(model, state_dict, new_classifier)
    if problem:
        raise CheckpointError(f'the weights of {args.initial_checkpoint} do not fit {args.model}'
                              f'{" beyond the classifier" if new_classifier else ""}: {problem}. '
                              f'{_changed_architecture(initial, model_kwargs, sources)}')
    model.load_state_dict(state_dict, strict=not new_classifier)
    ema = initial.meta.get('ema_key', 'state_dict_ema')  # timm train.py's, or another trainer's key
    log(f'Loaded {f"{ema}, its EMA weights," if initial.meta.get("ema_weights") else "the weights"} of '
        f'--initial-checkpoint {args.initial_checkpoint}' + (' but its classifier' if new_classifier else ''))


def restore(resume_ckpt: Checkpoint, model, optimizer, lr_scheduler, loss_scaler, updates_per_epoch: int,
            eval_metric: str):
    """Load a run's state for ``--resume``; returns (epochs done, updates done, history, best).

    The schedule is the one the arguments describe now, stepped to where the run stands, as timm's train.py
    resumes: loading the saved scheduler would bring back the run's old epoch count and learning rate, so that
    ``--epochs`` raised on a finished run would train on at the old schedule's end (LR ``min_lr``). Only the
    plateau scheduler keeps its saved state, its decisions depend on the metrics seen, unless ``eval_metric`` is
    another than the run's: its best value would be the old metric's. The updates done are the
    epochs done times ``updates_per_epoch``, as timm's train.py counts them: the saved count would put a run
    resumed with another batch size (or number of processes) elsewhere in its new schedule (at its end, LR 0)."""
    meta = resume_ckpt.meta
    num_updates = meta['epoch'] * updates_per_epoch
    model.load_state_dict(resume_ckpt.state_dict)
    saved = meta['optimizer']
    if len(saved['param_groups']) == len(optimizer.param_groups):  # else torch's error says so
        # the implementation is this machine's (--opt-fused): torch would take the saved groups' and place the
        # step counts by it
        saved = {**saved, 'param_groups': [{**group, **{k: now[k] for k in ('fused', 'foreach') if k in now}}
                                           for group, now in zip(saved['param_groups'], optimizer.param_groups)]}
    # this run's --lr, unscaled: timm's schedulers keep it in initial_lr and scale each step; none scaled it once
    fresh = [group['initial_lr'] if 'initial_lr' in group else group['lr'] / group.get('lr_scale', 1.0)
             for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    run_args, plateau = meta.get('args') or {}, isinstance(lr_scheduler, PlateauLRScheduler)
    if plateau and run_args.get('sched') == 'plateau' and run_args.get('eval_metric', eval_metric) == eval_metric:
        lr_scheduler.load_state_dict(meta['scheduler'])
    if lr_scheduler is None or plateau:  # no schedule sets each step's lr: the loaded one stays, unless changed
        changed = run_args.get('lr') is None or not math.isclose(run_args['lr'], fresh[0])
        if changed or run_args.get('sched') != ('plateau' if plateau else 'none'):
            for group, lr in zip(optimizer.param_groups, fresh):
                group['lr'] = lr * group.get('lr_scale', 1.0)
                if plateau:
                    group['initial_lr'] = lr
    else:
        # each is a no-op for a schedule not counted in its unit (epochs or updates)
        lr_scheduler.step(meta['epoch'])
        lr_scheduler.step_update(num_updates)
    if loss_scaler is not None and meta.get('loss_scaler'):
        loss_scaler.load_state_dict(meta['loss_scaler'])
    return meta['epoch'], num_updates, list(meta.get('history', [])), meta.get('best')
