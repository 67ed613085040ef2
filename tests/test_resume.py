""" ``--resume`` after a run was stopped anywhere, or with other arguments: the run's files agree with its last
checkpoint again (a kill or a full disk between ``last.pth.tar``, ``model_best.pth.tar`` and ``summary.csv``), the
schedule goes on at the epoch whatever the batch size now, a resume with nothing left to train reports what it
evaluated and leaves the run's recipe as it was, and a folder that cannot be written is named in one line """
import csv
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import file_size_limit, run_result, train_here

from sa_vision.train import epoch_files, loop
from sa_vision.train.checkpoint import read_checkpoint
from sa_vision.train.data import create_image_dataset
from sa_vision.train.recipes import RECIPE_DIR
from sa_vision.train.run_folder import repair_run_files

DIGITS_RECIPE = RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml'
TINY_ARGS = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32']


def _train_args(out, name, epochs, batch_size=64):
    return ['-c', DIGITS_RECIPE, *TINY_ARGS, '--epochs', epochs, '--warmup-epochs', 0.5, '-b', batch_size,
            '--output', out, '--experiment', name, '--log-interval', 50]


def _load(path: Path) -> dict:
    return torch.load(path, map_location='cpu', weights_only=True)


def _summary(run: Path):
    with open(run / 'summary.csv', encoding='utf-8') as f:
        return list(csv.DictReader(f))


def _failing_at_call(real, call: int, error: BaseException):
    """``real`` that raises ``error`` at its ``call``-th call instead (counted from 1)."""
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(args)
        if len(calls) == call:
            raise error
        return real(*args, **kwargs)
    return wrapped


def test_a_run_killed_between_its_files_is_made_whole_when_resumed(tmp_path, caplog, capsys, monkeypatch):
    """Killed after epoch 1's last.pth.tar (which names epoch 1 the best) but before its model_best.pth.tar and its
    summary.csv row: the resume writes both from last.pth.tar, so the export is of epoch 1, not epoch 0."""
    run = tmp_path / 'run'
    monkeypatch.setattr(loop, 'is_better', lambda metric, value, best: True)  # every epoch the best so far
    monkeypatch.setattr(epoch_files, 'atomic_duplicate',
                        _failing_at_call(epoch_files.atomic_duplicate, 2, KeyboardInterrupt()))
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 2))
    assert status == 130, log[-3000:]
    last = _load(run / 'last.pth.tar')
    assert last['epoch'] == last['best']['epoch'] == 1 and _load(run / 'model_best.pth.tar')['epoch'] == 0
    assert [row['epoch'] for row in _summary(run)] == ['0']
    monkeypatch.undo()

    status, log = train_here(caplog, capsys, '--resume', run, '--export')  # both epochs done: report and export
    assert status == 0, log[-3000:]
    best = _load(run / 'model_best.pth.tar')
    assert best['epoch'] == 1 and all(torch.equal(v, best['state_dict'][k]) for k, v in last['state_dict'].items())
    rows = _summary(run)
    assert [row['epoch'] for row in rows] == ['0', '1']
    assert (run / 'summary.csv').read_bytes().count(b'\r\n') == 3  # csv's line ends, as update_summary writes
    for row, epoch in zip(rows, last['history']):
        assert float(row['train_loss']) == epoch['train_loss'] and float(row['eval_top1']) == epoch['eval_top1']
    assert f'Exporting model_best.pth.tar: the weights after epoch 2 of 2 (top1 {last["metrics"]["top1"]:.2f}, ' \
           f'the best)' in log
    assert 'written again from last.pth.tar' in log


