""" The zoo, reproduced: train the four models, prune and fine-tune the fifth, evaluate, export (and publish)

    # 2-core CPU, offline: narrower models on Fashion-MNIST (Debian's dataset-fashion-mnist); times: --profile below
    sa-vision-reproduce --profile cpu --out output/reproduce-fmnist
    # the paper: CIFAR-10 with the recipes unchanged, on a GPU
    sa-vision-reproduce --profile paper --data-dir data --dataset-download --out output/reproduce-cifar10
    # the mechanics in two minutes
    sa-vision-reproduce --profile tiny --out output/reproduce-tiny
    # the cpu profile on a GPU, with training's speed flags on every stage
    sa-vision-reproduce --profile cpu --out output/reproduce-fmnist-gpu --train-args="--amp --torchcompile inductor"
    # the ablation of the positional parameters (the quadratic model, paper or conv init, positional lr x1 or x30)
    sa-vision-reproduce --profile cpu --ablation --epochs 2 --out output/ablation-fmnist

    # keep the zoo in a checkout: copy the Hub folders of a finished (or continued) run to zoo/<name>/<model>/
    sa-vision-reproduce --profile cpu --out output/reproduce-fmnist --keep zoo/fashion-mnist-cpu
    # check kept models against a results table (--no-accuracy: only the weights' SHA-256, 64 images' logits and the
    # cards' claimed top-1, --record: write that guard), and redraw the figures from them
    sa-vision-reproduce --check zoo/fashion-mnist-cpu --table docs/reproduction_fashion_mnist.csv
    sa-vision-reproduce --figures-from zoo/fashion-mnist-cpu --out docs/img/reproduction

Killed at any moment, the same command continues: finished stages are skipped and a training run resumes from its
last epoch. ``--publish`` uploads the five Hub folders (a dry run lists them otherwise). See
:mod:`sa_vision.reproduce`.
"""
import argparse
import shlex
import sys
from pathlib import Path

import torch

from sa_vision.errors import command
from sa_vision.io import folder_problem
from sa_vision.reproduce import (
    PROFILES,
    Reproduction,
    ReproductionError,
    StageFailed,
    check_classes_asked,
    check_keep_target,
    check_kept_models,
    draw_figures,
    record_kept_models,
)
from sa_vision.reproduce.provenance import reproduction_lock
from sa_vision.train.args import build_parser as build_train_parser


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--profile', default=None, choices=sorted(PROFILES),
                        help='(default cpu) ' + '; '.join(f'{p.name}: {p.description}' for p in PROFILES.values()))
    parser.add_argument('--dataset', default=None,
                        help="default: the profile's (" + ', '.join(f'{p.name}: {p.dataset}' for p in PROFILES.values())
                        + ')')
    parser.add_argument('--data-dir', default=None, metavar='DIR')
    parser.add_argument('--dataset-download', action='store_true', default=False)
    parser.add_argument('--epochs', type=int, default=None, help="every training stage's epochs (fine-tuning aside)")
    parser.add_argument('--train-args', default='', metavar='"ARGS"',
                        help='sa-vision-train arguments added to every training stage\'s command line after its '
                             'recipe, so they win over it (device, speed: e.g. --train-args="--device cuda:1 --amp"); '
                             'write it with "=" so that the value may start with --')
    parser.add_argument('--out', metavar='DIR', help='the reproduction folder (rerun to continue); with '
                                                     '--figures-from, the figures\' folder')
    parser.add_argument('--ablation', action='store_true', default=False,
                        help='train only the ablation of the positional parameters (ablation.md / ablation.csv)')
    parser.add_argument('--publish', action='store_true', default=False,
                        help='upload the five Hub folders (needs a write token: HF_TOKEN or `hf auth login`)')
    parser.add_argument('--keep', default=None, metavar='ZOO',
                        help='after the run, copy its Hub folders to ZOO/<model>/ (e.g. zoo/fashion-mnist-cpu)')
    parser.add_argument('--check', default=None, metavar='ZOO',
                        help='check the models kept in ZOO against --table instead of running (exit 1 on a '
                             'difference): their weights\' SHA-256 and the logits of 64 test images against the '
                             'guard beside the table (--record writes it; an error without it), the top-1 each '
                             'model card claims against the table\'s, and top-1 / top-5 on the whole test split '
                             '(one image in 10,000 of slack; minutes per model on a CPU)')
    parser.add_argument('--table', default=None, metavar='CSV', help='with --check: the results table')
    parser.add_argument('--no-accuracy', dest='accuracy', action='store_false', default=True,
                        help='with --check: only the guard (SHA-256 and logits) and the cards (seconds), not the '
                             'whole test split')
    parser.add_argument('--record', action='store_true', default=False,
                        help='with --check: (re)write the guard beside --table from the kept models instead')
    parser.add_argument('--figures-from', default=None, metavar='ZOO',
                        help="draw the paper's figures of the models kept in ZOO into --out instead of running")
    args = parser.parse_args(argv)
    _refuse_unused_options(parser, args)
    if args.check:
        if not args.table:
            parser.error('--check needs --table, the results CSV to compare with')
        if args.record:
            paths = record_kept_models(Path(args.check), Path(args.table), data_dir=args.data_dir)
            print('wrote ' + ', '.join(map(str, paths.values())))
            return 0
        try:
            rows = check_kept_models(Path(args.check), Path(args.table), data_dir=args.data_dir,
                                     accuracy=args.accuracy)
        except StageFailed as e:
            print(f'error: {e}', file=sys.stderr)
            return 1
        return 0 if all(r['ok'] for r in rows) else 1
    if args.figures_from:
        if not args.out:
            parser.error('--figures-from needs --out, the folder of the figures')
        draw_figures(_kept_folders(Path(args.figures_from), Path(args.out)), Path(args.out), redraw=True)
        return 0
    return _reproduce(parser, args)


