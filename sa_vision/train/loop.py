""" Training: a sa_vision model (or any timm model) with timm's library parts, no timm checkout needed

``sa-vision-train`` (:mod:`sa_vision.cli.train`, which adds ``--export``) runs :func:`main`.

Reads the recipes of ``sa_vision/configs`` (``-c``) in the argument names of timm's ``train.py``; command-line
arguments override the recipe. Offline quick start (digits from scikit-learn, a small model, ~2 min on 2 CPUs):

    sa-vision-train -c sa_quadratic_cifar_digits --export

CIFAR-10 with the paper's recipe (GPU: CUDA and bf16 autocast are used automatically, channels-last for
convolutional models):

    sa-vision-train -c sa_quadratic_cifar --data-dir data --dataset-download

Multi-process: ``torchrun --nproc_per_node N -m sa_vision.cli.train ...`` (DDP; gloo on CPU, nccl on GPU).
``--resume <run>/last.pth.tar`` continues a run exactly where its last completed epoch ended, with the run's own
arguments (saved in the checkpoint; explicit command-line options override them and are logged).
``--initial-checkpoint`` starts from weights of any kind (``sa-vision-prune`` output, a timm train.py checkpoint,
safetensors, a Hub folder); the architecture arguments stored with them are the defaults of ``--model-kwargs``.
A run's ``recipe.yaml`` (written beside its checkpoint and into exports) repeats it: ``-c recipe.yaml``.
"""
import argparse
import ast
import difflib
import functools
import importlib
import inspect
import json
import logging
import os
import random
import statistics
import sys
import textwrap
import time
from contextlib import contextmanager, nullcontext
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np
import timm
import torch
import torch.distributed as dist
import torch.nn as nn
import yaml
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ParseKwargs, dispatch_clip_grad, update_summary
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from .. import models  # noqa: F401  registers the models
from ..errors import RecipeError, UserError, run_cli
from ..models import param_groups_pos_lr
from .checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointError,
    atomic_torch_save,
    plain_data,
    read_checkpoint,
    strip_runtime_args,
)
from .data import check_dataset, create_image_dataset, normalization, split_name
from .evaluation import evaluate
from .recipes import RECIPE_DIR, check_recipe_keys, load_recipe

_logger = logging.getLogger('train')

# torch's own intra-op thread count (OMP_NUM_THREADS, else one per physical core it sees), read before any command
# changes it: the default of --threads is this, capped at the cores this process may run on
TORCH_DEFAULT_THREADS = torch.get_num_threads()


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, which a container or ``taskset`` narrows; the
    machine's count where the platform has no ``sched_getaffinity``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> int:
    """The default of ``--threads``: torch's own count, never more than :func:`available_cores` (torch counts the
    machine's cores, not those of this process, and threads beyond them only wait for each other)."""
    return max(1, min(TORCH_DEFAULT_THREADS, available_cores()))


def add_threads_argument(parser_or_group) -> None:
    """``--threads N`` (torch's compute threads), the same in every command that computes: see :func:`apply_threads`."""
    parser_or_group.add_argument(
        '--threads', type=int, default=None, metavar='N',
        help=f"torch's compute threads (default: torch's own count, capped at the cores this process may run on: "
             f"{default_threads()} here). 1 where other work keeps a core busy: waiting threads then slow every "
             f"product down (as OMP_NUM_THREADS=1)")


def apply_threads(args) -> int:
    """``torch.set_num_threads`` to ``args.threads``, or :func:`default_threads` when not given; returns the count."""
    threads = args.threads or default_threads()
    torch.set_num_threads(threads)
    return threads


config_parser = argparse.ArgumentParser(description='Training config', add_help=False)
config_parser.add_argument(
    '-c', '--config', default='', type=str, metavar='NAME|FILE',
    help='recipe whose values are argument defaults: the name of one shipped in the package '
         f'(sa_vision/configs/NAME.yaml: {", ".join(sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")))}) or a YAML '
         'file, such as the recipe.yaml of a run or an export')

