""" Training recipes: ``sa_vision/configs/<name>.yaml`` in the argument names of timm's ``train.py``

Read by both trainers with ``parser.set_defaults`` (the command line overrides them), the one place the paper's
hyper-parameters (App. A.4) are written down. Unknown keys are errors: a misspelt ``lr_rate`` must not pass. """
import argparse
import difflib
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Union

from ..errors import RecipeError, RecipeNotFoundError
from ..models._pretrained import training_commands
from ..paper import PRUNED_FROM
from .timm_args import OURS, TIMM_TRAIN_ARGS

__all__ = ['RECIPE_DIR', 'TIMM_ONLY_RECIPE_KEYS', 'recipe_path', 'load_recipe', 'recipe_if_any', 'check_recipe_keys',
           'repeat_run_args', 'check_recipe_start']

# keys that only timm's train.py reads: allowed, so one recipe serves both trainers, and ignored with a note
TIMM_ONLY_RECIPE_KEYS = frozenset(name for name, use in TIMM_TRAIN_ARGS.items() if use != OURS)

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
    with open(path) as f:
        recipe = yaml.safe_load(f) or {}
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
