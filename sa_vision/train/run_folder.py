""" A run's folder: where a new or resumed run writes (refusing one that holds another run, or that another
process is training in), the files that claim it, the advice Ctrl-C leaves there, and the files a resume writes
again where a stop left them behind its checkpoint """
import contextlib
import csv
import os
import re
import shutil
import tempfile
import unicodedata
import zipfile
from datetime import datetime
from pathlib import Path, PurePath
from shlex import quote
from typing import IO, Dict, List, Optional

import yaml

from ..errors import TrainingDiverged, UserError, write_failure
from ..io import atomic_duplicate, atomic_write, atomic_write_text, folder_problem, remove_stale_temporaries
from ..tables import plural
from .checkpoint import BEST_CHECKPOINT, RUN_CHECKPOINT, Checkpoint, CheckpointError, read_checkpoint
from .epoch_files import SUMMARY, write_summary_row
from .state import Log, args_as_saved, run_recipe
from .timm_args import model_kwargs_as_timm_args

__all__ = ['run_folder', 'write_run_files', 'training_in', 'repair_run_files']


def run_folder(args, resume_ckpt) -> Path:
    """The run folder: a resumed run's own, else ``--output/--experiment``, which must be new or empty (without
    ``--experiment``: named for the time, the model and the dataset; :func:`write_run_files` claims it)."""
    if resume_ckpt is not None:
        resumed = Path(resume_ckpt.source)  # --resume may name the run folder; kept as given (relative) for the log
        run_dir, last = resumed.parent, resumed.parent / RUN_CHECKPOINT
        if resumed.resolve() != last.resolve() and last.is_file():
            raise UserError(f'--resume {args.resume}: a run continues from its latest checkpoint, {last}; from '
                            f'{resumed.name} its folder would hold epochs of two histories. Resume from {last}, or '
                            f'start a new run from these weights: --initial-checkpoint {resumed} --experiment NEW')
        moved = [f'--{k} {new}' for k, (_, new) in args.resume_changes.items() if k in ('output', 'experiment')]
        named = Path(args.output) / (args.experiment or run_dir.name)  # a run moved (copied) names its new place
        if moved and named.resolve() != run_dir.resolve():
            # timm's train.py would write the rest of the run elsewhere: here the folder holds the whole run
            raise UserError(f'--resume continues the run in its own folder, {run_dir}, not where {" ".join(moved)} '
                            f'says. Drop {" and ".join(m.split()[0] for m in moved)}, or start a new run there from '
                            f'these weights: --initial-checkpoint {resumed} {" ".join(moved)}')
        problem = folder_problem(run_dir)
        if problem:
            raise UserError(f'--resume {args.resume}: {problem}; the run writes there (its checkpoints, summary and '
                            f'export): make it writable, or copy the folder to one that is and resume the copy')
        return run_dir
    problem = folder_problem(args.output)
    if problem:
        raise UserError(f'--output {args.output}: {problem}; pass --output a folder you can write to')
    problem = _experiment_problem(args.experiment)
    if problem:
        raise UserError(f'--experiment {args.experiment!r}: {problem}; name a folder below --output (a/b is one), '
                        f'and pass --output for another place')
    # a dataset named by a path is one folder's name: no separator, nor what Windows refuses in one (D:\data)
    run_dir = Path(args.output) / (args.experiment or '-'.join([
        datetime.now().strftime('%Y%m%d-%H%M%S'), args.model, re.sub(r'[\\/:*?"<>|]', '_', args.dataset or 'folder')]))
    problem = folder_problem(run_dir)  # a file of its name, or above it
    if problem:
        raise UserError(f'the run folder {run_dir}: {problem}; pass another --experiment (or --output)')
    # refused, not renamed as timm's get_outdir(inc=True) would: a run is found by its --experiment (the docs,
    # sa-vision-reproduce), and a silent "-1" folder would leave the old files looking like this run's
    if run_dir.is_dir() and any(run_dir.iterdir()):
        held = sorted(p.name for p in run_dir.iterdir())
        last = run_dir / RUN_CHECKPOINT
        running = _running_in(run_dir)
        go_on = (f'Continue it with --resume {quote(str(last))}, or start' if last.is_file() else
                 f'It has no {RUN_CHECKPOINT}: {_FIRST_EPOCH[running]}; or start')
        raise UserError(f'the run folder {run_dir} already holds a run ({", ".join(held[:6])}'
                        f'{", ..." if len(held) > 6 else ""}); a new run would overwrite it. {go_on} a new one '
                        f'with another --experiment (or --output)')
    return run_dir