# -c is parsed first, by config_parser; the main parser lists it too, so that --help shows it
parser = argparse.ArgumentParser(description='Train sa_vision models with timm parts', parents=[config_parser])
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
group.add_argument('--pos-lr-scale', type=float, default=1.0, metavar='SCALE',
                   help='learning-rate multiplier of the positional parameters (Gaussian centres and spreads, the '
                        'learned kind\'s tables): their own optimizer groups follow the schedule at SCALE x lr '
                        '(sa_vision.models.param_groups_pos_lr; default 1: one learning rate). Not a timm train.py '
                        'argument; a resumed run keeps its checkpoint\'s scale')
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
                   help='zero padding before the random crop (paper App. A.4); not an argument of timm train.py')
group.add_argument('--smoothing', type=float, default=0., help='label smoothing')
group.add_argument('--drop', type=float, default=None, metavar='PCT', help='dropout before the classifier')
group.add_argument('--drop-path', type=float, default=None, metavar='PCT', help='stochastic depth rate')

group = parser.add_argument_group('Device parameters')
group.add_argument('--device', default=None, type=str, help="'cuda', 'cpu', ... (default: cuda when present)")


def _amp_request(value):
    """``--amp`` value: True / False, or 'auto' (decided on the machine that runs, see resolve_amp)."""
    if isinstance(value, bool) or value is None:
        return value
    text = str(value).strip().lower()
    if text == 'auto':
        return 'auto'
    if text in ('1', 'true', 'on', 'yes'):
        return True
    if text in ('0', 'false', 'off', 'no'):
        return False
    raise argparse.ArgumentTypeError(f"--amp takes 'auto', 'on' or 'off', got {value!r}")


group.add_argument('--amp', nargs='?', const=True, default=None, type=_amp_request, metavar='auto|on|off',
                   help="autocast mixed precision: --amp (on), --no-amp (float32) or --amp auto (on with CUDA; on a "
                        "CPU only where a short matmul probe measures --amp-dtype faster than float32, see "
                        "cpu_autocast_speedup). Default: on with CUDA, off on a CPU. recipe.yaml keeps what was asked, "
                        "args.yaml and the log what was used and why")
group.add_argument('--no-amp', dest='amp', action='store_const', const=False, help='float32 (as --amp off)')


def _torchcompile_request(value):
    """``--torchcompile`` value: a backend name, 'auto', or None for eager ('off' / 'none', to override a recipe)."""
    text = '' if value is None or value is False else str(value).strip()
    if text.lower() in ('off', 'none', 'false', '0', ''):
        return None
    return 'auto' if text.lower() == 'auto' else text


group.add_argument('--torchcompile', nargs='?', const='inductor', default=None, type=_torchcompile_request,
                   metavar='BACKEND|auto|off',
                   help="torch.compile the training step (timm train.py's option; default backend inductor; 'off' "
                        "trains eagerly whatever the recipe says). 'auto': "
                        "compile with inductor and keep it only where a short probe measures the model's training "
                        "step at least 1.1x as fast as eager on this machine (see compile_speedup); a compilation "
                        "that fails falls back to eager. Evaluation runs eager. args.yaml and the log say what was "
                        "used and why")
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
add_threads_argument(group)

group = parser.add_argument_group('Miscellaneous parameters')
group.add_argument('--seed', type=int, default=42, metavar='S')
group.add_argument('--log-interval', type=int, default=50, metavar='N', help='batches between log lines')
group.add_argument('--output', default='output/train', type=str, metavar='PATH', help='runs are written here')
group.add_argument('--experiment', default='', type=str, metavar='NAME', help='run folder name')
group.add_argument('--eval-metric', default='top1', type=str, metavar='EVAL_METRIC',
                   help="'top1', 'top5' (higher is better) or 'loss' (lower is better): which epoch is best")
group.add_argument('--save-epoch-weights', action='store_true', default=False,
                   help='also keep the weights of every epoch (<run>/epoch-NNN.safetensors, NNN = epochs done; '
                        '000 = the initialisation), e.g. for the centre trajectories of sa_vision.research.plots')
group.add_argument('--export', action='store_true', default=False,
                   help='after training, write a Hub folder (timm format + model card) to <run>/hub')
