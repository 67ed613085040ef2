""" The GPU device check (docs/probes/gpu/device_check.py) in its CPU smoke mode, its readers, and its two hooks:
``Reproduction(train_args=)`` / ``--train-args`` and the benchmark's compile mode and prebuilt runners
"""
import csv
import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT_S, load_script
from torch import nn

from sa_vision import reproduce
from sa_vision.measure import benchmark as sab
from sa_vision.measure import runner as sar

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'docs' / 'probes' / 'gpu' / 'device_check.py'
MAX_FILES_BACK = 8  # what the device tool brings back from $OUT


dc = load_script(SCRIPT)


def _declared_steps(sections):
    """The compiled steps that the items of ``sections`` say they compile (what the warm phase compiles)."""
    check = dc.Check(dc.smoke_setting(), None, None, dc.Budget(0), True, 1)
    return {'/'.join(t) for item in dc.items(check) if item.section in sections for t in item.compiles}


def _run(out, *args, **env_vars):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1', **env_vars)
    proc = subprocess.run([sys.executable, str(SCRIPT), '--smoke', '--out', str(out), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    log = (out / 'device_check.log').read_text()
    assert 'FAILED' not in log, log[-4000:]
    assert len(os.listdir(out)) <= MAX_FILES_BACK
    return log, json.loads((out / 'device_check.json').read_text())


def test_no_budget_skips_every_section_and_still_reports(tmp_path):
    dc.main(['--smoke', '--budget-s', '0', '--out', str(tmp_path)])
    log = (tmp_path / 'device_check.log').read_text()
    results = json.loads((tmp_path / 'device_check.json').read_text())
    for key in ('torch', 'timm', 'cuda', 'triton'):  # the versions at the top
        assert f'\n{key}: ' in log
    budget = [i for i in results['items'] if i['status'] == 'skipped: budget']
    # all sections asked for: what runs only with its section alone says so instead
    alone = [i for i in results['items'] if i['status'] == 'skipped: not alone']
    assert budget and len(budget) + len(alone) == len(results['items'])
    assert [i['name'] for i in alone] == [i.name for i in dc.items(dc.Check(dc.smoke_setting(), None, None,
                                                                           dc.Budget(0), True, 1)) if i.alone]
    assert {i['section'] for i in results['items']} == set(dc.SECTIONS)
    assert log.count(': skipped: budget') == len(budget)
    assert [g.split()[0] for g in results['goals']] == ['UNKNOWN'] * 3


@pytest.mark.slow
def test_an_item_that_runs_alone_is_left_where_other_sections_are_asked_for(tmp_path):
    """Section 10's tuned copy compiles for minutes: asked for with other sections it is skipped, saying how to run
    it, so that the budget's scale cannot admit it into a call whose timeout would then kill it."""
    dc.main(['--smoke', '--budget-s', '0', '--section', '10,11', '--out', str(tmp_path / 'both')])
    dc.main(['--smoke', '--budget-s', '0', '--section', '10', '--out', str(tmp_path / 'alone')])
    for folder, status in (('both', 'skipped: not alone'), ('alone', 'skipped: budget')):
        items = json.loads((tmp_path / folder / 'device_check.json').read_text())['items']
        assert [i['status'] for i in items if 'tuned_blocks' in i['name']] == [status]
        assert [i['status'] for i in items if 'looped_reductions' in i['name']] == ['skipped: budget']


@pytest.mark.slow
def test_smoke_measures_profiles_and_checks_syncs(tmp_path):
    log, results = _run(tmp_path, '--section', '1,2,3,4,5')
    items = results['items']
    assert items and all(i['status'] == 'done' for i in items)
    assert {i['section'] for i in items} == {1, 2, 3, 4, 5}
    paired = results['paired']
    for size in ('full', 'narrow'):
        for mode in dc.MODES:
            rows = paired[f'{size}/{mode}/both' if mode == 'eager' else f'{size}/{mode}/train']
            assert [r['role'] for r in rows] == ['ours', 'paper', 'vit']
            assert all(r['train_samples_per_sec'] > 0 for r in rows) and rows[1]['train_ratio'] > 0
    # dense first, CUDA's default: the decision reads the [separable] row's ratio to it
    assert [r['model'] for r in paired['dense/full/reduce-overhead']] == [
        'sa_quadratic_cifar[dense]', 'sa_quadratic_cifar[separable]', 'sa_gen_cifar']
    for size in ('full', 'narrow'):  # dense first: the decisions read the other row's ratio to it
        assert [r['model'] for r in paired[f'projfirst/{size}/reduce-overhead']] == [
            'sa_quadratic_cifar[dense]', 'sa_quadratic_cifar[projfirst]']
        assert [r['model'] for r in paired[f'batchmajor/{size}/reduce-overhead']] == [
            'sa_quadratic_cifar[dense]', 'sa_quadratic_cifar[batch-major]']
    assert [r['model'] for r in paired['resnet/reduce-overhead']] == ['sa_quadratic_cifar', 'resnet18_cifar']
    # the compiled steps ran through torch.compile (dynamo's eager backend in the smoke run)
    assert 'first train steps (compile included)' in log
    assert set(results['profile']) == {'full/reduce-overhead', 'narrow/reduce-overhead', 'full/eager', 'full/default'}
    with gzip.open(tmp_path / 'trace_full_reduce-overhead.json.gz') as f:
        steps = [e for e in json.load(f)['traceEvents'] if e.get('name', '').startswith('ProfilerStep#')]
    assert len(steps) == dc.PROFILED_STEPS  # the schedule's recorded steps only, not its skipped and warm-up ones
    assert len(results['sync']) == 3
    # every compiled step the items ran is one they declare, so the warm phase compiles what they need
    assert set(results['compile_cache']) == _declared_steps({1, 2, 3, 4, 5})
    # and dynamo compiled each whole
    assert set(results['graph_breaks']) == _declared_steps({1, 2, 3, 4, 5})
    assert not any(results['graph_breaks'].values()) and 'GRAPH BREAK' not in log
    # tiny models on a CPU reach no goal: each is judged, none passes
    assert [g.split()[0] for g in results['goals']] == ['MISS', 'MISS']


@pytest.mark.slow
def test_smoke_trains_end_to_end_and_the_zoo_or_says_why_not(tmp_path):
    log, results = _run(tmp_path, '--section', '6,7')
    from sa_vision.train.args import build_parser  # what sa-vision-train --help prints
    if not all(flag in build_parser().format_help() for flag in ('--device-data', '--torchcompile-mode')):
        reason = 'skipped: sa-vision-train --help does not list'
        assert log.count(reason) == 3, log  # two trainings, the zoo
        return
    for size in ('full', 'narrow', 'narrow --opt-fused off'):
        run = results['train_e2e'][size]
        assert run['status'] == 0 and run['epochs'] and all(e['img_s'] > 0 for e in run['epochs'])
    zoo = results['zoo']
    assert [r['model'] for r in zoo['rows']] == [*reproduce.TRAINED_MODELS, reproduce.PRUNED_MODEL]
    assert all(0 <= r['top1_run'] <= 100 for r in zoo['rows'])
    # while the zoo ran, the goals after each stage said what had finished (a run killed then keeps that line)
    assert re.search(r'MISS the five stages .*: not ended after [\d.]+ min; stages finished: \w', log), log[-3000:]
    assert (tmp_path / 'zoo_results.md').is_file() and (tmp_path / 'zoo_train.log').is_file()


@pytest.mark.slow
def test_smoke_runs_the_fused_kernel_section(tmp_path):
    """Section 8 on the CPU: the Triton kernel in the interpreter, at tiny sizes: one layer against the batched
    path, then the whole model with and without it (same weights), eager and reduce-overhead."""
    _, results = _run(tmp_path, '--section', '8')
    for size in ('full', 'narrow'):
        run = results['fused_layer'][size]
        assert run['ms']['batched'] > 0 and run['ms']['fused'] > 0
        assert run['max_abs_difference_over_max'] < 0.05  # bf16 rounding of the same sums
    for key in ('fused/full/eager/both', 'fused/narrow/eager/both', 'fused/full/reduce-overhead/train',
                'fused/narrow/reduce-overhead/train'):
        ours, fused = results['paired'][key]
        assert (ours['role'], fused['role']) == ('ours', 'fused'), key
        assert (ours['model'], fused['model']) == ('sa_quadratic_cifar', 'sa_quadratic_cifar[fused]'), key
        assert ours['param_count'] == fused['param_count'] and fused['train_ratio'] > 0, key
    assert [i['status'] for i in results['items']] == ['done'] * 6
    assert set(results['compile_cache']) == _declared_steps({8})


@pytest.mark.slow
def test_smoke_runs_the_inductor_settings_section_and_each_copy_compiles_with_its_settings(tmp_path):
    """Section 10: ours against copies of it (same weights), each compiled with its inductor settings. Each copy
    compiles graphs of its own: a copy of a compiled model otherwise reuses the first one's graphs, as the H200's
    first run of this section did (compile caches: not used), which would time ours three times."""
    _, results = _run(tmp_path / 'out', '--section', '10', '--smoke-backend', 'inductor',
                      TORCHINDUCTOR_CACHE_DIR=str(tmp_path / 'inductor'))
    for knob in dc.INDUCTOR_KNOBS:  # an item each, so that a slow compile loses only its own row
        rows = results['paired'][f'inductor/{knob}/full/reduce-overhead']
        assert [r['role'] for r in rows] == ['ours', knob]
        assert rows[0]['param_count'] == rows[1]['param_count'] and rows[1]['train_ratio'] > 0
    assert [i['status'] for i in results['items']] == ['done'] * len(dc.INDUCTOR_KNOBS)
    assert set(results['compile_cache']) == _declared_steps({10})
    for label, cache in results['compile_cache'].items():  # a compile of its own looks up inductor's caches
        assert cache.get('inductor.fxgraph_cache_miss', 0) >= 1, (label, cache)
    family = dc.Check(dc.smoke_setting(), None, None, dc.Budget(0), True, 1).family('full', 'reduce-overhead')
    for knob, settings in dc.INDUCTOR_KNOBS.items():
        assert family[knob].compile_options == settings
        assert torch.equal(next(family[knob].model.parameters()), next(family['ours'].model.parameters()))


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(torch._dynamo.config, 'trace_autograd_ops'), reason='torch without trace_autograd_ops')
def test_smoke_runs_the_whole_step_section_with_the_backward_in_the_graph(tmp_path):
    """Section 11: the narrow step compiled whole, ours against timm's ViT compiled the same way and against ours
    with the model alone compiled; the whole steps break only around the optimizer step (torch.optim's own), never
    at ``loss.backward()``, and each copy has its base's weights."""
    _, results = _run(tmp_path, '--section', '11')
    assert [r['role'] for r in results['paired']['whole_step/narrow/vit']] == list(dc.WHOLE_STEP_ROLES)
    assert [r['role'] for r in results['paired']['whole_step/narrow/ours']] == [
        'ours_step', dc.FUSED_OPTIMIZER_ROLE, 'ours']
    assert [r['role'] for r in results['paired']['compiled_autograd/narrow/ours']] == [
        dc.COMPILED_AUTOGRAD_ROLE, dc.FUSED_OPTIMIZER_ROLE]
    assert [i['status'] for i in results['items']] == ['done', 'done', 'done']
    assert set(results['compile_cache']) == _declared_steps({11})
    for label, breaks in results['graph_breaks'].items():
        whole = any(f'/{role}/' in label for role in dc.WHOLE_STEP_ROLES)
        assert sum(breaks.values()) == (2 if whole else 0), (label, breaks)
        assert not any('backward' in reason for reason in breaks), (label, breaks)
    family = dc.Check(dc.smoke_setting(), None, None, dc.Budget(0), True, 1).family('narrow', 'reduce-overhead')
    for role, base in dc.WHOLE_STEP_ROLES.items():
        assert family[role].whole_step and not family[base].whole_step
        assert torch.equal(next(family[role].model.parameters()), next(family[base].model.parameters()))
    fused, ca = family[dc.FUSED_OPTIMIZER_ROLE], family[dc.COMPILED_AUTOGRAD_ROLE]
    assert fused.fused_optimizer and not fused.whole_step and not family['ours'].fused_optimizer
    assert ca.fused_optimizer and ca.compiled_autograd and not fused.compiled_autograd and not ca.whole_step
    for copied in (fused, ca):
        assert torch.equal(next(copied.model.parameters()), next(family['ours'].model.parameters()))


def test_a_whole_step_that_breaks_elsewhere_or_skips_cuda_graphs_is_not_timed():
    """The whole step's first steps may break the graph only where torch.optim does, twice; a break at
    ``loss.backward()`` (a dynamo that does not trace it) or a CUDA-graph skip fails the item instead of timing a
    different step."""
    optim = 'Call to `torch._dynamo.graph_break()`\n  Explanation: User-inserted graph break.'
    backward = 'Unsupported Tensor.backward() call\n  Explanation: Dynamo currently does not support tracing'
    assert dc.whole_step_problem({optim: 2}, 0) is None
    assert 'Unsupported Tensor.backward() call' in dc.whole_step_problem({optim: 2, backward: 1}, 0)
    assert 'did not compile whole' in dc.whole_step_problem({optim: 3}, 0)
    assert 'without CUDA graphs' in dc.whole_step_problem({optim: 2}, 1)


def test_a_compiled_autograd_step_that_captured_nothing_broke_or_skipped_cuda_graphs_is_not_timed():
    assert dc.compiled_autograd_problem(1, {}, 0) is None
    assert 'captured no backward' in dc.compiled_autograd_problem(0, {}, 0)
    assert 'graph breaks: 1, first: Unsupported' in dc.compiled_autograd_problem(1, {'Unsupported x\nmore': 1}, 0)
    assert 'without CUDA graphs' in dc.compiled_autograd_problem(1, {}, 2)


@pytest.mark.parametrize('check, role, expected', [
    pytest.param('whole_step_problem', 'ours_step', 2,  # the graph breaks dynamo counted: torch.optim's two
                 marks=pytest.mark.skipif(not hasattr(torch._dynamo.config, 'trace_autograd_ops'),
                                          reason='torch without trace_autograd_ops')),
    ('compiled_autograd_problem', dc.COMPILED_AUTOGRAD_ROLE, 1),  # the captures compiled autograd made
], ids=['whole-step', 'compiled-autograd'])
def test_the_first_steps_of_a_checked_runner_are_checked_and_only_theirs(tmp_path, monkeypatch, check, role, expected):
    """A whole-step or compiled-autograd runner's first training steps go through its check, with what they
    counted, and a problem stops the pair; the model-compiled runners are not checked."""
    seen = []

    def problem(counted, *rest):
        seen.append(sum(counted.values()) if isinstance(counted, dict) else counted)
        return 'a problem'
    monkeypatch.setattr(dc, check, problem)
    checker = dc.Check(dc.smoke_setting(), dc.Log(tmp_path), None, dc.Budget(60), True, 1)
    checker.paired('narrow', 'reduce-overhead', ('ours', dc.FUSED_OPTIMIZER_ROLE))
    assert seen == []
    with pytest.raises(RuntimeError, match='a problem'):
        checker.paired('narrow', 'reduce-overhead', (role, 'ours'))
    assert seen == [expected]


def test_compile_options_keep_the_mode_and_add_the_settings():
    """torch.compile takes a mode or options, not both: a variant with settings compiles with the mode's own
    options (CUDA graphs for reduce-overhead) and its settings."""
    assert sar._compile_how('reduce-overhead', None) == {'mode': 'reduce-overhead'}
    assert sar._compile_how('reduce-overhead', {'coordinate_descent_tuning': True}) == {
        'options': {'triton.cudagraphs': True, 'coordinate_descent_tuning': True}}
    assert sar._compile_how(None, {'coordinate_descent_tuning': True}) == {
        'options': {'coordinate_descent_tuning': True}}


def test_items_that_compile_cold_are_not_admitted_on_the_pace_of_warmed_ones():
    """The warm phase makes its items beat their estimates (which count a compilation): an item that compiles for
    itself is never expected to take less than its estimate because of them, while warmed items scale by their own."""
    budget = dc.Budget(600)
    budget.spent = [(100, 30, True)]  # a warmed item, 0.3x its estimate
    assert budget.expected(100, warmed=False) == 100
    assert budget.expected(100, warmed=True) == 50  # scaled, at most by 0.5
    budget.spent.append((100, 200, False))  # a cold one, 2x
    assert budget.expected(50, warmed=False) == 100 and budget.expected(100, warmed=True) == 50
    cold_only = dc.Budget(600, spent=[(100, 60, False)])
    assert cold_only.expected(100, warmed=True) == pytest.approx(60)  # no warmed item yet: the cold items' pace
    assert cold_only.expected(100, warmed=False) == pytest.approx(60)


def test_warm_phase_starts_no_step_it_expects_to_be_killed():
    assert dc.may_start([], now=99, deadline=100)  # the first wave starts whatever the time
    assert dc.may_start([10, 30, 20], now=0, deadline=25)  # the median, 20 s, ends before the deadline
    assert not dc.may_start([10, 30, 20], now=6, deadline=25)


def test_a_warm_step_counts_as_warmed_only_where_its_graphs_went_into_the_cache():
    assert dc.stored({'seconds': 30, 'inductor.fxgraph_cache_miss': 2, 'aot_autograd.autograd_cache_miss': 1})
    assert dc.stored({'seconds': 3, 'inductor.fxgraph_cache_hit': 2})  # already there
    assert not dc.stored({'seconds': 30, 'inductor.fxgraph_cache_miss': 1, 'inductor.fxgraph_cache_bypass': 1})
    assert not dc.stored({'seconds': 30, 'aot_autograd.autograd_cache_bypass': 1})  # the graphs were not cached
    assert not dc.stored({'seconds': 1})  # compiled nothing (dynamo's eager backend)
    assert not dc.stored({'skipped': 'no triton'}) and not dc.stored(None)


@pytest.mark.slow
def test_warm_phase_fills_the_compile_caches_that_the_items_then_load(tmp_path):
    """With inductor (C++ on the CPU), the warm phase compiles the items' steps in processes of their own; the items'
    first steps then find every graph in the on-disk caches and compile none."""
    cache = tmp_path / 'inductor-cache'
    # section 5 (the sync checks): two steps, one per warm process, so one round of cold C++ compiles (section 4's
    # three took two rounds and ~26 s more on a CI core)
    log, results = _run(tmp_path / 'out', '--section', '5', '--smoke-backend', 'inductor', '--warm-s', '600',
                        '--warm-parallel', '2', TORCHINDUCTOR_CACHE_DIR=str(cache))
    warm = results['warm']
    assert warm['verified'] is True and warm['left'] == [], log[-3000:]
    compiled = {k: v for k, v in warm['done'].items() if '(again' not in k}
    assert set(compiled) == _declared_steps({5}) and len(compiled) == 2
    assert all(v.get('inductor.fxgraph_cache_miss', 0) > 0 for v in compiled.values())  # each compiled, cold
    steps = results['compile_cache']
    assert set(steps) == set(compiled)
    for name, counts in steps.items():
        assert counts.get('inductor.fxgraph_cache_hit', 0) > 0, (name, counts)
        assert not any(k.endswith('cache_miss') for k in counts), (name, counts)


@pytest.mark.slow
def test_warm_phase_stops_where_a_fresh_process_finds_nothing_in_the_cache(tmp_path):
    """Dynamo's eager backend caches nothing on disk: the second process compiling the first step finds nothing,
    and the warm phase stops there, leaving the rest to the items."""
    log, results = _run(tmp_path / 'out', '--section', '4', '--warm-s', '600', '--warm-parallel', '1',
                        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / 'inductor-cache'))
    warm = results['warm']
    assert warm['verified'] is False, log[-3000:]
    assert warm['left'] == ['narrow/reduce-overhead/ours/train', 'full/default/ours/train']  # one at a time
    assert 'warming stops' in log
    assert [i['status'] for i in results['items']] == ['done'] * 4


