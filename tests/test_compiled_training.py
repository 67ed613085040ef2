""" Compiled training: sa-vision-train compiles once and evaluates through the same compiled module, and timm's own
train.py trains our models compiled (through sa_vision.train.run_timm) """
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT_S
from test_timm_train_args import timm_train_script

pytest.importorskip('sklearn')

from sa_vision.train import (
    evaluation,  # noqa: E402
    run_setup,  # noqa: E402
)
from sa_vision.train import loop as training  # noqa: E402
from sa_vision.train.recipes import RECIPE_DIR  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DIGITS_RECIPE = RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml'
TINY = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=16']


def test_padded_evaluation_counts_only_the_real_rows():
    """With pad_last_batch the model sees full batches only, and the metrics are those of the real images: the
    same as a plain evaluation and, for top-1, a count written here."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    seen = []

    def model(x):
        seen.append(x.shape[0])
        return linear(x)
    model.eval = lambda: None
    loader = [(torch.randn(n, 4), torch.randint(0, 3, (n,))) for n in (4, 4, 2)]
    padded = evaluation.evaluate(model, loader, 'cpu', pad_last_batch=True)
    assert seen == [4, 4, 4]
    plain = evaluation.evaluate(linear, loader, 'cpu')
    assert padded == pytest.approx(plain) and padded['num_images'] == 10
    hits = sum(int((linear(x).argmax(-1) == y).sum()) for x, y in loader)
    assert padded['top1'] == pytest.approx(100. * hits / 10)


@pytest.mark.slow
def test_compiled_run_compiles_in_the_first_epoch_only(monkeypatch, tmp_path):
    """Two epochs, each with an evaluation whose last batch is short (360 test digits in batches of 64, as training's
    1,437 with the short batch dropped): every graph is compiled in the first epoch, one for training and one for
    evaluation (its short batch padded: else a second, dynamic-shape one), none in the second, and evaluation runs
    through the compiled module."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    graphs_after_epoch, evaluated = [], []

    plain_evaluate = evaluation.evaluate

    def counting_evaluate(model, *args, **kwargs):
        evaluated.append(model)
        metrics = plain_evaluate(model, *args, **kwargs)
        graphs_after_epoch.append(counters['stats']['unique_graphs'])
        return metrics
    monkeypatch.setattr(evaluation, 'evaluate', counting_evaluate)
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 2, '-b', 64, '-vb', 64,
                                 '--torchcompile', 'inductor', '--output', tmp_path, '--experiment', 'compiled'])))
    assert all(isinstance(m, torch._dynamo.eval_frame.OptimizedModule) for m in evaluated)
    # the model traces whole: one graph per mode (training with autograd, evaluation without)
    assert graphs_after_epoch[0] == 2, f'graphs compiled in the first epoch: {graphs_after_epoch[0]} (expected 2)'
    assert graphs_after_epoch[1] == graphs_after_epoch[0], (
        f'the second epoch compiled {graphs_after_epoch[1] - graphs_after_epoch[0]} new graph(s)')


class _NotFiniteFirstRow(torch.nn.Module):
    """Stands for a compiled module whose evaluation is at fault: ``model``'s logits with one not finite."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        logits = self.model(x).clone()
        logits[0, 0] = float('nan')
        return logits


def test_a_compiled_evaluation_not_finite_gives_way_to_the_model_itself():
    """Independent reference: the plain evaluation of the same weights, and the warning naming both."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    loader = [(torch.randn(n, 4), torch.randint(0, 3, (n,))) for n in (4, 4, 2)]
    plain = evaluation.evaluate(linear, loader, 'cpu')
    lines = []
    metrics, through = evaluation.evaluate_compiled(_NotFiniteFirstRow(linear), linear, loader, 'cpu', lines.append)
    assert through is linear and metrics == pytest.approx(plain)
    assert len(lines) == 1 and 'loss nan' in lines[0] and f'loss {plain["loss"]:.4f}' in lines[0], lines
    # a finite compiled evaluation stays; one the model itself cannot evaluate finitely (the training diverged) too
    compiled = torch.nn.Sequential(linear)
    assert evaluation.evaluate_compiled(compiled, linear, loader, 'cpu', lines.append)[1] is compiled
    with torch.no_grad():
        linear.weight.fill_(float('nan'))
    faulty = _NotFiniteFirstRow(linear)
    metrics, through = evaluation.evaluate_compiled(faulty, linear, loader, 'cpu', lines.append)
    assert through is faulty and metrics['loss'] != metrics['loss'] and len(lines) == 1


def test_evaluation_on_cuda_runs_uncompiled_and_says_why():
    """On CUDA the loop evaluates through the model itself (its compiled evaluation was wrong on two GPUs); on the
    CPU, and where nothing was compiled, through the training's module, with no reason to give."""
    model = torch.nn.Linear(4, 3)
    compiled = torch.nn.Sequential(model)
    through, why = evaluation.evaluation_module(model, compiled, 'cuda')
    assert through is model and 'uncompiled on CUDA' in why
    assert evaluation.evaluation_module(model, compiled, torch.device('cuda', 0))[0] is model
    assert evaluation.evaluation_module(model, compiled, 'cpu') == (compiled, None)
    assert evaluation.evaluation_module(model, model, 'cuda') == (model, None)


