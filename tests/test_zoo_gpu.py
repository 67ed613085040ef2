""" The gpu-long zoo (zoo/fashion-mnist-gpu/<model>/, weights in bf16) against its table
(docs/reproduction_fashion_mnist_gpu.csv), checked as the cpu zoo is (tests/test_zoo.py): each weights file's SHA-256
and each model's float32 logits of 64 test images against the guard beside the table, and the whole test split's
accuracy where ``SA_VISION_ZOO_ACCURACY=1`` asks for it. Until a GPU run keeps it, the check skips and says so; the
same check runs on a tiny zoo that the GPU script's smoke mode keeps (bf16 weights) in every CI run.
"""
import csv
import importlib.util
import os
import re
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from sa_vision.reproduce import STAGE_ORDER, check_kept_models, stages

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / 'zoo' / 'fashion-mnist-gpu'
TABLE = ROOT / 'docs' / 'reproduction_fashion_mnist_gpu.csv'
SCRIPT = ROOT / 'docs' / 'probes' / 'gpu' / 'zoo_gpu_long.py'
MAX_FILES_BACK = 8  # what the device tool brings back from $OUT


def _check(zoo: Path, table: Path, accuracy: bool):
    results = check_kept_models(zoo, table, accuracy=accuracy)
    with open(table, newline='') as f:
        assert [r['model'] for r in results] == [row['model'] for row in csv.DictReader(f)]
    return results


def test_kept_gpu_zoo_matches_its_table():
    if not ZOO.is_dir():
        pytest.skip(f'the gpu-long zoo is not kept yet ({ZOO.relative_to(ROOT)} is missing): a GPU run of '
                    f'docs/probes/gpu/zoo_gpu_long.py keeps it (docs/probes/gpu/zoo_gpu_long.md)')
    results = _check(ZOO, TABLE, accuracy=os.environ.get('SA_VISION_ZOO_ACCURACY') == '1')
    assert all(r['ok'] for r in results), results


