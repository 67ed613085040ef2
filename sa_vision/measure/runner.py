""" What the benchmark times: a variant (a model, the context around its steps, how it compiles) and the runner of its
training step (forward, backward, SGD step) and inference
"""
import collections
import contextlib
import dataclasses
import functools
import time
from typing import Any, Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError
from ..train.compile_choice import CUDA_GRAPH_MODES
from ..train.runtime import synchronize
from .macs import _as_input_size
from .memory import _peak_memory, _tensor_bytes

__all__ = ['DTYPES', 'StepRunner', 'Variant', 'backward_tracing_problem']

DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}


@dataclasses.dataclass
class Variant:
    """One thing to time: a model (and a context active around its steps, e.g. the dense switch)."""
    name: str
    model: nn.Module
    context: Callable[[], Any] = contextlib.nullcontext
    infer_model: Optional[nn.Module] = None  # e.g. a fused copy for inference
    switch: Optional[str] = None  # the attention switch (dense, batched, fused) the context turns on
    # inductor settings its compile uses (torch.compile's ``options``). A setting patched around the steps instead
    # would not be seen: a copy of a compiled model reuses the first copy's graphs, since dynamo's cache is keyed
    # by the code and the backend's options, not by torch._inductor.config
    compile_options: Optional[Dict[str, Any]] = None
    # compiled, the training step is compiled whole (forward, loss, backward, the SGD step), not the model alone:
    # dynamo then traces the backward into the forward's graph (torch._dynamo.config.trace_autograd_ops), so the
    # gradients' accumulation runs in the graph instead of as one host dispatch per parameter
    whole_step: bool = False
    fused_optimizer: bool = False  # its SGD step fused (one launch), as sa-vision-train's AdamW on CUDA
    # compiled, the backward runs through compiled autograd: the autograd graph, the gradients' accumulation
    # included, traced and compiled like the model, while the optimizer step stays outside as the trainer runs it
    compiled_autograd: bool = False