group.add_argument('--target-top1', type=float, default=None,
                   help='exit with status 1 if the final top-1 is below this (for smoke runs)')


# arguments of a run that --resume does not take from the run: they are this process's (or resolved for this machine)
_NOT_RESUMED = frozenset({'config', 'resume', 'rank', 'world_size', 'local_rank', 'distributed', 'device', 'pin_mem',
                          'channels_last', 'retain_freed_memory', 'threads'})


_resume_parser = argparse.ArgumentParser(add_help=False)
_resume_parser.add_argument('--resume', default='')


def _parse_args(argv=None):
    """(args, recipe) of a command line; see :func:`_parse_run_args`."""
    args, recipe, _ = _parse_run_args(argv)
    return args, recipe


@contextmanager
def _parser_defaults_restored():
    """Leave the parser's defaults as they were: parse_args may run more than once in a process (tests, reproduce)."""
    saved_defaults = dict(parser._defaults)
    saved_action_defaults = [(a, a.default) for a in parser._actions]
    try:
        yield
    finally:
        parser._defaults.clear()
        parser._defaults.update(saved_defaults)
        for a, default in saved_action_defaults:
            a.default = default


def _explicit_dests(argv) -> set:
    """The argument names given on the command line ``argv`` itself (not defaults, recipe or resumed values)."""
    with _parser_defaults_restored():
        for a in parser._actions:
            a.default = argparse.SUPPRESS
        parser._defaults.clear()
        return set(vars(parser.parse_args(argv)))


def _parse_run_args(argv=None):
    """(args, recipe, resume checkpoint or None) of a command line.

    Defaults, lowest first: the parser's, the recipe's (``-c``), and with ``--resume`` the arguments the run was
    started with (saved in its checkpoint): a resumed run continues as it was configured, whatever recipe is given.
    Options given explicitly on the command line win over all of them; with ``--resume``, those that differ from
    the run are listed in
    ``args.resume_changes`` (logged by :func:`main`).
    """
    args_config, remaining = config_parser.parse_known_args(argv)
    known = {a.dest for a in parser._actions}
    recipe = {}
    if args_config.config:
        recipe = load_recipe(args_config.config)
        ignored = check_recipe_keys(recipe, known, source=f'recipe {args_config.config}')
        if ignored:
            print(f'note: recipe keys that only timm\'s train.py reads, ignored here: {ignored}', file=sys.stderr)
    defaults = {k: v for k, v in recipe.items() if k in known}
    resume_ckpt, run_args = None, {}
    resume = _resume_parser.parse_known_args(remaining)[0].resume
    if resume:
        resume_ckpt = read_checkpoint(resume)
        if resume_ckpt.format != 'sa_vision' or 'optimizer' not in resume_ckpt.meta:
            raise CheckpointError(f'{resume} is a {resume_ckpt.format} checkpoint without the run state of '
                                  f'sa-vision-train; --resume continues runs of this script. To start from its '
                                  f'weights use --initial-checkpoint')
        run_args = _saved_run_args(resume_ckpt, resume)
        defaults.update({k: v for k, v in run_args.items() if k in known and k not in _NOT_RESUMED})
    with _parser_defaults_restored():
        parser.set_defaults(**defaults)
        args = parser.parse_args(remaining)
    # command-line --model-kwargs update the recipe's dict instead of replacing it
    args.model_kwargs = {**(defaults.get('model_kwargs') or {}), **args.model_kwargs}
    args.config = args_config.config
    args.resume_changes = {}
    if resume_ckpt is not None:
        explicit = _explicit_dests(remaining)
        for key in sorted(explicit - _NOT_RESUMED - {'model_kwargs'}):
            if key in run_args and plain_data(getattr(args, key)) != run_args[key]:
                args.resume_changes[key] = (run_args[key], plain_data(getattr(args, key)))
    return args, recipe, resume_ckpt


