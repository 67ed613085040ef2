""" Training: a sa_vision model (or any timm model) with timm's library parts, no timm checkout needed

``scripts/train.py`` and ``python -m sa_vision.training`` run :func:`main`.

Reads the recipes of ``scripts/configs`` (``-c``) in the argument names of timm's ``train.py``; command-line
arguments override the recipe. Offline quick start (digits from scikit-learn, a small model, ~2 min on 2 CPUs):

    python scripts/train.py -c scripts/configs/sa_quadratic_cifar_digits.yaml --export

CIFAR-10 with the paper's recipe (GPU: CUDA and bf16 autocast are used automatically, channels-last for convolutional models):

    python scripts/train.py -c scripts/configs/sa_quadratic_cifar.yaml --data-dir data --dataset-download

Multi-process: ``torchrun --nproc_per_node N scripts/train.py ...`` (DDP; gloo on CPU, nccl on GPU).
``--resume <run>/last.pth.tar`` continues a run exactly where its last completed epoch ended.
``--initial-checkpoint`` starts from weights of any kind (``scripts/prune.py`` output, a timm train.py checkpoint,
safetensors, a Hub folder); the architecture arguments stored with them are the defaults of ``--model-kwargs``.
A run's ``recipe.yaml`` (written beside its checkpoint and into exports) repeats it: ``-c recipe.yaml``.

Layering (layers -> models -> tools -> scripts, checked by ``tests/test_structure.py``): a tool; imports
:mod:`sa_vision.models`, :mod:`sa_vision.checkpoint`, :mod:`sa_vision.data`, :mod:`sa_vision.evaluation`,
:mod:`sa_vision.recipes`, and :mod:`sa_vision.hub` for ``--export``. :mod:`sa_vision.reproduce` runs it in a
subprocess.
"""
import argparse
import importlib
import json
import logging
import os
import random
import sys
import time
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import yaml
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import timm
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ParseKwargs, dispatch_clip_grad, update_summary

from . import models  # noqa: F401  registers the models
from .checkpoint import (
    CHECKPOINT_VERSION, CheckpointError, atomic_torch_save, plain_data, read_checkpoint, strip_runtime_args)
from .data import create_image_dataset, normalization
from .evaluation import evaluate
from .recipes import load_recipe

_logger = logging.getLogger('train')

config_parser = argparse.ArgumentParser(description='Training config', add_help=False)
config_parser.add_argument('-c', '--config', default='', type=str, metavar='FILE',
                           help='YAML recipe (scripts/configs/<model>.yaml) whose values are argument defaults')

parser = argparse.ArgumentParser(description='Train sa_vision models with timm parts')
group = parser.add_argument_group('Dataset parameters')
group.add_argument('--data-dir', metavar='DIR', default=None,
                   help='dataset root: download target of torch/ datasets or the ImageFolder (train/, validation/)')
group.add_argument('--dataset', metavar='NAME', default='digits',
                   help="'digits' (offline, scikit-learn), 'fashion-mnist' (offline: Debian's dataset-fashion-mnist "
                        "or the four IDX files in --data-dir), 'torch/cifar10', or '' for an ImageFolder "
                        "(default: digits)")
group.add_argument('--train-split', metavar='NAME', default='train')
group.add_argument('--val-split', metavar='NAME', default='validation',
                   help='held-out split (torch/cifar10, fashion-mnist and digits map it to their test split; an '
                        'ImageFolder needs this subfolder)')
group.add_argument('--dataset-download', action='store_true', default=False,
                   help='download torch/ datasets that are not in --data-dir')

group = parser.add_argument_group('Model parameters')
group.add_argument('--model', default='sa_quadratic_cifar', type=str, metavar='MODEL')
group.add_argument('--pretrained', action='store_true', default=False, help='start from the published weights')
group.add_argument('--initial-checkpoint', default='', type=str, metavar='PATH',
                   help='start from these weights (any checkpoint, .safetensors or Hub folder of --model; '
                        'its stored architecture arguments are the defaults of --model-kwargs)')
group.add_argument('--resume', default='', type=str, metavar='PATH',
                   help='continue the run of this checkpoint (model, optimizer, schedule, epoch, RNG)')
