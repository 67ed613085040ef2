""" Alternating A/B throughput of models and variants (images/s, paired ratios), the matmul rate, step profiles

Columns: docs/performance.md, "What is measured"; only ratios of variants timed in one run are meant to be quoted.
"""
import contextlib
import copy
import functools
import statistics
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch
from torch import nn

from ..errors import UserError
from ..layers import check_input_size
from ..models import MODEL_NAMES
from ..models.factory import create_named_model, model_name_hint
from ..train.checkpoint import read_checkpoint, weights_path
from ..train.runtime import resolve_device as resolve_device_name
from ..train.runtime import synchronize
from .macs import _as_input_size, count_macs, unavoidable_macs, unavoidable_macs_from_config
from .memory import LiveTensorMemory
from .peers import PEERS, build_peer, is_peer
from .runner import DTYPES, StepRunner, Variant
from .switches import SWITCHES, check_switch_changes, check_switches_change_paths

__all__ = [
    'count_macs', 'unavoidable_macs', 'unavoidable_macs_from_config', 'matmul_rate', 'LiveTensorMemory',
    'resolve_device', 'hold_compiled_copies', 'compute_dtype', 'paper_model_like',
    'StepRunner', 'Variant', 'input_size_of', 'build_variants', 'benchmark_variants', 'profile_train_step',
]


def matmul_rate(
        n: int = 2048,
        iters: int = 5,
        runs: int = 5,
        device=None,
        dtype: torch.dtype = torch.float32,
) -> float:
    """The machine's matrix-multiply rate in GFLOP/s: median over ``runs`` of ``iters`` ``n x n`` torch.mm."""
    device = resolve_device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=out)
    rates = []
    for _ in range(runs):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, b, out=out)
        synchronize(device)
        rates.append(2.0 * n ** 3 * iters / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


def resolve_device(device=None) -> torch.device:
    """``--device`` as :func:`sa_vision.train.runtime.resolve_device` resolves it; a torch.device as it is."""
    return device if isinstance(device, torch.device) else torch.device(resolve_device_name(device))


def hold_compiled_copies(least: int = 64) -> None:
    """Let dynamo's per-code cache hold at least ``least`` compiled copies in this process: each model the benchmark
    compiles (every variant, width and mode of one model class) is a copy of the same code, and past torch's
    default of 8 the later ones would run eagerly, timed as compiled. For the benchmark's run only (its main gives
    the caller's back; a library import leaves these settings alone; sa-vision-train gets 1,000,000 from timm.optim,
    as timm's train.py)."""
    for name in ('cache_size_limit', 'recompile_limit'):
        setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), least))


def compute_dtype(precision: str = 'float32', amp: bool = False, amp_dtype: str = 'bfloat16') -> torch.dtype:
    """The dtype a step's matrix products run in: the autocast dtype under ``amp``, else the model's ``precision``."""
    names = amp_dtype if amp else precision
    if names not in DTYPES:
        raise UserError(f'unknown dtype {names!r}; use one of {sorted(DTYPES)}')
    return DTYPES[names]


def paper_model_like(model_name: str, model: nn.Module) -> nn.Module:
    """The paper's dense formulation (:class:`~sa_vision.research.paper_reference.PaperDenseSA`) with a copy of
    ``model``'s kind, sizes, dropout rates and weights."""
    from sa_vision.research.paper_reference import PAPER_ATTENTION_KINDS, PaperDenseSA
    kind = getattr(model, 'attn_kind', None)
    if kind not in PAPER_ATTENTION_KINDS:
        raise UserError(f'no paper formulation for {model_name!r} (attention kind {kind}); the paper formulates '
                         f'the attention kinds {PAPER_ATTENTION_KINDS}: compare a model built with one of them')
    block = model.blocks[0]
    return PaperDenseSA.from_state_dict(
        model.state_dict(), norm_eps=block.norm1.eps, proj_drop=block.proj_drop.p, attn_drop=block.attn.attn_drop)


