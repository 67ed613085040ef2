"""Device-check section 12: timm's own ``train.py`` trains the narrow ``sa_quadratic_cifar`` compiled with CUDA graphs
and bf16 autocast, and the evaluation it logs is checked against the same weights evaluated uncompiled.

``train.py --torchcompile --torchcompile-mode reduce-overhead --amp --amp-dtype bfloat16`` is to train our models, on
a CPU (tests/test_compiled_training.py) and on the GPU. train.py evaluates through the module it
compiled, so its users meet the compiled evaluation's fault on CUDA (docs/training.md, "Precision and compilation"),
which ``sa-vision-train`` sidesteps by evaluating uncompiled there. :func:`verdict` compares each epoch's evaluation
that train.py logged with that epoch's checkpoint evaluated eagerly through the same timm loader: the first one is
the first run of the newly compiled evaluation, the second comes after more compiled training (the fault in
``sa-vision-train``'s run stayed from its second epoch on).

pip's timm ships no ``train.py``: it travels as ``.whl/train.py`` (README.md, "timm and the commit"), or comes from
the checkout in ``$SA_VISION_TIMM_CHECKOUT``. The data are Fashion-MNIST's IDX files, laid out where torchvision's
``FashionMNIST`` (timm's ``--dataset torch/fashion_mnist``) finds them without a download.
"""
import csv
import gzip
import math
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import timm
import timm.data
import timm.utils
import torch
import torch.nn.functional as F

from sa_vision.models.input_pad import black_after_normalization
from sa_vision.train.checkpoint import read_checkpoint
from sa_vision.train.data import FASHION_MNIST, dataset_info
from sa_vision.train.datasets import _fashion_mnist_files

ROOT = Path(__file__).resolve().parents[3]
SCRIPT_IN_CARRY = ROOT / '.whl' / 'train.py'
TORCHVISION_DATASET = 'torch/fashion_mnist'
EXPERIMENT = 'timm'
EPOCHS = 2  # each ends with an evaluation through the compiled module, and a checkpoint of its own
GRID_PADDING = 2  # 28 + 2 * 2 = 32 pixels, the 16 x 16 grid the zoo's models attend over (their input_padding)
POS_LR_SCALE = 30.0  # the cpu profile's, through run_timm's hook into timm's optimizer factory
IDX_UBYTE = 0x08  # an IDX file's type code for unsigned bytes, Fashion-MNIST's only one
# train.py's compiled evaluation and the eager one of the same weights, both bf16 autocast: rounding moved 6 of
# 10,000 images between two exact ways on a CPU (0.06 points), while the fault moved 0.53 to 5.8 points or made the
# loss nan (docs/training.md, "Precision and compilation")
AGREE_TOP1_POINTS = 0.25
AGREE_LOSS_RELATIVE = 0.02
# a batch train.py logs alone (its first, the compiled code's first run, and its last, short, compiled anew): two
# images may flip on a near tie; its loss is printed to 3 decimals
AGREE_BATCH_IMAGES = 2
LOGGED_LOSS_ROUNDING = 5e-4
TRAIN_LINE = re.compile(r'^Train: (\d+) \[\s*(\d+)/(\d+).*?\(\s*[\d.]+s,\s*([\d.]+)/s\)', re.M)
TEST_LINE = re.compile(r'^Test: \[\s*(\d+)/\s*(\d+)\].*?Loss:\s*(\S+)\s*\(.*?Acc@1:\s*(\S+)\s*\(')


def train_script(explicit: Optional[str] = None) -> Optional[Path]:
    """timm's train.py: ``explicit``, else the carried ``.whl/train.py``, else the checkout's in
    ``$SA_VISION_TIMM_CHECKOUT``; None where none is a file."""
    if explicit:
        candidates = [Path(explicit)]
    else:
        checkout = os.environ.get('SA_VISION_TIMM_CHECKOUT')
        candidates = [SCRIPT_IN_CARRY, *([Path(checkout) / 'train.py'] if checkout else [])]
    return next((p for p in candidates if p.is_file()), None)


def truncated_idx(data: bytes, count: int) -> bytes:
    """An IDX file's bytes (unsigned bytes) with only its first ``count`` items, its header's count set to match."""
    if data[:2] != b'\0\0' or data[2] != IDX_UBYTE:
        raise ValueError(f'not an IDX file of unsigned bytes (header {data[:4].hex()})')
    ndim = data[3]
    dims = struct.unpack(f'>{ndim}I', data[4:4 + 4 * ndim])
    count = min(count, dims[0])
    start = 4 + 4 * ndim
    return data[:4] + struct.pack(f'>{ndim}I', count, *dims[1:]) + data[start:start + count * math.prod(dims[1:])]