def test_a_best_checkpoint_cut_short_is_written_again_when_resumed(tmp_path, caplog, capsys):
    """A copy of model_best.pth.tar cut short (a full disk, a killed copy) of the last epoch, the best: the resume
    writes it again from last.pth.tar, rather than stopping on it."""
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]
    whole = (run / 'model_best.pth.tar').read_bytes()
    (run / 'model_best.pth.tar').unlink()  # a copy of its own, not the link to last.pth.tar
    (run / 'model_best.pth.tar').write_bytes(whole[:len(whole) // 2])
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2)
    assert status == 0 and 'model_best.pth.tar written again from last.pth.tar' in log, log[-3000:]
    assert _load(run / 'model_best.pth.tar')['epoch'] in (1, 2)


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='fcntl locks: Linux and macOS')
def test_a_resume_that_stops_before_its_epochs_lets_its_folder_go(tmp_path, caplog, capsys, monkeypatch):
    """A resume refused after it held the run (in its repair, say): the folder is let go, so that a notebook's next
    --resume, or another process's, is not refused as if a run were training there."""
    import fcntl

    from sa_vision.errors import UserError
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]

    def refused(*args):
        raise UserError('refused in the repair')
    monkeypatch.setattr(loop, 'repair_run_files', refused)
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2)
    assert status == 2 and 'refused in the repair' in log, log[-3000:]
    with open(run / 'args.yaml', 'a', encoding='utf-8') as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_loss_that_diverges_stops_the_run_and_the_resume_with_a_lower_lr_goes_on(tmp_path, caplog, capsys):
    """A learning rate far too high: the loss is NaN within the epoch. The run stops there with one line (timm's
    train.py trains on, exits 0 and keeps NaN weights as its best), the epoch before is kept, and the resume the
    line advises, with a lower --lr, trains on from it."""
    import math
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2, '--lr', 1e6)
    error = log.strip().splitlines()[-1]
    assert status == 2 and error.startswith('error: the training loss is nan at epoch 1, step ') and error.endswith(
        f'Continue from its last finished epoch with --resume {run / "last.pth.tar"}, with a lower --lr or clipped '
        f'gradients (--clip-grad 1.0, say)'), error
    last = _load(run / 'last.pth.tar')
    assert last['epoch'] == 0 and all(v.isfinite().all() for v in last['state_dict'].values())
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2, '--lr', 1e-3)
    assert status == 0 and _load(run / 'last.pth.tar')['epoch'] == 1, log[-3000:]
    assert math.isfinite(_load(run / 'last.pth.tar')['metrics']['loss'])


def test_an_epoch_whose_evaluation_is_not_a_number_is_not_saved(tmp_path, caplog, capsys, monkeypatch):
    """The last steps of an epoch can break the weights with a finite training loss: its evaluation says so, and
    that epoch is neither saved nor kept as the best; the advice resumes from the epoch before."""
    from sa_vision.train import evaluation
    real = evaluation.evaluate_compiled

    def nan_after_epoch_1(eval_model, model, *args, **kwargs):
        metrics, eval_model = real(eval_model, model, *args, **kwargs)
        return {**metrics, 'loss': float('nan')} if calls.append(1) or len(calls) == 2 else metrics, eval_model
    calls = []
    monkeypatch.setattr(evaluation, 'evaluate_compiled', nan_after_epoch_1)
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 2))
    error = log.strip().splitlines()[-1]
    assert status == 2 and error.startswith('error: the evaluation loss after epoch 1 is nan: its weights give no '
                                            'numbers (the run diverged), and are not saved as that epoch. Continue '
                                            f'from its last finished epoch with --resume {run / "last.pth.tar"}'), error
    assert _load(run / 'last.pth.tar')['epoch'] == 0 and _load(run / 'model_best.pth.tar')['epoch'] == 0


def test_an_unevaluated_epoch_whose_weights_are_not_numbers_is_not_saved(tmp_path, caplog, capsys, monkeypatch):
    """--val-interval leaves an epoch unevaluated: weights its last steps broke are found before it is saved, not by
    the next epoch, whose advice would resume from them."""
    real = loop.train_one_epoch

    def breaking_the_weights(*args, **kwargs):
        result = real(*args, **kwargs)
        with torch.no_grad():
            next(args[1].parameters()).fill_(float('nan'))
        return result
    monkeypatch.setattr(loop, 'train_one_epoch', breaking_the_weights)
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 2), '--val-interval', 2)
    error = log.strip().splitlines()[-1]
    assert status == 2 and error.startswith('error: the weights after epoch 0 hold NaN or inf (') and \
        'this epoch is not saved. No epoch had finished' in error, error
    assert not (run / 'last.pth.tar').exists()


