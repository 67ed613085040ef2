""" sa-vision-reproduce end to end on digits with tiny models: five folders, a five-row table, kill and rerun """
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import (
    HANG_TIMEOUT_S,
    PAPER_TABLE_MODELS,
    command,
    command_here,
    keeping_threads,
    logged_here,
    sigint_as_from_a_terminal,
    train_here,
)

pytest.importorskip('sklearn')

ROOT = Path(__file__).resolve().parent.parent
MODELS = PAPER_TABLE_MODELS


def _env():
    return dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1')


@pytest.mark.slow
def test_pipeline_stopped_by_ctrl_c_mid_stage_continues_and_delivers_the_zoo(tmp_path, capfd, caplog, monkeypatch):
    out = tmp_path / 'zoo'
    # Ctrl-C in the middle of the second training stage, after its first epoch: SIGINT to the command's process
    # group, as a terminal sends it (the training's process among them, unless it runs in a group of its own)
    proc = subprocess.Popen([*command('reproduce'), '--profile', 'tiny', '--out', str(out)], cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=sigint_as_from_a_terminal)
    in_second_stage = False
    for line in proc.stdout:
        in_second_stage = in_second_stage or line.startswith('== [2/')
        if in_second_stage and line.startswith('Saved checkpoint of epoch 0 (1/2 done)'):
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest = proc.communicate(timeout=HANG_TIMEOUT_S)[0]
    # one line of advice, the reproduction's: the training ended without its own (a --resume for its stage alone)
    assert 'terminated' not in rest and '--resume' not in rest, rest[-3000:]
    assert proc.returncode == 130 and [line for line in rest.splitlines() if 'interrupted' in line] == [
        f'interrupted: finished stages are kept in {out}; run the same command to continue (a stopped training '
        f'resumes from its last finished epoch)'], rest[-3000:]
    first = out / 'runs' / 'sa_quadratic_cifar' / 'last.pth.tar'
    first_mtime = first.stat().st_mtime_ns
    killed = torch.load(out / 'runs' / 'sa_gen_cifar' / 'last.pth.tar', weights_only=True)
    assert killed['epoch'] == 0 and killed['num_epochs'] == 2  # epoch 0 done

    # the rerun in this process, its trainings too: the killed run above went through the processes
    from sa_vision.reproduce import stages
    monkeypatch.setattr(stages, 'run_training', _in_process_training)
    code, log = logged_here(caplog, capfd, 'reproduce', '--profile', 'tiny', '--out', out)  # with the trainings'
    assert code == 0, log[-4000:]
    assert 'sa_quadratic_cifar: finished (2 epochs), skipped' in log
    assert 'sa_gen_cifar: continuing the killed run at epoch 1' in log
    # the training process itself resumed at the saved epoch and update count (it did not start over)
    assert f'Resuming {out / "runs" / "sa_gen_cifar"} at epoch 1, update {killed["num_updates"]}' in log
    assert first.stat().st_mtime_ns == first_mtime, 'a finished stage was trained again'
    # the resumed stage continued the killed run's weights and optimizer state: it ends where an uninterrupted
    # run of the same recipe ends (a resume that restarted from fresh weights or a fresh optimizer does not)
    status, reference_log = train_here(caplog, capfd, '-c', out / 'recipes' / 'sa_gen_cifar.yaml',
                                       '--output', tmp_path / 'uninterrupted', '--experiment', 'sa_gen_cifar')
    assert status == 0, reference_log[-4000:]
    reference = torch.load(tmp_path / 'uninterrupted' / 'sa_gen_cifar' / 'last.pth.tar', weights_only=True)
    resumed = torch.load(out / 'runs' / 'sa_gen_cifar' / 'last.pth.tar', weights_only=True)
    assert resumed['epoch'] == reference['epoch'] == 1
    for key, value in reference['state_dict'].items():
        assert torch.equal(resumed['state_dict'][key], value), key
    # the silent stages say what they do, and recipe keys that the training script ignores are noted once
    assert 'pruning: evaluating the pruned model' in log
    assert log.count('checks the mechanics') == 1  # the tiny profile's note, under the whole table only
    assert log.count("recipe keys that only timm's train.py reads") <= 1
    assert 'recipe keys not used by this script' not in log

    with open(out / 'results.csv', encoding='utf-8') as f:
        rows = list(csv.DictReader(f))
    assert [r['model'] for r in rows] == list(MODELS)
    assert all(r['dataset'] == 'digits' and float(r['top1']) >= 0 and int(r['parameters']) > 0 for r in rows)
    assert (out / 'results.md').read_text().count('\n| `') == 5

    pruning = json.loads((out / 'pruning.json').read_text())
    assert len(pruning['kept_heads_per_layer']) == 2 and all(k >= 1 for k in pruning['kept_heads_per_layer'])
    # heads numbered from 1 (the file says so), as the figures and sa-vision-prune number them: 3 heads a layer
    assert pruning['heads_numbered_from'] == 1
    assert all(1 <= h <= 3 for layer in pruning['degenerate_heads'] + pruning['pruned_heads'] for h in layer)

    import timm

    import sa_vision  # noqa: F401
    from sa_vision.train.checkpoint import read_checkpoint
    folders = sorted((out / 'hub').iterdir())
    assert sorted(f.name.split('.')[0] for f in folders) == sorted(MODELS)
    x = torch.randn(2, 3, 32, 32)
    for folder in folders:
        assert folder.name.endswith('.digits_custom'), folder.name
        model = timm.create_model(f'local-dir:{folder}', pretrained=True).eval()
        trained = read_checkpoint(out / 'runs' / folder.name.split('.')[0] / 'last.pth.tar').create_model()
        with torch.no_grad():
            assert torch.equal(model(x), trained(x)), folder.name
    assert (out / 'figures' / 'trajectories_sa_quadratic_cifar.png').is_file()
    # each epoch's centres kept for their trajectories, not the whole weights; the learned kind has none to give
    runs = out / 'runs'
    assert not list(runs.glob('*/epoch-*.safetensors'))
    with_centres = sorted(run.name for run in runs.iterdir() if any(
        key.endswith('.centers') for key in read_checkpoint(run / 'last.pth.tar').state_dict))
    assert 'sa_quadratic_cifar' in with_centres and 'sa_learned_cifar' not in with_centres
    assert sorted(p.parent.name for p in runs.glob('*/positional_epochs.safetensors')) == with_centres
    assert 'dry run: would publish' in log
    assert (out / 'explorer.html').stat().st_size > 10_000
    _keep_check_and_draw_the_zoo(out, tmp_path, capfd)

    # everything done: a third run skips every stage (in this process: it starts none)
    code, stdout, stderr = command_here(capfd, 'reproduce', '--profile', 'tiny', '--out', out)
    log = stdout + stderr
    assert code == 0, log[-4000:]
    assert log.count('skipped') >= 5 + 5 + 1  # five trainings, five exports (pruning too), the explorer
    assert 'Epoch' not in log and 'Train: ' not in log

    # a stage that fails stops the run, names itself, and leaves the finished stages as they were
    learned = out / 'runs' / 'sa_learned_cifar' / 'last.pth.tar'
    learned.write_bytes(learned.read_bytes()[:1000])
    code, stdout, stderr = command_here(capfd, 'reproduce', '--profile', 'tiny', '--out', out)
    log = stdout + stderr
    assert code == 1 and "stage 'train sa_learned_cifar' failed" in log and 'corrupted' in log
    assert first.stat().st_mtime_ns == first_mtime and len(list((out / 'hub').iterdir())) == 5


def test_another_setup_in_the_same_folder_is_refused(tmp_path, capsys):
    """A folder holds one reproduction: other options (the profile, or --train-args, which every training stage
    takes) are refused in one error line that says how to go on, not 'run the same command' (which fails again)."""
    from sa_vision.cli import reproduce as reproduce_script
    from sa_vision.errors import run_cli
    from sa_vision.reproduce import Reproduction, ReproductionError
    (tmp_path / 'reproduction.json').write_text(json.dumps({'profile': 'cpu', 'dataset': 'fashion-mnist',
                                                            'epochs': None}))
    with pytest.raises(ReproductionError, match='made with --profile cpu --dataset fashion-mnist, not --profile tiny'):
        Reproduction(tmp_path, 'tiny').run()
    other = tmp_path / 'other'
    Reproduction(other, 'tiny')._check_same_setup()
    assert json.loads((other / 'reproduction.json').read_text())['train_args'] == {}
    status = run_cli(reproduce_script.main, ['--profile', 'tiny', '--out', str(other), '--train-args=--seed 1'])
    err = capsys.readouterr().err
    assert status == 2 and err.count('\n') == 1 and "differs in train_args" in err, err
    assert "--train-args setting seed=1" in err and 'run the same command' not in err, err


def _reproduce_error(capsys, *argv):
    """(exit status, stderr) of sa-vision-reproduce ``argv`` in this process."""
    from sa_vision.cli import reproduce as reproduce_script
    from sa_vision.errors import run_cli
    capsys.readouterr()
    try:
        status = run_cli(reproduce_script.main, [str(a) for a in argv])
    except SystemExit as e:  # argparse's errors
        status = e.code
    return status, capsys.readouterr().err