@functools.lru_cache(maxsize=None)
def timm_scheduler_names() -> Tuple[str, ...]:
    """The ``--sched`` names timm's ``create_scheduler_v2`` takes: the strings its source compares ``sched`` with
    (read with ``ast``, so they follow the installed timm); () where its source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(create_scheduler_v2))
    except (OSError, TypeError):
        return ()
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == 'sched':
            names.update(c.value for comparator in node.comparators for c in ast.walk(comparator)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return tuple(sorted(names))


def check_scheduler(sched: str, sched_on_updates: bool) -> None:
    """A :class:`RecipeError` for a ``--sched`` timm does not know (naming the ones it does) or a schedule it cannot
    step as asked; run before anything is built, where timm would only fail at the end of the first epoch."""
    known = timm_scheduler_names()
    if known and sched not in known:
        near = difflib.get_close_matches(sched, known, n=1, cutoff=0.6)
        raise RecipeError(f'--sched {sched!r} is not a scheduler of timm' + (f' (did you mean {near[0]!r}?)' if near
                          else '') + f'; timm\'s schedulers are {", ".join(known)}')
    if sched == 'plateau' and sched_on_updates:
        raise RecipeError("--sched plateau lowers the lr when the evaluation metric stops improving, once per epoch: "
                          "add --no-sched-on-updates (the recipe's sched_on_updates: false)")


def _saved_run_args(ckpt, path) -> dict:
    """The arguments a run was started with: its checkpoint's, else the ``args.yaml`` beside it."""
    saved = ckpt.meta.get('args')
    if not saved:
        args_file = Path(path).resolve().parent / 'args.yaml'
        if not args_file.is_file():
            raise CheckpointError(f'{path} holds no training arguments and there is no args.yaml beside it: '
                                  f'--resume cannot tell how the run was configured')
        with open(args_file) as f:
            saved = yaml.safe_load(f) or {}
    return {k: v for k, v in saved.items() if k not in ('amp_used', 'amp_reason')}


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


# bf16 autocast on a CPU must beat float32 by this factor in the probe to be chosen by --amp auto: the matmuls are
# most but not all of a training step (the casts, softmaxes and norms do not speed up), so a small edge in the probe
# could be a loss in the step
CPU_AUTOCAST_MIN_SPEEDUP = 1.3


@functools.lru_cache(maxsize=None)
def cpu_autocast_speedup(dtype: torch.dtype = torch.bfloat16, m: int = 1024, k: int = 512, n: int = 512,
                         repeats: int = 5) -> float:
    """How many times faster an (m x k) @ (k x n) matrix product runs on this CPU in ``dtype`` than in float32.

    Measured rather than read from CPU flags: a flag (``avx512_bf16``, ``amx_bf16``) says that an instruction
    exists, not that PyTorch's kernels use it or that it is fast; an Intel CPU without AMX runs bf16 products at
    about half the float32 rate, an AMD Zen 5 at about four times it. Best of ``repeats`` timings after one
    warm-up, at the current ``torch.get_num_threads()``; cached per process (about 0.1 s at the default size).
    """
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)

    def best_time(x, y):
        torch.mm(x, y)  # warm-up: first-call allocations and kernel selection
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(x, y)
            times.append(time.perf_counter() - start)
        return min(times)
    return best_time(a, b) / best_time(a.to(dtype), b.to(dtype))


def _probe_size(model: nn.Module, batch_size: int):
    """(m, k, n) of a matrix product like the model's widest Linear layer at this batch size (capped for speed)."""
    linears = [mod for mod in model.modules() if isinstance(mod, nn.Linear)]
    if not linears:
        return 1024, 512, 512
    widest = max(linears, key=lambda mod: mod.in_features * mod.out_features)
    return min(max(batch_size, 1) * 64, 4096), max(widest.in_features, 64), max(widest.out_features, 64)