def _reproduce(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The reproduction (or its ablation) into --out, continued where a folder of the same options stopped."""
    if not args.out:
        parser.error('--out is required: the reproduction folder')
    problem = folder_problem(args.out)
    if problem:
        raise ReproductionError(f'--out {args.out}: {problem}')
    train_args = shlex.split(args.train_args)
    try:
        asked = build_train_parser().parse_args(train_args)
    except SystemExit:
        parser.error(f'--train-args {args.train_args!r}: sa-vision-train does not take these (its error is above)')
    profile = PROFILES[args.profile or 'cpu']
    if profile.needs_gpu and not torch.cuda.is_available() and asked.device is None:  # --device=cpu too
        raise ReproductionError(f'--profile {profile.name} trains on a GPU ({profile.description}), and torch finds '
                                f'none here: run it where CUDA is, or add --train-args="--device cpu" to train on '
                                f'the CPU anyway')
    try:
        reproduction = Reproduction(args.out, profile.name, dataset=args.dataset, data_dir=args.data_dir,
                                    download=args.dataset_download, epochs=args.epochs, train_args=train_args)
        check_classes_asked(reproduction.dataset, args.data_dir, asked)
        if args.keep:  # before any training: a kept zoo of other models is never replaced at the end
            if Path(args.keep).resolve() == Path(args.out).resolve():
                raise ReproductionError(f'--keep {args.keep} names the reproduction folder itself: keep the zoo in a '
                                        f'folder of its own, e.g. zoo/<dataset>-<profile>')
            check_keep_target(Path(args.keep), reproduction.dataset)
        with reproduction_lock(args.out):
            if args.ablation:
                reproduction.ablation()
            else:
                reproduction.run(publish=args.publish)
                if args.keep:
                    reproduction.keep(args.keep)
    except StageFailed as e:
        print(f'error: {e}. Finished stages are kept in {args.out}; fix the cause and run the same command to '
              f'continue', file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: sa_vision.errors.run_cli prints this, once
        raise type(e)(f'finished stages are kept in {args.out}; run the same command to continue (a '
                                f'stopped training resumes from its last finished epoch)') from None
    return 0


# the options each way of running takes beside its own (the others would be ignored without a word)
_RUN_OPTIONS = ('profile', 'epochs', 'train_args', 'ablation', 'publish', 'keep')
_CHECK_OPTIONS = ('table', 'accuracy', 'record')


def _refuse_unused_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A parser error for options that the chosen way of running (a reproduction, --check or --figures-from) does
    not read."""
    given = [k for k, v in vars(args).items() if v != parser.get_default(k)]
    if args.check:  # the table names each model's dataset
        unused = [k for k in given if k in _RUN_OPTIONS or k in ('out', 'figures_from', 'dataset', 'dataset_download')]
    elif args.figures_from:
        unused = [k for k in given if k in _RUN_OPTIONS or k in _CHECK_OPTIONS or k in (
            'dataset', 'data_dir', 'dataset_download')]
    else:
        unused = [k for k in given if k in _CHECK_OPTIONS] + [k for k in given if args.ablation and k in (
            'publish', 'keep')]
    if unused:
        mode = '--check' if args.check else '--figures-from' if args.figures_from else (
            '--ablation' if args.ablation else 'a reproduction')
        names = ', '.join('--no-accuracy' if k == 'accuracy' else '--' + k.replace('_', '-') for k in unused)
        parser.error(f'{mode} does not use {names}: leave {"it" if len(unused) == 1 else "them"} out')


def _kept_folders(zoo: Path, out: Path):
    """The Hub folders (config.json) of the attention models kept in ``zoo``; a ReproductionError where there is
    none to draw, or ``out`` is a file."""
    from sa_vision.models import SA_MODEL_ARGS
    if not zoo.is_dir():
        raise ReproductionError(f'--figures-from {zoo} is not a folder: give the kept zoo, e.g. zoo/fashion-mnist-cpu')
    if out.exists() and not out.is_dir():
        raise ReproductionError(f'--out {out} is a file: give the folder to draw the figures into')
    folders = [p for p in sorted(zoo.iterdir()) if (p / 'config.json').is_file()]
    if not any(p.name.split('.')[0] in SA_MODEL_ARGS for p in folders):
        raise ReproductionError(f'{zoo} holds no Hub folder (<model>/config.json) of an attention model '
                                f'({", ".join(SA_MODEL_ARGS)}), found {[p.name for p in folders] or "none"}: give '
                                f'the kept zoo, e.g. zoo/fashion-mnist-cpu')
    return folders


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
