""" The CUDA code paths without a GPU: every model, autocast and the training step on fake CUDA tensors

The CPU stand-in for the ``cuda`` tests: those (marked ``cuda`` or run by the ``device`` fixture of conftest.py) are
skipped without a GPU; these are not marked ``cuda`` and run everywhere. PyTorch's fake tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``) carry a shape, a dtype and a device but no values: the
parameters and the batch are fake ``cuda`` tensors, so every branch on the device takes its CUDA side (the batched
heads of ``choose_path``, no eval cache in ``PositionalAttention.mixing_probs``) and ``torch.autocast('cuda')``
casts as on a GPU; the models are built on the CPU and converted, as ``model.to('cuda')`` would.

What it catches: a tensor created on the CPU inside a CUDA forward or backward (an ``arange`` or ``zeros`` without
``device=``): fake tensor mode raises on any op that mixes a CPU and a CUDA tensor (a 0-dim CPU tensor is allowed,
as on a GPU), and a real (non-fake) tensor reaching an op raises too; a CUDA branch that fails on shapes or
dtypes, under autocast too; a gradient of the wrong device, dtype or shape. What it cannot catch: anything that
needs values or the device itself: the CUDA kernels (fake tensors run meta implementations: whether a kernel exists
for a dtype, cuDNN / cuBLAS algorithm choice), numerics (TF32, bf16 / fp16 rounding, overflow, NaN), memory use,
speed, streams and synchronisation, NCCL and DDP, CUDA graphs, torch.compile on CUDA, and every host read of a
value (``.item()``, ``.tolist()``).

The harness (fake tensors, CUDA autocast and a backward without a CUDA context, the per-head CPU kernels forbidden)
is tests/fake_cuda.py. The host reads that fake tensors cannot answer bound what runs of the loop: the training
step's log line, the evaluation's totals and the float16 loss scaler's inf check (see the tests).
"""
import argparse
import functools
from pathlib import Path
from typing import List

import pytest
import timm
import torch
import torch.nn.functional as F
from fake_cuda import PRECISIONS, amp_context, install_fake_cuda, to_fake_cuda, use_backward_walk
from helpers import ALL_MODELS, SA_MODELS
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import NativeScaler
from torch import Tensor, nn
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

from sa_vision.layers import PositionalAttention, batched_heads, dense_attention, project_first
from sa_vision.models import SA_MODEL_ARGS, param_groups_pos_lr
from sa_vision.train import loop, run_setup, runtime
from sa_vision.train.evaluation import evaluate


def small_model(name: str, **kwargs) -> nn.Module:
    """``name`` built on the CPU and narrow: the attention models two layers deep (the pruned one with its first two
    layers' head counts), ResNet18 with an eighth of its channels: the same kinds of modules as the full model."""
    if name in SA_MODELS:
        kwargs = dict(embed_dim=16, mlp_hidden_dim=32, depth=2, **kwargs)
        if 'heads_per_layer' in SA_MODEL_ARGS[name]:
            kwargs['heads_per_layer'] = tuple(SA_MODEL_ARGS[name]['heads_per_layer'][:2])
    else:
        kwargs = dict(channels=(8, 16, 32, 64), **kwargs)
    return timm.create_model(name, **kwargs)




@pytest.fixture
def fake_cuda(monkeypatch) -> FakeTensorMode:
    """The fake tensor mode of :func:`fake_cuda.install_fake_cuda`, undone after the test."""
    return install_fake_cuda(monkeypatch)


def _assert_on_cuda(tensor: Tensor, what: str) -> None:
    assert tensor.device.type == 'cuda', f'{what} is on {tensor.device}'


