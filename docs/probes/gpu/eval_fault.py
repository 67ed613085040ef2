""" Where inductor's CUDA evaluation of sa_quadratic_cifar goes wrong (docs/training.md, "Precision and compilation").

On an H100 and an H200 (torch 2.11), the ``gpu-long`` quadratic model's evaluation through its compiled training
module gave logits that are not finite, or a top-1 6 points low, while its training and its weights are right. The
first version of this probe (commit 0083c45, h200_2026-11-26_eval_fault.log) kept the weights of the first epoch
whose compiled logits were not finite: ``h200_2026-11-26_fault/`` (the training's layout; the training fed it
32x32 images).

This version starts from those weights, in a process that trained nothing, and narrows the fault down. On the first
``--images`` Fashion-MNIST test images at 32x32, each way below against the model uncompiled under the same
autocast: top-1, the largest logit difference relative to the largest logit, and how many images get a logit that is
not finite. Each way's error, if it raises one, is kept in its place, and the JSON is written after each part (and
on ``timeout``'s SIGTERM).

* ``default`` / ``reduce-overhead``: the whole model compiled, bf16 autocast: does the fault need a training before
  it (the CUDA graph tree the training's graphs share)? The first version's module "compiled afresh" with CUDA
  graphs took 0.2 s, so dynamo most likely gave it the training's evaluation graph again; here nothing came before.
* ``cudagraphs backend``: no inductor, eager's own kernels recorded and replayed as CUDA graphs: right where
  inductor's code is at fault, and then a fast evaluation to use instead of the eager one (README.md, "What the
  probe decides"). Each way's images/s (a second pass, after the compile) is measured beside eager's.
* ``default, float32``: no autocast;
* ``default, separable``: ``dense_attention(model, False)``, not the dense mixing CUDA takes by default;
* ``default, probabilities eager``: the positional probabilities computed outside the graph
  (``torch.compiler.disable``): the positional part of the graph, or the rest?
* ``probabilities``: each layer's ``position_probs`` compiled alone against eager;
* ``blocks``: each block compiled alone, fed the eager model's activations: the first block that differs.

Then inductor's code (``output_code``) of the smallest graph found wrong goes into the log, and torch's compiler
bisector (``torch._inductor.compiler_bisector``) compiles that graph again and again to name the first backend
that makes it wrong and, within inductor, the pass, lowering or CUDA-graph wrapping and which application of it:
the finding to report to PyTorch, or to work around. ``WRONG`` marks a way whose relative logit difference exceeds
:data:`WRONG_ABOVE` (bf16 rounding alone stays near 1e-2) or that has a logit not finite.

``--part settings`` (after the H200's run of 2026-11-27, h200_2026-11-27_eval_fault_settings.log: the defaults'
first compile of a block wrong, two more compiles of it in the same process right, in a fifth of the time): each of
:data:`SETTINGS` in a process of its own (``--part setting``), inductor's caches off, the whole model compiled and
nothing else, so that its first pass runs kernels new to the process. Two passes over the images against eager,
each batch of the first compared alone, and the images/s: is only the first call of new code wrong (as where an
autotuned kernel that writes an input in place is benchmarked on live buffers), and which setting avoids it at what
speed (:func:`settings_verdict`; README.md, "What the probe decides").

``--smoke``: the CPU, dynamo's ``eager`` backend, bf16 autocast only where the CPU's bf16 products pay (float32
else), 200 images, a fault faked into the whole model's ``default``
way, the second layer's probabilities and the third block, and an error into its ``default, float32`` way; in the
settings part, a fault into the defaults' first call and an error into one setting's process, so that every branch
runs in tests/test_eval_fault.py.

    python3 docs/probes/gpu/eval_fault.py --out $OUT     # on the GPU: 2-4 minutes
    python3 docs/probes/gpu/eval_fault.py --out $OUT --part settings     # about 3 minutes
"""
import argparse
import contextlib
import copy
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, ContextManager, Dict, List, NamedTuple, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_env beside this file, also where a test loads it
from probe_env import fashion_mnist_dir, on_sigterm, redirect_fds, require_timm, sigterm_deferred, versions  # noqa: E402