group.add_argument('--num-classes', type=int, default=None, metavar='N')
group.add_argument('--img-size', type=int, default=None, metavar='N', help='image size (default: the model cfg)')
group.add_argument('-b', '--batch-size', type=int, default=100, metavar='N', help='batch size per process')
group.add_argument('-vb', '--validation-batch-size', type=int, default=None, metavar='N')
group.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs,
                   help='architecture arguments, e.g. --model-kwargs embed_dim=64 depth=2 (update the recipe\'s)')
group.add_argument('--device-modules', default=None, type=str, nargs='+',
                   help='python modules to import first (e.g. a package that registers models)')

group = parser.add_argument_group('Optimizer parameters')
group.add_argument('--opt', default='sgd', type=str, metavar='OPTIMIZER')
group.add_argument('--opt-eps', default=None, type=float, metavar='EPSILON')
group.add_argument('--momentum', type=float, default=0.9, metavar='M')
group.add_argument('--weight-decay', type=float, default=1e-4)
group.add_argument('--clip-grad', type=float, default=None, metavar='NORM')
group.add_argument('--clip-mode', type=str, default='norm')

group = parser.add_argument_group('Learning rate schedule parameters')
group.add_argument('--sched', type=str, default='cosine', metavar='SCHEDULER')
group.add_argument('--sched-on-updates', action=argparse.BooleanOptionalAction, default=True,
                   help='step the schedule per iteration (default) rather than per epoch')
group.add_argument('--lr', type=float, default=0.1, metavar='LR')
group.add_argument('--warmup-lr', type=float, default=0., metavar='LR')
group.add_argument('--min-lr', type=float, default=0., metavar='LR')
group.add_argument('--epochs', type=int, default=300, metavar='N')
group.add_argument('--warmup-epochs', type=float, default=15, metavar='N',
                   help='linear warm-up length in epochs (may be fractional: 5%% of all steps = 0.05 * epochs)')
group.add_argument('--warmup-prefix', action='store_true', default=False)
group.add_argument('--cooldown-epochs', type=int, default=0, metavar='N')
group.add_argument('--decay-milestones', default=[90, 180, 270], type=int, nargs='+', metavar='MILESTONES')
group.add_argument('--decay-rate', '--dr', type=float, default=0.1, metavar='RATE')

group = parser.add_argument_group('Augmentation and regularization parameters')
group.add_argument('--hflip', type=float, default=0.5, help='horizontal flip probability')
group.add_argument('--train-crop-padding', type=int, default=4,
                   help='zero padding before the random crop (SPEC 6); not an argument of timm train.py')
group.add_argument('--smoothing', type=float, default=0., help='label smoothing')
group.add_argument('--drop', type=float, default=None, metavar='PCT', help='dropout before the classifier')
group.add_argument('--drop-path', type=float, default=None, metavar='PCT', help='stochastic depth rate')

group = parser.add_argument_group('Device parameters')
group.add_argument('--device', default=None, type=str, help="'cuda', 'cpu', ... (default: cuda when present)")
group.add_argument('--amp', action=argparse.BooleanOptionalAction, default=None,
                   help='autocast mixed precision (default: on with CUDA, off on CPU)')
group.add_argument('--amp-dtype', default='bfloat16', type=str,
                   help="'bfloat16' (default) or 'float16' (with a gradient scaler)")
group.add_argument('--channels-last', action=argparse.BooleanOptionalAction, default=None,
                   help='channels-last memory layout (default: on with CUDA for models with real convolutions, '
                        'such as resnet18_cifar; see uses_channels_last)')
group.add_argument('--pin-mem', action=argparse.BooleanOptionalAction, default=None,
                   help='page-locked loader memory for faster host-to-device copies (default: on with CUDA)')
group.add_argument('--cudnn-benchmark', action='store_true', default=False,
                   help='let cuDNN time its convolution algorithms and keep the fastest: faster on CUDA, but the '
                        'choice may differ between processes, so a resumed run is no longer bit-exact')
group.add_argument('--tf32', action='store_true', default=False,
                   help='TensorFloat-32 float32 matrix products and convolutions on CUDA (Ampere and later): '
                        'faster, with a 10-bit mantissa in the products (default: off, full float32)')
