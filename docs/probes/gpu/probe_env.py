"""What the GPU scripts (``device_check.py``, ``zoo_gpu_long.py``, ``eval_fault.py``, ``ablation_gpu_long.py``)
share: the timm they need, checked before ``import sa_vision``; the versions and the commit they log; the
Fashion-MNIST folder they read, unpacked from what travelled; their output sent to a file that subprocesses
inherit; what they save when ``timeout`` stops them.

Imports nothing heavy at the top: :func:`require_timm` runs before torch and sa_vision are imported.
"""
import contextlib
import importlib.metadata
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Callable, Dict, Optional

ROOT = Path(__file__).resolve().parents[3]
WHEEL_RECIPE = 'docs/probes/gpu/README.md, "timm and the commit"'  # where the runbook says how to carry the right timm
FASHION_MNIST = ROOT / 'data' / 'fashion-mnist'  # the four IDX files the scripts read by default
# what travels instead: the same four files xz-compressed, 26.4 MB where Debian's .gz files take 30.9, which the
# tracked tree of 2026-11-26 (34.3 MB) and timm's wheel (2.8 MB) leave no room for under the 64 MiB that travel
FASHION_MNIST_XZ = ROOT / 'data' / 'fashion-mnist-xz'


def fashion_mnist_dir(unpacked: Path = FASHION_MNIST, packed: Path = FASHION_MNIST_XZ) -> Optional[str]:
    """The Fashion-MNIST folder the scripts read by default: ``unpacked``, made first from ``packed`` (its
    ``*.xz`` files decompressed to the IDX files sa_vision reads) where only that travelled; None where neither is
    here. Two scripts started together may both unpack: each into a folder of its own, the first one renamed in
    place wins."""
    if unpacked.is_dir():
        return str(unpacked)
    if not packed.is_dir():
        return None
    partial = Path(tempfile.mkdtemp(prefix=unpacked.name + '.', dir=unpacked.parent))
    for source in sorted(packed.glob('*.xz')):
        with lzma.open(source) as f, open(partial / source.stem, 'wb') as out:
            shutil.copyfileobj(f, out)
    try:
        partial.rename(unpacked)
    except OSError:  # the other script's is in place
        shutil.rmtree(partial)
    return str(unpacked)


def timm_requirement(pyproject: Path = ROOT / 'pyproject.toml') -> str:
    """The version range of timm that sa_vision declares (its one place: ``pyproject.toml``), e.g. ``>=1.0.31,<1.1``."""
    match = re.search(r'"timm\s*([<>=!~][^";]*)"', pyproject.read_text(encoding='utf-8'))
    if not match:
        raise RuntimeError(f'{pyproject} names no timm version range')
    return match.group(1).strip()


def timm_problem(installed: Optional[str], required: str) -> Optional[str]:
    """Why the installed timm (None: not installed) cannot run sa_vision, in one line; None where it can."""
    from packaging.specifiers import SpecifierSet
    if installed is not None and installed in SpecifierSet(required):
        return None
    return (f'timm {installed or "(not installed)"} is outside sa_vision\'s range timm{required} (pyproject.toml): '
            f'carry a wheel of the right one ({WHEEL_RECIPE}) and put it first on PYTHONPATH')


def require_timm() -> None:
    """Stop at once, with one line, where the timm found is outside pyproject's range (before ``import
    sa_vision``, which would fail somewhere inside timm's private helpers)."""
    try:
        installed: Optional[str] = importlib.metadata.version('timm')
    except importlib.metadata.PackageNotFoundError:
        installed = None
    problem = timm_problem(installed, timm_requirement())
    if problem:
        print(f'STOPPED: {problem}', file=sys.stderr, flush=True)
        sys.exit(2)


def commit() -> Optional[str]:
    """The checkout's commit: ``SA_VISION_COMMIT`` (the copy sent to a lent GPU has no ``.git``: the runbook's
    command names the hash), else ``git rev-parse``; None where neither says."""
    if os.environ.get('SA_VISION_COMMIT'):
        return os.environ['SA_VISION_COMMIT']
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return None


def versions() -> Dict[str, Optional[str]]:
    """What ran: Python, torch (and its CUDA), triton, timm, the commit."""
    import platform

    import timm
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = 'not installed'
    return {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,
            'triton': triton_version, 'timm': timm.__version__,
            'commit': commit() or 'unknown (no SA_VISION_COMMIT, no git)'}


@contextlib.contextmanager
def redirect_fds(path: Path):
    """Send this process's and its children's stdout and stderr to ``path`` (the training subprocesses inherit the
    file descriptors, not ``sys.stdout``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, 'ab') as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


# a SIGTERM that on_sigterm's handler put off while a file was written (sigterm_deferred): how deep such writes are
# nested, and the handler's work, run once the outermost ends
_deferred = {'depth': 0, 'pending': None}


@contextlib.contextmanager
def sigterm_deferred():
    """Inside the block (or the function it decorates), :func:`on_sigterm`'s handler waits for the block's end. For
    a file written whole and renamed over the last (a tar, the JSON) that the handler's ``save()`` writes again:
    Python runs the handler in the main thread between two steps of the write, so its own copy would be renamed
    over the interrupted one, whose buffered bytes then land in it as its file closes. For the main thread only."""
    _deferred['depth'] += 1
    try:
        yield
    finally:
        _deferred['depth'] -= 1
        if not _deferred['depth'] and _deferred['pending']:
            pending, _deferred['pending'] = _deferred['pending'], None
            pending()


# the exit status of the SIGTERM that on_sigterm's handler took, kept in case its SystemExit is lost
_stopped_status: Dict[str, Optional[int]] = {'status': None}


def exit_if_stopped() -> None:
    """Raise the SystemExit of a SIGTERM already handled (:func:`on_sigterm`) where it was lost: the handler runs
    wherever the main thread is, and an exception raised in a finaliser (``__del__``, a weakref callback, of which
    torch has many) is only printed. The handler ignores the signals after its first, so nothing else ends the
    process then."""
    if _stopped_status['status'] is not None:
        raise SystemExit(_stopped_status['status'])


@contextlib.contextmanager
def on_sigterm(save: Callable[[], None]):
    """Inside the block, SIGTERM (``timeout``'s first signal; its ``-k 20`` sends SIGKILL 20 s later) runs ``save()``
    to leave what there is to bring back (once a :func:`sigterm_deferred` block running then has ended), then ends
    the process with SIGTERM's status (143) through the ``finally`` blocks that end subprocesses. The handler
    before is restored on leaving; a block that ends after a SIGTERM whose exit was lost ends with it then
    (:func:`exit_if_stopped`)."""
    def end(signum):
        _stopped_status['status'] = 128 + signum
        try:
            save()
        except BaseException:  # noqa: BLE001  the exit below would hide why what comes back is stale
            traceback.print_exc()
        finally:
            raise SystemExit(_stopped_status['status'])

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once; timeout signals its whole process group
        if _deferred['depth']:
            _deferred['pending'] = lambda: end(signum)
        else:
            end(signum)
    _stopped_status['status'] = None
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
        exit_if_stopped()
    finally:
        signal.signal(signal.SIGTERM, previous)
