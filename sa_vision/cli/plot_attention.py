""" Pictures of where the attention heads of a sa_vision model look (paper figures 2-6)

    sa-vision-plot sa_quadratic_cifar --out fig.png            # (a) centres + contours
    sa-vision-plot sa_learned_cifar --figure maps --out maps.png  # (b) attention maps
    sa-vision-plot ep10.pth ep50.pth ep300.pth --out traj.png  # (c) centre trajectories
    sa-vision-plot output/train/run --figure trajectory --out traj.png  # (c) of the epochs a run kept
    sa-vision-plot run/best.safetensors --table heads.csv --out fig.svg
    sa-vision-plot local-dir:zoo/fashion-mnist-cpu/sa_quadratic_cifar --kernel-match  # the table, no picture

A source is a timm model name (random init, or --pretrained), a checkpoint file (.safetensors or a torch
checkpoint) or a Hub folder (config.json + model.safetensors). Several sources draw figure (c), as does one with
--figure trajectory: the epochs kept in its folder (sa-vision-train --save-epoch-positions). --kernel-match
prints, per layer of a Gaussian model, the dilation d of the 3x3 kernel d * {-1, 0, 1}^2 its centres come closest
to and their mean distance in grid units, heads and offsets matched one to one (sa_vision.research.kernel_match).
"""
import argparse
import inspect
import os
import sys
from typing import List, Tuple

from torch import nn

from sa_vision.errors import UserError, command
from sa_vision.research.analysis import (
    GAUSSIAN_KINDS,
    attention_layers,
    format_table,
    head_statistics,
    layer_summary,
    load_model,
    table_format,
    write_table,
)
from sa_vision.research.explorer import hub_epochs
from sa_vision.research.kernel_match import KERNEL_MATCH_COLUMNS, layer_kernel_matches
from sa_vision.research.plots import picture_problem, plot_attention_maps, plot_center_trajectories, plot_centers
from sa_vision.train.checkpoint import HF_HUB_PREFIX, read_checkpoint, weights_path
from sa_vision.train.positional_epochs import models_at_epochs, weights_epochs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('sources', nargs='+', help='timm model name, checkpoint file or Hub folder (several: figure c)')
    parser.add_argument('--out', help='output picture, .png / .svg / .pdf (needed unless --kernel-match); its '
                                      'folder is made')
    parser.add_argument('--figure', choices=('auto', 'centers', 'maps', 'trajectory'), default='auto',
                        help='auto: trajectory for several sources, centers for Gaussian kinds, else maps')
    parser.add_argument('--pretrained', action='store_true', help='load pretrained timm weights for a model name')
    parser.add_argument('--query', type=int, nargs=2, metavar=('ROW', 'COL'), help='query pixel (default grid centre)')
    parser.add_argument('--zoom', type=int, help='maps: grid units shown around the query (default '
                        f'{inspect.signature(plot_attention_maps).parameters["zoom"].default})')
    parser.add_argument('--table', help='also write the per-head statistics to this .csv or .json file')
    parser.add_argument('--kernel-match', action='store_true',
                        help='print how close each layer\'s centres come to a 3x3 kernel (per source); without '
                             '--out, no picture')
    args = parser.parse_args(argv)
    _check_outputs(args.out, args.table)
    trajectory = args.figure == 'trajectory' or (args.figure == 'auto' and len(args.sources) > 1)
    if not args.out and not args.kernel_match:
        parser.error('--out is required (or --kernel-match alone, for its table)')
    if args.out and not trajectory and len(args.sources) > 1:
        parser.error(f'--figure {args.figure} takes one source, got {len(args.sources)}')
    if args.table and not args.out and len(args.sources) > 1:
        parser.error('--table holds the per-head statistics of one model: give one source, or --out for figure (c)')
    models = [load_model(s, pretrained=args.pretrained) for s in args.sources]
    if args.kernel_match:
        for source, model in zip(args.sources, models):
            print(f'{source}: centres against a 3x3 kernel of dilation d (mean matched distance, grid units)')
            print(format_table(layer_kernel_matches(model), KERNEL_MATCH_COLUMNS))
        if not args.out and not args.table:
            return 0
    model = models[-1]  # figure (c): the table is of the last source's model
    query = tuple(args.query) if args.query else None
    rows = head_statistics(model, query=query)  # a query outside the grid is refused before anything is drawn
    figure = 'trajectory' if trajectory else 'centers' if args.figure == 'centers' or (
        args.figure == 'auto' and attention_layers(model)[0].kind in GAUSSIAN_KINDS) else 'maps'
    if args.out and args.zoom is not None and figure != 'maps':
        raise UserError(f'--zoom sizes the attention maps (--figure maps); the figure drawn here is {figure}, which '
                        f'shows every position: leave --zoom out, or pass --figure maps')
    if args.out and figure == 'trajectory':
        epochs, labels = _kept_epochs(args.sources[0], model) if len(models) == 1 else (
            models, [os.path.basename(s) for s in args.sources])
        plot_center_trajectories(epochs, args.out, labels=labels)
    elif args.out and figure == 'centers':
        plot_centers(model, args.out)
    elif args.out:
        plot_attention_maps(model, args.out, query=query, **({} if args.zoom is None else {'zoom': args.zoom}))
    try:  # the file before the output, whose reader may be gone (| head); the tables shown if it fails
        if args.table:
            write_table(rows, args.table)
    finally:
        print(format_table(layer_summary(rows)))
        if args.table:
            print(format_table(rows))
    if args.table:
        print(f'wrote {args.table}')
    if args.out:
        print(f'wrote {args.out}')
    return 0


def _kept_epochs(source: str, model: nn.Module) -> Tuple[List[nn.Module], List[str]]:
    """Figure (c) of one source: ``model`` at each epoch kept in the source's folder (a run's, of
    --save-epoch-positions or --save-epoch-weights, or a Hub folder exported from one), with their names."""
    path = weights_path(source)
    if source.startswith(HF_HUB_PREFIX):
        epochs = hub_epochs(source[len(HF_HUB_PREFIX):])
    else:
        # a run's up to the weights' own epoch (model_best's may be earlier than its last), or an export's
        epochs = weights_epochs(read_checkpoint(path)) if path is not None else {}
    if len(epochs) < 2:
        kept = f'only {next(iter(epochs))}' if epochs else 'none'
        raise UserError(f'--figure trajectory of one source draws the epochs kept beside it (a run of sa-vision-train '
                        f'--save-epoch-positions, or an export of one); {source} has {kept}: pass checkpoints of '
                        f'two epochs or more in training order instead')
    return models_at_epochs(model, epochs), list(epochs)


def _check_outputs(out, table) -> None:
    """Refuse a picture or table that could not be written before any work; their folders are made."""
    from sa_vision.io import file_problem
    problem = out and picture_problem(out)
    if problem:
        raise UserError(f'--out {problem}')
    if table:
        table_format(table)
        problem = file_problem(table)
        if problem:
            raise UserError(f'--table {table}: {problem}')


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
