""" Training recipes: ``sa_vision/configs/<name>.yaml`` in the argument names of timm's ``train.py``

Read by both trainers with ``parser.set_defaults`` (the command line overrides them), the one place the paper's
hyper-parameters (App. A.4) are written down. Unknown keys are errors: a misspelt ``lr_rate`` must not pass. """
import argparse
import difflib
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Union

from ..errors import RecipeError, RecipeNotFoundError
from ..models._pretrained import training_commands
from ..paper import PRUNED_FROM
from .timm_args import OURS, TIMM_TRAIN_ARGS, timm_only_techniques

__all__ = ['RECIPE_DIR', 'TIMM_ONLY_RECIPE_KEYS', 'recipe_path', 'load_recipe', 'recipe_if_any', 'recorded_arg',
           'check_recipe_keys', 'ignored_keys_notes', 'check_recipe_lr', 'repeat_run_args', 'check_recipe_start']

# keys that only timm's train.py reads: allowed, so one recipe serves both trainers, and ignored with a note
TIMM_ONLY_RECIPE_KEYS = frozenset(name for name, use in TIMM_TRAIN_ARGS.items() if use != OURS)
# ignored keys named one by one up to this many (a shipped recipe's few), else counted (a timm args.yaml's ~130)
_NAMED_KEYS = 12

# shipped inside the package (package data), so an installed sa_vision finds them
RECIPE_DIR = Path(__file__).resolve().parent.parent / 'configs'


def recipe_path(name: str) -> Path:
    """Path of the recipe ``name`` (a file path, or the name of a file in ``sa_vision/configs``)."""
    path = Path(name)
    if path.suffix in ('.yaml', '.yml') and path.exists():
        return path
    # a shipped recipe by its name, or by its file's name (-c sa_quadratic_cifar_digits.yaml)
    shipped = path.stem if path.suffix in ('.yaml', '.yml') and path.parent == Path('.') else name
    candidate = RECIPE_DIR / f'{shipped}.yaml'
    if candidate.exists():
        return candidate
    known = sorted(p.stem for p in RECIPE_DIR.glob('*.yaml')) if RECIPE_DIR.is_dir() else []
    raise RecipeNotFoundError(f'no recipe {name!r}: no such file, nor one of {known} in {RECIPE_DIR}')