def test_options_the_chosen_way_of_running_does_not_read_are_refused(tmp_path, capsys):
    for argv, message in (
            (['--check', 'zoo', '--table', 't.csv', '--epochs', 3], '--check does not use --epochs: leave it out'),
            (['--figures-from', 'zoo', '--out', 'o', '--profile', 'tiny'], '--figures-from does not use --profile'),
            (['--out', 'o', '--record', '--no-accuracy'], 'a reproduction does not use --no-accuracy, --record'),
            (['--out', 'o', '--ablation', '--keep', 'z', '--publish'], '--ablation does not use --publish, --keep')):
        status, err = _reproduce_error(capsys, *argv)
        assert status == 2 and message in err, err


def test_keep_never_replaces_models_of_another_dataset_nor_files_no_export_writes(tmp_path, capsys):
    """--keep replaces the kept models of its dataset (the zoo kept in a checkout): checked before any training,
    a folder of another dataset's models, or files no export writes, are refused instead."""
    from sa_vision.reproduce import ReproductionError, check_keep_target
    kept = tmp_path / 'zoo' / 'sa_quadratic_cifar'
    kept.mkdir(parents=True)
    (kept / 'config.json').write_text(json.dumps({'pretrained_cfg': {'tag': 'fashion_mnist_custom'}}))
    out = tmp_path / 'out'
    status, err = _reproduce_error(capsys, '--profile', 'tiny', '--out', out, '--keep', tmp_path / 'zoo')
    assert status == 2 and 'holds weights of another dataset (tag fashion_mnist_custom)' in err, err
    assert not (out / 'runs').exists()
    check_keep_target(tmp_path / 'zoo', 'fashion-mnist')  # the same dataset's models: replaced
    (kept / 'NOTES.md').write_text('mine')
    with pytest.raises(ReproductionError, match='keeping would remove NOTES.md'):
        check_keep_target(tmp_path / 'zoo', 'fashion-mnist')
    with pytest.raises(ReproductionError, match='is a file'):
        check_keep_target(kept / 'NOTES.md', 'digits')


def test_without_fcntl_a_reproduction_runs_unlocked(tmp_path, monkeypatch):
    """Windows has no fcntl: the folder is not locked there (as no run folder is), rather than a traceback."""
    import sys

    from sa_vision.reproduce.provenance import reproduction_lock
    monkeypatch.setitem(sys.modules, 'fcntl', None)  # import fcntl: ImportError, as on Windows
    with reproduction_lock(tmp_path / 'out'), reproduction_lock(tmp_path / 'out'):
        assert (tmp_path / 'out').is_dir()


def test_a_killed_reproductions_half_written_files_go_when_the_next_one_holds_the_folder(tmp_path, capsys):
    """kill -9 between a file's writing and its rename left a hidden full-size temporary (.pruned.tmpPID.pth: a
    whole pruned model) that no later run removed; one of a writer still running stays."""
    import subprocess
    import sys

    from sa_vision.reproduce.provenance import reproduction_lock
    gone = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    dead, alive = int(gone.stdout), os.getppid()  # a process that has ended, and one that runs
    out = tmp_path / 'out'
    (out / 'figures').mkdir(parents=True)
    left = [out / f'.pruned.tmp{dead}.pth', out / 'figures' / f'.maps.tmp{dead}.png']
    writing = out / f'.results.tmp{alive}.md'
    for path in (*left, writing):
        path.write_bytes(b'half')
    with reproduction_lock(out):
        pass
    assert not any(path.exists() for path in left) and writing.exists()
    assert f'removed .pruned.tmp{dead}.pth from {out}: files a reproduction killed' in capsys.readouterr().err


def test_a_folder_is_one_reproduction_at_a_time_and_only_a_reproductions(tmp_path, capsys):
    """A second reproduction in a running one's folder, a run folder of other files, a run or Hub folder of
    sa-vision-train, or a file as --out, and --keep naming --out: one error line each, and nothing in them is
    touched."""
    from sa_vision.reproduce import Reproduction, ReproductionError
    from sa_vision.reproduce.provenance import reproduction_lock
    running = tmp_path / 'running'
    with reproduction_lock(running):
        status, err = _reproduce_error(capsys, '--profile', 'tiny', '--out', running)
    assert status == 2 and f'another sa-vision-reproduce is running in {running}' in err, err
    notes = tmp_path / 'other' / 'runs' / 'sa_quadratic_cifar' / 'notes.txt'
    notes.parent.mkdir(parents=True)
    notes.write_text('mine')
    with pytest.raises(ReproductionError, match='holds neither a run of sa-vision-train nor its args.yaml'):
        Reproduction(tmp_path / 'other', 'tiny').run()
    assert notes.read_text() == 'mine'
    status, err = _reproduce_error(capsys, '--profile', 'tiny', '--out', notes)
    assert status == 2 and 'is a file, not a folder' in err, err
    # a run folder of sa-vision-train (with its export), or a reproduction kept into itself
    run = tmp_path / 'run'
    (run / 'hub').mkdir(parents=True)
    for name in ('args.yaml', 'last.pth.tar', 'hub/config.json'):
        (run / name).write_text('mine')
    status, err = _reproduce_error(capsys, '--profile', 'tiny', '--out', run)
    assert status == 2 and f"{run} is no reproduction's folder but holds args.yaml, hub/config.json, last" in err, err
    assert sorted(p.name for p in run.iterdir()) == ['args.yaml', 'hub', 'last.pth.tar']
    status, err = _reproduce_error(capsys, '--profile', 'tiny', '--out', tmp_path / 'r', '--keep', tmp_path / 'r')
    assert status == 2 and 'names the reproduction folder itself' in err, err
    # --epochs as the profile trains them is the profile's reproduction (its folder continues without them)
    assert Reproduction(tmp_path / 'e', 'tiny', epochs=2).epochs is None
    assert Reproduction(tmp_path / 'e', 'tiny', epochs=3).epochs == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks a machine without a GPU')
def test_a_gpu_profile_without_a_gpu_is_refused_unless_a_device_is_named(tmp_path, capsys, monkeypatch):
    status, err = _reproduce_error(capsys, '--profile', 'gpu-long', '--out', tmp_path / 'g')
    assert status == 2 and "trains on a GPU" in err and '--train-args="--device cpu"' in err, err
    assert not (tmp_path / 'g').exists()
    # named as --device=cpu too (it was refused, with the advice to add what it had): the reproduction starts
    from sa_vision.cli import reproduce as reproduce_cli

    class Started(Exception):
        pass

    def started(*args, **kwargs):
        raise Started
    monkeypatch.setattr(reproduce_cli, 'Reproduction', started)
    for device in (['--train-args=--device=cpu'], ['--train-args', '--device cpu']):
        with pytest.raises(Started):
            reproduce_cli.main(['--profile', 'gpu-long', '--out', str(tmp_path / 'g'), *device])


def test_figures_older_than_their_weights_are_drawn_again(tmp_path):
    """A stage trained anew exports its folder again: its figures follow, the others are kept."""
    from sa_vision.reproduce import draw_figures
    folder = tmp_path / 'sa_quadratic_cifar'
    shutil.copytree(ROOT / 'zoo' / 'fashion-mnist-cpu' / 'sa_quadratic_cifar', folder)
    figures = tmp_path / 'figures'
    figures.mkdir()
    weights_time = max(f.stat().st_mtime for f in folder.iterdir())  # the export writes the folder at once
    for name, age in (('centers', -100), ('maps', 100), ('trajectories', 100)):  # seconds after the weights
        path = figures / f'{name}_sa_quadratic_cifar.png'
        path.write_bytes(b'old')
        os.utime(path, (weights_time + age, weights_time + age))
    draw_figures([folder], figures)
    assert (figures / 'centers_sa_quadratic_cifar.png').read_bytes()[:4] == b'\x89PNG'
    assert (figures / 'maps_sa_quadratic_cifar.png').read_bytes() == b'old'


def test_publishing_without_a_token_fails_before_the_first_training(tmp_path, monkeypatch, capsys):
    """--publish uploads in the last stage: a missing token is one error line before any stage runs, not after
    every training."""
    import huggingface_hub

    from sa_vision.cli import reproduce as reproduce_script
    from sa_vision.errors import run_cli
    monkeypatch.delenv('HF_TOKEN', raising=False)
    monkeypatch.setattr(huggingface_hub, 'get_token', lambda: None)
    status = run_cli(reproduce_script.main, ['--profile', 'tiny', '--out', str(tmp_path / 'r'), '--publish'])
    err = capsys.readouterr().err
    assert status == 2 and err.count('error:') == 1 and 'no Hugging Face token' in err, err
    assert not (tmp_path / 'r').exists()  # nothing written: the options are checked first (docs/reproduction.md)


