""" sa-vision-train end to end on the offline digits data: accuracy, exact resume, torchrun DDP, safe loading,
timm train.py checkpoints, recipes, pruned weights, fp16 loss scaling """
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT_S, command, command_here, run_result, sigint_as_from_a_terminal, train_here

pytest.importorskip('sklearn')

from sa_vision.train.recipes import RECIPE_DIR  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DIGITS_RECIPE = RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml'
# a tiny model for the mechanics tests (accuracy does not matter there)
TINY_ARGS = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32']


def _env():
    # one BLAS thread per process: no oversubscription when processes share the 2 cores
    return dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))


def run_train(caplog, capsys, args):
    """The log of sa-vision-train ``args`` run in this process on one thread (``train_here``), which must succeed:
    only the killed run and torchrun need processes of their own."""
    status, log = train_here(caplog, capsys, *args)
    assert status == 0, log[-4000:]
    return log


def load_ckpt(path):
    return torch.load(path, map_location='cpu', weights_only=True)


@pytest.mark.slow
def test_digits_small_sa_model_reaches_90_percent(tmp_path, caplog, capsys):
    log = run_train(caplog, capsys, ['-c', DIGITS_RECIPE, '--output', tmp_path, '--experiment', 'digits',
                                     '--target-top1', 90])
    result = run_result(log)
    assert result['dataset'] == 'digits' and result['num_images'] == 360
    assert result['top1'] >= 90., log[-2000:]
    assert 'img/s' in log and 'LR:' in log and 'Loss:' in log


def test_the_result_is_one_json_line_on_stdout_and_the_log_on_stderr(tmp_path, caplog, capsys):
    """As timm's train.py prints its --result: a script reads stdout, a person the log (stderr's handler)."""
    with caplog.at_level(logging.INFO):
        status, out, err = command_here(capsys, 'train', '--threads', 1, *_mechanics_args(tmp_path, 'run', 1))
    assert status == 0, err[-3000:]
    assert len(out.splitlines()) == 1 and json.loads(out)['epochs'] == 1, out
    assert 'Top-1 on the digits test split' in caplog.text and '"top1"' not in caplog.text + err


def _mechanics_args(out, name, epochs):
    return ['-c', DIGITS_RECIPE, *TINY_ARGS, '--epochs', epochs, '--warmup-epochs', 0.5, '-b', 64,
            '--output', out, '--experiment', name, '--log-interval', 5]


# dropout, a random crop and flips: every epoch draws random numbers, so a resumed run repeats an uninterrupted one
# only if each epoch's RNG state is restored (the digits recipe alone draws none)
def train_killed_after_first_epoch(args) -> None:
    """Run sa-vision-train with ``args`` and kill it (SIGKILL) as soon as it has saved its first epoch."""
    cmd = [*command('train'), *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith('Saved checkpoint of epoch 0 (1/'):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=HANG_TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL, 'the run ended before it was killed'


RANDOM_ARGS = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32',
               'proj_drop_rate=0.2', 'attn_drop_rate=0.2', '--hflip', 0.5, '--train-crop-padding', 4]


@pytest.mark.slow
def test_killed_and_resumed_run_ends_with_the_same_weights(tmp_path, caplog, capsys):
    epochs = 3
    run_train(caplog, capsys, _mechanics_args(tmp_path, 'straight', epochs) + RANDOM_ARGS)

    # the same run, killed (SIGKILL) right after it saved its first epoch
    train_killed_after_first_epoch(_mechanics_args(tmp_path, 'killed', epochs) + RANDOM_ARGS)
    last = tmp_path / 'killed' / 'last.pth.tar'
    assert load_ckpt(last)['epoch'] < epochs - 1, 'the run finished before it was killed'  # counted from 0
    assert not [p for p in last.parent.iterdir() if '.tmp' in p.name], 'a temporary checkpoint was left behind'

    saved = load_ckpt(last)
    # no recipe and no options: the run's own arguments (AdamW, dropout, augmentation) are taken from its checkpoint
    log = run_train(caplog, capsys, ['--resume', last])
    # the resumed process starts at the saved epoch and update count, it does not redo epoch 0
    assert f'at epoch {saved["epoch"] + 1}, update {saved["num_updates"]}' in log
    trained_epochs = sorted({int(ln.split()[1]) for ln in log.splitlines() if ln.startswith('Train: ')})
    assert trained_epochs == list(range(saved['epoch'] + 1, epochs)), trained_epochs
    straight, resumed = load_ckpt(tmp_path / 'straight' / 'last.pth.tar'), load_ckpt(last)
    assert resumed['epoch'] == straight['epoch'] == epochs - 1
    assert resumed['num_updates'] == straight['num_updates']
    for key, value in straight['state_dict'].items():
        assert torch.equal(value, resumed['state_dict'][key]), key
    assert [h['eval_top1'] for h in resumed['history']] == [h['eval_top1'] for h in straight['history']]