def _script():
    spec = importlib.util.spec_from_file_location('zoo_gpu_long', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_check_holds_on_a_tiny_bf16_zoo_the_gpu_script_keeps(tmp_path, monkeypatch, request):
    """The GPU script's smoke run (tiny profile, one epoch, digits, bf16 weights) keeps five models; unpacked from
    its one tar, they pass the check against their table, accuracy included; a weight changed by one bf16 step
    fails it; a second run keeps nothing new."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    script, back = _script(), tmp_path / 'out'
    packed, write_back = [], script.write_back

    def write_back_and_look(*args, **kwargs):  # what a call killed at this moment would return
        tar = write_back(*args, **kwargs)
        with tarfile.open(tar) as f:
            folders = {Path(name).parts[1] for name in f.getnames() if name.startswith('zoo/')}
            rows = {row['model'] for row in csv.DictReader(f.extractfile('docs/t.csv').read().decode().splitlines())}
            guarded = any(name.endswith('_weights.sha256') for name in f.getnames())
        packed.append((folders, rows, guarded))
        return tar
    monkeypatch.setattr(script, 'write_back', write_back_and_look)
    threads, whole = {'stages': [], 'guard': []}, torch.get_num_threads()
    torch.set_num_threads(4)
    request.addfinalizer(lambda: torch.set_num_threads(whole))
    monkeypatch.setattr(script, 'available_cores', lambda: 5)  # a machine of 5 cores, whatever this one has

    def counting(kind, run):
        def counted(*args, **kwargs):
            threads[kind].append(torch.get_num_threads())
            return run(*args, **kwargs)
        return counted
    monkeypatch.setattr(stages, 'evaluate_on_test_split', counting('stages', stages.evaluate_on_test_split))
    monkeypatch.setattr(script, 'record_kept_models', counting('guard', script.record_kept_models))
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'docs' / 't_weights.sha256').write_text('an earlier call\'s guard\n')  # packed only once rewritten
    assert script.main(['--smoke', '--out', str(back), '--zoo', str(tmp_path / 'zoo'),
                        '--table', str(tmp_path / 'docs' / 't.csv')]) == 0
    # after each kept stage the tar holds the models kept so far, each with its folder and its row, and no folder
    # still being written; the last one all five
    assert len(packed) == 6 and all(folders == rows for folders, rows, _ in packed)
    # the stages' evaluations leave a core to each of the two trainings beside them; the guard after them takes all
    assert set(threads['stages']) == {5 - 2} and threads['guard'] == [4], threads
    assert [guarded for *_, guarded in packed] == [False] * 5 + [True]  # the guard only once recorded for all
    counts = [len(folders) for folders, *_ in packed]
    assert counts[0] >= 1 and counts == sorted(counts) and packed[-1][0] == set(STAGE_ORDER)
    assert len(os.listdir(back)) <= MAX_FILES_BACK and (back / 'zoo.tar').stat().st_size < 16 * 2 ** 20
    with tarfile.open(back / 'zoo.tar') as tar:
        tar.extractall(tmp_path / 'unpacked', filter='data')
    zoo, table = tmp_path / 'unpacked' / 'zoo', tmp_path / 'unpacked' / 'docs' / 't.csv'
    with safe_open(str(zoo / 'sa_quadratic_cifar' / 'model.safetensors'), 'pt') as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {'BF16'}
    results = _check(zoo, table, accuracy=True)
    assert [r['model'] for r in results] == list(STAGE_ORDER)
    assert all(r['ok'] and r['digest_ok'] and r['logits_ok'] and r['accuracy_ok'] for r in results), results
    weights_path = zoo / 'resnet18_cifar' / 'model.safetensors'
    weights = load_file(str(weights_path))
    bias = next(k for k in weights if k.endswith('fc.bias') or k.endswith('head.bias'))
    weights[bias][3] += 0.5
    save_file(weights, str(weights_path))
    changed = {r['model']: r for r in _check(zoo, table, accuracy=False)}
    assert not changed['resnet18_cifar']['ok'] and changed['sa_quadratic_cifar']['ok']
    shutil.rmtree(back)
    assert script.main(['--smoke', '--out', str(back), '--zoo', str(tmp_path / 'zoo'),
                        '--table', str(tmp_path / 'docs' / 't.csv')]) == 0
    assert 'kept this call [], missing none' in (back / 'zoo_gpu_long.log').read_text()


def test_the_tar_holds_only_kept_models_not_one_being_written(tmp_path):
    from sa_vision.hub import HUB_FOLDER_FILES
    from sa_vision.reproduce import Reproduction, StagedZoo
    staged = StagedZoo(Reproduction(tmp_path / 'work', 'tiny'), tmp_path / 'zoo', tmp_path / 'docs' / 't.csv')
    kept, unlisted = STAGE_ORDER[:2]
    for folder in (kept, unlisted, f'.{kept}.partial'):  # unlisted: its folder is written, its row not yet
        (staged.zoo / folder).mkdir(parents=True)
        for name in HUB_FOLDER_FILES:
            (staged.zoo / folder / name).write_text('x')
    staged.table.parent.mkdir()
    staged.table.write_text(f'model\n{kept}\n')
    (tmp_path / 'out').mkdir()
    with tarfile.open(_script().pack(staged, tmp_path / 'out')) as tar:
        names = set(tar.getnames())
    assert names == {'docs/t.csv', f'zoo/{kept}', *(f'zoo/{kept}/{name}' for name in HUB_FOLDER_FILES)}


@pytest.mark.slow
def test_a_stage_stopped_at_the_budget_goes_on_from_resume_tar_to_the_uninterrupted_weights(tmp_path, monkeypatch,
                                                                                          capfd):
    """A stage that only a later call can finish is stopped after its first epoch (the budget's end); its run goes
    into resume.tar (the checkpoint, not the whole epochs' weights), from which the next call's StagedZoo continues
    it to the weights of a training never stopped; a room too small keeps nothing and says so."""
    import threading
    import time

    from sa_vision.reproduce import Reproduction, StagedZoo
    from sa_vision.train.checkpoint import read_checkpoint
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    script, model = _script(), STAGE_ORDER[0]

    def staged(work):
        return StagedZoo(Reproduction(work, 'tiny', epochs=2, train_args=['--device', 'cpu']), tmp_path / 'zoo',
                         tmp_path / 'docs' / 't.csv')
    first = staged(tmp_path / 'call1')
    summary = first.reproduction.run_dir(model) / 'summary.csv'

    def stop_after_the_first_epoch():
        while not (summary.is_file() and len(summary.read_text().splitlines()) == 2):
            time.sleep(0.02)
        first.stop()
    threading.Thread(target=stop_after_the_first_epoch, daemon=True).start()
    # it does not fit (2,000 s of a 1,000 s budget), but its run is kept for the next call; no other stage fits
    assert first.run(1000, lambda m: 2000 if m == model else 10 ** 9, resumable=lambda m: m == model) == []
    assert first.stopped == [model] and first.missing() == list(STAGE_ORDER)
    out = tmp_path / 'out'
    out.mkdir()
    said = script.pack_resume(first, out, 10_000)[model]
    assert said.startswith('not kept: ') and 'it trains from the start' in said and not (out / 'resume.tar').exists()
    assert script.pack_resume(first, out, 16 * 2 ** 20)[model].startswith('kept after 1 of 2 epochs')
    run = f'runs/{model}'
    with tarfile.open(out / 'resume.tar') as tar:
        assert set(tar.getnames()) == {'reproduction.json', f'{run}/last.pth.tar', f'{run}/summary.csv',
                                       f'{run}/args.yaml', f'{run}/recipe.yaml', f'{run}/epoch-000.safetensors',
                                       f'{run}/epoch-001.safetensors'}
        tar.extractall(tmp_path / 'call2', filter='data')
    whole = first.reproduction.run_dir(model) / 'epoch-001.safetensors'
    assert (tmp_path / 'call2' / run / 'epoch-001.safetensors').stat().st_size < whole.stat().st_size / 10
    capfd.readouterr()
    second = staged(tmp_path / 'call2')
    assert second.run(1000, lambda m: 1 if m == model else 10 ** 9) == [model]
    assert f'{model}: continuing the killed run at epoch 1' in capfd.readouterr().out
    straight = Reproduction(tmp_path / 'straight', 'tiny', epochs=2, train_args=['--device', 'cpu']).train(model)
    resumed, straight = read_checkpoint(second.reproduction.run_dir(model)), read_checkpoint(straight)
    assert resumed.meta['epoch'] == straight.meta['epoch'] == 2
    for key, value in straight.state_dict.items():
        assert torch.equal(value, resumed.state_dict[key]), key
    # the kept row's centre shift reads the cut epoch-000: the same as the straight run's whole one
    from sa_vision.reproduce.report import center_shift_median
    assert second.rows()[model]['center_shift_median'] == center_shift_median(
        tmp_path / 'straight' / 'runs' / model, straight.state_dict) is not None


@pytest.mark.slow
def test_sigterm_stops_the_stages_and_still_returns_the_tar_and_the_json(tmp_path):
    """``timeout``'s SIGTERM while the first stages train: the trainings end, zoo.tar and the JSON are written (the
    stopped stages named), and the script ends with SIGTERM's status."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from helpers import HANG_TIMEOUT_S
    out = tmp_path / 'out'
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1')
    proc = subprocess.Popen([sys.executable, str(SCRIPT), '--smoke', '--out', str(out), '--zoo', str(tmp_path / 'zoo'),
                             '--table', str(tmp_path / 't.csv')], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    log, deadline = out / 'zoo_gpu_long.log', time.time() + HANG_TIMEOUT_S
    # the training's own first line: its process runs (a SIGTERM right after the stage's 'starting' line can come
    # before the stage is submitted, when there is nothing to stop yet)
    while not (log.is_file() and f'[{STAGE_ORDER[0]}] ' in log.read_text()) and time.time() < deadline:
        assert proc.poll() is None, 'the script ended before a stage started'
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG_TIMEOUT_S) == 128 + signal.SIGTERM
    result = json.loads((out / 'zoo_gpu_long.json').read_text())
    assert STAGE_ORDER[0] in result['stopped'] and result['stages'] == {}, result
    assert '== stopped by SIGTERM' in log.read_text() and (out / 'zoo.tar').is_file()


@pytest.mark.slow
def test_the_budgets_end_stops_the_running_stages(tmp_path, monkeypatch, capsys):
    """10 s of stages (--budget-s less the 60 s kept for the end), whose trainings take 100 epochs: those running
    then are stopped, named in the JSON, and the call ends with what it kept."""
    import json

    from sa_vision.reproduce import Reproduction
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    script, out = _script(), tmp_path / 'out'
    monkeypatch.setattr(script, 'Reproduction', lambda *a, **k: Reproduction(*a, **{**k, 'epochs': 100}))
    assert script.main(['--smoke', '--budget-s', '70', '--out', str(out), '--zoo', str(tmp_path / 'zoo'),
                        '--table', str(tmp_path / 't.csv')]) == 0
    result = json.loads((out / 'zoo_gpu_long.json').read_text())
    assert result['stopped'] == list(STAGE_ORDER[:2]) and result['stages'] == {}, result  # two at a time
    assert result['seconds'] < 60 and result['missing'] == list(STAGE_ORDER)
    said = capsys.readouterr().out  # in this process the stages' lines go to pytest's capture, not the log
    assert re.search(rf'{STAGE_ORDER[0]}: stopped after \d+ of 100 epochs', said), said[-3000:]