def test_a_reproduction_continues_on_another_device_or_worker_count(tmp_path):
    """--train-args' device and speed flags (docs/reproduction.md) are no part of the setup a folder holds: a
    killed reproduction continues with another --device or --workers, also in a folder whose reproduction.json
    holds the command line (an older sa_vision's); a training argument (--seed) still differs."""
    from sa_vision.reproduce import Reproduction, ReproductionError
    Reproduction(tmp_path / 'a', 'tiny', train_args=['--device', 'cpu'])._check_same_setup()
    Reproduction(tmp_path / 'a', 'tiny', train_args=['--device', 'cpu', '--workers', '0'])._check_same_setup()
    (tmp_path / 'b').mkdir()
    (tmp_path / 'b' / 'reproduction.json').write_text(json.dumps(
        {'profile': 'tiny', 'dataset': 'digits', 'epochs': None, 'train_args': ['--device', 'cpu', '--seed', '1']}))
    Reproduction(tmp_path / 'b', 'tiny', train_args=['--seed', '1', '--workers', '0'])._check_same_setup()
    for folder in ('a', 'b'):
        with pytest.raises(ReproductionError, match='differs in train_args'):
            Reproduction(tmp_path / folder, 'tiny', train_args=['--device', 'cpu', '--seed', '2'])._check_same_setup()


def _in_process_training(cmd, tag, trainings=None):
    """A stage's sa-vision-train run in this process (seconds for the tiny profile, no interpreter start), on one
    thread as the stages' processes run here (OMP_NUM_THREADS=1), so that it repeats a run of theirs bitwise."""
    from sa_vision.cli import train
    from sa_vision.errors import run_cli
    assert cmd[1:3] == ['-m', 'sa_vision.cli.train'], cmd
    with keeping_threads():
        return run_cli(train.main, [*cmd[3:], '--threads', '1'])


def test_a_run_is_skipped_or_continued_only_as_the_run_of_its_stages_arguments(tmp_path, monkeypatch, capsys):
    """A run trained with other arguments (one epoch with --seed 1, copied into the folder of another
    reproduction) is neither skipped as finished nor continued: the error names what differs; the same
    options skip it."""
    import shutil

    from sa_vision.reproduce import Reproduction, ReproductionError, stages
    from sa_vision.train.args import build_parser
    monkeypatch.setattr(stages, 'run_training', _in_process_training)
    made = Reproduction(tmp_path / 'made', 'tiny', epochs=1, train_args=['--seed', '1'])
    made.train('sa_quadratic_cifar')
    trained = []
    monkeypatch.setattr(stages, 'run_training', lambda cmd, tag, trainings: trained.append(cmd) or 0)
    capsys.readouterr()
    made.train('sa_quadratic_cifar')
    assert 'sa_quadratic_cifar: finished (1 epoch), skipped' in capsys.readouterr().out
    default_seed = build_parser().parse_args([]).seed
    for name, options, differing in (
            ('seed', dict(epochs=1), f'seed: 1 in the run, {default_seed} here'),
            ('epochs', dict(epochs=2, train_args=['--seed', '1']), 'epochs: 1 in the run, 2 here')):
        other = Reproduction(tmp_path / name, 'tiny', **options)
        shutil.copytree(made.run_dir('sa_quadratic_cifar'), other.run_dir('sa_quadratic_cifar'))
        with pytest.raises(ReproductionError) as error:  # the whole pipeline stops at its first stage, saying why
            other.run()
        assert differing in str(error.value) and 'Remove ' in str(error.value), str(error.value)
    assert not trained


def _image_folder(root, classes=('c2', 'c10', 'cat', 'dog'), per_class=(6, 2)):
    """``train/`` and ``validation/`` of tiny PNGs, RGB 40x24 and grey 24x40, one colour per class."""
    from PIL import Image
    for split, count in zip(('train', 'validation'), per_class):
        for label, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                image = Image.new('RGB', (40, 24), (60 * label, 255 - 60 * label, 128)) if i % 2 else Image.new(
                    'L', (24, 40), 60 * label)
                image.save(root / split / name / f'{i}.png')
    return root


def test_a_reproduction_on_an_image_folder_has_as_many_classes_as_its_class_folders(tmp_path, monkeypatch, capsys):
    """An image folder states no class count: a stage's model has one class per class folder (the paper recipes'
    num_classes is CIFAR-10's 10), and its finished run is skipped as that stage's; --train-args asking for another
    count are refused before anything is written, naming the option of sa-vision-reproduce to change."""
    from sa_vision.cli import reproduce as reproduce_script
    from sa_vision.errors import run_cli
    from sa_vision.reproduce import Reproduction, stages
    from sa_vision.train.checkpoint import read_checkpoint
    folder = _image_folder(tmp_path / 'pets')
    monkeypatch.setattr(stages, 'run_training', _in_process_training)
    zoo = Reproduction(tmp_path / 'out', 'tiny', dataset='pets', data_dir=str(folder), epochs=1, train_args=['-b', '8'])
    last = zoo.train('sa_quadratic_cifar')
    model = read_checkpoint(last).create_model().eval()
    assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 4)  # the four class folders written above
    monkeypatch.setattr(stages, 'run_training', lambda cmd, tag, trainings: pytest.fail(f'trained again: {cmd}'))
    capsys.readouterr()
    zoo.train('sa_quadratic_cifar')
    assert 'sa_quadratic_cifar: finished (1 epoch), skipped' in capsys.readouterr().out
    # a run of an earlier version recorded the class names sorted plainly, or none: the same folder still skips it
    checkpoint = torch.load(last, weights_only=True)
    for recorded in (['c10', 'c2', 'cat', 'dog'], None):
        torch.save({**checkpoint, 'args': {**checkpoint['args'], 'label_names': recorded}}, last)
        zoo.train('sa_quadratic_cifar')
        assert 'sa_quadratic_cifar: finished (1 epoch), skipped' in capsys.readouterr().out
    torch.save(checkpoint, last)
    # a class renamed since: the run's labels are no longer the folder's, and it is not skipped as if they were
    from sa_vision.reproduce import ReproductionError
    for split in ('train', 'validation'):
        (folder / split / 'dog').rename(folder / split / 'zebra')
    with pytest.raises(ReproductionError, match=r"label_names: \['c2', 'c10', 'cat', 'dog'\] in the run, \['c2', "
                                                r"'c10', 'cat', 'zebra'\] here.*The class folders of .* are not those "
                                                r"the run trained on"):
        zoo.train('sa_quadratic_cifar')
    for split in ('train', 'validation'):
        (folder / split / 'zebra').rename(folder / split / 'dog')

    out = tmp_path / 'other'
    status = run_cli(reproduce_script.main, ['--profile', 'tiny', '--dataset', 'pets', '--data-dir', str(folder),
                                             '--train-args=-b 8 --num-classes 5', '--out', str(out)])
    err = capsys.readouterr().err
    assert status == 2 and err.count('error:') == 1 and not out.exists(), err
    assert 'asks every training stage for 5 classes' in err and '4 class folders' in err and '--train-args' in err, err


def test_pruning_json_and_the_log_number_heads_from_1(tmp_path, capsys):
    """The second head of the one layer planted degenerate (index 1) is head 2 in pruning.json and in the log, as
    the figures and sa-vision-prune number it."""
    from sa_vision.reproduce import Reproduction
    zoo = Reproduction(tmp_path, 'tiny')
    _finished_run(tmp_path, 'sa_gen_cifar')
    path = tmp_path / 'runs' / 'sa_gen_cifar' / 'last.pth.tar'
    ckpt = torch.load(path, weights_only=True)
    ckpt['state_dict']['blocks.0.attn.position.precision_factors'][1] = torch.eye(2) * 1e-3  # M_h's largest 1e-6
    torch.save(ckpt, path)
    zoo.prune()
    report = json.loads((tmp_path / 'pruning.json').read_text())
    assert report['heads_numbered_from'] == 1 and report['pruned_heads'] == report['degenerate_heads'] == [[2]]
    assert report['kept_heads_per_layer'] == [1]
    assert 'degenerate heads per layer [[2]], pruning [[2]]' in capsys.readouterr().out


def test_pruning_and_its_fine_tuning_are_made_again_when_the_source_weights_change(tmp_path, capsys):
    """pruned.pth is the pruning of the source's weights as they are now: kept while they are the same, made again
    (and the fine-tuning of the old ones removed) when the source stage was trained again."""
    from sa_vision.reproduce import Reproduction
    zoo = Reproduction(tmp_path, 'tiny')
    source = _finished_run(tmp_path, 'sa_gen_cifar')
    zoo.prune()
    finetuned = zoo.run_dir('sa_gen_pruned')
    finetuned.mkdir(parents=True)
    (finetuned / 'last.pth.tar').write_bytes(b'the fine-tuning of these pruned weights')
    zoo.prune()
    assert 'pruning: done ([2] heads kept), skipped' in capsys.readouterr().out and finetuned.is_dir()

    shutil.rmtree(tmp_path / 'runs' / 'sa_gen_cifar')  # the source trained again: other weights
    torch.manual_seed(1)
    retrained = _finished_run(tmp_path, 'sa_gen_cifar')
    assert any(not torch.equal(retrained[k], source[k]) for k in source)
    zoo.prune()
    assert 'skipped' not in capsys.readouterr().out and not finetuned.exists()
    pruned = torch.load(tmp_path / 'pruned.pth', weights_only=True)['state_dict']
    assert pruned.keys() == retrained.keys() and all(torch.equal(pruned[k], retrained[k]) for k in retrained)


