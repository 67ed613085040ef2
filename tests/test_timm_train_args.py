""" sa_vision.train.timm_args against timm: train.py's arguments and create_model keywords, timm's schedulers

``sa_vision.train.run_timm`` runs a top-level script of a timm checkout by its path (README: ``python -m
sa_vision.train.run_timm $TIMM/train.py ...``); pip's timm wheel and sdist ship no train.py. The script checked is
``$SA_VISION_TIMM_CHECKOUT/train.py``, else the train.py beside the installed timm package (a checkout installed with
``pip install -e``); without either the test is skipped and says so. Its ``add_argument`` calls are read with ``ast``
rather than imported: importing train.py runs its module code and imports (wandb, apex, ...), and a checkout of
another timm version need not import against the installed one.
"""
import argparse
import ast
import inspect
import operator
import os
import textwrap
from pathlib import Path
from typing import Dict, Optional, Set

import pytest
import timm
import torch
from timm.scheduler import create_scheduler_v2
from timm.utils import init_distributed_device

from sa_vision.train.args import build_parser
from sa_vision.train.recipes import TIMM_ONLY_RECIPE_KEYS
from sa_vision.train.timm_args import (
    OURS,
    TIMM_MODEL_KWARGS,
    TIMM_ONLY,
    TIMM_ONLY_TECHNIQUES,
    TIMM_PREPROCESSING,
    TIMM_SCHEDULERS,
    TIMM_SET_ARGS,
    TIMM_TRAIN_ARGS,
    TIMM_VALIDATE_ONLY,
)


def argparse_calls(source: str) -> Dict[str, ast.Call]:
    """The ``add_argument`` calls of ``source`` by the ``dest`` each gets, derived as argparse derives it: ``dest=``
    if given, else the first long option (``--batch-size`` -> ``batch_size``), else the first short one, else the
    name of a positional argument."""
    calls = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == 'add_argument'):
            continue
        explicit = [k.value.value for k in node.keywords if k.arg == 'dest' and isinstance(k.value, ast.Constant)]
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if explicit:
            calls[explicit[0]] = node
        elif names and not names[0].startswith('-'):
            calls[names[0]] = node
        elif names:
            option = next((n for n in names if n.startswith('--')), names[0])
            calls[option.lstrip('-').replace('-', '_')] = node
    return calls


def argparse_dests(source: str) -> Set[str]:
    return set(argparse_calls(source))


def _folded(node: ast.AST) -> ast.AST:
    """``node`` with the arithmetic of its constants done (train.py's ``default=[3./4., 4./3.]``), which
    ``ast.literal_eval`` refuses."""
    operators = {ast.Div: operator.truediv, ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub}
    if isinstance(node, ast.List):
        return ast.List(elts=[_folded(e) for e in node.elts], ctx=node.ctx)
    if isinstance(node, ast.BinOp) and type(node.op) in operators:
        left, right = ast.literal_eval(_folded(node.left)), ast.literal_eval(_folded(node.right))
        return ast.Constant(operators[type(node.op)](left, right))
    return node


def argparse_default(call: ast.Call):
    """The default of an ``add_argument`` call as argparse sets it: ``default=`` (a literal), else False for
    ``store_true``, else None."""
    keywords = {k.arg: k.value for k in call.keywords}
    if 'default' in keywords:
        return ast.literal_eval(_folded(keywords['default']))
    action = keywords.get('action')
    return False if isinstance(action, ast.Constant) and action.value == 'store_true' else None


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


def args_attributes(source: str) -> Set[str]:
    """The attributes of ``args`` that ``source`` assigns (``args.x = ...``) or reads with ``getattr(args, 'x')``."""
    names = set()
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                and node.value.id == 'args'):
            names.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'getattr'
              and isinstance(node.args[0], ast.Name) and node.args[0].id == 'args'
              and isinstance(node.args[1], ast.Constant)):
            names.add(node.args[1].value)
    return names


def create_model_keywords(source: str) -> dict:
    """``{keyword: argument}`` of the ``create_model(...)`` call in ``source`` whose values are ``args.<argument>``,
    with ``None`` for keywords given by another expression."""
    (call,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id == 'create_model']
    return {k.arg: k.value.attr if isinstance(k.value, ast.Attribute) and isinstance(k.value.value, ast.Name)
            and k.value.value.id == 'args' else None for k in call.keywords if k.arg}