@pytest.mark.parametrize('kind', ['forward', 'backward'])
def test_a_cpu_tensor_in_a_cuda_pass_fails(fake_cuda, kind):
    """The defect these tests are for, written on purpose: a tensor made on the CPU inside a CUDA forward (an
    ``arange`` without ``device=``) or a backward that returns its gradient on the CPU must fail the run."""
    class CpuInForward(nn.Linear):
        def forward(self, x):
            return super().forward(x) + torch.arange(self.out_features)

    class CpuGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return torch.ones(grad.shape)  # on the CPU

    layer = to_fake_cuda(CpuInForward(4, 3) if kind == 'forward' else nn.Linear(4, 3), fake_cuda)
    with fake_cuda:
        images = torch.empty(2, 4, device='cuda')
        if kind == 'forward':
            with pytest.raises(RuntimeError, match='same device'):
                layer(images)
        else:
            loss = CpuGradient.apply(layer(images)).sum()
            with pytest.raises(RuntimeError, match='a gradient on cpu for an input on cuda'):
                loss.backward()


@pytest.fixture
def one_thread():
    """One intra-op thread while tiny CPU tensors compute: on a busy machine, OpenMP's threads wait on each other
    for far longer than the arithmetic takes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize('name', ALL_MODELS)
def test_backward_walk_matches_autograd(monkeypatch, one_thread, name):
    """The backward walk gives the gradients of PyTorch's engine (CPU, float64, one graph, dropout on); for the
    attention models on both paths, per head (the package's autograd Functions, the MLP's nested
    ``torch.autograd.grad``) and batched (the separable mixing's Function)."""
    torch.manual_seed(0)
    model = small_model(name, drop_path_rate=0.1).double()
    images = torch.randn(2, 3, 12, 8, dtype=torch.float64)
    targets = torch.tensor([1, 7])
    params = list(model.parameters())
    for batched in ((False, True) if name in SA_MODELS else (False,)):
        with batched_heads(model, batched):
            loss = F.cross_entropy(model(images), targets)
        with monkeypatch.context() as patch:
            use_backward_walk(patch)
            walked = torch.autograd.grad(loss, params)
        reference = torch.autograd.grad(loss, params)
        for (param_name, _), got, expected in zip(model.named_parameters(), walked, reference):
            where = f'{param_name} (batched={batched})'
            torch.testing.assert_close(got, expected, msg=lambda m, where=where: f'{where}: {m}')


@pytest.mark.parametrize('precision', PRECISIONS)
@pytest.mark.parametrize('name', ALL_MODELS)
def test_forward_backward_on_fake_cuda(fake_cuda, name, precision):
    """Training forward (dropout and stochastic depth on), loss and backward of every model on CUDA, eager and
    under CUDA autocast; a non-square batch (the attention's separate row and column path; the training step
    below runs the square one)."""
    model = to_fake_cuda(small_model(name, drop_path_rate=0.1), fake_cuda)
    with fake_cuda:
        images = torch.empty(3, 3, 32, 24, device='cuda')
        targets = torch.zeros(3, dtype=torch.long, device='cuda')
        with amp_context(precision):
            logits = model(images)
            loss = F.cross_entropy(logits, targets)
        loss.backward()
    _assert_on_cuda(logits, 'the logits')
    assert logits.shape == (3, 10)
    assert logits.dtype == (PRECISIONS[precision] or torch.float32), 'autocast did not cast the classifier'
    for param_name, param in model.named_parameters():
        assert param.grad is not None, f'{param_name} got no gradient'
        _assert_on_cuda(param.grad, f'the gradient of {param_name}')
        assert param.grad.dtype == param.dtype and param.grad.shape == param.shape, param_name


@pytest.mark.parametrize('cuda_dense', (False, True), ids=('separable', 'dense'))
def test_cuda_default_mixing_is_the_constant_and_an_override_wins(fake_cuda, monkeypatch, cuda_dense):
    """A separable model on CUDA mixes by the form ``CUDA_DENSE_MIXING`` names, read when it runs, and trains in
    either; ``dense_attention(model, False)`` forces the separable form, as a benchmark of the pair would."""
    import sa_vision.layers.attention_path as attention_path
    monkeypatch.setattr(attention_path, 'CUDA_DENSE_MIXING', cuda_dense)
    forms = []
    probs = PositionalAttention._probs
    monkeypatch.setattr(PositionalAttention, '_probs',
                        lambda self, h, w, dense: (forms.append(dense), probs(self, h, w, dense))[1])
    model = to_fake_cuda(small_model('sa_quadratic_cifar'), fake_cuda)
    with fake_cuda:
        images = torch.empty(2, 3, 16, 16, device='cuda')
        F.cross_entropy(model(images), torch.zeros(2, dtype=torch.long, device='cuda')).backward()
        assert forms and set(forms) == {cuda_dense}
        forms.clear()
        with dense_attention(model, False):
            model(images)
        assert forms and set(forms) == {False}


@pytest.mark.parametrize('size, dense', [(32, True), (34, False)], ids=('16x16-grid', '17x17-grid'))
def test_cuda_mixes_densely_up_to_the_measured_grid_only(fake_cuda, size, dense):
    """CUDA's dense mixing holds (h*w)^2 probabilities a head: measured at 16x16 grids, it is the default up to
    CUDA_DENSE_MAX_TOKENS; a larger grid (larger images) mixes by the separable factors, whose memory grows with
    h*w*(h+w) (at 64x64 images the narrow model's step held 1,473 MiB dense against 43 MiB)."""
    from sa_vision.layers.attention_path import CUDA_DENSE_MAX_TOKENS
    assert CUDA_DENSE_MAX_TOKENS == 16 * 16
    forms = []
    probs = PositionalAttention._probs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PositionalAttention, '_probs',
                      lambda self, h, w, dense: (forms.append(dense), probs(self, h, w, dense))[1])
        model = to_fake_cuda(small_model('sa_quadratic_cifar'), fake_cuda)
        with fake_cuda:
            model(torch.empty(1, 3, size, size, device='cuda'))
    assert forms and set(forms) == {dense}


