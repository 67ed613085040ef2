""" scripts/train.py end to end on the offline digits data: accuracy, exact resume, torchrun DDP, safe loading """
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip('sklearn')

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / 'scripts' / 'train.py'
DIGITS_RECIPE = ROOT / 'scripts' / 'configs' / 'sa_quadratic_cifar_digits.yaml'
# a tiny model for the mechanics tests (accuracy does not matter there)
TINY_ARGS = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32']


def _env(threads: int = 1):
    # one BLAS thread per process: no oversubscription when processes share the 2 cores
    return dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT))


def run_train(args, threads=1, timeout=600):
    proc = subprocess.run([sys.executable, str(TRAIN), *map(str, args)], cwd=ROOT, env=_env(threads),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def result_of(log: str):
    line = [l for l in log.splitlines() if l.startswith('Result ')][-1]
    return json.loads(line[len('Result '):])


def load_ckpt(path):
    return torch.load(path, map_location='cpu', weights_only=True)


@pytest.mark.slow
def test_digits_small_sa_model_reaches_90_percent(tmp_path):
    log = run_train(['-c', DIGITS_RECIPE, '--output', tmp_path, '--experiment', 'digits', '--target-top1', 90])
    result = result_of(log)
    assert result['dataset'] == 'digits' and result['num_images'] == 360
    assert result['top1'] >= 90., log[-2000:]
    assert 'img/s' in log and 'LR:' in log and 'Loss:' in log


def _mechanics_args(out, name, epochs):
    return ['-c', DIGITS_RECIPE, *TINY_ARGS, '--epochs', epochs, '--warmup-epochs', 0.5, '-b', 64,
            '--output', out, '--experiment', name, '--log-interval', 5]


@pytest.mark.slow
def test_killed_and_resumed_run_ends_with_the_same_weights(tmp_path):
    epochs = 3
    run_train(_mechanics_args(tmp_path, 'straight', epochs))

    # the same run, killed (SIGKILL) right after it saved its first epoch
    cmd = [sys.executable, str(TRAIN), *map(str, _mechanics_args(tmp_path, 'killed', epochs))]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith('Saved checkpoint epoch 1/'):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    last = tmp_path / 'killed' / 'last.pth.tar'
    assert load_ckpt(last)['epoch'] < epochs, 'the run finished before it was killed'
    assert not [p for p in last.parent.iterdir() if '.tmp' in p.name], 'a temporary checkpoint was left behind'

    run_train(_mechanics_args(tmp_path, 'killed', epochs)[:-4] + ['--resume', last, '--log-interval', 5])
    straight, resumed = load_ckpt(tmp_path / 'straight' / 'last.pth.tar'), load_ckpt(last)
    assert resumed['epoch'] == straight['epoch'] == epochs
    assert resumed['num_updates'] == straight['num_updates']
    for key, value in straight['state_dict'].items():
        assert torch.equal(value, resumed['state_dict'][key]), key
    assert [h['eval_top1'] for h in resumed['history']] == [h['eval_top1'] for h in straight['history']]


@pytest.mark.slow
def test_torchrun_two_processes_on_cpu(tmp_path):
    torchrun = shutil.which('torchrun')
    cmd = [torchrun] if torchrun else [sys.executable, '-m', 'torch.distributed.run']
    cmd += ['--standalone', '--nproc_per_node', '2', str(TRAIN),
            *map(str, _mechanics_args(tmp_path, 'ddp', 1)), '--workers', '0']
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert '2 process(es) on cpu' in log
    result = result_of(log)
    assert result['num_images'] == 360  # the two evaluation shards add up to the whole test split

    from sa_vision.hub import load_training_checkpoint, model_from_checkpoint
    ckpt = load_training_checkpoint(tmp_path / 'ddp' / 'last.pth.tar')
    assert ckpt['args']['world_size'] == 2
    model = model_from_checkpoint(ckpt)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_digits_dataset_split_is_fixed():
    from sa_vision.data import DigitsDataset
    train, test = DigitsDataset('train'), DigitsDataset('test')
    assert (len(train), len(test)) == (1437, 360)
    assert train.images.shape[1:] == (3, 32, 32)
    assert torch.equal(DigitsDataset('test').targets, test.targets)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    from sa_vision.hub import atomic_torch_save
    path = tmp_path / 'last.pth.tar'
    atomic_torch_save({'epoch': 1}, path)

    def crash(obj, f, *args, **kwargs):
        Path(f).write_bytes(b'half a checkpoint')
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, 'save', crash)
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({'epoch': 2}, path)
    assert load_ckpt(path) == {'epoch': 1}
    assert [p.name for p in tmp_path.iterdir()] == ['last.pth.tar']


def test_recipes_use_timm_argument_names():
    from sa_vision.paper import PAPER_RESULTS
    from sa_vision.recipes import load_recipe
    for arch in PAPER_RESULTS:
        recipe = load_recipe(arch)
        assert recipe['model'] == arch
        assert recipe['batch_size'] == 100 and recipe['opt'] == 'sgd' and recipe['momentum'] == 0.9
        assert recipe['sched_on_updates'] is True and recipe['smoothing'] == 0.
        if arch != 'resnet18_cifar':
            assert recipe['warmup_epochs'] == pytest.approx(0.05 * recipe['epochs'])