class _Pickled:
    """An object torch.load refuses under weights_only."""


def test_a_best_checkpoint_of_an_earlier_epoch_cut_short_is_removed_when_resumed(tmp_path, caplog, capsys,
                                                                                monkeypatch):
    """model_best.pth.tar of epoch 0 cut short, the last epoch 1: there is nothing to write it again from, so the
    resume removes it, saying so (an export then takes the last epoch), rather than failing after its epochs."""
    run = tmp_path / 'run'
    monkeypatch.setattr(loop, 'is_better', lambda metric, value, best: False)  # epoch 0 stays the best
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 2))
    assert status == 0 and _load(run / 'model_best.pth.tar')['epoch'] == 0, log[-3000:]
    monkeypatch.undo()
    # a whole file refused for what it holds (a pickled object) is no copy cut short: it stays, and its error comes
    other = tmp_path / 'other'
    shutil.copytree(run, other)
    (other / 'model_best.pth.tar').unlink()
    torch.save({'state_dict': {}, 'kept': _Pickled()}, other / 'model_best.pth.tar')
    repair_run_files(other, read_checkpoint(other / 'last.pth.tar'), print)
    assert (other / 'model_best.pth.tar').is_file()
    whole = (run / 'model_best.pth.tar').read_bytes()
    (run / 'model_best.pth.tar').write_bytes(whole[:len(whole) // 2])
    # nor one this user (or the disk) cannot read: root reads every file, so the refusal is made here
    from sa_vision.train import run_folder
    shutil.copy(run / 'model_best.pth.tar', other / 'model_best.pth.tar')

    def refused(path, *args, **kwargs):
        raise PermissionError(13, 'Permission denied', str(path))
    monkeypatch.setattr(run_folder, 'open', refused, raising=False)
    repair_run_files(other, read_checkpoint(other / 'last.pth.tar'), print)
    monkeypatch.undo()
    assert (other / 'model_best.pth.tar').is_file()
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 3, '--export')
    assert status == 0 and 'model_best.pth.tar could not be read (a copy cut short) and is removed' in log, log[-3000:]
    assert (run / 'hub' / 'model.safetensors').is_file()


def test_a_summary_row_cut_short_is_written_again_when_resumed(tmp_path, caplog, capsys):
    """A stop in the middle of appending a summary.csv row leaves part of it: the resume writes the file again from
    the checkpoint's history, rather than gluing the next row onto the part."""
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]
    whole = (run / 'summary.csv').read_bytes()
    (run / 'summary.csv').write_bytes(whole[:whole.rindex(b',')])  # epoch 0's row without its last field
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2)
    assert status == 0 and 'summary.csv written again from last.pth.tar' in log, log[-3000:]
    history = _load(run / 'last.pth.tar')['history']
    rows = _summary(run)
    assert [row['epoch'] for row in rows] == ['0', '1'] and all(len(row) == len(rows[0]) for row in rows)
    assert [float(row['train_loss']) for row in rows] == [epoch['train_loss'] for epoch in history]
    assert (run / 'summary.csv').read_bytes().startswith(whole)


def test_a_full_disk_stops_the_run_in_one_line_and_the_resume_goes_on(tmp_path, caplog, capsys, monkeypatch):
    """torch.save's error on a full disk names no disk: the run says what it could not write and how to go on."""
    run = tmp_path / 'run'
    full = RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 31424 vs 31316')
    monkeypatch.setattr(epoch_files, 'atomic_torch_save', _failing_at_call(epoch_files.atomic_torch_save, 2, full))
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 2))
    assert status == 2, log[-3000:]
    error = log.strip().splitlines()[-1]
    assert error.startswith(f'error: could not write in {run} (torch.save: [enforce fail at inline_container') \
        and 'free on its disk' in error and error.endswith(f'with --resume {run / "last.pth.tar"}'), error
    assert _load(run / 'last.pth.tar')['epoch'] == 0
    monkeypatch.undo()
    status, log = train_here(caplog, capsys, '--resume', run)
    assert status == 0 and _load(run / 'last.pth.tar')['epoch'] == 1, log[-3000:]