@pytest.mark.slow
def test_smoke_runs_the_cuda_tests_section(tmp_path):
    """Section 9 on the CPU: pytest selects the CUDA cases of one file, which skip here; the log has pytest's tally."""
    log, results = _run(tmp_path, '--section', '9')
    run = results['cuda_tests']
    assert run['status'] == 0 and run['failed'] == []
    assert re.fullmatch(r'\d+ skipped, \d+ deselected in [\d.]+s', run['summary']), run['summary']
    assert (tmp_path / 'cuda_tests.log').is_file() and run['summary'] in log


def test_trace_summary_counts_gpu_busy_time_once_where_kernels_overlap():
    trace = {'traceEvents': [
        {'ph': 'X', 'cat': 'cpu_op', 'name': 'aten::mm', 'ts': -5000, 'dur': 50},  # a misplaced first timestamp
        {'ph': 'X', 'cat': 'cuda_runtime', 'name': 'cudaGraphLaunch', 'ts': 1, 'dur': 2},
        {'ph': 'X', 'cat': 'kernel', 'name': 'gemm', 'ts': 10, 'dur': 10},
        {'ph': 'X', 'cat': 'kernel', 'name': 'softmax', 'ts': 15, 'dur': 10},  # overlaps gemm by 5 us
        {'ph': 'X', 'cat': 'gpu_memcpy', 'name': 'Memcpy DtoD', 'ts': 40, 'dur': 4},
        {'ph': 'X', 'cat': 'kernel', 'name': 'gemm', 'ts': 90, 'dur': 10},
        {'ph': 'X', 'cat': 'gpu_memset', 'name': 'Memset', 'ts': 120, 'dur': 2},  # after the last kernel
        {'ph': 'i', 'cat': 'kernel', 'name': 'marker', 'ts': 200},  # an instant event, not an interval
    ]}
    s = dc.trace_summary(trace, steps=2)
    assert s['gpu_busy_ms'] == pytest.approx((15 + 4 + 10 + 2) / 1000 / 2)  # [10, 25], [40, 44], [90, 100], [120, 122]
    assert s['window_ms'] == pytest.approx(90 / 1000)  # the kernels' first start to their last end
    assert (s['kernels'], s['memcpy'], s['memset'], s['cpu_ops'], s['graph_launches']) == (3, 1, 1, 1, 1)
    assert s['top_kernels'][0] == ('gemm', (0.02, 2))


