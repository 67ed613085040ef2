""" A run folder holds one run: a second run into it is refused before anything is written, ``model_best.pth.tar``
keeps the best epoch by ``--eval-metric``, ``--export`` publishes it, a resumed ``--export`` swaps the Hub folder
whole, and the files written through a temporary file get the mode ``open()`` gives (the process umask) """
import csv
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import HANG_TIMEOUT_S, command_here, train_here, usual_file_mode
from timm.models import resume_checkpoint

from sa_vision.errors import UserError
from sa_vision.io import atomic_write, remove_stale_temporaries
from sa_vision.train import loop
from sa_vision.train.args import build_parser
from sa_vision.train.checkpoint import read_checkpoint
from sa_vision.train.recipes import RECIPE_DIR
from sa_vision.train.run_folder import run_folder, write_run_files

ROOT = Path(__file__).resolve().parent.parent
DIGITS_RECIPE = RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml'
TINY_ARGS = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32']


def _train_args(out, name, epochs):
    return ['-c', DIGITS_RECIPE, *TINY_ARGS, '--epochs', epochs, '--warmup-epochs', 0.5, '-b', 64,
            '--output', out, '--experiment', name, '--log-interval', 50]


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob('*')) if p.is_file()}


def _written_into_pipe(pipe: Path, write) -> bytes:
    """What ``write()`` writes into the named pipe ``pipe``, read by a thread. Never blocks: where the writer never
    opened the pipe, the reader is let go by a non-blocking open (a blocking one would wait forever for a reader
    that has already read and gone)."""
    import threading
    read = []
    reader = threading.Thread(target=lambda: read.append(pipe.read_bytes()), daemon=True)
    reader.start()
    try:
        write()
    finally:
        reader.join(timeout=10)
        if reader.is_alive():
            try:
                os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader has the pipe open (ENXIO): nothing to let go
                pass
            reader.join(timeout=10)
    return b''.join(read)


def _best_epoch(summary: Path) -> int:
    """The epochs done at the best top-1 of summary.csv: the first of equal ones (a later epoch must beat it)."""
    with open(summary, encoding='utf-8') as f:
        top1 = [float(row['eval_top1']) for row in csv.DictReader(f)]
    return top1.index(max(top1)) + 1


def _assert_same_weights(state_dict, safetensors_file: Path):
    from safetensors.torch import load_file
    reference = load_file(str(safetensors_file))
    assert set(state_dict) == set(reference)
    for key, value in reference.items():
        assert torch.equal(state_dict[key], value), key


