"""A lead for the narrow model's host-bound GPU step (docs/performance.md, "Where the narrow step goes"): the whole
training step compiled, its backward traced into the same graph as the forward, against today's compiled model.

On an H100 the narrow step with CUDA graphs took 4.69 ms, the GPU busy 54 % of it; of its host time the
gradients' accumulation into 88 parameters took 0.87 ms a step, the optimizer step 0.73 ms and the loss 0.35 ms,
all outside the compiled model. torch's dynamo can trace ``loss.backward()`` itself (``torch._dynamo.config
.trace_autograd_ops``; pytorch/pytorch#169415 rewrites it as ``autograd.grad`` plus ``accumulate_grad_`` in the
graph), so the loss, the backward and the accumulation can join the forward's graph; the optimizer step stays out
of it (``Optimizer.step`` breaks the graph before and after, on purpose: torch/optim/optimizer.py; ``foreach`` makes
a second graph, ``fused`` runs as it is).

On the CPU, with the ``aot_eager`` backend (no inductor; the counts are the same, the times are not the point),
the cpu profile's narrow ``sa_quadratic_cifar`` without dropout, float32, batch 32, torch's AdamW:

* ``model compiled``: what sa-vision-train does today: the model compiled, the loss, backward and step eager;
* ``step compiled``: one compiled function doing forward, loss, backward, step and ``grad = None``.

For each: the ATen operations per step outside any compiled region (each a dispatch on the host, most a kernel
launch on a GPU; counted as docs/probes/cpu/loop_host_work.py counts them), the graphs and graph breaks dynamo made,
and the largest difference of the parameters from an eager run of the same steps (the same numbers, or not); first
with AdamW ``foreach`` and a constant learning rate, then with the learning rate changed every step, as timm's
per-update schedules change it, held as a tensor that the loop changes in place (AdamW ``fused``; on CUDA
``foreach`` with ``capturable=True`` takes one too). As a
Python float in ``param_groups``, as timm's schedulers write it, each new value is a constant to dynamo: on this
CPU (torch 2.14.1, 2026-11-26) the compiled step then recompiled and its memory grew by about 1 GB every 3 s, past
8 GB within a minute, when it was stopped; that case is not run here.

    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/probes/cpu/whole_step_compile.py   # -> whole_step_compile_<date>.log
"""
import sys
import time
from pathlib import Path

import timm
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

import sa_vision  # noqa: F401  registers the models

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loop_host_work beside this file
from loop_host_work import count, show  # noqa: E402

# the cpu profile's narrow model, without dropout so that eager and compiled runs draw nothing and compare exactly
MODEL_KWARGS = dict(embed_dim=64, mlp_hidden_dim=128, num_classes=10, attn_drop_rate=0., proj_drop_rate=0.)
BATCH, STEPS, PROFILED = 32, 8, 5
LR = 1e-3


def _setup(scheduled: bool, seed: int = 0):
    """The model and AdamW: foreach with a float lr, or (``scheduled``) fused with the lr a tensor, which the steps
    change in place."""
    torch.manual_seed(seed)
    model = timm.create_model('sa_quadratic_cifar', **MODEL_KWARGS)
    kwargs = dict(lr=torch.tensor(LR), fused=True) if scheduled else dict(lr=LR, foreach=True)
    return model, torch.optim.AdamW(model.parameters(), weight_decay=0.05, **kwargs)


def _batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(n)]


def eager_step(model, optimizer, images, targets) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(model(images), targets)
    kept = loss.detach()  # returned detached before backward consumes the graph (dynamo refuses it after)
    loss.backward()
    optimizer.step()
    for p in model.parameters():  # zero_grad(set_to_none=True), which dynamo does not trace (a skipped function)
        p.grad = None
    return kept


def run(name: str, batches, scheduled: bool = False):
    """The steps of one way: (parameters after them, per-step table of the profiled steps, dynamo's counters,
    seconds). ``scheduled``: the lr, a tensor, falls linearly, set in place before each step."""
    torch._dynamo.reset()
    counters.clear()
    model, optimizer = _setup(scheduled)
    if name == 'eager':
        step = eager_step
    elif name == 'model compiled':
        compiled = torch.compile(model, backend='aot_eager')
        step = lambda m, o, x, y: eager_step(compiled, o, x, y)  # noqa: E731
    else:
        torch._dynamo.config.trace_autograd_ops = True
        step = torch.compile(eager_step, backend='aot_eager')
    start, prof = time.perf_counter(), None
    try:
        for i, (images, targets) in enumerate(batches):
            if scheduled:
                for group in optimizer.param_groups:
                    group['lr'].fill_(LR * (1 - i / len(batches)))
            if i == len(batches) - PROFILED and name != 'eager':
                prof = profile(activities=[ProfilerActivity.CPU], with_stack=True)
                prof.__enter__()
            step(model, optimizer, images, targets)
    finally:
        torch._dynamo.config.trace_autograd_ops = False
        if prof is not None:
            prof.__exit__(None, None, None)
    seconds = time.perf_counter() - start
    table = count(prof, PROFILED) if prof is not None else None
    return [p.detach().clone() for p in model.parameters()], table, {k: dict(v) for k, v in counters.items()}, seconds


def _breaks(found: dict) -> str:
    reasons = {}
    for reason, n in found.get('graph_break', {}).items():
        first = reason.splitlines()[0][:100]
        reasons[first] = reasons.get(first, 0) + n
    return '; '.join(f'{n}x {r}' for r, n in reasons.items()) or 'none'


def main() -> None:
    print(f'== torch {torch.__version__}, timm {timm.__version__}; sa_quadratic_cifar {MODEL_KWARGS}, batch {BATCH}, '
          f'{STEPS} AdamW steps, the last {PROFILED} profiled; backend aot_eager', flush=True)
    model, _ = _setup(False)
    print(f'   {sum(1 for _ in model.parameters())} parameters', flush=True)
    batches = _batches(STEPS)
    for scheduled in (False, True):
        reference, *_ = run('eager', batches, scheduled)
        for name in ('model compiled', 'step compiled'):
            params, table, found, seconds = run(name, batches, scheduled)
            diff = max((a - b).abs().max().item() for a, b in zip(params, reference))
            show(name + (', fused AdamW, its lr a tensor changed every step' if scheduled else
                         ', foreach AdamW, a constant lr'), table)
            stats = found.get('stats', {})
            print(f'  graphs {stats.get("unique_graphs")}, recompiles {sum(found.get("recompiles", {}).values())}, '
                  f'graph breaks: {_breaks(found)}; parameters after {STEPS} steps {diff:.1e} from eager at most; '
                  f'{seconds:.0f} s with the compile', flush=True)


if __name__ == '__main__':
    main()