@pytest.mark.slow
def test_sigterm_ends_a_run_as_ctrl_c_does_and_it_resumes(tmp_path, caplog, capsys):
    """A cluster's scheduler ends a job with SIGTERM, to all its processes (the DataLoader's workers too): the run
    says what it left and how to go on, in one line, and exits with 143 (128 + SIGTERM), as a shell reports a
    command that SIGTERM ended; what it saved resumes."""
    cmd = [*command('train'), *map(str, _mechanics_args(tmp_path, 'preempted', 20)), '-j', '2']
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    log = []
    for line in proc.stdout:
        log.append(line)
        if line.startswith('Train: 1 '):  # in the second epoch, its workers running
            os.killpg(proc.pid, signal.SIGTERM)
            break
    log = ''.join(log + proc.stdout.readlines())
    proc.wait(timeout=HANG_TIMEOUT_S)
    last = tmp_path / 'preempted' / 'last.pth.tar'
    assert proc.returncode == 128 + signal.SIGTERM, log[-3000:]
    assert [ln for ln in log.splitlines() if 'SIGTERM' in ln] == [
        f'terminated (SIGTERM): continue from its last finished epoch with --resume {last}'], log[-3000:]
    assert 'Traceback' not in log and 'Exception ignored' not in log, log[-3000:]
    assert not [p for p in last.parent.iterdir() if '.tmp' in p.name], 'a temporary file was left behind'
    done = load_ckpt(last)['epoch']
    log = run_train(caplog, capsys, ['--resume', last, '--epochs', done + 2])
    assert f'at epoch {done + 1}, update' in log and load_ckpt(last)['epoch'] == done + 1


@pytest.mark.slow
def test_torchrun_two_processes_train_like_one_process_with_the_global_batch(tmp_path, caplog, capsys):
    """DDP averages the two processes' gradients: 2 x 32 images per step train the same weights as 1 x 64.

    Without DDP each process would train on its own half and the saved (rank 0) weights would differ. SGD, not the
    recipe's AdamW, whose steps do not change with the gradients' scale: summed gradients would pass under it."""
    sgd = ['--opt', 'momentum', '--lr', '0.1']
    torchrun = shutil.which('torchrun')
    cmd = [torchrun] if torchrun else [sys.executable, '-m', 'torch.distributed.run']
    cmd += ['--standalone', '--nproc_per_node', '2', '-m', 'sa_vision.cli.train',
            *map(str, _mechanics_args(tmp_path, 'ddp', 1)), '-b', 32, '--workers', '0', '--export', *sgd]
    proc = subprocess.run(list(map(str, cmd)), cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=HANG_TIMEOUT_S)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert '2 process(es) on cpu' in log
    result = run_result(log)
    assert result['num_images'] == 360  # the two evaluation shards are summed over the processes
    run_train(caplog, capsys, [*_mechanics_args(tmp_path, 'single', 1), *sgd])  # -b 64 in one process
    ddp, single = load_ckpt(tmp_path / 'ddp' / 'last.pth.tar'), load_ckpt(tmp_path / 'single' / 'last.pth.tar')
    assert ddp['num_updates'] == single['num_updates'] == 1437 // 64
    for key, value in single['state_dict'].items():
        torch.testing.assert_close(ddp['state_dict'][key], value, rtol=1e-3, atol=1e-4, msg=key)
    assert ddp['metrics']['top1'] == pytest.approx(single['metrics']['top1'], abs=0.3)
    # the training loss of both processes' halves: the loss of the 64 images one process trains on
    assert ddp['history'][0]['train_loss'] == pytest.approx(single['history'][0]['train_loss'], rel=1e-3)
    # so its recipe (batch 32, each process's) repeats the run only under torchrun with two processes
    repeat = 'torchrun --nproc_per_node 2 -m sa_vision.cli.train -c recipe.yaml'
    hub = tmp_path / 'ddp' / 'hub'
    assert repeat in (hub / 'recipe.yaml').read_text().splitlines()[0]
    assert f'`{repeat}` repeats the run' in (hub / 'README.md').read_text()


