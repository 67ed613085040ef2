"""The GPU device check: throughput in three compile modes, dense mixing, a profile, syncs, training, the zoo, the
CUDA tests.

One script for a lent GPU (how to run it, the data folder and the time: device_check.md beside this file). Full-size
``sa_quadratic_cifar`` (the paper's width, Sec. 4) and the ``cpu`` profile's narrow one (embedding 64, MLP 128), bf16
autocast, batch 128. Numbered sections, run in order of importance and skipped with a ``skipped: budget`` line
once ``--budget-s`` would be exceeded:

1. training and inference throughput, eager / ``torch.compile`` / ``torch.compile(mode='reduce-overhead')``, each
   paired (alternating rounds, median ratio; ``sa_vision.measure.benchmark``) against the paper's formulation and
   timm's ViT at matched MACs, compiled the same way;
2. dense (Kronecker, CUDA's default) against separable mixing, with ``sa_gen_cifar`` (never separable) beside; then
   the dense path against itself batch-major (``batch_major.py`` beside this file: no copy of the heads-sized tensor)
   and projected first (``project_then_mix``, same weights): whether CUDA mixes batch-major, or projects first;
3. the zoo's half-width ResNet18 against the narrow model;
4. a profiler summary of one compiled training step (GPU busy time, kernels, the top kernels; a trace file);
5. the sync check: training steps under ``torch.cuda.set_sync_debug_mode('error')``;
6. ``sa-vision-train`` end to end on Fashion-MNIST with the data on the device, its epochs' images/s;
7. the ``cpu`` zoo profile's five stages trained on the GPU (``Reproduction(train_args=...)``);
8. the fused Triton kernel (``sa_vision.layers.triton_mixing``): one attention layer's training step through it
   against the batched path, then the whole model with and without it (``fused_mix_and_project``, same weights;
   eager training and inference, ``reduce-overhead`` training): whether it becomes the default on CUDA;
9. the repository's CUDA test cases (``pytest -m cuda``): exactness of every path on the GPU, compiled training steps
   that never wait for the host, the compiled Triton kernel;
10. two inductor settings (:data:`INDUCTOR_KNOBS`) against its defaults on the full-size step, same weights: the H100's
   profile found its largest kernel, a LayerNorm's backward fused with the dropout's, at 13 % occupancy with 235
   registers a thread (14 % of the step), a persistent reduction;
11. the narrow training step compiled whole (:data:`WHOLE_STEP_ROLES`: forward, loss, backward and the SGD step in one
   compiled function, dynamo tracing the backward into the graph), ours against timm's ViT compiled the same way and
   against ours with the model alone compiled: the host-bound narrow step's accumulation of gradients into 88
   parameters runs in the graph then (docs/performance.md, the lead measured on a CPU);
12. timm's own ``train.py`` trains the narrow model compiled with CUDA graphs and bf16 autocast (``timm_train_check``
   beside this file): that it runs, its images/s, and its compiled evaluation against the same weights evaluated
   uncompiled (the compiled evaluation's fault, docs/training.md).

Before the first item, a warm phase compiles the selected items' steps in parallel processes, which leave their graphs
in inductor's on-disk caches for the items' first steps to load (:func:`warm`; none under a budget of 400 s). A PASS /
MISS line for each goal is written after every item and on ``timeout``'s SIGTERM (:func:`goals`), so that a run
killed at any point leaves them. ``--smoke`` runs every section on the CPU with tiny models, a few steps and dynamo's
``eager`` backend (tests/test_device_check.py), so that a slip cannot cost device time.
"""
import argparse
import contextlib
import copy
import csv
import dataclasses
import gzip
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_env beside this file, also where a test loads it
from probe_env import exit_if_stopped, fashion_mnist_dir, on_sigterm, redirect_fds, require_timm, versions

require_timm()  # one line and exit 2 where timm is outside pyproject's range: sa_vision would fail inside it

import timm.optim  # for create_optimizer_v2 below: `import sa_vision` leaves timm.optim unimported
import timm_train_check  # beside this file, as probe_env
import torch
from batch_major import batch_major
from torch._dynamo.utils import counters

import sa_vision
from sa_vision.errors import freeze_at_exit
from sa_vision.layers import dense_attention
from sa_vision.measure import benchmark as sab
from sa_vision.measure import format_results
from sa_vision.reproduce import PROFILES, PRUNED_MODEL, TRAINED_MODELS, Reproduction, StageStopped
from sa_vision.reproduce.processes import die_with_parent
from sa_vision.train.args import build_parser as build_train_parser
from sa_vision.train.checkpoint import read_checkpoint
from sa_vision.train.runtime import uses_channels_last

ROOT = Path(__file__).resolve().parents[3]
KEPT_TABLE = ROOT / 'docs' / 'reproduction_fashion_mnist.csv'  # the kept zoo's results (zoo/fashion-mnist-cpu)
MODES = ('eager', 'default', 'reduce-overhead')
PROFILED_STEPS = 2  # section 4: the training steps recorded, after one skipped and one warming the profiler up
# the goals this check reports against
FULL_MIN_IMG_S, FULL_MIN_VS_PAPER = 15_000, 1.5
NARROW_MIN_IMG_S, NARROW_MIN_VS_VIT = 25_000, 1.2
ZOO_MAX_MINUTES = 5.0
# section 10: inductor settings, each compiling a copy of ours with them (torch.compile's options), against the
# defaults. The full-size dense step's largest kernel (h100_2026-11-26b trace: triton_per_fused_..._native_dropout_
# backward_native_layer_norm_backward, 194 us, 10 a step) is a persistent reduction over 400 channels padded to 512 at
# 13 % occupancy: looped reductions hold fewer values per thread, and the tuning may pick smaller blocks
INDUCTOR_KNOBS = {'looped_reductions': {'triton.persistent_reductions': False},
                  'tuned_blocks': {'coordinate_descent_tuning': True}}
# each setting is an item of its own, paired with ours, so that a slow compile loses only its own row: on the H200
# (2026-11-27) ours compiled in 23 s and the looped copy in 17 s, while the tuned copy was still compiling (tuning)
# after 110 s when the call's timeout stopped it
INDUCTOR_KNOB_ESTIMATES_S = {'looped_reductions': 70, 'tuned_blocks': 300}
# section 11: copies of these roles (same weights) whose training step compiles whole; and ours with the model
# compiled and the optimizer fused (one launch, as sa-vision-train's fused AdamW on CUDA), the baseline the
# decision reads, so that the whole step's gain is not only the SGD step's foreach launches compiled away
WHOLE_STEP_ROLES = {'ours_step': 'ours', 'vit_step': 'vit'}
FUSED_OPTIMIZER_ROLE = 'ours_fused'
# and ours with the model compiled, the SGD step fused, and the backward through compiled autograd: the gradients'
# accumulation in a compiled graph while the optimizer and its learning rate stay as the trainer runs them (no
# tensor learning rate needed, unlike the whole step)
COMPILED_AUTOGRAD_ROLE = 'ours_ca'
SECTIONS = range(1, 13)
# the share of --budget-s that compiling the items' steps beforehand may take (the warm phase), and the budget
# below which there is none: under it the share is shorter than most items' compiles (their estimates, up to 120 s
# but section 10's tuned copy, 300 s: run that section with --warm-s 0), so the cut could kill every process before
# it stored a step (not measured on a GPU)
WARM_SHARE, WARM_MIN_BUDGET_S = 0.3, 400
# sa-vision-train flags of the device-data path; until they exist a section says so (smoke: skips)
NEW_TRAIN_FLAGS = ('--device-data', '--torchcompile-mode')
SPEED_FLAGS = ('--device-data', 'on', '--torchcompile', 'inductor', '--torchcompile-mode', 'reduce-overhead', '--amp',
               '--amp-dtype', 'bfloat16')
# sections 6 and 12: the optimizer and schedule of a training, in the argument names sa-vision-train and timm's
# train.py share; the warm-up apart, whole epochs in train.py
TRAIN_RECIPE = ('--opt', 'adamw', '--lr', '2e-3', '--weight-decay', '0.05', '--sched', 'cosine')
TIMM_TRAIN_WORKERS = 8  # section 12: train.py's loader transforms each image in Python, in worker processes
SMOKE_TIMM_IMAGES = 254  # section 12's smoke run: the first images of each split, the last batch short as on the GPU
TIMM_EVAL_RESERVE_S = 30  # section 12: the checkpoints' eager evaluations after train.py ends


@dataclass
class Setting:
    """Sizes and step counts: the GPU's, or the smoke run's tiny ones on the CPU."""
    device: str
    batch_size: int
    backend: str  # torch.compile backend: inductor, or dynamo's 'eager' for the smoke run
    warmup: int
    runs: int
    iters: int
    full: Dict[str, Any]  # model kwargs of sa_quadratic_cifar / sa_gen_cifar at the paper's width
    narrow: Dict[str, Any]
    vit_full: Dict[str, Any]  # vit_peer overrides (sa_vision.measure.peers) matching the full model's MACs
    vit_narrow: Dict[str, Any]
    resnet: Dict[str, Any]
    zoo_profile: str
    dataset: str
    matmul_size: int
    copy_mb: int
    e2e_epochs: int
    zoo_epochs: Optional[int] = None
    e2e_batch_size: Optional[int] = None  # section 6's trainings (default: batch_size)

    @property
    def train_batch_size(self) -> int:
        return self.e2e_batch_size or self.batch_size


def gpu_setting() -> Setting:
    cpu = PROFILES['cpu'].per_model
    return Setting(
        device='cuda', batch_size=128, backend='inductor', warmup=3, runs=5, iters=20,
        full={}, narrow=dict(cpu['sa_quadratic_cifar']['model_kwargs']),
        # width 486 = 9 heads x 54: 3.29 GMAC and 11.5 M parameters against our 3.26 GMAC and 12.1 M (patch 2)
        vit_full={'embed_dim': 486}, vit_narrow={}, resnet=dict(cpu['resnet18_cifar']['model_kwargs']),
        zoo_profile='cpu', dataset='fashion-mnist', matmul_size=8192, copy_mb=1024, e2e_epochs=2)


