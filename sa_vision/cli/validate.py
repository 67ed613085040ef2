""" Top-1 / top-5 accuracy and loss of a model on a dataset (by default the one its weights were trained on)

What to evaluate (one of):
    --checkpoint output/train/<run>/last.pth.tar     a checkpoint of sa-vision-train or timm's train.py
                                                      (--use-ema: its EMA weights), a state dict, .safetensors,
                                                      or an exported Hub folder
    --model local-dir:output/train/<run>/hub         an exported Hub folder
    --model hf-hub:sa-vision/sa_quadratic_cifar.cifar10
    --model sa_quadratic_cifar --pretrained          the published weights (none is published yet)

    sa-vision-validate --checkpoint output/train/<run>/model_best.pth.tar --data-dir data --dataset-download
    sa-vision-validate --checkpoint output/train/<run>/last.pth.tar --dataset digits
    sa-vision-validate --model local-dir:zoo/fashion-mnist-cpu/sa_quadratic_cifar    # its tag: fashion-mnist

Without --dataset, the weights' own dataset is evaluated: a checkpoint's training dataset, or the dataset of the
pretrained tag (``fashion_mnist_custom`` -> fashion-mnist); CIFAR-10 where neither names one. On a terminal a
progress bar shows images/s and the time left (not in logs: only when stderr is a terminal).
"""
import argparse
import csv
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import timm
import torch

import sa_vision  # noqa: F401  registers the models
from sa_vision.errors import UserError, command
from sa_vision.io import atomic_write, file_problem
from sa_vision.models import DEFAULT_MODEL
from sa_vision.train.arg_groups import ModelKwargs, add_threads_argument
from sa_vision.train.arg_values import check_value_bounds
from sa_vision.train.args import refuse_unknown
from sa_vision.train.checkpoint import CheckpointError, load_model, read_checkpoint, weights_path
from sa_vision.train.data import (
    check_dataset,
    create_image_dataset,
    dataset_info,
    datasets_held_out_as_test,
    image_folder_labels,
    input_channels,
    named_datasets,
    normalization,
    split_name,
    trained_dataset,
)
from sa_vision.train.data_fit import classes_problem
from sa_vision.train.evaluation import evaluate, result_json
from sa_vision.train.recipes import recorded_arg
from sa_vision.train.runtime import apply_threads, import_device_modules, resolve_device
from sa_vision.train.timm_args import TIMM_PREPROCESSING, TIMM_VALIDATE_ONLY

DEFAULT_DATASET = 'torch/cifar10'  # where the weights name no dataset: the paper's


def model_to_evaluate(args):
    """(the model to evaluate, the --dataset its weights were trained on: a name, '' for an image folder, None for
    none), resolved as every command resolves weights and names (:func:`load_model`): --checkpoint names weights (a
    file or folder), --model a name (registered, local-dir:<folder> or hf-hub:<repo>)."""
    if not args.checkpoint:
        path = weights_path(args.model)  # local-dir:<folder>, or weights named by their path: with their dataset
        if path is not None:
            # --no-pretrained: the architecture and preprocessing of the weights at random, as timm builds
            # create_model('local-dir:...', pretrained=False)
            ckpt = read_checkpoint(path, model_args=args.model_kwargs, use_ema=args.use_ema)
            _note_run_data(args, ckpt)
            return ckpt.create_model(load_weights=args.pretrained is not False), trained_dataset(ckpt.meta)
        if args.use_ema:  # else the plain weights' score would pass for the EMA's
            raise UserError(f'--use-ema takes the EMA weights of a checkpoint of timm\'s train.py (--checkpoint '
                            f'FILE); the model {args.model} holds none: drop --use-ema')
        # as timm's validate.py: without --checkpoint a name means its trained weights, a random init only asked
        model = load_model(args.model, pretrained=args.pretrained is not False, **args.model_kwargs)
        return model, trained_dataset({'pretrained_cfg': model.pretrained_cfg})
    if not Path(args.checkpoint).exists():  # never a name: load_model would build a model of that name
        raise CheckpointError(f'--checkpoint {args.checkpoint} does not exist: pass a checkpoint file (last.pth.tar '
                              f'of a run, a state dict, a .safetensors file), a run folder or an exported Hub '
                              f'folder; a model name goes to --model')
    # --model with --checkpoint: the architecture the weights must be (read_checkpoint's arch)
    ckpt = read_checkpoint(args.checkpoint, arch=args.model if args.model_given else None,
                           model_args=args.model_kwargs, use_ema=args.use_ema)
    _note_run_data(args, ckpt)
    return ckpt.create_model(), trained_dataset(ckpt.meta)