# torchrun runs this in place of sa-vision-train: its second process starts later, in another second of the clock,
# and measures the opposite of what the first measures of autocast (--amp auto)
_SECOND_PROCESS_OTHERWISE = """import os, sys, time
if os.environ['LOCAL_RANK'] == '1':
    time.sleep(1.5)
    import sa_vision.train.loop as loop
    import sa_vision.train.run_setup as run_setup
    measured = run_setup.resolve_amp
    run_setup.resolve_amp = lambda *args, **kwargs: (not measured(*args, **kwargs)[0], 'measured otherwise')

    def precision(model, args, chosen=run_setup.precision):
        try:
            return chosen(model, args)
        finally:
            print(f'the second process trains with amp={args.amp_used}', flush=True)
    loop.precision = precision
from sa_vision.cli.train import cli
sys.exit(cli())
"""


@pytest.mark.slow
def test_torchrun_evaluates_the_batch_norm_it_saves_and_says_things_once(tmp_path):
    """Under torchrun each process updates the BatchNorm statistics of its own batches; they are averaged before
    the evaluation (as timm's train.py, --dist-bn reduce), so the run's evaluation is that of the weights saved:
    one process evaluating the checkpoint gets the same. A recipe's note and Ctrl-C's advice come once, naming the
    folder the run writes (a name of the clock's second, which the later process would name otherwise), and
    --amp auto's choice is the first process's for all."""
    script = tmp_path / 'train_later.py'
    script.write_text(_SECOND_PROCESS_OTHERWISE)
    recipe = tmp_path / 'recipe.yaml'
    recipe.write_text('dataset: digits\nhflip: 0\nsync_bn: false\n')  # sync_bn: a key only timm's train.py reads
    torchrun = shutil.which('torchrun')
    cmd = [torchrun] if torchrun else [sys.executable, '-m', 'torch.distributed.run']
    cmd += ['--standalone', '--nproc_per_node', 2, script, '-c', recipe, '--model', 'resnet18_cifar',
            '--model-kwargs', 'channels=[8,16,16,16]', '--epochs', 50, '-b', 32, '--opt', 'adamw', '--lr', '3e-3',
            '--workers', 0, '--amp', 'auto', '--output', tmp_path / 'runs']
    proc = subprocess.Popen(list(map(str, cmd)), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=sigint_as_from_a_terminal)
    log = []
    for line in proc.stdout:
        log.append(line)
        if line.startswith('Saved checkpoint of epoch 0 (1/'):
            os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C reaches every process
            break
    log += proc.stdout.readlines()
    proc.wait(timeout=HANG_TIMEOUT_S)
    log = ''.join(log)
    (run,) = (tmp_path / 'runs').iterdir()
    last = run / 'last.pth.tar'
    assert [ln for ln in log.splitlines() if 'interrupted' in ln] == [
        f'interrupted: continue from its last finished epoch with --resume {last}'], log[-4000:]
    assert log.count('sync_bn') == 1, log[-4000:]
    # every process trains and evaluates in the precision the first chose
    amp = load_ckpt(last)['args']['amp_used']
    assert f'the second process trains with amp={amp}' in log, log[-4000:]
    saved = load_ckpt(last)
    assert saved['epoch'] == 0, 'the run went on after Ctrl-C'
    from sa_vision.cli import validate
    out = tmp_path / 'validate.json'
    assert validate.main(['--checkpoint', str(last), '--threads', '1', '--results-file', str(out),
                          '--results-format', 'json', '--amp' if amp else '--no-amp']) == 0
    alone = json.loads(out.read_text())
    assert alone['num_images'] == 360
    # the loss to float32 sums' rounding; top-1 to one image (a near-tie may round either way on another CPU)
    assert alone['top1'] == pytest.approx(saved['metrics']['top1'], abs=100 / 360)
    assert alone['loss'] == pytest.approx(saved['metrics']['loss'], rel=1e-5)