def smoke_setting(backend: str = 'eager') -> Setting:
    tiny = dict(embed_dim=16, depth=1, heads_per_layer=3, mlp_hidden_dim=32, proj_drop_rate=0.0, attn_drop_rate=0.0)
    vit = dict(embed_dim=12, depth=1, num_heads=3)
    return Setting(
        device='cpu', batch_size=4, backend=backend, warmup=1, runs=2, iters=1,
        # two widths, so that each size compiles its own graphs as on the GPU (the ViT: one size twice)
        full=tiny, narrow=dict(tiny, embed_dim=24), vit_full=vit, vit_narrow=vit,
        resnet=dict(PROFILES['tiny'].per_model['resnet18_cifar']['model_kwargs']),
        zoo_profile='tiny', dataset='digits', matmul_size=128, copy_mb=1, e2e_epochs=1, zoo_epochs=1,
        # 22 steps an epoch, not 359 of batch 4: the three trainings' code runs the same, 8 s sooner on a CI core
        e2e_batch_size=64)


class Log:
    """One text log: every line to stdout and to ``device_check.log``; results to ``device_check.json``."""

    def __init__(self, out: Path):
        self.out = out
        self.file = open(out / 'device_check.log', 'a', encoding='utf-8', buffering=1)
        self.results: Dict[str, Any] = {'items': []}
        self.lock = threading.RLock()  # the zoo's stages report from their threads
        self.goals_logged: List[str] = []

    def __call__(self, msg: str = '') -> None:
        print(msg, flush=True)
        self.file.write(msg + '\n')

    def save(self) -> None:
        path = self.out / 'device_check.json'
        with self.lock:  # the zoo's stage threads add to the results under it
            text = json.dumps(self.results, indent=1, default=str)
        path.with_suffix('.tmp').write_text(text)
        os.replace(path.with_suffix('.tmp'), path)


# one compiled step of a runner: (size, mode, role, 'train' or 'infer')
Target = Tuple[str, str, str, str]
BENCH_KINDS = {'both': ('train', 'infer'), 'train': ('train',), 'inference': ('infer',)}


def whole_step_problem(breaks: Dict[str, int], cudagraph_skips: int) -> Optional[str]:
    """Why a whole-step runner's first steps are not the step section 11 means to time, or None: a graph break
    other than the two torch.optim puts around the optimizer step (a break at ``loss.backward()`` where this torch's
    dynamo does not trace it), or on CUDA a graph run without CUDA graphs."""
    others = {r: n for r, n in breaks.items() if 'graph_break()' not in r}
    if others or sum(breaks.values()) > 2:
        return ('the step did not compile whole, graph breaks: ' +
                '; '.join(f'{n}x {(r.splitlines() or [""])[0][:200]}' for r, n in breaks.items()))
    if cudagraph_skips:
        return f'{cudagraph_skips} graph(s) of the step ran without CUDA graphs'
    return None


def compiled_autograd_problem(captures: int, breaks: Dict[str, int], cudagraph_skips: int) -> Optional[str]:
    """Why a compiled-autograd runner's first steps are not the step section 11 means to time, or None: its backward
    never went through compiled autograd, a graph broke, or on CUDA a graph ran without CUDA graphs."""
    if not captures:
        return 'compiled autograd captured no backward: the step timed would be the model-compiled one'
    if breaks:
        return f'graph breaks: {sum(breaks.values())}, first: {(next(iter(breaks)).splitlines() or [""])[0][:200]}'
    if cudagraph_skips:
        return f'{cudagraph_skips} graph(s) of the step ran without CUDA graphs'
    return None


def compiled_targets(size: str, mode: str, roles, bench: str = 'train') -> Tuple[Target, ...]:
    """The compiled steps that :meth:`Check.paired` (and the items on its runners) compile: none in eager mode."""
    if mode == 'eager':
        return ()
    return tuple((size, mode, role, kind) for role in roles for kind in BENCH_KINDS[bench])


@dataclass
class Item:
    section: int
    name: str
    run: Callable[[], None]
    estimate_s: float  # device seconds it is expected to take on an H100, compile included
    compiles: Tuple[Target, ...] = ()  # what the warm phase compiles for it beforehand
    # run only where its section is the only one asked for: a compile whose length no estimate holds (the budget's
    # scale of the items before could admit it, and the call's timeout then kill it with the device time spent)
    alone: bool = False


@dataclass
class Budget:
    seconds: float
    start: float = field(default_factory=time.time)
    spent: List = field(default_factory=list)  # (estimate, actual, warmed) of the items run

    def left(self) -> float:
        return self.seconds - (time.time() - self.start)

    def expected(self, estimate: float, warmed: bool = False) -> float:
        """``estimate`` scaled by how the items so far compared to theirs (between 0.5x and 3x). Items whose steps
        the warm phase compiled are scaled by their own kind: their estimates count a compilation they skip. An item
        that compiles for itself is never scaled below its estimate by them."""
        done = [(e, a, w) for e, a, w in self.spent if e >= 20]
        own = [(e, a) for e, a, w in done if w == warmed]
        if not own and not done:
            return estimate
        pairs = own or [(e, a) for e, a, _ in done]
        scale = sum(a for _, a in pairs) / sum(e for e, _ in pairs)
        return estimate * min(max(scale, 0.5 if own or warmed else 1.0), 3.0)