def torchvision_fashion_mnist(data_dir: Optional[str], root: Path, limit: Optional[int] = None) -> Path:
    """Fashion-MNIST from ``data_dir`` (sa_vision's folder: the four IDX files, gzipped or not; None: Debian's) laid
    out as torchvision's ``FashionMNIST(root)`` reads it with no download, ``root/FashionMNIST/raw`` uncompressed;
    ``limit``: the first images of each split only (the smoke run). Returns ``root``."""
    raw = root / 'FashionMNIST' / 'raw'
    raw.mkdir(parents=True, exist_ok=True)
    for split in ('train', 'test'):
        for path in _fashion_mnist_files(split, data_dir):
            with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:
                data = f.read()
            name = Path(path).name.removesuffix('.gz')
            (raw / name).write_bytes(data if limit is None else truncated_idx(data, limit))
    return root


def normalization() -> Dict[str, float]:
    """Fashion-MNIST's grey mean and std (sa_vision's, as its zoo trained) and a black pixel's value after them."""
    info = dataset_info(FASHION_MNIST)
    mean, std = info.mean[0], info.std[0]
    return {'mean': mean, 'std': std, 'black': black_after_normalization([mean], [std])[0]}


def train_argv(script: Path, data_root: Path, out: Path, model_kwargs: Dict[str, Any], recipe: Sequence[str], *,
               device: str, backend: str, batch_size: int, workers: int) -> List[str]:
    """The command: ``python -m sa_vision.train.run_timm`` running ``script`` on one grey channel at 28 x 28,
    padded by the model to the zoo's grid, compiled with CUDA graphs, bf16 autocast, :data:`EPOCHS` epochs, each
    one's checkpoint kept; ``recipe``: optimizer and schedule flags (names both trainers take)."""
    norm = normalization()
    kwargs = dict(model_kwargs, input_padding=GRID_PADDING, input_pad_value=norm['black'])
    return [sys.executable, '-m', 'sa_vision.train.run_timm', '--pos-lr-scale', str(POS_LR_SCALE), str(script),
            '--dataset', TORCHVISION_DATASET, '--data-dir', str(data_root),
            '--model', 'sa_quadratic_cifar', '--model-kwargs', *(f'{k}={v}' for k, v in kwargs.items()),
            '--num-classes', '10', '--in-chans', '1', '--input-size', '1', '28', '28',
            '--mean', str(norm['mean']), '--std', str(norm['std']), '--crop-pct', '1.0',
            '--scale', '1', '1', '--ratio', '1', '1', '--color-jitter', '0',  # the whole image, flips only
            '--smoothing', '0', '-b', str(batch_size), '--epochs', str(EPOCHS), *recipe, '--seed', '42',
            '--device', device, '--torchcompile', backend, '--torchcompile-mode', 'reduce-overhead',
            '--amp', '--amp-dtype', 'bfloat16', '--workers', str(workers), '--log-interval', '100',
            '--checkpoint-hist', str(EPOCHS), '--output', str(out), '--experiment', EXPERIMENT]


def epoch_rates(log_text: str) -> Dict[int, float]:
    """Each epoch's training images/s as train.py's last line of the epoch gives it (its average over the epoch,
    the first epoch's compilation included)."""
    rates: Dict[int, float] = {}
    for match in TRAIN_LINE.finditer(log_text):
        rates[int(match.group(1))] = float(match.group(4))
    return rates


def evaluations(summary_csv: Path) -> Dict[int, Dict[str, float]]:
    """train.py's evaluation of each epoch, from its ``summary.csv`` (none where it wrote none)."""
    if not summary_csv.is_file():
        return {}
    rows = csv.DictReader(summary_csv.read_text(encoding='utf-8').splitlines())
    return {int(r['epoch']): {'top1': float(r['eval_top1']), 'loss': float(r['eval_loss'])} for r in rows}


def logged_batches(log_text: str) -> Dict[int, Dict[int, Dict[str, float]]]:
    """The evaluation batches train.py logged alone (``Test:`` lines: each ``--log-interval``-th and the last), by
    epoch (the ``Train:`` lines before them) and batch index: that batch's own loss and top-1, not the averages."""
    found: Dict[int, Dict[int, Dict[str, float]]] = {}
    epoch = None
    for line in log_text.splitlines():
        train = TRAIN_LINE.match(line)
        if train:
            epoch = int(train.group(1))
            continue
        test = TEST_LINE.match(line)
        if test and epoch is not None:
            found.setdefault(epoch, {})[int(test.group(1))] = {'loss': float(test.group(3)),
                                                               'top1': float(test.group(4))}
    return found


