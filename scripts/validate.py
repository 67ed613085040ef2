#!/usr/bin/env python3
""" Top-1 / top-5 accuracy and loss of a model on a dataset (CIFAR-10 test split by default)

What to evaluate (one of):
    --checkpoint output/train/<run>/last.pth.tar     a training checkpoint of scripts/train.py
    --model local-dir:output/train/<run>/hub         an exported Hub folder
    --model hf-hub:sa-vision/sa_quadratic_cifar.cifar10
    --model sa_quadratic_cifar --pretrained          the published weights

    python scripts/validate.py --model sa_quadratic_cifar --pretrained --data-dir data --dataset-download
    python scripts/validate.py --checkpoint output/train/<run>/last.pth.tar --dataset digits
"""
import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import timm
from timm.utils import ParseKwargs, accuracy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone without installing
import sa_vision  # noqa: F401  registers the models
from sa_vision.data import create_image_dataset


@torch.no_grad()
def evaluate(model, loader, device, amp_ctx=nullcontext, channels_last=False, distributed=False):
    """Loss, top-1 and top-5 (percent) over every image of the loader (summed over processes if distributed)."""
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64)  # loss sum, top1 hits, top5 hits, images
    for images, targets in loader:
        images, targets = images.to(device), targets.to(device)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with amp_ctx():
            logits = model(images)
        logits = logits.float()
        top1, top5 = accuracy(logits, targets, topk=(1, min(5, logits.shape[-1])))
        n = images.size(0)
        totals += torch.tensor([F.cross_entropy(logits, targets, reduction='sum').item(),
                                top1.item() * n / 100., top5.item() * n / 100., n], dtype=torch.float64)
    if distributed:
        dist.all_reduce(totals)
    num_images = max(int(round(totals[3].item())), 1)
    return {
        'loss': totals[0].item() / num_images,
        'top1': 100. * totals[1].item() / num_images,
        'top5': 100. * totals[2].item() / num_images,
        'num_images': int(round(totals[3].item())),
    }


def load_model(args):
    """The model to evaluate, from a checkpoint, a local-dir:/hf-hub: name or a registered name."""
    if args.checkpoint:
        from sa_vision.hub import load_training_checkpoint, model_from_checkpoint
        return model_from_checkpoint(load_training_checkpoint(args.checkpoint))
    # a Hub folder or repository always means its weights
    pretrained = args.pretrained or args.model.startswith(('local-dir:', 'hf-hub:'))
    return timm.create_model(args.model, pretrained=pretrained, **args.model_kwargs)


def main():
    parser = argparse.ArgumentParser(description='Evaluate a sa_vision model')
    parser.add_argument('--model', default='sa_quadratic_cifar', help='registered name, local-dir:<folder> or hf-hub:<repo>')
    parser.add_argument('--pretrained', action='store_true', default=False, help='load the published weights')
    parser.add_argument('--checkpoint', default='', help='a training checkpoint of scripts/train.py')
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs)
    parser.add_argument('--data-dir', default=None, metavar='DIR')
    parser.add_argument('--dataset', default='torch/cifar10', help="'torch/cifar10' (default), 'digits', '' (folder)")
    parser.add_argument('--split', default='validation', help='split (torch/cifar10 and digits: the test split)')
    parser.add_argument('--dataset-download', action='store_true', default=False)
    parser.add_argument('-b', '--batch-size', type=int, default=256)
    parser.add_argument('-j', '--workers', type=int, default=2)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--amp', action=argparse.BooleanOptionalAction, default=None,
                        help='bf16 autocast (default: on with CUDA)')
    args = parser.parse_args()

    model = load_model(args).to(args.device)
    data_cfg = timm.data.resolve_data_config({}, model=model)
    ds = create_image_dataset(args.dataset, args.split, is_training=False, data_dir=args.data_dir,
                              download=args.dataset_download, img_size=data_cfg['input_size'][-1],
                              mean=data_cfg['mean'], std=data_cfg['std'])
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


if __name__ == '__main__':
    main()