def _maybe_fused(model: nn.Module, fuse: bool) -> Optional[nn.Module]:
    if not fuse:
        return None
    if not hasattr(model, 'fuse'):
        raise UserError(f'{type(model).__name__} has no fuse() method: drop --fuse for it')
    fused = copy.deepcopy(model).eval()
    out = fused.fuse()
    return out if isinstance(out, nn.Module) else fused


def input_size_of(model_name: str) -> tuple:
    """The input size to measure ``model_name`` at where none is given: weights' own (a Fashion-MNIST export
    takes 28x28 and pads it itself), a registered model's pretrained config's (timm's benchmark.py takes it: 224 for
    a ViT of ImageNet; 32 for ours), else CIFAR's 32x32 (the peers)."""
    import timm
    from timm.models import get_pretrained_cfg
    if is_peer(model_name):
        return 3, 32, 32
    if timm.is_model(model_name):
        cfg = get_pretrained_cfg(model_name)
        return tuple(cfg.input_size) if cfg is not None else (3, 32, 32)
    path = weights_path(model_name)
    stated = read_checkpoint(path).preprocessing if path is not None else {}
    return tuple(stated.get('input_size') or (3, 32, 32))


def check_model_name(model_name: str) -> None:
    """A UserError where ``model_name`` is none of what :func:`build_variants` builds (asked of every name before
    any is timed)."""
    import timm

    import sa_vision  # noqa: F401  (registers the models)
    if not (is_peer(model_name) or timm.is_model(model_name) or weights_path(model_name) is not None):
        raise UserError(f'unknown model {model_name!r} ({model_name_hint(model_name)}): not a registered timm name, '
                        f'a peer nor weights (sa_vision: {", ".join(MODEL_NAMES)};'
                        f' peers: {", ".join(PEERS)}; local-dir:<folder> or a weights file)')


@contextlib.contextmanager
def _switched(switch: Callable[[nn.Module], Any], *models: Optional[nn.Module]) -> Iterator[None]:
    """``switch`` on for each of ``models`` (the training model and its fused inference copy, if any)."""
    with contextlib.ExitStack() as stack:
        for m in models:
            if m is not None:
                stack.enter_context(switch(m))
        yield


def build_variants(
        model_name: str,
        compare: Sequence[str] = (),
        fuse: bool = False,
        compare_kwargs: Optional[Dict[str, Dict[str, Any]]] = None,
        input_size=(3, 32, 32),
        **model_kwargs,
) -> List[Variant]:
    """The model itself, then each of ``compare``: 'dense' / 'separable' / 'batched' / 'fused' / 'projfirst' (same
    weights on that path, 'fused' through the fused Triton kernel: it needs a CUDA device or ``TRITON_INTERPRET=1``),
    'paper' (same
    weights through :mod:`sa_vision.research.paper_reference`), a peer of :mod:`sa_vision.measure.peers` built for
    ``input_size``, or any timm model name (built with ``compare_kwargs[name]``)."""
    import timm

    import sa_vision  # noqa: F401  (registers the models)
    c, h, w = _as_input_size(input_size)
    if is_peer(model_name):
        model = build_peer(model_name, img_size=(h, w), in_chans=c, **model_kwargs)
    elif timm.is_model(model_name):
        model = create_named_model(model_name, **model_kwargs)
    elif (path := weights_path(model_name)) is not None:  # local-dir:<folder> or a file, as timm's benchmark.py
        model = read_checkpoint(path, model_args=model_kwargs).create_model()
    else:
        check_model_name(model_name)  # raises
    try:  # its rule, before any copy or timing
        check_input_size(model, (c, h, w))
    except ValueError as e:
        raise UserError(f'{model_name} cannot take input size {(c, h, w)} (--img-size / --input-size): {e}') from None
    variants = [Variant(model_name, model, infer_model=_maybe_fused(model, fuse))]
    for other in compare:
        if other in SWITCHES:
            check_switch_changes(model, model_name, other)
            switched = copy.deepcopy(model)  # same weights, run inside the switch
            fused = _maybe_fused(switched, fuse)  # a --fuse comparison is fused on both sides
            variants.append(Variant(f'{model_name}[{other}]', switched, infer_model=fused,
                                    context=functools.partial(_switched, SWITCHES[other], switched, fused),
                                    switch=other))
        elif other == 'paper':
            variants.append(Variant(f'{model_name}[paper]', paper_model_like(model_name, model)))
        elif is_peer(other):
            variants.append(Variant(other, build_peer(other, img_size=(h, w), in_chans=c,
                                                      **(compare_kwargs or {}).get(other, {}))))
        elif timm.is_model(other):
            variants.append(Variant(other, create_named_model(other, **(compare_kwargs or {}).get(other, {}))))
        else:
            raise UserError(f'unknown comparison {other!r}; use {", ".join(SWITCHES)}, paper, a peer '
                            f'({", ".join(PEERS)}) or a timm model name')
    return variants