require_timm()

import torch  # noqa: E402

from sa_vision.errors import freeze_at_exit  # noqa: E402
from sa_vision.io import atomic_write_text  # noqa: E402
from sa_vision.layers import PositionalAttention, dense_attention  # noqa: E402
from sa_vision.reproduce.kept import model_as_trained  # noqa: E402
from sa_vision.train.data import dataset_info  # noqa: E402
from sa_vision.train.datasets import FashionMnistDataset  # noqa: E402
from sa_vision.train.device_data import DeviceEvalLoader  # noqa: E402
from sa_vision.train.runtime import resolve_amp  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
WEIGHTS = Path(__file__).resolve().parent / 'h200_2026-11-26_fault'
WRONG_ABOVE = 0.05  # relative logit difference; bf16 autocast's rounding alone stays near 1e-2
SMOKE_FAULTS = ('default', 'probabilities 1', 'block 2')  # what the smoke run fakes wrong
SMOKE_FIRST_CALL_FAULTS = ('setting defaults', 'setting defaults, again')  # wrong at their first call only
SMOKE_ERRORS = ('default, float32', 'setting emulated precision casts')  # and what it fakes failing
BATCH = 500  # the gpu-long recipe's evaluation batch
# the settings part, each in a process of its own: the defaults twice (is a fresh process always wrong?), then
# settings that would avoid the fault, one inductor knob each, the likeliest first: pointwise kernels compiled with
# one configuration (nothing benchmarked on live buffers: the graph's GELU and residual + LayerNorm kernels write an
# input in place), no kernel writing over its input at all (then a benchmark has nothing to restore), looped
# reductions, no pre-grad passes (what the bisector named), emulated bf16 rounding
SETTINGS = (('defaults', {}), ('defaults, again', {}),
            ('no pointwise autotuning', {'triton.autotune_pointwise': False}),
            ('no in-place buffers', {'inplace_buffers': False}),
            ('looped reductions', {'triton.persistent_reductions': False}),
            ('no pre-grad passes', {'use_pre_grad_passes': False}),
            ('emulated precision casts', {'emulate_precision_casts': True}))
# the smoke run's settings: every branch of the settings part (a first-call fault twice, a setting that holds, one
# whose process fails) in four processes, not seven: each costs the smoke a process start and its imports
SMOKE_SETTINGS = ('defaults', 'defaults, again', 'no pointwise autotuning', 'emulated precision casts')
# and each of their processes evaluates this many images, in two batches (the first-batch check needs a second):
# the smoke checks the probe's branches, which a tenth of the whole-model part's images exercise as well
SMOKE_SETTING_IMAGES = 20
NO_CACHES = {'fx_graph_cache': False, 'autotune_local_cache': False}
SETTING_TIMEOUT_S = 120  # one setting's process: start, data, eager, a compile (about 25 s on the H200)
FAST_EVAL_VS_EAGER = 1.5  # README.md, "What the probe decides": the speed that replaces the uncompiled evaluation


def _faked(fn: Callable, name: str, smoke: bool) -> Callable:
    """``fn``, or in the smoke run for a name in :data:`SMOKE_FAULTS` its result scaled by 1.5 (in
    :data:`SMOKE_FIRST_CALL_FAULTS` only its first call's), for one in :data:`SMOKE_ERRORS` an error."""
    if smoke and name in SMOKE_ERRORS:
        def failing(*args):
            raise RuntimeError(f'{name}: an error the smoke run fakes')
        return failing
    if smoke and name in SMOKE_FIRST_CALL_FAULTS:
        calls = []

        def first_wrong(*args):
            calls.append(1)
            return fn(*args) * (1.5 if len(calls) == 1 else 1)
        return first_wrong
    if not (smoke and name in SMOKE_FAULTS):
        return fn
    return lambda *args: fn(*args) * 1.5


