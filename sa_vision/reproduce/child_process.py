""" A child process that is killed with the process that started it (Linux): a killed reproduction leaves no training
that would go on writing the checkpoint its next run resumes """
import os
import sys
from typing import Callable, Optional

__all__ = ['die_with_parent']


def _death_signal_setter() -> Optional[Callable[[], None]]:
    """What a training process runs before it starts (Linux): it is killed with the reproduction, so no orphan
    writes the checkpoint the next run resumes. prctl is looked up here, in the parent: the child, forked from a
    parent that may run threads (stages side by side), must not load a library before it execs."""
    if not sys.platform.startswith('linux'):
        return None
    import ctypes
    import signal
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    # the forking process's pid, set in it just before each fork (subprocess runs these hooks when a child runs
    # Python before its exec), so that the child holds its parent's pid in its copy of this dict
    forked_by = {'pid': os.getpid()}
    os.register_at_fork(before=lambda: forked_by.update(pid=os.getpid()))

    def die_with_parent() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != forked_by['pid']:  # the parent ended before the prctl: no signal will come
            os.kill(os.getpid(), signal.SIGKILL)
    return die_with_parent


# a subprocess's preexec_fn (None off Linux): the training processes, and the device check's pytest. The signal
# comes when the thread that started the process ends; a stage's thread waits for its training.
die_with_parent = _death_signal_setter()