def test_the_loop_evaluates_through_what_evaluation_module_chooses(monkeypatch, tmp_path, caplog):
    """The loop's evaluation goes through evaluation_module's choice, and its reason reaches the log and
    args.yaml: the choice is forced here (a CPU run would keep the compiled module)."""
    import logging
    chosen = []

    def choose(model, compiled, device):
        chosen.append(_NotFiniteFirstRow(model))
        return chosen[-1], 'evaluation runs through the stand-in'
    monkeypatch.setattr(run_setup, 'evaluation_module', choose)
    caplog.set_level(logging.INFO)
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 1, '-b', 64, '-vb', 64, '--output', tmp_path,
                                 '--experiment', 'chosen'])))
    assert chosen[0].calls == 6  # 360 test digits in batches of 64
    assert any('Compilation: evaluation runs through the stand-in' in r.message for r in caplog.records)
    assert 'evaluation runs through the stand-in' in (tmp_path / 'chosen' / 'args.yaml').read_text()


def test_training_evaluates_uncompiled_after_a_compiled_evaluation_not_finite(monkeypatch, tmp_path, caplog):
    """The loop keeps the module evaluate_compiled returns: the faulty one evaluates the first epoch only, and every
    epoch's metrics, the best checkpoint's among them, are finite."""
    import logging
    made, training_model = [], training.training_model

    def faulty_eval_model(model, *args, **kwargs):
        trained_through, _ = training_model(model, *args, **kwargs)
        made.append(_NotFiniteFirstRow(model))
        return trained_through, made[-1]
    monkeypatch.setattr(training, 'training_model', faulty_eval_model)
    caplog.set_level(logging.INFO)
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 2, '-b', 64, '-vb', 64, '--output', tmp_path,
                                 '--experiment', 'faulty'])))
    assert made[0].calls == 6  # 360 test digits in batches of 64: the first epoch's evaluation only
    assert sum('a fault of the compiled evaluation' in r.message for r in caplog.records) == 1
    ckpt = torch.load(tmp_path / 'faulty' / 'model_best.pth.tar', map_location='cpu', weights_only=True)
    assert all(h['eval_loss'] == h['eval_loss'] for h in ckpt['history']), ckpt['history']


def _write_image_folder(root, per_class):
    """An ImageFolder of 32x32 noise PNGs, two classes, ``per_class`` = {split: images per class}."""
    from PIL import Image
    gen = torch.Generator().manual_seed(0)
    for split, count in per_class.items():
        for label in ('a', 'b'):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=gen)
                Image.fromarray(pixels.numpy()).save(folder / f'{i}.png')


@pytest.mark.slow
def test_timm_train_py_trains_our_model_compiled(tmp_path):
    """timm's own train.py (a checkout's, through run_timm) trains a tiny SA model with --torchcompile
    --torchcompile-mode reduce-overhead and bf16 autocast on the CPU (where reduce-overhead compiles without CUDA
    graphs) and writes its checkpoint, whose weights load into our model."""
    import timm
    script = timm_train_script()
    if script is None:
        pytest.skip('no timm train.py: set SA_VISION_TIMM_CHECKOUT to a pytorch-image-models checkout (pip ships no '
                    'train.py)')
    _write_image_folder(tmp_path / 'data', {'train': 8, 'validation': 4})
    kwargs = {'embed_dim': 16, 'depth': 1, 'heads_per_layer': 2, 'mlp_hidden_dim': 16}
    proc = subprocess.run(
        [sys.executable, '-m', 'sa_vision.train.run_timm', str(script), '--data-dir', str(tmp_path / 'data'),
         '--model', 'sa_quadratic_cifar', '--model-kwargs', *(f'{k}={v}' for k, v in kwargs.items()),
         '--num-classes', '2', '-b', '4', '--epochs', '1',
         '--device', 'cpu', '--torchcompile', '--torchcompile-mode', 'reduce-overhead', '--amp', '--amp-dtype',
         'bfloat16', '--workers', '0', '--output', str(tmp_path / 'out'), '--experiment', 'compiled'],
        cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=HANG_TIMEOUT_S)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert 'Compiling task components with backend=inductor, mode=reduce-overhead' in log, log[-3000:]
    ckpt = torch.load(tmp_path / 'out' / 'compiled' / 'last.pth.tar', map_location='cpu', weights_only=False)
    model = timm.create_model('sa_quadratic_cifar', num_classes=2, **kwargs)
    model.load_state_dict(ckpt['state_dict'])  # plain weights: no '_orig_mod.' prefixes of the compiled module


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize('compile_args', [
    [], ['--torchcompile', 'inductor'], ['--torchcompile', 'inductor', '--torchcompile-mode', 'reduce-overhead']],
    ids=['eager', 'inductor', 'cuda-graphs'])
def test_cuda_steps_and_evaluation_never_wait_for_the_host(monkeypatch, tmp_path, compile_args):
    """The second epoch, its graphs compiled and CUDA graphs recorded in the first, trains and evaluates with CUDA's
    sync debug mode at 'error': no forward, backward or optimizer step waits for the host. The log lines and the
    metrics read the device on purpose, inside host_sync_allowed."""
    checked = []

    def strict(fn, name):
        def run(*args, **kwargs):
            calls = sum(1 for n in checked if n.startswith(name))
            if calls == 0:  # the first epoch compiles and records, which synchronizes
                checked.append(f'{name} (not checked)')
                return fn(*args, **kwargs)
            torch.cuda.set_sync_debug_mode('error')
            try:
                result = fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            checked.append(name)
            return result
        return run
    monkeypatch.setattr(training, 'train_one_epoch', strict(training.train_one_epoch, 'train'))
    monkeypatch.setattr(evaluation, 'evaluate', strict(evaluation.evaluate, 'evaluate'))  # evaluate_compiled's
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 2, '-b', 64, '-vb', 64, '--device', 'cuda',
                                 *compile_args, '--output', tmp_path, '--experiment', 'strict'])))
    assert checked[-2:] == ['train', 'evaluate']
