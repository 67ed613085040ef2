""" scripts/reproduce.py end to end on digits with tiny models: five folders, a five-row table, kill and rerun """
import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip('sklearn')

ROOT = Path(__file__).resolve().parent.parent
REPRODUCE = ROOT / 'scripts' / 'reproduce.py'
MODELS = ('sa_quadratic_cifar', 'sa_gen_cifar', 'sa_gen_pruned', 'sa_learned_cifar', 'resnet18_cifar')


def _env():
    return dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1')


def _reproduce(out, *extra, check=True):
    proc = subprocess.run([sys.executable, str(REPRODUCE), '--profile', 'tiny', '--out', str(out), *extra],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    if check:
        assert proc.returncode == 0, log[-4000:]
    return proc.returncode, log


@pytest.mark.slow
def test_pipeline_killed_mid_stage_continues_and_delivers_the_zoo(tmp_path):
    out = tmp_path / 'zoo'
    # killed (SIGKILL) in the middle of the second training stage, after its first epoch
    proc = subprocess.Popen([sys.executable, str(REPRODUCE), '--profile', 'tiny', '--out', str(out)], cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    in_second_stage = False
    for line in proc.stdout:
        in_second_stage = in_second_stage or line.startswith('== [2/')
        if in_second_stage and line.startswith('Saved checkpoint epoch 1/2'):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    first = out / 'runs' / 'sa_quadratic_cifar' / 'last.pth.tar'
    first_mtime = first.stat().st_mtime_ns
    killed = torch.load(out / 'runs' / 'sa_gen_cifar' / 'last.pth.tar', weights_only=True)
    assert killed['epoch'] == 1 and killed['num_epochs'] == 2

    _, log = _reproduce(out)
    assert 'sa_quadratic_cifar: finished (2 epochs), skipped' in log
    assert 'sa_gen_cifar: continuing the killed run at epoch 1' in log
    # the training process itself resumed at the saved epoch and update count (it did not start over)
    assert f'Resuming {out / "runs" / "sa_gen_cifar"} at epoch 1, update {killed["num_updates"]}' in log
    assert first.stat().st_mtime_ns == first_mtime, 'a finished stage was trained again'

    with open(out / 'results.csv') as f:
        rows = list(csv.DictReader(f))
    assert [r['model'] for r in rows] == list(MODELS)
    assert all(r['dataset'] == 'digits' and float(r['top1']) >= 0 and int(r['parameters']) > 0 for r in rows)
    assert (out / 'results.md').read_text().count('\n| `') == 5

    pruning = json.loads((out / 'pruning.json').read_text())
    assert len(pruning['kept_heads_per_layer']) == 2 and all(k >= 1 for k in pruning['kept_heads_per_layer'])

    import timm
    import sa_vision  # noqa: F401
    from sa_vision.checkpoint import read_checkpoint
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
    assert 'dry run: would publish' in log

    # everything done: a third run skips every stage
    _, log = _reproduce(out)
    assert log.count('skipped') >= 5 + 5  # five trainings, five exports (pruning too)
    assert 'Epoch' not in log and 'Train: ' not in log

    # a stage that fails stops the run, names itself, and leaves the finished stages as they were
    learned = out / 'runs' / 'sa_learned_cifar' / 'last.pth.tar'
    learned.write_bytes(learned.read_bytes()[:1000])
    code, log = _reproduce(out, check=False)
    assert code == 1 and "stage 'train sa_learned_cifar' failed" in log and 'corrupted' in log
    assert first.stat().st_mtime_ns == first_mtime and len(list((out / 'hub').iterdir())) == 5


def test_another_setup_in_the_same_folder_is_refused(tmp_path):
    from sa_vision.reproduce import Reproduction, StageFailed
    (tmp_path / 'reproduction.json').write_text(json.dumps({'profile': 'cpu', 'dataset': 'fashion-mnist',
                                                            'epochs': None}))
    with pytest.raises(StageFailed, match='continue it with the same options'):
        Reproduction(tmp_path, 'tiny').run()


def test_profiles_keep_the_paper_depth_and_heads_and_the_paper_recipes():
    from sa_vision.recipes import load_recipe
    from sa_vision.reproduce import PROFILES
    for model in MODELS:  # the paper profile: the recipes unchanged, CIFAR-10's test split
        expected = load_recipe(model)
        expected.pop('initial_checkpoint', None)  # given per run: the pruned weights
        expected.update(dataset='torch/cifar10', val_split='test', num_classes=10)
        assert PROFILES['paper'].recipe(model, 'torch/cifar10') == expected, model
    cpu = PROFILES['cpu'].recipe('sa_quadratic_cifar', 'fashion-mnist')
    assert 'depth' not in cpu['model_kwargs'] and 'heads_per_layer' not in cpu['model_kwargs']
    assert cpu['dataset'] == 'fashion-mnist' and cpu['epochs'] < 300
    assert 'heads_per_layer' not in PROFILES['cpu'].recipe('sa_gen_pruned', 'fashion-mnist').get('model_kwargs', {})


def test_results_table_has_the_median_centre_shift_of_each_run(tmp_path):
    """The column compares a run's epoch-000 weights with its last: a run whose centres moved by hand."""
    import timm
    from safetensors.torch import save_file
    import sa_vision  # noqa: F401
    from sa_vision.checkpoint import CHECKPOINT_VERSION, atomic_torch_save
    from sa_vision.reproduce import Reproduction
    kwargs = dict(embed_dim=8, depth=1, heads_per_layer=4, mlp_hidden_dim=8, num_classes=10)
    zoo = Reproduction(tmp_path, 'tiny')
    for arch in ('sa_quadratic_cifar', 'sa_learned_cifar'):
        model = timm.create_model(arch, **kwargs)
        run = zoo.run_dir(arch)
        run.mkdir(parents=True)
        initial = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(initial, str(run / 'epoch-000.safetensors'), metadata={'arch': arch, 'model_args': json.dumps(kwargs)})
        final = dict(initial)
        if arch == 'sa_quadratic_cifar':  # heads moved by 0.5, 1, 2, 4 grid units: median 1.5
            final['blocks.0.attn.position.centers'] = initial['blocks.0.attn.position.centers'] + torch.tensor(
                [[0.5, 0.], [0., -1.], [2., 0.], [0., 4.]])
        atomic_torch_save({'version': CHECKPOINT_VERSION, 'arch': arch, 'model_args': kwargs, 'state_dict': final,
                           'epoch': 1, 'num_epochs': 1, 'metrics': {'top1': 50., 'top5': 90.},
                           'history': [{'train_time': 60.}]}, run / 'last.pth.tar')
    zoo.table(quiet=True)
    with open(tmp_path / 'results.csv') as f:
        rows = {r['model']: r for r in csv.DictReader(f)}
    assert float(rows['sa_quadratic_cifar']['center_shift_median']) == pytest.approx(1.5)
    assert rows['sa_learned_cifar']['center_shift_median'] == ''
    assert '| 1.50 |' in (tmp_path / 'results.md').read_text()