@pytest.mark.parametrize('argv, message', [
    (['--dataset', 'fashon-mnist'], "unknown dataset 'fashon-mnist': not one of"),
    (['--profile', 'paper', '--train-args=--device cpu'], "dataset 'torch/cifar10' needs --data-dir"),
    (['--profile', 'paper', '--data-dir', '{empty}', '--train-args=--device cpu'], 'torch/cifar10 is not in'),
    (['--profile', 'tiny', '--epochs', '0'], '--epochs is 0, it must be at least 1'),
    (['--profile', 'tiny', '--train-args=--batch-size 0'], '--batch-size is 0, it must be at least 1'),
], ids=['misspelt', 'cifar10-without-data-dir', 'cifar10-not-in-data-dir', 'epochs-0', 'batch-size-0'])
def test_a_dataset_that_cannot_be_read_fails_before_anything_is_written(argv, message, tmp_path, capsys):
    """A mistake in the dataset or training arguments is one error line with status 2 (as argparse's), and no
    folder, recipe or training is started: the same folder takes the corrected options."""
    from sa_vision.cli import reproduce as reproduce_script
    from sa_vision.errors import run_cli
    out = tmp_path / 'out'
    (tmp_path / 'empty').mkdir()
    argv = [a.replace('{empty}', str(tmp_path / 'empty')) for a in argv]
    status = run_cli(reproduce_script.main, [*argv, '--out', str(out)])
    captured = capsys.readouterr()
    assert status == 2 and captured.err.startswith('error: ') and captured.err.count('error:') == 1, captured.err
    assert message in captured.err and not out.exists() and '== [1/' not in captured.out


def test_profiles_keep_the_paper_depth_and_heads_and_the_paper_recipes():
    from sa_vision.reproduce import PROFILES
    from sa_vision.reproduce.stages import _training_script_keys
    from sa_vision.train.recipes import load_recipe
    for model in MODELS:  # the paper profile: the recipes unchanged, CIFAR-10's test split
        expected = load_recipe(model)
        expected.pop('initial_checkpoint', None)  # given per run: the pruned weights
        expected.update(dataset='torch/cifar10', val_split='test', num_classes=10)
        assert PROFILES['paper'].recipe(model, 'torch/cifar10') == expected, model
    cpu = PROFILES['cpu'].recipe('sa_quadratic_cifar', 'fashion-mnist')
    assert 'depth' not in cpu['model_kwargs'] and 'heads_per_layer' not in cpu['model_kwargs']
    assert cpu['dataset'] == 'fashion-mnist' and cpu['epochs'] < 300
    # the CPU zoo decides bf16 on the machine that trains it (a recorded 'auto'); the paper's recipes do not
    assert all(PROFILES['cpu'].recipe(m, 'fashion-mnist')['amp'] == 'auto' for m in MODELS)
    # and whether compiling pays there: the training script reads the key (it is not left out as timm-only)
    assert all(PROFILES['cpu'].recipe(m, 'fashion-mnist')['torchcompile'] == 'auto' for m in MODELS)
    assert 'torchcompile' in _training_script_keys()
    assert all(PROFILES['paper'].recipe(m, 'torch/cifar10').get('amp') != 'auto' for m in MODELS)
    assert 'heads_per_layer' not in PROFILES['cpu'].recipe('sa_gen_pruned', 'fashion-mnist').get('model_kwargs', {})


def _finished_run(out, model='sa_quadratic_cifar'):
    """runs/<model>/last.pth.tar as a finished training writes it (tiny model, digits, one epoch)."""
    import timm

    from sa_vision.train.checkpoint import CHECKPOINT_VERSION
    model_args = dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32, num_classes=10)
    state_dict = timm.create_model(model, **model_args).state_dict()
    run = out / 'runs' / model
    run.mkdir(parents=True)
    recipe = {'model': model, 'dataset': 'digits', 'epochs': 1, 'opt': 'adamw', 'lr': 2e-3, 'batch_size': 64,
              'model_kwargs': {k: v for k, v in model_args.items() if k != 'num_classes'}}
    torch.save({'version': CHECKPOINT_VERSION, 'arch': model, 'model_args': model_args, 'state_dict': state_dict,
                'epoch': 0, 'num_epochs': 1, 'num_updates': 20, 'dataset': 'digits', 'recipe': recipe,
                'metrics': {'top1': 50.0, 'top5': 90.0, 'loss': 1.0},
                'history': [{'epoch': 1, 'train_loss': 1.5, 'lr': 2e-3, 'eval_loss': 1.0, 'eval_top1': 50.0,
                             'eval_top5': 90.0, 'train_time': 2.5}]},
               run / 'last.pth.tar')
    return state_dict


def test_export_interrupted_after_config_json_is_redone(tmp_path, monkeypatch, capsys):
    """A killed export (config.json and weights written, no model card yet) is not taken for up to date."""
    from sa_vision.hub import export as hub  # where export_hub_folder looks the card renderer up
    from sa_vision.reproduce import Reproduction
    _finished_run(tmp_path)
    reproduction = Reproduction(tmp_path, 'tiny')

    def killed(*args, **kwargs):
        raise KeyboardInterrupt('killed while rendering the model card')
    render = hub.render_model_card
    monkeypatch.setattr(hub, 'render_model_card', killed)
    with pytest.raises(KeyboardInterrupt):
        reproduction.export(models=['sa_quadratic_cifar'])
    monkeypatch.setattr(hub, 'render_model_card', render)
    capsys.readouterr()

    folder, = reproduction.export(models=['sa_quadratic_cifar'])
    assert 'up to date' not in capsys.readouterr().out
    assert {'config.json', 'model.safetensors', 'README.md'} <= {p.name for p in folder.iterdir()}
    assert [p.name for p in (tmp_path / 'hub').iterdir()] == [folder.name]
    reproduction.export(models=['sa_quadratic_cifar'])
    assert 'up to date, skipped' in capsys.readouterr().out


def test_export_never_replaces_files_of_no_export(tmp_path):
    """A Hub folder of the reproduction that holds other files (here through a link to a folder of the user's) is
    refused, and those files stay."""
    from sa_vision.hub import ExportExistsError
    from sa_vision.reproduce import Reproduction
    _finished_run(tmp_path)
    reproduction = Reproduction(tmp_path, 'tiny')
    folder, = reproduction.export(models=['sa_quadratic_cifar'])
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')
    shutil.rmtree(folder)
    folder.symlink_to(mine)
    with pytest.raises(ExportExistsError, match=r"not part of an export \(\['notes.txt'\]\)"):
        reproduction.export(models=['sa_quadratic_cifar'])
    assert [p.name for p in mine.iterdir()] == ['notes.txt']


def test_stage_recipes_leave_out_timm_only_keys_and_say_so_once(tmp_path, monkeypatch, capsys):
    """The paper's recipes hold keys only timm's train.py reads (color_jitter, ...): one note for the whole
    reproduction, not one per training stage, and the stage recipes hold only what the training script reads."""
    from sa_vision import reproduce
    from sa_vision.train.args import build_parser
    from sa_vision.train.recipes import load_recipe
    commands = []
    monkeypatch.setattr(reproduce.stages, 'run_training', lambda cmd, tag, trainings: commands.append(cmd) or 0)
    reproduction = reproduce.Reproduction(tmp_path, 'tiny')
    for model in ('sa_quadratic_cifar', 'sa_gen_cifar', 'resnet18_cifar'):
        reproduction.train(model)
    log = capsys.readouterr().out
    assert len(commands) == 3
    assert log.count("recipe keys that only timm's train.py reads") == 1 and 'color_jitter' in log, log
    script_keys = {action.dest for action in build_parser()._actions}
    for model in ('sa_quadratic_cifar', 'sa_gen_cifar', 'resnet18_cifar'):
        path = tmp_path / 'recipes' / f'{model}.yaml'
        assert set(load_recipe(path)) <= script_keys
        assert 'color_jitter: 0.0' in path.read_text().splitlines()[0]  # named in the header comment


def test_results_table_reads_for_a_mechanics_check(tmp_path, capsys):
    """A run of seconds shows seconds (not '0.0' minutes); the tiny profile's table says its models are not
    meant to learn (near chance, pruning may remove nothing), in results.md, and once in the output: under the
    whole table, not under each partial one printed after a training stage."""
    from sa_vision.reproduce import Reproduction
    _finished_run(tmp_path)
    Reproduction(tmp_path, 'tiny').table(['sa_quadratic_cifar'])
    printed = capsys.readouterr().out
    assert '| `sa_quadratic_cifar`' in printed and 'checks the mechanics' not in printed, printed
    Reproduction(tmp_path, 'tiny').table()
    assert capsys.readouterr().out.count('checks the mechanics') == 1
    markdown = (tmp_path / 'results.md').read_text()
    row = next(line for line in markdown.splitlines() if line.startswith('| `sa_quadratic_cifar`'))
    assert row.split(' | ')[7] == '2.5 s', row  # history: train_time 2.5 s
    assert 'checks the mechanics' in markdown and 'close to chance' in markdown and 'keeps every head' in markdown