group.add_argument('--retain-freed-memory', action=argparse.BooleanOptionalAction, default=None,
                   help='keep the memory a step frees in the process for the next step instead of returning it to '
                        'the kernel (glibc malloc; see retain_freed_memory). Default: on when training on the CPU')
group.add_argument('-j', '--workers', type=int, default=4, metavar='N', help='data loading processes')

group = parser.add_argument_group('Miscellaneous parameters')
group.add_argument('--seed', type=int, default=42, metavar='S')
group.add_argument('--log-interval', type=int, default=50, metavar='N', help='batches between log lines')
group.add_argument('--output', default='output/train', type=str, metavar='PATH', help='runs are written here')
group.add_argument('--experiment', default='', type=str, metavar='NAME', help='run folder name')
group.add_argument('--eval-metric', default='top1', type=str, metavar='EVAL_METRIC',
                   help="'top1', 'top5' (higher is better) or 'loss' (lower is better): which epoch is best")
group.add_argument('--save-epoch-weights', action='store_true', default=False,
                   help='also keep the weights of every epoch (<run>/epoch-NNN.safetensors, NNN = epochs done; '
                        '000 = the initialisation), e.g. for the centre trajectories of sa_vision.plots')
group.add_argument('--export', action='store_true', default=False,
                   help='after training, write a Hub folder (timm format + model card) to <run>/hub')
group.add_argument('--target-top1', type=float, default=None,
                   help='exit with status 1 if the final top-1 is below this (for smoke runs)')


def _parse_args(argv=None):
    args_config, remaining = config_parser.parse_known_args(argv)
    recipe = {}
    if args_config.config:
        recipe = load_recipe(args_config.config)
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(recipe) - known)
        if unknown:
            # timm's train.py takes these recipe keys; this script does not implement them
            print(f'note: recipe keys not used by this script: {unknown}', file=sys.stderr)
        parser.set_defaults(**{k: v for k, v in recipe.items() if k in known})
    args = parser.parse_args(remaining)
    # command-line --model-kwargs update the recipe's dict instead of replacing it
    args.model_kwargs = {**(recipe.get('model_kwargs') or {}), **args.model_kwargs}
    args.config = args_config.config
    return args, recipe


def _init_distributed(args):
    """Set args.device, rank, world_size; DDP under torchrun (nccl with CUDA, gloo on CPU)."""
    args.world_size = int(os.environ.get('WORLD_SIZE', 1))
    args.rank = int(os.environ.get('RANK', 0))
    args.local_rank = int(os.environ.get('LOCAL_RANK', 0))
    args.distributed = args.world_size > 1
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if torch.device(device).type == 'cuda':
        if args.distributed:  # one GPU per process, whatever index was asked for
            device = f'cuda:{args.local_rank}'
        device = str(torch.device(device))
        torch.cuda.set_device(torch.device(device))
    args.device = device
    if args.distributed:
        dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo')
    on_cuda = torch.device(device).type == 'cuda'
    args.amp = on_cuda if args.amp is None else args.amp
    args.pin_mem = on_cuda if args.pin_mem is None else args.pin_mem
    retain = getattr(args, 'retain_freed_memory', None)
    args.retain_freed_memory = (not on_cuda) if retain is None else retain


def configure_backends(args) -> None:
    """Set the process-wide cuDNN / TF32 switches from ``args``: all off unless asked for.

    ``cudnn.benchmark`` picks convolution algorithms by timing them, so two processes (a run and its resume)
    may compute with different algorithms and round differently; off, a resumed run repeats an uninterrupted
    one bit for bit. PyTorch allows TF32 convolutions by default; they are switched off with TF32 matmuls
    unless ``--tf32`` is given, so float32 means float32.
    """
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
    torch.backends.cudnn.allow_tf32 = bool(args.tf32)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters of glibc's malloc.h