@pytest.mark.parametrize('kind', ['quadratic', 'learned'])
@pytest.mark.parametrize('grid, dense', [(16, True), (24, False)], ids=('16x16-grid', '24x24-grid'))
def test_mixing_probs_are_what_the_forward_applies_on_cuda(fake_cuda, kind, grid, dense):
    """mixing_probs (the fused kernel's and the device check's inputs) chooses by the grid it is asked for, as the
    forward does: not by the shape of the parameter it reads the device and dtype from."""
    from sa_vision.layers import PositionalAttention as Attention
    layer = to_fake_cuda(Attention(16, 4, kind, grid_major=True).eval(), fake_cuda)
    with fake_cuda:
        probs = layer.mixing_probs(grid, grid)
    assert len(probs) == (1 if dense else 2), [tuple(p.shape) for p in probs]


@pytest.mark.parametrize('cuda_project_first', (False, True), ids=('off', 'on'))
def test_cuda_dense_path_projects_first_by_the_constant_and_an_override_wins(fake_cuda, monkeypatch,
                                                                           cuda_project_first):
    """On CUDA the dense path projects first (``project_then_mix``) when ``CUDA_PROJECT_FIRST`` says so, read when
    it runs, and trains so; ``project_first(model, not constant)`` forces the other way, as a benchmark would."""
    import sa_vision.layers.attention as attention
    import sa_vision.layers.attention_path as attention_path
    monkeypatch.setattr(attention_path, 'CUDA_PROJECT_FIRST', cuda_project_first)
    calls = []
    project_then_mix = attention.project_then_mix
    monkeypatch.setattr(attention, 'project_then_mix', lambda *args: (calls.append(1), project_then_mix(*args))[1])
    model = to_fake_cuda(small_model('sa_quadratic_cifar'), fake_cuda)
    with fake_cuda, dense_attention(model):
        images = torch.empty(2, 3, 16, 16, device='cuda')
        F.cross_entropy(model(images), torch.zeros(2, dtype=torch.long, device='cuda')).backward()
        assert len(calls) == (2 if cuda_project_first else 0)  # one per layer
        calls.clear()
        with project_first(model, not cuda_project_first):
            model(images)
        assert len(calls) == (0 if cuda_project_first else 2)
        with dense_attention(model, False):
            model(images)  # separable: never projected first
        assert len(calls) == (0 if cuda_project_first else 2)


def _attention_layers(model: nn.Module) -> List[PositionalAttention]:
    return [m for m in model.modules() if isinstance(m, PositionalAttention)]


