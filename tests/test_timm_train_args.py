""" TIMM_ONLY_RECIPE_KEYS against the argument parser of timm's own train.py

``sa_vision.train.run_timm`` runs a top-level script of a timm checkout by its path (README: ``python -m
sa_vision.train.run_timm $TIMM/train.py ...``); pip's timm wheel and sdist ship no train.py. The script checked is
``$SA_VISION_TIMM_CHECKOUT/train.py``, else the train.py beside the installed timm package (a checkout installed with
``pip install -e``); without either the test is skipped and says so. Its ``add_argument`` calls are read with ``ast``
rather than imported: importing train.py runs its module code and imports (wandb, apex, ...), and a checkout of
another timm version need not import against the installed one.
"""
import argparse
import ast
import os
from pathlib import Path
from typing import Optional, Set

import pytest
import timm

from sa_vision.train.args import build_parser
from sa_vision.train.recipes import TIMM_ONLY_RECIPE_KEYS


def argparse_dests(source: str) -> Set[str]:
    """The ``dest`` of every ``add_argument`` call in ``source``, derived as argparse derives it: ``dest=`` if given,
    else the first long option (``--batch-size`` -> ``batch_size``), else the first short one, else the name of a
    positional argument."""
    dests = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == 'add_argument'):
            continue
        explicit = [k.value.value for k in node.keywords if k.arg == 'dest' and isinstance(k.value, ast.Constant)]
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if explicit:
            dests.add(explicit[0])
        elif names and not names[0].startswith('-'):
            dests.add(names[0])
        elif names:
            option = next((n for n in names if n.startswith('--')), names[0])
            dests.add(option.lstrip('-').replace('-', '_'))
    return dests


def timm_train_script() -> Optional[Path]:
    """timm's train.py: in ``$SA_VISION_TIMM_CHECKOUT``, else beside the installed timm package, else None."""
    configured = os.environ.get('SA_VISION_TIMM_CHECKOUT')
    folder = Path(configured) if configured else Path(timm.__file__).resolve().parent.parent
    script = folder / 'train.py'
    return script if script.is_file() else None


def test_argparse_dests_are_the_ones_argparse_derives():
    source = '\n'.join([
        'parser = argparse.ArgumentParser(add_help=False)',
        'group = parser.add_argument_group("g")',
        "parser.add_argument('data', nargs='?', metavar='DIR')",
        "group.add_argument('--data-dir', metavar='DIR')",
        "group.add_argument('-b', '--batch-size', type=int, default=128)",
        "group.add_argument('--decay-rate', '--dr', type=float)",
        "group.add_argument('--torchscript', dest='torchscript', action='store_true')",
        "group.add_argument('--no-prefetcher', action='store_true')",
        "group.add_argument('--local_rank', default=0, type=int)",
        "group.add_argument('-j', type=int)",
        "scripting = group.add_mutually_exclusive_group()",
        "scripting.add_argument('--torchcompile', nargs='?', const='inductor')",
        "group.add_argument('--pin-mem', action=argparse.BooleanOptionalAction, dest='pin_memory')",
    ])
    namespace = {'argparse': argparse}
    exec(source, namespace)  # the reference: argparse's own dests for the same calls
    assert argparse_dests(source) == {a.dest for a in namespace['parser']._actions}


def test_timm_only_recipe_keys_are_arguments_of_timms_train_py():
    script = timm_train_script()
    if script is None:
        pytest.skip(f'no timm train.py to check TIMM_ONLY_RECIPE_KEYS against: the installed timm '
                    f'{timm.__version__} ({Path(timm.__file__).parent}) has none beside it (pip ships no train.py); '
                    f'set SA_VISION_TIMM_CHECKOUT to a pytorch-image-models checkout of that version')
    dests = argparse_dests(script.read_text(encoding='utf-8'))
    assert {'model', 'sched', 'epochs'} <= dests, f'{script} does not look like timm\'s train.py'
    assert not TIMM_ONLY_RECIPE_KEYS - dests, (
        f'TIMM_ONLY_RECIPE_KEYS names keys that {script} has no argument for: '
        f'{sorted(TIMM_ONLY_RECIPE_KEYS - dests)}')
    # minimal: nothing that sa-vision-train reads itself (those are its own arguments, not timm-only ones)
    assert not TIMM_ONLY_RECIPE_KEYS & {a.dest for a in build_parser()._actions}
