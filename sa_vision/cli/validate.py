""" Top-1 / top-5 accuracy and loss of a model on a dataset (CIFAR-10 test split by default)

What to evaluate (one of):
    --checkpoint output/train/<run>/last.pth.tar     a checkpoint of sa-vision-train or timm's train.py
                                                      (--use-ema: its EMA weights), a state dict, .safetensors,
                                                      or an exported Hub folder
    --model local-dir:output/train/<run>/hub         an exported Hub folder
    --model hf-hub:sa-vision/sa_quadratic_cifar.cifar10
    --model sa_quadratic_cifar --pretrained          the published weights

    sa-vision-validate --model sa_quadratic_cifar --pretrained --data-dir data --dataset-download
    sa-vision-validate --checkpoint output/train/<run>/last.pth.tar --dataset digits
"""
import argparse
import importlib
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import timm
import torch
from timm.utils import ParseKwargs

import sa_vision  # noqa: F401  registers the models
from sa_vision.errors import command
from sa_vision.train.args import add_threads_argument
from sa_vision.train.checkpoint import CheckpointError, load_model, read_checkpoint
from sa_vision.train.data import check_dataset, create_image_dataset, dataset_info, normalization, split_name
from sa_vision.train.evaluation import evaluate
from sa_vision.train.runtime import apply_threads


def model_to_evaluate(args):
    """The model to evaluate, resolved as every command resolves weights and names (:func:`load_model`): --checkpoint
    names weights (a file or folder), --model a name (registered, local-dir:<folder> or hf-hub:<repo>)."""
    if not args.checkpoint:
        return load_model(args.model, pretrained=args.pretrained, **args.model_kwargs)
    if not Path(args.checkpoint).exists():  # never a name: load_model would build a model of that name
        raise CheckpointError(f'--checkpoint {args.checkpoint} does not exist: pass a checkpoint file (last.pth.tar '
                              f'of a run, a state dict, a .safetensors file), a run folder or an exported Hub '
                              f'folder; a model name goes to --model')
    if args.model_given:  # the architecture the weights must be (read_checkpoint's arch; load_model takes none)
        return read_checkpoint(args.checkpoint, arch=args.model, model_args=args.model_kwargs,
                               use_ema=args.use_ema).create_model()
    return load_model(args.checkpoint, use_ema=args.use_ema, **args.model_kwargs)


def main(argv=None):
    parser = argparse.ArgumentParser(description='Evaluate a sa_vision model')
    parser.add_argument('--model', default=None,
                        help='registered name, local-dir:<folder> or hf-hub:<repo> (default sa_quadratic_cifar); '
                             'with --checkpoint: the expected architecture, needed for bare non-SA weights')
    parser.add_argument('--pretrained', action='store_true', default=False, help='load the published weights')
    parser.add_argument('--checkpoint', default='', help='weights of any kind (see above)')
    parser.add_argument('--use-ema', action='store_true', default=False,
                        help='the EMA weights of a timm train.py checkpoint')
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs)
    parser.add_argument('--data-dir', default=None, metavar='DIR')
    parser.add_argument('--dataset', default='torch/cifar10',
                        help="'torch/cifar10' (default), 'fashion-mnist', 'digits', '' (an ImageFolder)")
    parser.add_argument('--split', default=None,
                        help="split (default: the dataset's held-out split: 'test' for torch/cifar10, fashion-mnist "
                             "and digits, which also read it for 'validation'; 'validation' for an image folder)")
    parser.add_argument('--dataset-download', action='store_true', default=False)
    parser.add_argument('-b', '--batch-size', type=int, default=256)
    parser.add_argument('-j', '--workers', type=int, default=None,
                        help='data loading processes (default: 0 for the in-memory digits and fashion-mnist, else 2)')
    add_threads_argument(parser)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--amp', action=argparse.BooleanOptionalAction, default=None,
                        help='bf16 autocast (default: on with CUDA)')
    parser.add_argument('--device-modules', default=None, type=str, nargs='+',
                        help='python modules to import first (e.g. a package that registers models)')
    args = parser.parse_args(argv)
    apply_threads(args)
    info = dataset_info(args.dataset)
    args.split = split_name(args.dataset, args.split or info.eval_split)
    check_dataset(args.dataset, data_dir=args.data_dir, download=args.dataset_download, eval_split=args.split)
    if args.workers is None:  # worker processes only compete for the cores when the images are already in memory
        args.workers = 0 if info.name in ('digits', 'fashion-mnist') else 2
    args.model_given = args.model is not None
    args.model = args.model or 'sa_quadratic_cifar'
    for module in args.device_modules or ():
        importlib.import_module(module)

    model = model_to_evaluate(args).to(args.device)
    data_cfg = timm.data.resolve_data_config({}, model=model)
    ds = create_image_dataset(args.dataset, args.split, is_training=False, data_dir=args.data_dir,
                              download=args.dataset_download, img_size=data_cfg['input_size'][-1],
                              **normalization(args.dataset, data_cfg))  # as sa-vision-train normalises
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=False, num_workers=args.workers)
    use_amp = torch.device(args.device).type == 'cuda' if args.amp is None else args.amp
    device_type = torch.device(args.device).type

    def amp_ctx():
        return torch.autocast(device_type, dtype=torch.bfloat16) if use_amp else nullcontext()

    metrics = evaluate(model, loader, args.device, amp_ctx=amp_ctx)
    name = args.checkpoint or args.model
    print(f'{name} on {args.dataset or args.data_dir} {args.split}: top-1 {metrics["top1"]:.2f}%  '
          f'top-5 {metrics["top5"]:.2f}%  loss {metrics["loss"]:.4f}  ({metrics["num_images"]} images)')
    print(json.dumps({'model': name, 'dataset': args.dataset, 'split': args.split, **metrics}))
    return 0


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