def _compare(reference: torch.Tensor, got: torch.Tensor, targets: Optional[torch.Tensor] = None) -> dict:
    """How ``got`` differs from ``reference`` (same shape): relative largest difference, values not finite, top-1s."""
    got, reference = got.float(), reference.float()
    finite = torch.isfinite(got)
    diff = (got - reference).abs()[finite]
    row = {'rel_diff': (diff.max() / reference.abs().max()).item() if diff.numel() else float('nan'),
           'nonfinite': int((~finite).sum())}
    if targets is not None:
        row['nonfinite_images'] = int((~finite.all(dim=-1)).sum())
        row['top1'] = round(100. * (got.argmax(-1) == targets).float().mean().item(), 2)
        row['top1_eager'] = round(100. * (reference.argmax(-1) == targets).float().mean().item(), 2)
    row['wrong'] = bool(row['nonfinite'] or not row['rel_diff'] <= WRONG_ABOVE)
    return row


def _bf16(args) -> ContextManager:
    """bf16 autocast, as the training evaluated; in the smoke run only where this CPU's bf16 products pay
    (``resolve_amp('auto')`` measures it): without bf16 units they run about 100x slower than float32, and the
    smoke checks the probe, not the precision."""
    return torch.autocast(args.device, torch.bfloat16, enabled=args.bf16)


@torch.no_grad()
def _logits(module, batches, amp: Callable) -> torch.Tensor:
    out = []
    for images in batches:
        with amp():
            out.append(module(images).float())
    return torch.cat(out)


def _images_per_s(module, batches, amp: Callable) -> float:
    """Images/s of a pass over ``batches`` after the one that compiled (and recorded) ``module``."""
    synchronize = torch.cuda.synchronize if batches[0].is_cuda else (lambda: None)
    synchronize()
    start = time.perf_counter()
    _logits(module, batches, amp)
    synchronize()
    return round(sum(len(b) for b in batches) / (time.perf_counter() - start))


@contextlib.contextmanager
def _probabilities_eager():
    """PositionalAttention's probabilities computed outside any compiled graph while active."""
    compiled = PositionalAttention._mixing_probs
    PositionalAttention._mixing_probs = torch.compiler.disable(compiled)
    try:
        yield
    finally:
        PositionalAttention._mixing_probs = compiled


def _whole_model_ways(model, batches, targets, args, log, found: Dict[str, dict]) -> float:
    """The whole model compiled each way, into ``found`` (the result's ``whole_model``) as each ends; returns the
    eager model's images/s."""
    bf16 = lambda: _bf16(args)  # noqa: E731
    fp32 = contextlib.nullcontext
    eager = {'bf16': _logits(model, batches, bf16), 'fp32': _logits(model, batches, fp32)}
    eager_img_per_s = _images_per_s(model, batches, bf16)
    log(f'eager: top-1 {_compare(eager["bf16"], eager["bf16"], targets)["top1"]:.2f} (bf16 autocast), '
        f'{_compare(eager["fp32"], eager["fp32"], targets)["top1"]:.2f} (float32); {eager_img_per_s:,} img/s (bf16)')
    # name, torch.compile's arguments (a backend of its own only on the GPU), autocast, eager reference, context
    # the first three decide (README.md, "What the probe decides"), should the call's time run out
    ways = (('default', {}, bf16, 'bf16', None), ('reduce-overhead', {'mode': 'reduce-overhead'}, bf16, 'bf16', None),
            # eager's own kernels replayed as CUDA graphs, no inductor: the way to a fast evaluation if inductor's
            # code is at fault
            ('cudagraphs backend', {'backend': 'cudagraphs'}, bf16, 'bf16', None),
            ('default, float32', {}, fp32, 'fp32', None),
            ('default, separable', {}, bf16, 'bf16', lambda m: dense_attention(m, False)),
            ('default, probabilities eager', {}, bf16, 'bf16', lambda m: _probabilities_eager()))
    for name, kwargs, amp, reference, context in ways:
        torch._dynamo.reset()
        start, copied = time.time(), copy.deepcopy(model)
        compile_args = {**kwargs, 'backend': args.backend if args.smoke else kwargs.get('backend', args.backend)}
        try:
            with context(copied) if context else contextlib.nullcontext():
                compiled = _faked(torch.compile(copied, **compile_args), name, args.smoke)
                row = _compare(eager[reference], _logits(compiled, batches, amp), targets)
                row['img_per_s'] = _images_per_s(compiled, batches, amp)
        except Exception:  # noqa: BLE001  the other ways still run; the error is this way's finding
            found[name] = {'error': traceback.format_exc(limit=-4), 'wrong': True, 's': round(time.time() - start, 1)}
            log(f'{name}: FAILED: {found[name]["error"]}')
            continue
        found[name] = {**row, 's': round(time.time() - start, 1)}
        log(f'{name}: top-1 {row["top1"]:.2f} (eager {row["top1_eager"]:.2f}), logits {row["rel_diff"]:.2e} apart '
            f'(relative), {row["nonfinite_images"]} images not finite, {row["img_per_s"]:,} img/s '
            f'({found[name]["s"]:.0f} s)' + ('  WRONG' if row['wrong'] else ''))
    return eager_img_per_s


