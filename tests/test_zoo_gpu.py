""" The gpu-long zoo (zoo/fashion-mnist-gpu/<model>/, weights in bf16) against its table
(docs/reproduction_fashion_mnist_gpu.csv), checked as the cpu zoo is (tests/test_zoo.py): each weights file's SHA-256
and each model's float32 logits of 64 test images against the guard beside the table, and the whole test split's
accuracy where ``SA_VISION_ZOO_ACCURACY=1`` asks for it. Until a GPU run keeps it, the check skips and says so; the
same check runs on a tiny zoo that the GPU script's smoke mode keeps (bf16 weights) in every CI run.
"""
import csv
import os
import re
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from helpers import load_script

from sa_vision.reproduce import STAGE_ORDER, check_kept_models, stages

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / 'zoo' / 'fashion-mnist-gpu'
TABLE = ROOT / 'docs' / 'reproduction_fashion_mnist_gpu.csv'
SCRIPT = ROOT / 'docs' / 'probes' / 'gpu' / 'zoo_gpu_long.py'
MAX_FILES_BACK = 8  # what the device tool brings back from $OUT


def _check(zoo: Path, table: Path, accuracy: bool):
    results = check_kept_models(zoo, table, accuracy=accuracy)
    with open(table, encoding='utf-8', newline='') as f:
        assert [r['model'] for r in results] == [row['model'] for row in csv.DictReader(f)]
    return results


def test_kept_gpu_zoo_matches_its_table():
    if not ZOO.is_dir():
        pytest.skip(f'the gpu-long zoo is not kept yet ({ZOO.relative_to(ROOT)} is missing): a GPU run of '
                    f'docs/probes/gpu/zoo_gpu_long.py keeps it (docs/probes/gpu/zoo_gpu_long.md)')
    results = _check(ZOO, TABLE, accuracy=os.environ.get('SA_VISION_ZOO_ACCURACY') == '1')
    assert all(r['ok'] for r in results), results


def _script():
    return load_script(SCRIPT)


def test_the_smoke_run_does_not_continue_the_gpu_calls_resume_tar(tmp_path):
    # a GPU call leaves its resume.tar in data/ for the next one; the smoke run (tiny profile, digits) would refuse
    # to continue that gpu-long run, so it reads none unless --resume names one
    script = _script()
    assert script.resume_tar(None, smoke=True) is None
    assert script.resume_tar(None, smoke=False) == ROOT / 'data' / 'gpu-long-resume.tar'
    assert script.resume_tar(tmp_path / 'r.tar', smoke=True) == tmp_path / 'r.tar'
    with pytest.raises(SystemExit):  # a --resume that names no file is an error, not a start from scratch
        script.main(['--smoke', '--out', str(tmp_path / 'out'), '--zoo', str(tmp_path / 'zoo'),
                     '--table', str(tmp_path / 't.csv'), '--resume', str(tmp_path / 'missing.tar')])


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
                                       f'{run}/args.yaml', f'{run}/recipe.yaml', f'{run}/positional_epochs.safetensors'}
        tar.extractall(tmp_path / 'call2', filter='data')
    capfd.readouterr()
    second = staged(tmp_path / 'call2')
    assert second.run(1000, lambda m: 1 if m == model else 10 ** 9) == [model]
    assert f'{model}: continuing the killed run at epoch 1' in capfd.readouterr().out
    straight = Reproduction(tmp_path / 'straight', 'tiny', epochs=2, train_args=['--device', 'cpu']).train(model)
    resumed, straight = read_checkpoint(second.reproduction.run_dir(model)), read_checkpoint(straight)
    assert resumed.meta['epoch'] == straight.meta['epoch'] == 2
    for key, value in straight.state_dict.items():
        assert torch.equal(value, resumed.state_dict[key]), key
    # stopped inside its second epoch, the run logged the first once: summary.csv holds the straight run's epochs
    def epochs(run):
        with open(run / 'summary.csv', encoding='utf-8', newline='') as f:
            return [row['epoch'] for row in csv.DictReader(f)]
    assert epochs(second.reproduction.run_dir(model)) == epochs(tmp_path / 'straight' / 'runs' / model) == ['0', '1']
    # model_best.pth.tar stays behind (not in resume.tar): the export is of the last epoch, and its card's record
    # (which epoch was the best, each epoch's evaluation) travels in last.pth.tar, so the card is the straight run's
    [folder] = Reproduction(tmp_path / 'straight', 'tiny', epochs=2, train_args=['--device', 'cpu']).export([model])
    summary = re.compile(r'## Training summary.*?(?=\n## )', re.S)
    assert summary.search((tmp_path / 'zoo' / model / 'README.md').read_text()).group() == summary.search(
        (folder / 'README.md').read_text()).group()
    # the kept row's centre shift reads the kept epoch-000 centres: the same as the straight run's
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