def test_a_second_run_into_a_run_folder_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'last.pth.tar').write_bytes(b'an earlier run')
    (run / 'summary.csv').write_text('epoch,eval_top1\n0,95.0\n')
    before = _files(run)
    with pytest.raises(UserError, match='already holds a run') as refused:
        loop.main(['-c', str(DIGITS_RECIPE), '--output', str(tmp_path), '--experiment', 'run'])
    assert f'--resume {run / "last.pth.tar"}' in str(refused.value) and 'another --experiment' in str(refused.value)
    assert _files(run) == before
    # one without a checkpoint may be training its first epoch now: deleting it is advice for a killed one only
    (run / 'last.pth.tar').unlink()
    with pytest.raises(UserError, match='already holds a run') as refused:
        loop.main(['-c', str(DIGITS_RECIPE), '--output', str(tmp_path), '--experiment', 'run'])
    assert ('It has no last.pth.tar: a run still in its first epoch, or one killed before that ended (then delete '
            'it); or start a new one with another --experiment') in str(refused.value), str(refused.value)
    # told apart by the lock a running sa-vision-train holds on its args.yaml: killed, or running in another process
    (run / 'args.yaml').write_text('model: sa_quadratic_cifar\n')
    with pytest.raises(UserError, match='already holds a run') as refused:
        loop.main(['-c', str(DIGITS_RECIPE), '--output', str(tmp_path), '--experiment', 'run'])
    assert ('It has no last.pth.tar: a run killed before its first epoch ended, which no process holds: delete it '
            'and run this again; or start') in str(refused.value), str(refused.value)
    holder = subprocess.Popen([sys.executable, '-c', 'import fcntl, sys, time; f = open(sys.argv[1], "a"); '
                               'fcntl.flock(f, fcntl.LOCK_EX); print("held", flush=True); time.sleep(120)',
                               str(run / 'args.yaml')], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'held\n'
        with pytest.raises(UserError, match='already holds a run') as refused:
            loop.main(['-c', str(DIGITS_RECIPE), '--output', str(tmp_path), '--experiment', 'run'])
    finally:
        holder.kill()
        holder.wait()
    assert ('It has no last.pth.tar: another sa-vision-train is running in it, in its first epoch: let it finish; '
            'or start') in str(refused.value), str(refused.value)


def test_an_empty_output_is_the_default_folder_as_in_timm():
    """timm's train.py defaults --output to '' and writes to ./output/train then; '' wrote into the current folder."""
    assert build_parser().parse_args(['--output', '']).output == build_parser().parse_args([]).output == 'output/train'


def test_a_new_or_empty_run_folder_is_taken(tmp_path):
    (tmp_path / 'empty').mkdir()
    for name in ('new', 'empty'):
        args = build_parser().parse_args(['--output', str(tmp_path), '--experiment', name])
        assert run_folder(args, None) == tmp_path / name


@pytest.mark.parametrize('name, problem', [
    ('/elsewhere', 'it leads out of --output'), ('../beside', 'it leads out of --output'),
    ('a/../../b', 'it leads out of --output'), ('.', 'it is --output itself'),
    ('run\n2', 'it holds a control character'), ('run\t2', 'it holds a control character')])
def test_an_experiment_that_is_no_folder_below_output_is_refused(tmp_path, name, problem):
    """timm's train.py joins --output and --experiment as they are: these would write beside or into --output."""
    args = build_parser().parse_args(['--output', str(tmp_path / 'out'), '--experiment', name])
    with pytest.raises(UserError, match=f'^--experiment {re.escape(repr(name))}: {problem}.*; name a folder below '):
        run_folder(args, None)
    args = build_parser().parse_args(['--output', str(tmp_path / 'out'), '--experiment', 'fm/quadratic'])
    assert run_folder(args, None) == tmp_path / 'out' / 'fm' / 'quadratic'  # a folder below it, as in timm
    args.experiment = None  # a config's 'experiment:' left empty: named for the time, as without one
    assert run_folder(args, None).parent == tmp_path / 'out'


def test_runs_that_found_the_same_folder_empty_never_share_it(tmp_path, monkeypatch):
    """Two runs checked the same folder before either wrote into it (started in the same second, or the same
    --experiment): the first claims it; the second, named for the time, takes ``-1`` as timm's get_outdir(inc=True)
    does, and with an --experiment is refused, the first run's files left as they were."""
    import sa_vision.train.run_folder as folders

    class Frozen(folders.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 11, 27, 6, 0, 0)
    monkeypatch.setattr(folders, 'datetime', Frozen)
    timed = [build_parser().parse_args(['--output', str(tmp_path), '--seed', str(seed)]) for seed in (1, 2)]
    found = [run_folder(args, None) for args in timed]
    assert found[0] == found[1]
    claimed = [write_run_files(args, folder, new_run=True) for args, folder in zip(timed, found)]
    assert claimed == [found[0], found[0].with_name(found[0].name + '-1')]
    assert [yaml.safe_load((folder / 'args.yaml').read_text())['seed'] for folder in claimed] == [1, 2]

    named = [build_parser().parse_args(['--output', str(tmp_path), '--experiment', 'run', '--seed', str(seed)])
             for seed in (1, 2)]
    found = [run_folder(args, None) for args in named]
    write_run_files(named[0], found[0], new_run=True)
    before = _files(found[0])
    with pytest.raises(UserError, match='another run started in .*another --experiment'):
        write_run_files(named[1], found[1], new_run=True)
    assert _files(found[0]) == before
    write_run_files(named[1], found[1], new_run=False)  # a resumed run writes its own folder's files again


def test_atomic_folder_replaces_a_folder_whole_or_not_at_all(tmp_path):
    from sa_vision.io import atomic_folder
    hub = tmp_path / 'hub'
    hub.mkdir()
    (hub / 'model.safetensors').write_text('epoch 2')
    (hub / 'attention.png').write_text('a figure of epoch 2')
    with pytest.raises(KeyboardInterrupt), atomic_folder(hub) as partial:
        partial.mkdir()
        (partial / 'model.safetensors').write_text('epoch 3')
        raise KeyboardInterrupt('killed while exporting')
    assert _files(hub) == {'model.safetensors': b'epoch 2', 'attention.png': b'a figure of epoch 2'}
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hub']
    with atomic_folder(hub) as partial:  # a new version without a figure
        partial.mkdir()
        (partial / 'model.safetensors').write_text('epoch 3')
    assert _files(hub) == {'model.safetensors': b'epoch 3'}
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hub']


def test_atomic_folder_brings_back_the_version_a_writer_killed_between_its_renames_left(tmp_path):
    """Killed after moving the earlier version aside and before moving the new one in: the folder is missing and
    the earlier version lies beside it. The next writer brings it back, so a failure of its own leaves that one."""
    from sa_vision.io import atomic_folder
    hub, old = tmp_path / 'hub', tmp_path / '.hub.old'
    old.mkdir()
    (old / 'model.safetensors').write_text('epoch 2')
    with pytest.raises(OSError), atomic_folder(hub):
        raise OSError(28, 'No space left on device')
    assert _files(hub) == {'model.safetensors': b'epoch 2'} and sorted(p.name for p in tmp_path.iterdir()) == ['hub']


def test_atomic_folder_replaces_what_a_link_names_and_fills_a_mount_point(tmp_path, monkeypatch):
    """--out-dir may be a link to a folder (the link stays; the folder it names gets the new version, again and
    again) or a mount point (a container's volume: it cannot be renamed, so its contents are replaced, and a failed
    writer leaves the earlier ones)."""
    from sa_vision.io import atomic_folder
    target, link = tmp_path / 'big' / 'hub', tmp_path / 'hub'
    target.mkdir(parents=True)
    link.symlink_to(target)
    for version in ('epoch 2', 'epoch 3'):
        with atomic_folder(link) as partial:
            partial.mkdir()
            (partial / 'model.safetensors').write_text(version)
        assert link.is_symlink() and _files(target) == {'model.safetensors': version.encode()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ['big', 'hub'] and os.listdir(tmp_path / 'big') == ['hub']

    volume = tmp_path / 'volume'
    volume.mkdir()
    (volume / 'model.safetensors').write_text('epoch 2')
    (volume / 'attention.png').write_text('a figure of epoch 2')
    monkeypatch.setattr(os.path, 'ismount', lambda path: Path(path) == volume)
    with pytest.raises(OSError), atomic_folder(volume) as partial:
        partial.mkdir()
        (partial / 'model.safetensors').write_text('epoch 3')
        raise OSError(28, 'No space left on device')
    assert _files(volume) == {'model.safetensors': b'epoch 2', 'attention.png': b'a figure of epoch 2'}
    with atomic_folder(volume) as partial:
        partial.mkdir()
        (partial / 'model.safetensors').write_text('epoch 3')
    assert _files(volume) == {'model.safetensors': b'epoch 3'}


def test_export_replaces_the_runs_earlier_export_but_no_other_files(tmp_path, caplog, capsys):
    """--export of a resumed run replaces its earlier export (of other weights: an earlier best epoch). Where the
    run's hub/ is a link to a folder holding files of no export (or a mounted volume), they stay: refused in one
    line, before the epochs (not after them, with nowhere else to export to)."""
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1), '--export')
    assert status == 0, log[-2000:]
    run = tmp_path / 'run'
    before = (run / 'hub' / 'model.safetensors').read_bytes()
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2, '--export')
    assert status == 0 and 'after epoch 2 of 2' in (run / 'hub' / 'README.md').read_text(), log[-2000:]
    assert (run / 'hub' / 'model.safetensors').read_bytes() != before
    (run / 'hub' / '.DS_Store').write_bytes(b'a file browser looked')  # no file of the user's: replaced too
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2, '--export')
    assert status == 0 and not (run / 'hub' / '.DS_Store').exists(), log[-2000:]
    shared = tmp_path / 'shared'
    (run / 'hub').rename(shared)
    (shared / 'notes.txt').write_text('mine')
    (run / 'hub').symlink_to(shared)
    held = _files(shared)
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 3, '--export')
    error = log.strip().splitlines()[-1]
    assert status == 2 and "holds files that are not part of an export (['notes.txt'])" in error, log[-2000:]
    assert error.endswith('move what is in the way out of it, or leave out --export'), error
    assert 'Train:' not in log  # refused before the epochs, not after them
    assert _files(shared) == held and (run / 'hub').is_symlink()
    (run / 'hub').unlink()
    (run / 'hub').write_text('a file')
    last = (run / 'last.pth.tar').read_bytes()
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 3, '--export')
    assert status == 2 and f'{run / "hub"} is a file, not a folder' in log.strip().splitlines()[-1], log[-2000:]
    assert 'Train:' not in log and (run / 'last.pth.tar').read_bytes() == last