def test_a_trace_that_cannot_be_right_is_named_and_not_raised():
    good = {'kernels': 40, 'gpu_busy_ms': 2.0, 'step_ms_unprofiled': 2.5, 'window_ms': 5.5, 'profiled_wall_ms': 6.0}
    assert dc.trace_problems(good, cuda=True) == []
    assert dc.trace_problems({**good, 'kernels': 0, 'gpu_busy_ms': 0.0}, cuda=True) == [
        'no kernel recorded (CUPTI gave none)']
    (busy,) = dc.trace_problems({**good, 'gpu_busy_ms': 3.0}, cuda=True)
    assert 'GPU busy 3.00 ms per step, longer than the unprofiled step (2.50 ms)' in busy
    (spread,) = dc.trace_problems({**good, 'window_ms': 60.0}, cuda=True)
    assert 'spread over 60.00 ms, longer than the profiled steps\' 6.00 ms' in spread
    assert dc.trace_problems({**good, 'kernels': 0}, cuda=False) == []  # the CPU records no kernel


def test_epoch_rates_are_an_epochs_images_over_its_train_time(tmp_path):
    text = ('Run folder x; 2 epochs of 10 steps, 1 process(es) on cuda, amp=bfloat16\n'
            'Train: 0 [   5/10 ( 50%)]  Loss: 2.30 (2.30)  LR: 1.000e-03     12.5 img/s  ETA 1s\n'
            'Train: 0 [  10/10 (100%)]  Loss: 2.20 (2.25)  LR: 1.000e-03   1234.5 img/s  ETA 1s\n'
            'Epoch 0: 1,100 img/s end to end (data on the device, evaluation apart)\n'
            'Train: 1 [  10/10 (100%)]  Loss: 2.10 (2.15)  LR: 1.000e-03  20000.0 img/s  ETA 0s\n')
    summary = tmp_path / 'summary.csv'
    with open(summary, 'w', encoding='utf-8', newline='') as f:
        writer = csv.DictWriter(f, ['epoch', 'train_loss', 'train_lr', 'train_time', 'eval_top1'])
        writer.writeheader()
        writer.writerows([{'epoch': 0, 'train_time': 8.0, 'eval_top1': 50.0},
                          {'epoch': 1, 'train_time': 0.5, 'eval_top1': 60.0}])
    epochs = dc.epoch_rates(text, summary, batch_size=128)['epochs']
    assert [(e['images'], e['img_s'], e['log_img_s'], e['end_to_end_img_s']) for e in epochs] == [
        (1280, 160.0, 1234.5, 1100.0), (1280, 2560.0, 20000.0, None)]
    # a run of one epoch says 'epoch', as the trainer writes it
    one = text.replace('2 epochs of', '1 epoch of')
    assert [e['images'] for e in dc.epoch_rates(one, summary, batch_size=128)['epochs']] == [1280, 1280]