class Check:
    """The sections' shared state: models and their step runners, kept so that compiled ones are compiled once."""

    def __init__(self, setting: Setting, log: Log, data_dir: Optional[str], budget: Budget, smoke: bool,
                 zoo_parallel: int):
        self.s, self.log, self.data_dir, self.budget, self.smoke = setting, log, data_dir, budget, smoke
        self.zoo_parallel = zoo_parallel
        self.device = torch.device(setting.device)
        self.families: Dict[Any, Dict[str, sab.Variant]] = {}
        self.runners: Dict[Any, Any] = {}
        self.input_size = (3, 32, 32)
        self.timm_train_path: Optional[str] = None  # section 12: --timm-train

    # ---- models and runners

    def family(self, size: str, mode: str) -> Dict[str, sab.Variant]:
        """The variants of one size, built once per compile mode (each mode compiles its own copies): ours, the
        paper's formulation, ours on the dense path, through the fused Triton kernel, on the dense path projected
        first and batch-major (same weights), timm's ViT, sa_gen_cifar, the ResNet."""
        key = (size, mode)
        if key not in self.families:
            kwargs = self.s.full if size == 'full' else self.s.narrow
            vit = self.s.vit_full if size == 'full' else self.s.vit_narrow
            torch.manual_seed(0)
            variants = sab.build_variants(
                'sa_quadratic_cifar',
                ['paper', 'dense', 'separable', 'fused', 'projfirst', 'vit_peer', 'sa_gen_cifar', 'resnet18_cifar'],
                compare_kwargs={'vit_peer': vit, 'sa_gen_cifar': kwargs, 'resnet18_cifar': self.s.resnet},
                input_size=self.input_size, **kwargs)
            family = dict(zip(('ours', 'paper', 'dense', 'separable', 'fused', 'projfirst', 'vit', 'gen', 'resnet'),
                              variants))
            patched = batch_major(copy.deepcopy(family['ours'].model))  # dense, as the role it is paired with
            family['batchmajor'] = sab.Variant(f'{family["ours"].name}[batch-major]', patched,
                                               context=lambda m=patched: dense_attention(m))
            for knob, settings in INDUCTOR_KNOBS.items():  # same weights, compiled (at its first step) with them
                family[knob] = sab.Variant(f'{family["ours"].name}[{knob}]', copy.deepcopy(family['ours'].model),
                                           compile_options=settings)
            for role, base in WHOLE_STEP_ROLES.items():
                family[role] = dataclasses.replace(family[base], name=f'{family[base].name}[whole step]',
                                                   model=copy.deepcopy(family[base].model), whole_step=True)
            family[COMPILED_AUTOGRAD_ROLE] = dataclasses.replace(
                family['ours'], name=f'{family["ours"].name}[compiled autograd, fused SGD]',
                model=copy.deepcopy(family['ours'].model), fused_optimizer=True, compiled_autograd=True)
            family[FUSED_OPTIMIZER_ROLE] = dataclasses.replace(
                family['ours'], name=f'{family["ours"].name}[fused SGD]', model=copy.deepcopy(family['ours'].model),
                fused_optimizer=True)
            self.families[key] = family
        return self.families[key]

    def runner(self, size: str, mode: str, role: str):
        """The step runner of one variant, laid out as sa-vision-train lays it out (channels-last on CUDA for a
        model with a real convolution, the ResNet: ``uses_channels_last``)."""
        key = (size, mode, role)
        if key not in self.runners:
            variant = self.family(size, mode)[role]
            channels_last = uses_channels_last(variant.model, self.device)
            runner = sab.StepRunner(
                variant, self.s.batch_size, self.input_size, self.device, amp=True, amp_dtype='bfloat16',
                channels_last=channels_last, torchcompile=None if mode == 'eager' else self.s.backend,
                torchcompile_mode=mode if mode == 'reduce-overhead' else None)
            runner.label, runner.layout = '/'.join(key), 'channels-last' if channels_last else 'NCHW'
            self.runners[key] = runner
        return self.runners[key]

    def first_steps(self, runner, name: str, bench: str) -> None:
        """Time a runner's first steps (compilation, CUDA graph recording) once, apart from the timed ones."""
        for kind in BENCH_KINDS[bench]:
            if getattr(runner, f'_first_{kind}', None) is not None:
                continue
            t0, skips, cached = time.time(), counters['inductor']['cudagraph_skips'], cache_counters()
            captures = counters['compiled_autograd']['captures']
            breaks_before = dict(counters['graph_break'])
            for _ in range(3 if runner.cudagraphs else 1):  # warm-up, recording, first replay
                getattr(runner, f'{kind}_step')()
            self.sync()
            setattr(runner, f'_first_{kind}', time.time() - t0)
            if runner.torchcompile:
                cache = {k: v - cached.get(k, 0) for k, v in cache_counters().items() if v - cached.get(k, 0)}
                breaks = {k: v - breaks_before.get(k, 0) for k, v in counters['graph_break'].items()
                          if v - breaks_before.get(k, 0)}
                self.log(f'  {name}: first {kind} steps (compile included) {time.time() - t0:.1f} s; compile '
                         f'caches: {format_cache(cache)}; graph breaks: {sum(breaks.values())}')
                self.log.results.setdefault('compile_cache', {})[f'{runner.label}/{kind}'] = cache
                self.log.results.setdefault('graph_breaks', {})[f'{runner.label}/{kind}'] = breaks
                for reason, count in breaks.items():  # dynamo's reasons: a break costs a graph and a launch each
                    self.log(f'  {name}: GRAPH BREAK ({count}x in the {kind} step): '
                             f'{(reason.splitlines() or [""])[0][:300]}')
            skipped = counters['inductor']['cudagraph_skips'] - skips
            if runner.cudagraphs and skipped:  # inductor then runs the compiled graph without CUDA graphs
                self.log(f'  {name}: CUDA GRAPHS SKIPPED for {skipped} graph(s) of the {kind} step (inductor\'s '
                         f'reason: "skipping cudagraphs due to ..." in the console output)')
                self.log.results.setdefault('cudagraph_skips', {})[f'{name} {kind}'] = skipped
            skipped_here = skipped if runner.cudagraphs and self.device.type == 'cuda' else 0
            if runner.step_fn is not None and kind == 'train':
                problem = whole_step_problem(breaks if runner.torchcompile else {}, skipped_here)
                if problem:
                    raise RuntimeError(f'{name}: {problem}')
            if runner.torchcompile and runner.variant.compiled_autograd and kind == 'train':
                problem = compiled_autograd_problem(counters['compiled_autograd']['captures'] - captures, breaks,
                                                    skipped_here)
                if problem:
                    raise RuntimeError(f'{name}: {problem}')

    def sync(self) -> None:
        if self.device.type == 'cuda':
            torch.cuda.synchronize()

    # ---- section 1-3: paired throughput

    def paired(self, size: str, mode: str, roles, bench: str = 'train', key: Optional[str] = None) -> List[Dict]:
        variants = self.family(size, mode)
        runners = [self.runner(size, mode, r) for r in roles]
        for role, runner in zip(roles, runners):
            self.first_steps(runner, variants[role].name, bench)
        rows = sab.benchmark_variants(
            [variants[r] for r in roles], runners=runners, batch_size=self.s.batch_size, input_size=self.input_size,
            device=self.device, bench=bench, warmup=self.s.warmup, runs=self.s.runs, iters=self.s.iters,
            measure_memory=mode == 'eager', log=lambda m: None)
        for role, row, runner in zip(roles, rows, runners):
            row.update(role=role, size=size, mode=mode, layout=runner.layout)
        self.log(f'{size}, {mode}, batch {self.s.batch_size}, bf16 autocast ({bench}; ratios: '
                 f'{variants[roles[0]].name} / the row, > 1: it is faster)')
        self.log(format_results(rows))
        self.log('  layout (as sa-vision-train trains it): ' + ', '.join(f'{r["model"]} {r["layout"]}' for r in rows))
        self.log.results.setdefault('paired', {})[key or f'{size}/{mode}/{bench}'] = rows
        return rows

    # ---- section 4: profile

    def profile(self, size: str, mode: str, trace_name: Optional[str]) -> None:
        """Training steps under ``torch.profiler`` with a schedule (one step skipped, one to warm the profiler up,
        :data:`PROFILED_STEPS` recorded): a later profiler session in one process can misplace its first
        timestamps, and CUPTI 13.0 misreports kernels replayed from CUDA graphs, so the summary is checked
        (:func:`trace_problems`) and a trace that looks wrong says so."""
        from torch.profiler import ProfilerActivity, profile, schedule
        runner = self.runner(size, mode, 'ours')
        self.first_steps(runner, f'{size} {mode}', 'train')
        step_ms = 1000 * self.s.batch_size / runner.time(runner.train_step, max(self.s.iters, 2))
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == 'cuda' else [])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / 'trace.json'
            with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=PROFILED_STEPS),
                         on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
                for step in range(2 + PROFILED_STEPS):
                    if step == 2:
                        t0 = time.perf_counter()
                    runner.train_step()
                    self.sync()
                    prof.step()
                wall_ms = 1000 * (time.perf_counter() - t0)
            summary = trace_summary(json.loads(path.read_text()), PROFILED_STEPS)
            if trace_name:
                with open(path, 'rb') as f, gzip.open(self.log.out / trace_name, 'wb') as g:
                    shutil.copyfileobj(f, g)
        summary.update(step_ms_unprofiled=round(step_ms, 3), profiled_wall_ms=round(wall_ms, 3),
                       gpu_busy_fraction_of_step=round(summary['gpu_busy_ms'] / step_ms, 3) if step_ms else None)
        summary['problems'] = trace_problems(summary, self.device.type == 'cuda')
        self.log(f'{size} sa_quadratic_cifar, {mode}, a training step: {step_ms:.2f} ms unprofiled (mean of '
                 f'{max(self.s.iters, 2)}), GPU busy {summary["gpu_busy_ms"]:.2f} ms '
                 f'({100 * (summary["gpu_busy_fraction_of_step"] or 0):.0f} % of it); the {PROFILED_STEPS} profiled '
                 f'steps: {wall_ms:.2f} ms wall, kernels from first start to last end {summary["window_ms"]:.2f} ms, '
                 f'{summary["kernels"]} kernels, {summary["memcpy"]} copies, {summary["memset"]} memsets, '
                 f'{summary["cpu_ops"]} CPU ops, {summary["graph_launches"]} graph launches'
                 f'{"; trace " + trace_name if trace_name else ""}')
        for problem in summary['problems']:
            self.log(f'  WARNING: the trace looks wrong, its figures above are not to be read: {problem}')
        for name, (total, count) in summary['top_kernels']:
            self.log(f'  {total:8.3f} ms  {count:4d}x  {name[:110]}')
        self.log.results.setdefault('profile', {})[f'{size}/{mode}'] = summary

    # ---- section 5: syncs

    def sync_check(self, size: str, mode: str) -> None:
        runner = self.runner(size, mode, 'ours')
        self.first_steps(runner, f'{size} {mode}', 'train')
        # the training's optimizer (the cpu profile's AdamW through timm), not the benchmark's SGD, for these steps
        sgd, runner.optimizer = runner.optimizer, timm.optim.create_optimizer_v2(
            runner.train_model, opt='adamw', lr=1e-4, weight_decay=0.05)
        label = f'{size} sa_quadratic_cifar, {mode}'
        try:
            for _ in range(2):
                runner.train_step()
            self.sync()
            if self.device.type == 'cuda':
                self.find_syncs(runner, label)
            else:
                runner.train_step()
                self.log(f'{label}: the sync debug mode needs CUDA; the steps ran without it (smoke)')
                self.log.results.setdefault('sync', {})[label] = 'not checked (no CUDA)'
        finally:
            runner.optimizer = sgd

    def find_syncs(self, runner, label: str, debug_mode=None) -> None:
        """One training step under the sync debug mode 'error'; after a sync, one under 'warn' for all of them."""
        debug_mode = debug_mode or torch.cuda.set_sync_debug_mode
        first = None
        debug_mode('error')
        try:
            runner.train_step()
        except RuntimeError:
            first = traceback.format_exc(limit=-14)
        finally:
            debug_mode(0)
        self.sync()
        if first is None:
            self.log(f'{label}: no synchronizing CUDA call in a training step (forward, backward, AdamW step)')
            self.log.results.setdefault('sync', {})[label] = []
            return
        self.log(f'{label}: SYNC in a training step; the first, with its stack:\n{first}')
        stacks = self.all_syncs(runner, debug_mode)
        self.log(f'{label}: {len(stacks)} synchronizing call(s) in one step (sync debug mode "warn"); distinct stacks:')
        for stack, count in sorted(stacks.items(), key=lambda kv: -kv[1]):
            self.log(f'--- {count}x\n{stack}')
        self.log.results.setdefault('sync', {})[label] = [{'count': c, 'stack': s} for s, c in stacks.items()]

    def all_syncs(self, runner, debug_mode) -> Dict[str, int]:
        stacks: Dict[str, int] = {}

        def record(message, category, filename, lineno, file=None, line=None):
            if 'synchroniz' in str(message):
                stack = ''.join(traceback.format_stack(limit=14)[:-2])
                stacks[stack] = stacks.get(stack, 0) + 1
        shown = warnings.showwarning
        with warnings.catch_warnings():
            warnings.simplefilter('always')
            warnings.showwarning = record
            debug_mode('warn')
            try:
                runner.train_step()
            finally:
                debug_mode(0)
                warnings.showwarning = shown
        self.sync()
        return stacks

    # ---- section 9: the CUDA tests

    def cuda_tests(self) -> None:
        """``pytest -m cuda`` over the whole test suite (the smoke run: one file, whose CUDA cases skip on the CPU),
        its output in cuda_tests.log, within the time left."""
        tests = ROOT / 'tests'
        cmd = [sys.executable, '-m', 'pytest', '-m', 'cuda', '-q', '-rfEs', '-p', 'no:cacheprovider',
               '--continue-on-collection-errors', str(tests / 'test_train_runtime.py' if self.smoke else tests)]
        log_path, t0 = self.log.out / 'cuda_tests.log', time.time()
        with open(log_path, 'w', encoding='utf-8') as f:
            # a session of its own, ended whole: no process the tests started (a training) keeps the GPU busy while
            # the next item is timed; and pytest dies with this script, whatever stops it
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=dict(os.environ, PYTHONUNBUFFERED='1'), preexec_fn=die_with_parent)
            try:
                status = proc.wait(timeout=max(self.budget.left(), 30))
            except subprocess.TimeoutExpired:
                status = 'stopped: budget'
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        lines = log_path.read_text().splitlines()
        summary = next((line.strip('= ') for line in reversed(lines) if re.search(r'\d+ (passed|failed|skipped|error)',
                                                                                  line)), 'no summary line')
        failed = [line for line in lines if line.startswith(('FAILED', 'ERROR'))]
        self.log(f'$ {" ".join(cmd[1:])}\nexit {status}: {summary} ({time.time() - t0:.0f} s); its output: '
                 f'cuda_tests.log')
        for line in failed[:20]:
            self.log(f'  | {line[:200]}')
        self.log.results['cuda_tests'] = {'status': status, 'summary': summary, 'failed': failed}

    # ---- section 8: the fused Triton kernel

    def triton_runs(self, label: str) -> bool:
        """Whether the fused Triton kernel can run (smoke: in triton's CPU interpreter, this code's correctness
        only); else says why ``label`` is skipped."""
        from sa_vision.layers import triton_mixing
        if self.smoke:
            os.environ.setdefault('TRITON_INTERPRET', '1')
            triton_mixing.MAX_BLOCK = 256  # the interpreter's time goes per program: whole tiles, 6x faster here
        if triton_mixing.triton_available():
            return True
        self.log(f'{label}: skipped: triton cannot run here')
        self.log.results.setdefault('skipped', {})[label] = 'no triton'
        return False

    def fused_model(self, size: str, mode: str, bench: str = 'train') -> None:
        """The whole model through the fused Triton kernel (``fused_mix_and_project``) against itself without it,
        same weights, alternating: whether the kernel becomes the default on CUDA."""
        if self.triton_runs(f'{size} model with / without the fused Triton kernel, {mode}, {bench}'):
            self.paired(size, mode, ('ours', 'fused'), bench, key=f'fused/{size}/{mode}/{bench}')

    def fused_layer(self, size: str) -> None:
        """One attention layer's training step, bf16 autocast: the batched path's products (all heads mixed, then one
        Value GEMM) against ``mix_and_project`` (one Triton kernel, no heads-sized tensor), alternating: the kernel's
        own speed, apart from the rest of the model (:meth:`fused_model` times the whole model)."""
        from sa_vision.layers import HeadsLinear, PositionalAttention, triton_mixing
        label = f'{size} one layer, fused Triton mix_and_project against the batched path'
        if not self.triton_runs(label):
            return
        kwargs = self.s.full if size == 'full' else self.s.narrow
        dim, heads = kwargs.get('embed_dim', 400), kwargs.get('heads_per_layer', 9)
        grid, batch = (4, 2) if self.smoke else (16, self.s.batch_size)
        torch.manual_seed(0)
        attn = PositionalAttention(dim, heads, 'quadratic', grid_major=True, device=self.device).eval()
        value = HeadsLinear(heads * dim, dim, device=self.device)
        x = torch.randn(grid, grid, batch, dim, device=self.device, requires_grad=True)
        paths = {'batched': lambda: value.forward_batched(attn.mix(x)),
                 'fused': lambda: triton_mixing.mix_and_project(x, attn.mixing_probs(grid, grid), value.weight,
                                                                value.bias)}

        def step(name):
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                out = paths[name]()
            out.float().square().mean().backward()
            return out.detach().float()

        outs = {name: step(name) for name in paths}  # first calls: the kernel compiles
        scale = outs['batched'].abs().max().item()
        times = {name: [] for name in paths}
        for _ in range(2 if self.smoke else 20):
            for name in paths:
                self.sync()
                t0 = time.perf_counter()
                step(name)
                self.sync()
                times[name].append(time.perf_counter() - t0)
        median = {name: statistics.median(t) for name, t in times.items()}
        peak = {}
        for name in paths:
            if self.device.type == 'cuda':
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            step(name)
            peak[name] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20 if self.device.type == 'cuda' else None
        result = dict(size=size, dim=dim, heads=heads, grid=grid, batch=batch,
                      ms={k: round(1e3 * v, 3) for k, v in median.items()},
                      ratio_batched_over_fused=round(median['batched'] / median['fused'], 3),
                      peak_mib=peak, max_abs_difference_over_max=(outs['fused'] - outs['batched']).abs().max().item()
                      / max(scale, 1e-30))
        self.log(f'{label} (D={dim}, {heads} heads, {grid}x{grid}, batch {batch}): batched '
                 f'{result["ms"]["batched"]:.3f} ms, fused {result["ms"]["fused"]:.3f} ms per step (median of '
                 f'{len(times["fused"])}): fused is {result["ratio_batched_over_fused"]:.2f}x as fast; peak MiB '
                 f'{peak}; outputs differ by {result["max_abs_difference_over_max"]:.2e} of their largest')
        self.log.results.setdefault('fused_layer', {})[size] = result

    # ---- sections 6 and 12: trainings in processes of their own

    def run_logged(self, cmd: List[str], log_name: str, seconds: float, cwd: Optional[str] = None):
        """(exit status or 'stopped: budget', wall seconds, this run's output) of ``cmd``, its output appended to
        ``log_name`` in the output folder after the command line, stopped after ``seconds`` (at least 30)."""
        log_path = self.log.out / log_name
        t0 = time.time()
        with open(log_path, 'a', encoding='utf-8') as f:
            f.write(f'\n$ {" ".join(cmd)}\n')
            f.flush()
            try:
                status = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, timeout=max(seconds, 30),
                                        env=dict(os.environ, PYTHONUNBUFFERED='1')).returncode
            except subprocess.TimeoutExpired:
                status = 'stopped: budget'
        text = log_path.read_text().rsplit('\n$ ', 1)[-1].split('\n', 1)[-1]
        return status, time.time() - t0, text

    def speed_flags(self, missing=()) -> List[str]:
        """The training flags of the device-data path, less ``missing`` ones; smoke: dynamo's eager backend (no
        C++ compile) on the CPU, and bf16 autocast only where this CPU's bf16 products pay (``--amp auto``
        measures it): without bf16 units they run about 100x slower than float32, which the smoke need not pay."""
        flags = list(SPEED_FLAGS)
        for flag in missing:  # each takes one value
            i = flags.index(flag)
            del flags[i:i + 2]
        if self.smoke:
            flags[flags.index('inductor')] = 'eager'
            flags.insert(flags.index('--amp') + 1, 'auto')
            flags += ['--device', 'cpu']
        return flags

    def usable_speed_flags(self, what: str) -> Optional[List[str]]:
        """:meth:`speed_flags` as sa-vision-train takes them: on the GPU without the flags it lacks (said), while
        the smoke run skips (None); None without the data folder."""
        if not self.smoke and not self.data_dir:
            self.log(f'{what}: skipped: no Fashion-MNIST folder (carry data/fashion-mnist-xz, or --data-dir)')
            self.log.results.setdefault('skipped', {})[what] = 'no data folder'
            return None
        help_text = build_train_parser().format_help()
        missing = [f for f in NEW_TRAIN_FLAGS if f not in help_text]
        if not missing:
            return self.speed_flags()
        reason = f'sa-vision-train --help does not list {", ".join(missing)} yet'
        if self.smoke:
            self.log(f'{what}: skipped: {reason}')
            self.log.results.setdefault('skipped', {})[what] = reason
            return None
        flags = self.speed_flags(missing)
        if '--device-data' in missing:  # the recipes' single-process loader would starve the GPU
            flags += ['--workers', '6']
        self.log(f'{what}: {reason}; running without them: {" ".join(flags)}')
        return flags

    @staticmethod
    def e2e_argv(setting: Setting, size: str, flags: List[str], out: str, data_dir: Optional[str]) -> List[str]:
        kwargs = setting.full if size == 'full' else setting.narrow
        argv = ['--model', 'sa_quadratic_cifar', '--dataset', setting.dataset, '--epochs', str(setting.e2e_epochs),
                '-b', str(setting.train_batch_size), *TRAIN_RECIPE, '--warmup-epochs', '0.1', '--workers', '0',
                '--train-crop-padding', '0', '--log-interval', '100', '--output', out, '--experiment', size, *flags]
        if kwargs:
            argv[2:2] = ['--model-kwargs', *(f'{k}={v}' for k, v in kwargs.items())]
        return argv + (['--data-dir', data_dir] if data_dir else [])

    def train_e2e(self, size: str, extra: Tuple[str, ...] = ()) -> None:
        """One training run; ``extra``: flags added, the other half of a pair (its results key: size and flags)."""
        label = ' '.join((size, *extra))
        flags = self.usable_speed_flags(f'sa-vision-train, {label}')
        if flags is None:
            return
        with tempfile.TemporaryDirectory() as tmp:
            if self.smoke:  # the GPU's command line parses
                build_train_parser().parse_args(
                    self.e2e_argv(gpu_setting(), size, list(SPEED_FLAGS), tmp, 'data/fashion-mnist') + list(extra))
            argv = self.e2e_argv(self.s, size, flags, tmp, None if self.smoke else self.data_dir) + list(extra)
            cmd = [sys.executable, '-m', 'sa_vision.cli.train', *argv]
            self.log(f'$ sa-vision-train {" ".join(argv)}')
            status, wall, text = self.run_logged(cmd, 'train_e2e.log', self.budget.left())
            result = epoch_rates(text, Path(tmp) / size / 'summary.csv', self.s.train_batch_size)
        result.update(size=size, status=status, wall_s=round(wall, 1), command=argv)
        shown = [line for line in text.splitlines()
                 if line.startswith(('Compilation', 'Precision', 'Optimizer', 'Data', 'Run folder', 'Top-1 on',
                                     'Traceback'))
                 or 'device' in line.lower() or 'error' in line.lower()]
        for line in shown[:16]:
            self.log(f'  | {line[:200]}')
        for epoch in result['epochs']:
            self.log(f'  epoch {epoch["epoch"]}: {epoch["images"]} images in {epoch["train_s"]:.1f} s = '
                     f'{epoch["img_s"]:,.0f} img/s (the log\'s last interval: {epoch["log_img_s"]} img/s; its end '
                     f'to end line: {epoch["end_to_end_img_s"]} img/s)')
        self.log(f'sa-vision-train {label}: exit {status}, {wall:.0f} s wall (process start, compile and evaluation '
                 f'included); its log: train_e2e.log')
        self.log.results.setdefault('train_e2e', {})[label] = result

    # ---- section 12: timm's train.py

    def timm_train(self) -> None:
        """timm's own train.py (``timm_train_check``) trains the narrow model compiled with CUDA graphs; then each
        epoch's checkpoint is evaluated uncompiled against the evaluation train.py logged through the compiled
        module."""
        tc = timm_train_check
        script = tc.train_script(self.timm_train_path)
        if script is None:
            reason = (f'no timm train.py at {self.timm_train_path}' if self.timm_train_path else
                      f'no timm train.py: carry it as {tc.SCRIPT_IN_CARRY.relative_to(ROOT)} (README.md, "timm and '
                      f'the commit"), or pass --timm-train')
            self.log(f'timm\'s train.py: skipped: {reason}')
            self.log.results.setdefault('skipped', {})['timm train.py'] = reason
            return
        if not self.smoke and not self.data_dir:  # the smoke run reads Debian's files, where the tests have them
            self.log('timm\'s train.py: skipped: no Fashion-MNIST folder (carry data/fashion-mnist-xz, or --data-dir)')
            self.log.results.setdefault('skipped', {})['timm train.py'] = 'no data folder'
            return
        with tempfile.TemporaryDirectory(prefix='timm-train-') as tmp:
            data = tc.torchvision_fashion_mnist(self.data_dir, Path(tmp) / 'data',
                                                SMOKE_TIMM_IMAGES if self.smoke else None)
            recipe = (*TRAIN_RECIPE, '--warmup-epochs', '0')  # train.py's default is 5
            cmd = tc.train_argv(script, data, Path(tmp) / 'out', self.s.narrow, recipe, device=self.s.device,
                                backend=self.s.backend, batch_size=self.s.batch_size,
                                workers=0 if self.smoke else TIMM_TRAIN_WORKERS)
            self.log(f'$ {" ".join(cmd[1:])}')
            status, wall, text = self.run_logged(cmd, 'timm_train.log', self.budget.left() - TIMM_EVAL_RESERVE_S,
                                                 cwd=tmp)
            run = Path(tmp) / 'out' / tc.EXPERIMENT
            compiled = tc.evaluations(run / 'summary.csv')
            result = {'status': status, 'wall_s': round(wall, 1), 'command': cmd[1:], 'script': str(script),
                      'epoch_img_s': tc.epoch_rates(text), 'epochs': {}}
            self.log.results['timm_train'] = result
            self.log(f'train.py: exit {status}, {wall:.0f} s wall (process start, compile and evaluations included); '
                     f'its log: timm_train.log')
            for epoch, rate in result['epoch_img_s'].items():
                self.log(f'  epoch {epoch}: {rate:,.0f} img/s (train.py\'s average over the epoch'
                         f'{", its compilation included" if epoch == 0 else ""})')
            if status != 0 or len(compiled) != tc.EPOCHS:
                for line in text.splitlines()[-12:]:
                    self.log(f'  | {line[:200]}')
                raise RuntimeError(f'train.py: exit {status}, evaluations of epochs {sorted(compiled)}')
            self._timm_evaluations(run, data, compiled, tc.logged_batches(text), result['epochs'])

    def _timm_evaluations(self, run: Path, data: Path, compiled: Dict[int, Dict[str, float]],
                          batches: Dict[int, Dict[int, Dict[str, float]]], into: Dict[int, Any]) -> None:
        """Each epoch's checkpoint of train.py evaluated uncompiled against its logged evaluation, ``into`` the
        results, a line each."""
        tc = timm_train_check
        for epoch, logged in compiled.items():
            eager = tc.evaluate_uncompiled(tc.epoch_checkpoint(run, epoch), data, self.s.device, self.s.batch_size)
            v = tc.verdict(logged, eager, batches.get(epoch))
            into[epoch] = {'compiled': logged, 'eager': eager, 'verdict': v}
            said = {True: 'RIGHT', False: 'WRONG', None: 'NO VERDICT (the eager loss is not finite)'}[v['right']]
            self.log(f'its evaluation of epoch {epoch}, compiled: top-1 {logged["top1"]:.2f} %, loss '
                     f'{logged["loss"]:.4f}; that checkpoint uncompiled: top-1 {eager["top1"]:.2f} %, loss '
                     f'{eager["loss"]:.4f} ({eager["images"]} images): {said} (top-1 '
                     f'{v["top1_diff_points"]:+.2f} points, loss {v["loss_relative_diff"]:.2%} apart; the batches '
                     f'train.py logged alone, {v["batches_compared"]}: wrong {v["wrong_batches"] or "none"})')

    # ---- section 7: the zoo

    def zoo(self) -> None:
        flags = self.usable_speed_flags('the zoo')
        if flags is None:
            return
        with tempfile.TemporaryDirectory(prefix='zoo-') as tmp:
            self._zoo(Path(tmp), flags)

    def _zoo(self, out: Path, flags: List[str]) -> None:
        reproduction = Reproduction(out, self.s.zoo_profile, data_dir=None if self.smoke else self.data_dir,
                                    epochs=self.s.zoo_epochs, train_args=flags)
        reproduction.tag_output = self.zoo_parallel > 1  # the trainings' lines interleave in zoo_train.log
        self.log(f'the {self.s.zoo_profile!r} profile\'s stages in {out}, {self.zoo_parallel} at a time, training '
                 f'arguments {" ".join(flags)}; their output: zoo_train.log')
        stage_s: Dict[str, float] = {}
        t0 = time.time()
        # until the five stages end: what finished, so that a run killed meanwhile says it (goals after each stage)
        self.log.results['zoo'] = {'minutes': None, 'started': t0, 'stage_s': stage_s, 'profile': self.s.zoo_profile}

        def train(model, **kwargs):
            started = time.time()
            reproduction.train(model, **kwargs)
            with self.log.lock:  # Log.save writes the results out meanwhile
                stage_s[model] = round(time.time() - started, 1)
            goals(self.log, True, final=False)

        # the budget's end stops the trainings: the zoo's goal then says what finished
        deadline = threading.Timer(max(self.budget.left(), 0), reproduction.stop)
        deadline.start()
        try:
            with redirect_fds(self.log.out / 'zoo_train.log'):
                with ThreadPoolExecutor(self.zoo_parallel) as pool:
                    list(pool.map(train, TRAINED_MODELS))
                trained = time.time() - t0
                pruned = reproduction.prune()
                train(PRUNED_MODEL, initial_checkpoint=pruned)
        except StageStopped as e:
            self.log(f'the zoo: stopped at the budget\'s end ({e}); finished: {stage_s or "none"}')
            return
        finally:
            deadline.cancel()
        total = time.time() - t0
        kept = {row['model']: row for row in csv.DictReader(KEPT_TABLE.read_text().splitlines())}
        rows = []
        for model in (*TRAINED_MODELS, PRUNED_MODEL):
            meta = read_checkpoint(reproduction.run_dir(model) / 'last.pth.tar').meta
            history = meta.get('history', [])
            rows.append({'model': model, 'stage_s': stage_s.get(model), 'epochs': meta.get('epoch'),
                         'train_s': round(sum(h.get('train_time', 0.) for h in history), 1),
                         'top1_run': round(meta['metrics']['top1'], 2),
                         'top1_kept': float(kept[model]['top1']) if model in kept else None})
        self.log(f'the five stages: {total / 60:.2f} device minutes (the four trainings {trained / 60:.2f}, then '
                 f'pruning with its CPU evaluation and the fine-tuning), compile included')
        self.log('| model | stage wall s | epochs | epochs\' train s | top-1 % (run\'s evaluation) | kept top-1 % |')
        self.log('|---|---:|---:|---:|---:|---:|')
        for r in rows:
            self.log(f'| {r["model"]} | {r["stage_s"]} | {r["epochs"]} | {r["train_s"]} | {r["top1_run"]:.2f} | '
                     f'{r["top1_kept"]} |')
        result = {'minutes': round(total / 60, 3), 'trainings_minutes': round(trained / 60, 3), 'rows': rows,
                  'train_args': flags, 'profile': self.s.zoo_profile}
        self.log.results['zoo'] = result
        self.log.save()
        if self.budget.left() < self.budget.expected(120):
            self.log(f'the results table (float32, CPU): skipped: budget ({self.budget.left():.0f} s left)')
            return
        table = reproduction.table(quiet=True)
        for row in table:
            self.log(f'  {row["model"]}: top-1 {row["top1"]:.2f} % float32 (kept table: '
                     f'{kept.get(row["model"], {}).get("top1", "-")}), training {row["train_minutes"]:.2f} min, '
                     f'{row["amp"]}')
        shutil.copy(out / 'results.md', self.log.out / 'zoo_results.md')
        result['table'] = table