def test_a_resume_removes_the_temporary_files_a_killed_writer_left(tmp_path, caplog, capsys):
    """A process killed while writing a checkpoint leaves its temporary file (a whole checkpoint, hidden): the
    resume, which holds the run folder, removes those of processes no longer running, and keeps one a running
    process is writing. Elsewhere, such a file is removed only once untouched for a while."""
    import subprocess
    import sys
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-2000:]
    run = tmp_path / 'run'
    killed = subprocess.run([sys.executable, '-c', (
        'import os, signal, sys\n'
        'from sa_vision.io import atomic_write\n'
        'with atomic_write(sys.argv[1]) as tmp:\n'
        '    tmp.write_bytes(bytes(1000))\n'
        '    os.kill(os.getpid(), signal.SIGKILL)\n'), str(run / 'last.pth.tar')], timeout=HANG_TIMEOUT_S)
    assert killed.returncode == -9
    (left,) = [p.name for p in run.iterdir() if p.name.startswith('.last.pth.tmp')]
    writing = '.model_best.pth.tmp1.tar'  # of process 1, which runs as long as the system does
    (run / writing).write_bytes(b'')
    # a folder no run holds: a file of a process this one cannot see (another container's) is left alone while it
    # may be written to; one untouched for long is removed
    assert remove_stale_temporaries(run) == []
    hour_ago = time.time() - 3600
    for name in (left, writing):
        os.utime(run / name, (hour_ago, hour_ago))
    os.utime(run / left, None)
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2)  # holds its folder: removed at once
    assert status == 0 and f'removed {left} from {run}' in log, log[-2000:]
    assert not (run / left).exists() and (run / writing).exists()
    own = run / f'.last.pth.tmp{os.getpid()}.tar'  # a file of this process's id (process 1 in a container, again)
    own.write_bytes(b'')
    assert remove_stale_temporaries(run, held=True) == [own.name] and (run / writing).exists()
    stale = run / left.replace('.last.', '.summary.').replace('.tar', '.csv')
    stale.write_bytes(b'')
    os.utime(stale, (hour_ago, hour_ago))
    assert remove_stale_temporaries(run) == [stale.name] and (run / writing).exists()