def _to_channels_last(model: nn.Module) -> None:
    """Channels-last 4-D parameters and buffers (``Module.to(memory_format=)`` refuses the paper formulation's
    5-D buffer)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.dim() == 4:
                t.data = t.data.contiguous(memory_format=torch.channels_last)


@functools.lru_cache(maxsize=None)
def backward_tracing_problem(trace_autograd_ops: bool = True) -> Optional[str]:
    """Why this torch's dynamo cannot trace ``loss.backward()`` into a compiled function's graph, or None: tried on
    a Linear of two weights in about a second, where a whole-step runner would compile a model for minutes (on a
    GPU, of a lent machine's few) to find a graph break there. ``trace_autograd_ops=False`` tries it as a dynamo
    without the tracing runs."""
    if not hasattr(torch._dynamo.config, 'trace_autograd_ops'):
        return f'torch {torch.__version__} has no torch._dynamo.config.trace_autograd_ops'
    from torch._dynamo.utils import counters
    with torch.random.fork_rng(devices=[]):  # the caller's random stream stays as it was
        layer = nn.Linear(2, 1)

    def step(x: torch.Tensor) -> None:
        layer(x).sum().backward()
    seen = {name: collections.Counter(counter) for name, counter in counters.items()}
    try:
        with torch._dynamo.config.patch(trace_autograd_ops=trace_autograd_ops):
            torch.compile(step, backend='eager', fullgraph=True)(torch.ones(1, 2))
    except Exception as e:  # noqa: BLE001  dynamo's Unsupported and its kin: the reason is what is reported
        return f'torch {torch.__version__}: {type(e).__name__}: {(str(e).strip().splitlines() or [""])[0][:200]}'
    finally:  # its graph is not one of the runs whose graphs and breaks the callers count
        counters.clear()
        counters.update(seen)
    return None


def _compile_how(mode: Optional[str], options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """torch.compile's ``mode`` or, with inductor ``options``, the mode's own options with them (torch.compile
    refuses both at once)."""
    if not options:
        return {'mode': mode}
    from torch._inductor import list_mode_options
    return {'options': {**list_mode_options(mode or 'default'), **options}}


class StepRunner:
    """Training step (forward, backward, SGD step) and inference for one variant."""

    def __init__(
            self, variant: Variant, batch_size: int, input_size, device: torch.device,
            precision: str = 'float32', amp: bool = False, amp_dtype: str = 'bfloat16',
            channels_last: bool = False, torchcompile: Optional[str] = None, lr: float = 1e-4,
            num_classes: Optional[int] = None, torchcompile_mode: Optional[str] = None,
    ):
        self.variant, self.device, self.batch_size = variant, device, batch_size
        self.torchcompile = torchcompile
        # CUDA graphs replay into the same output buffers: each step starts a new generation (torch.compile docs)
        self.cudagraphs = bool(torchcompile) and torchcompile_mode in CUDA_GRAPH_MODES
        dtype = DTYPES[precision]
        self.amp = amp
        self.amp_dtype = DTYPES[amp_dtype]
        mf = torch.channels_last if channels_last else torch.contiguous_format
        self.train_model = variant.model.to(device=device, dtype=dtype)
        self.infer_model = (variant.infer_model or variant.model).to(device=device, dtype=dtype)
        if channels_last:
            _to_channels_last(self.train_model)
            _to_channels_last(self.infer_model)
        c, h, w = _as_input_size(input_size)
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(batch_size, c, h, w, generator=gen).to(device=device, dtype=dtype).contiguous(
            memory_format=mf)
        if num_classes is None:  # timm's models say it (resnet's classifier is fc, not head)
            head = getattr(variant.model, 'head', None)
            num_classes = getattr(variant.model, 'num_classes', None) or (
                head.out_features if isinstance(head, nn.Linear) else 10)
        self.target = torch.randint(0, num_classes, (batch_size,), generator=gen).to(device)
        self.optimizer = torch.optim.SGD(self.train_model.parameters(), lr=lr, momentum=0.9,
                                         **({'fused': True} if variant.fused_optimizer else {}))
        self._prime_optimizer()
        self.train_fn = self.train_model
        self.infer_fn = self.infer_model
        self.step_fn = None
        self.backward_context: Callable[[], Any] = contextlib.nullcontext
        if torchcompile:
            how = _compile_how(torchcompile_mode, variant.compile_options)
            self.train_fn = torch.compile(self.train_model, backend=torchcompile, **how)
            self.infer_fn = torch.compile(self.infer_model, backend=torchcompile, **how)
            if variant.whole_step:
                problem = backward_tracing_problem()
                if problem:
                    raise UserError(f'{variant.name}: compiling the whole training step needs a torch whose dynamo '
                                    f'traces the backward into the graph: {problem}')
                self.step_fn = torch.compile(self._whole_step, backend=torchcompile, **how)
            if variant.compiled_autograd:
                # torch's documented switch (dynamo's compiled_autograd config) covers a backward inside a compiled
                # function only; this one follows the compiled model, as in timm's train.py
                enable = getattr(getattr(torch._dynamo, 'compiled_autograd', None), '_enable', None)
                if enable is None:
                    raise UserError(f'{variant.name}: compiled autograd needs torch._dynamo.compiled_autograd; this '
                                    f'is torch {torch.__version__}')
                self.backward_context = functools.partial(enable, torch.compile(backend=torchcompile, **how))

    def _prime_optimizer(self) -> None:
        """Create the momentum buffers with a zero-gradient step (weights unchanged), so that the state belongs to
        the baseline, not to the first measured step."""
        params = [p for p in self.train_model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.zeros_like(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _autocast(self):
        if self.amp:
            return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)
        return contextlib.nullcontext()

    def _whole_step(self, x: torch.Tensor, target: torch.Tensor) -> None:
        # train_step's update written out again, not shared: called from here, a helper holding optimizer.step()
        # would put torch.optim's graph breaks in a nested frame, where dynamo breaks this whole frame once more
        with self._autocast():
            loss = F.cross_entropy(self.train_model(x), target)
        loss.backward()
        self.optimizer.step()
        for p in self.train_model.parameters():  # zero_grad(set_to_none=True), which dynamo does not trace
            p.grad = None

    def train_step(self) -> None:
        self.train_model.train()
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        if self.step_fn is not None:
            with self.variant.context(), torch._dynamo.config.patch(trace_autograd_ops=True):
                self.step_fn(self.x, self.target)
            return
        with self.variant.context():
            self.optimizer.zero_grad(set_to_none=True)
            with self._autocast():
                loss = F.cross_entropy(self.train_fn(self.x), self.target)
            with self.backward_context():
                loss.backward()
            self.optimizer.step()

    def infer_step(self) -> None:
        self.infer_model.eval()
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with self.variant.context(), torch.no_grad(), self._autocast():
            self.infer_fn(self.x)

    def time(self, fn: Callable[[], None], iters: int) -> float:
        synchronize(self.device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        synchronize(self.device)
        return self.batch_size * iters / (time.perf_counter() - t0)

    def peak(self, fn: Callable[[], None]) -> int:
        # the previous step's gradients go first, so CUDA's and the CPU tracker's peaks both count each step's own
        self.optimizer.zero_grad(set_to_none=True)
        with _peak_memory(self.device) as r:
            fn()
        return int(r['peak'])

    def baseline_bytes(self) -> int:
        state = [t for s in self.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return _tensor_bytes(list(self.train_model.parameters()) + list(self.train_model.buffers()) + state)
