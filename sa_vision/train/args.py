""" The arguments of ``sa-vision-train``: timm ``train.py``'s names, built fresh by :func:`build_parser`

A run's arguments fall into the groups below; every argument in none of them is a training argument, written to
the run's ``recipe.yaml`` (``-c recipe.yaml`` repeats the run) and taken from the checkpoint by ``--resume``.
"""
import argparse
import copy
import os
from types import MappingProxyType
from typing import AbstractSet, Mapping, Optional, Tuple

from ..errors import RecipeError, UserError
from .arg_groups import ARGUMENT_GROUPS
from .arg_values import command_line_kwargs_over_recipe_flags
from .recipes import RECIPE_DIR, TIMM_ONLY_RECIPE_KEYS
from .timm_args import LOCAL, TIMM_SET_ARGS, TIMM_TRAIN_ARGS
from .weights_files import RUN_CHECKPOINT, WEIGHT_SUFFIXES

__all__ = ['PROCESS_ARGS', 'LOCAL_ARGS', 'TIMM_LOCAL_ARGS', 'RESOLVED_ARGS', 'RUNTIME_ARGS', 'build_config_parser',
           'build_parser', 'parse_over', 'argument_names', 'refuse_unknown']

# this process's and this machine's: set anew by every process, so --resume does not take them from the run
PROCESS_ARGS = frozenset({'config', 'resume', 'rank', 'world_size', 'local_rank', 'distributed', 'device', 'pin_mem',
                          'channels_last', 'retain_freed_memory', 'threads'})
# this run's files and this machine's choices: resumed with the run, but no part of the recipe
LOCAL_ARGS = frozenset({'output', 'experiment', 'data_dir', 'dataset_download', 'initial_checkpoint', 'device_modules',
                        'workers', 'log_interval', 'val_interval', 'save_epoch_weights', 'save_epoch_positions',
                        'export', 'target_top1', 'torchcompile', 'torchcompile_mode', 'cudnn_benchmark', 'device_data',
                        'opt_fused'})
# timm train.py's arguments of the same kinds, for the recipes of its checkpoints
TIMM_LOCAL_ARGS = frozenset(name for name, use in TIMM_TRAIN_ARGS.items() if use == LOCAL) | TIMM_SET_ARGS
# decided on the machine that runs (args.yaml and the log say what and why), never asked for
RESOLVED_ARGS = frozenset({'amp_used', 'amp_reason', 'torchcompile_used', 'torchcompile_mode_used', 'opt_fused_used',
                           'torchcompile_reason', 'resume_changes', 'device_data_used', 'device_data_reason',
                           'opt_fused_reason', 'model_given',  # --model local-dir:<folder>: its architecture
                           'label_names'})  # an image folder's classes, in timm's label order
# left out of published recipes: a recipe reproduces the run anywhere and leaks no local paths
RUNTIME_ARGS = PROCESS_ARGS | LOCAL_ARGS | TIMM_LOCAL_ARGS | RESOLVED_ARGS


def build_config_parser() -> argparse.ArgumentParser:
    """The parser of ``-c`` alone, read first: the recipe it names gives the defaults of :func:`build_parser`."""
    parser = argparse.ArgumentParser(description='Training config', add_help=False)
    parser.add_argument(
        '-c', '--config', default='', type=str, metavar='NAME|FILE',
        help='recipe whose values are argument defaults: the name of one shipped in the package '
             f'(sa_vision/configs/NAME.yaml: {", ".join(sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")))}) or a '
             'YAML file, such as the recipe.yaml of a run or an export')
    return parser


_SHOWN_DEFAULT = 'default: %(default)s'  # the help of an option without one