def trace_summary(trace: Dict[str, Any], steps: int = 1, top: int = 12) -> Dict[str, Any]:
    """A Chrome trace of ``steps`` steps: the GPU's busy time per step (the union of kernel, copy and memset
    intervals), the window from the first kernel's start to the last one's end (device kernels only: CPU events may
    carry a later profiler session's misplaced first timestamps), counts and the top kernels over all steps."""
    events = [e for e in trace.get('traceEvents', []) if e.get('ph') == 'X']
    gpu = [e for e in events if e.get('cat') in ('kernel', 'gpu_memcpy', 'gpu_memset')]
    kernel_events = [e for e in gpu if e.get('cat') == 'kernel']
    busy, end = 0.0, float('-inf')
    for e in sorted(gpu, key=lambda e: e['ts']):
        start, stop = e['ts'], e['ts'] + e.get('dur', 0)
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    kernels: Dict[str, List[float]] = {}
    for e in kernel_events:
        entry = kernels.setdefault(e['name'], [0.0, 0])
        entry[0] += e.get('dur', 0) / 1000
        entry[1] += 1
    window = kernel_events and (max(e['ts'] + e.get('dur', 0) for e in kernel_events)
                                - min(e['ts'] for e in kernel_events))
    return {
        'steps': steps, 'gpu_busy_ms': busy / 1000 / steps, 'window_ms': (window or 0) / 1000,
        'kernels': len(kernel_events),
        'memcpy': sum(1 for e in gpu if e.get('cat') == 'gpu_memcpy'),
        'memset': sum(1 for e in gpu if e.get('cat') == 'gpu_memset'),
        'cpu_ops': sum(1 for e in events if e.get('cat') == 'cpu_op'),
        'graph_launches': sum(1 for e in events if e.get('name', '').startswith('cudaGraphLaunch')),
        'top_kernels': sorted(((n, (round(t, 4), c)) for n, (t, c) in kernels.items()), key=lambda kv: -kv[1][0])[:top],
    }