def test_goals_pass_only_where_one_mode_meets_both_bounds(tmp_path):
    log = dc.Log(tmp_path)

    def rows(ours, peer_role, ratio):
        return [{'role': 'ours', 'train_samples_per_sec': ours}, {'role': peer_role, 'train_ratio': ratio}]
    log.results['paired'] = {
        # the brief's bounds: full >= 15,000 img/s and >= 1.5x the paper; narrow >= 25,000 img/s and >= 1.2x ViT
        'full/eager/both': rows(4_000, 'paper', 2.0),
        'full/reduce-overhead/train': rows(16_000, 'paper', 1.49),  # fast enough, too little over the paper
        'narrow/default/train': rows(24_000, 'vit', 1.3),
        'narrow/reduce-overhead/train': rows(26_000, 'vit', 1.21),
    }
    log.results['zoo'] = {'minutes': 5.01}
    dc.goals(log, zoo_selected=True)
    verdicts = [g.split()[0] for g in log.results['goals']]
    assert verdicts == ['MISS', 'PASS', 'MISS']
    assert 'best reduce-overhead 26,000 img/s, 1.21x' in log.results['goals'][1]


class _SyncingRunner:
    """A training step that synchronises twice, as the sync debug mode reports it ('error': raises, 'warn': warns)."""

    def __init__(self):
        self.mode = 0

    def train_step(self):
        for _ in range(2):
            if self.mode == 'error':
                raise RuntimeError('called a synchronizing CUDA operation')
            if self.mode == 'warn':
                warnings.warn('called a synchronizing CUDA operation', stacklevel=1)