@pytest.mark.parametrize('precision', ['float32', 'bfloat16'])
@pytest.mark.parametrize('name', ALL_MODELS)
def test_evaluation_on_fake_cuda(fake_cuda, name, precision):
    """The loop's evaluation on CUDA runs up to its one host read (the totals' ``tolist``, which needs values);
    the attention layers cache no probabilities off the CPU. Then the attention models' inference fusion."""
    model = to_fake_cuda(small_model(name), fake_cuda)
    with fake_cuda:
        batch = (torch.empty(4, 3, 32, 32), torch.zeros(4, dtype=torch.long))  # on the CPU, as a loader gives them
        with pytest.raises(DataDependentOutputException) as failure:
            evaluate(model, [batch], 'cuda', amp_ctx=functools.partial(amp_context, precision))
        last_line = [entry for entry in failure.traceback if Path(str(entry.path)).name == 'evaluation.py'][-1]
        assert '.tolist()' in str(last_line.statement), f'stopped before the host read: {last_line.statement}'
        assert all(layer._probs_cache == {} for layer in _attention_layers(model)), 'probabilities cached on CUDA'
        if name in SA_MODELS:
            with torch.no_grad(), amp_context(precision):
                logits = model.fuse()(torch.empty(2, 3, 32, 32, device='cuda'))
            _assert_on_cuda(logits, 'the fused model\'s logits')


class _AtTheLogLine(Exception):
    """Where the loop reads the running loss to the host for its log line (``host_sync_allowed``), which fake
    tensors cannot answer (the first step logs, as timm's train.py): the step before it ran whole."""


def _stop_at_the_log_line():
    raise _AtTheLogLine


# bfloat16 autocast is what training on CUDA uses unless told otherwise (--amp off: float32, --amp-dtype float16);
# the other two precisions are slow only in sum, and their forward and backward run in the fast tests above
@pytest.mark.parametrize('precision', [pytest.param('float32', marks=pytest.mark.slow), 'bfloat16',
                                       pytest.param('float16', marks=pytest.mark.slow)])
@pytest.mark.parametrize('name', ALL_MODELS)
def test_training_step_on_fake_cuda(fake_cuda, name, precision, monkeypatch):
    """One step of the loop's ``train_one_epoch`` on CUDA as ``main`` sets it up there: channels-last for the
    ResNet, the recipe's SGD (foreach) with the positional groups, the cosine schedule per update, gradient
    clipping, and for float16 the loss scaler.

    float32 and bfloat16 run the whole step: batch to the device, forward, loss, backward, clipping, optimizer
    step, schedule, running loss; not the log line (:class:`_AtTheLogLine`). float16 stops in ``GradScaler.step``,
    which reads whether the unscaled gradients hold an inf (``.item()``) before it steps: covered are the scaled
    loss, backward, ``unscale_`` and clipping, not the optimizer step and the scale update.
    """
    model = small_model(name, drop_path_rate=0.1)
    channels_last = runtime.uses_channels_last(model, 'cuda')
    assert channels_last == (name not in SA_MODELS)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model = to_fake_cuda(model, fake_cuda)
    args = argparse.Namespace(device='cuda', channels_last=channels_last, clip_grad=1.0, clip_mode='norm',
                              log_interval=100, world_size=1, rank=0, distributed=False)
    dtype = PRECISIONS[precision]
    with fake_cuda:
        optimizer = create_optimizer_v2(
            # foreach=True: torch's own choice for CUDA parameters, which it does not make for fake ones
            model, opt='sgd', lr=0.1, weight_decay=1e-4, momentum=0.9, foreach=True,
            param_group_fn=functools.partial(param_groups_pos_lr, weight_decay=1e-4, pos_lr_scale=3.0))
        scheduler, num_epochs = create_scheduler_v2(optimizer, sched='cosine', num_epochs=2, warmup_epochs=1,
                                                    step_on_epochs=False, updates_per_epoch=2)
        scaler = NativeScaler('cuda') if dtype == torch.float16 else None
        loader = [(torch.empty(4, 3, 32, 32), torch.zeros(4, dtype=torch.long))]
        monkeypatch.setattr(loop, 'host_sync_allowed', _stop_at_the_log_line)
        step = functools.partial(loop.train_one_epoch, 0, model, loader, optimizer, nn.CrossEntropyLoss(),
                                 scheduler, args, 0, functools.partial(amp_context, precision), scaler, num_epochs)
        if scaler is None:
            with pytest.raises(_AtTheLogLine):
                step()
        else:
            with pytest.raises(DataDependentOutputException) as failure:
                step()
            in_scaler = [entry for entry in failure.traceback if Path(str(entry.path)).name == 'grad_scaler.py']
            assert in_scaler and '.item()' in str(in_scaler[-1].statement), 'stopped before the scaler\'s inf check'
            assert [found.device.type for found in
                    scaler._scaler._per_optimizer_states[id(optimizer)]['found_inf_per_device'].values()] == ['cuda']
    for param_name, param in model.named_parameters():
        assert param.grad is not None, f'{param_name} got no gradient'
        _assert_on_cuda(param.grad, f'the gradient of {param_name}')
        if scaler is None:
            _assert_on_cuda(optimizer.state[param]['momentum_buffer'], f'the momentum of {param_name}')