def test_where_a_signal_would_end_the_writer_only_a_file_s_age_tells(tmp_path, monkeypatch):
    """On Windows, os.kill ends the process whatever the signal: no writer is asked whether it runs there (a
    resume would have ended an unrelated process), and a temporary file is removed only once untouched for long,
    also in a folder this process holds."""
    import sa_vision.io as sa_io

    def ended(pid, sig):
        raise AssertionError(f'os.kill({pid}, {sig}) would end process {pid} on Windows')
    monkeypatch.setattr(sa_io, '_KILL_ENDS_PROCESS', True)
    monkeypatch.setattr(os, 'kill', ended)
    fresh, old = tmp_path / '.last.pth.tmp4000000.tar', tmp_path / '.model_best.pth.tmp1.tar'
    for path in (fresh, old):
        path.write_bytes(b'')
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    assert remove_stale_temporaries(tmp_path, held=True) == [old.name] and fresh.exists()


def test_the_file_synced_before_its_rename_is_opened_for_writing(tmp_path, monkeypatch):
    """Windows' fsync (FlushFileBuffers) refuses a handle opened for reading alone (EBADF), so atomic_write syncs
    through one opened for writing there: every checkpoint, recipe and export goes through it."""
    import errno
    import fcntl

    import sa_vision.io as sa_io
    real_fsync = os.fsync
    monkeypatch.setattr(sa_io, '_FSYNC_NEEDS_WRITE', True)

    def windows_fsync(fd):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, 'Bad file descriptor')
        real_fsync(fd)
    monkeypatch.setattr(os, 'fsync', windows_fsync)
    with atomic_write(tmp_path / 'recipe.yaml') as tmp:
        tmp.write_text('epochs: 1\n', encoding='utf-8')
    assert (tmp_path / 'recipe.yaml').read_text(encoding='utf-8') == 'epochs: 1\n'


