""" Fake CUDA on the CPU: fake ``cuda`` tensors, CUDA autocast, and a backward that needs no CUDA context

The harness of tests/test_cuda_fake.py (what it catches and what it cannot is said there). PyTorch's fake tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``) carry a shape, a dtype and a device but no values.

Two stand-ins make it run without a device, both installed by :func:`install_fake_cuda`:

* autocast: ``torch.autocast('cuda')`` switches itself off (with a warning) while ``torch.cuda.is_available()`` is
  False and refuses bfloat16 while ``torch.cuda.is_bf16_supported()`` is; both questions are answered as a GPU
  would.
* backward: PyTorch's autograd engine syncs the streams of every CUDA device a backward touches and needs a CUDA
  context for it ("hasPrimaryContext expects a valid device index"), fake tensors or not. :func:`_backward` walks
  the autograd graph in Python instead, calling every node's own backward (the same derivative formulas, the
  package's autograd Functions) and conforming each gradient to its input's metadata as the engine does (sum to
  the shape, cast to the dtype, same device or fail); ``Tensor.backward`` and ``torch.autograd.grad`` are routed
  to it. ``test_backward_walk_matches_autograd`` (tests/test_cuda_fake.py) checks it against the engine on the CPU.

It also makes the per-head CPU kernels of ``sa_vision.layers.attention_autograd`` fail if called: off the CPU the
layers must take the batched path.
"""
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode

from sa_vision.layers.attention_autograd import _AttendThenProject, _HeadsLinearFunction

__all__ = ['PRECISIONS', 'install_fake_cuda', 'to_fake_cuda', 'amp_context', 'use_backward_walk']

PRECISIONS = {'float32': None, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


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


def use_backward_walk(monkeypatch) -> None:
    """Route ``Tensor.backward`` and ``torch.autograd.grad`` to :func:`_backward`."""
    monkeypatch.setattr(torch.Tensor, 'backward', _tensor_backward)
    monkeypatch.setattr(torch.autograd, 'grad', _autograd_grad)


# ---- fake CUDA ----

def _cpu_only_kernel(*args, **kwargs):
    raise AssertionError('a per-head CPU kernel of sa_vision.layers.attention_autograd ran on CUDA: choose_path '
                         'must pick the batched path off the CPU')


def install_fake_cuda(monkeypatch) -> FakeTensorMode:
    """A fake tensor mode with CUDA autocast and the backward walk in place; the per-head CPU kernels forbidden
    (what the ``fake_cuda`` fixture of the tests returns)."""
    monkeypatch.setattr(torch.cuda.amp.common, 'amp_definitely_not_available', lambda: False)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *args, **kwargs: True)
    use_backward_walk(monkeypatch)
    monkeypatch.setattr(_AttendThenProject, 'apply', _cpu_only_kernel)
    monkeypatch.setattr(_HeadsLinearFunction, 'apply', _cpu_only_kernel)
    return FakeTensorMode(allow_non_fake_inputs=False)


def to_fake_cuda(model: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """Every parameter and buffer of ``model`` replaced by a fake CUDA tensor of its shape, dtype and layout."""
    with mode:  # outside a fake mode, .to('cuda') initialises CUDA
        return model._apply(lambda t: mode.from_tensor(t).to('cuda'))


def amp_context(precision: str):
    """CUDA autocast in ``precision`` (a key of :data:`PRECISIONS`; float32: autocast off)."""
    dtype = PRECISIONS[precision]
    return torch.autocast('cuda', dtype=dtype) if dtype is not None else torch.autocast('cuda', enabled=False)