def test_a_write_refused_before_any_epoch_or_in_the_export_says_how_to_go_on(tmp_path, caplog, capsys, monkeypatch):
    """The system refuses a write (safetensors' own error, torch.save's, an OSError): one line naming the run and
    what was refused. Before any epoch finished there is no checkpoint to resume: start again. In the export after
    the epochs, a resume with --export exports again."""
    import sa_vision.cli.train as train_command
    run = tmp_path / 'early'
    with file_size_limit(8192):  # args.yaml fits; the initial weights (11 kB) do not
        status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'early', 1), '--save-epoch-weights')
    error = log.strip().splitlines()[-1]
    assert status == 2 and error.startswith(f'error: could not write in {run} (File too large, writing a '
                                            f'safetensors file') and error.endswith(
        f'no epoch had finished: delete {run} and start again'), error
    assert not (run / 'last.pth.tar').exists()

    real_export = train_command.export_hub_folder

    def export_on_a_full_disk(*args, **kwargs):
        with file_size_limit(8192):  # the weights (11 kB) do not fit
            return real_export(*args, **kwargs)
    monkeypatch.setattr(train_command, 'export_hub_folder', export_on_a_full_disk)
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'late', 1), '--export')
    error = log.strip().splitlines()[-1]
    assert status == 2 and 'File too large' in error and error.endswith(
        f'continue from its last finished epoch with --resume {tmp_path / "late" / "last.pth.tar"} --export'), error
    assert not (tmp_path / 'late' / 'hub').exists()
    monkeypatch.undo()
    status, log = train_here(caplog, capsys, '--resume', tmp_path / 'late' / 'last.pth.tar', '--export')
    assert status == 0 and (tmp_path / 'late' / 'hub' / 'model.safetensors').is_file(), log[-2000:]


def test_a_resume_on_a_full_disk_keeps_args_yaml_whole(tmp_path, caplog, capsys):
    """A resume writes args.yaml again (its new arguments): a refused write leaves the earlier file, not half one."""
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]
    args_yaml = tmp_path / 'run' / 'args.yaml'
    before = args_yaml.read_bytes()
    with file_size_limit(len(before) // 2):
        status, log = train_here(caplog, capsys, '--resume', tmp_path / 'run', '--epochs', 2)
    assert status == 2 and 'File too large' in log.strip().splitlines()[-1], log[-3000:]
    assert args_yaml.read_bytes() == before
    if hasattr(os, 'fork'):  # the run was let go (fcntl locks: Linux and macOS)
        import fcntl
        with open(args_yaml, 'a', encoding='utf-8') as other:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_resume_with_another_batch_size_goes_on_with_the_schedule_at_its_epoch(tmp_path, caplog, capsys):
    """One epoch at batch 64 (22 updates), resumed at batch 32 (44 an epoch): the learning rates and the update
    count are those of a run at batch 32 from the start, as timm's train.py counts an epoch's updates anew."""
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'straight', 3, batch_size=32))
    assert status == 0, log[-3000:]
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'resumed', 1))
    assert status == 0, log[-3000:]
    status, log = train_here(caplog, capsys, '--resume', tmp_path / 'resumed', '--epochs', 3, '-b', 32)
    assert status == 0, log[-3000:]
    assert 'an epoch is now 44 updates, 22 before' in log and 'written again' not in log, log[-3000:]
    straight, resumed = _load(tmp_path / 'straight' / 'last.pth.tar'), _load(tmp_path / 'resumed' / 'last.pth.tar')
    assert resumed['num_updates'] == straight['num_updates'] == 3 * 44
    assert [h['lr'] for h in resumed['history'][1:]] == [h['lr'] for h in straight['history'][1:]]