def test_the_tiny_profiles_note_holds_for_any_dataset_and_epochs():
    """The note under a tiny reproduction's table is printed whatever its --dataset and --epochs (torch/cifar100, an
    image folder of 4 classes, --epochs 1): it gives chance as one over the number of classes, digits' 10 % as
    digits', and no count of epochs."""
    import re

    from sa_vision.reproduce import PROFILES
    note = ' '.join(PROFILES['tiny'].table_note.split())
    assert 'close to chance, a top-1 of 100 % over the number of classes' in note, note
    figures = [(m.group(), note[m.end():].split()[:2]) for m in re.finditer(r'\b\d+ %', note)]
    assert figures == [('100 %', ['over', 'the']), ('10 %', ['on', 'digits;'])], note
    assert not re.search(r'\d+ epochs', note), note


def test_results_table_has_the_median_centre_shift_of_each_run(tmp_path):
    """The column compares a run's epoch-000 weights with its last: a run whose centres moved by hand."""
    import timm
    from safetensors.torch import save_file

    import sa_vision  # noqa: F401
    from sa_vision.io import atomic_torch_save
    from sa_vision.reproduce import Reproduction
    from sa_vision.train.checkpoint import CHECKPOINT_VERSION
    kwargs = dict(embed_dim=8, depth=1, heads_per_layer=4, mlp_hidden_dim=8, num_classes=10)
    zoo = Reproduction(tmp_path, 'tiny')
    for arch in ('sa_quadratic_cifar', 'sa_learned_cifar'):
        model = timm.create_model(arch, **kwargs)
        run = zoo.run_dir(arch)
        run.mkdir(parents=True)
        initial = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(initial, str(run / 'epoch-000.safetensors'),
                  metadata={'arch': arch, 'model_args': json.dumps(kwargs)})
        final = dict(initial)
        if arch == 'sa_quadratic_cifar':  # heads moved by 0.5, 1, 2, 4 grid units: median 1.5
            final['blocks.0.attn.position.centers'] = initial['blocks.0.attn.position.centers'] + torch.tensor(
                [[0.5, 0.], [0., -1.], [2., 0.], [0., 4.]])
        atomic_torch_save({'version': CHECKPOINT_VERSION, 'arch': arch, 'model_args': kwargs, 'state_dict': final,
                           'epoch': 0, 'num_epochs': 1, 'metrics': {'top1': 50., 'top5': 90.},
                           'history': [{'train_time': 60.}]}, run / 'last.pth.tar')
    zoo.table(quiet=True)
    with open(tmp_path / 'results.csv', encoding='utf-8') as f:
        rows = {r['model']: r for r in csv.DictReader(f)}
    assert float(rows['sa_quadratic_cifar']['center_shift_median']) == pytest.approx(1.5)
    assert rows['sa_learned_cifar']['center_shift_median'] == ''
    assert '| 1.50 |' in (tmp_path / 'results.md').read_text()


def test_ablation_variants_reach_the_stage_recipes(tmp_path, monkeypatch):
    """Each variant trains the profile's quadratic model with its own init and positional lr, nothing else changed."""
    import yaml

    from sa_vision import reproduce
    commands = []
    monkeypatch.setattr(reproduce.stages, 'run_training', lambda cmd, tag, trainings: commands.append(cmd) or 0)
    reproduction = reproduce.Reproduction(tmp_path, 'cpu', epochs=2)
    base = reproduce.PROFILES['cpu'].recipe('sa_quadratic_cifar', 'fashion-mnist', epochs=2)
    expected = {  # written out here, independent of ABLATION_VARIANTS
        'ablation-paper-init': ('paper', 1.0),
        'ablation-paper-init-positional-lr-x30': ('paper', 30.0),
        'ablation-conv-init-theorem-1': ('conv', 1.0),
        'ablation-conv-init-theorem-1-positional-lr-x30': ('conv', 30.0),
    }
    assert [reproduce.ablation_run_name(v) for v in reproduce.ABLATION_VARIANTS] == list(expected)
    for variant, changes in reproduce.ABLATION_VARIANTS.items():
        reproduction.train(reproduce.ABLATION_MODEL, run=reproduce.ablation_run_name(variant), changes=changes)
    for cmd, (run, (pos_init, scale)) in zip(commands, expected.items()):
        assert cmd[cmd.index('--experiment') + 1] == run
        recipe = yaml.safe_load(Path(cmd[cmd.index('-c') + 1]).read_text(encoding='utf-8'))
        assert recipe['model'] == 'sa_quadratic_cifar' and recipe['epochs'] == 2
        assert recipe['model_kwargs']['pos_init'] == pos_init and recipe['pos_lr_scale'] == scale
        assert {k: v for k, v in recipe['model_kwargs'].items() if k != 'pos_init'} == {
            k: v for k, v in base['model_kwargs'].items() if k != 'pos_init'}
        assert recipe['lr'] == base['lr'] and recipe['opt'] == base['opt']


def test_ablation_table_reads_each_variant_run(tmp_path, monkeypatch):
    """ablation.csv: one row per variant, top-1 and the centre shift of that variant's own run."""
    from safetensors.torch import save_file

    from sa_vision import reproduce
    runs = {}
    for i, variant in enumerate(reproduce.ABLATION_VARIANTS):
        name = reproduce.ablation_run_name(variant)
        final = _finished_run(tmp_path, 'sa_quadratic_cifar')
        os.replace(tmp_path / 'runs' / 'sa_quadratic_cifar', tmp_path / 'runs' / name)
        initial = {k: v.clone() for k, v in final.items()}
        for key in initial:
            if key.endswith('position.centers'):
                initial[key] = final[key] - torch.tensor([0., float(i)])  # every head moved i grid units
        save_file(initial, str(tmp_path / 'runs' / name / 'epoch-000.safetensors'))
        runs[name] = i
    monkeypatch.setattr(reproduce.Reproduction, 'train',
                        lambda self, model, run=None, changes=None, **kw: self.run_dir(run) / 'last.pth.tar')
    rows = reproduce.Reproduction(tmp_path, 'tiny').ablation()
    with open(tmp_path / 'ablation.csv', encoding='utf-8') as f:
        csv_rows = list(csv.DictReader(f))
    assert [r['run'] for r in csv_rows] == list(runs)
    assert [float(r['center_shift_median']) for r in csv_rows] == [0., 1., 2., 3.]
    assert all(float(r['top1']) == 50.0 for r in csv_rows) and len(rows) == 4
    assert '| paper init, positional lr x30 | 1 | 50.00 |' in (tmp_path / 'ablation.md').read_text()


def _check(capfd, zoo, table, *extra):
    status, out, err = command_here(capfd, 'reproduce', '--check', zoo, '--table', table, *extra)
    return SimpleNamespace(returncode=status, stdout=out, stderr=err)


def _keep_check_and_draw_the_zoo(out, tmp_path, capfd):
    """The run's Hub folders kept as a checkout keeps the zoo: loadable by timm, publishable as they are, checked
    against the results table (and failing the check once a weight or a table figure changes), and drawn."""
    import timm
    from safetensors.torch import load_file, save_file

    from sa_vision.cli import push_to_hub
    from sa_vision.reproduce import Reproduction, draw_figures, kept_guard_paths
    from sa_vision.train.positional_epochs import POSITIONAL_EPOCHS_FILE, load_positional_trajectory
    zoo = tmp_path / 'kept' / 'digits-tiny'
    kept = Reproduction(out, 'tiny').keep(zoo)
    assert sorted(p.name for p in kept) == sorted(MODELS)
    epochs = load_positional_trajectory(zoo / 'sa_quadratic_cifar' / POSITIONAL_EPOCHS_FILE)
    assert list(epochs) == ['epoch-000', 'epoch-001', 'epoch-002']
    final = load_file(str(zoo / 'sa_quadratic_cifar' / 'model.safetensors'))
    assert all(torch.equal(v, final[k]) for k, v in epochs['epoch-002'].items())
    for folder in kept:
        timm.create_model(f'local-dir:{folder}', pretrained=True)

    # published file for file, nothing re-exported into it
    before = sorted(p.name for p in (zoo / 'sa_quadratic_cifar').iterdir())
    assert push_to_hub.main([str(zoo / 'sa_quadratic_cifar'), '--dry-run']) == 0
    assert sorted(p.name for p in (zoo / 'sa_quadratic_cifar').iterdir()) == before
    assert POSITIONAL_EPOCHS_FILE in before

    table = out / 'results.csv'
    check = _check(capfd, zoo, table)  # a check needs the guard: the weights' SHA-256 and logits
    assert check.returncode == 2 and 'has no guard beside it' in check.stderr, check.stdout + check.stderr
    record = _check(capfd, zoo, table, '--record')
    assert record.returncode == 0 and 'on all 360 test images' in record.stdout, record.stdout + record.stderr
    check = _check(capfd, zoo, table)
    assert check.returncode == 0 and check.stdout.count(': ok') == 5, check.stdout + check.stderr
    with open(table, encoding='utf-8') as f:
        rows = list(csv.DictReader(f))
    assert {r['eval_precision'] for r in rows} == {'float32'}
    best = max(rows, key=lambda r: float(r['top1']))  # far enough from chance that mixed-up classes show
    weights_path = zoo / best['model'] / 'model.safetensors'
    weights = load_file(str(weights_path))
    head = next(k for k in weights if k.endswith(('head.weight', 'fc.weight')))
    original = weights_path.read_bytes()
    save_file({**weights, head: weights[head].roll(1, dims=0)}, str(weights_path))
    check = _check(capfd, zoo, table)
    assert check.returncode == 1 and 'DIFFERS' in check.stdout, check.stdout + check.stderr
    weights_path.write_bytes(original)
    edited = tmp_path / 'edited.csv'
    lowered = f',{float(best["top5"]) - 0.5:g},float32'
    edited.write_text(table.read_text().replace(f',{best["top5"]},float32', lowered, 1))
    for kind, path in kept_guard_paths(table).items():
        shutil.copy(path, kept_guard_paths(edited)[kind])
    assert edited.read_text() != table.read_text()
    check = _check(capfd, zoo, edited)
    assert check.returncode == 1 and check.stdout.count('DIFFERS') == 1, check.stdout + check.stderr

    figures = draw_figures(kept, tmp_path / 'figures')
    assert {p.name for p in figures} >= {'trajectories_sa_quadratic_cifar.png', 'centers_sa_gen_cifar.png'}


