""" Writing files and folders so that a crash or kill never leaves half of one: :func:`atomic_write` and the
writers built on it (text, ``torch.save``, a duplicate of a file), each with the mode ``open()`` gives a new file,
and :func:`atomic_folder`; :func:`folder_problem` and :func:`file_problem`, what would stop a folder or a file
from being written; and :func:`plain_data`, a value as data any of these files can hold. Imports no sa_vision
code. """
import contextlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional, Union

import torch

__all__ = ['atomic_write', 'atomic_write_text', 'atomic_torch_save', 'atomic_duplicate', 'atomic_folder',
           'partial_name', 'remove_stale_temporaries', 'usual_file_mode', 'folder_problem', 'file_problem',
           'plain_data']

PathLike = Union[str, os.PathLike]
# Windows' fsync (FlushFileBuffers) refuses a handle opened for reading; elsewhere reading is all a file its writer
# made read-only (a umask of 0277, a hard link to a read-only file) allows
_FSYNC_NEEDS_WRITE = os.name == 'nt'


@contextlib.contextmanager
def atomic_write(path: PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to, renamed over it when the block succeeds (removed otherwise):
    a crash or kill never leaves a half-written file. A symbolic link keeps pointing where it did, at the file
    written; something that is no file (a pipe), or a name of the system's (``/dev/stdout``, which is a file where
    the output goes to one), is written into as ``open()`` would."""
    path = Path(path)
    if (path.exists() and not path.is_file()) or os.path.abspath(path).startswith(('/dev/', '/proc/')):
        yield path
        return
    path = Path(os.path.realpath(path))
    tmp = path.with_name(f'.{path.stem}.tmp{os.getpid()}{path.suffix}')  # named for its writer: _TEMPORARY
    try:
        yield tmp
        with open(tmp, 'r+b' if _FSYNC_NEEDS_WRITE else 'rb') as f:
            os.fsync(f.fileno())
        if os.stat(tmp).st_nlink == 1:  # a hard link (atomic_duplicate) shares its mode with the file it names
            usual_file_mode(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# the temporary files of atomic_write, by the process writing them, and how long one is left alone since its
# writer last wrote to it
_TEMPORARY = re.compile(r'\..+\.tmp(\d+)(\.[^.]+)?')
_STALE_AFTER_S = 600
# Windows' os.kill ends the process whatever the signal: no test of a writer there
_KILL_ENDS_PROCESS = os.name == 'nt'


def remove_stale_temporaries(folder: PathLike, held: bool = False) -> List[str]:
    """Remove the temporary files in ``folder`` that :func:`atomic_write` left where its writer was killed before
    the rename (a whole checkpoint each, hidden from ``ls``): those of processes no longer running, untouched for
    ten minutes (a writer in another container or on another host, whose process this one cannot see, is still
    writing to its own), or at once where the caller holds the folder (``held``: no one else writes there). Where no
    writer can be asked whether it runs (Windows: :data:`_KILL_ENDS_PROCESS`), only once untouched for long. Their
    names."""
    removed, now = [], time.time()
    for entry in os.scandir(folder):
        match = _TEMPORARY.fullmatch(entry.name)
        if not match or not entry.is_file(follow_symlinks=False):
            continue
        pid, stale = int(match.group(1)), now - entry.stat().st_mtime > _STALE_AFTER_S
        running = _running(pid)
        # held: no other writer there, and this process (a container's process 1 again, say) is writing none now
        writer_gone = held and pid == os.getpid() or running is False or (running is None and stale)
        if writer_gone and (held or stale):
            os.unlink(entry.path)
            removed.append(entry.name)
    return sorted(removed)


def _running(pid: int) -> Optional[bool]:
    """Whether process ``pid`` runs; ``None`` where that cannot be asked (:data:`_KILL_ENDS_PROCESS`): then a
    file's age alone tells."""
    if _KILL_ENDS_PROCESS:
        return None
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: a number no process has
        return False
    except PermissionError:  # another user's process
        return True
    return True


def usual_file_mode(path: PathLike) -> None:
    """Give ``path`` the mode ``open()`` gives a new file (0644 under the usual umask 022): writers that go through
    a temporary file of their own (safetensors' ``save_file``, ``tempfile``) leave it 0600."""
    umask = os.umask(0)  # reading the umask means setting it: set it straight back
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def atomic_write_text(path: PathLike, text: str) -> None:
    """``path`` holds ``text`` (UTF-8) through :func:`atomic_write`."""
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding='utf-8')


def atomic_torch_save(obj: Any, path: PathLike) -> None:
    """``torch.save`` through :func:`atomic_write`."""
    with atomic_write(path) as tmp:
        torch.save(obj, tmp)


def atomic_duplicate(src: PathLike, dst: PathLike) -> None:
    """``dst`` becomes a copy of ``src`` at once: a hard link where the file system allows (no second copy of the
    tensors, as timm's ``CheckpointSaver`` keeps ``model_best``), else a copy, renamed over ``dst``."""
    with atomic_write(dst) as tmp:
        if Path(tmp) == Path(dst):  # a pipe or a name of the system's: written into (atomic_write)
            with open(src, 'rb') as source, open(tmp, 'wb') as copy:
                shutil.copyfileobj(source, copy)
            return
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)


