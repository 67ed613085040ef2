""" The training processes of a reproduction: each dies with the process that started it, its output tagged where
several run side by side, all of them stopped at once by :meth:`Trainings.stop` """
import contextlib
import os
import signal
import subprocess
import sys
import threading
from typing import Callable, List, Optional, Set

from ..errors import SIGTERM_ENDS_QUIETLY

__all__ = ['Trainings', 'die_with_parent', 'run_training']


class Trainings:
    """The training processes running (stages side by side run several), which :meth:`stop` ends."""

    def __init__(self):
        self.lock, self.stopped = threading.Lock(), threading.Event()
        self.running: Set[subprocess.Popen] = set()

    def stop(self, wait_s: float = 10.0) -> None:
        """SIGTERM to every training, then up to ``wait_s`` for them to end (their files whole: each is written
        atomically)."""
        with self.lock:
            self.stopped.set()
            running = list(self.running)
            for proc in running:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait_s)

    @contextlib.contextmanager
    def holding(self, proc: subprocess.Popen):
        with self.lock:
            self.running.add(proc)
            if self.stopped.is_set():  # stopped between the stage's check and this start
                proc.terminate()
        try:
            yield
        finally:
            with self.lock:
                self.running.discard(proc)


def run_training(cmd: List[str], tag: Optional[str], trainings: Optional[Trainings] = None) -> int:
    """Run a training process to its end (or until ``trainings`` is stopped): its output goes to ours, each line
    after ``tag`` where one is given."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', **{SIGTERM_ENDS_QUIETLY: '1'})  # the reproduction says it
    piped = {} if tag is None else dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors='replace')
    # a session of its own: the terminal's Ctrl-C reaches the reproduction alone, which ends the training (below, or
    # Trainings.stop) and says once what continues it; the training's own advice would be for its stage only
    held = _hold_sigterm()
    try:
        proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent, start_new_session=True, **piped)
    except BaseException:
        _let_sigterm_through(held)
        raise
    with proc:
        try:
            _let_sigterm_through(held)  # one that came meanwhile is raised here, and ends the training below
            with trainings.holding(proc) if trainings else contextlib.nullcontext():
                for line in proc.stdout if tag is not None else ():
                    sys.stdout.write(tag + line)
                    sys.stdout.flush()
                proc.wait()
        except KeyboardInterrupt:  # its run folder keeps its last finished epoch (each file is written atomically)
            proc.terminate()
            proc.wait()
            raise
    return proc.returncode


def _hold_sigterm() -> bool:
    """SIGTERM held back in this thread, and so in a process it forks until that runs :func:`die_with_parent`:
    a process group's SIGTERM (a scheduler's, a timeout's) that reaches a training after its fork, while it runs
    our Python before its exec, would raise in it our handler's error, which Python prints and ignores, and the
    training would start. Whether it was held (Linux, where the child lets it through)."""
    if die_with_parent is None:
        return False
    return signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])


def _let_sigterm_through(held: bool) -> None:
    if held:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])


def _death_signal_setter() -> Optional[Callable[[], None]]:
    """What a training process runs before it starts (Linux): it is killed with the reproduction, so no orphan
    writes the checkpoint the next run resumes. prctl is looked up here, in the parent: the child, forked from a
    parent that may run threads (stages side by side), must not load a library before it execs."""
    if not sys.platform.startswith('linux'):
        return None
    import ctypes
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    # the forking process's pid, set in it just before each fork (subprocess runs these hooks when a child runs
    # Python before its exec), so that the child holds its parent's pid in its copy of this dict
    forked_by = {'pid': os.getpid()}
    os.register_at_fork(before=lambda: forked_by.update(pid=os.getpid()))

    def die_with_parent() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != forked_by['pid']:  # the parent ended before the prctl: no signal will come
            os.kill(os.getpid(), signal.SIGKILL)
        # a SIGTERM held back over the fork (_hold_sigterm) ends the child now, as it would after its exec, where a
        # handler is reset (one ignored stays so)
        if callable(signal.getsignal(signal.SIGTERM)):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    return die_with_parent


# a subprocess's preexec_fn (None off Linux): the training processes, and the device check's pytest. The signal
# comes when the thread that started the process ends; a stage's thread waits for its training.
die_with_parent = _death_signal_setter()
