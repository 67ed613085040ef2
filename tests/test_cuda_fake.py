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

Two stand-ins make it run without a device, both installed by the ``fake_cuda`` fixture:

* autocast: ``torch.autocast('cuda')`` switches itself off (with a warning) while ``torch.cuda.is_available()`` is
  False and refuses bfloat16 while ``torch.cuda.is_bf16_supported()`` is; both questions are answered as a GPU
  would. The tests check that the logits come out in the autocast dtype.
* backward: PyTorch's autograd engine syncs the streams of every CUDA device a backward touches and needs a CUDA
  context for it ("hasPrimaryContext expects a valid device index"), fake tensors or not. :func:`_backward` walks
  the autograd graph in Python instead, calling every node's own backward (the same derivative formulas, the
  package's autograd Functions) and conforming each gradient to its input's metadata as the engine does (sum to
  the shape, cast to the dtype, same device or fail); ``Tensor.backward`` and ``torch.autograd.grad`` are routed
  to it. ``test_backward_walk_matches_autograd`` checks it against the engine on the CPU.

The fixture also makes the per-head CPU kernels of ``sa_vision.layers.fused`` fail if called: off the CPU the
layers must take the batched path. The host reads that fake tensors cannot answer bound what runs of the loop: the
training step's log line, the evaluation's totals and the float16 loss scaler's inf check (see the tests).
"""
import argparse
import functools
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
import timm
import torch
import torch.nn.functional as F
from helpers import ALL_MODELS, SA_MODELS
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import NativeScaler
from torch import Tensor, nn
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

from sa_vision.layers import PositionalAttention, batched_heads, dense_attention
from sa_vision.layers.fused import _AttendThenProject, _HeadsLinearFunction
from sa_vision.models import SA_MODEL_ARGS, param_groups_pos_lr
from sa_vision.train import loop, runtime
from sa_vision.train.evaluation import evaluate

PRECISIONS = {'float32': None, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def small_model(name: str, **kwargs) -> nn.Module:
    """``name`` built on the CPU and narrow: the attention models two layers deep (the pruned one with its first two
    layers' head counts), ResNet18 with an eighth of its channels: the same kinds of modules as the full model."""
    if name in SA_MODELS:
        kwargs = dict(embed_dim=16, mlp_hidden_dim=32, depth=2, **kwargs)
        if 'heads_per_layer' in SA_MODEL_ARGS[name]:
            kwargs['heads_per_layer'] = tuple(SA_MODEL_ARGS[name]['heads_per_layer'][:2])
    else:
        kwargs = dict(stem_width=8, channels=(8, 16, 32, 64), **kwargs)
    return timm.create_model(name, **kwargs)


# ---- the backward walk: PyTorch's autograd engine needs a CUDA context; this needs none ----

def _topological_order(roots: Sequence) -> List:
    """Every node reachable from ``roots``, each before the nodes it sends gradients to (reverse DFS post-order)."""
    order, seen = [], set(roots)
    for root in roots:
        stack = [(root, iter(root.next_functions))]
        while stack:
            node, edges = stack[-1]
            for child, _ in edges:
                if child is not None and child not in seen:
                    seen.add(child)
                    stack.append((child, iter(child.next_functions)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order[::-1]


def _conform(grad: Tensor, meta) -> Tensor:
    """``grad`` as the engine hands it to a node's input of metadata ``meta``: summed to its shape, in its dtype;
    a gradient on another device is an error, as in the engine (``validate_outputs``)."""
    if grad.device != meta.device:
        raise RuntimeError(f'a gradient on {grad.device} for an input on {meta.device}')
    if tuple(grad.shape) != tuple(meta.shape):
        grad = grad.sum_to_size(meta.shape)
    return grad if grad.dtype == meta.dtype else grad.to(meta.dtype)


def _backward(outputs: Sequence[Tensor], grad_outputs: Sequence[Tensor],
              inputs: Optional[Sequence[Tensor]] = None) -> Optional[tuple]:
    """Backpropagate ``grad_outputs`` from ``outputs`` by calling each node of the autograd graph in turn.

    Without ``inputs`` the leaves' gradients accumulate into ``.grad`` (``Tensor.backward``); with them the
    gradients of ``inputs`` are returned instead (``torch.autograd.grad``). Runs without grad mode, as the engine
    does without ``create_graph``; autograd Functions get zeros for missing gradients (their default). Tensor and
    node hooks are not run (the models register none). The graph is kept (``retain_graph`` in effect).
    """
    pending: Dict = {}

    def add(node, index: int, grad: Tensor) -> None:
        slots = pending.setdefault(node, [None] * len(node._input_metadata))
        slots[index] = grad if slots[index] is None else slots[index] + grad

    roots = []
    for out, grad in zip(outputs, grad_outputs):
        if out.grad_fn is None:
            raise RuntimeError('an output without grad_fn: nothing to backpropagate')
        roots.append(out.grad_fn)
        add(out.grad_fn, out.output_nr, grad)
    wanted = {id(t): i for i, t in enumerate(inputs)} if inputs is not None else None
    captured: Dict[int, Tensor] = {}
    with torch.no_grad():
        for node in _topological_order(roots):
            grads = pending.pop(node, None)
            if grads is None:
                continue
            if type(node).__name__ == 'AccumulateGrad':
                leaf, grad = node.variable, grads[0]
                if wanted is None:
                    leaf.grad = grad if leaf.grad is None else leaf.grad + grad
                elif id(leaf) in wanted:
                    captured[wanted[id(leaf)]] = grad
                continue
            if isinstance(node, torch.autograd.function.BackwardCFunction):
                grads = [torch.zeros(m.shape, dtype=m.dtype, device=m.device) if g is None else g
                         for g, m in zip(grads, node._input_metadata)]
                results = node.apply(*grads)  # the Function's own backward
            else:
                results = node(*grads)  # the node's derivative formula
            results = results if isinstance(results, tuple) else (results,)
            for (child, index), grad in zip(node.next_functions, results):
                if child is not None and grad is not None:
                    add(child, index, _conform(grad, child._input_metadata[index]))
    return tuple(captured.get(i) for i in range(len(inputs))) if inputs is not None else None


def _tensor_backward(self: Tensor, gradient: Optional[Tensor] = None, retain_graph=None, create_graph=False,
                     inputs=None) -> None:
    if create_graph or inputs is not None:
        raise NotImplementedError('the backward walk supports neither create_graph nor inputs')
    _backward((self,), (torch.ones_like(self) if gradient is None else gradient,))


def _autograd_grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None,
                   **kwargs) -> tuple:
    if create_graph:
        raise NotImplementedError('the backward walk does not support create_graph')
    outputs = (outputs,) if isinstance(outputs, Tensor) else tuple(outputs)
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    if grad_outputs is None:
        grad_outputs = tuple(torch.ones_like(out) for out in outputs)
    grad_outputs = (grad_outputs,) if isinstance(grad_outputs, Tensor) else tuple(grad_outputs)
    grads = _backward(outputs, grad_outputs, inputs)
    if not allow_unused and any(g is None for g in grads):
        raise RuntimeError('one of the inputs was not used in the graph (allow_unused=False)')
    return grads


def _use_backward_walk(monkeypatch) -> None:
    monkeypatch.setattr(torch.Tensor, 'backward', _tensor_backward)
    monkeypatch.setattr(torch.autograd, 'grad', _autograd_grad)


# ---- fake CUDA ----

def _cpu_only_kernel(*args, **kwargs):
    raise AssertionError('a per-head CPU kernel of sa_vision.layers.fused ran on CUDA: choose_path must pick '
                         'the batched path off the CPU')


@pytest.fixture
def fake_cuda(monkeypatch) -> FakeTensorMode:
    """A fake tensor mode with CUDA autocast and the backward walk in place; the per-head CPU kernels forbidden."""
    monkeypatch.setattr(torch.cuda.amp.common, 'amp_definitely_not_available', lambda: False)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *args, **kwargs: True)
    _use_backward_walk(monkeypatch)
    monkeypatch.setattr(_AttendThenProject, 'apply', _cpu_only_kernel)
    monkeypatch.setattr(_HeadsLinearFunction, 'apply', _cpu_only_kernel)
    return FakeTensorMode(allow_non_fake_inputs=False)


def to_fake_cuda(model: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """Every parameter and buffer of ``model`` replaced by a fake CUDA tensor of its shape, dtype and layout."""
    with mode:  # outside a fake mode, .to('cuda') initialises CUDA
        return model._apply(lambda t: mode.from_tensor(t).to('cuda'))


def amp_context(precision: str):
    dtype = PRECISIONS[precision]
    return torch.autocast('cuda', dtype=dtype) if dtype is not None else torch.autocast('cuda', enabled=False)


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
            _use_backward_walk(patch)
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
    import sa_vision.layers.attention as attention
    monkeypatch.setattr(attention, 'CUDA_DENSE_MIXING', cuda_dense)
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


class _OneBatch:
    """A loader of one batch that reports two: the loop's log line after the last batch reads the running loss
    to the host (``tolist``), which fake tensors cannot answer, so the epoch must end before it."""

    def __init__(self, batch):
        self.batch = batch

    def __len__(self) -> int:
        return 2

    def __iter__(self):
        yield self.batch


# bfloat16 autocast is what training on CUDA uses unless told otherwise (--amp off: float32, --amp-dtype float16);
# the other two precisions are slow only in sum, and their forward and backward run in the fast tests above
@pytest.mark.parametrize('precision', [pytest.param('float32', marks=pytest.mark.slow), 'bfloat16',
                                       pytest.param('float16', marks=pytest.mark.slow)])
@pytest.mark.parametrize('name', ALL_MODELS)
def test_training_step_on_fake_cuda(fake_cuda, name, precision):
    """One step of the loop's ``train_one_epoch`` on CUDA as ``main`` sets it up there: channels-last for the
    ResNet, the recipe's SGD (foreach) with the positional groups, the cosine schedule per update, gradient
    clipping, and for float16 the loss scaler.

    float32 and bfloat16 run the whole step: batch to the device, forward, loss, backward, clipping, optimizer
    step, schedule, running loss; not the log line (see ``_OneBatch``). float16 stops in ``GradScaler.step``,
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
                              log_interval=100, world_size=1, rank=0)
    dtype = PRECISIONS[precision]
    with fake_cuda:
        optimizer = create_optimizer_v2(
            # foreach=True: torch's own choice for CUDA parameters, which it does not make for fake ones
            model, opt='sgd', lr=0.1, weight_decay=1e-4, momentum=0.9, foreach=True,
            param_group_fn=functools.partial(param_groups_pos_lr, weight_decay=1e-4, pos_lr_scale=3.0))
        scheduler, num_epochs = create_scheduler_v2(optimizer, sched='cosine', num_epochs=2, warmup_epochs=1,
                                                    step_on_epochs=False, updates_per_epoch=2)
        scaler = NativeScaler('cuda') if dtype == torch.float16 else None
        loader = _OneBatch((torch.empty(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)))
        step = functools.partial(loop.train_one_epoch, 0, model, loader, optimizer, nn.CrossEntropyLoss(),
                                 scheduler, args, 0, functools.partial(amp_context, precision), scaler, num_epochs)
        if scaler is None:
            _, num_updates = step()
            assert num_updates == 1
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