class _DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter, for options without help too, less the defaults that read as
    unset (None, False, empty) and those the help names itself."""

    def _format_action(self, action):
        if action.option_strings and not action.help and self._shows_default(action):
            action = copy.copy(action)
            action.help = _SHOWN_DEFAULT
        return super()._format_action(action)

    def _get_help_string(self, action):
        if action.help != _SHOWN_DEFAULT and 'default' in action.help:  # it names the built-in one: a recipe's beside
            recipes = getattr(action, 'built_in_default', action.default) != action.default
            return f'{action.help} (in force: %(default)s)' if recipes else action.help
        shown = self._shows_default(action) and action.help != _SHOWN_DEFAULT
        return f'{action.help} (default: %(default)s)' if shown else action.help

    @staticmethod
    def _shows_default(action) -> bool:
        default = action.default
        return bool(action.option_strings) and default is not argparse.SUPPRESS and default is not None \
            and default is not False and default not in ('', [], {})


def build_parser(defaults: Optional[dict] = None) -> argparse.ArgumentParser:
    """The training arguments (``-c`` listed too, for ``--help``), with ``defaults`` (a recipe's, a resumed run's)
    over the built-in ones."""
    parser = argparse.ArgumentParser(
        description="Train sa_vision models with timm parts. The defaults shown are those in force: without -c, "
                    "the paper's batch and schedule for CIFAR-10 (App. A.4: lr 0.1 for batch 100, 15 warm-up epochs, "
                    "cosine per step over 300 epochs), not timm's, on the offline digits unless --dataset says "
                    "otherwise (torch/cifar10 for the paper's data); with -c NAME|FILE --help, the recipe's.",
        parents=[build_config_parser()], formatter_class=_DefaultsHelpFormatter)
    for title, add in ARGUMENT_GROUPS:
        add(parser.add_argument_group(title))
    if defaults:
        for action in parser._actions:
            action.built_in_default = action.default
        parser.set_defaults(**defaults)
    return parser


def parse_over(defaults: dict, argv, source: str = 'the recipe', resumed: bool = False) -> argparse.Namespace:
    """``argv`` parsed over ``defaults`` (a recipe's, a resumed run's: ``source`` names them for errors): a
    command-line ``--model-kwargs`` updates their ``model_kwargs`` instead of replacing them, and (unless
    ``resumed``: the run keeps its model) wins over their flags of the same keyword."""
    parser = build_parser(defaults)
    _check_default_types(parser, defaults, source)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        refuse_unknown(parser, unknown)
    _check_choices(parser, args, source)
    if not resumed:
        command_line_kwargs_over_recipe_flags(args, argv, parser._option_string_actions)
    args.model_kwargs = {**(defaults.get('model_kwargs') or {}), **args.model_kwargs}
    return args


def refuse_unknown(parser: argparse.ArgumentParser, unknown, command: str = 'sa-vision-train',
                   script: str = 'train.py', timm_only: AbstractSet[str] = TIMM_ONLY_RECIPE_KEYS,
                   own: Mapping[str, str] = MappingProxyType({'--input-size': '--img-size N'}),
                   note: Tuple[AbstractSet[str], str] = (frozenset(), '')) -> None:
    """What argparse leaves unparsed: a UserError naming the options of timm's ``script`` that ``command`` lacks
    (--model-ema, --mixup, --aa, ... of train.py), and where they work, with ``note`` = (options, text): the text
    where one of those options is among them; those it takes under another name (``own``: timm's option -> ours);
    a data folder given as timm's deprecated positional argument; else argparse's own error."""
    given = [arg.split('=')[0] for arg in unknown if arg.startswith('--')]
    if renamed := [f'{arg}: {command} takes {own[arg]}' for arg in given if arg in own]:
        raise UserError('; '.join(renamed))
    timms = [arg for arg in given if arg[2:].replace('-', '_') in timm_only]
    if timms:
        one, why = len(timms) == 1, note[1] * any(arg[2:].replace('-', '_') in note[0] for arg in timms)
        raise UserError(f'{", ".join(timms)}: {"an option" if one else "options"} of timm\'s {script} that {command} '
                        f'does not take{why}. Run timm\'s own script for {"it" if one else "them"}: python -m '
                        f'sa_vision.train.run_timm path/to/timm/{script} ... ({script} of a pytorch-image-models '
                        f'checkout: pip\'s timm ships no {script}; docs/training.md, "Running timm\'s top-level '
                        f'scripts")')
    for arg in (arg for arg in unknown if not arg.startswith('-')):
        if weights := _weights_by_position(arg, command):
            raise UserError(weights)
    folders = [arg for arg in unknown if not arg.startswith('-') and os.path.isdir(arg)]
    if folders:
        raise UserError(f'{folders[0]}: {command} takes the data folder as --data-dir {folders[0]} (timm\'s scripts '
                        f'take it by position too, which they call deprecated)')
    parser.error(f'unrecognized arguments: {" ".join(unknown)}')


# the options that take weights, per command: of a run folder ({run}: its checkpoint), a weights file, a Hub folder
_WEIGHT_OPTIONS = {
    'sa-vision-train': ('--resume {run} to continue it',
                        '--resume {arg} to continue its run, or --initial-checkpoint {arg} to start from its weights',
                        '--model local-dir:{arg} --pretrained to start from its weights'),
    'sa-vision-validate': ('--checkpoint {run}', '--checkpoint {arg}', '--model local-dir:{arg}'),
}


def _weights_by_position(arg: str, command: str) -> Optional[str]:
    """What to say of weights given by position (a user resuming a run or evaluating weights as timm's scripts
    take a data folder): a run folder, a weights file or a Hub folder, and the option of ``command`` that takes it;
    None for anything else. A folder is read as read_checkpoint reads it: config.json first."""
    options = _WEIGHT_OPTIONS.get(command)
    if options is None:
        return None
    if os.path.isfile(os.path.join(arg, 'config.json')):
        what, option = 'a Hub folder', options[2]
    elif os.path.isfile(os.path.join(arg, RUN_CHECKPOINT)):
        what, option = 'the folder of a training run', options[0]
    elif arg.endswith(WEIGHT_SUFFIXES) and not os.path.isdir(arg):
        what, option = 'a weights file', options[1]
    else:
        return None
    option = option.format(arg=arg, run=os.path.join(arg, RUN_CHECKPOINT))
    return f'{arg}: {what}; {command} takes it as {option}'  # given by position, or as the value of another option


def _check_choices(parser: argparse.ArgumentParser, args: argparse.Namespace, source: str) -> None:
    """A :class:`RecipeError` for a value outside its argument's ``choices``: argparse checks those given on the
    command line only, so the value came from ``source``, whose values are defaults."""
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if action.choices is not None and value is not None and value not in action.choices:
            raise RecipeError(f'{action.option_strings[0]} is {value!r} in {source}, it must be one of '
                              f'{", ".join(map(str, action.choices))}')


def _check_default_types(parser: argparse.ArgumentParser, defaults: dict, source: str) -> None:
    """A :class:`RecipeError` for a value of ``source`` (a recipe's, a resumed run's) of the wrong kind: argparse
    would convert a text default with no word of where it came from, and ``model_kwargs`` must be a mapping."""
    kwargs = defaults.get('model_kwargs')
    if kwargs is not None and not isinstance(kwargs, dict):
        raise RecipeError(f'model_kwargs in {source} is {kwargs!r}, it must be a mapping of keyword: value '
                          f'(model_kwargs: {{embed_dim: 16}})')
    for action in parser._actions:
        value = defaults.get(action.dest)
        if isinstance(value, str) and action.type in (int, float):
            try:
                action.type(value)
            except ValueError:
                raise RecipeError(f'{action.option_strings[0]} is {value!r} in {source}, it must be '
                                  f'{"a whole number" if action.type is int else "a number"}') from None


def argument_names() -> frozenset:
    """The ``dest`` of every training argument."""
    return frozenset(vars(build_parser().parse_args([])))