def test_sync_check_reports_the_first_sync_and_then_every_one(tmp_path):
    check = dc.Check(dc.smoke_setting(), dc.Log(tmp_path), None, dc.Budget(60), True, 2)
    runner = _SyncingRunner()
    check.find_syncs(runner, 'syncing', debug_mode=lambda mode: setattr(runner, 'mode', mode))
    assert runner.mode == 0  # left off
    (found,) = check.log.results['sync']['syncing']
    assert found['count'] == 2 and 'train_step' in found['stack']
    log = (tmp_path / 'device_check.log').read_text()
    assert 'SYNC in a training step' in log and 'RuntimeError: called a synchronizing CUDA operation' in log

    quiet = _SyncingRunner()
    quiet.train_step = lambda: None
    check.find_syncs(quiet, 'quiet', debug_mode=lambda mode: None)
    assert check.log.results['sync']['quiet'] == []


def test_reproduction_train_args_win_over_every_stage_recipe(tmp_path, monkeypatch):
    from sa_vision.train.state import parse_run_args
    commands = []
    monkeypatch.setattr(reproduce.stages, 'run_training', lambda cmd, tag, trainings: commands.append(cmd) or 0)
    # the cpu profile's recipes say torchcompile: auto, amp: auto
    zoo = reproduce.Reproduction(tmp_path, 'cpu', train_args=['--torchcompile', 'inductor', '--amp', '--device', 'cpu'])
    zoo.train('sa_quadratic_cifar')
    zoo.train(reproduce.PRUNED_MODEL, initial_checkpoint=tmp_path / 'pruned.pth')
    for cmd in commands:
        args, recipe, _ = parse_run_args(cmd[cmd.index('-c'):])
        assert recipe['torchcompile'] == 'auto' and recipe['amp'] == 'auto'
        assert (args.torchcompile, args.amp, args.device) == ('inductor', True, 'cpu')


def test_reproduce_command_refuses_train_args_the_trainer_does_not_take(tmp_path, capsys):
    from sa_vision.cli.reproduce import main
    with pytest.raises(SystemExit) as exit_info:
        main(['--profile', 'tiny', '--out', str(tmp_path), '--train-args=--amp --no-such-flag 3'])
    assert exit_info.value.code == 2
    assert "--train-args '--amp --no-such-flag 3'" in capsys.readouterr().err
    assert not (tmp_path / 'reproduction.json').exists()


def test_runner_compiles_in_the_asked_mode_and_starts_a_cuda_graph_step_each_time(monkeypatch):
    compiled, steps_begun = [], []
    monkeypatch.setattr(sab.torch, 'compile', lambda model, **kwargs: compiled.append(kwargs) or model)
    monkeypatch.setattr(sab.torch.compiler, 'cudagraph_mark_step_begin', lambda: steps_begun.append(1))
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 10))
    runner = sab.StepRunner(sab.Variant('m', model), 4, (3, 2, 2), torch.device('cpu'), torchcompile='inductor',
                         torchcompile_mode='reduce-overhead')
    assert compiled == [{'backend': 'inductor', 'mode': 'reduce-overhead'}] * 2  # training and inference
    runner.train_step()
    runner.infer_step()
    assert len(steps_begun) == 2
    sab.StepRunner(sab.Variant('m', model), 4, (3, 2, 2), torch.device('cpu'), torchcompile='inductor').train_step()
    assert compiled[-1] == {'backend': 'inductor', 'mode': None} and len(steps_begun) == 2