def trace_problems(summary: Dict[str, Any], cuda: bool, slack: float = 1.05) -> List[str]:
    """Why a profile of CUDA steps cannot be right: no kernel recorded, the GPU busy longer per step than the
    unprofiled step lasts, or kernels spread wider than the wall time of the steps profiled (``slack``: timing
    noise between the runs); none off CUDA, which records no kernel."""
    if not cuda:
        return []
    problems = []
    if not summary['kernels']:
        problems.append('no kernel recorded (CUPTI gave none)')
    if summary['gpu_busy_ms'] > slack * summary['step_ms_unprofiled']:
        problems.append(f'the GPU busy {summary["gpu_busy_ms"]:.2f} ms per step, longer than the unprofiled step '
                        f'({summary["step_ms_unprofiled"]:.2f} ms): kernel times misreported (CUPTI 13.0 does so '
                        f'for kernels replayed from CUDA graphs)')
    if summary['window_ms'] > slack * summary['profiled_wall_ms']:
        problems.append(f'kernels spread over {summary["window_ms"]:.2f} ms, longer than the profiled steps\' '
                        f'{summary["profiled_wall_ms"]:.2f} ms of wall time: misplaced timestamps (as in a later '
                        f'profiler session of one process)')
    return problems


def epoch_rates(text: str, summary_csv: Path, batch_size: int) -> Dict[str, Any]:
    """Each epoch's images/s from a training run: images (its steps x batch) over the epoch's train time in
    ``summary.csv``, the rate of the log's last ``Train:`` line of that epoch and its ``Epoch N: ... img/s end to
    end`` line (where the trainer writes one)."""
    steps = re.search(r'epochs? of (\d+) steps', text)
    last_rate: Dict[int, float] = {}
    for m in re.finditer(r'Train: (\d+) \[.*?([\d.]+) img/s', text):
        last_rate[int(m.group(1))] = float(m.group(2))
    end_to_end = {int(m.group(1)): float(m.group(2).replace(',', ''))
                  for m in re.finditer(r'Epoch (\d+): ([\d,.]+) img/s end to end', text)}
    epochs = []
    if steps and summary_csv.is_file():
        images = int(steps.group(1)) * batch_size
        for row in csv.DictReader(summary_csv.read_text(encoding='utf-8').splitlines()):
            train_s = float(row['train_time'])
            epochs.append({'epoch': int(row['epoch']), 'images': images, 'train_s': train_s,
                           'img_s': images / train_s, 'log_img_s': last_rate.get(int(row['epoch'])),
                           'end_to_end_img_s': end_to_end.get(int(row['epoch'])),
                           'top1': float(row.get('eval_top1') or 'nan')})
    return {'epochs': epochs}


