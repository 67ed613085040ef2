""" The weights whose compiled evaluation gave loss nan on an H100 (docs/training.md, "Precision and compilation"),
evaluated on this CPU on Fashion-MNIST's test split: float32 and bf16 autocast, eager and compiled (inductor), and
compiled on the dense path CUDA takes (``dense_attention``). On a CPU every way gives the same top-1.

    OMP_NUM_THREADS=2 python docs/probes/cpu/eval_fault_cpu.py docs/probes/gpu/h100_2026-11-26b_quadratic \\
        --data-dir data/fashion-mnist     # about 2 minutes on 2 cores
"""
import argparse
import contextlib
from pathlib import Path

import timm
import torch

import sa_vision  # noqa: F401  registers the models
from sa_vision.layers import dense_attention
from sa_vision.train.datasets import FashionMnistDataset
from sa_vision.train.device_data import DeviceEvalLoader
from sa_vision.train.evaluation import evaluate

WAYS = (('float32, eager', False, False, False), ('bf16, eager', True, False, False),
        ('bf16, compiled', True, True, False), ('bf16, compiled, dense', True, True, True))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('folder', type=Path, help='config.json and model.safetensors')
    p.add_argument('--data-dir', default=None)
    p.add_argument('--batch-size', type=int, default=500, help='the gpu-long recipe\'s evaluation batch')
    args = p.parse_args(argv)
    model = timm.create_model(f'local-dir:{args.folder}', pretrained=True).eval()  # bf16 weights into float32
    data_cfg = model.pretrained_cfg
    split = FashionMnistDataset('test', data_dir=args.data_dir, img_size=data_cfg['input_size'][-1])
    images, targets = split.held_tensors()
    loader = DeviceEvalLoader(images, targets, args.batch_size, data_cfg['mean'], data_cfg['std'], 'cpu')
    print(f'{data_cfg["architecture"]} from {args.folder}, torch {torch.__version__}, {len(targets)} test images')
    for name, bf16, compiled, dense in WAYS:
        amp = (lambda: torch.autocast('cpu', torch.bfloat16)) if bf16 else contextlib.nullcontext
        torch._dynamo.reset()
        with dense_attention(model, True) if dense else contextlib.nullcontext():
            metrics = evaluate(torch.compile(model) if compiled else model, loader, 'cpu', amp)
        print(f'{name:24s} loss {metrics["loss"]:.4f}  top-1 {metrics["top1"]:.2f}  top-5 {metrics["top5"]:.2f}')


if __name__ == '__main__':
    main()