def _block_activations(model, batch, args):
    """Each block's input and output on ``batch``, eager, bf16 autocast (grid-major: H, W, B, D)."""
    inputs, outputs = [], []

    def keep(module, args, out) -> None:  # None: the output stays the block's
        inputs.append(args[0])
        outputs.append(out)
    hooks = [b.register_forward_hook(keep) for b in model.blocks]
    with torch.no_grad(), _bf16(args):
        model(batch)
    for hook in hooks:
        hook.remove()
    return inputs, outputs


def _layer_ways(model, inputs, outputs, args, log, found: Dict[str, List[dict]]) -> None:
    """Each layer's probabilities, and each block fed the eager activations, compiled alone against eager, into
    ``found`` (``{'probabilities': [], 'blocks': []}``)."""
    grid_h, grid_w = inputs[0].shape[:2]

    def compared(reference: torch.Tensor, compiled: Callable, *compiled_args) -> dict:
        try:
            with torch.no_grad(), _bf16(args):
                return _compare(reference, compiled(*compiled_args))
        except Exception:  # noqa: BLE001  the other layers still run; the error is this one's finding
            return {'error': traceback.format_exc(limit=-4), 'wrong': True}

    torch._dynamo.reset()  # the blocks share their code: one compile serves them all
    for i, block in enumerate(model.blocks):
        with torch.no_grad(), _bf16(args):
            eager = block.attn.position_probs(grid_h, grid_w)
        probs = _faked(torch.compile(block.attn.position_probs, backend=args.backend), f'probabilities {i}', args.smoke)
        found['probabilities'].append(compared(eager, probs, grid_h, grid_w))
        whole = _faked(torch.compile(copy.deepcopy(block), backend=args.backend), f'block {i}', args.smoke)
        found['blocks'].append(compared(outputs[i], whole, inputs[i]))
    for kind, rows in found.items():
        log(f'{kind}, each compiled alone: ' + ', '.join(
            f'{i}: ' + ('FAILED' if 'error' in r else f'{r["rel_diff"]:.1e}') + (' WRONG' if r['wrong'] else '')
            for i, r in enumerate(rows)))