def test_a_resume_with_nothing_to_train_reports_what_it_evaluated(tmp_path, caplog, capsys):
    """A finished run resumed with another --val-split: the report is of that split, evaluated now, not the
    checkpoint's metrics under its name; the run's args.yaml and recipe.yaml stay those of its epochs. The report
    names the best checkpoint and how to evaluate it, and an ignored --model is not listed as a change."""
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]
    best = _load(run / 'model_best.pth.tar')
    assert (f'Best top1 {best["metrics"]["top1"]:.2f} at epoch 0 (1/1 done): {run / "model_best.pth.tar"}; '
            f'sa-vision-validate --checkpoint {run / "model_best.pth.tar"} evaluates it') in log
    files = {name: (run / name).read_bytes() for name in ('args.yaml', 'recipe.yaml')}
    status, log = train_here(caplog, capsys, '--resume', run, '--val-split', 'train', '--model', 'resnet18_cifar')
    assert status == 0, log[-3000:]
    result = run_result(log)
    assert result['split'] == 'train' and result['num_images'] == len(create_image_dataset('digits', 'train', False))
    assert f'Top-1 on the digits train split: {result["top1"]:.2f}%' in log
    assert 'the best epoch is counted anew' in log and 'Best top1' not in log  # its best was of the test split
    assert {name: (run / name).read_bytes() for name in files} == files
    assert "-> 'resnet18_cifar'" not in log and 'ignoring --model resnet18_cifar' in log


def test_a_resume_with_another_eval_metric_judges_the_best_epoch_by_it(tmp_path, caplog, capsys):
    """Two epochs judged by top-5, resumed for a third by top-1: the best checkpoint's epoch and the last are
    judged by their top-1 (the run's history has it), not by top-5 under top-1's name, which no top-1 could beat;
    the plateau scheduler's best is of top-1 too."""
    import re
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 2), '--eval-metric', 'top5', '--sched',
                             'plateau', '--no-sched-on-updates', '--warmup-epochs', 0)
    assert status == 0, log[-3000:]
    old_best = _load(run / 'model_best.pth.tar')['epoch']
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 3, '--eval-metric', 'top1')
    assert status == 0, log[-3000:]
    history = _load(run / 'last.pth.tar')['history']
    top1 = {h['epoch']: h['eval_top1'] for h in history}
    # the two epochs whose weights were kept (model_best's, the last), then the epoch trained
    best_epoch = 1 if top1[1] > top1[old_best] else old_best
    assert f'--eval-metric top5 -> top1: the best epoch by top1 of those whose weights are kept is epoch ' \
           f'{best_epoch} ({"the last, now" if best_epoch != old_best else "in"} model_best.pth.tar)' in log, log
    best_epoch = 2 if top1[2] > top1[best_epoch] else best_epoch
    reported = re.search(r'Best top1 ([\d.]+) at epoch (\d+)', log)
    assert (float(reported[1]), int(reported[2])) == (round(top1[best_epoch], 2), best_epoch), (reported[0], top1)
    assert _load(run / 'model_best.pth.tar')['epoch'] == best_epoch
    assert _load(run / 'last.pth.tar')['scheduler']['best'] == top1[2]


