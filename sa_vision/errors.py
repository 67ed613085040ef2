""" Errors a user can cause (:class:`UserError`, a ``ValueError``), and the one place the command-line scripts
report them: :func:`run_cli` prints ``error: <message>`` without a traceback and exits with status 2; and the
commands' entry point (:func:`command`), which also spares their exit a second of CPU (:func:`freeze_at_exit`) """
import atexit
import contextlib
import errno
import gc
import os
import re
import signal
import sys
import threading
from typing import Callable, Optional, Sequence

__all__ = ['UserError', 'RecipeError', 'RecipeNotFoundError', 'DatasetError', 'DatasetNotFoundError',
           'TrainingDiverged', 'Terminated', 'SIGTERM_ENDS_QUIETLY', 'USAGE_ERROR_STATUS', 'INTERRUPTED_STATUS',
           'TERMINATED_STATUS', 'READER_GONE_STATUS', 'first_launched_process', 'write_failure', 'out_of_memory',
           'run_cli', 'command_name', 'command', 'freeze_at_exit']

USAGE_ERROR_STATUS = 2  # as argparse exits on a bad command line
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended
TERMINATED_STATUS = 128 + signal.SIGTERM  # 143, as a shell reports a command that SIGTERM ended
READER_GONE_STATUS = 141  # 128 + SIGPIPE, as a shell reports a command whose output's reader ended (| head)


class UserError(ValueError):
    """Something the user asked for cannot be done as asked: the message says what and how to fix it."""


class RecipeError(UserError):
    """A recipe (``-c``) or the arguments of a run are inconsistent or name unknown keys."""


class RecipeNotFoundError(RecipeError, FileNotFoundError):
    """A recipe name that is neither a YAML file nor a shipped recipe."""


class Terminated(KeyboardInterrupt):
    """SIGTERM reached a command (a cluster's scheduler preempting or ending a job, ``timeout``, ``kill``): it ends
    as Ctrl-C ends it, each file whole, saying what it left and how to go on; a subclass of KeyboardInterrupt, so
    that what ends cleanly on Ctrl-C (a DataLoader's workers, a reproduction's trainings) ends so on it too."""


# set for the commands a process starts that it ends with SIGTERM, saying itself what they left (a reproduction's
# trainings): they end on it as on Ctrl-C, their DataLoader's workers too, without advice of their own
SIGTERM_ENDS_QUIETLY = 'SA_VISION_SIGTERM_ENDS_QUIETLY'


def _terminate(signum, frame):
    # a DataLoader's workers die of the same SIGTERM where it reached the process group (timeout, a scheduler): their
    # deaths, reported by torch's SIGCHLD handler while the run unwinds, are no error of the run's
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    raise Terminated()


class DatasetError(UserError):
    """A dataset name, folder or file that cannot be read as asked."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset folder or file that does not exist."""


class TrainingDiverged(UserError):
    """The training or evaluation loss is no longer a number (NaN or inf): the weights are lost from there."""


def first_launched_process() -> bool:
    """Whether this process is the first of those torchrun (or SLURM) launched, or the only one: known from the
    environment, before any process group is set up (timm's ``world_info_from_env``)."""
    from timm.utils.distributed import is_distributed_env, world_info_from_env
    return not is_distributed_env() or world_info_from_env()[1] == 0


# a write the system refused: a full disk or quota, a file too large, a read-only or forbidden place
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)
# torch.save's words for a write that failed (they name no errno: a full disk is "unexpected pos", a folder gone
# "Parent directory ... does not exist"), and safetensors' (the OS error's code, in Rust's words)
_TORCH_WRITE_FAILED = ('inline_container', 'PytorchStreamWriter', 'Parent directory')
_SAFETENSORS_OS_ERROR = re.compile(r'\(os error (\d+)\)')


def write_failure(error: BaseException) -> Optional[str]:
    """What stopped a file from being written (or read: a permission), in words, where ``error`` is an access the
    system refused (a full disk, a file size limit, a read-only or vanished folder, no permission); None for any
    other error, a fault to see whole."""
    if isinstance(error, OSError):
        if error.errno not in _WRITE_ERRNOS:
            return None
        advice = _write_advice(error.errno)
        return f'{error.strerror}: {error.filename} ({advice})' if error.filename else f'{error.strerror} ({advice})'
    text = (str(error).strip().splitlines() or [''])[0]
    if type(error).__name__ == 'SafetensorError':
        code = _SAFETENSORS_OS_ERROR.search(str(error))
        if code is None:
            return None
        code = int(code.group(1))
        return f'{os.strerror(code)}, writing a safetensors file ({_write_advice(code)})'
    if isinstance(error, RuntimeError) and any(words in text for words in _TORCH_WRITE_FAILED):
        return f'torch.save: {text[:200]} ({_write_advice(None)})'
    return None


def _write_advice(code: Optional[int]) -> str:
    """How to mend a write refused with errno ``code`` (None: not known, as torch.save does not say)."""
    if code == errno.EROFS:
        return 'write elsewhere'
    if code in (errno.EACCES, errno.EPERM):  # a permission may be a read's too (of a recipe, say)
        return 'mend its permissions, or use another place'
    return 'make room, or write elsewhere'  # no room, or a folder gone (safetensors' ENOENT)


