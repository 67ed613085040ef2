""" The machine a run trains on: threads, devices and DDP, backend switches, allocator, AMP probe

They decide the ``PROCESS_ARGS`` / ``RESOLVED_ARGS`` of :mod:`sa_vision.train.args` (measured: docs/performance.md).
"""
import contextlib
import ctypes
import ctypes.util
import functools
import importlib
import os
import statistics
import sys
import time
from typing import Optional

import torch
import torch.nn as nn
from timm.utils import init_distributed_device, random_seed

from ..errors import UserError

__all__ = [
    'TORCH_DEFAULT_THREADS', 'available_cores', 'default_threads', 'apply_threads', 'import_device_modules',
    'resolve_device', 'init_distributed', 'configure_backends', 'retain_freed_memory', 'uses_channels_last',
    'seed_epoch', 'synchronize', 'host_sync_allowed', 'CPU_AUTOCAST_MIN_SPEEDUP', 'cpu_autocast_speedup',
    'probe_size', 'resolve_amp',
]

# read before any command changes it: the default of --threads is this, capped at this process's cores
TORCH_DEFAULT_THREADS = torch.get_num_threads()


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, which a container or ``taskset`` narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> int:
    """torch's own thread count, capped at :func:`available_cores` (torch counts the machine's cores)."""
    return max(1, min(TORCH_DEFAULT_THREADS, available_cores()))


def apply_threads(args) -> int:
    """``torch.set_num_threads`` to ``args.threads``, or :func:`default_threads` when not given; returns the count."""
    threads = args.threads or default_threads()
    torch.set_num_threads(threads)
    return threads


def import_device_modules(modules) -> None:
    """Import ``--device-modules`` (as timm's train.py does, first): a package that registers models, datasets or a
    device type (a torch backend such as torch_npu), so before ``--device`` is resolved."""
    for module in modules or ():
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is None or not (module == e.name or module.startswith(e.name + '.')):  # its own import's: as is
                raise
            raise UserError(f'--device-modules {module}: no module {e.name!r} in this Python ({sys.executable}); '
                            f'install the package that provides it, or check the name') from None


def resolve_device(requested: Optional[str] = None) -> str:
    """The ``--device`` to run on: ``requested``, or cuda where present, else cpu (None, '' or 'auto'); a
    :class:`UserError` for a name torch does not know or a CUDA device this machine does not have."""
    if not requested or requested == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    try:
        device = torch.device(requested)
    except (RuntimeError, ValueError):
        raise UserError(f'--device {requested!r} is not a device torch knows; pass cpu, cuda or cuda:<index>, or '
                        f'drop --device (cuda where present, else cpu)') from None
    if device.type == 'cuda' and not torch.cuda.is_available():
        why = 'this torch is built without CUDA' if torch.version.cuda is None else 'no GPU or driver is found'
        raise UserError(f'--device {requested}: CUDA is not available here ({why}); drop --device or pass '
                        f'--device cpu')
    if device.type == 'meta':
        raise UserError('--device meta holds shapes, not values: nothing can be trained or evaluated there; drop '
                        '--device (cuda where present, else cpu) or pass --device cpu')
    if device.type not in ('cpu', 'cuda'):  # mps, xpu, hpu, xla, ...: known to torch, not necessarily here
        try:
            torch.empty(0, device=device)
        except (RuntimeError, ImportError, AssertionError, NotImplementedError) as e:
            raise UserError(f'--device {requested}: torch cannot place a tensor there ({str(e).split(". ")[0]}); '
                            f'drop --device (cuda where present, else cpu) or pass --device cpu. A backend of a '
                            f'package of its own needs it imported (--device-modules of sa-vision-train and -validate: '
                            f'habana_frameworks.torch for hpu, torch_xla for xla, ...)') from None
    if device.type == 'cuda' and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f'--device {requested}: this machine has {torch.cuda.device_count()} CUDA device(s), '
                        f'cuda:0 to cuda:{torch.cuda.device_count() - 1}')
    return requested


def init_distributed(args) -> None:
    """Set ``args.device`` (:func:`resolve_device`), ``rank``, ``world_size``, ``distributed`` (DDP under
    torchrun) and the device-dependent defaults of ``--pin-mem`` and ``--retain-freed-memory``."""
    args.device = resolve_device(args.device)
    init_distributed_device(args)
    on_cuda = torch.device(args.device).type == 'cuda'
    args.pin_mem = on_cuda if args.pin_mem is None else args.pin_mem
    retain = getattr(args, 'retain_freed_memory', None)
    args.retain_freed_memory = (not on_cuda) if retain is None else retain


def configure_backends(args) -> None:
    """A CUDA run's process-wide cuDNN / TF32 switches, all off unless asked for: with ``cudnn.benchmark`` a resumed
    run may round differently from an uninterrupted one, and with TF32 float32 is not float32. Elsewhere untouched."""
    if torch.device(args.device).type == 'cuda':
        torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(args.tf32)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters of glibc's malloc.h