def cache_counters() -> Dict[str, int]:
    """This process's counts of the two on-disk caches the warm phase fills, inductor's compiled graphs
    (``fxgraph_cache_*``) and AOTAutograd's (``autograd_cache_*``): hits, misses and bypasses. Not inductor's
    in-process ``async_compile_cache_*``, which counts a miss for every Triton kernel loaded, from the cache too."""
    return {f'{group}.{k}': v for group in ('inductor', 'aot_autograd') for k, v in counters[group].items()
            if k.startswith(('fxgraph_cache_', 'autograd_cache_'))}


def format_cache(cache: Dict[str, int]) -> str:
    return ', '.join(f'{k.split(".", 1)[1]} {v}' for k, v in sorted(cache.items())) or 'not used'


def warm_one(check: Check, target: Target) -> Dict[str, Any]:
    """A warm-up process's work: one compiled step of ``target``, which leaves its graphs in inductor's on-disk
    caches; returns its seconds and cache counts."""
    size, mode, role, kind = target
    if role == 'fused' and not check.triton_runs(f'warm {"/".join(target)}'):
        return {'skipped': 'no triton'}
    t0 = time.time()
    check.first_steps(check.runner(size, mode, role), '/'.join(target), 'train' if kind == 'train' else 'inference')
    return {'seconds': round(time.time() - t0, 1), **cache_counters()}


WARM_LINE = 'WARMED '  # a warm-up process's last line: this, then its result as JSON


def warm(check: Check, targets: List[Target], seconds: float, parallel: int, argv: List[str]) -> set:
    """Compile the items' steps beforehand, ``parallel`` processes at a time, each one step of one target, within
    ``seconds``: inductor and AOTAutograd keep what they compile in caches on disk, so the items' first steps load
    their graphs there instead of compiling them one after another on one core (on the CPU, the narrow model's
    first training step: 29.5 s cold, 2.9 s from the cache). The first target is compiled twice, the second time in
    a fresh process: where that finds nothing in the cache, warming cannot help, and it stops. ``argv``: the command
    line of this run (its --smoke and --smoke-backend), which the processes repeat. Returns the targets compiled
    (none where the cache check failed)."""
    log = check.log
    cache_dir = os.environ.get('TORCHINDUCTOR_CACHE_DIR', "inductor's default")
    log(f'\n== warm: {len(targets)} compiled steps of the items below, each in a process of its own, {parallel} at a '
        f'time, within {seconds:.0f} s (TORCHINDUCTOR_CACHE_DIR: {cache_dir})')
    t_start, deadline = time.time(), time.time() + seconds
    # the compile workers shared out; not OMP_NUM_THREADS: the key of a CPU graph holds the thread count
    env = dict(os.environ, PYTHONUNBUFFERED='1',
               TORCHINDUCTOR_COMPILE_THREADS=str(max(1, (os.cpu_count() or 2) // parallel)))
    pending = [(t, False) for t in targets]  # (target, whether it checks the cache)
    running: Dict[Any, Any] = {}
    done: Dict[str, Any] = {}
    took: List[float] = []  # seconds of the steps compiled so far
    verified: Optional[bool] = None
    with tempfile.TemporaryDirectory(prefix='warm-') as tmp:
        def start(target, verify):
            out = Path(tmp) / f'{len(done) + len(running)}-{"-".join(target)}{"-check" if verify else ""}.log'
            cmd = [sys.executable, str(Path(__file__).resolve()), *argv, '--out', str(Path(tmp) / 'out'),
                   '--warm-target', ','.join(target), '--warm-parallel', str(parallel)]
            with open(out, 'w', encoding='utf-8') as f:
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True, preexec_fn=die_with_parent)
            running[proc] = (target, verify, out, time.time())

        try:
            while (pending or running) and time.time() < deadline and verified is not False:
                while pending and len(running) < parallel and may_start(took, time.time(), deadline):
                    start(*pending.pop(0))
                if not running:
                    break
                time.sleep(0.2)
                for proc in [p for p in running if p.poll() is not None]:
                    target, verify, out, t0 = running.pop(proc)
                    text = out.read_text(errors='replace')
                    line = next((x for x in reversed(text.splitlines()) if x.startswith(WARM_LINE)), None)
                    result = None
                    if line and proc.returncode == 0:
                        with contextlib.suppress(ValueError):
                            result = json.loads(line[len(WARM_LINE):])
                    name = '/'.join(target) + (' (again, fresh process: the cache check)' if verify else '')
                    if result is None:
                        log(f'  {name}: FAILED (exit {proc.returncode}); its last lines:')
                        for x in text.splitlines()[-6:]:
                            log(f'    | {x[:200]}')
                    else:
                        cache = {k: v for k, v in result.items() if k not in ('seconds', 'skipped')}
                        if not verify and 'skipped' not in result:
                            took.append(time.time() - t0)
                        said = result.get('skipped') or f'{time.time() - t0:.0f} s'
                        log(f'  {name}: {said}; compile caches: {format_cache(cache)}')
                    done[name] = result
                    if verify and result is None:
                        log('  the cache check did not run to its end: warming goes on unchecked')
                    elif verify:
                        verified = any(v for k, v in result.items() if k.endswith('cache_hit'))
                        if not verified:
                            log('  the cache check found no compiled graph in the cache: warming stops, the items '
                                'compile as before')
                    elif target == targets[0] and result is not None and 'skipped' not in result:
                        pending.insert(0, (target, True))
        finally:
            for proc in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    left = [t for t, verify in pending if not verify] + [t for t, verify, *_ in running.values() if not verify]
    compiled = sum(r is not None and 'skipped' not in r for name, r in done.items() if '(again' not in name)
    check_said = {None: 'not run', True: 'passed', False: 'failed'}[verified]
    cold = ', '.join('/'.join(t) for t in left) if len(left) <= 6 else f'{len(left)} (device_check.json, "warm")'
    log(f'-- warm: {compiled} of {len(targets)} steps compiled in {time.time() - t_start:.0f} s; the cache check: '
        f'{check_said}' + (f'; left cold: {cold}' if left else ''))
    check.log.results['warm'] = {'seconds': round(time.time() - t_start, 1), 'verified': verified,
                                 'done': done, 'left': ['/'.join(t) for t in left]}
    if verified is False:
        return set()
    return {t for t in targets if stored(done.get('/'.join(t)))}


def may_start(took: List[float], now: float, deadline: float) -> bool:
    """Whether the warm phase starts another step: always in the first wave (``took`` empty: no step has ended),
    then only one that would end by the deadline if it took the median of those ended; one killed half-compiled
    would only hold the items back."""
    return not took or now + statistics.median(took) < deadline


def stored(result: Optional[Dict[str, Any]]) -> bool:
    """Whether a warm process's step left its graphs in the on-disk cache: it compiled them (a miss, then saved) or
    found them there, and none bypassed the cache."""
    if not result or 'skipped' in result:
        return False
    return (any(v for k, v in result.items() if k.endswith('fxgraph_cache_miss') or k.endswith('fxgraph_cache_hit'))
            and not any(v for k, v in result.items() if k.endswith('cache_bypass')))


def environment(check: Check) -> None:
    """The versions, the GPU, and its two ceilings measured once (bf16 matmul rate, device-to-device copy)."""
    log, s = check.log, check.s
    env: Dict[str, Any] = {
        'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'), **versions(),
        'sa_vision': getattr(sa_vision, '__version__', '?'), 'cpus': os.cpu_count(), 'device': s.device,
        'smoke': check.smoke,
    }
    if check.device.type == 'cuda':
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, capability=f'{props.major}.{props.minor}', sms=props.multi_processor_count,
                   memory_gb=round(props.total_memory / 2 ** 30, 1), cudnn=torch.backends.cudnn.version())
        with contextlib.suppress(Exception):
            env['nvidia_smi'] = subprocess.run(
                ['nvidia-smi', '--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit',
                 '--format=csv,noheader'], capture_output=True, text=True, timeout=20).stdout.strip()
    for key in ('gpu', 'capability', 'sms', 'memory_gb', 'nvidia_smi', 'torch', 'cuda', 'cudnn', 'triton', 'timm',
                'sa_vision', 'commit', 'python', 'cpus', 'date'):
        if key in env:
            log(f'{key}: {env[key]}')
    env['matmul_bf16_tflops'] = round(sab.matmul_rate(s.matmul_size, iters=10, runs=3, device=check.device,
                                                      dtype=torch.bfloat16) / 1000, 2)
    n = s.copy_mb * 2 ** 20 // 4
    src, dst = torch.randn(n, device=check.device), torch.empty(n, device=check.device)
    dst.copy_(src)
    check.sync()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    check.sync()
    env['copy_gb_s'] = round(10 * 2 * n * 4 / (time.perf_counter() - t0) / 1e9, 1)  # bytes read + written
    del src, dst
    log(f'ceilings: bf16 matmul {s.matmul_size}^3 {env["matmul_bf16_tflops"]} TFLOP/s (random data), '
        f'device copy {env["copy_gb_s"]} GB/s (read + written)')
    log.results['env'] = env


