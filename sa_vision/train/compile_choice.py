""" The choice of ``--torchcompile``: torch.compile's modes, each timed on a training step, the cheapest kept """
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from ..tables import format_duration
from .runtime import synchronize

__all__ = [
    'COMPILE_MODES', 'CUDA_GRAPH_MODES', 'compile_model', 'compile_choices', 'time_training_steps', 'probe_compile',
    'choose_compile', 'first_error_line', 'resolve_torchcompile',
]

# torch.compile's modes (timm train.py's --torchcompile-mode passes one through); 'reduce-overhead' adds CUDA graphs
COMPILE_MODES = (None, 'default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')
# the modes whose compiled graphs run as CUDA graphs on CUDA
CUDA_GRAPH_MODES = ('reduce-overhead', 'max-autotune')


def compile_model(model: nn.Module, backend: str = 'inductor', mode: Optional[str] = None) -> Callable:
    """``torch.compile(model, backend=backend, mode=mode)``, as timm's train.py compiles (None: torch's default)."""
    return torch.compile(model, backend=backend, mode=mode)


def compile_choices(device, mode: Optional[str] = None) -> Dict[str, Tuple[Optional[str], Optional[str]]]:
    """What ``--torchcompile auto`` weighs, label -> (backend, mode): eager, inductor in ``mode`` (default: torch's
    default mode) and, on CUDA without a ``mode``, inductor with CUDA graphs ('reduce-overhead')."""
    choices = {'eager': (None, None), _label('inductor', mode): ('inductor', mode)}
    if mode is None and torch.device(device).type == 'cuda':
        choices[_label('inductor', 'reduce-overhead')] = ('inductor', 'reduce-overhead')
    return choices


def _label(backend: str, mode: Optional[str]) -> str:
    return backend if mode in (None, 'default') else f'{backend} ({mode})'


def time_training_steps(model: nn.Module, callables: Dict[str, Callable], images: torch.Tensor,
                        targets: torch.Tensor, loss_fn: Callable, amp_ctx: Callable, rounds: int = 3,
                        steps: int = 2, warmup: int = 3) -> Tuple[Dict[str, Tuple[float, float]], Dict[str, str]]:
    """(label -> (compile seconds, steady seconds per training step), label -> why it failed) of each callable
    training ``model`` (forward and backward). Each first runs ``warmup`` steps (compiling; CUDA graphs record on
    the second or third), then ``rounds`` of ``steps`` steps alternate between the callables, order reversed every
    round; the step time is the median, the compile time what the warm-up took beyond ``warmup`` steady steps (0
    for a callable that is ``model`` itself). A compiled callable whose warm-up raises is left out and its error
    kept (CUDA graphs can fail where plain inductor works); ``model`` itself raising is raised. Weights,
    gradients and RNG state are restored."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rng_state = torch.get_rng_state()
    cuda_rng_states = torch.cuda.get_rng_state_all() if images.device.type == 'cuda' else None

    def run(fn, count: int) -> float:
        synchronize(images.device)
        start = time.perf_counter()
        for _ in range(count):
            with amp_ctx():
                loss = loss_fn(fn(images), targets)
            loss.backward()
        synchronize(images.device)
        return time.perf_counter() - start

    model.train()
    try:
        warmups, failures = {}, {}
        for label, fn in callables.items():
            try:
                warmups[label] = run(fn, warmup)
            except Exception as e:  # noqa: BLE001 -- whatever stops a compiled choice, the others stay
                if fn is model:
                    raise
                failures[label] = first_error_line(e)
        per_step = {label: [] for label in warmups}
        order = list(warmups)
        for _ in range(rounds):
            for label in order:
                per_step[label].append(run(callables[label], steps) / steps)
            order.reverse()
        step_s = {label: statistics.median(times) for label, times in per_step.items()}
        return {label: (0. if callables[label] is model else max(warmups[label] - warmup * step_s[label], 0.),
                        step_s[label]) for label in warmups}, failures
    finally:
        model.load_state_dict(state)
        for p in model.parameters():
            p.grad = None
        torch.set_rng_state(rng_state)
        if cuda_rng_states is not None:
            torch.cuda.set_rng_state_all(cuda_rng_states)


def first_error_line(e: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters): what a log line says of an error."""
    return f'{type(e).__name__}: {(str(e).strip().splitlines() or [""])[0][:200]}'


