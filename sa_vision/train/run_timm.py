""" Run one of timm's top-level scripts with the sa_vision models registered

timm's ``train.py``, ``validate.py``, ``benchmark.py``, ``inference.py`` and ``onnx_export.py`` (in a timm checkout)
create models by name but have no option to import a plugin. This imports ``sa_vision`` (registering its models)
and then runs the given script as ``__main__`` with the remaining arguments::

    python -m sa_vision.train.run_timm path/to/timm/validate.py --model sa_quadratic_cifar --pretrained ...
    python -m sa_vision.train.run_timm --pos-lr-scale 30 path/to/timm/train.py --model sa_quadratic_cifar ...

The script sees ``sys.argv == [script, *arguments]`` and its own folder first on ``sys.path``, as when run
with ``python script ...``.
"""
import argparse
import functools
import inspect
import os
import runpy
import sys
from typing import List, Optional

from torch import nn

import sa_vision  # noqa: F401  (registers the models with timm)

from ..errors import UserError, freeze_at_exit, run_cli
from ..models.param_groups import check_pos_lr_scale, param_groups_pos_lr, positional_parameter_names

__all__ = ['main', 'use_pos_lr_scale']


def use_pos_lr_scale(pos_lr_scale: float) -> None:
    """Make ``timm.optim.create_optimizer_v2`` group a model's parameters with ``param_groups_pos_lr``.

    timm's ``train.py`` builds its optimizer with ``create_optimizer_v2(model, **optimizer_kwargs(cfg=args))``; its
    ``--opt-kwargs`` are Python literals, so no ``param_group_fn`` can reach it from the command line. Call this
    before the script imports timm.optim's names."""
    import timm.optim
    check_pos_lr_scale(pos_lr_scale)
    create_optimizer_v2 = timm.optim.create_optimizer_v2
    signature = inspect.signature(create_optimizer_v2)

    @functools.wraps(create_optimizer_v2)
    def with_pos_lr(model_or_params, *args, **kwargs):
        given = signature.bind_partial(model_or_params, *args, **kwargs).arguments
        if isinstance(model_or_params, nn.Module) and given.get('param_group_fn') is None:
            if given.get('layer_decay') is not None:
                raise UserError('--pos-lr-scale and --layer-decay both set the learning rate per parameter group; '
                                'pass one of them')
            kwargs['param_group_fn'] = functools.partial(
                param_groups_pos_lr, weight_decay=given.get('weight_decay', 0.), pos_lr_scale=pos_lr_scale)
            _say_what_pos_lr_scales(model_or_params, pos_lr_scale)
        return create_optimizer_v2(model_or_params, *args, **kwargs)

    timm.optim.create_optimizer_v2 = with_pos_lr


def _say_what_pos_lr_scales(model: nn.Module, pos_lr_scale: float) -> None:
    """One line (from the first process of a distributed run) naming what --pos-lr-scale scales: timm's own log
    shows only the optimizer it created."""
    if int(os.environ.get('RANK', '0')) != 0:
        return
    names = positional_parameter_names(model)
    what = (f'{len(names)} positional parameters of {type(model).__name__} ({", ".join(sorted(names)[:2])}'
            f'{", ..." if len(names) > 2 else ""}) train at {pos_lr_scale:g}x the scheduled learning rate' if names
            else f'{type(model).__name__} has no positional parameters: it changes nothing')
    print(f'sa_vision: --pos-lr-scale {pos_lr_scale:g}: {what}', file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m sa_vision.train.run_timm', description=__doc__.strip().splitlines()[0],
        epilog='Everything after SCRIPT is passed to the script unchanged.')
    parser.add_argument('--pos-lr-scale', type=float, default=None, metavar='SCALE',
                        help='train the positional parameters at SCALE x the scheduled learning rate '
                             '(sa_vision.models.param_groups_pos_lr; for train.py)')
    parser.add_argument('script', help='a top-level script of a timm checkout, e.g. path/to/timm/validate.py')
    parser.add_argument('script_args', nargs=argparse.REMAINDER, metavar='ARGS', help="the script's arguments")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    """Run ``SCRIPT`` as ``__main__`` with ``ARGS`` as its arguments."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.isfile(args.script):
        what = 'is a directory, not a script' if os.path.isdir(args.script) else 'does not exist'
        parser.error(f'{args.script} {what}; pass the path of a script such as train.py, validate.py, benchmark.py, '
                     f'inference.py or onnx_export.py of a timm checkout')
    if args.pos_lr_scale is not None:
        use_pos_lr_scale(args.pos_lr_scale)
    sys.argv = [args.script, *args.script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    runpy.run_path(args.script, run_name='__main__')


if __name__ == '__main__':
    freeze_at_exit()
    sys.exit(run_cli(main))