def required_timm_train_script() -> Path:
    script = timm_train_script()
    if script is None:
        pytest.skip(f'no timm train.py to check sa_vision.train.timm_args against: the installed timm '
                    f'{timm.__version__} ({Path(timm.__file__).parent}) has none beside it (pip ships no train.py); '
                    f'set SA_VISION_TIMM_CHECKOUT to a pytorch-image-models checkout of that version')
    return script


def test_the_packaged_list_is_the_parser_of_timms_train_py():
    script = required_timm_train_script()
    source = script.read_text(encoding='utf-8')
    dests = argparse_dests(source)
    assert {'model', 'sched', 'epochs'} <= dests, f'{script} does not look like timm\'s train.py'
    assert set(TIMM_TRAIN_ARGS) == dests, (
        f'sa_vision.train.timm_args.TIMM_TRAIN_ARGS differs from the parser of {script}: missing '
        f'{sorted(dests - set(TIMM_TRAIN_ARGS))}, not there {sorted(set(TIMM_TRAIN_ARGS) - dests)}')
    # what train.py and timm's init_distributed_device put on args beyond the parser (its checkpoints hold them)
    set_later = args_attributes(source) | args_attributes(inspect.getsource(init_distributed_device))
    assert set_later - dests == TIMM_SET_ARGS


def test_the_model_keywords_are_the_ones_timms_train_py_passes_to_create_model():
    keywords = create_model_keywords(required_timm_train_script().read_text(encoding='utf-8'))
    loading = {'pretrained', 'scriptable', 'checkpoint_path'}  # how to load, not what the architecture is
    assert keywords['in_chans'] is None  # train.py's own choice between --in-chans and --input-size
    assert {k: v for k, v in keywords.items() if v and k not in loading} == {
        k: v for k, v in TIMM_MODEL_KWARGS.items() if k != 'in_chans'}


def test_the_techniques_are_off_at_timms_defaults_but_for_its_imagenet_augmentation():
    """A timm args.yaml holds every argument, at train.py's default where not given: only its random-resized crop
    and colour jitter, on by default, are named as left out of a run here unless they were asked for."""
    assert {name for name in TIMM_ONLY_TECHNIQUES if TIMM_TRAIN_ARGS[name] != TIMM_ONLY} == set()
    calls = argparse_calls(required_timm_train_script().read_text(encoding='utf-8'))
    defaults = {name: argparse_default(calls[name]) for name in TIMM_ONLY_TECHNIQUES}
    on_by_default = {name for name, off in TIMM_ONLY_TECHNIQUES.items()
                     if defaults[name] is not None and defaults[name] != off}
    assert on_by_default == {'scale', 'ratio', 'color_jitter'}, defaults


def test_the_refused_validate_options_are_those_of_timms_validate_py_that_ours_lacks():
    from sa_vision.cli.validate import _parser
    ours = {action.dest for action in _parser()._actions}
    assert not TIMM_VALIDATE_ONLY & ours and TIMM_PREPROCESSING <= TIMM_VALIDATE_ONLY
    script = required_timm_train_script().parent / 'validate.py'
    assert argparse_dests(script.read_text(encoding='utf-8')) - ours == TIMM_VALIDATE_ONLY


def test_ours_are_exactly_the_arguments_sa_vision_train_shares_with_timm():
    ours = {a.dest for a in build_parser()._actions}
    assert {name for name, use in TIMM_TRAIN_ARGS.items() if use == OURS} == ours & set(TIMM_TRAIN_ARGS)
    # the recipe keys ignored with a note are the rest, nothing that sa-vision-train reads itself
    assert TIMM_ONLY_RECIPE_KEYS == set(TIMM_TRAIN_ARGS) - ours


def test_scheduler_names_are_the_ones_timm_takes():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    for name in TIMM_SCHEDULERS:  # every name is accepted by timm itself
        create_scheduler_v2(optimizer, sched=name, num_epochs=10, warmup_epochs=1)
    with pytest.raises(ValueError, match='Unknown scheduler'):
        create_scheduler_v2(optimizer, sched='cosin', num_epochs=10)
    # and timm takes no other: the strings its source compares sched with
    compared = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(create_scheduler_v2)))):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == 'sched':
            compared.update(c.value for comparator in node.comparators for c in ast.walk(comparator)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str))
    assert 'cosine' in compared and set(TIMM_SCHEDULERS) == compared