def resolve_amp(requested, device, amp_dtype: str = 'bfloat16', probe_size=(1024, 512, 512)):
    """(autocast on?, why) for the ``--amp`` value ``requested``: True, False, None (default) or 'auto'.

    None: on with CUDA, off elsewhere (as before 'auto' existed). 'auto': on with CUDA; on a CPU only if
    :func:`cpu_autocast_speedup` measures ``amp_dtype`` at least ``CPU_AUTOCAST_MIN_SPEEDUP`` times faster than
    float32; off on other devices.
    """
    device_type = torch.device(device).type
    if requested is True or requested is False:
        return requested, f'--amp {"on" if requested else "off"} asked for'
    if device_type == 'cuda':
        return True, f'--amp {requested or "default"}: on with CUDA'
    if requested is None:
        return False, f'--amp default: off on {device_type} (--amp auto measures whether {amp_dtype} pays here)'
    if device_type != 'cpu':
        return False, f'--amp auto: off on {device_type}'
    speedup = cpu_autocast_speedup(getattr(torch, amp_dtype), *probe_size)
    m, k, n = probe_size
    verdict = 'on' if speedup >= CPU_AUTOCAST_MIN_SPEEDUP else 'off'
    return verdict == 'on', (f'--amp auto: {verdict}, a {m}x{k} @ {k}x{n} matrix product runs {speedup:.2f}x as fast '
                             f'in {amp_dtype} as in float32 on this CPU (on from {CPU_AUTOCAST_MIN_SPEEDUP}x)')


# --torchcompile auto keeps the compiled step only from this measured speed-up: a few percent in a probe of a
# few steps is within the noise of a shared machine, and compiled code is harder to debug and profile
COMPILE_MIN_SPEEDUP = 1.1


def _sync(device) -> None:
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)


def compile_speedup(model: nn.Module, compiled: Callable, images: torch.Tensor, targets: torch.Tensor,
                    loss_fn: Callable, amp_ctx: Callable, rounds: int = 3, steps: int = 2) -> float:
    """How many times faster ``compiled`` runs a training forward and backward of ``(images, targets)`` than
    ``model`` itself (eager).

    Measured on the machine that trains, because the answer depends on it: the narrow SA model's bf16 step ran
    1.27-1.37x as fast compiled on an Intel Xeon with AMX and 0.76x on an AMD EPYC (Zen 5; docs/performance.md). The
    first compiled calls compile (forward and backward); then eager and compiled are timed alternately, ``steps``
    each, and the median of ``rounds`` ratios is returned. The weights, buffers (batch-norm statistics),
    gradients and RNG state are restored afterwards, so the probe leaves the run as it found it. Raises whatever
    compilation raises.
    """
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rng_state = torch.get_rng_state()
    cuda_rng_states = torch.cuda.get_rng_state_all() if images.device.type == 'cuda' else None

    def step(fn):
        with amp_ctx():
            loss = loss_fn(fn(images), targets)
        loss.backward()

    def timed(fn) -> float:
        _sync(images.device)
        start = time.perf_counter()
        for _ in range(steps):
            step(fn)
        _sync(images.device)
        return time.perf_counter() - start

    model.train()
    try:
        for fn in (model, compiled, compiled):  # warm-up; the first compiled step compiles forward and backward
            step(fn)
        return statistics.median(timed(model) / timed(compiled) for _ in range(rounds))
    finally:
        model.load_state_dict(state)
        for p in model.parameters():
            p.grad = None
        torch.set_rng_state(rng_state)
        if cuda_rng_states is not None:
            torch.cuda.set_rng_state_all(cuda_rng_states)


def resolve_torchcompile(requested: Optional[str], model: nn.Module, probe: Callable[[Callable], float]):
    """(the callable that trains, backend used or False, why) for the ``--torchcompile`` value ``requested``.

    None: eager. A backend name: ``torch.compile(model, backend=requested)``. 'auto': compiled with inductor if
    ``probe(compiled)`` (:func:`compile_speedup` in training) measures at least ``COMPILE_MIN_SPEEDUP``, else eager,
    also when compiling fails (no C++ compiler, an operator inductor cannot lower).
    """
    if not requested:
        return model, False, 'eager (no --torchcompile)'
    if requested != 'auto':
        return torch.compile(model, backend=requested), requested, f'--torchcompile {requested} asked for'
    compiled = torch.compile(model, backend='inductor')
    try:
        speedup = probe(compiled)
    except Exception as e:  # noqa: BLE001 -- whatever stops compilation, 'auto' trains eagerly and says why
        torch.compiler.reset()
        first_line = (str(e).strip().splitlines() or [''])[0][:200]
        return model, False, f'--torchcompile auto: eager, compiling failed ({type(e).__name__}: {first_line})'
    verdict = speedup >= COMPILE_MIN_SPEEDUP
    return (compiled if verdict else model), ('inductor' if verdict else False), (
        f'--torchcompile auto: {"compiled (inductor)" if verdict else "eager"}, the compiled training step ran '
        f'{speedup:.2f}x as fast as eager in a probe on this machine (compiled from {COMPILE_MIN_SPEEDUP}x)')


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
        _ = libc.gnu_get_libc_version  # glibc's; other C libraries number mallopt's parameters differently
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