def probe_compile(model: nn.Module, args, input_size, loss_fn, amp_ctx,
                  callables: Dict[str, Callable]) -> Tuple[Dict[str, Tuple[float, float]], Dict[str, str]]:
    """:func:`time_training_steps` on a random batch of the run's shape. Every rank probes its own model (no DDP:
    an all-reduce would add the same time to every choice); rank 0's figures decide among the choices that
    compiled on every rank, so that all ranks train through the same one."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch_size, *input_size, generator=gen).to(args.device)
    if args.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    num_classes = getattr(model, 'num_classes', 1) or 1
    targets = torch.randint(0, num_classes, (args.batch_size,), generator=gen).to(args.device)
    measured, failures = time_training_steps(model, callables, images, targets, loss_fn, amp_ctx)
    if args.distributed:
        every_rank = [None] * dist.get_world_size()
        dist.all_gather_object(every_rank, failures)
        failures = {label: why for rank_failures in reversed(every_rank) for label, why in rank_failures.items()}
        shared = [measured]
        dist.broadcast_object_list(shared, src=0)
        measured = {label: figures for label, figures in shared[0].items() if label not in failures}
    return measured, failures


def choose_compile(measured: Dict[str, Tuple[float, float]], steps_left: int) -> Tuple[str, List[str]]:
    """(the label of least ``compile seconds + steps_left * seconds per step``, one log line per choice and the
    verdict). The probe has compiled every choice by then; the compile time still counts as what the choice costs
    each process that runs it (a resumed run compiles again). No margin for noise: choices within it cost about the
    same either way."""
    def cost(label):
        compile_s, step_s = measured[label]
        return compile_s + steps_left * step_s
    best = min(measured, key=cost)
    lines = [f'{label} {1e3 * step_s:.1f} ms/step' + (f' after a {format_duration(compile_s)} compile'
                                                      if compile_s else '')
             for label, (compile_s, step_s) in measured.items()]
    if len(measured) == 1:
        verdict = 'the only choice left'
    elif best != 'eager':
        verdict = f'saves ~{format_duration(cost("eager") - cost(best))} over {steps_left:,} steps against eager'
    else:
        runner_up = min((label for label in measured if label != best), key=cost)
        verdict = f'{runner_up} would take ~{format_duration(cost(runner_up) - cost(best))} longer over ' \
                  f'{steps_left:,} steps'
    return best, lines + [f'-> {best}: {verdict}']


def resolve_torchcompile(requested: Optional[str], model: nn.Module,
                         probe: Callable[[Dict[str, Callable]],
                                         Tuple[Dict[str, Tuple[float, float]], Dict[str, str]]],
                         mode: Optional[str] = None, steps_left: int = 0, device='cpu'):
    """(the callable that trains, backend used or False, mode used, why: a list of lines) for ``--torchcompile``
    ``requested`` and ``--torchcompile-mode`` ``mode``. 'auto' compiles every :func:`compile_choices`, times them
    with ``probe`` and keeps the cheapest over ``steps_left`` steps (:func:`choose_compile`) among those that
    compiled: a choice that fails is left out and named, and if the probe itself fails the run trains eagerly."""
    if not requested:
        return model, False, None, ['eager (--torchcompile off)' + (f'; --torchcompile-mode {mode} ignored'
                                                                    if mode else '')]
    if requested != 'auto':
        return compile_model(model, requested, mode), requested, mode, [
            f'--torchcompile {requested}{f" --torchcompile-mode {mode}" if mode else ""} asked for']
    choices = compile_choices(device, mode)
    callables = {label: model if backend is None else compile_model(model, backend, choice_mode)
                 for label, (backend, choice_mode) in choices.items()}
    try:
        measured, failures = probe(callables)
    except Exception as e:  # noqa: BLE001 -- whatever stops compilation, 'auto' trains eagerly and says why
        torch.compiler.reset()
        return model, False, None, [f'--torchcompile auto: eager, compiling failed ({first_error_line(e)})']
    failed = [f'{label} failed to compile ({why}), left out' for label, why in failures.items()]
    best, lines = choose_compile(measured, steps_left)
    backend, best_mode = choices[best]
    if best_mode not in CUDA_GRAPH_MODES and any(m in CUDA_GRAPH_MODES for _, m in choices.values()):
        # the probe recorded CUDA graphs for a choice not kept: their private memory pool would stay allocated
        # for the whole run. Nothing else has recorded any yet: the run's training starts after this
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
        reset_cudagraph_trees()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # the pool's blocks, back to the GPU rather than held by the allocator
    return callables[best], backend or False, best_mode, [f'--torchcompile auto: {line}' for line in failed + lines]