def load_recipe(name: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Read a recipe into a dict of argument defaults (keys with '-' are accepted as '_')."""
    import yaml
    path = recipe_path(str(name))
    with open(path, encoding='utf-8') as f:
        try:
            recipe = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            where = getattr(e, 'problem_mark', None)
            raise RecipeError(f'recipe {path} is not valid YAML ({getattr(e, "problem", None) or e}'
                              + (f' at line {where.line + 1} column {where.column + 1}' if where else '')
                              + '): fix the file') from None
    if not isinstance(recipe, dict):
        raise RecipeError(f'recipe {path} must be a mapping of argument names to values, got {type(recipe).__name__}')
    return {k.replace('-', '_'): v for k, v in recipe.items()}


def recipe_if_any(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """The recipe in file ``path`` (an export's recipe.yaml), or {} where there is none or it does not read as a
    recipe: the weights beside it load without it."""
    import yaml
    if not Path(path).is_file():
        return {}
    try:
        return load_recipe(path)
    except (RecipeError, yaml.YAMLError):
        return {}


def recorded_arg(meta: Mapping[str, Any], name: str) -> Any:
    """The training argument ``name`` of the run that made weights, as their file records it (a checkpoint's
    ``meta``: a run's arguments, else an export's recipe), or None."""
    return (meta.get('args') or meta.get('recipe') or {}).get(name)


def check_recipe_keys(keys: Iterable[str], known: Iterable[str], source: str = 'the recipe') -> List[str]:
    """The keys that only timm's train.py reads (to be ignored with a note); any other unknown key raises a
    RecipeError naming the nearest known key."""
    known = set(known)
    unknown = sorted(k for k in keys if k not in known and k not in TIMM_ONLY_RECIPE_KEYS)
    if unknown:
        candidates = sorted(known | TIMM_ONLY_RECIPE_KEYS)
        parts = []
        for key in unknown:
            near = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
            parts.append(f'{key!r}' + (f' (did you mean {near[0]!r}?)' if near else ''))
        raise RecipeError(f'{source} has the unknown key(s) {", ".join(parts)}: neither sa-vision-train nor timm\'s '
                          f'train.py reads them. Fix or remove them (timm train.py\'s arguments are listed in '
                          f'sa_vision.train.timm_args.TIMM_TRAIN_ARGS)')
    return sorted(k for k in keys if k not in known)


def ignored_keys_notes(recipe: Dict[str, Any], ignored: List[str], source: str) -> List[str]:
    """What to say of the keys of ``recipe`` that only timm's train.py reads: a warning naming those that switch on
    a technique this run leaves out (a timm ``args.yaml``'s EMA, mixup, RandAugment, ...), then the rest, by name
    where they are few (a shipped recipe's), else counted (the ~130 arguments of a timm ``args.yaml``)."""
    techniques = timm_only_techniques({key: recipe[key] for key in ignored})
    notes = []
    if techniques:
        notes.append(f'warning: {source} turns on what only timm\'s train.py does, which this run leaves out: '
                     + ', '.join(f'{k}={v!r}' for k, v in techniques.items())
                     + '. Train with timm\'s train.py for them (docs/training.md), or set them off in the recipe')
    rest = [key for key in ignored if key not in techniques]
    if rest:
        named = f': {", ".join(rest)}' if len(rest) <= _NAMED_KEYS else ' (sa_vision.train.timm_args lists them)'
        notes.append(f'note: {len(rest)} {"other " * bool(techniques)}key(s) of {source} that only timm\'s '
                     f'train.py reads are ignored here{named}')
    return notes


def check_recipe_lr(recipe: Dict[str, Any], args: argparse.Namespace, source: str) -> None:
    """Refuse ``lr: null``, which a timm ``args.yaml`` holds where train.py was given no ``--lr``: train.py then
    derives the lr from ``lr_base`` and the batch size, which sa-vision-train does not; the error gives the lr that
    train.py would have used on one process."""
    if args.lr is not None:
        return
    base, base_size = recipe.get('lr_base', 0.1), recipe.get('lr_base_size', 256)
    scale = recipe.get('lr_base_scale') or ('sqrt' if any(o in args.opt.lower() for o in ('ada', 'lamb'))
                                            else 'linear')
    accumulated = recipe.get('grad_accum_steps') or 1  # timm's global batch counts the accumulated steps
    ratio = args.batch_size * accumulated / base_size
    lr = base * (ratio ** 0.5 if scale == 'sqrt' else ratio)
    raise RecipeError(f'--lr is null in {source}: timm\'s train.py then scales lr_base {base:g} by the global batch '
                      f'size over lr_base_size {base_size} ({scale}), which sa-vision-train does not. Pass the lr: '
                      f'--lr {lr:.4g} is what train.py used with -b {args.batch_size}'
                      + (f' and grad_accum_steps {accumulated}' if accumulated > 1 else '') + ' on one process')


def repeat_run_args(model: str, recipe_file: str) -> str:
    """The arguments that repeat a run from its recipe file: ``-c FILE``, with the pruned weights a pruned model
    fine-tuned (a recipe keeps no local paths, and :func:`check_recipe_start` refuses it without them)."""
    return f'-c {recipe_file}' + (' --initial-checkpoint PRUNED' if model in PRUNED_FROM else '')


def check_recipe_start(recipe: Dict[str, Any], args: argparse.Namespace, source: str) -> None:
    """Refuse the recipe of a pruned model without the weights it fine-tunes: the pruned model is a fine-tune of
    pruned weights (paper App. A.1), and its recipe alone would train it from a random initialisation."""
    model = recipe.get('model')
    if model not in PRUNED_FROM or args.model != model or args.initial_checkpoint or args.resume or args.pretrained:
        return
    raise RecipeError(
        f'recipe {source} fine-tunes pruned {model} weights, but no --initial-checkpoint names them: it would train '
        f'{model} from a random initialisation. Add --initial-checkpoint with the pruned weights (sa-vision-prune '
        f'of a trained {PRUNED_FROM[model]}). For CIFAR-10 from nothing: {training_commands(model)}. To train the '
        f'pruned architecture from scratch instead: -c {PRUNED_FROM[model]} --model {model}')