def test_benchmark_times_prebuilt_runners_without_building_others(monkeypatch):
    variants = [sab.Variant(name, nn.Sequential(nn.Flatten(), nn.Linear(12, 10))) for name in ('a', 'b')]
    runners = [sab.StepRunner(v, 4, (3, 2, 2), torch.device('cpu')) for v in variants]
    calls = []
    for r in runners:
        r.train_step = (lambda step, name: lambda: (calls.append(name), step()))(r.train_step, r.variant.name)

    def no_new_runner(*args, **kwargs):
        raise AssertionError('built a runner although prebuilt ones were given')
    monkeypatch.setattr(sab, 'StepRunner', no_new_runner)
    rows = sab.benchmark_variants(variants, runners=runners, batch_size=4, input_size=(3, 2, 2), device='cpu',
                                  bench='train', warmup=0, runs=2, measure_memory=False)
    assert calls == ['a', 'b', 'a', 'b']  # alternately, round by round
    assert [r['model'] for r in rows] == ['a', 'b'] and rows[1]['train_ratio'] > 0


def test_gpu_long_script_with_no_budget_starts_no_stage_and_still_packs(tmp_path):
    """docs/probes/gpu/zoo_gpu_long.py --smoke --budget-s 0: every stage is left for a later call, and what comes
    back (within the tool's count of files) says so; its full smoke run is tests/test_zoo_gpu.py's."""
    script = load_script(SCRIPT.with_name('zoo_gpu_long.py'))
    out = tmp_path / 'out'
    assert script.main(['--smoke', '--budget-s', '0', '--out', str(out), '--zoo', str(tmp_path / 'zoo'),
                        '--table', str(tmp_path / 't.csv')]) == 0
    result = json.loads((out / 'zoo_gpu_long.json').read_text())
    assert result['stages'] == {} and result['missing'] == list(reproduce.STAGE_ORDER) and 'failed' not in result
    assert len(os.listdir(out)) <= MAX_FILES_BACK and (out / 'zoo.tar').is_file()
    # the GPU's estimates: every stage of the gpu-long profile has one, from its recipe's epochs
    gpu = reproduce.Reproduction(tmp_path / 'gpu', 'gpu-long')
    assert all(script.estimate_s(gpu, m) > script.STAGE_OVERHEAD_S for m in reproduce.STAGE_ORDER)


@pytest.mark.parametrize('name', ['device_check.py', 'zoo_gpu_long.py'])
def test_the_gpu_scripts_print_their_help(name, capsys):
    """The runbook's first look at a script on the lent machine: --help prints every option (argparse formats each
    help text with %, so a bare % in one broke it) and exits 0."""
    script = load_script(SCRIPT.with_name(name))
    with pytest.raises(SystemExit) as exit_:
        script.main(['--help'])
    assert exit_.value.code == 0 and '--budget-s' in capsys.readouterr().out


def test_gpu_long_evaluations_leave_a_core_per_training_and_never_take_more_threads_than_asked():
    script = load_script(SCRIPT.with_name('zoo_gpu_long.py'))
    assert script.evaluation_threads(16, 16, 4) == 12  # the GPU machine: 16 cores, 4 stages at a time
    assert script.evaluation_threads(2, 16, 4) == 2  # OMP_NUM_THREADS=2 is kept
    assert script.evaluation_threads(16, 4, 4) == script.evaluation_threads(16, 2, 4) == 1



def _probe_env():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import probe_env
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return probe_env


def test_a_run_killed_inside_an_item_leaves_the_goals_of_the_items_before(tmp_path, monkeypatch):
    """The goals are written after every item: a run that SIGKILL ends inside an item (here an exception that
    nothing catches) leaves the lines of what it measured before, in the log and the JSON."""
    def first(check):  # measures the full-size pair, far from the goal
        check.log.results.setdefault('paired', {})['full/eager/both'] = [
            {'role': 'ours', 'train_samples_per_sec': 100.0}, {'role': 'paper', 'train_ratio': 1.0}]

    def killed():
        raise KeyboardInterrupt
    monkeypatch.setattr(dc, 'items', lambda c: [dc.Item(1, 'measured', lambda: first(c), 0),
                                                dc.Item(1, 'killed', killed, 0)])
    with pytest.raises(KeyboardInterrupt):
        dc.main(['--smoke', '--budget-s', '60', '--section', '1', '--out', str(tmp_path)])
    log = (tmp_path / 'device_check.log').read_text()
    goals = log[log.rindex('== goals so far'):].splitlines()[1:3]
    assert goals[0].startswith('MISS full-size training') and '100 img/s' in goals[0], log[-2000:]
    assert goals[1].startswith('UNKNOWN narrow training')
    assert json.loads((tmp_path / 'device_check.json').read_text())['goals'] == goals


def test_the_zoo_goal_says_what_finished_where_the_zoo_did_not_end():
    import time
    partial = {'minutes': None, 'started': time.time() - 150, 'stage_s': {'sa_quadratic_cifar': 61.0}}
    line = dc.zoo_goal(partial)
    assert line.startswith('MISS the five stages') and 'stages finished: sa_quadratic_cifar (61 s)' in line
    assert re.search(r'not ended after 2\.5\d min', line), line
    assert dc.zoo_goal({'minutes': 4.5}).startswith('PASS') and dc.zoo_goal(None).startswith('UNKNOWN')