@pytest.mark.slow
def test_a_stage_killed_before_its_first_checkpoint_trains_again_from_the_start(tmp_path, capsys, monkeypatch):
    """A training killed before its first epoch was saved leaves a run folder without last.pth.tar; the training
    script refuses a new run into a folder that holds files, so the stage clears it and trains anew."""
    from sa_vision.reproduce import Reproduction, stages
    monkeypatch.setattr(stages, 'run_training', _in_process_training)
    zoo = Reproduction(tmp_path, 'tiny', epochs=1)
    run = zoo.run_dir('sa_quadratic_cifar')
    run.mkdir(parents=True)
    (run / 'args.yaml').write_text('model: sa_quadratic_cifar\n')  # what the killed training had written
    (run / 'positional_epochs.safetensors').write_bytes(b'the killed run\'s initialisation')
    last = zoo.train('sa_quadratic_cifar')
    assert 'holds no finished epoch, removed' in capsys.readouterr().out
    assert torch.load(last, weights_only=True)['epoch'] == 0
    assert (run / 'positional_epochs.safetensors').read_bytes() != b'the killed run\'s initialisation'



class _Killed(Exception):
    pass


def test_a_run_an_older_reproduction_began_keeps_centres_not_whole_weights_once_resumed(tmp_path, monkeypatch):
    """Until 2026-11-29 a Gaussian model's stage kept the whole weights of every epoch (48 MB each at the paper's
    size), and --resume keeps a run's own arguments: the stage's resume turns them off and keeps the centres
    instead, ahead of its --train-args (which still win)."""
    from safetensors import safe_open

    from sa_vision.reproduce import Reproduction, stages
    from sa_vision.train import loop
    from sa_vision.train.positional_epochs import POSITIONAL_EPOCHS_FILE, run_epochs
    zoo = Reproduction(tmp_path, 'tiny', epochs=2, train_args=['--seed', '1'])
    run, save = zoo.run_dir('sa_quadratic_cifar'), loop.save_epoch

    def save_and_stop(ckpt, *rest):  # killed right after its first epoch's files
        save(ckpt, *rest)
        raise _Killed
    with monkeypatch.context() as older:  # the stage as it was: whole weights, no centres file
        older.setattr(stages, 'keeps_epoch_positions', lambda model: False)
        older.setattr(stages, 'run_training',
                      lambda cmd, tag, trainings: _in_process_training(cmd + ['--save-epoch-weights'], tag))
        older.setattr(loop, 'save_epoch', save_and_stop)
        with pytest.raises(_Killed):
            zoo.train('sa_quadratic_cifar')
    whole = ['epoch-000.safetensors', 'epoch-001.safetensors']
    assert sorted(p.name for p in run.glob('epoch-*')) == whole and not (run / POSITIONAL_EPOCHS_FILE).exists()
    commands = []
    monkeypatch.setattr(stages, 'run_training',
                        lambda cmd, tag, trainings: commands.append(cmd) or _in_process_training(cmd, tag))
    zoo.train('sa_quadratic_cifar')
    resumed, = commands
    assert '--resume' in resumed and resumed.index('--no-save-epoch-weights') < resumed.index('--seed')
    assert resumed.index('--save-epoch-positions') < resumed.index('--seed')
    assert sorted(p.name for p in run.glob('epoch-*')) == whole
    final = torch.load(run / 'last.pth.tar', map_location='cpu', weights_only=True)
    with safe_open(str(run / POSITIONAL_EPOCHS_FILE), 'pt') as f:
        # the epoch it resumed from (its whole weights are kept too), then the one it trained
        assert json.loads(f.metadata()['epochs']) == ['epoch-001', 'epoch-002'] and final['epoch'] == 1
        assert all(torch.equal(f.get_tensor(key)[1], final['state_dict'][key]) for key in f.keys())
    assert list(run_epochs(run)) == ['epoch-000', 'epoch-001', 'epoch-002']


def _fake_staged_zoo(tmp_path, monkeypatch, seconds):
    """A StagedZoo whose stages write the kept files and the row at once and take ``seconds[model]`` of a clock."""
    from sa_vision.hub import HUB_FOLDER_FILES
    from sa_vision.reproduce import Reproduction, staged
    clock = [0.0]
    monkeypatch.setattr(staged.time, 'time', lambda: clock[0])
    zoo = staged.StagedZoo(Reproduction(tmp_path / 'out', 'tiny'), tmp_path / 'zoo', tmp_path / 't.csv')
    ran, table_lock = [], threading.Lock()

    def stage(model):
        ran.append(model)
        clock[0] += seconds[model]
        for name in HUB_FOLDER_FILES:
            (zoo.zoo / model).mkdir(parents=True, exist_ok=True)
            (zoo.zoo / model / name).write_text('x')
        with table_lock:  # as StagedZoo.stage: one writer at a time, and readers see a whole file
            rows = [*zoo.rows(), model]
            with staged.atomic_write(zoo.table) as tmp:
                Path(tmp).write_text('model\n' + ''.join(f'{m}\n' for m in rows), encoding='utf-8')
    monkeypatch.setattr(zoo, 'stage', stage)
    return zoo, ran


def test_staged_zoo_starts_only_the_stages_the_budget_fits_and_resumes(tmp_path, monkeypatch):
    from sa_vision.reproduce import PRUNED_MODEL, STAGE_ORDER
    order = list(STAGE_ORDER)
    assert order.index(PRUNED_MODEL) == order.index('sa_gen_cifar') + 1
    seconds = {m: 100 for m in order}
    zoo, ran = _fake_staged_zoo(tmp_path, monkeypatch, seconds)
    # estimates of 100 s: two stages fit 250 s, the third would end at 300
    assert zoo.run(250, lambda m: 100) == order[:2] and ran == order[:2]
    assert PRUNED_MODEL in order
    # the next call skips the kept ones; its first stage takes twice its estimate, so the next is expected to take
    # 200 s too, more than the 150 left
    seconds.update({m: 200 for m in order})
    assert zoo.run(350, lambda m: 100) == order[2:3]
    assert zoo.missing() == order[3:]


def test_staged_zoo_refuses_a_zoo_folder_of_other_files_before_any_stage(tmp_path, monkeypatch):
    from sa_vision.hub import ExportExistsError
    from sa_vision.reproduce import STAGE_ORDER
    zoo, ran = _fake_staged_zoo(tmp_path, monkeypatch, {m: 1 for m in STAGE_ORDER})
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')
    zoo.zoo.mkdir()
    (zoo.zoo / STAGE_ORDER[-1]).symlink_to(mine)  # the last stage's folder: refused before the first starts
    with pytest.raises(ExportExistsError, match='notes.txt'):
        zoo.run(100, lambda m: 1)
    assert ran == [] and [p.name for p in mine.iterdir()] == ['notes.txt']


def test_staged_zoo_prunes_only_from_a_kept_source(tmp_path, monkeypatch):
    from sa_vision.reproduce import PRUNED_MODEL, STAGE_ORDER
    zoo, ran = _fake_staged_zoo(tmp_path, monkeypatch, {m: 1 for m in STAGE_ORDER})
    # the generalized model's stage does not fit: the pruned one waits, the cheaper ones after it run
    kept = zoo.run(100, lambda m: 1000 if m == 'sa_gen_cifar' else 10)
    assert 'sa_gen_cifar' not in kept and PRUNED_MODEL not in kept
    assert kept == [m for m in STAGE_ORDER if m not in ('sa_gen_cifar', PRUNED_MODEL)]


def test_staged_zoo_runs_stages_side_by_side_and_the_pruned_one_after_its_source(tmp_path, monkeypatch):
    from sa_vision.reproduce import PRUNED_MODEL, STAGE_ORDER
    zoo, ran = _fake_staged_zoo(tmp_path, monkeypatch, {m: 0 for m in STAGE_ORDER})
    fake_stage, both_running, ended = zoo.stage, threading.Barrier(2, timeout=20), []

    def stage(model):
        if len(ran) < 2:  # the first two wait for each other: they fail unless they run at the same time
            ran.append(model)
            both_running.wait()
            ran.pop()
        fake_stage(model)
        ended.append(model)
    monkeypatch.setattr(zoo, 'stage', stage)
    assert sorted(zoo.run(100, lambda m: 1, parallel=2)) == sorted(STAGE_ORDER)
    assert ended.index(PRUNED_MODEL) > ended.index('sa_gen_cifar')


