""" Training recipes: ``sa_vision/configs/<name>.yaml`` in the argument names of timm's ``train.py``

A recipe is a flat YAML mapping whose keys are the ``dest`` names of timm's ``train.py`` arguments
(``batch_size``, ``weight_decay``, ``sched_on_updates``, ...). timm's ``train.py -c <recipe>`` and this
repository's ``scripts/train.py -c <recipe>`` both read them with ``parser.set_defaults(**recipe)``, so
arguments on the command line override the recipe. The recipe files are the single place the paper's
hyper-parameters (SPEC 6) are written down.

Layering (layers -> models -> tools -> scripts, checked by ``tests/test_structure.py``): a tool that imports no
sa_vision code.
"""
import os
from pathlib import Path
from typing import Any, Dict, Union

__all__ = ['RECIPE_DIR', 'recipe_path', 'load_recipe']

# shipped inside the package (package data), so an installed sa_vision finds them; scripts/configs links here
RECIPE_DIR = Path(__file__).resolve().parent / 'configs'


def recipe_path(name: str) -> Path:
    """Path of the recipe ``name`` (a file path, or the name of a file in ``sa_vision/configs``)."""
    path = Path(name)
    if path.suffix in ('.yaml', '.yml') and path.exists():
        return path
    candidate = RECIPE_DIR / f'{name}.yaml'
    if candidate.exists():
        return candidate
    known = sorted(p.stem for p in RECIPE_DIR.glob('*.yaml')) if RECIPE_DIR.is_dir() else []
    raise FileNotFoundError(f'no recipe {name!r}: not a YAML file and not one of {known} in {RECIPE_DIR}')


def load_recipe(name: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Read a recipe into a dict of argument defaults (keys with '-' are accepted as '_')."""
    import yaml
    path = recipe_path(str(name))
    with open(path) as f:
        recipe = yaml.safe_load(f) or {}
    if not isinstance(recipe, dict):
        raise ValueError(f'recipe {path} must be a mapping of argument names to values, got {type(recipe).__name__}')
    return {k.replace('-', '_'): v for k, v in recipe.items()}