@pytest.mark.slow
def test_sigterm_leaves_the_goals_and_the_json(tmp_path):
    """``timeout``'s SIGTERM inside an item: the script writes the goals and the JSON, then ends with status 143."""
    import signal
    import time
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1')
    proc = subprocess.Popen([sys.executable, str(SCRIPT), '--smoke', '--section', '1', '--out', str(tmp_path)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    log_path, deadline = tmp_path / 'device_check.log', time.time() + HANG_TIMEOUT_S
    while not (log_path.is_file() and '== [1] ' in log_path.read_text()) and time.time() < deadline:
        assert proc.poll() is None, 'the check ended before its first item'
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG_TIMEOUT_S) == 128 + signal.SIGTERM
    tail = log_path.read_text().split('== stopped by SIGTERM after ')[1].splitlines()
    assert tail[2:4] == ['== goals', 'UNKNOWN full-size training >= 15,000 img/s and >= 1.5x the paper\'s '
                         'formulation compiled the same way: not measured'], tail
    assert len(json.loads((tmp_path / 'device_check.json').read_text())['goals']) == 2


def test_a_sigterm_whose_exit_a_finaliser_lost_ends_before_the_next_item(tmp_path, monkeypatch):
    """SIGTERM's handler runs wherever the main thread is. In a ``__del__`` (torch has many finalisers) Python only
    prints the SystemExit it raises, and the handler ignores the signals after its first. The check then ends with
    SIGTERM's status before its next item all the same, having saved once."""
    import signal
    lost, saved, ran = [], [], []
    monkeypatch.setattr(sys, 'unraisablehook', lambda unraisable: lost.append(unraisable.exc_type))

    class Finalised:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the handler runs here

    check = dc.Check(dc.smoke_setting(), dc.Log(tmp_path), None, dc.Budget(60), True, 1)
    items = [dc.Item(1, 'first', lambda: Finalised() and None, 0), dc.Item(1, 'second', lambda: ran.append(2), 0)]
    with pytest.raises(SystemExit) as exit_, _probe_env().on_sigterm(lambda: saved.append(1)):
        dc.run_items(check, items, set(), False)
    assert lost == [SystemExit], 'the finaliser did not lose the exit: this test no longer tests that case'
    assert exit_.value.code == 128 + signal.SIGTERM and saved == [1] and ran == []
    with pytest.raises(SystemExit), _probe_env().on_sigterm(lambda: None):
        Finalised()  # in a block with no item after it, its end ends it
    assert lost == [SystemExit] * 2


def test_no_warm_phase_under_its_minimum_budget(tmp_path, monkeypatch):
    """Below 400 s the GPU's 30 % share is shorter than a compile: the warm phase is skipped and says so."""
    import argparse
    asked = []
    monkeypatch.setattr(dc, 'warm', lambda check, targets, seconds, *a: asked.append(seconds) or set(targets))
    items = [dc.Item(1, 'compiled', lambda: None, 100, (('full', 'default', 'ours', 'train'),))]
    for budget_s in (399, 400):
        check = dc.Check(dc.smoke_setting(), dc.Log(tmp_path), None, dc.Budget(budget_s), False, 1)
        args = argparse.Namespace(smoke=False, budget_s=budget_s, warm_s=None, warm_parallel=1, smoke_backend='eager')
        dc.warm_phase(check, items, args)
    assert asked == [pytest.approx(120)]
    assert 'warm: skipped: a budget of 399 s is under 400 s' in (tmp_path / 'device_check.log').read_text()


def test_timm_range_is_pyprojects_and_a_timm_outside_it_stops_both_scripts_in_one_line(tmp_path):
    tomllib = pytest.importorskip('tomllib')  # Python 3.11
    probe_env = _probe_env()
    declared = next(d for d in tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['dependencies']
                    if re.match(r'timm\b', d))
    assert 'timm' + probe_env.timm_requirement() == declared.replace(' ', '')
    assert probe_env.timm_problem('1.0.31', '>=1.0.31,<1.1') is None
    assert 'timm 1.0.30 is outside' in probe_env.timm_problem('1.0.30', '>=1.0.31,<1.1')
    assert 'timm (not installed)' in probe_env.timm_problem(None, '>=1.0.31,<1.1')
    # an older timm found first on the path, as on a machine whose image holds one
    (tmp_path / 'timm-0.9.2.dist-info').mkdir()
    (tmp_path / 'timm-0.9.2.dist-info' / 'METADATA').write_text('Metadata-Version: 2.1\nName: timm\nVersion: 0.9.2\n')
    env = dict(os.environ, PYTHONPATH=f'{tmp_path}{os.pathsep}{ROOT}')
    for name in ('device_check.py', 'zoo_gpu_long.py'):
        proc = subprocess.run([sys.executable, str(SCRIPT.with_name(name)), '--help'], env=env, capture_output=True,
                              text=True, timeout=HANG_TIMEOUT_S)
        assert proc.returncode == 2 and not proc.stdout, proc.stdout[-2000:]
        assert re.fullmatch(r'STOPPED: timm 0\.9\.2 is outside sa_vision\'s range timm>=1\.0\.31,<1\.1 \(pyproject'
                            r'\.toml\): carry a wheel .*\n', proc.stderr), proc.stderr


def test_the_commit_comes_from_the_environment_where_there_is_no_git(monkeypatch):
    probe_env = _probe_env()
    monkeypatch.setenv('SA_VISION_COMMIT', 'abc1234')
    assert probe_env.commit() == 'abc1234'
    monkeypatch.delenv('SA_VISION_COMMIT')
    git = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True)
    assert probe_env.commit() == (git.stdout.strip() if git.returncode == 0 else None)