def epoch_checkpoint(run: Path, epoch: int) -> Path:
    """train.py's checkpoint of ``epoch`` (its saver's name; all kept with ``--checkpoint-hist`` = the epochs)."""
    return run / f'checkpoint-{epoch}.pth.tar'


@torch.inference_mode()  # as train.py's validate: the path a layer takes may depend on it
def evaluate_uncompiled(checkpoint: Path, data_root: Path, device: str, batch_size: int) -> Dict[str, Any]:
    """``checkpoint`` (train.py's) evaluated eagerly in bf16 autocast over the split train.py evaluated, through the
    loader train.py builds for it (timm's ``create_loader`` with its prefetcher, which normalises the bytes on the
    device, in train.py's batches): only the compilation differs, as bf16 rounding flips near ties otherwise."""
    ckpt = read_checkpoint(checkpoint)
    model = timm.create_model(ckpt.arch, **ckpt.model_args)
    model.load_state_dict(ckpt.state_dict)
    model.eval().to(device)
    norm = normalization()
    dataset = timm.data.create_dataset(TORCHVISION_DATASET, root=str(data_root), split='validation')
    loader = timm.data.create_loader(
        dataset, input_size=(1, 28, 28), batch_size=batch_size, is_training=False, interpolation='bilinear',
        mean=(norm['mean'],), std=(norm['std'],), crop_pct=1.0, num_workers=0, use_prefetcher=True,
        device=torch.device(device))
    batches = {}
    for i, (x, y) in enumerate(loader):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            logits = model(x)
        # train.py's own count, top-1 and top-5 at once: topk breaks a tie of bf16 logits unlike argmax
        top1, top5 = timm.utils.accuracy(logits, y, topk=(1, 5))
        batches[i] = {'loss': F.cross_entropy(logits.float(), y).item(), 'top1': top1.item(), 'top5': top5.item(),
                      'images': len(y)}
    images = sum(b['images'] for b in batches.values())
    return {**{k: sum(b[k] * b['images'] for b in batches.values()) / images for k in ('loss', 'top1', 'top5')},
            'images': images, 'batches': batches, 'arch': ckpt.arch, 'model_args': ckpt.model_args}


def _batch_agrees(logged: Dict[str, float], eager: Dict[str, float]) -> bool:
    return (math.isfinite(logged['loss'])
            and abs(logged['loss'] - eager['loss']) <= AGREE_LOSS_RELATIVE * abs(eager['loss']) + LOGGED_LOSS_ROUNDING
            and abs(logged['top1'] - eager['top1']) <= 100. * AGREE_BATCH_IMAGES / eager['images'])


def verdict(compiled: Dict[str, float], eager: Dict[str, Any],
            batches: Optional[Dict[int, Dict[str, float]]] = None) -> Dict[str, Any]:
    """Whether one epoch's compiled evaluation (train.py's ``summary.csv`` row, and the ``batches`` it logged alone)
    is right against the same checkpoint's eager one: the whole split's top-1 within :data:`AGREE_TOP1_POINTS`
    points and loss within :data:`AGREE_LOSS_RELATIVE`, and each logged batch within :data:`AGREE_BATCH_IMAGES`
    images and that loss (a fault of the first batch alone is diluted by the others in the totals). ``right`` is
    None where the eager loss is not finite: the weights diverged, and nothing is compared."""
    top1_diff = compiled['top1'] - eager['top1']
    loss_rel = abs(compiled['loss'] - eager['loss']) / max(abs(eager['loss']), 1e-12)
    wrong_batches = sorted(i for i, logged in (batches or {}).items() if not _batch_agrees(logged, eager['batches'][i]))
    right = (math.isfinite(compiled['loss']) and abs(top1_diff) <= AGREE_TOP1_POINTS
             and loss_rel <= AGREE_LOSS_RELATIVE and not wrong_batches)
    return {'right': right if math.isfinite(eager['loss']) else None, 'top1_diff_points': round(top1_diff, 3),
            'loss_relative_diff': loss_rel, 'batches_compared': sorted(batches or {}), 'wrong_batches': wrong_batches}