def test_a_resume_with_another_eval_metric_keeps_the_last_epoch_where_it_is_better_by_it(tmp_path, caplog,
                                                                                          capsys):
    """The last epoch's weights are at hand too: a run resumed with another --eval-metric, whose last epoch beats
    the kept best one by it, keeps the last epoch as its best (model_best.pth.tar becomes its copy, recording the
    new metric) where it trains on. A finished run's files, which nothing records the new metric in, stay as
    they are: the note says where the last epoch is."""
    import shutil
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 2), '--eval-metric', 'loss')
    assert status == 0, log[-3000:]
    last = _load(run / 'last.pth.tar')
    last['best'] = {'metric': last['history'][0]['eval_loss'], 'epoch': 0}  # as if epoch 0 had the lower loss
    last['history'][0]['eval_top1'] = -1.0  # and the lower top-1
    for name, ckpt in (('last.pth.tar', last), ('model_best.pth.tar', {**last, 'epoch': 0})):
        (run / name).unlink()  # the run's two may be one file (a hard link)
        torch.save(ckpt, run / name)
    shutil.copytree(run, tmp_path / 'finished')
    shutil.copytree(run, tmp_path / 'stopped')
    status, log = train_here(caplog, capsys, '--resume', tmp_path / 'finished', '--eval-metric', 'top1')
    assert status == 0, log[-3000:]
    assert 'is epoch 0 (in model_best.pth.tar; the last epoch, 1, has the better top1' in log, log
    assert _load(tmp_path / 'finished' / 'model_best.pth.tar')['epoch'] == 0  # unchanged

    status, log = train_here(caplog, capsys, '--resume', run, '--eval-metric', 'top1', '--epochs', 3)
    assert status == 0, log[-3000:]
    assert 'the best epoch by top1 of those whose weights are kept is epoch 1 (the last, now in' in log, log
    history, kept = _load(run / 'last.pth.tar')['history'], _load(run / 'model_best.pth.tar')
    best = 2 if history[2]['eval_top1'] > history[1]['eval_top1'] else 1
    assert kept['epoch'] == best and kept['best'] == {'metric': history[best]['eval_top1'], 'epoch': best}
    assert kept['args']['eval_metric'] == 'top1' == kept['recipe']['eval_metric']
    assert f'Best top1 {history[best]["eval_top1"]:.2f} at epoch {best} (' in log, log

    # stopped before its next epoch's files (Ctrl-C, a preemption): the two checkpoints still agree
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, 'train_one_epoch', stopped)
        status, log = train_here(caplog, capsys, '--resume', tmp_path / 'stopped', '--eval-metric', 'top1',
                                 '--epochs', 3)
    assert status == 130, log[-3000:]
    for name in ('last.pth.tar', 'model_best.pth.tar'):
        ckpt = _load(tmp_path / 'stopped' / name)
        assert (ckpt['args']['eval_metric'], ckpt['best']['epoch'], ckpt['epoch']) == ('top1', 1, 1), name


def test_summary_and_checkpoints_carry_timms_lr_column_and_metric_key(tmp_path, caplog, capsys):
    """timm's tools read summary.csv's ``lr`` column and a checkpoint's ``metric`` (avg_checkpoints.py ranks by
    it): both are there. A run of an older sa_vision, whose summary.csv has no ``lr`` column, is resumed with rows
    that fit its header."""
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]
    ckpt = _load(run / 'last.pth.tar')
    assert ckpt['metric'] == ckpt['metrics']['top1'] and _load(run / 'model_best.pth.tar')['metric'] > 0
    (row,) = _summary(run)
    assert float(row['lr']) == float(row['train_lr']) == ckpt['history'][0]['lr'], row
    with open(run / 'summary.csv', encoding='utf-8', newline='') as f:  # as an older sa_vision wrote it
        rows = [r[:-1] for r in csv.reader(f)]
    with open(run / 'summary.csv', 'w', encoding='utf-8', newline='') as f:
        csv.writer(f).writerows(rows)
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2)
    assert status == 0, log[-3000:]
    with open(run / 'summary.csv', encoding='utf-8', newline='') as f:
        header, *rows = list(csv.reader(f))
    assert 'lr' not in header and [len(r) for r in rows] == [len(header)] * 2 and rows[1][0] == '1', rows