def retain_freed_memory() -> bool:
    """Let the process keep the memory PyTorch frees on the CPU instead of returning it to the kernel (glibc only).

    PyTorch's CPU tensors come from ``malloc``. glibc serves a block above its mmap threshold (dynamic: 128 KiB,
    rising to at most 32 MiB) with a fresh ``mmap`` and unmaps it on ``free``, and it trims free memory above
    twice that threshold off the top of the heap. A training step allocates and frees the same large tensors
    every step, so each step faults every page of them in again, one 4 KiB page at a time: 72,000 page
    faults per step of the narrow SA model (embedding 64, batch 100) under bf16 autocast, none for the
    half-width ResNet18, whose tensors stay below the threshold (docs/performance.md). With both thresholds set
    (which also turns glibc's adjustment off) freed blocks stay in the heap and the next step reuses them.

    The process then keeps its peak memory until it exits. Returns False (and changes nothing) where the C
    library is not glibc.
    """
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc's; other C libraries number mallopt's parameters differently
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # 1 GiB: nothing a step allocates is mmapped; glibc before 2.35 refuses more than 32 MiB, still enough for
    # the bf16 tensors the narrow model frees
    mmapped = mallopt(_M_MMAP_THRESHOLD, 2 ** 30) or mallopt(_M_MMAP_THRESHOLD, 2 ** 25)
    return bool(mmapped and mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1))


def uses_channels_last(model: nn.Module, device) -> bool:
    """Default of ``--channels-last``: on CUDA, for models with a real convolution.

    cuDNN's fastest convolution kernels read channels-last tensors, so a convolutional network gains. A
    convolution whose kernel equals its stride (the 2x2 patch embedding of the SA models, a ViT's patch
    embedding) is a Linear layer per patch: a model with no other convolution has nothing to gain and
    pays for the layout copies.
    """
    if torch.device(device).type != 'cuda':
        return False
    return any(isinstance(m, nn.Conv2d) and tuple(m.kernel_size) != tuple(m.stride) for m in model.modules())


def _seed_epoch(seed: int, epoch: int, rank: int):
    """Reseed every RNG from (seed, epoch, rank): an epoch's augmentation and dropout do not depend on
    what ran before it, so resuming at an epoch boundary reproduces an uninterrupted run exactly."""
    s = seed + 1000003 * epoch + 7919 * rank
    random.seed(s)
    np.random.seed(s % 2 ** 32)
    torch.manual_seed(s)


def is_better(metric: str, value: float, best: float) -> bool:
    """Whether ``value`` of ``metric`` beats ``best``: lower is better for a loss, higher for accuracies."""
    return value < best if metric == 'loss' else value > best