def out_of_memory(error: BaseException) -> Optional[str]:
    """A memory request the system or the GPU refused, in words with what needs less, or None: a size the user
    chose (the batch, the images; the dense kinds grow with the image size squared)."""
    text = (str(error).strip().splitlines() or [''])[0]
    refused = isinstance(error, MemoryError) or type(error).__name__ == 'OutOfMemoryError' or (
        isinstance(error, RuntimeError) and "can't allocate memory" in text)  # torch's CPU allocator's words
    if not refused:
        return None
    return (f'out of memory ({text or type(error).__name__}). A smaller --batch-size or --img-size needs less; the '
            f'generalized and content kinds grow with the image size squared, the quadratic and learned ones far '
            f'less (docs/performance.md, "Where each kind stops fitting")')


def run_cli(main: Callable[[Optional[Sequence[str]]], Optional[int]], argv: Optional[Sequence[str]] = None) -> int:
    """Run a script's ``main(argv)``: its status (``None`` is 0), 2 after printing a :class:`UserError` or a write
    the system refused, 130 on Ctrl-C, 143 on SIGTERM (:func:`command` makes it :class:`Terminated`), 141 where the
    output's reader has gone (:class:`_Stdout`)."""
    try:
        status = main(argv) or 0
        if sys.stdout is not None:  # None: started with its output closed (>&-)
            sys.stdout.flush()  # what is left of the output, whose reader may be gone
        return status
    except UserError as e:
        print(f'error: {e}', file=sys.stderr)
        return USAGE_ERROR_STATUS
    except Exception as e:  # noqa: BLE001  of the rest, only a write the system refused is the user's to mend
        if _reader_gone(e):
            return READER_GONE_STATUS
        reason = write_failure(e) or out_of_memory(e)
        if reason is None:
            raise
        print(f'error: {reason}', file=sys.stderr)
        return USAGE_ERROR_STATUS
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: what it left, where a command says (timm's train.py says nothing)
        terminated = isinstance(e, Terminated)
        if first_launched_process() and not (terminated and os.environ.get(SIGTERM_ENDS_QUIETLY)):
            # the signal reaches every process torchrun started: one says it
            print(f'{"terminated (SIGTERM)" if terminated else "interrupted"}{": " + str(e) if str(e) else ""}',
                  file=sys.stderr)
        return TERMINATED_STATUS if terminated else INTERRUPTED_STATUS


class _Stdout:
    """A command's ``sys.stdout``, which marks a write its reader refused (``| head`` has read its lines): that
    error, however wrapped, ends the command quietly (:func:`_reader_gone`), where a broken pipe of anything else
    (a socket, a worker's pipe) stays an error. The rest is the stream's own."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        with self._marked():
            return self._stream.write(text)

    def flush(self):
        with self._marked():
            return self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)

    @contextlib.contextmanager
    def _marked(self):
        try:
            yield
        except BrokenPipeError as e:
            e.stdout_reader_gone = True
            raise


def _reader_gone(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a write to this command's stdout that its reader
    refused (:class:`_Stdout`): then the command ends quietly, as Unix tools do, its output sent nowhere from then on
    (Python's own flush at exit would fail again). The commands write their files before they print."""
    seen = set()
    while error is not None and not getattr(error, 'stdout_reader_gone', False) and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    if error is None or id(error) in seen:
        return False
    try:
        nowhere = os.open(os.devnull, os.O_WRONLY)
        os.dup2(nowhere, sys.stdout.fileno())
        os.close(nowhere)
    except (OSError, ValueError, AttributeError):  # no file to point elsewhere (a test's stream)
        pass
    return True


def freeze_at_exit() -> None:
    """Leave the objects alive at this process's exit out of the garbage collections of the interpreter's exit.

    The exit clears the modules and collects garbage again and again, walking torch's, sympy's and timm's objects
    each time: about a second of CPU per process on a CI core. Frozen (``gc.freeze``) they are left out; atexit
    handlers, flushing and closing files run as before. Done by an atexit handler, so it happens only at the
    process's exit, and once however often it is asked for.
    """
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def command_name(module_name: str) -> Optional[str]:
    """The installed command (``sa-vision-train``) whose ``cli`` is in module ``module_name`` (``__main__`` under
    ``python -m``: its spec's name), read from the package's entry points; None where none is installed."""
    from importlib.metadata import entry_points
    spec = getattr(sys.modules.get(module_name), '__spec__', None)
    name = spec.name if spec is not None else module_name
    return next((ep.name for ep in entry_points(group='console_scripts')
                 if ep.module == name and ep.attr == 'cli'), None)


def command(module_name: str) -> Callable[[], int]:
    """The installed command of the module ``module_name`` (``cli = command(__name__)``): its ``main`` through
    :func:`run_cli`, looked up when called, so ``python -m`` (``__main__``) and a patched ``main`` are what run."""
    def cli() -> int:
        # argparse names the program after sys.argv[0]: under python -m that is the module's file (train.py)
        sys.argv[0] = command_name(module_name) or sys.argv[0]
        if hasattr(sys.stdout, 'reconfigure'):  # a path or class name no encoding of the output holds (ascii)
            sys.stdout.reconfigure(errors='backslashreplace')
        if sys.stdout is not None and not isinstance(sys.stdout, _Stdout):
            sys.stdout = _Stdout(sys.stdout)
        freeze_at_exit()
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # not where a caller handles it
            signal.signal(signal.SIGTERM, _terminate)
        return run_cli(sys.modules[module_name].main)
    return cli