def _gpu_long_budget(tmp_path, monkeypatch, budget_s, kept=(), done=None):
    """The script's ``_Budget`` of one gpu-long call of ``budget_s`` seconds, on a fake clock (``clock[0]``), with
    ``kept`` models kept and the running ones' share of epochs done in ``done``."""
    from sa_vision.reproduce import PRUNED_MODEL, Reproduction, staged
    script, clock, done = _script(), [0.0], {} if done is None else done
    monkeypatch.setattr(staged.time, 'time', lambda: clock[0])
    reproduction = Reproduction(tmp_path / 'gpu', 'gpu-long')
    zoo = staged.StagedZoo(reproduction, tmp_path / 'zoo', tmp_path / 't.csv')
    kept = set(kept)
    monkeypatch.setattr(zoo, 'is_kept', lambda m, rows=None: m in kept)
    monkeypatch.setattr(zoo, 'missing', lambda: [m for m in STAGE_ORDER if m not in kept])
    budget = staged._Budget(zoo, budget_s, lambda m: script.estimate_s(reproduction, m),
                            resumable=lambda m: m != 'resnet18_cifar',
                            slowdown=lambda m, k: script.shared_slowdown(reproduction, m, k))
    monkeypatch.setattr(budget, 'progress', lambda m: min(done.get(m, 0.0), 0.8))
    return budget, clock, kept, script, PRUNED_MODEL


def test_the_next_gpu_long_call_starts_the_three_stages_left_side_by_side(tmp_path, monkeypatch):
    """The call after the first (480 s less the 60 kept for the end), with sa_gen_cifar and the pruned model kept and
    sa_learned_cifar continued after 23 of its 50 epochs: at the speeds in the script sa_quadratic_cifar starts, then
    sa_learned_cifar beside it, then the ResNet, each expected to end within the call at its shared speed."""
    budget, _, _, script, pruned = _gpu_long_budget(tmp_path, monkeypatch, 420, kept=('sa_gen_cifar', 'sa_gen_pruned'),
                                                    done={'sa_learned_cifar': 23 / 50})
    o, e = script.STAGE_OVERHEAD_S, script.EPOCH_SLOWDOWN_4_SHARED
    # each model's 50 epochs and 50 evaluations (uncompiled on CUDA: 33.4 s) alone, in seconds
    train = {m: 50 * (script.TRAIN_IMAGES / script.IMAGES_PER_S[m] + script.TEST_IMAGES / script.EVAL_IMAGES_PER_S)
             for m in ('sa_quadratic_cifar', 'sa_learned_cifar', 'resnet18_cifar')}
    two, three = 1 + (e - 1) / 3, 1 + 2 * (e - 1) / 3  # an epoch's slowdown beside 1 other, beside 2
    assert budget.next_to_start({}) == 'sa_quadratic_cifar'
    # beside each other: 113 + 87.9 x 2.15 = 302 s, and 27/50 of 113 + 89.3 x 2.15 = 165 s
    assert o + train['sa_quadratic_cifar'] * two <= 420 and 27 / 50 * (o + train['sa_learned_cifar'] * two) <= 420
    assert budget.next_to_start({'sa_quadratic_cifar': None}) == 'sa_learned_cifar'
    # the third: 113 + 78.7 x 3.3 = 373 s for the ResNet, which cannot be stopped and continued
    assert o + train['resnet18_cifar'] * three <= 420
    assert budget.next_to_start({'sa_quadratic_cifar': None, 'sa_learned_cifar': None}) == 'resnet18_cifar'