@contextlib.contextmanager
def _inductor_settings(settings: Dict[str, object]):
    """inductor's config patched with ``settings`` and its caches off, dynamo's compiled code dropped before, so that
    what compiles inside compiles anew under them."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    torch._dynamo.reset()
    with inductor_config.patch({**NO_CACHES, **settings}), functorch_config.patch(enable_autograd_cache=False):
        yield


@contextlib.contextmanager
def _autotune_record(record: Dict[str, int]):
    """Count, while active, how inductor's Triton autotuner keeps a kernel's in-place arguments from being
    contaminated while it benchmarks configurations: cloned on the device, or, in an inference or backward graph
    whose clones would raise the peak memory (``optimize_mem``), copied to the CPU and restored after each run
    (``CachingAutotuner.copy_args_to_cpu_if_needed``): the path that only evaluation's graphs take, where only
    evaluation is wrong. Nothing is counted where this torch has no such methods."""
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
        to_cpu, clone = CachingAutotuner.copy_args_to_cpu_if_needed, CachingAutotuner.maybe_clone_args
    except (ImportError, AttributeError):
        yield
        return

    # counted beside inductor's own calls, never in their way: a torch whose methods return something else (the GPU
    # image's is older than this CPU's) loses the count, not the setting's run
    def copying(self, *a, **k):
        copies = to_cpu(self, *a, **k)
        with contextlib.suppress(Exception):
            record['benchmarks'] += 1
            record['cpu_copies'] += len(copies)
            record['cpu_copy_bytes'] += sum(c.numel() * c.element_size() for _, c in copies.values())
        return copies

    def cloning(self, exclude, *a, **k):
        cloned = clone(self, exclude, *a, **k)
        with contextlib.suppress(Exception):
            record['clones'] += sum(x is not y for x, y in zip(cloned[0], a))
        return cloned
    record.update(benchmarks=0, cpu_copies=0, cpu_copy_bytes=0, clones=0)
    CachingAutotuner.copy_args_to_cpu_if_needed, CachingAutotuner.maybe_clone_args = copying, cloning
    try:
        yield
    finally:
        CachingAutotuner.copy_args_to_cpu_if_needed, CachingAutotuner.maybe_clone_args = to_cpu, clone


def _one_setting(model, batches, targets, name: str, args, log) -> dict:
    """In this process, which compiled nothing before: the whole model compiled under the setting ``name`` of
    :data:`SETTINGS`, two passes over the images against eager, each batch of the first pass compared alone (is
    only the first call wrong?), and the images/s against eager's. Nothing else compiles in the process, so that the
    first pass runs kernels that are new to it."""
    bf16 = lambda: _bf16(args)  # noqa: E731
    eager = [_logits(model, [b], bf16) for b in batches]
    row = {'eager_img_per_s': _images_per_s(model, batches, bf16), 'autotune': {}}
    with _inductor_settings(dict(SETTINGS)[name]), _autotune_record(row['autotune']):
        compiled = _faked(torch.compile(copy.deepcopy(model), backend=args.backend), f'setting {name}', args.smoke)
        first = [_logits(compiled, [b], bf16) for b in batches]
        row['first_pass_batches_wrong'] = [_compare(e, f)['wrong'] for e, f in zip(eager, first)]
        row['first_pass'] = _compare(torch.cat(eager), torch.cat(first), targets)
        row['second_pass'] = _compare(torch.cat(eager), _logits(compiled, batches, bf16), targets)
        row['img_per_s'] = _images_per_s(compiled, batches, bf16)
    row['vs_eager'] = round(row['img_per_s'] / row['eager_img_per_s'], 2)
    row['right'] = not (row['first_pass']['wrong'] or row['second_pass']['wrong'])
    said = lambda r: f'{r["rel_diff"]:.1e}' + (' WRONG' if r['wrong'] else '')  # noqa: E731
    log(f'setting {name}: first pass {said(row["first_pass"])} (top-1 {row["first_pass"]["top1"]:.2f}, eager '
        f'{row["first_pass"]["top1_eager"]:.2f}; batches wrong: '
        f'{"".join("x" if w else "." for w in row["first_pass_batches_wrong"])}), second pass '
        f'{said(row["second_pass"])}; {row["img_per_s"]:,} img/s, {row["vs_eager"]:.2f}x eager; autotuning: '
        + (', '.join(f'{k} {v}' for k, v in row['autotune'].items()) or 'not recorded'))
    return row


def settings_verdict(rows: Dict[str, dict]) -> dict:
    """What the settings' rows say together (README.md, "What the probe decides"): how often the defaults were
    wrong, at their first batch only or after it too, and, only where the defaults were wrong in this run, the
    other settings right at both passes and at least :data:`FAST_EVAL_VS_EAGER` x eager's speed."""
    done = {n: r for n, r in rows.items() if 'first_pass' in r}
    defaults = [r for n, r in done.items() if n.startswith('defaults')]
    wrong = [r for r in defaults if r['first_pass']['wrong'] or r['second_pass']['wrong']]
    first_call_only = [r for r in wrong if not r['second_pass']['wrong'] and not any(r['first_pass_batches_wrong'][1:])]
    verdict = {'defaults_wrong': f'{len(wrong)} of {len(defaults)}',
               'defaults_first_call_only': f'{len(first_call_only)} of {len(wrong)}',
               'fast_right': [n for n, r in done.items() if wrong and not n.startswith('defaults') and r['right']
                              and r['vs_eager'] >= FAST_EVAL_VS_EAGER]}
    verdict['first_run_fault'] = bool(wrong) and len(first_call_only) == len(wrong)
    return verdict