def benchmark_variants(
        variants: Sequence[Variant],
        batch_size: int = 32,
        input_size=(3, 32, 32),
        device=None,
        bench: str = 'both',
        warmup: int = 1,
        runs: int = 3,
        iters: int = 1,
        measure_memory: bool = True,
        matmul_size: Optional[int] = None,
        log: Optional[Callable[[str], None]] = None,
        runners: Optional[Sequence['StepRunner']] = None,
        **runner_kwargs,
) -> List[Dict[str, Any]]:
    """Time ``variants`` alternately (round r: A, B, ...; training then inference): one row per variant with median
    images/s, peak step memory (from an untimed step) and MACs, and for rows after the first the paired ratios to it
    (``train_ratio``: median of ``first / this`` per round, > 1: the first is faster); ``matmul_size`` adds the
    :func:`matmul_rate` of every round, in the steps' dtype, under the same load. ``runners``: the variants' step
    runners built beforehand (compiled ones stay compiled across calls), else built from ``runner_kwargs``."""
    device = resolve_device(device)
    log = log or (lambda s: None)
    do_train, do_infer = bench in ('both', 'train'), bench in ('both', 'inference')
    if runners is None:
        runners = [StepRunner(v, batch_size, input_size, device, **runner_kwargs) for v in variants]
    check_switches_change_paths(variants, runners)
    matmul_dtype = compute_dtype(
        **{k: runner_kwargs[k] for k in ('precision', 'amp', 'amp_dtype') if k in runner_kwargs})
    rows = [_describe(v, r, batch_size, input_size, device, log) for v, r in zip(variants, runners)]
    if measure_memory and any(r.torchcompile for r in runners):
        log('peak memory: not measured for compiled steps; time without --torchcompile for it')
    for v, r, row in zip(variants, runners, rows):
        _warm_up(v, r, row, warmup, do_train, do_infer, measure_memory and not r.torchcompile, log)
    train_runs = [[] for _ in variants]
    infer_runs = [[] for _ in variants]
    matmul_runs = []
    for k in range(runs):
        if matmul_size:
            matmul_runs.append(matmul_rate(matmul_size, iters=3, runs=1, device=device, dtype=matmul_dtype))
        for i, (v, r) in enumerate(zip(variants, runners)):
            if do_train:
                train_runs[i].append(r.time(r.train_step, iters))
            if do_infer:
                infer_runs[i].append(r.time(r.infer_step, iters))
            done = [f'{kind} {runs_of_kind[-1]:,.1f}' for kind, runs_of_kind in (('train', train_runs[i]),
                                                                                  ('infer', infer_runs[i]))
                    if runs_of_kind]
            log(f'run {k + 1}/{runs} {v.name}: {", ".join(done)} img/s')
    for row, train, infer in zip(rows, train_runs, infer_runs):
        for runs_of_kind, key in ((train, 'train'), (infer, 'infer')):
            if runs_of_kind:
                row[f'{key}_samples_per_sec'] = statistics.median(runs_of_kind)
                row[f'{key}_runs'] = [round(x, 3) for x in runs_of_kind]
        if matmul_runs:
            row['matmul_gflops'] = statistics.median(matmul_runs)
            row['matmul_dtype'] = str(matmul_dtype).replace('torch.', '')
            row['matmul_runs'] = [round(x, 3) for x in matmul_runs]
    _add_ratios_to_the_first(rows, train_runs, infer_runs)
    return rows