def test_the_first_step_of_each_epoch_is_logged_as_timm_logs_it(tmp_path, caplog, capsys):
    """A paper recipe logs every 100 steps: its first line came after 100 steps (over an hour on a CPU at full
    size). The first step of each epoch is logged, as timm's train.py logs it, then every --log-interval."""
    import re

    from torch.optim.optimizer import register_optimizer_step_pre_hook
    used = []  # the lr of each step as the optimizer takes it
    hook = register_optimizer_step_pre_hook(lambda opt, *a: used.append(opt.param_groups[0]['lr']))
    try:
        status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 2), '--log-interval', 10)
    finally:
        hook.remove()
    assert status == 0, log[-3000:]
    lines = re.findall(r'^Train: (\d) \[\s*(\d+)/22 .*LR: (\S+) .*$', log, re.M)  # 22 steps of 64 an epoch
    assert [line[:2] for line in lines] == [(e, s) for e in '01' for s in ('1', '10', '20', '22')], lines
    # the LR of the step logged, as timm's train.py logs it (it was the next step's)
    assert [float(lr) for *_, lr in lines] == [float(f'{used[22 * int(e) + int(s) - 1]:.3e}') for e, s, _ in lines]
    first = [ln for ln in log.splitlines() if ln.startswith('Train: 0 [   1/')][0]
    assert 'ETA' not in first, first  # one step's time (a compile's, under --torchcompile) times the run's steps


def test_adaptive_clipping_leaves_the_classifier_out_as_timm_does(tmp_path, caplog, capsys, monkeypatch):
    """timm's train.py clips every parameter but the classifier's (the last two) with --clip-mode agc: unit-wise
    clipping of a freshly initialised head shrank its gradient 25-fold."""
    clipped = []
    monkeypatch.setattr(loop, 'dispatch_clip_grad', lambda params, value, mode: clipped.append(
        (mode, [p.shape for p in params])))
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1), '--clip-grad', 0.01,
                             '--clip-mode', 'agc')
    assert status == 0, log[-3000:]
    shapes = [p.shape for n, p in _load(tmp_path / 'run' / 'last.pth.tar')['state_dict'].items()
              if not n.startswith('head.')]  # state dict order, without buffers (none in this model)
    assert clipped and all(c == ('agc', shapes) for c in clipped), clipped[0]


def test_a_run_folder_that_cannot_be_written_is_named_before_the_resume(tmp_path, caplog, capsys, monkeypatch):
    """As for a new run's --output: one line, before the model and data are set up (a read-only file system is
    what a root-run test cannot make, so the probe's answer is given)."""
    from sa_vision.train import run_folder
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]
    asked = []
    monkeypatch.setattr(run_folder, 'folder_problem',
                        lambda folder: asked.append(Path(folder)) or f'nothing can be created in {folder} '
                                                                       f'(Read-only file system)')
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2)
    assert status == 2 and asked == [run], log[-3000:]
    assert log.strip().splitlines()[-1] == (
        f'error: --resume {run}: nothing can be created in {run} (Read-only file system); the run writes there '
        f'(its checkpoints, summary and export): make it writable, or copy the folder to one that is and resume the '
        f'copy'), log[-3000:]
    assert 'Run folder' not in log


def test_a_lone_checkpoint_of_a_run_is_resumed_and_its_files_written(tmp_path, caplog, capsys):
    """A folder holding only a run's checkpoint under another name (copied, renamed): the resume keeps it as the
    best where its record says so, and writes the args.yaml and summary.csv the folder lacks, also when it has no
    epoch left to train (no empty args.yaml)."""
    import shutil

    import yaml
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]
    lone = tmp_path / 'lone'
    lone.mkdir()
    shutil.copy(tmp_path / 'run' / 'last.pth.tar', lone / 'epoch1.pth.tar')
    status, log = train_here(caplog, capsys, '--resume', lone / 'epoch1.pth.tar')  # nothing left to train
    assert status == 0, log[-3000:]
    assert _load(lone / 'model_best.pth.tar')['epoch'] == 0 and [r['epoch'] for r in _summary(lone)] == ['0']
    args = yaml.safe_load((lone / 'args.yaml').read_text())
    assert args['epochs'] == 1 and args['dataset'] == 'digits'
    status, log = train_here(caplog, capsys, '--resume', lone / 'epoch1.pth.tar', '--epochs', 2)
    assert status == 0 and _load(lone / 'last.pth.tar')['epoch'] == 1, log[-3000:]
    assert [r['epoch'] for r in _summary(lone)] == ['0', '1']