@pytest.mark.parametrize('device', ['meta', pytest.param('cuda', marks=pytest.mark.cuda)])
def test_evaluation_reduces_on_the_model_device(monkeypatch, device):
    """NCCL reduces only tensors on the process's GPU: the totals must live on the evaluation device
    ('meta' stands in for a device other than the CPU where there is no GPU)."""
    import torch.distributed as dist

    from sa_vision.train.evaluation import evaluate
    seen = []

    class Stop(Exception):
        pass

    def all_reduce(tensor, *args, **kwargs):
        seen.append(tensor.device)
        raise Stop
    monkeypatch.setattr(dist, 'all_reduce', all_reduce)
    model = torch.nn.Linear(4, 3, device=device)
    loader = [(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))]
    with pytest.raises(Stop):
        evaluate(model, loader, device, distributed=True)
    assert [d.type for d in seen] == [device]


@pytest.mark.cuda
def test_evaluation_all_reduces_over_nccl(tmp_path):
    """A real NCCL all-reduce of the evaluation totals (one process, world size 1): the same metrics as
    without DDP. Two processes need two GPUs (one GPU per process), which the torchrun test above does on CPU."""
    import torch.distributed as dist

    from sa_vision.train.evaluation import evaluate
    if not dist.is_nccl_available():
        pytest.skip('PyTorch built without NCCL')
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 7).cuda()
    loader = [(torch.randn(5, 4), torch.randint(0, 7, (5,))) for _ in range(3)]
    expected = evaluate(model, loader, 'cuda')
    dist.init_process_group('nccl', init_method=f'file://{tmp_path / "store"}', rank=0, world_size=1)
    try:
        assert evaluate(model, loader, 'cuda', distributed=True) == pytest.approx(expected)
    finally:
        dist.destroy_process_group()


def test_evaluation_counts_top1_and_top5():
    from sa_vision.train.evaluation import evaluate
    logits = torch.tensor([[9., 1, 2, 3, 4, 5, 6], [1., 9, 2, 3, 4, 5, 6], [6., 5, 4, 3, 2, 1, 0]])
    targets = torch.tensor([0, 0, 5])  # hit at rank 1; rank 7 (miss); rank 6 (miss for top-5)
    model = torch.nn.Identity()
    metrics = evaluate(model, [(logits, targets)], 'cpu')
    assert metrics['num_images'] == 3
    assert metrics['top1'] == pytest.approx(100 / 3) and metrics['top5'] == pytest.approx(100 / 3)
    expected = torch.nn.functional.cross_entropy(logits, targets).item()
    assert metrics['loss'] == pytest.approx(expected)


def test_evaluation_with_a_padded_last_batch_counts_only_the_real_images():
    """``pad_last_batch`` (the compiled evaluation's one shape) pads the short batch with zero images to the
    loader's batch size and drops their logits: loss, top-1, top-5 and the count equal a hand computation over the
    real images alone (torch's cross-entropy and argmax / top-5 on their 7 x 7 logits)."""
    from sa_vision.train.evaluation import evaluate
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 7)
    model.bias.data.fill_(3.)  # a zero (padding) image's logits are the bias: a class of its own, if it counted
    model.bias.data[6] = 9.
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    images, targets = torch.randn(7, 4), torch.tensor([6, 1, 2, 3, 4, 5, 0])
    loader = [(images[:5], targets[:5]), (images[5:], targets[5:])]
    metrics = evaluate(model, loader, 'cpu', pad_last_batch=True)
    assert seen == [5, 5], 'the short batch must be padded to the first batch size'
    with torch.no_grad():
        logits = model(images)
    top5 = logits.topk(5, dim=-1).indices
    assert metrics['num_images'] == 7
    assert metrics['loss'] == pytest.approx(torch.nn.functional.cross_entropy(logits, targets).item(), rel=1e-6)
    assert metrics['top1'] == pytest.approx(100 * (logits.argmax(-1) == targets).sum().item() / 7)
    assert metrics['top5'] == pytest.approx(100 * (top5 == targets[:, None]).any(-1).sum().item() / 7)