# a run folder without a checkpoint, by whether a process holds it (_running_in)
_FIRST_EPOCH = {True: 'another sa-vision-train is running in it, in its first epoch: let it finish',
                False: 'a run killed before its first epoch ended, which no process holds: delete it and run this '
                       'again',
                None: 'a run still in its first epoch, or one killed before that ended (then delete it)'}


def _running_in(folder: Path) -> Optional[bool]:
    """Whether a sa-vision-train holds ``folder`` now (:func:`_hold`); None where that cannot be told (no
    args.yaml, or no fcntl)."""
    try:
        import fcntl
        opened = open(folder / 'args.yaml', encoding='utf-8')
    except (ImportError, OSError):
        return None
    with opened:
        try:
            fcntl.flock(opened, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(opened, fcntl.LOCK_UN)
    return False


def _experiment_problem(name: str) -> Optional[str]:
    """What keeps ``--experiment`` from naming a folder below ``--output``, or None. timm's train.py joins the
    two as they are: an absolute name or a ``..`` would write elsewhere, ``.`` into ``--output`` itself."""
    name = name or ''  # None from a config's 'experiment:' left empty
    if any(unicodedata.category(c) == 'Cc' for c in name):
        return 'it holds a control character (a tab, a new line, ...)'
    path = PurePath(name)
    if path.is_absolute() or '..' in path.parts:
        return 'it leads out of --output'
    if name and not path.parts:
        return 'it is --output itself'
    return None


def write_run_files(args, run_dir: Path, new_run: bool, trains: bool = True,
                    resumed: Optional[Checkpoint] = None) -> Path:
    """``args.yaml`` (every argument, with what was resolved here) and ``recipe.yaml`` (``-c`` repeats the run), in
    the folder returned; a resumed run with no epoch left to train (not ``trains``) only holds its folder, whose
    files stay those of the epochs that made it (written where it has none). A new run's ``args.yaml`` claims its
    folder, made only where none is there: where another run claimed ``run_dir`` since :func:`run_folder` found it
    empty, one named for the time is claimed as ``-1``, ``-2``, ... (timm's ``get_outdir(inc=True)``), and an
    ``--experiment`` is refused before anything is written. The folder is then held for this process's epochs,
    report and export (:func:`training_in`): another process resuming the run is refused meanwhile, and the
    checkpoint ``resumed`` must be as this one read it, once held (:func:`_check_unchanged_since_read`)."""
    if not (new_run or trains) and (run_dir / 'args.yaml').is_file():
        _hold(run_dir)
        _check_unchanged_since_read(run_dir, resumed)
        return run_dir
    saved = _yaml(model_kwargs_as_timm_args(args_as_saved(args)))
    folder = _claim(run_dir, saved, args.experiment) if new_run else run_dir
    folder.mkdir(parents=True, exist_ok=True)
    _hold(folder)
    try:  # let go where a write is refused: no run holds the folder then
        _check_unchanged_since_read(folder, resumed)
        if not new_run:  # rewritten whole (a full disk leaves the earlier one) while held, then the new file held
            atomic_write_text(folder / 'args.yaml', saved)
            _hold(folder)
        atomic_write_text(folder / 'recipe.yaml', _yaml(run_recipe(args)))
    except BaseException:
        _let_go(folder)
        raise
    return folder


def _claim(run_dir: Path, saved: str, experiment: Optional[str]) -> Path:
    """``run_dir`` (or, where another run claimed it meanwhile, ``run_dir-1``, ...) claimed by writing its
    ``args.yaml`` (``saved``), which no other run has written; an ``experiment`` named is not renamed but refused."""
    folder, suffix = run_dir, 0
    while True:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with open(folder / 'args.yaml', 'x', encoding='utf-8') as f:
                f.write(saved)
            return folder
        except FileExistsError:
            if experiment:
                raise UserError(f'another run started in {folder} while this one set up; start this one with '
                                f'another --experiment (or --output)') from None
        suffix += 1
        folder = run_dir.with_name(f'{run_dir.name}-{suffix}')


def _yaml(values) -> str:
    return yaml.safe_dump(values, sort_keys=False)


# the run folders this process trains in: their args.yaml open and locked (flock: a file's lock, which NFS shares
# between hosts, as it does no folder's) until their epochs, report and export end (training_in), the process
# ends, or this process claims the folder again (a run of it that raised before its epochs)
_HELD: Dict[Path, IO] = {}


def _hold(folder: Path) -> None:
    """Hold ``folder`` for this process's run: another sa-vision-train resuming it (its checkpoints, its args.yaml)
    is refused while this one runs. Advisory, Linux and macOS (fcntl); elsewhere nothing is held. The lock is on
    args.yaml as it is now: one a resume has replaced since it was opened is opened again, and a process's own
    earlier lock (on the file it replaced) is let go only once it holds the new one."""
    try:
        import fcntl
    except ImportError:
        return
    path = folder / 'args.yaml'
    if folder.resolve() in _HELD and _same_file(_HELD[folder.resolve()], path):
        return  # this process holds it already (a run of it that raised before its epochs)
    while True:
        held = open(path, 'a', encoding='utf-8')
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked_now = _same_file(held, path)
        except BaseException as e:
            held.close()
            if not isinstance(e, BlockingIOError):
                raise
            _let_go(folder)
            raise UserError(f'another sa-vision-train is running in {folder}: let it finish or stop it, then '
                            f'continue the run with --resume {quote(str(folder / RUN_CHECKPOINT))}') from None
        if locked_now:
            break
        held.close()
    _let_go(folder)
    _HELD[folder.resolve()] = held


def _same_file(opened: IO, path: Path) -> bool:
    """Whether ``opened`` is the file at ``path`` now (not one a rename has replaced, or one deleted, since)."""
    try:
        there, here = os.fstat(opened.fileno()), os.stat(path)
    except FileNotFoundError:
        return False
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


def _let_go(folder: Path) -> None:
    held = _HELD.pop(folder.resolve(), None)
    if held is not None:
        held.close()


@contextlib.contextmanager
def training_in(run_dir: Path, export: bool = False):
    """The epochs of a run in ``run_dir`` and its report and export (``export``) after them, while
    :func:`write_run_files` holds it for this process (no other resumes it meanwhile), let go at the end; Ctrl-C or
    SIGTERM, a loss that diverged, or a file the system would not write (a full disk, the folder gone), ends them
    with how to go on, which :func:`sa_vision.errors.run_cli` prints (not a traceback)."""
    def go_on() -> str:
        last = run_dir / RUN_CHECKPOINT
        return (f'continue from its last finished epoch with --resume {quote(str(last))}{" --export" if export else ""}'
                if last.is_file() else f'no epoch had finished: delete {run_dir} and start again')
    try:
        yield
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (sa_vision.errors.Terminated)
        raise type(e)(go_on()) from None
    except TrainingDiverged as e:  # the epochs before are whole: with a lower learning rate, they may go on
        advice = go_on()
        raise UserError(f'{e}. {advice[0].upper()}{advice[1:]}, with a lower --lr or clipped gradients (--clip-grad '
                        f'1.0, say)') from None
    except Exception as e:  # noqa: BLE001  a write the system refused is the user's to mend; any other, a fault
        reason = write_failure(e)
        if reason is None:
            raise
        on = next(p for p in (run_dir, *run_dir.parents) if p.is_dir())  # the run folder may be gone
        free = shutil.disk_usage(on).free
        raise UserError(f'could not write in {run_dir} ({reason}); {free / 1e6:,.0f} MB free on its disk. Each '
                        f'file is written whole or not at all: once mended, {go_on()}') from e
    finally:
        _let_go(run_dir)


def _epoch_of(checkpoint: Path) -> Optional[int]:
    """The epochs done in ``checkpoint``; None where it cannot be read (cut short, refused, or unreadable)."""
    try:
        return read_checkpoint(checkpoint).meta['epoch']
    except CheckpointError:
        return None


def _check_unchanged_since_read(folder: Path, resumed: Optional[Checkpoint]) -> None:
    """Refuse to resume a checkpoint that another process replaced after this one read it and before this one held
    ``folder`` (a resume queued behind a run that went on): its epochs would be trained again over the newer ones,
    and model_best.pth.tar left of the history lost."""
    if resumed is None:
        return
    done, read = _epoch_of(Path(resumed.source)), resumed.meta['epoch']
    if done != read:
        _let_go(folder)
        now = 'can no longer be read' if done is None else f'holds {plural(done, "epoch")} done'
        raise UserError(f'{resumed.source} changed while this run set up: it held {plural(read, "epoch")} done when '
                        f'read, and {now} (another sa-vision-train went on with the run). Nothing was written; run '
                        f'the same command again to continue from where the run is now')


def _cut_short(checkpoint: Path) -> bool:
    """Whether ``checkpoint``, read to its end without an error, is a torch.save zip archive that has lost its end
    (a copy cut short); not a whole file refused for what it holds, nor one this user or the disk cannot read."""
    try:
        with open(checkpoint, 'rb') as f:
            f.seek(-min(checkpoint.stat().st_size, 2 ** 16 + 22), os.SEEK_END)  # where a zip's directory ends
            f.read()
    except OSError:
        return False
    return not zipfile.is_zipfile(checkpoint)


def repair_run_files(run_dir: Path, resume_ckpt: Optional[Checkpoint], log: Log) -> None:
    """Make ``model_best.pth.tar`` and ``summary.csv`` agree with the checkpoint resumed (``last.pth.tar``, which
    ``epoch_files.save_epoch`` writes first): a run stopped after it (killed, a full disk) left its epoch's best
    checkpoint or summary row unwritten, and an export would publish an older epoch as the best. A new run (no
    ``resume_ckpt``) has nothing to repair."""
    if resume_ckpt is None:
        return
    removed = remove_stale_temporaries(run_dir, held=True)  # write_run_files holds the folder
    if removed:
        log(f'removed {", ".join(removed)} from {run_dir}: files a run killed while writing them left behind')
    # the file resumed: last.pth.tar, or a checkpoint of the run that a folder without one holds (run_folder)
    meta, kept, source = resume_ckpt.meta, run_dir / BEST_CHECKPOINT, Path(resume_ckpt.source)
    best = meta.get('best')
    last_is_best = best is not None and best['epoch'] == meta['epoch'] - 1
    kept_epoch = None
    if kept.is_file():
        kept_epoch = meta['epoch'] if os.path.samefile(kept, source) else _epoch_of(kept)
        if kept_epoch is None and not last_is_best and _cut_short(kept):  # of an earlier epoch: nothing to copy
            kept.unlink()
            log(f'{kept} could not be read (a copy cut short) and is removed: the best epoch\'s weights are lost; '
                f'a later epoch that beats it is kept there, and an export takes the last one meanwhile')
    if last_is_best and kept_epoch != meta['epoch']:
        atomic_duplicate(source, kept)
        log(f'{kept} written again from {source.name}: the run had stopped before it kept epoch {best["epoch"]}, '
            f'its best, there')
    history = meta.get('history') or []  # none in a checkpoint of an older sa_vision
    summary = run_dir / SUMMARY
    if history and _summary_epochs(summary) != [str(record['epoch']) for record in history]:
        with tempfile.TemporaryDirectory() as folder:  # as timm's update_summary writes them (csv's \r\n)
            rows = Path(folder) / SUMMARY
            for index, record in enumerate(history):
                write_summary_row(rows, record, write_header=index == 0)
            with atomic_write(summary) as tmp:
                tmp.write_bytes(rows.read_bytes())
        log(f'{summary} written again from {source.name}: it did not hold the {plural(len(history), "epoch")} the '
            f'run has done, one row each (the run had stopped between its files)')


def _summary_epochs(summary: Path) -> Optional[List[str]]:
    """The epoch column of ``summary.csv``, or None where there is none to read, or a row was cut short (a stop
    in the middle of appending it: the next row would be glued to it)."""
    try:
        with open(summary, encoding='utf-8', newline='') as f:
            text = f.read()
        header, *rows = csv.reader(text.splitlines())
    except (OSError, csv.Error, UnicodeDecodeError, ValueError):
        return None
    if not text.endswith('\n') or 'epoch' not in header or any(len(row) != len(header) for row in rows):
        return None
    return [row[header.index('epoch')] for row in rows]