def retain_freed_memory() -> bool:
    """Keep the memory PyTorch frees on the CPU in the process (glibc only; False where nothing changed): glibc
    unmaps large freed blocks, so every step faults their pages in again (docs/performance.md)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        mallopt = libc.mallopt
        _ = libc.gnu_get_libc_version  # other C libraries number mallopt's parameters differently
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # glibc before 2.35 refuses more than 32 MiB, still above the tensors a step of the narrow model frees
    mmapped = mallopt(_M_MMAP_THRESHOLD, 2 ** 30) or mallopt(_M_MMAP_THRESHOLD, 2 ** 25)
    return bool(mmapped and mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1))


def uses_channels_last(model: nn.Module, device) -> bool:
    """Default of ``--channels-last``: on CUDA, for models with a real convolution (a kernel-equals-stride patch
    embedding is a per-patch Linear and gains nothing from it)."""
    if torch.device(device).type != 'cuda':
        return False
    return any(isinstance(m, nn.Conv2d) and tuple(m.kernel_size) != tuple(m.stride) for m in model.modules())


def seed_epoch(seed: int, epoch: int, rank: int) -> None:
    """Reseed every RNG from (seed, epoch, rank): resuming at an epoch boundary repeats an uninterrupted run."""
    random_seed((seed + 1000003 * epoch + 7919 * rank) % 2 ** 32)  # numpy takes seeds below 2**32


def synchronize(device) -> None:
    """Wait for the device's queued work (CUDA, mps, any accelerator; a no-op on the CPU): before reading a clock."""
    device = torch.device(device)
    if device.type != 'cpu':
        torch.accelerator.synchronize(device)


@contextlib.contextmanager
def host_sync_allowed():
    """Where the training loop and evaluation read device values on purpose (a log line, the metrics): CUDA's sync
    debug mode (``torch.cuda.set_sync_debug_mode('error')``, which a check of the training step turns on) is off
    inside, so every other host sync in a step still raises."""
    mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
    if mode:
        torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        if mode:
            torch.cuda.set_sync_debug_mode(mode)


# --amp auto turns bf16 on on a CPU only from this probe speed-up: the matmuls are most but not all of a step
CPU_AUTOCAST_MIN_SPEEDUP = 1.3
# below this speed-up on a small probe, a CPU has no bf16 units (products are converted in software, measured 0.02x
# on an AMD EPYC without AVX-512): the full-size probe would only confirm it, at about 3 s per process there
CPU_AUTOCAST_EMULATED_BELOW = 0.25
CPU_AUTOCAST_SMALL_PROBE = (256, 256, 256)


@functools.lru_cache(maxsize=None)
def cpu_autocast_speedup(dtype: torch.dtype = torch.bfloat16, m: int = 1024, k: int = 512, n: int = 512,
                         min_seconds: float = 0.2) -> float:
    """How many times faster an (m x k) @ (k x n) matrix product runs on this CPU in ``dtype`` than in float32:
    measured, since a CPU flag says an instruction exists, not that PyTorch's kernels use it well. The two run in
    turn for ``min_seconds`` (at least 5 pairs), and the median of the pairs' ratios counts: a burst of other work
    on a shared machine slows a pair, not a whole dtype's block of products (which once turned bf16 off)."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    low = a.to(dtype), b.to(dtype)
    torch.mm(a, b), torch.mm(*low)  # first-call allocations and kernel selection
    ratios, spent = [], 0.
    while len(ratios) < 5 or spent < min_seconds and len(ratios) < 1000:
        start = time.perf_counter()
        torch.mm(a, b)
        middle = time.perf_counter()
        torch.mm(*low)
        end = time.perf_counter()
        ratios.append((middle - start) / max(end - middle, 1e-9))
        spent += end - start
    return statistics.median(ratios)


def probe_size(model: nn.Module, batch_size: int):
    """(m, k, n) of a matrix product like the model's widest Linear layer at this batch size (capped for speed)."""
    linears = [mod for mod in model.modules() if isinstance(mod, nn.Linear)]
    if not linears:
        return 1024, 512, 512
    widest = max(linears, key=lambda mod: mod.in_features * mod.out_features)
    return min(max(batch_size, 1) * 64, 4096), max(widest.in_features, 64), max(widest.out_features, 64)


def resolve_amp(requested, device, amp_dtype: str = 'bfloat16', matmul_size=(1024, 512, 512)):
    """(autocast on?, why) for ``--amp`` ``requested``: None is on with CUDA only; 'auto' is also on for a CPU
    where :func:`cpu_autocast_speedup` reaches ``CPU_AUTOCAST_MIN_SPEEDUP`` at ``matmul_size`` (m, k, n:
    :func:`probe_size` of the model). A small probe comes first: below ``CPU_AUTOCAST_EMULATED_BELOW`` it decides
    'off' alone."""
    device_type = torch.device(device).type
    if requested is True or requested is False:
        return requested, f'--amp {"on" if requested else "off"} asked for'
    if device_type == 'cuda':
        return True, f'--amp {requested or "default"}: on with CUDA'
    if requested is None:
        return False, f'--amp default: off on {device_type} (--amp auto measures whether {amp_dtype} pays here)'
    if device_type != 'cpu':
        return False, f'--amp auto: off on {device_type}'
    dtype = getattr(torch, amp_dtype)
    speedup = cpu_autocast_speedup(dtype, *CPU_AUTOCAST_SMALL_PROBE)
    if speedup >= CPU_AUTOCAST_EMULATED_BELOW:
        speedup = cpu_autocast_speedup(dtype, *matmul_size)
    else:
        matmul_size = CPU_AUTOCAST_SMALL_PROBE
    m, k, n = matmul_size
    verdict = 'on' if speedup >= CPU_AUTOCAST_MIN_SPEEDUP else 'off'
    return verdict == 'on', (f'--amp auto: {verdict}, a {m}x{k} @ {k}x{n} matrix product runs {speedup:.2f}x as fast '
                             f'in {amp_dtype} as in float32 on this CPU (on from {CPU_AUTOCAST_MIN_SPEEDUP}x)')