@pytest.mark.parametrize('smoothing', [0.1, 0.])
def test_training_loss_is_timms_label_smoothing_cross_entropy(tmp_path, caplog, capsys, monkeypatch, smoothing):
    """--smoothing (timm's): the loss every training step calls is timm's ``LabelSmoothingCrossEntropy(smoothing)``
    where it is positive and plain cross-entropy at 0. The loss is caught where sa-vision-train hands it to the
    epoch (run in this process, stopped there) and compared on random logits with timm's and torch's own."""
    from timm.loss import LabelSmoothingCrossEntropy

    from sa_vision.train import loop

    class Caught(Exception):
        pass
    caught = []

    def first_epoch(epoch, model, loader, optimizer, loss_fn, *args, **kwargs):
        caught.append(loss_fn)
        raise Caught
    monkeypatch.setattr(loop, 'train_one_epoch', first_epoch)
    with pytest.raises(Caught):
        train_here(caplog, capsys, *_mechanics_args(tmp_path, 'smoothing', 1), '--smoothing', smoothing)
    loss_fn, = caught
    torch.manual_seed(0)
    logits, targets = torch.randn(32, 10), torch.randint(0, 10, (32,))
    expected = (LabelSmoothingCrossEntropy(smoothing)(logits, targets) if smoothing
                else torch.nn.functional.cross_entropy(logits, targets))
    assert not torch.allclose(LabelSmoothingCrossEntropy(0.1)(logits, targets),
                              torch.nn.functional.cross_entropy(logits, targets)), 'the two must differ here'
    torch.testing.assert_close(loss_fn(logits, targets), expected)


def test_digits_dataset_split_is_fixed():
    from sa_vision.train.datasets import DigitsDataset
    train, test = DigitsDataset('train'), DigitsDataset('test')
    assert (len(train), len(test)) == (1437, 360)
    assert train.images.shape[1:] == (3, 32, 32)
    assert torch.equal(DigitsDataset('test').targets, test.targets)


@pytest.mark.parametrize('is_training', [True, False])
def test_digits_take_the_asked_image_size(is_training):
    """--img-size reaches the digits as it reaches every dataset: 16 x 16 images (of the same digits, and the
    training ones still padded and cropped), where they were 32 x 32 whatever was asked."""
    from sklearn.datasets import load_digits

    from sa_vision.train.data import create_image_dataset
    ds = create_image_dataset('digits', 'test', is_training=is_training, img_size=16, mean=(0.,), std=(1.,))
    assert ds[0][0].shape == (3, 16, 16)
    # the same digits: halved back to 8 x 8, each of the first 20 is nearest an original digit of its own label
    digits = load_digits()
    originals = torch.tensor(digits.images / 16., dtype=torch.float32).reshape(len(digits.target), 64)
    halved = torch.nn.functional.avg_pool2d(ds.images[:20, :1], 2).reshape(20, 64)
    nearest = torch.cdist(halved, originals, p=1).argmin(1)
    assert digits.target[nearest].tolist() == ds.targets[:20].tolist()


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    from sa_vision.io import atomic_torch_save
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
    from sa_vision.train.recipes import load_recipe
    for arch in PAPER_RESULTS:
        recipe = load_recipe(arch)
        assert recipe['model'] == arch
        # App. A.4: momentum 0.9, which timm names 'momentum' (its 'sgd' is Nesterov's)
        assert recipe['opt'] == 'momentum' and recipe['momentum'] == 0.9 and recipe['lr'] in (0.1, 0.01)
        assert recipe['sched_on_updates'] is True and recipe['smoothing'] == 0.
        if arch != 'resnet18_cifar':
            assert recipe['batch_size'] == 100 and recipe['sched'] == 'cosine'
            assert recipe['warmup_epochs'] == pytest.approx(0.05 * recipe['epochs'])
        else:  # the authors' released baseline (hyperparameters/resnet18_cifar10_baseline.py): A.4 may not be its
            assert (recipe['batch_size'], recipe['epochs'], recipe['sched'], recipe['decay_milestones'],
                    recipe['decay_rate']) == (256, 300, 'multistep', [150, 250], 0.1)


def test_command_line_model_kwargs_update_the_recipes(monkeypatch):
    from sa_vision.train.state import parse_run_args
    args, recipe, _ = parse_run_args(['-c', str(DIGITS_RECIPE), '--model-kwargs', 'embed_dim=8'])
    assert recipe['model_kwargs']['proj_drop_rate'] == 0.0
    assert args.model_kwargs == {**recipe['model_kwargs'], 'embed_dim': 8}