def main(argv=None, export: Optional[Callable[[Path, Path], List[str]]] = None):
    """Train as the command line says; ``export(checkpoint, folder)`` writes the Hub folder of ``--export``
    (``sa_vision.cli.train`` passes ``sa_vision.hub.export_hub_folder``: the Hub is a tier above training)."""
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    args, recipe, resume_ckpt = _parse_run_args(argv)
    if args.export and export is None:
        raise UserError('--export writes a Hub folder, which this entry point cannot: run sa-vision-train '
                        '(python -m sa_vision.cli.train) instead')
    # the arguments that would only fail once the model and the data are built, checked before either
    check_scheduler(args.sched, args.sched_on_updates)
    check_dataset(args.dataset, data_dir=args.data_dir, download=args.dataset_download,
                  train_split=args.train_split, eval_split=args.val_split)
    threads = apply_threads(args)
    _init_distributed(args)
    for module in args.device_modules or ():
        importlib.import_module(module)
    configure_backends(args)
    _log(args, f'Threads: {threads} (--threads {args.threads or "default"})')
    if args.retain_freed_memory and not retain_freed_memory():
        _log(args, '--retain-freed-memory: the C library is not glibc; freed memory is returned as usual')
        args.retain_freed_memory = False

    initial = None
    if resume_ckpt is not None:
        if args.resume_changes:
            _log(args, 'resuming with changed arguments: ' + ', '.join(
                f'{k} {old!r} -> {new!r}' for k, (old, new) in args.resume_changes.items()))
        if args.config:
            _log(args, f'resuming: the run\'s own arguments take precedence over -c {args.config}')
        if resume_ckpt.arch != args.model:
            _log(args, f'resuming {resume_ckpt.arch} from {args.resume} (ignoring --model {args.model})')
        args.model = resume_ckpt.arch
        # the run's model is fixed by the checkpoint: exactly what it was built with
        model_kwargs = dict(resume_ckpt.model_args)
        # and so are its optimizer groups: the positional groups and their lr_scale are in the saved optimizer state
        saved_scale = (resume_ckpt.meta.get('args') or {}).get('pos_lr_scale', 1.0)
        if saved_scale != args.pos_lr_scale:
            _log(args, f'resuming with the run\'s --pos-lr-scale {saved_scale} (ignoring {args.pos_lr_scale})')
        args.pos_lr_scale = saved_scale
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
        _load_initial_weights(model, initial, args, model_kwargs)
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
    # timm's weight-decay groups (model.no_weight_decay() honoured), the positional parameters in groups of their own
    # with lr_scale = --pos-lr-scale, which timm's schedulers multiply into the scheduled lr on every step
    optimizer = create_optimizer_v2(
        model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum,
        param_group_fn=partial(param_groups_pos_lr, weight_decay=args.weight_decay, pos_lr_scale=args.pos_lr_scale),
        **({'eps': args.opt_eps} if args.opt_eps is not None else {}))

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
        raise UserError(f'the training split has {len(train_ds)} images, fewer than one batch of '
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
        step_on_epochs=not args.sched_on_updates, updates_per_epoch=updates_per_epoch,
        plateau_mode='min' if args.eval_metric == 'loss' else 'max')  # None for --sched none: the optimizer's lr
    loss_fn = LabelSmoothingCrossEntropy(args.smoothing) if args.smoothing > 0 else nn.CrossEntropyLoss()
    amp_dtype = getattr(torch, args.amp_dtype)
    device_type = torch.device(args.device).type
    # args.amp stays what was asked (recipe.yaml: -c on another machine decides again); the choice made here and why
    # go to the log, args.yaml and the checkpoint's args
    use_amp, args.amp_reason = resolve_amp(args.amp, args.device, args.amp_dtype,
                                           _probe_size(model, args.batch_size))
    args.amp_used = args.amp_dtype if use_amp else False
    _log(args, f'Precision: {"autocast " + args.amp_dtype if use_amp else "float32"} ({args.amp_reason})')

    def amp_ctx():
        return torch.autocast(device_type, dtype=amp_dtype) if use_amp else nullcontext()

    # float16 needs loss scaling (its range underflows small gradients); bfloat16 has float32's range
    loss_scaler = torch.amp.GradScaler(device_type) if use_amp and amp_dtype == torch.float16 else None

    start_epoch, num_updates, history, best = 0, 0, [], None
    if resume_ckpt is not None:
        meta = resume_ckpt.meta
        model.load_state_dict(resume_ckpt.state_dict)
        optimizer.load_state_dict(meta['optimizer'])
        if lr_scheduler is not None:
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
    # torch.compile after DDP, as timm's train.py does; evaluation and checkpoints use the model itself
    ddp_model = DistributedDataParallel(model) if args.distributed else model
    train_model, args.torchcompile_used, args.torchcompile_reason = resolve_torchcompile(
        args.torchcompile, ddp_model, partial(_probe_compile, ddp_model, args, data_cfg, loss_fn, amp_ctx))
    _log(args, f'Compilation: {args.torchcompile_reason}')
    if args.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / 'args.yaml', 'w') as f:
            yaml.safe_dump(_plain_args(args), f, sort_keys=False)
        with open(run_dir / 'recipe.yaml', 'w') as f:  # -c recipe.yaml repeats this run
            yaml.safe_dump(_run_recipe(args), f, sort_keys=False)
        _log(args, f'Run folder {run_dir}; {num_epochs} epochs of {updates_per_epoch} steps, '
                   f'{args.world_size} process(es) on {args.device}, amp={args.amp_used}')

    if args.save_epoch_weights and args.rank == 0 and start_epoch == 0:
        _save_epoch_weights(model, args, run_dir, 0)
    metrics = resume_ckpt.meta.get('metrics') if resume_ckpt else None
    for epoch in range(start_epoch, num_epochs):
        _seed_epoch(args.seed, epoch, args.rank)
        train_sampler.set_epoch(epoch)
        train_metrics, num_updates = train_one_epoch(
            epoch, train_model, train_loader, optimizer, loss_fn, lr_scheduler, args, num_updates, amp_ctx,
            loss_scaler, num_epochs)
        metrics = evaluate(model, eval_loader, args.device, amp_ctx=amp_ctx, channels_last=args.channels_last,
                           distributed=args.distributed)
        if lr_scheduler is not None:  # plateau decides on the evaluation metric; the others ignore it
            lr_scheduler.step(epoch + 1, metrics[args.eval_metric] if args.sched == 'plateau' else None)
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
                'scheduler': lr_scheduler.state_dict() if lr_scheduler is not None else None,
                'epoch': epoch + 1,  # epochs completed
                'num_epochs': num_epochs,
                'num_updates': num_updates,
                'loss_scaler': loss_scaler.state_dict() if loss_scaler is not None else None,
                'args': _plain_args(args),
                'recipe': _run_recipe(args),
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
        result = {'model': args.model, 'dataset': args.dataset or 'folder',
                  'split': split_name(args.dataset, args.val_split), 'epochs': num_epochs, **metrics,
                  'amp': args.amp_used, 'amp_reason': args.amp_reason, 'torchcompile': args.torchcompile_used,
                  'checkpoint': str(run_dir / 'last.pth.tar')}
        if args.export:
            export_dir = run_dir / 'hub'
            staged = export(run_dir / 'last.pth.tar', export_dir)
            result['hub_folder'] = str(export_dir)
            _log(args, f'Exported Hub folder {export_dir}: {", ".join(staged)}')
        _log(args, 'Result ' + json.dumps(result))
        _log(args, f'Top-1 on the {args.dataset or "folder"} {split_name(args.dataset, args.val_split)} split: '
                   f'{metrics["top1"]:.2f}%  '
                   f'(checkpoint {run_dir / "last.pth.tar"})')
    if args.distributed:
        dist.destroy_process_group()
    if args.target_top1 is not None and metrics is not None and metrics['top1'] < args.target_top1:
        _log(args, f'top-1 {metrics["top1"]:.2f}% is below --target-top1 {args.target_top1}')
        sys.exit(1)


