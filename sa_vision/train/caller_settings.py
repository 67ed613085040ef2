""" The process-wide settings a command changes, given back to its caller once it returns (a notebook, a script
that trains twice): :func:`caller_settings_kept`. Imports no timm (its ``timm.optim`` sets dynamo's limits as it is
imported). """
import contextlib
import logging
from typing import Any, Dict

import torch
import torch._dynamo

__all__ = ['caller_settings_kept', 'RUN_LOG']

RUN_LOG = 'train'  # the logger of a run's lines, named as timm's train.py names its own


@contextlib.contextmanager
def caller_settings_kept(run_log: bool = True):
    """Give back the process-wide settings a command changes once it returns, also by an error: a notebook's or a
    script's that runs it in its own process (a console command's process ends anyway). torch's thread count, the
    cuDNN / TF32 switches, flushing subnormals and dynamo's limits of compiled copies; with ``run_log``, the root
    logger's handlers and level, the run's lines showing at INFO (under a logging the caller set up, or one of
    ``logging.basicConfig``, as timm's train.py sets up). glibc's malloc thresholds (``--retain-freed-memory``)
    stay: they cannot be read back."""
    run_log_lines = logging.getLogger(RUN_LOG)
    threads, switches, flushes = torch.get_num_threads(), _cuda_switches(), _flushes_subnormals()
    limits = {name: getattr(torch._dynamo.config, name) for name in ('cache_size_limit', 'recompile_limit')}
    root = logging.getLogger()
    handlers, levels = list(root.handlers), (root.level, run_log_lines.level)
    if run_log and handlers:
        run_log_lines.setLevel(logging.INFO)
    elif run_log:
        logging.basicConfig(level=logging.INFO, format='%(message)s')
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        _give_back_cuda_switches(switches)
        if _flushes_subnormals() != flushes:
            torch.set_flush_denormal(flushes)
        for name, limit in limits.items():
            setattr(torch._dynamo.config, name, limit)
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(levels[0])
        run_log_lines.setLevel(levels[1])


def _cuda_switches() -> Dict[str, Any]:
    """The switches ``sa_vision.train.runtime.configure_backends`` sets, as torch's new ``fp32_precision`` strings
    (always readable) and as its legacy flags (None where torch refuses to read one: the caller mixed the two APIs)."""
    backends = torch.backends
    return dict(benchmark=backends.cudnn.benchmark, strings=(
        backends.cuda.matmul.fp32_precision, backends.cudnn.conv.fp32_precision, backends.cudnn.rnn.fp32_precision),
        matmul=_readable(lambda: backends.cuda.matmul.allow_tf32), cudnn=_readable(lambda: backends.cudnn.allow_tf32),
        precision=_readable(torch.get_float32_matmul_precision))


def _readable(read):
    try:
        return read()
    except RuntimeError:
        return None


def _give_back_cuda_switches(saved: Dict[str, Any]) -> None:
    """Only where a run changed them (a CUDA run), each through the API the caller's reads: a legacy setting written
    through the new API, or the reverse, makes torch's getters of the other raise. A switch the caller left to its
    parent ('none') is written back as that, which keeps the legacy getters readable."""
    backends, now = torch.backends, _cuda_switches()
    backends.cudnn.benchmark = saved['benchmark']
    if {**now, 'benchmark': None} == {**saved, 'benchmark': None}:
        return
    matmul, conv, rnn = saved['strings']
    if saved['matmul'] is not None and matmul != 'none':
        backends.cuda.matmul.allow_tf32 = saved['matmul']
    if saved['precision'] is not None:  # after allow_tf32, which sets it too ('medium' reads as its 'high')
        torch.set_float32_matmul_precision(saved['precision'])
    if saved['matmul'] is None or matmul == 'none':  # last: set_float32_matmul_precision writes this string too
        backends.cuda.matmul.fp32_precision = matmul
    if saved['cudnn'] is None or 'none' in (conv, rnn):
        backends.cudnn.conv.fp32_precision, backends.cudnn.rnn.fp32_precision = conv, rnn
    else:
        backends.cudnn.allow_tf32 = saved['cudnn']


def _flushes_subnormals() -> bool:
    return bool(torch.tensor([1e-39]) * 1.0 == 0)  # torch has no getter for set_flush_denormal