def test_a_resume_onto_a_schedule_that_sets_no_lr_takes_the_changed_lr(tmp_path, caplog, capsys):
    """--sched none (and plateau) set no lr per step: the resumed optimizer's saved lr stayed, though the log said
    '--lr 0.005 -> 0.05' (and a cosine run resumed as --sched none trained at its end's lr). And a run resumed as
    plateau from another schedule loaded that schedule's state into the plateau (a KeyError traceback)."""
    import csv
    common = ['-c', DIGITS_RECIPE, *TINY_ARGS, '-b', 64, '--log-interval', 100, '--output', tmp_path]
    status, log = train_here(caplog, capsys, *common, '--sched', 'none', '--epochs', 1, '--experiment', 'none')
    assert status == 0, log[-2000:]
    status, log = train_here(caplog, capsys, '--resume', tmp_path / 'none' / 'last.pth.tar', '--epochs', 2,
                             '--lr', 0.05)
    assert status == 0, log[-2000:]
    with open(tmp_path / 'none' / 'summary.csv', encoding='utf-8', newline='') as f:
        assert [float(row['train_lr']) for row in csv.DictReader(f)] == [0.005, 0.05]
    status, log = train_here(caplog, capsys, *common, '--epochs', 1, '--experiment', 'cosine')
    assert status == 0, log[-2000:]
    status, log = train_here(caplog, capsys, '--resume', tmp_path / 'cosine' / 'last.pth.tar', '--epochs', 2,
                             '--sched', 'plateau', '--no-sched-on-updates', '--warmup-epochs', 0)
    assert status == 0 and 'Top-1 on the digits test split' in log, log[-2000:]
    # plateau with the positional parameters at 10x: a changed --lr keeps their scale
    status, log = train_here(caplog, capsys, *common, '--sched', 'plateau', '--no-sched-on-updates', '--warmup-epochs',
                             0, '--pos-lr-scale', 10, '--epochs', 1, '--experiment', 'plateau')
    assert status == 0, log[-2000:]
    status, log = train_here(caplog, capsys, '--resume', tmp_path / 'plateau' / 'last.pth.tar', '--epochs', 2,
                             '--lr', 0.01)
    assert status == 0, log[-2000:]
    groups = torch.load(tmp_path / 'plateau' / 'last.pth.tar', weights_only=True)['optimizer']['param_groups']
    assert sorted({(g.get('lr_scale', 1.0), g['lr']) for g in groups}) == [(1.0, 0.01), (10.0, 0.1)]


def test_a_resume_queued_behind_a_run_that_went_on_is_refused(tmp_path, caplog, capsys, monkeypatch):
    """A second job resumes the run while the first still trains its last epoch, and sets up until the first has
    ended: it read the checkpoint before the run went on, and would train over the newer epochs."""
    run = tmp_path / 'run'
    status, log = train_here(caplog, capsys, *_train_args(tmp_path, 'run', 1))
    assert status == 0, log[-3000:]
    one_done = (run / 'last.pth.tar').read_bytes()
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 2)
    assert status == 0, log[-3000:]
    went_on = {name: (run / name).read_bytes() for name in ('last.pth.tar', 'args.yaml', 'summary.csv')}
    (run / 'last.pth.tar').write_bytes(one_done)  # as the queued job reads it

    def the_first_job_ends_meanwhile(*args, **kwargs):
        (run / 'last.pth.tar').write_bytes(went_on['last.pth.tar'])
        return create_loaders(*args, **kwargs)
    create_loaders = loop.create_loaders
    monkeypatch.setattr(loop, 'create_loaders', the_first_job_ends_meanwhile)
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 3)
    assert status == 2 and (f'{run / "last.pth.tar"} changed while this run set up: it held 1 epoch done when '
                            f'read, and holds 2 epochs done') in log, log[-3000:]
    assert {name: (run / name).read_bytes() for name in went_on} == went_on
    monkeypatch.undo()
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 3)  # run again: it goes on from 2
    assert status == 0 and 'at epoch 2, update' in log, log[-3000:]