def test_files_written_through_a_temporary_file_get_the_usual_mode(tmp_path):
    from safetensors.torch import save_file
    with atomic_write(tmp_path / 'w.safetensors') as tmp:
        save_file({'w': torch.zeros(2)}, str(tmp))  # safetensors writes through a 0600 file of its own
    assert stat.S_IMODE((tmp_path / 'w.safetensors').stat().st_mode) == usual_file_mode()


def test_a_duplicate_by_hard_link_leaves_the_mode_of_the_file_it_names(tmp_path):
    """model_best.pth.tar as a hard link to a read-only last.pth.tar (a run folder copied read-only, then resumed):
    the mode a new file gets is not forced on the inode both names share."""
    from sa_vision.io import atomic_duplicate
    last = tmp_path / 'last.pth.tar'
    last.write_bytes(b'weights')
    last.chmod(0o444)
    atomic_duplicate(last, tmp_path / 'model_best.pth.tar')
    assert stat.S_IMODE(last.stat().st_mode) == 0o444 and (tmp_path / 'model_best.pth.tar').read_bytes() == b'weights'


def test_a_link_or_a_pipe_is_written_through_not_replaced(tmp_path):
    """A results file named by a symbolic link updates the file it points at (the link stays); a pipe, as
    /dev/stdout often is, is written into, as open() writes, not replaced by a file of that name."""
    from sa_vision.io import atomic_write_text
    target, link = tmp_path / 'target.json', tmp_path / 'results.json'
    target.write_text('old')
    link.symlink_to(target)
    atomic_write_text(link, 'new')
    assert link.is_symlink() and target.read_text() == 'new'
    pipe = tmp_path / 'pipe'
    os.mkfifo(pipe)
    assert _written_into_pipe(pipe, lambda: atomic_write_text(pipe, 'through the pipe')) == b'through the pipe'
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['pipe', 'results.json', 'target.json']


def test_a_link_into_a_missing_folder_is_named_before_writing(tmp_path):
    """A results file named by a link into a folder that does not exist: open() would fail, so file_problem says
    so (it used to pass, and the write failed with a bare FileNotFoundError); a link into an existing folder is
    fine, and a duplicate into a pipe is written into it, as atomic_write writes."""
    from sa_vision.io import atomic_duplicate, file_problem
    dangling = tmp_path / 'results.csv'
    dangling.symlink_to(tmp_path / 'gone' / 'results.csv')
    with pytest.raises(FileNotFoundError):
        open(dangling, 'w', encoding='utf-8')
    assert file_problem(dangling) == (f'{dangling} is a link to {tmp_path / "gone" / "results.csv"}, '
                                      f'in a folder that does not exist')
    pointing = tmp_path / 'new.csv'
    pointing.symlink_to(tmp_path / 'not yet.csv')
    assert file_problem(pointing) is None
    source, pipe = tmp_path / 'last.pth.tar', tmp_path / 'pipe'
    source.write_bytes(b'weights')
    os.mkfifo(pipe)
    assert _written_into_pipe(pipe, lambda: atomic_duplicate(source, pipe)) == b'weights'
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)