def test_a_graph_break_in_a_compiled_step_is_counted_and_flagged(tmp_path):
    class Breaks(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(12, 10)

        def forward(self, x):
            x = x.flatten(1)
            torch._dynamo.graph_break()
            return self.head(x)
    check = dc.Check(dc.smoke_setting(), dc.Log(tmp_path), None, dc.Budget(60), True, 1)
    runner = sab.StepRunner(sab.Variant('breaks', Breaks()), 4, (3, 2, 2), torch.device('cpu'), torchcompile='eager')
    runner.label = 'breaks'
    torch._dynamo.reset()
    check.first_steps(runner, 'breaks', 'train')
    torch._dynamo.reset()
    (reasons,) = check.log.results['graph_breaks'].values()
    assert sum(reasons.values()) == 1, reasons
    log = (tmp_path / 'device_check.log').read_text()
    assert 'graph breaks: 1' in log and 'GRAPH BREAK (1x in the train step)' in log


def test_runners_take_the_layout_that_training_takes(tmp_path, monkeypatch):
    """sa-vision-train trains the ResNet channels-last on CUDA (``uses_channels_last``): its runner is timed so, with
    its input and convolution weights channels-last, while the attention models stay NCHW. CUDA's rule is applied
    on the CPU here."""
    from sa_vision.train import runtime
    monkeypatch.setattr(dc, 'uses_channels_last', lambda model, device: runtime.uses_channels_last(model, 'cuda'))
    check = dc.Check(dc.smoke_setting(), dc.Log(tmp_path), None, dc.Budget(60), True, 1)
    resnet, ours = check.runner('narrow', 'eager', 'resnet'), check.runner('narrow', 'eager', 'ours')
    assert (resnet.layout, ours.layout) == ('channels-last', 'NCHW')
    assert resnet.x.is_contiguous(memory_format=torch.channels_last) and ours.x.is_contiguous()
    conv = next(m for m in resnet.train_model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size != m.stride)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()


@pytest.mark.slow
def test_the_zoo_stops_at_the_budgets_end_and_its_goal_says_what_finished(tmp_path, monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    check = dc.Check(dc.smoke_setting(), dc.Log(tmp_path), None, dc.Budget(2), True, 2)
    check.zoo()
    log = (tmp_path / 'device_check.log').read_text()
    assert "the zoo: stopped at the budget's end (" in log and 'finished: none' in log, log[-2000:]
    assert check.log.results['zoo']['minutes'] is None
    assert dc.zoo_goal(check.log.results['zoo']).endswith('stages finished: none')



def test_the_json_is_written_though_a_stage_thread_changes_the_results_meanwhile(tmp_path, monkeypatch):
    """The zoo's stage threads add to the results while the main thread (or the SIGTERM handler) saves them: a
    stage's write waits for the save's lock (json would raise 'dictionary changed size during iteration'), so the
    file is written whole, and the write lands after it."""
    log = dc.Log(tmp_path)
    log.results['zoo'] = {'stage_s': {'model0': 1.0}}
    dumps, dumping, written = dc.json.dumps, threading.Event(), []

    def stage_ends():
        dumping.wait()
        with log.lock:  # as Check.zoo's train() records a stage
            log.results['zoo']['stage_s']['model1'] = 2.0
            written.append(1)

    def slow_dumps(obj, **kwargs):
        dumping.set()
        time.sleep(0.2)  # the stage thread would change the dict now, were it not for the lock
        assert not written, 'a stage wrote into the results while they were written out'
        return dumps(obj, **kwargs)
    monkeypatch.setattr(dc.json, 'dumps', slow_dumps)
    stage = threading.Thread(target=stage_ends)
    stage.start()
    log.save()
    stage.join()
    assert json.loads((tmp_path / 'device_check.json').read_text())['zoo'] == {'stage_s': {'model0': 1.0}}
    assert log.results['zoo']['stage_s'] == {'model0': 1.0, 'model1': 2.0}


def test_fashion_mnist_travels_xz_compressed_and_unpacks_to_what_sa_vision_reads(tmp_path):
    """What a call carries (data/fashion-mnist-xz) unpacks to IDX files FashionMnistDataset reads, the same images
    as Debian's .gz files; a folder already unpacked is used as it is, and without either there is none."""
    import lzma

    from sa_vision.train.datasets import FASHION_MNIST_DIR, FashionMnistDataset
    probe_env = _probe_env()
    packed, unpacked = tmp_path / 'fashion-mnist-xz', tmp_path / 'fashion-mnist'
    packed.mkdir()
    for name in ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte'):  # the test split is enough to read
        with gzip.open(Path(FASHION_MNIST_DIR) / f'{name}.gz') as f:
            (packed / f'{name}.xz').write_bytes(lzma.compress(f.read(), preset=0))
    assert probe_env.fashion_mnist_dir(unpacked, packed) == str(unpacked)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['fashion-mnist', 'fashion-mnist-xz']  # no partial left
    ours, debian = FashionMnistDataset('test', data_dir=str(unpacked)), FashionMnistDataset('test')
    assert torch.equal(ours.images, debian.images) and torch.equal(ours.targets, debian.targets)
    (packed / 't10k-labels-idx1-ubyte.xz').unlink()
    assert probe_env.fashion_mnist_dir(unpacked, packed) == str(unpacked)  # already there: not unpacked again
    assert (unpacked / 't10k-labels-idx1-ubyte').is_file()
    assert probe_env.fashion_mnist_dir(tmp_path / 'none', tmp_path / 'none-xz') is None


def test_what_a_gpu_call_sends_fits_the_64_mib_that_travel():
    """A call sends the tracked tree with the carried data and wheel (device_check.md, "The data folder"); over
    64 MiB the tool refuses it. Measured on 2026-11-26: data/fashion-mnist-xz 26,427,996 bytes, timm's wheel
    2,802,810, and since 2026-11-27 timm's train.py beside it (section 12) 73,502; the tracked tree 34.3 MB then,
    3.4 MiB below the limit. A file that would take that room fails here, in
    CI, and not at the start of a session's few GPU minutes."""
    listed = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip('not a git checkout: the tracked tree is unknown')
    tracked = sum((ROOT / name).stat().st_size for name in listed.stdout.decode().split('\0')
                  if name and (ROOT / name).is_file())
    carried = 26_427_996 + 2_802_810 + 73_502
    assert tracked + carried <= 64 * 2 ** 20, (
        f'a GPU call would send {(tracked + carried) / 2 ** 20:.1f} MiB (tracked {tracked / 1e6:.1f} MB): keep '
        f'large files out of the repository, or carry less (docs/probes/gpu/device_check.md, "The data folder")')