@pytest.mark.parametrize('amp_dtype', ['bfloat16', 'float16'])
def test_the_loops_precision_casts_on_cuda(fake_cuda, amp_dtype):
    """What ``main`` trains and evaluates under for ``--device cuda`` (the loop's own ``run_setup.precision``, not this
    module's ``amp_context``): CUDA autocast in the asked dtype, the loss scaler with float16 only."""
    model = to_fake_cuda(small_model('sa_quadratic_cifar'), fake_cuda)
    args = argparse.Namespace(amp=None, amp_dtype=amp_dtype, device='cuda', batch_size=4, rank=0, world_size=1,
                              distributed=False)
    amp_ctx, scaler = run_setup.precision(model, args)
    assert args.amp_used == amp_dtype
    assert (scaler is not None) == (amp_dtype == 'float16')
    with fake_cuda:
        with amp_ctx():
            assert torch.is_autocast_enabled('cuda'), 'the training autocast is not CUDA\'s'
            assert torch.get_autocast_dtype('cuda') == getattr(torch, amp_dtype)
            logits = model(torch.empty(2, 3, 32, 32, device='cuda'))
    assert logits.dtype == getattr(torch, amp_dtype), 'the loop\'s autocast did not cast the CUDA model'


_SCORE_METHODS = ('grid_scores', 'axis_scores', 'square_axis_scores')


@pytest.mark.parametrize('name', SA_MODELS)
def test_positional_scores_and_softmax_leave_cuda_autocast(fake_cuda, monkeypatch, name):
    """Under CUDA autocast the positional scores and their softmax run with CUDA's autocast off and come out in
    float32: in bfloat16 the far shifts' squared differences lose whole units (docs/attention.md). Recorded inside
    the score methods, which the softmax follows in the same autocast-off block."""
    model = to_fake_cuda(small_model(name), fake_cuda)
    calls = []

    def recording(method):
        @functools.wraps(method)
        def scores(self, *args, **kwargs):
            out = method(self, *args, **kwargs)
            for tensor in out if isinstance(out, tuple) else (out,):
                calls.append((type(self).__name__, method.__name__, torch.is_autocast_enabled('cuda'), tensor.dtype))
            return out
        return scores
    for cls in {type(layer.position) for layer in _attention_layers(model)}:
        for method in _SCORE_METHODS:
            monkeypatch.setattr(cls, method, recording(getattr(cls, method)))
    with fake_cuda:
        for precision in ('bfloat16', 'float16'):
            for training in (True, False):  # the batched training path, and evaluation without gradients
                model.train(training)
                with torch.set_grad_enabled(training), amp_context(precision):
                    assert torch.is_autocast_enabled('cuda')
                    model(torch.empty(2, 3, 32, 24, device='cuda'))
                    model(torch.empty(2, 3, 32, 32, device='cuda'))  # the square grid's one stacked softmax
    assert calls, 'no positional scores were computed'
    wrong = sorted({call for call in calls if call[2] or call[3] != torch.float32})
    assert not wrong, f'positional scores under CUDA autocast (class, method, autocast on, dtype): {wrong}'