def test_names_longer_than_the_file_system_takes_and_a_file_as_the_run_folder_are_named(tmp_path, caplog, capsys):
    """A name longer than the file system takes raised OSError (File name too long) from every command's checks
    of its outputs, below an existing folder; below a missing one the checks passed and the run failed writing
    its files. A file where the run folder goes, or above it, failed there too (FileExistsError,
    NotADirectoryError), after the model and data were set up."""
    from sa_vision.io import file_problem, folder_problem
    long = 'o' * 300
    with pytest.raises(OSError):  # the reference: the file system refuses it
        (tmp_path / long).mkdir()
    for below in (tmp_path, tmp_path / 'missing'):
        assert 'a name of 300 bytes (oooooooooooooooooooo...) is longer than the' in folder_problem(below / long)
        assert 'a name of 300 bytes' in folder_problem(below / long / 'sub')  # not the last: stat raised
        for path in (below / long / 'x.png', below / f'{long}.png', below / long / 'sub' / 'x.png'):
            assert 'is longer than the' in file_problem(path), path
    assert folder_problem(tmp_path / 'missing' / 'fine') is None and file_problem(tmp_path / 'x' / 'y.png') is None
    (tmp_path / 'runs').mkdir()
    (tmp_path / 'runs' / 'taken').write_text('')
    for experiment, blocking in (('taken', 'taken'), ('taken/sub', 'taken'), (long, None)):
        status, log = train_here(caplog, capsys, '--dataset', 'digits', '--output', tmp_path / 'runs',
                                 '--experiment', experiment)
        assert status == 2 and log.splitlines()[-1].startswith(f'error: the run folder {tmp_path / "runs"}'), log
        assert (f'{tmp_path / "runs" / blocking} is a file, not a folder' if blocking else 'is longer than') in log
    assert os.listdir(tmp_path / 'runs') == ['taken']


def test_a_tilde_no_shell_expanded_is_refused_unless_such_a_folder_is_here(tmp_path, monkeypatch):
    """--output=~/runs (no shell expands a ~ after '=') made a folder named '~' here. It is refused as written;
    './~/runs' names such a folder on purpose, and one already here (the old behaviour's) is taken as named."""
    from sa_vision.io import file_problem, folder_problem
    monkeypatch.chdir(tmp_path)
    for problem in (folder_problem('~/runs'), file_problem('~/fig.png'), folder_problem('~')):
        assert problem and 'a ~ is expanded by the shell only at the start of a word' in problem
    assert folder_problem('./~/runs') is None and folder_problem(Path('~/runs')) is None  # written so: meant
    (tmp_path / '~').mkdir()
    assert folder_problem('~/runs') is None and file_problem('~/fig.png') is None


def test_dev_stdout_going_to_a_file_keeps_what_is_printed_after(capfd):
    """--results-file /dev/stdout with the output sent to a file (here pytest's): /dev/stdout then resolves to that
    file, and a rename over it would leave what is printed next in a deleted file. Written as open() writes it (the
    reference, as timm's validate.py writes its results file)."""
    from sa_vision.io import atomic_write_text
    outputs = []
    for write in (lambda: Path('/dev/stdout').write_text('results\n', encoding='utf-8'),
                  lambda: atomic_write_text('/dev/stdout', 'results\n')):
        print('before', flush=True)
        write()
        print('after', flush=True)
        outputs.append(capfd.readouterr().out)
    assert outputs[1] == outputs[0] and outputs[0].endswith('after\n'), outputs