def _probe_compile(model: nn.Module, args, data_cfg, loss_fn, amp_ctx, compiled) -> float:
    """:func:`compile_speedup` on a random batch of the run's shape (the timing does not depend on the data);
    with several processes every rank probes (DDP's collectives need them all) and rank 0's figure decides."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch_size, *data_cfg['input_size'], generator=gen).to(args.device)
    if args.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    num_classes = getattr(model.module if args.distributed else model, 'num_classes', 1) or 1
    targets = torch.randint(0, num_classes, (args.batch_size,), generator=gen).to(args.device)
    speedup = compile_speedup(model, compiled, images, targets, loss_fn, amp_ctx)
    if args.distributed:
        shared = [speedup]
        dist.broadcast_object_list(shared, src=0)
        speedup = shared[0]
    return speedup


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


# what a run resolved on its machine or process (written to args.yaml and the log), not what it asked for
_RESOLVED_ARGS = ('amp_used', 'amp_reason', 'torchcompile_used', 'torchcompile_reason', 'resume_changes')
# this machine's, like RUNTIME_ARGS: left out of recipe.yaml
_MACHINE_ARGS = ('threads',)


def _run_recipe(args) -> dict:
    """The run's recipe.yaml: the training arguments as asked (``amp: auto`` stays 'auto'), no machine fields,
    and the weights a fine-tune started from (without them ``-c recipe.yaml`` would train from scratch)."""
    recipe = {k: v for k, v in strip_runtime_args(_plain_args(args)).items()
              if k not in _RESOLVED_ARGS and k not in _MACHINE_ARGS}
    if args.initial_checkpoint:
        recipe['initial_checkpoint'] = str(args.initial_checkpoint)
    return recipe


def _load_initial_weights(model: nn.Module, initial, args, model_kwargs) -> None:
    """Load ``--initial-checkpoint`` into ``model``; with another ``--num-classes``, everything but the classifier.

    As timm does when ``num_classes`` differs from the pretrained weights: the classifier keeps its fresh
    initialisation (logged), every other tensor must fit.
    """
    state_dict = dict(initial.state_dict)
    stored_classes = initial.model_args.get('num_classes')
    classifier = (getattr(model, 'pretrained_cfg', None) or {}).get('classifier')
    if stored_classes is not None and stored_classes != model_kwargs.get('num_classes', stored_classes) and classifier:
        dropped = [k for k in state_dict if k.startswith(classifier + '.')]
        for key in dropped:
            del state_dict[key]
        _log(args, f'--num-classes {model_kwargs["num_classes"]}: {args.initial_checkpoint} was trained for '
                   f'{stored_classes} classes; its classifier ({", ".join(dropped)}) is left out and trained from its '
                   f'initialisation')
        model_keys = {k for k in model.state_dict() if k.startswith(classifier + '.')}
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        if set(missing) - model_keys or unexpected:
            raise CheckpointError(f'the weights of {args.initial_checkpoint} do not fit {args.model}({model_kwargs}) '
                                  f'beyond the classifier: missing {sorted(set(missing) - model_keys)[:5]}, '
                                  f'unexpected {sorted(unexpected)[:5]}')
        return
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as e:
        first = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e).splitlines()[0])
        raise CheckpointError(f'the weights of {args.initial_checkpoint} do not fit {args.model}({model_kwargs}): '
                              f'{first}. Drop the --model-kwargs that change the architecture') from None

if __name__ == '__main__':
    sys.exit(run_cli(main))