def test_staged_zoo_starts_a_stage_only_if_it_fits_behind_the_running_ones(tmp_path, monkeypatch):
    from sa_vision.reproduce import Reproduction, staged
    clock = [0.0]
    monkeypatch.setattr(staged.time, 'time', lambda: clock[0])
    reproduction = Reproduction(tmp_path / 'out', 'tiny', epochs=4)
    budget = staged._Budget(staged.StagedZoo(reproduction, tmp_path / 'zoo', tmp_path / 't.csv'), 250,
                            lambda m: 100)
    first, second, third = [m for m in staged.STAGE_ORDER if m != staged.PRUNED_MODEL][:3]
    assert budget.next_to_start({}) == first
    assert budget.next_to_start({first: None}) == second  # 100 s of work, then 100 more: 200 s fit 250
    assert budget.next_to_start({first: None, second: None}) is None  # 300 s do not
    clock[0] = 100.0
    budget.finished(first)  # its own 100 s for an estimate of 100: 1 s per second of estimate
    # nothing known of the second stage's progress: its 100 s and the third's 100 > 150 left
    assert budget.next_to_start({second: None}) is None
    summary = reproduction.run_dir(second) / 'summary.csv'
    summary.parent.mkdir(parents=True)
    summary.write_text('epoch,loss\n0,1\n1,1\n2,1\n')  # 3 of its 4 epochs done
    # its last quarter, 25 s, and the third's 100 fit 150
    assert budget.next_to_start({second: None}) == third
    # with 100 s left they do not: the first stage's own wall time counts, not the 175 s of estimate that the two
    # side by side did in 100 s (0.57 s per second: 71 s, which would have admitted the third to run on alone)
    del budget.started[third]
    budget.budget_s = 200
    assert budget.next_to_start({second: None}) is None
    summary.write_text('epoch,loss\n0,1\n1,1\n2,1\n3,1\n')  # every epoch done: its evaluation and export are not
    assert budget.progress(second) == pytest.approx(0.8)


def test_with_a_slowdown_stages_start_side_by_side_where_each_ends_in_time(tmp_path, monkeypatch):
    """``slowdown(model, k)``: a stage starts if, with it, each of the k running ends in time at k-fold sharing; the
    kept stages' wall seconds are compared with what that sharing expected of them, not with their time alone."""
    from sa_vision.reproduce import Reproduction, staged
    clock = [0.0]
    monkeypatch.setattr(staged.time, 'time', lambda: clock[0])
    reproduction = Reproduction(tmp_path / 'out', 'tiny', epochs=4)
    zoo = staged.StagedZoo(reproduction, tmp_path / 'zoo', tmp_path / 't.csv')
    a, b, c, d = [m for m in staged.STAGE_ORDER if m != staged.PRUNED_MODEL]
    slower = {1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}  # a stage beside k - 1 others: 1 + (k - 1) / 2 times its time alone
    budget = staged._Budget(zoo, 240, lambda m: 100, slowdown=lambda m, k: slower[k])
    assert budget.next_to_start({}) == a
    assert budget.next_to_start({a: None}) == b  # each 100 s x 1.5 = 150 <= 240 (one after another: 200)
    assert budget.next_to_start({a: None, b: None}) == c  # 100 x 2 = 200 <= 240 (one after another: 300)
    assert budget.next_to_start({a: None, b: None, c: None}) is None  # 100 x 2.5 = 250 > 240
    # the sequential rule, the default, starts two
    sequential = staged._Budget(zoo, 240, lambda m: 100)
    assert [sequential.next_to_start({}), sequential.next_to_start({a: None})] == [a, b]
    assert sequential.next_to_start({a: None, b: None}) is None
    # a running stage counts too: 3 of b's 4 epochs done (its last fifth left, 20 s alone), c's 2 of 4 (50 s); with
    # d (50 s alone), 3 side by side: b 20 x 2 = 40, c 50 x 2 = 100, d 50 x 2 = 100, all within 150
    budget = staged._Budget(zoo, 150, lambda m: 50 if m == d else 100, slowdown=lambda m, k: slower[k])
    for model in (a, b, c):  # a kept, b and c running
        budget.started[model] = budget.estimated[model] = budget.alone_s[model] = 0.0
    done = {b: 0.75, c: 0.5}
    monkeypatch.setattr(budget, 'progress', lambda m: min(done.get(m, 0.0), 0.8))
    assert budget.next_to_start({b: None, c: None}) == d
    # c with nothing done: 100 x 2 = 200 > 150 with d beside it, though d's own 100 would fit
    done[c] = 0.0
    del budget.started[d]
    assert budget.next_to_start({b: None, c: None}) is None


def test_a_stage_that_ran_side_by_side_as_the_slowdown_expects_leaves_the_scale_at_1(tmp_path, monkeypatch):
    from sa_vision.reproduce import Reproduction, staged
    clock = [0.0]
    monkeypatch.setattr(staged.time, 'time', lambda: clock[0])
    zoo = staged.StagedZoo(Reproduction(tmp_path / 'out', 'tiny', epochs=4), tmp_path / 'zoo', tmp_path / 't.csv')
    a, b = [m for m in staged.STAGE_ORDER if m != staged.PRUNED_MODEL][:2]

    def alone(m):  # the others, waiting, fit no budget
        return {a: 100, b: 200}.get(m, 1e9)

    def slower(m, k):
        return {1: 1.0, 2: 1.5}[k]
    budget = staged._Budget(zoo, 1000, alone, slowdown=slower)
    assert budget.next_to_start({}) == a and budget.next_to_start({a: None}) == b
    clock[0] = 150.0  # a's 100 s alone, 1.5x beside b: as expected
    assert budget.finished(a) == 150.0 and budget.scale() == pytest.approx(1.0)
    clock[0] = 150.0 + 100.0  # b: 150 s beside a (100 s alone), then 100 s alone: 200 s, as expected
    budget.next_to_start({b: None})
    assert budget.finished(b) == 250.0 and budget.scale() == pytest.approx(1.0)
    # each 20 % slower than that: a's 180 s are 120 alone; b: 180 s beside a (120 alone), then 120 alone (240)
    budget = staged._Budget(zoo, 1000, alone, slowdown=slower)
    clock[0] = 0.0
    assert budget.next_to_start({}) == a and budget.next_to_start({a: None}) == b
    clock[0] = 180.0
    budget.finished(a)
    assert budget.scale() == pytest.approx(1.2)
    clock[0] = 300.0
    budget.next_to_start({b: None})
    assert budget.finished(b) == 300.0 and budget.scale() == pytest.approx((120 + 240) / 300)


def test_a_stage_the_budget_cannot_fit_starts_alone_where_a_later_call_continues_it(tmp_path):
    """A stage longer than any call starts only where its run is kept for the next call (``resumable``), only with
    nothing running beside it and more left than its part outside the epochs; a continued stage is expected to take
    only what is left of its epochs."""
    from sa_vision.reproduce import Reproduction, staged
    reproduction = Reproduction(tmp_path / 'out', 'tiny', epochs=4)
    zoo = staged.StagedZoo(reproduction, tmp_path / 'zoo', tmp_path / 't.csv')
    first, second = staged.STAGE_ORDER[:2]
    assert staged._Budget(zoo, 250, lambda m: 1000).next_to_start({}) is None  # kept by nobody: never
    budget = staged._Budget(zoo, 250, lambda m: 1000, resumable=lambda m: m == second)
    assert budget.next_to_start({first: None}) is None  # not beside a running stage
    assert budget.next_to_start({}) == second
    assert staged._Budget(zoo, 199, lambda m: 1000, resumable=lambda m: True).next_to_start({}) is None  # < 20 %
    summary = reproduction.run_dir(first) / 'summary.csv'
    summary.parent.mkdir(parents=True)
    summary.write_text('epoch,loss\n0,1\n1,1\n2,1\n')  # continued: 3 of its 4 epochs done, 250 s of 1000 left
    assert staged._Budget(zoo, 260, lambda m: 1000).next_to_start({}) == first


def test_a_stopped_training_ends_at_once_and_no_other_starts(tmp_path, monkeypatch):
    from sa_vision.reproduce import Reproduction, StageStopped, processes, stages
    sleeping = [sys.executable, '-c', 'import time; time.sleep(60)']
    monkeypatch.setattr(stages, 'run_training',
                        lambda cmd, tag, trainings: processes.run_training(sleeping, tag, trainings))
    zoo = Reproduction(tmp_path, 'tiny')
    threading.Timer(1.0, zoo.stop).start()
    started = time.time()
    with pytest.raises(StageStopped, match='sa_quadratic_cifar: stopped after 0 of 2 epochs'):
        zoo.train('sa_quadratic_cifar')
    assert time.time() - started < 30
    with pytest.raises(StageStopped, match='sa_learned_cifar: not started'):
        zoo.train('sa_learned_cifar')
    # the whole pipeline says so too (stop()'s promise), not that a stage failed
    with pytest.raises(StageStopped, match='sa_quadratic_cifar: not started'):
        zoo.run()