def test_best_epoch_follows_the_metric_direction():
    from sa_vision.train.loop import is_better
    assert is_better('loss', 0.5, 1.0) and not is_better('loss', 1.0, 0.5)
    assert is_better('top1', 60., 50.) and not is_better('top1', 50., 60.)


@pytest.mark.slow
def test_float16_amp_trains_with_a_loss_scaler(tmp_path, caplog, capsys):
    run_train(caplog, capsys, _mechanics_args(tmp_path, 'fp16', 1) + ['--amp', '--amp-dtype', 'float16'])
    ckpt = load_ckpt(tmp_path / 'fp16' / 'last.pth.tar')
    assert isinstance(ckpt.get('loss_scaler'), dict) and ckpt['loss_scaler']['scale'] > 0
    # the scaler took part in every step: it counts the steps since its scale last changed (growth every 2000
    # clean steps, halved on an overflow), so an unused scaler still reads its initial 2**16 and 0 steps
    scaler = ckpt['loss_scaler']
    assert scaler['_growth_tracker'] == ckpt['num_updates'] or scaler['scale'] != 2. ** 16, scaler
    assert all(torch.isfinite(v).all() for v in ckpt['state_dict'].values())


@pytest.mark.cuda
def test_bfloat16_amp_channels_last_run_on_cuda(tmp_path, caplog, capsys):
    """One short epoch on the GPU with bf16 autocast and the channels-last layout; the checkpoint loads."""
    from sa_vision.train.checkpoint import load_model
    log = run_train(caplog, capsys, _mechanics_args(tmp_path, 'cuda', 1) + [
        '--device', 'cuda', '--amp', '--amp-dtype', 'bfloat16', '--channels-last', '--workers', 0])
    assert '1 process(es) on cuda' in log and 'amp=bfloat16' in log
    ckpt = load_ckpt(tmp_path / 'cuda' / 'last.pth.tar')
    assert ckpt['num_updates'] == 1437 // 64 and ckpt.get('loss_scaler') is None  # no scaler for bfloat16
    assert all(torch.isfinite(v).all() for v in ckpt['state_dict'].values())
    model = load_model(str(tmp_path / 'cuda' / 'last.pth.tar'))
    for key, value in model.state_dict().items():
        assert torch.equal(value, ckpt['state_dict'][key]), key
    assert torch.isfinite(model(torch.randn(2, 3, 32, 32))).all()


@pytest.mark.slow
def test_pruned_weights_start_a_fine_tuning_run(tmp_path, caplog, capsys):
    """sa-vision-prune output -> train.py --model sa_gen_pruned --initial-checkpoint, whatever heads survive."""
    import timm

    import sa_vision  # noqa: F401
    source = timm.create_model('sa_gen_cifar', embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=32)
    torch.save(source.state_dict(), tmp_path / 'gen.pth')  # a bare state dict: architecture read off the shapes
    pruned = tmp_path / 'pruned.pth'
    status, _, err = command_here(capsys, 'prune', tmp_path / 'gen.pth', '--heads', '1', '2,3', '--out', pruned)
    assert status == 0, err
    # lr 0: the run must end with exactly the pruned weights it started from
    run_train(caplog, capsys, ['-c', RECIPE_DIR / 'sa_gen_pruned.yaml', '--initial-checkpoint', pruned,
               '--dataset', 'digits', '--val-split', 'test', '-b', 64, '--epochs', 1, '--warmup-epochs', 0,
               '--lr', 0, '--workers', 0, '--output', tmp_path, '--experiment', 'finetune'])
    ckpt = load_ckpt(tmp_path / 'finetune' / 'last.pth.tar')
    assert tuple(ckpt['model_args']['heads_per_layer']) == (2, 1)
    start = load_ckpt(pruned)['state_dict']
    for key, value in start.items():
        assert torch.equal(ckpt['state_dict'][key], value), key


def test_image_folder_without_held_out_split_is_an_error(tmp_path):
    from sa_vision.train.data import create_image_dataset
    for cls in ('cat', 'dog'):
        (tmp_path / 'train' / cls).mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no 'validation' subfolder.*\['train'\].*--val-split"):
        create_image_dataset('', 'validation', is_training=False, data_dir=str(tmp_path))