def _note_run_data(args, ckpt) -> None:
    """Where the run that made ``ckpt`` read its held-out images (its --data-dir, where it still is, and its
    --val-split): the defaults when the weights' own dataset is evaluated."""
    args.trained_data_dir = recorded_arg(ckpt.meta, 'data_dir')
    args.trained_val_split = recorded_arg(ckpt.meta, 'val_split')


def with_progress(loader, num_images: int, stream=None):
    """``loader``, with a progress bar of images/s and the time left on ``stream`` (stderr) where it is a terminal;
    unchanged elsewhere (CI logs)."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return loader
    from tqdm import tqdm

    def batches():
        with tqdm(total=num_images, unit='img', desc='evaluating', file=stream, dynamic_ncols=True) as bar:
            for images, targets in loader:
                yield images, targets
                bar.update(len(targets))
    return batches()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('-m', '--model', default=None,
                        help=f'registered name, local-dir:<folder> or hf-hub:<repo> (default {DEFAULT_MODEL}); '
                             'with --checkpoint: the expected architecture, needed for bare non-SA weights')
    parser.add_argument('--pretrained', action=argparse.BooleanOptionalAction, default=None,
                        help="the published weights of --model: the default without --checkpoint, as in timm's "
                             "validate.py; --no-pretrained evaluates a random initialisation (of a local-dir: "
                             "folder's or a weights file's architecture too); --checkpoint always loads its weights")
    parser.add_argument('--checkpoint', default='', help='weights of any kind (see above)')
    parser.add_argument('--use-ema', action='store_true', default=False,
                        help='the EMA weights of a timm train.py checkpoint')
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ModelKwargs)
    parser.add_argument('--data-dir', default=None, metavar='DIR')
    parser.add_argument('--dataset', default=None,
                        help=f"{', '.join(repr(info.name) for info in named_datasets())}, another timm "
                             f"<type>/<name>, or '' (an ImageFolder); "
                             f"default: the dataset the weights were trained on (their checkpoint or pretrained tag), "
                             f"else {DEFAULT_DATASET!r}")
    parser.add_argument('--split', '--val-split', default=None,
                        help="split (default: on the weights' own dataset, the --val-split of the run that trained "
                             f"them; else the dataset's held-out split: 'test' for {datasets_held_out_as_test()}, "
                             "which also read it for 'validation'; 'validation' for an image folder); --val-split, "
                             "as sa-vision-train names it, is the same")
    parser.add_argument('--dataset-download', action='store_true', default=False)
    parser.add_argument('-b', '--batch-size', type=int, default=256)
    parser.add_argument('-j', '--workers', type=int, default=None,
                        help='data loading processes (default: 0 for the in-memory digits and fashion-mnist, else 2)')
    add_threads_argument(parser)
    parser.add_argument('--device', default=None, help="'cuda', 'cpu', ... (default: cuda when present)")
    parser.add_argument('--amp', action=argparse.BooleanOptionalAction, default=None,
                        help='bf16 autocast (default: on with CUDA)')
    parser.add_argument('--results-file', default='', metavar='FILENAME',
                        help="also write the result to this file, as timm's validate.py does")
    parser.add_argument('--results-format', default='csv', choices=('csv', 'json'),
                        help='format of --results-file (default: csv, as timm)')
    parser.add_argument('--device-modules', default=None, type=str, nargs='+',
                        help='python modules to import first (e.g. a package that registers models)')
    return parser


def main(argv=None):
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        refuse_unknown(parser, unknown, 'sa-vision-validate', 'validate.py', TIMM_VALIDATE_ONLY, own={},
                       note=(TIMM_PREPROCESSING, ' (it feeds the weights what their training fed them)'))
    check_value_bounds(args)
    problem = args.results_file and file_problem(args.results_file)  # before the evaluation, not after it
    if problem:
        raise UserError(f'--results-file {args.results_file}: {problem}')
    import_device_modules(args.device_modules)
    args.device = resolve_device(args.device)
    apply_threads(args)
    if args.dataset is not None:  # a missing dataset fails before any model is built
        _check_dataset(args)
    args.model_given = args.model is not None
    args.model = args.model or DEFAULT_MODEL

    model, trained_on = model_to_evaluate(args)
    model = model.to(args.device)
    if args.dataset is None:
        args.dataset = DEFAULT_DATASET if trained_on is None else trained_on
        # the run's split, as the explorer's: said, since a run may have evaluated on any split
        inherited = None if args.split or trained_on is None else getattr(args, 'trained_val_split', None)
        args.split = args.split or inherited
        trained_dir = getattr(args, 'trained_data_dir', None)
        reused = trained_on is not None and not args.data_dir and trained_dir and os.path.isdir(trained_dir)
        if reused:  # the run's own --data-dir, as --resume finds it
            args.data_dir = trained_dir
        what = (f'{args.dataset or "an image folder"} in {args.data_dir}' if reused
                else args.dataset or 'an image folder in --data-dir')
        why = 'the weights name none' if trained_on is None else 'the weights were trained on it'
        other = '--dataset and --data-dir choose another' if reused else '--dataset chooses another'
        split = f'; split {inherited}: the run\'s --val-split (--split chooses another)' if inherited else ''
        print(f'dataset: {what} ({why}; {other}){split}', file=sys.stderr)
        _check_dataset(args, of_weights=trained_on is not None)
    problem = classes_problem(args.checkpoint or args.model, model, args.dataset)
    if problem:  # before the data is read
        raise UserError(f'{problem}: evaluate the weights on a dataset of their classes (--dataset), or fine-tune '
                        f'them on this one first (sa-vision-train --initial-checkpoint ... --num-classes N)')
    data_cfg, channels = timm.data.resolve_data_config({}, model=model), input_channels(model)
    # a grey model (in_chans=1) reads grey images, as timm's validate.py does, normalised as timm's loaders adapt
    ds = create_image_dataset(args.dataset, args.split, is_training=False, data_dir=args.data_dir,
                              download=args.dataset_download, img_size=data_cfg['input_size'][-1],
                              classes=image_folder_labels(model, trained_on), in_chans=channels,  # as in training
                              **normalization(args.dataset, data_cfg, channels))  # as sa-vision-train normalises
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=False, num_workers=args.workers)
    loader = with_progress(loader, len(ds))
    use_amp = torch.device(args.device).type == 'cuda' if args.amp is None else args.amp
    device_type = torch.device(args.device).type

    def amp_ctx():
        return torch.autocast(device_type, dtype=torch.bfloat16) if use_amp else nullcontext()

    metrics = evaluate(model, loader, args.device, amp_ctx=amp_ctx)
    name = args.checkpoint or args.model
    result = {'model': name, 'dataset': args.dataset, 'split': args.split, **metrics}
    try:  # the file before the output, whose reader may be gone (| head); the figures shown if it fails
        if args.results_file:
            _write_results(args.results_file, args.results_format, result)
    finally:
        print(f'{name} on {args.dataset or args.data_dir} {args.split}: top-1 {metrics["top1"]:.2f}%  '
              f'top-5 {metrics["top5"]:.2f}%  loss {metrics["loss"]:.4f}  ({metrics["num_images"]} images)')
        print(result_json(result))
    return 0


def _write_results(path: str, results_format: str, result: dict) -> None:
    """The result as timm's validate.py writes its --results-file: a JSON object, or a CSV header and row (its
    folder is made, as sa-vision-benchmark makes its results file's)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp, open(tmp, 'w', encoding='utf-8', newline='') as f:
        if results_format == 'json':
            f.write(result_json(result, indent=4))
        else:
            writer = csv.DictWriter(f, fieldnames=list(result))
            writer.writeheader()
            writer.writerow(result)


def _check_dataset(args, of_weights: bool = False) -> None:
    """The split to read (the dataset's held-out one by default), the loader workers, and the DatasetError a
    missing dataset would raise later; ``of_weights``: the dataset is the one the weights were trained on."""
    info = dataset_info(args.dataset)
    args.split = split_name(args.dataset, args.split or info.eval_split)
    if of_weights and info.is_image_folder and not args.data_dir and not os.path.isdir(args.dataset):
        gone = getattr(args, 'trained_data_dir', None)
        raise UserError(f'the weights were trained on an image folder{f" named {args.dataset!r}" * bool(args.dataset)}'
                        f'{f", {gone}, which is not there any more" if gone else ", which they do not locate"}: '
                        f'pass --data-dir with the folder to evaluate (<folder>/{args.split}/<class>/<image>), or '
                        f'--dataset for another dataset')
    check_dataset(args.dataset, data_dir=args.data_dir, download=args.dataset_download, eval_split=args.split)
    if args.workers is None:  # worker processes only compete for the cores when the images are already in memory
        args.workers = 0 if info.tensor_images else 2


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