def _log(args, msg):
    if args.rank == 0:
        _logger.info(msg)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, lr_scheduler, args, num_updates, amp_ctx,
                    loss_scaler=None, num_epochs=None):
    model.train()
    # the running loss stays on the device (sum of loss x images, images): reading it is a host sync, which
    # stalls the GPU's queue, so it is read only for the log lines
    loss_sum = torch.zeros((), dtype=torch.float64, device=args.device)
    loss_count = torch.zeros((), dtype=torch.float64, device=args.device)
    loss_avg = float('nan')
    start = batch_start = time.time()
    num_batches = len(loader)
    seen = 0
    for batch_idx, (images, targets) in enumerate(loader):
        images = images.to(args.device, non_blocking=True)
        targets = targets.to(args.device, non_blocking=True)
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with amp_ctx():
            loss = loss_fn(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        if loss_scaler is not None:  # float16: scale the loss so small gradients do not underflow
            loss_scaler.scale(loss).backward()
            if args.clip_grad is not None:
                loss_scaler.unscale_(optimizer)
                dispatch_clip_grad(model.parameters(), value=args.clip_grad, mode=args.clip_mode)
            loss_scaler.step(optimizer)
            loss_scaler.update()
        else:
            loss.backward()
            if args.clip_grad is not None:
                dispatch_clip_grad(model.parameters(), value=args.clip_grad, mode=args.clip_mode)
            optimizer.step()
        num_updates += 1
        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates)
        loss = loss.detach()
        loss_sum += loss.double() * images.size(0)
        loss_count += images.size(0)
        seen += images.size(0)
        last = batch_idx == num_batches - 1
        if last or (batch_idx + 1) % args.log_interval == 0:
            loss_val, loss_avg = torch.stack([loss.double(), loss_sum / loss_count]).tolist()  # the one host sync
            lr = optimizer.param_groups[0]['lr']
            now = time.time()
            rate = seen * args.world_size / max(now - batch_start, 1e-9)
            # time left in this run at this epoch's pace so far (evaluation not counted)
            batches_left = num_batches - batch_idx - 1 + ((num_epochs or epoch + 1) - epoch - 1) * num_batches
            eta = (now - start) / (batch_idx + 1) * batches_left
            _log(args,
                 f'Train: {epoch} [{batch_idx + 1:>4d}/{num_batches} ({100. * (batch_idx + 1) / num_batches:>3.0f}%)]  '
                 f'Loss: {loss_val:#.3g} ({loss_avg:#.3g})  LR: {lr:.3e}  {rate:>7.1f} img/s  '
                 f'ETA {_duration(eta)}')
            batch_start, seen = time.time(), 0
    return {'loss': loss_avg, 'lr': optimizer.param_groups[0]['lr'], 'time': time.time() - start}, num_updates


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    args, recipe = _parse_args(argv)
    _init_distributed(args)
    for module in args.device_modules or ():
        importlib.import_module(module)
    configure_backends(args)
    if args.retain_freed_memory and not retain_freed_memory():
        _log(args, '--retain-freed-memory: the C library is not glibc; freed memory is returned as usual')
        args.retain_freed_memory = False

    resume_ckpt, initial = None, None
    if args.resume:
        resume_ckpt = read_checkpoint(args.resume)
        if resume_ckpt.format != 'sa_vision' or 'optimizer' not in resume_ckpt.meta:
            raise CheckpointError(f'{args.resume} is a {resume_ckpt.format} checkpoint without the run state of '
                                  f'scripts/train.py; --resume continues runs of this script. To start from its '
                                  f'weights use --initial-checkpoint')
        if resume_ckpt.arch != args.model:
            _log(args, f'resuming {resume_ckpt.arch} from {args.resume} (ignoring --model {args.model})')
        args.model = resume_ckpt.arch
        # the run's model is fixed by the checkpoint: exactly what it was built with
        model_kwargs = dict(resume_ckpt.model_args)
    else:
        model_kwargs = {}
        if args.initial_checkpoint:
            initial = read_checkpoint(args.initial_checkpoint, arch=args.model)
            model_kwargs.update(initial.model_args)  # e.g. the heads a pruning kept
        model_kwargs.update(args.model_kwargs)
        for key, value in (('num_classes', args.num_classes), ('drop_rate', args.drop),
                           ('drop_path_rate', args.drop_path)):
            if value is not None:
                model_kwargs[key] = value
    args.model_kwargs = model_kwargs  # everything create_model gets: saved in checkpoints and the recipe

    _seed_epoch(args.seed, 0, args.rank)
    model = timm.create_model(args.model, pretrained=args.pretrained, **model_kwargs)
    if initial is not None:
        try:
            model.load_state_dict(initial.state_dict)
        except RuntimeError as e:
            raise CheckpointError(f'the weights of {args.initial_checkpoint} do not fit {args.model}({model_kwargs}): '
                                  f'{str(e).splitlines()[0]} ... drop the --model-kwargs that change the '
                                  f'architecture') from None
    num_params = sum(p.numel() for p in model.parameters())
    _log(args, f'Model {args.model} {model_kwargs or ""} created, {num_params:,} parameters')
    data_cfg = timm.data.resolve_data_config({'img_size': args.img_size} if args.img_size else {}, model=model)
    img_size = data_cfg['input_size'][-1]
    norm = normalization(args.dataset, data_cfg)

    if args.channels_last is None:
        args.channels_last = uses_channels_last(model, args.device)
    model.to(args.device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    optimizer = create_optimizer_v2(
        model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum,
        **({'eps': args.opt_eps} if args.opt_eps is not None else {}))  # honours model.no_weight_decay()

    ds_kwargs = dict(data_dir=args.data_dir, download=args.dataset_download, img_size=img_size, **norm)
    train_ds = create_image_dataset(args.dataset, args.train_split, is_training=True, hflip=args.hflip,
                                    crop_padding=args.train_crop_padding, **ds_kwargs)
    eval_ds = create_image_dataset(args.dataset, args.val_split, is_training=False, **ds_kwargs)
    # one sampler for 1 and N processes: the shuffle order depends only on (seed, epoch)
    train_sampler = DistributedSampler(
        train_ds, num_replicas=args.world_size, rank=args.rank, shuffle=True, seed=args.seed, drop_last=True)
    train_loader = DataLoader(
        train_ds, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers,
        pin_memory=args.pin_mem, drop_last=True, persistent_workers=False)
    if len(train_loader) == 0:
        raise ValueError(f'the training split has {len(train_ds)} images, fewer than one batch of '
                         f'{args.batch_size} x {args.world_size} processes; lower --batch-size')
    eval_indices = list(range(args.rank, len(eval_ds), args.world_size))  # disjoint shards, no padding
    eval_loader = DataLoader(
        torch.utils.data.Subset(eval_ds, eval_indices), batch_size=args.validation_batch_size or args.batch_size,
        shuffle=False, num_workers=args.workers, pin_memory=args.pin_mem)

    updates_per_epoch = len(train_loader)
    lr_scheduler, num_epochs = create_scheduler_v2(
        optimizer, sched=args.sched, num_epochs=args.epochs, decay_milestones=args.decay_milestones,
        decay_rate=args.decay_rate, min_lr=args.min_lr, warmup_lr=args.warmup_lr,
        warmup_epochs=args.warmup_epochs, warmup_prefix=args.warmup_prefix, cooldown_epochs=args.cooldown_epochs,
        step_on_epochs=not args.sched_on_updates, updates_per_epoch=updates_per_epoch)
    loss_fn = LabelSmoothingCrossEntropy(args.smoothing) if args.smoothing > 0 else nn.CrossEntropyLoss()
    amp_dtype = getattr(torch, args.amp_dtype)
    device_type = torch.device(args.device).type

    def amp_ctx():
        return torch.autocast(device_type, dtype=amp_dtype) if args.amp else nullcontext()

    # float16 needs loss scaling (its range underflows small gradients); bfloat16 has float32's range
    loss_scaler = torch.amp.GradScaler(device_type) if args.amp and amp_dtype == torch.float16 else None

    start_epoch, num_updates, history, best = 0, 0, [], None
    if resume_ckpt is not None:
        meta = resume_ckpt.meta
        model.load_state_dict(resume_ckpt.state_dict)
        optimizer.load_state_dict(meta['optimizer'])
        lr_scheduler.load_state_dict(meta['scheduler'])
        if loss_scaler is not None and meta.get('loss_scaler'):
            loss_scaler.load_state_dict(meta['loss_scaler'])
        start_epoch, num_updates = meta['epoch'], meta['num_updates']
        history, best = list(meta.get('history', [])), meta.get('best')
        run_dir = Path(args.resume).resolve().parent  # a resumed run continues in its own folder
        _log(args, f'Resuming {run_dir} at epoch {start_epoch}, update {num_updates}')
    else:
        name = args.experiment or '-'.join([
            datetime.now().strftime('%Y%m%d-%H%M%S'), args.model, (args.dataset or 'folder').replace('/', '_')])
        run_dir = Path(args.output) / name
    if args.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / 'args.yaml', 'w') as f:
            yaml.safe_dump(_plain_args(args), f, sort_keys=False)
        with open(run_dir / 'recipe.yaml', 'w') as f:  # -c recipe.yaml repeats this run
            yaml.safe_dump(strip_runtime_args(_plain_args(args)), f, sort_keys=False)
        _log(args, f'Run folder {run_dir}; {num_epochs} epochs of {updates_per_epoch} steps, '
                   f'{args.world_size} process(es) on {args.device}, amp={args.amp}')

    if args.save_epoch_weights and args.rank == 0 and start_epoch == 0:
        _save_epoch_weights(model, args, run_dir, 0)
    train_model = DistributedDataParallel(model) if args.distributed else model
    metrics = resume_ckpt.meta.get('metrics') if resume_ckpt else None
    for epoch in range(start_epoch, num_epochs):
        _seed_epoch(args.seed, epoch, args.rank)
        train_sampler.set_epoch(epoch)
        train_metrics, num_updates = train_one_epoch(
            epoch, train_model, train_loader, optimizer, loss_fn, lr_scheduler, args, num_updates, amp_ctx,
            loss_scaler, num_epochs)
        lr_scheduler.step(epoch + 1)
        metrics = evaluate(model, eval_loader, args.device, amp_ctx=amp_ctx, channels_last=args.channels_last,
                           distributed=args.distributed)
        _log(args, f'Eval: {epoch}  Loss: {metrics["loss"]:.4f}  Acc@1: {metrics["top1"]:.2f}  '
                   f'Acc@5: {metrics["top5"]:.2f}  ({metrics["num_images"]} images)')
        history.append({'epoch': epoch, 'train_loss': train_metrics['loss'], 'lr': train_metrics['lr'],
                        'train_time': train_metrics['time'],
                        **{f'eval_{k}': v for k, v in metrics.items()}})
        if best is None or is_better(args.eval_metric, metrics[args.eval_metric], best['metric']):
            best = {'metric': metrics[args.eval_metric], 'epoch': epoch}
        if args.rank == 0:
            ckpt = {
                'version': CHECKPOINT_VERSION,
                'arch': args.model,
                'model_args': dict(args.model_kwargs),
                'state_dict': model.state_dict(),
                'optimizer': optimizer.state_dict(),
                'scheduler': lr_scheduler.state_dict(),
                'epoch': epoch + 1,  # epochs completed
                'num_epochs': num_epochs,
                'num_updates': num_updates,
                'loss_scaler': loss_scaler.state_dict() if loss_scaler is not None else None,
                'args': _plain_args(args),
                'recipe': strip_runtime_args(_plain_args(args)),
                'data_config': {**norm, 'input_size': list(data_cfg['input_size'])},
                'metrics': metrics,
                'history': history,
                'best': best,
                'dataset': args.dataset,
            }
            if args.save_epoch_weights:
                _save_epoch_weights(model, args, run_dir, epoch + 1)
            atomic_torch_save(ckpt, run_dir / 'last.pth.tar')
            update_summary(epoch, train_metrics, metrics, run_dir / 'summary.csv', write_header=epoch == 0)
            _log(args, f'Saved checkpoint epoch {epoch + 1}/{num_epochs} to {run_dir / "last.pth.tar"}')
        if args.distributed:
            dist.barrier()

    if args.rank == 0 and metrics is not None:
        result = {'model': args.model, 'dataset': args.dataset or 'folder', 'epochs': num_epochs, **metrics,
                  'checkpoint': str(run_dir / 'last.pth.tar')}
        if args.export:
            from .hub import export_hub_folder
            export_dir = run_dir / 'hub'
            staged = export_hub_folder(run_dir / 'last.pth.tar', export_dir)
            result['hub_folder'] = str(export_dir)
            _log(args, f'Exported Hub folder {export_dir}: {", ".join(staged)}')
        _log(args, 'Result ' + json.dumps(result))
        _log(args, f'Top-1 on the {args.dataset or "folder"} {args.val_split} split: {metrics["top1"]:.2f}%  '
                   f'(checkpoint {run_dir / "last.pth.tar"})')
    if args.distributed:
        dist.destroy_process_group()
    if args.target_top1 is not None and metrics is not None and metrics['top1'] < args.target_top1:
        _log(args, f'top-1 {metrics["top1"]:.2f}% is below --target-top1 {args.target_top1}')
        sys.exit(1)


def _save_epoch_weights(model, args, run_dir: Path, epochs_done: int) -> None:
    """The weights after ``epochs_done`` epochs, with arch / model_args in the safetensors metadata."""
    from safetensors.torch import save_file
    state_dict = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tmp = run_dir / f'.epoch-{epochs_done:03d}.safetensors.tmp'
    metadata = {'arch': args.model, 'model_args': json.dumps(plain_data(args.model_kwargs))}
    save_file(state_dict, str(tmp), metadata=metadata)
    os.replace(tmp, run_dir / f'epoch-{epochs_done:03d}.safetensors')


def _plain_args(args):
    """The arguments as plain YAML/`weights_only`-safe values (the recipe actually used)."""
    return plain_data(dict(sorted(vars(args).items())))

if __name__ == '__main__':
    main()