def test_the_half_width_resnet_starts_only_where_it_is_expected_to_end(tmp_path, monkeypatch):
    """Its checkpoint cannot come back: it starts alone where its estimate fits, beside sa_learned_cifar only where
    both at their shared speed do, and never to be stopped."""
    models = ('sa_quadratic_cifar', 'sa_gen_cifar', 'sa_gen_pruned')
    o, e = _script().STAGE_OVERHEAD_S, _script().EPOCH_SLOWDOWN_4_SHARED
    script = _script()
    # 50 epochs and 50 evaluations (uncompiled on CUDA), both slowed by sharing the GPU
    resnet_train, learned_train = (50 * (script.TRAIN_IMAGES / script.IMAGES_PER_S[m]
                                         + script.TEST_IMAGES / script.EVAL_IMAGES_PER_S)
                                   for m in ('resnet18_cifar', 'sa_learned_cifar'))
    two = 1 + (e - 1) / 3  # an epoch's slowdown beside one other
    alone = o + resnet_train
    beside = max(o + resnet_train * two, o + learned_train * two)  # both must end within the budget
    for budget_s, expected in ((alone + 1, 'resnet18_cifar'), (alone - 1, None)):
        budget, *_ = _gpu_long_budget(tmp_path, monkeypatch, budget_s, kept=(*models, 'sa_learned_cifar'))
        assert budget.next_to_start({}) == expected, budget_s
    for budget_s, expected in ((beside + 1, 'resnet18_cifar'), (beside - 1, None)):
        budget, *_ = _gpu_long_budget(tmp_path, monkeypatch, budget_s, kept=models)
        assert budget.next_to_start({}) == 'sa_learned_cifar'  # 202 s alone
        assert budget.next_to_start({'sa_learned_cifar': None}) == expected, budget_s


def test_the_shared_slowdown_covers_the_stages_the_h100_ran_side_by_side(tmp_path):
    """The first gpu-long call (h100_2026-11-26b_gpu_long.json): sa_quadratic_cifar and sa_gen_cifar trained side by
    side. The model of two stages sharing the GPU, at the script's speeds, expects each to take at least what it
    took, and not twice as much."""
    import json
    measured = json.loads((SCRIPT.with_name('h100_2026-11-26b_gpu_long.json')).read_text())['stages']
    script = _script()
    from sa_vision.reproduce import Reproduction
    gpu_long = Reproduction(tmp_path, 'gpu-long')
    for model in ('sa_quadratic_cifar', 'sa_gen_cifar'):
        expected = script.estimate_s(gpu_long, model) * script.shared_slowdown(gpu_long, model, 2)
        assert measured[model] <= expected < 2 * measured[model], (model, expected, measured[model])