def _settings_ways(args, log, found: dict, save: Callable[[], None]) -> None:
    """Each of :data:`SETTINGS` by :func:`_one_setting` in a process of its own, into ``found`` (the result's
    ``settings``), saved after each; then :func:`settings_verdict`. The processes write into a folder of their own,
    outside ``--out``: their log's lines and, where one failed, its last words come into ours."""
    import torch._inductor.config as inductor_config
    known = inductor_config.get_config_copy()
    found['rows'] = {}
    for name, settings in SETTINGS:
        if args.smoke and name not in SMOKE_SETTINGS:
            continue
        missing = [k for k in settings if k not in known]
        if missing:
            found['rows'][name] = {'missing': missing}
            log(f'setting {name}: not in this torch ({", ".join(missing)})')
            continue
        start = time.time()
        with tempfile.TemporaryDirectory() as out:
            images = SMOKE_SETTING_IMAGES if args.smoke else args.images
            command = [sys.executable, str(Path(__file__).resolve()), '--part', 'setting', '--setting', name,
                       '--images', str(images), '--out', out, '--weights', str(args.weights)]
            command += (['--smoke'] if args.smoke else []) + (['--data-dir', args.data_dir] if args.data_dir else [])
            try:
                proc = subprocess.run(command, timeout=SETTING_TIMEOUT_S, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
                stderr, returncode = proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as e:
                stderr, returncode = f'stopped after {SETTING_TIMEOUT_S} s: {e.stderr or ""}', None
            result_file, log_file = Path(out) / 'eval_fault.json', Path(out) / 'eval_fault.log'
            child = json.loads(result_file.read_text()) if result_file.is_file() else {}
            child_log = log_file.read_text().splitlines() if log_file.is_file() else []
        row = child.get('setting') or {
            'error': child.get('failed') or '\n'.join(child_log[-20:] + stderr.splitlines()[-20:]) or 'no output',
            'returncode': returncode}
        found['rows'][name] = {**row, 's': round(time.time() - start, 1)}
        said = next((line for line in child_log if line.startswith(f'setting {name}:')), None)
        log(f'setting {name}: FAILED: {row["error"]}' if 'error' in row else
            f'{said} ({found["rows"][name]["s"]:.0f} s)')
        save()
    found.update(settings_verdict(found['rows']))
    log(f'settings: the defaults wrong in {found["defaults_wrong"]} processes, at their first call only in '
        f'{found["defaults_first_call_only"]}' + ('' if found['first_run_fault'] else ' (not a first-run fault)') +
        f'; right at both passes and >= {FAST_EVAL_VS_EAGER}x eager where the defaults were wrong: '
        f'{found["fast_right"] or "none"}')


class SmallestWrong(NamedTuple):
    """The smallest graph found wrong: its name, the eager result, and a call that compiles it anew and runs it."""
    name: str
    reference: torch.Tensor
    compile_and_run: Callable[[], torch.Tensor]


def _smallest_wrong(model, layers: Dict[str, List[dict]], inputs, outputs, args) -> Optional[SmallestWrong]:
    """A layer's probabilities found wrong, else a block (the first of either), else none."""
    wrong = {kind: next((i for i, r in enumerate(rows) if r['wrong']), None) for kind, rows in layers.items()}
    if wrong['probabilities'] is not None:
        i = wrong['probabilities']
        attn, grid = model.blocks[i].attn, inputs[0].shape[:2]
        with torch.no_grad(), _bf16(args):
            reference = attn.position_probs(*grid)
        name = f'probabilities {i}'
        return SmallestWrong(name, reference, lambda: _faked(
            torch.compile(attn.position_probs, backend=args.backend), name, args.smoke)(*grid))
    if wrong['blocks'] is not None:
        i = wrong['blocks']
        name = f'block {i}'
        return SmallestWrong(name, outputs[i], lambda: _faked(
            torch.compile(copy.deepcopy(model.blocks[i]), backend=args.backend), name, args.smoke)(inputs[i]))
    return None


def _whole_model_wrong(model, ways: Dict[str, dict], batch, args) -> Optional[SmallestWrong]:
    """Where no layer or block is wrong alone: the whole model on one batch, in the first of ``default`` and
    ``reduce-overhead`` found wrong (the layers compiled in the default mode only)."""
    mode = next((m for m in ('default', 'reduce-overhead') if ways.get(m, {}).get('wrong')), None)
    if mode is None:
        return None
    with torch.no_grad(), _bf16(args):
        reference = model(batch).float()
    name = f'whole model, {mode}'
    return SmallestWrong(name, reference, lambda: _faked(
        torch.compile(copy.deepcopy(model), backend=args.backend, mode=mode), mode, args.smoke)(batch).float())


def _show_code(graph: SmallestWrong, args, log) -> None:
    """inductor's code of ``graph`` into the log."""
    torch._dynamo.reset()
    torch._logging.set_logs(output_code=True)
    try:
        with torch.no_grad(), _bf16(args):
            graph.compile_and_run()
    finally:
        torch._logging.set_logs(output_code=False)
    log(f'inductor\'s code of {graph.name} is above' if args.backend == 'inductor' else
        f'{graph.name} is the smallest graph found wrong (the {args.backend} backend writes no code)')


def _bisect(graph: SmallestWrong, args, log) -> Optional[dict]:
    """torch's compiler bisector on ``graph``: the first backend (eager, aot_eager, ..., inductor) that makes it
    wrong, and within inductor the subsystem (a pass, a lowering, CUDA graphs) and which of its applications."""
    from torch._inductor.compiler_bisector import CompilerBisector

    def good() -> bool:  # compiled anew each time: the bisector picks the backend and what it turns off
        torch._dynamo.reset()
        with torch.no_grad(), _bf16(args):
            return not _compare(graph.reference, graph.compile_and_run())['wrong']
    start = time.time()
    found = CompilerBisector.do_bisect(good)
    row = None if found is None else {**dataclasses.asdict(found), 's': round(time.time() - start, 1)}
    log(f'compiler bisector on {graph.name}: ' + ('right every way it tried' if row is None else
        f'backend {row["backend"]}, subsystem {row["subsystem"]}, application {row["bisect_number"]}: '
        f'{row["debug_info"]} ({row["s"]:.0f} s)'))
    return row


def run(args, result: dict, save: Callable[[], None]) -> None:
    """The parts in order into ``result``, ``save()`` after each."""
    log = lambda line: print(line, flush=True)  # noqa: E731
    if args.part == 'settings':  # each in a process of its own, which loads what it needs
        result['settings'] = {}
        _settings_ways(args, log, result['settings'], save)
        return
    model = model_as_trained(args.weights).to(args.device).eval()
    cfg, data = model.pretrained_cfg, dataset_info('fashion-mnist')  # the model's cfg is its arch's default's
    split = FashionMnistDataset('test', data_dir=args.data_dir, img_size=32)  # the training's images, padded
    images, targets = split.held_tensors()
    loader = DeviceEvalLoader(images[:args.images], targets[:args.images], args.batch_size, data.mean, data.std,
                              args.device)
    batches = [batch for batch, _ in loader]
    targets = targets[:args.images].to(args.device)
    result.update(weights=str(args.weights), images=len(targets), whole_model={},
                  layers={'probabilities': [], 'blocks': []}, code_shown=None)
    log(f'{cfg["architecture"]} from {args.weights}, as it trained; {len(targets)} test images of 32x32 in batches '
        f'of {args.batch_size} on {args.device}, backend {args.backend}')
    if args.part == 'setting':
        result['setting'] = _one_setting(model, batches, targets, args.setting, args, log)
        return
    result['eager_img_per_s'] = _whole_model_ways(model, batches, targets, args, log, result['whole_model'])
    save()
    inputs, outputs = _block_activations(model, batches[0], args)
    _layer_ways(model, inputs, outputs, args, log, result['layers'])
    save()
    graph = (_smallest_wrong(model, result['layers'], inputs, outputs, args)
             or _whole_model_wrong(model, result['whole_model'], batches[0], args))
    if graph is None:
        log('nothing found wrong: no graph to show or bisect')
        return
    _show_code(graph, args, log)
    result['code_shown'] = graph.name
    save()
    result['bisect'] = _bisect(graph, args, log)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', required=True, type=Path, help='folder of eval_fault.log and eval_fault.json')
    p.add_argument('--weights', type=Path, default=WEIGHTS, help=f'config.json and model.safetensors (default '
                                                                  f'{WEIGHTS.relative_to(ROOT)})')
    p.add_argument('--images', type=int, default=2000, help='test images (default 2000; smoke 200)')
    p.add_argument('--smoke', action='store_true', help='the CPU, dynamo\'s eager backend, faked faults')
    p.add_argument('--data-dir', default=None,
                   help='Fashion-MNIST\'s folder (default data/fashion-mnist, unpacked from data/fashion-mnist-xz '
                        'where only that travelled; the smoke run: where sa_vision finds it)')
    p.add_argument('--part', choices=('all', 'settings', 'setting'), default='all',
                   help='all: the ways, the layers, the code and the bisector; settings: each of SETTINGS in a '
                        'process of its own (setting: that process, with --setting)')
    p.add_argument('--setting', choices=[name for name, _ in SETTINGS], default='defaults',
                   help='--part setting: which')
    args = p.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        p.error('no CUDA device: run with --smoke on the CPU')
    if args.data_dir is None and not args.smoke:
        args.data_dir = fashion_mnist_dir()
    args.device, args.backend = ('cpu', 'eager') if args.smoke else ('cuda', 'inductor')
    args.bf16 = not args.smoke or resolve_amp('auto', 'cpu', matmul_size=(256, 256, 256))[0]
    args.images = min(args.images, 200) if args.smoke else args.images
    args.batch_size = max(1, args.images // 2) if args.smoke else BATCH  # smoke: two batches
    args.out.mkdir(parents=True, exist_ok=True)
    result = {'versions': versions(), 'smoke': args.smoke}

    @sigterm_deferred()
    def save() -> None:
        atomic_write_text(args.out / 'eval_fault.json', json.dumps(result, indent=1, default=str))

    def stopped() -> None:  # timeout's SIGTERM: what was found so far
        result['stopped'] = 'SIGTERM'
        print('== stopped by SIGTERM', flush=True)
        save()

    with redirect_fds(args.out / 'eval_fault.log'), on_sigterm(stopped):
        print(f'== eval fault probe{" (smoke)" if args.smoke else ""}: '
              f'{", ".join(f"{k} {v}" for k, v in versions().items())}', flush=True)
        try:
            run(args, result, save)
        except Exception:  # noqa: BLE001  what was found before comes back with it
            result['failed'] = traceback.format_exc(limit=-8)
            print(f'FAILED: {result["failed"]}', flush=True)
        save()
        if args.part == 'settings':
            settings = result.get('settings', {})
            print(f'== done: first-run fault {settings.get("first_run_fault")}; a fast evaluation with '
                  f'{settings.get("fast_right") or "none"}', flush=True)
        elif args.part == 'setting':
            print(f'== done: {args.setting}', flush=True)
        else:
            wrong = [name for name, row in result.get('whole_model', {}).items() if row.get('wrong')]
            print(f'== done: wrong {wrong or "none"}; code shown: {result.get("code_shown")}', flush=True)
    return 1 if 'failed' in result else 0


if __name__ == '__main__':
    freeze_at_exit()
    sys.exit(main())