@pytest.mark.slow
def test_a_run_folder_holds_one_run(tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.chdir(ROOT)  # a user's folder, which the relative path below names the run from
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 2) + ['--save-epoch-weights', '--export'])
    assert status == 0, log[-3000:]
    best = _best_epoch(run / 'summary.csv')
    best_ckpt = torch.load(run / 'model_best.pth.tar', weights_only=True)
    assert best_ckpt['epoch'] == best_ckpt['best']['epoch'] == best - 1  # counted from 0
    # timm's own resume (train.py --resume) continues the two epochs done at the third, epoch 2 counted from 0
    last = run / 'last.pth.tar'
    assert resume_checkpoint(read_checkpoint(last).create_model(), str(last), log_info=False) == 2
    _assert_same_weights(best_ckpt['state_dict'], run / f'epoch-{best:03d}.safetensors')
    # --export publishes the best epoch and says so, in the log and on the card
    _assert_same_weights(torch.load(run / 'model_best.pth.tar', weights_only=True)['state_dict'],
                         run / 'hub' / 'model.safetensors')
    assert f'Exporting model_best.pth.tar: the weights after epoch {best} of 2 (top1 ' \
           f'{best_ckpt["metrics"]["top1"]:.2f}, the best)' in log  # as the Eval lines print it
    assert f'- Weights: after epoch {best} of 2, the best by `--eval-metric top1`.' in (
        run / 'hub' / 'README.md').read_text()
    for path in [*(run / 'hub').iterdir(), *run.glob('*.safetensors'), *run.glob('*.pth.tar')]:
        assert stat.S_IMODE(path.stat().st_mode) == usual_file_mode(), path

    # the same recipe again into the same folder (a new run): refused, the run left as it was
    before = _files(run)
    status, _, err = command_here(capsys, 'train', *_train_args(tmp_path, 'run', 1))
    assert status == 2 and 'already holds a run' in err, err
    # continuing from model_best would mix two histories in the folder: refused too
    status, _, err = command_here(capsys, 'train', '--resume', run / 'model_best.pth.tar', '--epochs', 3)
    assert status == 2 and f'Resume from {run / "last.pth.tar"}' in err, err
    assert _files(run) == before

    # the run continued for a third epoch, exported again: one summary, the Hub folder of the new best, swapped in
    # whole (a file of no export there is refused: test_export_replaces_the_runs_earlier_export_but_no_other_files)
    (run / 'hub' / 'attention.png').write_text('the earlier export\'s figure')
    relative = Path(os.path.relpath(run, ROOT))  # as a user in another folder names it; the log keeps it so
    status, log = train_here(caplog, capsys, '--resume', relative / 'last.pth.tar', '--epochs', 3, '--export')
    assert status == 0, log[-3000:]
    assert f'Run folder {relative};' in log and (f'Saved checkpoint of epoch 2 (3/3 done) to '
                                                     f'{relative / "last.pth.tar"}') in log
    assert (run / 'hub' / 'attention.png').read_bytes().startswith(b'\x89PNG')
    assert (run / 'summary.csv').read_text().count('epoch,') == 1
    best = _best_epoch(run / 'summary.csv')
    assert torch.load(run / 'model_best.pth.tar', weights_only=True)['epoch'] == best - 1
    _assert_same_weights(torch.load(run / 'model_best.pth.tar', weights_only=True)['state_dict'],
                         run / 'hub' / 'model.safetensors')
    assert sorted(p.name for p in run.iterdir() if p.name.startswith('.')) == []


@pytest.mark.parametrize('eval_metric, value, shown', [('top1', 95.0, '95.00'), ('top5', 99.5, '99.50'),
                                                       ('loss', 0.25, '0.2500')])
