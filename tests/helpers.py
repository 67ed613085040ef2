""" What several test modules share: the model lists (derived from the registry), float32 on a GPU, the hang limit,
a new file's mode and the loading of a probe script """
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import resource
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator, List, Tuple

import torch

from sa_vision.models import DEFAULT_MODEL_OF_KIND, MODEL_NAMES, SA_MODEL_ARGS
from sa_vision.paper import PAPER_RESULTS

# the wall-clock limit of every subprocess a test runs (subprocess.run, Popen.wait) and of the browser's page load:
# it only catches hangs and is no speed check. A test's speed depends on how busy the machine is (two shared cores,
# nice 19 beside a training run); what a test asserts never does, so this is many times the longest run's time.
HANG_TIMEOUT_S = 1800


def sigint_as_from_a_terminal() -> None:
    """A test process's ``preexec_fn`` before it is sent the Ctrl-C of a terminal (SIGINT): a command in a
    terminal's foreground takes it, where one that a non-interactive shell started in its background (``pytest
    ... &``, and what that starts) inherits it ignored, and would not see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def load_script(path: Path) -> ModuleType:
    """A script that is no package module (docs/probes/...), loaded as a module named after its file."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command(name: str) -> List[str]:
    """The argv that runs the installed command ``sa-vision-<name>`` (``python -m sa_vision.cli.<name>``)."""
    return [sys.executable, '-m', f'sa_vision.cli.{name}']


def command_here(capture, name: str, *args) -> Tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``sa-vision-<name> args`` run in this process as the installed command runs
    it (``run_cli``: a user's error is one line and status 2, anything else raises); ``capture`` is pytest's capsys,
    or capfd to see the output of the processes it starts too. A process of its own costs ~7 s of imports on a CI
    core: a test runs the installed command itself only where the process is what it checks."""
    from sa_vision.errors import run_cli
    capture.readouterr()
    with keeping_threads():
        status = run_cli(importlib.import_module(f'sa_vision.cli.{name}').main, list(map(str, args)))
    return (status, *capture.readouterr())


@contextlib.contextmanager
def keeping_threads() -> Iterator[None]:
    """torch's thread count as it was before the block: a command's ``--threads`` is its process's, and a command
    run in this process must not leave it to the tests after it."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def logged_here(caplog, capture, name: str, *args) -> Tuple[int, str]:
    """(exit status, log) of ``sa-vision-<name> args`` run in this process (:func:`command_here`): the messages it
    logs (INFO and up, as the installed command prints them; a training's), then what it printed."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        status, out, err = command_here(capture, name, *args)
    return status, ''.join(f'{record.getMessage()}\n' for record in caplog.records) + out + err


def run_result(output: str) -> dict:
    """The result sa-vision-train prints on stdout (a JSON line) at the end of ``output``."""
    return json.loads([line for line in output.splitlines() if line.startswith('{"model": ')][-1])


def train_here(caplog, capture, *args) -> Tuple[int, str]:
    """:func:`logged_here` of ``sa-vision-train --threads 1 args``: one thread, as the tests' training processes
    run (OMP_NUM_THREADS=1), so that a run here and one in a process compare bitwise."""
    return logged_here(caplog, capture, 'train', '--threads', 1, *args)


SA_MODELS = tuple(SA_MODEL_ARGS)  # every registered attention model
ALL_MODELS = MODEL_NAMES  # the attention models, then the ResNet baseline: every model the package registers
PAPER_TABLE_MODELS = tuple(PAPER_RESULTS)  # the models of the paper's table (Table 1), in its order
# the content-free Gaussian and learned kinds with a registered model of their own (not the pruned copy)
CONTENT_FREE_MODELS = tuple(name for kind, name in DEFAULT_MODEL_OF_KIND.items() if kind != 'content')
GAUSSIAN_MODELS = tuple(name for name in CONTENT_FREE_MODELS
                        if SA_MODEL_ARGS[name].get('attn_kind', 'quadratic') in ('quadratic', 'generalized'))


@contextlib.contextmanager
def file_size_limit(size: int):
    """Writes past ``size`` bytes of any file fail in this process (EFBIG, as on a full disk), as the system refuses
    them: RLIMIT_FSIZE, with SIGXFSZ ignored so that the write fails rather than the process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Full float32 matrix products and convolutions on CUDA inside the block (TF32 off, restored on exit).

    cuDNN runs float32 convolutions in TF32 by default on Ampere and later GPUs, so ``nn.Conv2d`` itself is then
    only accurate to ~1e-3. No effect on the CPU, which has no TF32.
    """
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def fashion_mnist_test_images(count: int):
    """The first ``count`` Fashion-MNIST test images as PIL RGB images, as timm's ImageDataset opens image files
    (``Image.open(f).convert('RGB')``), and their labels, read from the IDX files with numpy (not sa_vision)."""
    import gzip
    from pathlib import Path

    import numpy as np
    from PIL import Image

    from sa_vision.train.datasets import FASHION_MNIST_DIR

    def read(stem, header):
        path = next(p for p in Path(FASHION_MNIST_DIR).iterdir() if p.name.split('.')[0] == stem)
        data = gzip.open(path).read() if path.suffix == '.gz' else path.read_bytes()
        return np.frombuffer(data, dtype=np.uint8, offset=header)
    images = read('t10k-images-idx3-ubyte', 16).reshape(-1, 28, 28)[:count]
    labels = read('t10k-labels-idx1-ubyte', 8)[:count]
    return [Image.fromarray(img).convert('RGB') for img in images], torch.tensor(labels.astype('int64'))


def usual_file_mode() -> int:
    """The mode open() gives a new file under this process's umask (0644 under the usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def untraceable_autocast_availability(monkeypatch) -> None:
    """``torch.amp.is_autocast_available`` made a graph break, as dynamo before torch 2.14 has it (an H100 with torch
    2.11 failed ``fullgraph`` there): compiled code that asks it breaks its graph, and fails under ``fullgraph``."""
    ask = torch.amp.is_autocast_available

    def asked(device_type: str) -> bool:
        torch._dynamo.graph_break()
        return ask(device_type)
    monkeypatch.setattr(torch.amp, 'is_autocast_available', asked)


BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2**-7: bf16 keeps 8 bits of mantissa


def assert_bf16_close(out, ref, grads, ref_grads, params) -> None:
    """A bf16 autocast output and float32 gradients against a float32 reference, each within 4 bf16 epsilons (3.1 %)
    of its largest value. Measured over 40 seeds of the attention tests (an AMD CPU with avx512_bf16): outputs
    within 0.8 %, gradients within 1.0 % (5 % of the largest value and of each, allowed before, was 6-10x that)."""
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=4 * BF16_EPS * ref.abs().max().item())
    for g, rg, p in zip(grads, ref_grads, params):
        assert g.dtype == p.dtype
        torch.testing.assert_close(g, rg, rtol=0, atol=4 * BF16_EPS * rg.abs().max().item())