def goals(log: Log, zoo_selected: bool, final: bool = True) -> None:
    """A PASS / MISS line for each goal (UNKNOWN where its measurement did not run), into the JSON and the log: after
    every item too (``final`` False), where the log gets them only when they changed, so that a run killed at any
    point leaves its latest lines (the last ``== goals`` block of the log)."""
    with log.lock:
        verdicts = goal_lines(log.results, zoo_selected)
        log.results['goals'] = verdicts
        if final or verdicts != log.goals_logged:
            log(f'\n== goals{"" if final else " so far"}')
            for line in verdicts:
                log(line)
            log.goals_logged = verdicts
        log.save()


def goal_lines(results: Dict[str, Any], zoo_selected: bool) -> List[str]:
    paired = results.get('paired', {})
    verdicts = []

    def rows_by_role(size, mode):
        return {r['role']: r for r in paired.get(f'{size}/{mode}/train', paired.get(f'{size}/{mode}/both', []))}

    def judge(title, size, peer, min_img_s, min_ratio):
        seen = []
        for mode in MODES:
            rows = rows_by_role(size, mode)
            if 'ours' in rows and peer in rows:
                img_s, ratio = rows['ours']['train_samples_per_sec'], rows[peer]['train_ratio']
                seen.append((img_s >= min_img_s and ratio >= min_ratio, img_s, mode, ratio))
        if not seen:
            line = f'UNKNOWN {title}: not measured'
        else:
            ok, img_s, mode, ratio = max(seen, key=lambda t: (t[0], t[1]))
            others = '; '.join(f'{m}: {i:,.0f} img/s, {r:.2f}x' for _, i, m, r in seen)
            line = f'{"PASS" if ok else "MISS"} {title}: best {mode} {img_s:,.0f} img/s, {ratio:.2f}x ({others})'
        verdicts.append(line)

    judge(f'full-size training >= {FULL_MIN_IMG_S:,} img/s and >= {FULL_MIN_VS_PAPER}x the paper\'s formulation '
          f'compiled the same way', 'full', 'paper', FULL_MIN_IMG_S, FULL_MIN_VS_PAPER)
    judge(f'narrow training >= {NARROW_MIN_IMG_S:,} img/s and >= {NARROW_MIN_VS_VIT}x timm\'s ViT compiled the '
          f'same way', 'narrow', 'vit', NARROW_MIN_IMG_S, NARROW_MIN_VS_VIT)
    if zoo_selected:
        verdicts.append(zoo_goal(results.get('zoo')))
    return verdicts


def zoo_goal(zoo: Optional[Dict[str, Any]]) -> str:
    """The zoo's line: PASS / MISS by its device minutes; MISS with what finished where it did not end."""
    title = f'the five stages <= {ZOO_MAX_MINUTES:g} device minutes, compile included'
    if not zoo:
        return f'UNKNOWN {title}: not measured'
    if zoo.get('minutes') is None:
        finished = ', '.join(f'{m} ({s:.0f} s)' for m, s in zoo['stage_s'].items()) or 'none'
        return (f'MISS {title}: not ended after {(time.time() - zoo["started"]) / 60:.2f} min; stages finished: '
                f'{finished}')
    return f'{"PASS" if zoo["minutes"] <= ZOO_MAX_MINUTES else "MISS"} {title}: {zoo["minutes"]:.2f} min'


def items(check: Check) -> List[Item]:
    """Everything the check does, most important first; each names its section and the compiled steps it needs."""
    c = check
    main3 = ('ours', 'paper', 'vit')

    def pair(section, name, size, mode, roles, estimate, bench='train', key=None):
        return Item(section, name, lambda: c.paired(size, mode, roles, bench, key), estimate,
                    compiled_targets(size, mode, roles, bench))

    def knob(name, alone=False):  # section 10: ours against a copy compiled with one of INDUCTOR_KNOBS
        item = pair(10, f'full-size ours / {name}, reduce-overhead, training', 'full', 'reduce-overhead',
                    ('ours', name), INDUCTOR_KNOB_ESTIMATES_S[name], key=f'inductor/{name}/full/reduce-overhead')
        return dataclasses.replace(item, alone=alone)

    def ours(section, name, run, size, mode, estimate):  # the profile and the sync check: ours, training
        return Item(section, name, run, estimate, compiled_targets(size, mode, ('ours',)))

    def fused(name, size, mode, estimate, bench='train'):
        return Item(8, name, lambda: c.fused_model(size, mode, bench), estimate,
                    compiled_targets(size, mode, ('ours', 'fused'), bench))

    return [
        pair(1, 'full-size, eager', 'full', 'eager', main3, 25, 'both'),
        pair(1, 'narrow, eager', 'narrow', 'eager', main3, 20, 'both'),
        pair(1, 'full-size, reduce-overhead, training', 'full', 'reduce-overhead', main3, 120),
        pair(1, 'narrow, reduce-overhead, training', 'narrow', 'reduce-overhead', main3, 90),
        # a default still to decide, so before the profiles: dense first, the ratio is dense / batch-major
        pair(2, 'full-size dense / dense batch-major, reduce-overhead', 'full', 'reduce-overhead',
             ('dense', 'batchmajor'), 60, key='batchmajor/full/reduce-overhead'),
        pair(2, 'narrow dense / dense batch-major, reduce-overhead', 'narrow', 'reduce-overhead',
             ('dense', 'batchmajor'), 45, key='batchmajor/narrow/reduce-overhead'),
        ours(4, 'profile full-size reduce-overhead',
             lambda: c.profile('full', 'reduce-overhead', 'trace_full_reduce-overhead.json.gz'),
             'full', 'reduce-overhead', 10),
        ours(4, 'profile narrow reduce-overhead',
             lambda: c.profile('narrow', 'reduce-overhead', 'trace_narrow_reduce-overhead.json.gz'),
             'narrow', 'reduce-overhead', 10),
        ours(4, 'profile full-size eager', lambda: c.profile('full', 'eager', None), 'full', 'eager', 10),
        ours(5, 'sync check, eager', lambda: c.sync_check('full', 'eager'), 'full', 'eager', 10),
        ours(5, 'sync check, reduce-overhead', lambda: c.sync_check('full', 'reduce-overhead'), 'full',
             'reduce-overhead', 20),
        Item(6, 'sa-vision-train narrow', lambda: c.train_e2e('narrow'), 80),
        # decided pairs, measured again after the rest of sections 4-6 (CUDA_PROJECT_FIRST and CUDA_DENSE_MIXING,
        # the H100's second run of 2026-11-26)
        pair(2, 'full-size dense / dense projected first, reduce-overhead', 'full', 'reduce-overhead',
             ('dense', 'projfirst'), 60, key='projfirst/full/reduce-overhead'),
        pair(2, 'narrow dense / dense projected first, reduce-overhead', 'narrow', 'reduce-overhead',
             ('dense', 'projfirst'), 45, key='projfirst/narrow/reduce-overhead'),
        # dense first (CUDA's default since the H100 of 2026-11-26; on the CPU the smoke's switch): the ratio is
        # dense / separable
        pair(2, 'full-size dense / separable / sa_gen, reduce-overhead', 'full', 'reduce-overhead',
             ('dense', 'separable', 'gen'), 100, key='dense/full/reduce-overhead'),
        pair(2, 'narrow dense / separable / sa_gen, reduce-overhead', 'narrow', 'reduce-overhead',
             ('dense', 'separable', 'gen'), 70, key='dense/narrow/reduce-overhead'),
        pair(2, 'full-size dense / separable / sa_gen, eager', 'full', 'eager', ('dense', 'separable', 'gen'), 20,
             'both', key='dense/full/eager'),
        pair(2, 'narrow dense / separable / sa_gen, eager', 'narrow', 'eager', ('dense', 'separable', 'gen'), 15,
             'both', key='dense/narrow/eager'),
        Item(6, 'sa-vision-train full-size', lambda: c.train_e2e('full'), 100),
        # the narrow run's optimizer step with torch's default (foreach) in place of the fused one: its pair
        Item(6, 'sa-vision-train narrow, --opt-fused off', lambda: c.train_e2e('narrow', ('--opt-fused', 'off')), 70),
        Item(8, 'full-size layer, fused Triton kernel', lambda: c.fused_layer('full'), 40),
        Item(8, 'narrow layer, fused Triton kernel', lambda: c.fused_layer('narrow'), 30),
        # the tests before the whole model with the kernel: what runs today is checked before what may come
        Item(9, 'the CUDA tests (pytest -m cuda)', c.cuda_tests, 150),
        fused('full-size with / without the fused kernel, eager', 'full', 'eager', 25, 'both'),
        fused('narrow with / without the fused kernel, eager', 'narrow', 'eager', 20, 'both'),
        fused('full-size with / without the fused kernel, reduce-overhead, training', 'full', 'reduce-overhead', 100),
        fused('narrow with / without the fused kernel, reduce-overhead, training', 'narrow', 'reduce-overhead', 70),
        pair(1, 'full-size, default compile, training', 'full', 'default', main3, 70),
        pair(1, 'narrow, default compile, training', 'narrow', 'default', main3, 50),
        ours(5, 'sync check, default compile', lambda: c.sync_check('full', 'default'), 'full', 'default', 10),
        ours(4, 'profile full-size default compile', lambda: c.profile('full', 'default', None), 'full', 'default',
             10),
        pair(3, 'narrow / half-width ResNet18, eager', 'narrow', 'eager', ('ours', 'resnet'), 10, 'both',
             key='resnet/eager'),
        pair(3, 'narrow / half-width ResNet18, reduce-overhead', 'narrow', 'reduce-overhead', ('ours', 'resnet'), 70,
             'both', key='resnet/reduce-overhead'),
        pair(1, 'full-size, reduce-overhead, inference', 'full', 'reduce-overhead', main3, 60, 'inference'),
        pair(1, 'narrow, reduce-overhead, inference', 'narrow', 'reduce-overhead', main3, 45, 'inference'),
        pair(3, 'narrow / half-width ResNet18, default compile', 'narrow', 'default', ('ours', 'resnet'), 40, 'both',
             key='resnet/default'),
        pair(1, 'full-size, default compile, inference', 'full', 'default', main3, 40, 'inference'),
        pair(1, 'narrow, default compile, inference', 'narrow', 'default', main3, 30, 'inference'),
        Item(7, 'the zoo: the cpu profile\'s five stages', c.zoo, 240),
        knob('looped_reductions'),
        pair(11, 'narrow, whole step compiled: ours / timm ViT, reduce-overhead, training', 'narrow', 'reduce-overhead',
             tuple(WHOLE_STEP_ROLES), 100, key='whole_step/narrow/vit'),
        pair(11, 'narrow, ours: whole step / model compiled (fused SGD, foreach SGD), reduce-overhead, training',
             'narrow', 'reduce-overhead', ('ours_step', FUSED_OPTIMIZER_ROLE, 'ours'), 80,
             key='whole_step/narrow/ours'),
        pair(11, 'narrow, ours: compiled autograd / model compiled (both fused SGD), reduce-overhead, training',
             'narrow', 'reduce-overhead', (COMPILED_AUTOGRAD_ROLE, FUSED_OPTIMIZER_ROLE), 60,
             key='compiled_autograd/narrow/ours'),
        Item(12, f'timm\'s train.py, narrow, reduce-overhead, {timm_train_check.EPOCHS} epochs', c.timm_train, 150),
        # last, and only with --section 10 alone: its compile took over 110 s on the H200 (2026-11-27), 300 s expected
        knob('tuned_blocks', alone=True),
    ]


