""" The GPU probe of the compiled evaluation's fault (docs/probes/gpu/eval_fault.py) in its CPU smoke mode """
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT_S, load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'docs' / 'probes' / 'gpu' / 'eval_fault.py'


@pytest.mark.slow
def test_smoke_finds_the_faked_faults_and_only_them(tmp_path):
    """The smoke run fakes the whole model's default way, the second layer's probabilities and the third block
    wrong (scaled by 1.5), and one way failing: each is found WRONG and nothing else, the error is kept and the
    other ways run; the smallest graph shown is the probabilities'."""
    proc = subprocess.run([sys.executable, str(SCRIPT), '--smoke', '--out', str(tmp_path)],
                          cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    log = (tmp_path / 'eval_fault.log').read_text() if (tmp_path / 'eval_fault.log').is_file() else ''
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + log[-3000:]
    result = json.loads((tmp_path / 'eval_fault.json').read_text())
    whole = result['whole_model']
    # the faked error is kept in its place, and the ways after it still ran
    assert 'an error the smoke run fakes' in whole.pop('default, float32')['error']
    assert [name for name, row in whole.items() if row['wrong']] == ['default']
    assert len(whole) == 5 and all(row['top1'] == row['top1_eager'] for row in whole.values())
    assert 'cudagraphs backend' in whole and all(row['img_per_s'] > 0 for row in whole.values())
    assert result['eager_img_per_s'] > 0
    # the weights as they trained, fed as the training fed them: 78.5 % on these 200 images (46 % with the
    # architecture's default normalisation)
    assert whole['reduce-overhead']['top1_eager'] > 70
    assert whole['default']['rel_diff'] > 0.3 and whole['reduce-overhead']['rel_diff'] < 1e-3
    layers = result['layers']
    assert [r['wrong'] for r in layers['probabilities']] == [i == 1 for i in range(6)]
    assert [r['wrong'] for r in layers['blocks']] == [i == 2 for i in range(6)]
    # the bisector finds the faked fault without any compiler: dynamo's eager backend already has it
    assert result['bisect']['backend'] == 'eager' and result['bisect']['subsystem'] is None
    assert result['code_shown'] == 'probabilities 1' and '== done: wrong [\'default\', \'default, float32\']' in log


def _probe():
    return load_script(SCRIPT)


@pytest.mark.slow
def test_smoke_settings_part_runs_each_setting_in_its_own_process_and_tells_a_first_run_fault(tmp_path):
    """The settings part fakes the defaults wrong at their first call only (in both of their processes) and one
    setting's process failing: the first pass is wrong at its first batch alone, the second pass right, the part
    calls it a first-run fault, keeps the failed process's last words, and leaves only its own log and JSON."""
    probe = _probe()
    proc = subprocess.run([sys.executable, str(SCRIPT), '--smoke', '--part', 'settings', '--out', str(tmp_path)],
                          cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    log = (tmp_path / 'eval_fault.log').read_text() if (tmp_path / 'eval_fault.log').is_file() else ''
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + log[-3000:]
    found = json.loads((tmp_path / 'eval_fault.json').read_text())['settings']
    rows = found['rows']
    assert list(rows) == [name for name, _ in probe.SETTINGS if name in probe.SMOKE_SETTINGS]
    assert 'an error the smoke run fakes' in rows.pop('emulated precision casts')['error']
    for name, row in rows.items():
        first_wrong = f'setting {name}' in probe.SMOKE_FIRST_CALL_FAULTS
        assert row['first_pass_batches_wrong'] == [first_wrong, False], name  # SMOKE_SETTING_IMAGES: two batches
        assert row['first_pass']['wrong'] is first_wrong and not row['second_pass']['wrong'], name
        assert row['right'] is not first_wrong and row['vs_eager'] > 0
        assert row['autotune'] == {'benchmarks': 0, 'cpu_copies': 0, 'cpu_copy_bytes': 0, 'clones': 0}  # eager
    assert found['defaults_wrong'] == '2 of 2' and found['defaults_first_call_only'] == '2 of 2'
    assert found['first_run_fault'] is True and 'FAILED' in log and 'first call only in 2 of 2' in log
    assert sorted(p.name for p in tmp_path.rglob('*')) == ['eval_fault.json', 'eval_fault.log']


def test_the_autotuners_way_of_keeping_in_place_arguments_is_counted_and_then_put_back():
    """While recording, inductor's autotuner's two ways of keeping a kernel's in-place arguments intact (a clone on
    the device, or a copy to the CPU restored after each run) are counted as they run; after it, its own methods are
    back. On the CPU no argument is copied (the CPU path is for device tensors)."""
    from types import SimpleNamespace

    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    probe, record = _probe(), {}
    methods = (CachingAutotuner.copy_args_to_cpu_if_needed, CachingAutotuner.maybe_clone_args)
    tuner = SimpleNamespace(optimize_mem=True, mutated_arg_names=['in_out_ptr0'],
                            fn=SimpleNamespace(arg_names=['in_out_ptr0', 'in_ptr1']))
    x, y = torch.ones(4), torch.zeros(4)
    with probe._autotune_record(record):
        copies = CachingAutotuner.copy_args_to_cpu_if_needed(tuner, x, y)
        cloned, _ = CachingAutotuner.maybe_clone_args(tuner, copies, x, y)
    assert record == {'benchmarks': 1, 'cpu_copies': 0, 'cpu_copy_bytes': 0, 'clones': 1}
    assert cloned[0] is not x and torch.equal(cloned[0], x) and cloned[1] is y
    assert (CachingAutotuner.copy_args_to_cpu_if_needed, CachingAutotuner.maybe_clone_args) == methods


def test_counting_never_changes_what_the_autotuners_methods_return(monkeypatch):
    """A torch whose methods return something the count cannot read (the GPU image's is older) loses the count,
    not the run: the call's own result comes back unchanged."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    monkeypatch.setattr(CachingAutotuner, 'copy_args_to_cpu_if_needed', lambda self, *a, **k: 'unexpected')
    monkeypatch.setattr(CachingAutotuner, 'maybe_clone_args', lambda self, exclude, *a, **k: None)
    with _probe()._autotune_record({}):
        assert CachingAutotuner.copy_args_to_cpu_if_needed(object(), torch.ones(1)) == 'unexpected'
        assert CachingAutotuner.maybe_clone_args(object(), {}, torch.ones(1)) is None


def _setting_row(first_batches, second_wrong=False, vs_eager=2.0):
    first_wrong = any(first_batches)
    return {'first_pass_batches_wrong': list(first_batches), 'first_pass': {'wrong': first_wrong},
            'second_pass': {'wrong': second_wrong}, 'right': not (first_wrong or second_wrong), 'vs_eager': vs_eager}


def test_settings_verdict_names_a_setting_only_where_the_defaults_failed_in_the_same_run():
    """A setting found right proves something only beside defaults found wrong: with the defaults right nothing is
    named; a defaults row wrong after its first batch, or at its second pass, is not a first-run fault; a setting
    right but slower than 1.5x eager is not a fast evaluation, and the defaults are never one."""
    verdict = _probe().settings_verdict
    first_only, right = _setting_row([True, False]), _setting_row([False, False])
    slow = _setting_row([False], vs_eager=1.2)
    v = verdict({'defaults': first_only, 'defaults, again': right, 'a': right, 'b': slow, 'c': {'error': 'x'}})
    assert v == {'defaults_wrong': '1 of 2', 'defaults_first_call_only': '1 of 1', 'fast_right': ['a'],
                 'first_run_fault': True}
    assert verdict({'defaults': right, 'defaults, again': right, 'a': right})['fast_right'] == []
    assert not verdict({'defaults': right, 'a': right})['first_run_fault']
    later = verdict({'defaults': _setting_row([True, True]), 'defaults, again': first_only, 'a': right})
    assert later['defaults_first_call_only'] == '1 of 2' and not later['first_run_fault']
    assert not verdict({'defaults': _setting_row([True, False], second_wrong=True)})['first_run_fault']


def test_a_setting_holds_where_its_model_compiles_with_caches_off(monkeypatch):
    """torch.compile compiles at the first call: the setting, and inductor's caches off, must hold there, and not
    after."""
    from types import SimpleNamespace

    import torch._inductor.config as inductor_config
    probe = _probe()
    keys = ('fx_graph_cache', 'triton.autotune_pointwise', 'triton.persistent_reductions')
    seen = []

    def compile_recorded(module, **kwargs):
        calls = []

        def first_call(*args):
            if not calls:
                config = inductor_config.get_config_copy()
                seen.append({k: config[k] for k in keys})
            calls.append(1)
            return module(*args)
        return first_call
    monkeypatch.setattr(probe.torch, 'compile', compile_recorded)
    model = probe.model_as_trained(probe.WEIGHTS).eval()
    batches = [torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)]
    args = SimpleNamespace(device='cpu', backend='inductor', smoke=False, bf16=True)
    row = probe._one_setting(model, batches, torch.zeros(4, dtype=torch.long), 'no pointwise autotuning', args,
                             lambda _: None)
    assert seen == [{'fx_graph_cache': False, 'triton.autotune_pointwise': False,
                     'triton.persistent_reductions': True}]
    assert row['right'] and row['first_pass_batches_wrong'] == [False, False]
    after = inductor_config.get_config_copy()
    assert after['triton.autotune_pointwise'] is True and after['fx_graph_cache'] is not False


def test_on_the_gpu_one_way_compiles_with_the_cudagraphs_backend_and_the_others_with_inductor(monkeypatch):
    """Outside the smoke run (here on the CPU, torch.compile recorded and left out) the ways use the run's backend,
    inductor on the GPU, but for the one that replays eager's kernels as CUDA graphs."""
    from types import SimpleNamespace
    probe = _probe()
    seen = []

    def compile_recorded(module, **kwargs):
        seen.append(kwargs)
        return module
    monkeypatch.setattr(probe.torch, 'compile', compile_recorded)
    model = probe.model_as_trained(probe.WEIGHTS).eval()
    batches = [torch.randn(2, 3, 32, 32)]
    found = {}
    args = SimpleNamespace(device='cpu', backend='inductor', smoke=False, bf16=True)
    assert probe._whole_model_ways(model, batches, torch.zeros(2, dtype=torch.long), args, lambda _: None, found) > 0
    assert [k['backend'] for k in seen] == ['inductor', 'inductor', 'cudagraphs', 'inductor', 'inductor', 'inductor']
    assert seen[1] == {'mode': 'reduce-overhead', 'backend': 'inductor'} and list(found)[2] == 'cudagraphs backend'


def test_with_no_layer_wrong_the_whole_model_is_what_gets_bisected():
    """Where every layer and block is right alone, the graph to bisect is the whole model on one batch, in the
    first mode found wrong; none where no mode is."""
    from types import SimpleNamespace
    probe = _probe()
    model = probe.model_as_trained(probe.WEIGHTS).eval()
    batch = torch.randn(2, 3, 32, 32)
    args = SimpleNamespace(device='cpu', backend='eager', smoke=True, bf16=False)
    assert probe._whole_model_wrong(model, {'default': {'wrong': False}, 'reduce-overhead': {'wrong': False}},
                                    batch, args) is None
    graph = probe._whole_model_wrong(model, {'default': {'wrong': False}, 'reduce-overhead': {'wrong': True}},
                                     batch, args)
    assert graph.name == 'whole model, reduce-overhead'
    assert not probe._compare(graph.reference, graph.compile_and_run())['wrong']  # the eager backend is right