def _describe(variant: Variant, runner: 'StepRunner', batch_size: int, input_size, device: torch.device,
              log: Callable[[str], None]) -> Dict[str, Any]:
    """The result row of ``variant`` before timing: its setting, parameters and MACs."""
    row = dict(
        model=variant.name, device=device.type, batch_size=batch_size,
        input_size='x'.join(str(s) for s in _as_input_size(input_size)),
        param_count=sum(p.numel() for p in runner.train_model.parameters()),
        threads=torch.get_num_threads(),
    )
    try:
        with variant.context():
            row['macs'] = count_macs(runner.infer_model, _as_input_size(input_size))
    except Exception as e:  # noqa: BLE001  counting must never stop the timing
        log(f'{variant.name}: MAC count failed: {e!r}')
        row['macs'] = None
    return row


def _warm_up(variant: Variant, runner: 'StepRunner', row: Dict[str, Any], warmup: int, do_train: bool, do_infer: bool,
             measure_memory: bool, log: Callable[[str], None]) -> None:
    """``warmup`` untimed steps of each kind, then (``measure_memory``) one that records its peak memory."""
    log(f'warm-up {variant.name}')
    for _ in range(warmup):
        if do_train:
            runner.train_step()
        if do_infer:
            runner.infer_step()
    if measure_memory:
        if do_train:
            row['train_peak_mb'] = runner.peak(runner.train_step) / 2 ** 20
            row['state_mb'] = runner.baseline_bytes() / 2 ** 20
        if do_infer:
            row['infer_peak_mb'] = runner.peak(runner.infer_step) / 2 ** 20
        log(f'peak memory {variant.name}: ' + ', '.join(f'{kind} {row[f"{kind}_peak_mb"]:,.1f} MB'
                                                       for kind in ('train', 'infer') if f'{kind}_peak_mb' in row))


def _add_ratios_to_the_first(rows: List[Dict[str, Any]], train_runs: List[List[float]],
                             infer_runs: List[List[float]]) -> None:
    """Speed and memory of every row after the first, relative to the first (> 1: the first is faster/smaller)."""
    first = rows[0]
    for i, row in enumerate(rows[1:], start=1):
        # speed: the two variants of one round ran back to back, so their ratio cancels slow drifts in load
        for timed, ratio_key in ((train_runs, 'train_ratio'), (infer_runs, 'infer_ratio')):
            if timed[i]:
                paired = [a / b for a, b in zip(timed[0], timed[i])]
                row[ratio_key] = statistics.median(paired)
                row[ratio_key + '_runs'] = [round(x, 3) for x in paired]
        for key, ratio_key in (('train_peak_mb', 'train_mem_ratio'), ('infer_peak_mb', 'infer_mem_ratio')):
            if key in first and key in row and row[key]:
                row[ratio_key] = first[key] / row[key]


def profile_train_step(model: nn.Module, batch_size: int = 32, input_size=(3, 32, 32), row_limit: int = 15,
                       warmup: int = 1, device=None, **runner_kwargs) -> str:
    """torch.profiler table of one training step after ``warmup`` steps, run as the timed steps run (``runner_kwargs``
    of :class:`StepRunner`); top ops by self device time on CUDA, by self CPU time otherwise."""
    from torch.profiler import ProfilerActivity, profile
    device = resolve_device(device)
    runner = StepRunner(Variant('profile', model), batch_size, input_size, device, **runner_kwargs)
    for _ in range(max(warmup, 1 if runner_kwargs.get('torchcompile') else 0)):
        runner.train_step()
    activities = [ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        runner.train_step()
        synchronize(device)
    sort_by = 'self_device_time_total' if device.type == 'cuda' else 'self_cpu_time_total'
    return prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)