@pytest.fixture
def ctrl_c_after():
    """``ctrl_c_after(seconds)``: a SIGINT to the main thread then, as the terminal's Ctrl-C (it wakes a blocking
    wait, as Python's own handler needs); Python's handler is in place meanwhile."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timers = []

    def after(seconds):
        timers.append(threading.Timer(seconds, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)))
        timers[-1].start()
    yield after
    for timer in timers:
        timer.cancel()
    signal.signal(signal.SIGINT, previous)


def _sleeping_trainings(tmp_path, monkeypatch):
    """Each training a 60 s sleep that writes its pid into ``tmp_path/pids``; returns the function listing them."""
    from sa_vision.reproduce import processes, stages
    pids = tmp_path / 'pids'
    pids.mkdir()
    sleeping = [sys.executable, '-c', f'import os, time; open(os.path.join({str(pids)!r}, str(os.getpid())), "w"); '
                'time.sleep(60)']
    monkeypatch.setattr(stages, 'run_training',
                        lambda cmd, tag, trainings: processes.run_training(sleeping, tag, trainings))

    def started(count):
        deadline = time.time() + HANG_TIMEOUT_S
        while len(list(pids.iterdir())) < count:
            assert time.time() < deadline
            time.sleep(0.05)
        return [int(p.name) for p in pids.iterdir()]
    return started


def _running(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/status', encoding='utf-8') as f:
            return 'State:\tZ' not in f.read()
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='/proc')
@pytest.mark.parametrize('parallel', [0, 1, 2])
def test_ctrl_c_ends_the_trainings_it_started(tmp_path, monkeypatch, ctrl_c_after, parallel):
    """Ctrl-C reaches the reproduction alone (its trainings run in sessions of their own, so that they print no
    advice of their own): it ends them at once, a training in this thread (``parallel`` 0) or stages in threads of
    their own, one or two side by side; none runs on after it."""
    from sa_vision.reproduce import Reproduction, staged
    started = _sleeping_trainings(tmp_path, monkeypatch)
    reproduction = Reproduction(tmp_path / 'out', 'tiny')
    zoo = staged.StagedZoo(reproduction, tmp_path / 'zoo', tmp_path / 't.csv')
    threading.Thread(target=lambda: started(max(parallel, 1)) and ctrl_c_after(0), daemon=True).start()
    begun = time.time()
    with pytest.raises(KeyboardInterrupt):
        if parallel:
            zoo.run(10 ** 6, lambda m: 1, parallel=parallel)
        else:
            reproduction.train(staged.STAGE_ORDER[0])
    assert time.time() - begun < 30, 'the trainings ran on after Ctrl-C'
    pids = started(max(parallel, 1))
    assert len(pids) == max(parallel, 1) and not any(_running(pid) for pid in pids)


def test_a_failing_stage_side_by_side_is_named_and_stops_new_starts(tmp_path, monkeypatch):
    from sa_vision.reproduce import STAGE_ORDER, StageFailed
    zoo, ran = _fake_staged_zoo(tmp_path, monkeypatch, {m: 0 for m in STAGE_ORDER})
    fake_stage, first = zoo.stage, STAGE_ORDER[0]

    def stage(model):
        if model == first:
            raise OSError('disk full')
        fake_stage(model)
    monkeypatch.setattr(zoo, 'stage', stage)
    with pytest.raises(StageFailed, match=f'stage {first} failed: OSError: disk full'):
        zoo.run(100, lambda m: 1, parallel=2)
    assert len(ran) <= 1  # the one started beside it may end; none starts after the failure
    with pytest.raises(ValueError, match='parallel must be at least 1'):
        zoo.run(100, lambda m: 1, parallel=0)


def test_a_stage_the_disk_refused_says_so_in_words(tmp_path, monkeypatch):
    """A full disk in a stage run in this process (the export, the figures, the pruning's torch.save) ended in
    'OSError: [Errno 27] File too large' or torch's 'unexpected pos': the stage says the system's reason, the file
    and the remedy, as every other command does."""
    import errno

    from sa_vision.reproduce import Reproduction, StageFailed
    refused = tmp_path / 'out' / 'pruned.pth'

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(refused))
    monkeypatch.setattr(Reproduction, 'train', full_disk)
    with pytest.raises(StageFailed, match=rf"stage 'train sa_quadratic_cifar' failed: File too large: {refused} "
                                          rf"\(make room, or write elsewhere\)$"):
        Reproduction(tmp_path / 'out', 'tiny').run()


def test_a_training_side_by_side_tags_each_line_of_its_output(capfd):
    import sys

    from sa_vision.reproduce.processes import run_training
    script = 'import sys; print("epoch 1"); print("oops", file=sys.stderr); sys.exit(3)'
    assert run_training([sys.executable, '-c', script], '[sa_gen_cifar] ') == 3
    assert capfd.readouterr().out.splitlines() == ['[sa_gen_cifar] epoch 1', '[sa_gen_cifar] oops']


def _child_outlives_its_parent(parent_code: str, child_pid) -> bool:
    """Run ``parent_code`` (it starts a child, a 60 s sleep), read the child's pid with ``child_pid(parent)``, kill
    the parent: whether the child still runs 10 s later."""
    parent = subprocess.Popen([sys.executable, '-c', parent_code], env=_env(), stdout=subprocess.PIPE, text=True)
    child = child_pid(parent)
    parent.kill()
    parent.wait(timeout=HANG_TIMEOUT_S)
    deadline = time.time() + 10  # a signal, not work: seconds are plenty
    while time.time() < deadline:
        try:
            with open(f'/proc/{child}/status', encoding='utf-8') as f:
                if 'State:\tZ' in f.read():  # dead, not yet reaped by its new parent
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    return True


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='PR_SET_PDEATHSIG is Linux')
def test_a_training_process_dies_with_the_reproduction_that_started_it():
    """No orphan training process goes on writing the checkpoint that the next run resumes."""
    parent_code = ('import subprocess, sys, time\n'
                   'from sa_vision.reproduce.processes import die_with_parent\n'
                   'child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], '
                   'preexec_fn=die_with_parent)\n'
                   'print(child.pid, flush=True)\n'
                   'time.sleep(60)\n')
    assert not _child_outlives_its_parent(parent_code, lambda parent: int(parent.stdout.readline())), \
        'the training process outlived the reproduction'


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='PR_SET_PDEATHSIG is Linux')
def test_a_training_process_dies_when_the_reproduction_ended_before_its_death_signal_was_set(tmp_path):
    """The parent killed between the fork and the prctl (widened here by a sleep before it): no death signal can
    come any more, and the child ends itself instead of running on."""
    pid_file = tmp_path / 'child.pid'
    parent_code = ('import os, subprocess, sys, time\n'
                   'from sa_vision.reproduce.processes import die_with_parent\n'
                   'def late():\n'
                   f'    open({str(pid_file)!r}, "w").write(str(os.getpid()))\n'
                   '    time.sleep(1.5)\n'
                   '    die_with_parent()\n'
                   'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=late)\n'
                   'time.sleep(60)\n')

    def child_pid(parent):
        deadline = time.time() + HANG_TIMEOUT_S
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.time() < deadline and parent.poll() is None
            time.sleep(0.05)
        return int(pid_file.read_text())
    assert not _child_outlives_its_parent(parent_code, child_pid), 'the training process outlived the reproduction'


def test_ctrl_c_says_that_the_same_command_continues(tmp_path, capsys, monkeypatch):
    """Ctrl-C in a reproduction: one line naming what continues it (the command itself), status 130."""
    from sa_vision.reproduce import Reproduction

    def interrupted(self, publish=False):
        raise KeyboardInterrupt
    monkeypatch.setattr(Reproduction, 'run', interrupted)
    status, err = _reproduce_error(capsys, '--profile', 'tiny', '--out', tmp_path / 'r')
    assert status == 130 and err == (f'interrupted: finished stages are kept in {tmp_path / "r"}; run the same '
                                     f'command to continue (a stopped training resumes from its last finished '
                                     f'epoch)\n'), err


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='the trainings die with the reproduction on Linux')
def test_a_sigterm_while_a_training_is_forked_kills_it_before_it_runs(tmp_path):
    # the SIGTERM of a process group (a scheduler's, a timeout's) can reach a training between its fork and its
    # exec, while it runs the reproduction's Python and handler: sent there by an at-fork hook here
    script = tmp_path / 'forks.py'
    script.write_text(
        'import os, signal, sys\n'
        'from sa_vision.errors import _terminate\n'
        'from sa_vision.reproduce.processes import run_training\n'
        'signal.signal(signal.SIGTERM, _terminate)\n'
        'os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))\n'
        'status = run_training([sys.executable, "-c", "print(\'trained\')"], None)\n'
        'print("status", status, "blocked", signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []))\n')
    done = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True,
                          timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ['status', str(-signal.SIGTERM), 'blocked', 'False']  # no training ran
    assert 'Exception ignored' not in done.stderr, done.stderr