def test_the_best_metric_is_printed_as_the_eval_lines_print_it(tmp_path, eval_metric, value, shown):
    """Accuracies in % with two decimals, a loss with four, whatever the value's digits."""
    from types import SimpleNamespace

    from sa_vision.train.epoch_files import save_epoch
    lines = []
    ckpt = {'epoch': 0, 'num_epochs': 2, 'best': {'metric': value, 'epoch': 0},
            'metrics': {'loss': 0.25, 'top1': 95.0, 'top5': 99.5},
            'history': [{'epoch': 0, 'train_loss': 0.5, 'lr': 0.1, 'train_time': 1.0, 'eval_top1': 95.0}]}
    args = SimpleNamespace(save_epoch_weights=False, save_epoch_positions=False, eval_metric=eval_metric)
    save_epoch(ckpt, torch.nn.Linear(1, 1), args, tmp_path, lines.append)
    assert f'Best {eval_metric} so far ({shown}): {tmp_path / "model_best.pth.tar"}' in lines


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='fcntl locks: Linux and macOS')
def test_a_run_another_process_is_training_is_not_resumed_into_it(tmp_path, caplog, capsys):
    """Two processes resuming one run would write the same checkpoints: while one trains (it holds the run's
    args.yaml, as here a stand-in process does), another's --resume is refused before it writes anything; once that
    one has ended, the resume goes on. A run lets its folder go when its epochs end."""
    import subprocess
    import sys

    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-2000:]
    run = tmp_path / 'run'
    holder = subprocess.Popen([sys.executable, '-c', 'import fcntl, sys, time\n'
                               f'f = open({str(run / "args.yaml")!r}, "a")\n'
                               'fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n'
                               'print("held", flush=True)\ntime.sleep(60)\n'], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'held\n'  # so this process let the folder go after its epoch
        before = _files(run)
        status, log = train_here(caplog, capsys, '--resume', run / 'last.pth.tar', '--epochs', '2')
        assert status == 2 and (f'another sa-vision-train is running in {run}: let it finish or stop it, then '
                                f'continue the run with --resume {run / "last.pth.tar"}') in log, log[-2000:]
        assert _files(run) == before
    finally:
        holder.kill()
        holder.wait(timeout=HANG_TIMEOUT_S)
    status, log = train_here(caplog, capsys, '--resume', run / 'last.pth.tar', '--epochs', '2')
    assert status == 0 and read_checkpoint(run).meta['epoch'] == 2, log[-2000:]


def test_a_run_holds_its_folder_through_its_export(tmp_path):
    """The report and the Hub folder of --export come after the epochs: a resume from elsewhere meanwhile would
    train into the checkpoint being exported, so the folder is still held then, and let go after."""
    import fcntl
    tried = []

    def export(checkpoint, folder):
        # what another process's --resume takes
        with open(checkpoint.parent / 'args.yaml', 'a', encoding='utf-8') as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                tried.append('taken')
            except BlockingIOError:
                tried.append('refused')
        Path(folder).mkdir(parents=True, exist_ok=True)  # the Hub folder, empty
        return []
    loop.main([str(a) for a in _train_args(tmp_path, 'run', 1)] + ['--export'], export=export)
    assert tried == ['refused']
    # a resume replaces args.yaml (whole, with its new arguments) and holds the new file, which another process opens
    loop.main(['--resume', str(tmp_path / 'run'), '--epochs', '2', '--export'], export=export)
    assert tried == ['refused', 'refused']
    with open(tmp_path / 'run' / 'args.yaml', 'a', encoding='utf-8') as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # let go at the end


def test_the_advice_quotes_a_path_for_the_shell(tmp_path):
    """A run in a folder named with a space (or a quote): the --resume the advice gives pastes into a shell whole."""
    import shlex

    from sa_vision.train.run_folder import training_in
    run = tmp_path / "Mary's runs" / 'run 1'
    run.mkdir(parents=True)
    (run / 'last.pth.tar').write_bytes(b'')
    with pytest.raises(KeyboardInterrupt) as stopped:
        with training_in(run, export=True):
            raise KeyboardInterrupt
    assert shlex.split(str(stopped.value))[-3:] == ['--resume', str(run / 'last.pth.tar'), '--export'], stopped.value


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='fcntl locks: Linux and macOS')
def test_the_lock_is_on_args_yaml_as_it_is_once_held(tmp_path, monkeypatch):
    """A resume elsewhere that replaced args.yaml between this process's open and its lock: the file now there is
    held, not the one replaced (which no other process would open again)."""
    import fcntl

    from sa_vision.train import run_folder
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'args.yaml').write_text('epochs: 1\n')
    real_flock, replaced = fcntl.flock, []

    def flock_after_a_replace(f, operation):
        if not replaced:
            (run / 'new.yaml').write_text('epochs: 2\n')
            os.replace(run / 'new.yaml', run / 'args.yaml')
            replaced.append(True)
        return real_flock(f, operation)
    monkeypatch.setattr(fcntl, 'flock', flock_after_a_replace)
    try:
        run_folder._hold(run)
        with open(run / 'args.yaml', 'a', encoding='utf-8') as other, pytest.raises(BlockingIOError):
            real_flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        run_folder._let_go(run)