def configure_torch() -> None:
    # every size and mode compiles its own copies of one model class: dynamo's per-code cache must hold them all
    for name, value in (('cache_size_limit', 64), ('recompile_limit', 64), ('accumulated_cache_size_limit', 1024),
                        ('accumulated_recompile_limit', 1024)):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', required=True, type=Path, help='folder of the log, the JSON results and the traces')
    p.add_argument('--smoke', action='store_true', help='the CPU with tiny models and a few steps: seconds')
    p.add_argument('--budget-s', type=float, default=480, help='skip what would end later than this (default 480)')
    p.add_argument('--section', default='all',
                   help=f'comma list of the sections to run, {SECTIONS[0]}-{SECTIONS[-1]} (default all; the zoo, 7, '
                        f'needs its own call)')
    p.add_argument('--data-dir', default=None,
                   help='the folder of Fashion-MNIST\'s four IDX files (sections 6, 7; default data/fashion-mnist, '
                        'unpacked from data/fashion-mnist-xz where only that travelled)')
    p.add_argument('--zoo-parallel', type=int, default=None,
                   help='the zoo\'s four trainings run this many at a time (default 4 on the GPU, 2 in the smoke run)')
    p.add_argument('--smoke-backend', default='eager', choices=('eager', 'inductor'),
                   help='the smoke run\'s torch.compile backend: dynamo\'s eager (default: no C++ compile) or '
                        'inductor (slower; its compile caches are what the warm phase fills)')
    p.add_argument('--warm-s', type=float, default=None,
                   help=f'compile the items\' steps beforehand, in parallel processes, for at most this many seconds '
                        f'(default {WARM_SHARE * 100:.0f} %% of --budget-s on the GPU, none under a budget of '
                        f'{WARM_MIN_BUDGET_S} s or in the smoke run; 0: none)')
    p.add_argument('--warm-parallel', type=int, default=max(1, min(6, (os.cpu_count() or 2) // 2)),
                   help='warm-up processes at a time (default: half the CPUs, at most 6)')
    p.add_argument('--timm-train', default=None, metavar='TRAIN_PY',
                   help='timm\'s train.py (section 12; default .whl/train.py, else $SA_VISION_TIMM_CHECKOUT/train.py)')
    p.add_argument('--warm-target', default=None, help=argparse.SUPPRESS)  # one warm-up process's target
    args = p.parse_args(argv)
    if args.warm_parallel < 1:
        p.error(f'--warm-parallel {args.warm_parallel}: at least 1')
    sections = set(SECTIONS) if args.section == 'all' else {int(x) for x in args.section.split(',') if x.strip()}
    if not sections <= set(SECTIONS):
        p.error(f'--section {args.section!r}: sections are {SECTIONS[0]} to {SECTIONS[-1]}')
    if not args.smoke and not torch.cuda.is_available():
        p.error('no CUDA device: run with --smoke on the CPU')
    if args.data_dir is None:
        args.data_dir = fashion_mnist_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out)
    budget = Budget(args.budget_s)
    configure_torch()
    check = Check(smoke_setting(args.smoke_backend) if args.smoke else gpu_setting(), log, args.data_dir, budget,
                  args.smoke, args.zoo_parallel or (2 if args.smoke else 4))
    check.timm_train_path = args.timm_train
    if args.warm_target:
        if check.device.type == 'cuda':  # the processes side by side share the GPU's memory
            torch.cuda.set_per_process_memory_fraction(0.9 / args.warm_parallel)
        # kernel configs benchmarked while the processes share the GPU are not kept: the items benchmark their own
        # (no part of the compiled graphs' cache key)
        from torch._inductor import config as inductor_config
        inductor_config.autotune_local_cache = False
        print(WARM_LINE + json.dumps(warm_one(check, tuple(args.warm_target.split(',')))), flush=True)
        sys.stderr.flush()
        os._exit(0)  # what it had to leave is on disk: no teardown that could fail or take seconds
    log(f'== sa_vision device check{" (smoke, CPU)" if args.smoke else ""}: sections {sorted(sections)}, budget '
        f'{args.budget_s:.0f} s')

    def stopped() -> None:  # timeout's SIGTERM: the goals as they stand, in the log and the JSON
        log(f'\n== stopped by SIGTERM after {time.time() - budget.start:.0f} s')
        goals(log, 7 in sections)
    with on_sigterm(stopped):
        environment(check)
        log.save()
        selected = [i for i in items(check) if i.section in sections]
        for item in [i for i in selected if i.alone and len(sections) > 1]:
            log(f'\n== [{item.section}] {item.name}: skipped: it runs only with --section {item.section} alone')
            log.results['items'].append({'section': item.section, 'name': item.name, 'status': 'skipped: not alone'})
        selected = [i for i in selected if not i.alone or len(sections) == 1]
        run_items(check, selected, warm_phase(check, selected, args), 7 in sections)
        goals(log, 7 in sections)
        log(f'\n== done in {time.time() - budget.start:.0f} s; files: {", ".join(sorted(os.listdir(args.out)))}')
        log.save()
    return 0


def warm_phase(check: Check, selected: List[Item], args) -> set:
    """The warm phase before the items (:func:`warm`), within ``--warm-s``; by default 30 % of ``--budget-s`` on
    the GPU, none in the smoke run, and none below :data:`WARM_MIN_BUDGET_S`, where the share is too short for the
    processes to end before the cut that kills them."""
    log, budget = check.log, check.budget
    targets = list(dict.fromkeys(t for i in selected for t in i.compiles))
    warm_s = args.warm_s
    if warm_s is None:
        warm_s = 0 if args.smoke or args.budget_s < WARM_MIN_BUDGET_S else WARM_SHARE * args.budget_s
        if targets and not args.smoke and args.budget_s < WARM_MIN_BUDGET_S:
            log(f'\n== warm: skipped: a budget of {args.budget_s:.0f} s is under {WARM_MIN_BUDGET_S} s (the items '
                f'compile for themselves)')
    if not targets or min(warm_s, budget.left()) <= 0:
        return set()
    if check.device.type == 'cuda':
        torch.cuda.empty_cache()  # the ceilings' buffers: the warm-up processes need the memory
    warmed: set = set()
    try:
        warmed = warm(check, targets, min(warm_s, budget.left()), args.warm_parallel,
                      ['--smoke', '--smoke-backend', args.smoke_backend] if args.smoke else [])
    except Exception:  # noqa: BLE001  the items compile for themselves
        log(f'the warm phase FAILED: {traceback.format_exc(limit=-12)}')
    log.save()
    return warmed


def run_items(check: Check, selected: List[Item], warmed_steps: set, zoo_selected: bool) -> None:
    """Each item that its scaled estimate lets fit the time left, in order; the goals after each."""
    log, budget = check.log, check.budget
    for item in selected:
        exit_if_stopped()
        warmed = bool(item.compiles) and set(item.compiles) <= warmed_steps
        expected = budget.expected(item.estimate_s if not check.smoke else 0, warmed)
        if budget.left() < expected or budget.left() <= 0:
            log(f'\n== [{item.section}] {item.name}: skipped: budget ({budget.left():.0f} s left, needs '
                f'~{expected:.0f})')
            log.results['items'].append({'section': item.section, 'name': item.name, 'status': 'skipped: budget'})
            goals(log, zoo_selected, final=False)
            continue
        log(f'\n== [{item.section}] {item.name}  ({time.time() - budget.start:.0f} s in)')
        t0 = time.time()
        try:
            item.run()
            status = 'done'
        except Exception:  # noqa: BLE001  one failing measurement must not cost the others
            status = 'FAILED'
            log(f'FAILED: {traceback.format_exc(limit=-12)}')
        spent = time.time() - t0
        budget.spent.append((item.estimate_s, spent, warmed))
        log(f'-- {status} in {spent:.1f} s')
        log.results['items'].append({'section': item.section, 'name': item.name, 'status': status,
                                     'seconds': round(spent, 1)})
        goals(log, zoo_selected, final=False)

if __name__ == '__main__':
    freeze_at_exit()
    sys.exit(main())