@contextlib.contextmanager
def atomic_folder(folder: PathLike) -> Iterator[Path]:
    """A path beside ``folder`` to build its new contents at, swapped in for ``folder`` when the block succeeds
    (removed otherwise): the folder never mixes two versions, and a killed writer leaves the earlier one (or none),
    never half a folder. What a killed writer left beside it is removed first. A link to a folder stays, and the
    folder it names is replaced; a mount point, which cannot be renamed, is filled in place
    (:func:`_filled_in_place`)."""
    folder = Path(os.path.realpath(folder))
    here = Path.cwd()
    if os.path.ismount(folder) or folder == here or folder in here.parents:  # the working folder stays too
        with _filled_in_place(folder) as partial:
            yield partial
        return
    partial, old = folder.with_name(partial_name(folder)), folder.with_name(f'.{folder.name}.old')
    if old.is_dir() and not old.is_symlink() and not folder.exists():  # a writer killed between its two renames
        os.replace(old, folder)
    for leftover in (partial, old):
        _remove(leftover)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield partial
        if folder.exists():
            os.replace(folder, old)
        os.replace(partial, folder)
        _remove(old)
    finally:
        _remove(partial)


@contextlib.contextmanager
def _filled_in_place(folder: Path) -> Iterator[Path]:
    """:func:`atomic_folder` for a mount point: the new contents are built in a hidden folder inside it, and once
    complete replace the old ones name by name (a kill in between leaves a mix, which the next writer replaces)."""
    partial = folder / partial_name(folder)
    _remove(partial)
    try:
        yield partial
        for entry in folder.iterdir():
            if entry != partial:
                _remove(entry)
        for entry in partial.iterdir():
            os.replace(entry, folder / entry.name)
    finally:
        _remove(partial)


def partial_name(folder: PathLike) -> str:
    """The name of the folder :func:`atomic_folder` builds ``folder``'s new contents in: beside it, or inside it
    where it is filled in place (a writer killed there leaves it, which the next one replaces, and which a check
    of what ``folder`` holds passes over)."""
    return f'.{Path(os.path.realpath(folder)).name}.partial'


def _remove(path: Path) -> None:
    """``path`` gone, whatever it is: a folder with its contents, a file, a link (not what it names)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()


def folder_problem(folder: PathLike) -> Optional[str]:
    """What would stop ``folder`` (and the folders above it) from being created and written, in words (a file in
    the way, no permission, a file system that takes nothing new), or None; nothing is created (a probe folder in
    the nearest existing one is removed at once)."""
    tilde = _unexpanded_tilde(folder)
    if tilde:
        return tilde
    folder = Path(folder)
    existing = next(p for p in (folder, *folder.parents) if _exists(p))  # the last parent, '.' or '/', exists
    too_long = _name_too_long(folder.parts[len(existing.parts):], existing)  # the names to create
    if too_long:
        return too_long
    if not existing.is_dir():
        return f'{existing} is a file, not a folder'
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing))
    except OSError as e:
        return f'nothing can be created in {existing} ({e.strerror or e})'
    return None


def _unexpanded_tilde(path: PathLike) -> Optional[str]:
    """Why a path given as written (a str: ``Path`` reads './~' as '~') that starts with a ~ no shell expanded is
    refused, where no folder of that name is here yet: it would be made in the current one, which a later
    ``rm -rf ~...`` hits."""
    if isinstance(path, str) and path.startswith('~') and not os.path.lexists(path.split(os.sep)[0]):
        return ('a ~ is expanded by the shell only at the start of a word (not after "=", nor in a recipe): write '
                '~/... after a space, or the whole path')
    return None


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; False where stat refuses it (a name too long: below an existing folder stat says
    so, below a missing one it says "no such file")."""
    try:
        return path.exists()
    except OSError:
        return False


def _name_too_long(names, folder: Path) -> Optional[str]:
    """Which of ``names`` (of folders to create in ``folder``) is longer than its file system takes, in words."""
    try:
        most = os.pathconf(folder, 'PC_NAME_MAX')
    except (OSError, ValueError, AttributeError):  # no such query here: the usual limit
        most = 255
    longest = max(names, key=lambda name: len(os.fsencode(name)), default='')
    if len(os.fsencode(longest)) > most:
        return f'a name of {len(os.fsencode(longest))} bytes ({longest[:20]}...) is longer than the {most} its file ' \
               f'system takes'
    return None


def file_problem(path: PathLike) -> Optional[str]:
    """What would stop the file ``path`` from being written (a folder of that name, a folder above it that cannot be
    created, see :func:`folder_problem`; for a symbolic link, the folder of the file it points at), in words, or
    None; nothing is created."""
    problem = _unexpanded_tilde(path) or _name_too_long([Path(path).name], Path(path).parent)
    if problem:
        return problem
    try:
        is_folder, is_link = Path(path).is_dir(), Path(path).is_symlink()
    except OSError:  # a folder's name above it is too long (stat says so): folder_problem says which
        return folder_problem(Path(path).parent)
    if is_folder or str(path).endswith(('/', os.sep)):  # Path('x/') is 'x': the slash says "a folder"
        return f'{path} is a folder: name the file to write'
    if is_link:  # written where it points (atomic_write), a folder nothing creates
        target = Path(os.path.realpath(path))
        if not target.parent.is_dir():
            return f'{path} is a link to {target}, in a folder that does not exist'
        return folder_problem(target.parent)
    return folder_problem(Path(path).parent)


def plain_data(value: Any) -> Any:
    """A value as plain YAML / JSON / ``weights_only``-safe data (tuples as lists, other objects as str)."""
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain_data(v) for k, v in value.items()}
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