def test_sigterm_while_packing_waits_for_that_pack(tmp_path, monkeypatch):
    """``timeout``'s SIGTERM arriving while resume.tar is written: the handler's own packs (resume.tar, zoo.tar, the
    JSON, as the script's) start only once that one has ended, never inside it (the interrupted pack's buffered
    bytes would land in the file the handler renamed over it), and both tars come back whole."""
    import json
    import signal
    import time
    from types import SimpleNamespace

    from sa_vision.reproduce import Reproduction, StagedZoo
    script = _script()
    from probe_env import on_sigterm  # beside the script, on the path it sets
    staged = StagedZoo(Reproduction(tmp_path / 'work', 'tiny'), tmp_path / 'zoo', tmp_path / 'docs' / 't.csv')
    staged.reproduction.out.mkdir()
    (staged.reproduction.out / 'reproduction.json').write_text('{}')
    model = STAGE_ORDER[0]
    run = staged.reproduction.run_dir(model)
    run.mkdir(parents=True)
    for name in script.RESUME_FILES:
        (run / name).write_bytes(os.urandom(20_000))  # over a buffer: the first add writes through
    monkeypatch.setattr(script, 'read_checkpoint', lambda path: SimpleNamespace(meta={'epoch': 1, 'num_epochs': 2}))
    out, result, events = tmp_path / 'out', {}, []
    out.mkdir()
    opened, added = tarfile.TarFile.__init__, tarfile.TarFile.add

    def tar_init(self, name=None, mode='r', *args, **kwargs):
        opened(self, name, mode, *args, **kwargs)
        if mode == 'w':
            events.append(('open', Path(name).name))
            close = self.close
            self.close = lambda: (close(), events.append(('close', Path(name).name)))

    def add(self, name, *args, **kwargs):
        if events == [('open', '.resume.tar.partial')]:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the handler runs here, in the middle of the pack, unless it waits
        added(self, name, *args, **kwargs)
    monkeypatch.setattr(tarfile.TarFile, '__init__', tar_init)
    monkeypatch.setattr(tarfile.TarFile, 'add', add)

    def stopped():  # the script's handler: resume.tar, then zoo.tar and the JSON
        result['resume'] = script.pack_resume(staged, out, 2 ** 20)
        script.write_back(staged, out, result, time.time())
    with pytest.raises(SystemExit) as exit_, on_sigterm(stopped):
        script.pack_resume(staged, out, 2 ** 20)
    assert exit_.value.code == 128 + signal.SIGTERM
    # each tar is closed before the next is opened
    assert events == [(kind, name) for name in ('.resume.tar.partial', '.resume.tar.partial', '.zoo.tar.partial')
                      for kind in ('open', 'close')], events
    with tarfile.open(out / 'resume.tar') as tar:
        assert set(tar.getnames()) == {'reproduction.json', *(f'runs/{model}/{n}' for n in script.RESUME_FILES)}
        for name in script.RESUME_FILES:
            assert tar.extractfile(f'runs/{model}/{name}').read() == (run / name).read_bytes()
    with tarfile.open(out / 'zoo.tar') as tar:
        assert tar.getnames() == []
    assert json.loads((out / 'zoo_gpu_long.json').read_text())['resume'][model].startswith('kept after 1 of 2')


def test_sigterm_after_the_guard_is_recorded_packs_it(tmp_path, monkeypatch):
    """A SIGTERM once the guard of the zoo is recorded (every model kept, nothing to train): the zoo.tar that the
    handler writes holds the guard, as the call's end would have."""
    import signal

    from sa_vision.hub import HUB_FOLDER_FILES
    script, zoo, table = _script(), tmp_path / 'zoo', tmp_path / 'docs' / 't.csv'
    for model in STAGE_ORDER:
        (zoo / model).mkdir(parents=True)
        for name in HUB_FOLDER_FILES:
            (zoo / model / name).write_text('x')
    table.parent.mkdir()
    table.write_text('model\n' + ''.join(f'{m}\n' for m in STAGE_ORDER))

    def record(*args, **kwargs):
        for suffix in ('_weights.sha256', '_logits.safetensors'):
            table.with_name(table.stem + suffix).write_text('the guard of this call')
    pack_resume = script.pack_resume

    def sigterm_then_pack_resume(*args):  # the SIGTERM as the call's end begins
        os.kill(os.getpid(), signal.SIGTERM)
        return pack_resume(*args)
    monkeypatch.setattr(script, 'record_kept_models', record)
    monkeypatch.setattr(script, 'pack_resume', sigterm_then_pack_resume)
    monkeypatch.setattr(script, 'checkpoint_bytes', lambda *a: 0)
    with pytest.raises(SystemExit) as exit_:
        script.main(['--smoke', '--out', str(tmp_path / 'out'), '--zoo', str(zoo), '--table', str(table)])
    assert exit_.value.code == 128 + signal.SIGTERM
    with tarfile.open(tmp_path / 'out' / 'zoo.tar') as tar:
        assert {'docs/t_weights.sha256', 'docs/t_logits.safetensors'} <= set(tar.getnames())
