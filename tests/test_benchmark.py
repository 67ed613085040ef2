"""Fast checks of the measuring tools (sa_vision.measure.benchmark, sa-vision-benchmark). No timing thresholds."""
import copy
import csv
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import timm
import torch
from float32_bounds import assert_network_float32_close, sa_model_reduction_lengths
from helpers import HANG_TIMEOUT_S
from torch import nn

import sa_vision  # noqa: F401
from sa_vision.measure import benchmark as sab
from sa_vision.measure import format_results
from sa_vision.measure.results import RATIO_NOTE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# tiny config: D=8, one layer, 2 heads, MLP 16, 10 classes, 8x8 image -> 4x4 grid (16 tokens)
TINY = dict(embed_dim=8, depth=1, heads_per_layer=2, mlp_hidden_dim=16)
TINY_ARGS = ['embed_dim=8', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=16']
D, HEADS, M, CLASSES, N, GH, GW = 8, 2, 16, 10, 16, 4, 4
# hand count: embedding 12->D per token, Value (heads*D)->D and proj D->D per token, MLP D->M->D per token,
# classifier once; attention: separable h*w*(h+w)*D per head, dense (h*w)^2*D per head
LINEAR_MACS = N * 12 * D + N * (HEADS * D * D + D * D + 2 * D * M) + D * CLASSES
SEPARABLE_MACS = LINEAR_MACS + HEADS * N * (GH + GW) * D
DENSE_MACS = LINEAR_MACS + HEADS * N * N * D


def _load_cli():
    from sa_vision.cli import benchmark
    return benchmark


def test_count_macs_linear():
    assert sab.count_macs(nn.Linear(5, 7), (5,)) == 35
    assert sab.count_macs(nn.Linear(5, 7), (5,), batch_size=3) == 105
    assert sab.count_macs(nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 2)), (4, 5)) == 4 * 35 + 4 * 14


def test_count_macs_tiny_sa_model():
    assert (LINEAR_MACS, SEPARABLE_MACS, DENSE_MACS) == (10832 - 2048, 10832, 12880)
    model = timm.create_model('sa_quadratic_cifar', **TINY)
    assert sab.count_macs(model, (3, 8, 8)) == SEPARABLE_MACS
    from sa_vision.layers import dense_attention
    with dense_attention(model):
        assert sab.count_macs(model, (3, 8, 8)) == DENSE_MACS
    assert model.training  # count_macs restores the mode


def test_count_macs_counts_a_full_pass_whatever_ran_before():
    # the learned kind computes its key maps on the shift tables in every pass; in eval mode without autograd
    # the layer keeps the probabilities of the last pass, which must not make a later count smaller
    learned = SEPARABLE_MACS + (GH * GH + GW * GW) * D * HEADS
    model = timm.create_model('sa_learned_cifar', **TINY).eval()
    assert sab.count_macs(model, (3, 8, 8)) == learned
    with torch.no_grad():
        model(torch.zeros(1, 3, 8, 8))
    assert sab.count_macs(model, (3, 8, 8)) == learned
    assert sab.count_macs(model, (3, 8, 8)) == learned


def test_hub_counts_with_the_one_counter_on_the_model_device():
    from sa_vision.hub import count_params_and_macs
    with torch.device('meta'):  # 'meta' stands in for a device other than the CPU (a CUDA model)
        model = timm.create_model('sa_quadratic_cifar', **TINY)
    params = sum(p.numel() for p in timm.create_model('sa_quadratic_cifar', **TINY).parameters())
    assert count_params_and_macs(model, img_size=8) == {'params': params, 'macs': SEPARABLE_MACS}


def test_unavoidable_macs():
    for name, attn in (('sa_quadratic_cifar', SEPARABLE_MACS), ('sa_gen_cifar', DENSE_MACS)):
        assert sab.unavoidable_macs(timm.create_model(name, **TINY), (3, 8, 8)) == attn
    learned = sab.unavoidable_macs(timm.create_model('sa_learned_cifar', **TINY), (3, 8, 8))
    assert learned == SEPARABLE_MACS + (GH * GH + GW * GW) * D * HEADS
    # the full model: 6 layers of 9 heads, D=400, MLP 512, 16x16 grid
    full = sab.unavoidable_macs(timm.create_model('sa_quadratic_cifar'))
    per_layer = 256 * (9 * 400 * 400 + 400 * 400 + 2 * 400 * 512) + 9 * 256 * 32 * 400
    assert full == 256 * 12 * 400 + 6 * per_layer + 400 * 10


def test_live_tensor_memory():
    with sab.LiveTensorMemory() as tracker:
        a = torch.empty(1000)
        b = torch.empty(500)
        del a
        c = torch.empty(100)
        v = b.view(50, 10)  # a view allocates nothing
    assert tracker.peak == 6000
    assert tracker.live == 2400
    del b, c, v


def test_matmul_rate_positive():
    assert sab.matmul_rate(64, iters=1, runs=1) > 0


def test_format_results():
    rows = [dict(model='a', batch_size=2, train_samples_per_sec=10.0, train_runs=[9.0, 10.0, 11.0]),
            dict(model='b', batch_size=2, train_samples_per_sec=5.0, train_ratio=2.0)]
    table = format_results(rows, 'table').splitlines()
    assert table[0].startswith('| model') and 'train_ratio' in table[0] and len(table) == 6
    # which way round the ratios are, below the table only: a file of CSV or JSON stays one
    assert table[-1] == RATIO_NOTE and '> 1: the first is faster' in RATIO_NOTE
    assert 'ratios' not in format_results(rows[:1], 'table')
    parsed = list(csv.DictReader(io.StringIO(format_results(rows, 'csv'))))
    assert [r['model'] for r in parsed] == ['a', 'b'] and float(parsed[1]['train_ratio']) == 2.0
    assert json.loads(format_results(rows, 'json')) == rows


@pytest.mark.parametrize('fmt', ['table', 'csv', 'json'])
def test_cli_runs(fmt, tmp_path, capsys):
    cli = _load_cli()
    out = tmp_path / 'new' / f'results.{fmt}'  # its folder is made
    argv = ['--model', 'sa_quadratic_cifar', '--model-kwargs', *TINY_ARGS, '--img-size', '8', '-b', '2',
            '--runs', '1', '--num-warm-iter', '0', '--results-format', fmt, '--results-file', str(out), '--quiet']
    assert cli.main(argv) == 0
    text = out.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    if fmt == 'json':
        (row,) = json.loads(text)
        assert row['macs'] == SEPARABLE_MACS == row['unavoidable_macs']
        assert row['train_samples_per_sec'] > 0 and row['infer_samples_per_sec'] > 0
        assert row['train_peak_mb'] > 0 and row['infer_peak_mb'] > 0
    elif fmt == 'csv':
        (row,) = list(csv.DictReader(io.StringIO(text)))
        assert row['model'] == 'sa_quadratic_cifar' and int(row['macs']) == SEPARABLE_MACS
    else:
        assert text.splitlines()[0].startswith('| model')


def test_the_results_files_suffix_picks_its_format_unless_one_is_given(tmp_path, capsys):
    """As timm's benchmark.py writes a results file as CSV, a .csv or .json file is written as it is named; a
    --results-format wins, and other names get the table printed."""
    cli = _load_cli()
    argv = ['--model', 'sa_quadratic_cifar', '--model-kwargs', *TINY_ARGS, '--img-size', '8', '-b', '2',
            '--runs', '1', '--num-warm-iter', '0', '--no-memory', '--quiet']
    for name, given, check in (('r.csv', [], lambda t: next(csv.DictReader(io.StringIO(t)))['model']),
                               ('r.json', [], lambda t: json.loads(t)[0]['model']),
                               ('r.csv', ['--results-format', 'json'], lambda t: json.loads(t)[0]['model']),
                               ('r.txt', [], lambda t: t.splitlines()[2].split('|')[1].strip())):
        out = tmp_path / name
        assert cli.main([*argv, *given, '--results-file', str(out)]) == 0
        assert check(out.read_text()) == 'sa_quadratic_cifar', (name, given)
        capsys.readouterr()


def test_cli_compare_dense_and_matmul(tmp_path):
    cli = _load_cli()
    out = tmp_path / 'r.json'
    argv = ['--model', 'sa_quadratic_cifar', '--model-kwargs', *TINY_ARGS, '--img-size', '8', '-b', '2',
            '--runs', '2', '--num-warm-iter', '0', '--compare', 'dense', '--matmul-peak', '--matmul-size', '64',
            '--results-format', 'json', '--results-file', str(out), '--quiet']
    assert cli.main(argv) == 0
    ours, dense = json.loads(out.read_text())
    assert (ours['model'], dense['model']) == ('sa_quadratic_cifar', 'sa_quadratic_cifar[dense]')
    assert ours['macs'] == SEPARABLE_MACS and dense['macs'] == DENSE_MACS
    assert len(ours['train_runs']) == len(dense['train_runs']) == 2
    for key in ('train_ratio', 'infer_ratio', 'train_mem_ratio'):
        assert dense[key] > 0
    # the speed ratio pairs the runs of one round (back to back), then takes the median over rounds
    paired = [a / b for a, b in zip(ours['train_runs'], dense['train_runs'])]
    assert dense['train_ratio_runs'] == pytest.approx(paired, rel=1e-2, abs=1e-3)  # stored to 3 decimals
    assert dense['train_ratio'] == pytest.approx(sorted(paired)[0] / 2 + sorted(paired)[1] / 2, rel=1e-2)
    assert 0 < ours['matmul_fraction'] and ours['matmul_gflops'] > 0
    # inference counts one forward pass of the unavoidable MACs, training three
    assert ours['infer_matmul_fraction'] == pytest.approx(
        ours['infer_samples_per_sec'] * ours['unavoidable_macs'] * 2 / 1e9 / ours['matmul_gflops'], rel=1e-6)
    assert ours['matmul_fraction'] == pytest.approx(
        ours['train_samples_per_sec'] * 3 * ours['unavoidable_macs'] * 2 / 1e9 / ours['matmul_gflops'], rel=1e-6)


def test_cli_compare_with_a_model_built_as_a_reproduction_profile_builds_it(tmp_path):
    """--reproduce-profile tiny builds the SA model and the compared ResNet18 with the tiny profile's widths
    (sa_vision.reproduce: SA embedding 16, 2 layers of 3 heads, MLP 32; ResNet18 channels 4-32)."""
    import timm
    cli = _load_cli()
    out = tmp_path / 'r.json'
    argv = ['--model', 'sa_quadratic_cifar', '--reproduce-profile', 'tiny', '--compare', 'resnet18_cifar',
            '--img-size', '8', '-b', '2', '--runs', '1', '--num-warm-iter', '0', '--bench', 'train', '--no-memory',
            '--results-format', 'json', '--results-file', str(out), '--quiet']
    assert cli.main(argv) == 0
    sa, resnet = json.loads(out.read_text())
    assert (sa['model'], resnet['model']) == ('sa_quadratic_cifar', 'resnet18_cifar')
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert sa['param_count'] == count(timm.create_model(
        'sa_quadratic_cifar', embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=32))
    assert resnet['param_count'] == count(timm.create_model('resnet18_cifar', channels=(4, 8, 16, 32)))
    assert resnet['train_ratio'] > 0


def test_cli_compare_paper(tmp_path):
    cli = _load_cli()
    out = tmp_path / 'r.csv'
    argv = ['--model', 'sa_learned_cifar', '--model-kwargs', *TINY_ARGS, '--img-size', '8', '-b', '2',
            '--runs', '1', '--num-warm-iter', '0', '--bench', 'inference', '--no-memory', '--compare', 'paper',
            '--amp', '--channels-last', '--results-format', 'csv', '--results-file', str(out), '--quiet']
    assert cli.main(argv) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r['model'] for r in rows] == ['sa_learned_cifar', 'sa_learned_cifar[paper]']
    assert float(rows[1]['infer_ratio']) > 0 and 'train_samples_per_sec' not in rows[1]


def test_fuse_times_the_fused_copy_of_the_model_and_of_its_switches(tmp_path):
    """--fuse: inference of the model and of each switch runs on a fused copy (one Linear instead of Value then
    proj), so the MACs it counts and the unavoidable MACs of inference both lack the projection; the switch stays on
    for that copy, and training counts the unfused model."""
    out = tmp_path / 'r.json'
    argv = ['--model', 'sa_quadratic_cifar', '--model-kwargs', *TINY_ARGS, '--img-size', '8', '-b', '2',
            '--runs', '1', '--num-warm-iter', '0', '--compare', 'dense', '--fuse', '--matmul-peak',
            '--matmul-size', '64', '--results-format', 'json', '--results-file', str(out), '--quiet']
    assert _load_cli().main(argv) == 0
    ours, dense = json.loads(out.read_text())
    projection = N * D * D  # the proj Linear, folded into Value by fuse()
    assert ours['macs'] == SEPARABLE_MACS - projection and dense['macs'] == DENSE_MACS - projection
    assert ours['unavoidable_macs'] == SEPARABLE_MACS and ours['infer_unavoidable_macs'] == ours['macs']
    assert ours['infer_matmul_fraction'] == pytest.approx(
        ours['infer_samples_per_sec'] * ours['macs'] * 2 / 1e9 / ours['matmul_gflops'], rel=1e-6)


def test_compiled_steps_say_that_their_peak_memory_is_not_measured():
    """The peak-memory step is skipped for compiled steps (the CPU's tracker would count none of their tensors):
    the log says so, rather than leaving the columns out unexplained."""
    lines = []
    variants = sab.build_variants('sa_quadratic_cifar', input_size=(3, 8, 8), **TINY)
    (row,) = sab.benchmark_variants(variants, batch_size=2, input_size=(3, 8, 8), runs=1, warmup=0,
                                    torchcompile='eager', log=lines.append)
    assert 'train_peak_mb' not in row and row['train_samples_per_sec'] > 0
    assert any(line.startswith('peak memory: not measured for compiled steps') for line in lines)


def test_paper_variant_is_the_packaged_reference_with_the_same_weights():
    from sa_vision.research.paper_reference import PaperDenseSA
    model, paper = [v.model for v in sab.build_variants('sa_gen_pruned', ['paper'], **dict(TINY, heads_per_layer=3))]
    assert isinstance(paper, PaperDenseSA) and paper.kind == 'generalized' and paper.heads_per_layer == (3,)
    model.eval(), paper.eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        reference = copy.deepcopy(model).double()(x.double())
        assert_network_float32_close(paper(x), reference, sa_model_reduction_lengths(model, 16))
    assert all(p.data_ptr() != q.data_ptr() for p in paper.parameters() for q in model.parameters())  # a copy
    with pytest.raises(ValueError, match='no paper formulation'):
        sab.build_variants('sa_content_cifar', ['paper'], **TINY)


def test_cli_compare_paper_runs_in_a_clone_without_shared(tmp_path):
    """sa-vision-benchmark --compare paper from a copy of the package alone: nothing beside the repository (no
    ../shared) is needed, and the copy's own sa_vision is the one that runs."""
    clone = tmp_path / 'clone'
    shutil.copytree(os.path.join(REPO, 'sa_vision'), clone / 'sa_vision', ignore=shutil.ignore_patterns('__pycache__'))
    assert not (tmp_path / 'shared').exists()
    argv = ['--model', 'sa_quadratic_cifar', '--model-kwargs', *TINY_ARGS, '--img-size', '8', '-b', '2',
            '--runs', '1', '--num-warm-iter', '0', '--compare', 'paper', '--results-format', 'json',
            '--results-file', str(tmp_path / 'r.json'), '--quiet']
    script = (
        'import runpy, sys\n'
        f'sys.argv = ["sa-vision-benchmark", *{argv!r}]\n'
        'try:\n'
        '    runpy.run_module("sa_vision.cli.benchmark", run_name="__main__", alter_sys=True)\n'
        'except SystemExit as e:\n'
        '    assert not e.code, e.code\n'
        'print("SA_VISION", sys.modules["sa_vision"].__file__)\n')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    proc = subprocess.run([sys.executable, '-c', script], cwd=clone, env=dict(env, OMP_NUM_THREADS='1'),
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'SA_VISION {clone / "sa_vision" / "__init__.py"}' in proc.stdout
    ours, paper = json.loads((tmp_path / 'r.json').read_text())
    assert (ours['model'], paper['model']) == ('sa_quadratic_cifar', 'sa_quadratic_cifar[paper]')
    assert ours['macs'] == SEPARABLE_MACS and paper['train_ratio'] > 0 and paper['infer_ratio'] > 0


def test_paper_variant_takes_kind_and_heads_from_the_model():
    from sa_vision.paper import PRUNED_HEADS_PER_LAYER
    small = dict(embed_dim=8, mlp_hidden_dim=16)  # the registered heads per layer
    for name, kind in (('sa_quadratic_cifar', 'quadratic'), ('sa_gen_pruned', 'generalized'),
                       ('sa_learned_cifar', 'learned')):
        model, paper = [v.model for v in sab.build_variants(name, ['paper'], **small)]
        assert paper.kind == kind and paper.heads_per_layer == tuple(model.heads_per_layer)
    assert paper.heads_per_layer == (9,) * 6
    pruned = sab.build_variants('sa_gen_pruned', ['paper'], **small)[1].model
    assert pruned.heads_per_layer == PRUNED_HEADS_PER_LAYER
    # by kind, not by name: a quadratic model built with generalized attention is compared as generalized
    assert sab.build_variants('sa_quadratic_cifar', ['paper'], attn_kind='generalized', **TINY)[1].model.kind == \
        'generalized'
    for name in ('resnet18_cifar', 'sa_content_cifar'):
        with pytest.raises(ValueError, match='no paper formulation'):
            sab.paper_model_like(name, timm.create_model(name, **(TINY if name.startswith('sa_') else {})))


def test_package_independence():
    for root, _, files in os.walk(os.path.join(REPO, 'sa_vision')):
        for f in files:
            if f.endswith('.py'):
                with open(os.path.join(root, f), encoding='utf-8') as fh:
                    text = fh.read()
                assert 'import paper_dense' not in text and 'paper_dense.py' not in text, f
                assert "'shared'" not in text and '../shared' not in text, f  # no path beside the checkout


def test_step_dtype_and_matmul_rate_dtype(monkeypatch):
    assert sab.compute_dtype('float32', amp=True, amp_dtype='bfloat16') == torch.bfloat16
    assert sab.compute_dtype('float32', amp=False, amp_dtype='bfloat16') == torch.float32
    assert sab.compute_dtype('float16') == torch.float16
    timed = []
    monkeypatch.setattr(sab, 'matmul_rate', lambda *a, dtype=torch.float32, **k: timed.append(dtype) or 1.0)
    variants = sab.build_variants('sa_quadratic_cifar', **TINY)
    (row,) = sab.benchmark_variants(variants, batch_size=2, input_size=(3, 8, 8), device='cpu', warmup=0, runs=2,
                                    measure_memory=False, matmul_size=64, amp=True, amp_dtype='bfloat16')
    assert timed == [torch.bfloat16] * 2 and row['matmul_dtype'] == 'bfloat16'


def test_peak_memory_step_starts_without_the_previous_gradients():
    runner = sab.StepRunner(sab.Variant('m', nn.Sequential(nn.Flatten(), nn.Linear(12, 10))), 4, (3, 2, 2),
                         torch.device('cpu'))
    runner.train_step()
    grads_at_start = []
    runner.peak(lambda: grads_at_start.extend(p.grad for p in runner.train_model.parameters()))
    assert grads_at_start == [None, None]
    # the step's own gradients are in its peak: at least the parameters' size again (CPU tracker)
    params_bytes = sum(p.numel() * p.element_size() for p in runner.train_model.parameters())
    assert runner.peak(runner.train_step) >= params_bytes


class _StepRecorder(nn.Module):
    """Records how its forward runs: input dtype and layout, autocast dtype, whether under torch.compile."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(12, 10)
        self.calls = []

    def forward(self, x):
        autocast = torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu') else None
        self.calls.append((x.dtype, x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(),
                           autocast, torch.compiler.is_compiling()))
        return self.head(x.flatten(1))


def test_profile_runs_the_configured_step():
    recorder = _StepRecorder()
    table = sab.profile_train_step(recorder, 4, (3, 2, 2), device='cpu', warmup=0, amp=True, amp_dtype='bfloat16',
                                   channels_last=True)
    assert 'Self CPU' in table
    assert recorder.calls == [(torch.float32, True, torch.bfloat16, False)]
    recorder = _StepRecorder()
    sab.profile_train_step(recorder, 4, (3, 2, 2), device='cpu', warmup=0, precision='bfloat16',
                           torchcompile='eager')
    assert recorder.calls[-1] == (torch.bfloat16, False, None, True)


def test_cli_profiles_the_configured_step(monkeypatch, capsys):
    cli = _load_cli()
    profiled = []
    monkeypatch.setattr(sab, 'profile_train_step', lambda model, *args, **kwargs: profiled.append(kwargs) or 'TABLE')
    argv = ['--model', 'sa_quadratic_cifar', '--model-kwargs', *TINY_ARGS, '--img-size', '8', '-b', '2', '--runs', '0',
            '--num-warm-iter', '0', '--no-memory', '--profile', '--device', 'cpu', '--amp', '--channels-last',
            '--quiet']
    assert cli.main(argv) == 0
    assert profiled == [dict(device=torch.device('cpu'), precision='float32', amp=True, amp_dtype='bfloat16',
                             channels_last=True, torchcompile=None)]
    assert 'bfloat16 autocast' in capsys.readouterr().out


def test_batched_variant_runs_the_batched_path_with_the_same_weights():
    from sa_vision.layers import PositionalAttention
    model, batched = sab.build_variants('sa_quadratic_cifar', ['batched'], **TINY)
    assert batched.name == 'sa_quadratic_cifar[batched]'
    layers = [m for m in batched.model.modules() if isinstance(m, PositionalAttention)]
    x = torch.randn(2, 3, 8, 8)
    model.model.eval(), batched.model.eval()
    with torch.no_grad(), batched.context():
        assert layers and all(m.batched_heads for m in layers)
        out = batched.model(x)
    assert not any(m.batched_heads for m in layers)
    with torch.no_grad():
        reference = copy.deepcopy(model.model).double()(x.double())
    assert_network_float32_close(out, reference, sa_model_reduction_lengths(model.model, 16))


def test_fused_variant_runs_the_triton_kernel_with_the_same_weights(monkeypatch):
    """'fused': a copy inside fused_mix_and_project, launching the kernel (in triton's CPU interpreter here), equal
    to the model in float64."""
    from sa_vision.layers import PositionalAttention, triton_mixing
    if triton_mixing.triton is None:
        pytest.skip('triton is not installed')
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    launches, launch = [], triton_mixing._chain
    monkeypatch.setattr(triton_mixing, '_chain', lambda *a, **k: launches.append(1) or launch(*a, **k))
    model, fused = sab.build_variants('sa_quadratic_cifar', ['fused'], **TINY)
    assert fused.name == 'sa_quadratic_cifar[fused]'
    layers = [m for m in fused.model.modules() if isinstance(m, PositionalAttention)]
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    model.model.double().eval(), fused.model.double().eval()
    with torch.no_grad(), fused.context():
        assert layers and all(m.fused_kernel for m in layers)
        out = fused.model(x)
    assert launches and not any(m.fused_kernel for m in layers)
    with torch.no_grad():
        torch.testing.assert_close(out, model.model(x), rtol=0, atol=1e-12)

# the peers of --compare (sa_vision.measure.peers): timm's ViT and ConViT at patch 2, 6 layers of 9 heads, width 72
PEER_WIDTH, PEER_HIDDEN, PEER_DEPTH, PEER_HEADS = 72, 144, 6, 9


def _vit_peer_macs(img: int) -> int:
    """A hand count of timm's ViT at patch 2 on an img x img RGB input: the patch embedding (a 2x2 stride-2 conv,
    3 -> 72), per layer the qkv, output and MLP products of every token and attention's two (hw)^2 products
    (scores and weighted sum, 8 channels per head over 9 heads: 72), then the classifier on the pooled token."""
    tokens, d = (img // 2) ** 2, PEER_WIDTH
    per_layer = tokens * (3 * d * d + d * d + 2 * d * PEER_HIDDEN) + 2 * tokens * tokens * d
    return tokens * 3 * 4 * d + PEER_DEPTH * per_layer + d * CLASSES


@pytest.mark.parametrize('img', [32, 64])
def test_vit_peer_macs_count_its_attention(img):
    # FlopCounterMode knows no CPU flash-attention kernel: without sa_vision.measure.macs' mapping for it the
    # attention's (hw)^2 products would be missing from the count
    vit = sab.build_variants('vit_peer', input_size=(3, img, img))[0].model
    assert sab.count_macs(vit, (3, img, img)) == _vit_peer_macs(img)


@pytest.mark.parametrize('peer', ['vit_peer', 'convit_peer'])
def test_peers_are_built_for_the_input_size_at_patch_2(peer):
    sa_model, peer_variant = sab.build_variants('sa_quadratic_cifar', [peer],
                                                input_size=(3, 64, 64), embed_dim=64, mlp_hidden_dim=128)
    model = peer_variant.model
    assert peer_variant.name == peer
    assert model.patch_embed.grid_size == (32, 32)  # patch 2 whatever the input size: a grid like ours
    assert len(model.blocks) == PEER_DEPTH and model.num_features == PEER_WIDTH
    out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, CLASSES)
    # about the narrow SA model's size: within a third of its parameters
    ours, theirs = (sum(p.numel() for p in m.parameters()) for m in (sa_model.model, model))
    assert abs(theirs - ours) < ours / 3


def test_unknown_peer_or_comparison_names_the_peers():
    with pytest.raises(sa_vision.errors.UserError, match='vit_peer'):
        sab.build_variants('sa_quadratic_cifar', ['vit_pear'], embed_dim=8, depth=1, heads_per_layer=1,
                           mlp_hidden_dim=8)


def test_weights_are_measured_at_their_own_input_size_and_a_typo_names_the_model(tmp_path, capsys):
    """--model local-dir:<folder>, as timm's benchmark.py takes it: a kept Fashion-MNIST model takes 28x28 images
    (it pads them itself), so it is measured there, not at CIFAR's 32x32; a misspelt name gets 'did you mean'."""
    from sa_vision.train.checkpoint import load_model
    kept = os.path.join(REPO, 'zoo', 'fashion-mnist-cpu', 'sa_quadratic_cifar')
    out = tmp_path / 'row.json'
    assert _load_cli().main(['--model', f'local-dir:{kept}', '--bench', 'inference', '-b', '2', '--runs', '1',
                             '--num-warm-iter', '0', '--results-format', 'json', '--results-file', str(out),
                             '--quiet', '--threads', '1']) == 0
    (row,) = json.loads(out.read_text())
    model = load_model(kept)
    assert row['macs'] == sa_vision.measure.count_macs(model, (3, 28, 28)) != sa_vision.measure.count_macs(
        model, (3, 32, 32))
    with pytest.raises(sa_vision.errors.UserError, match="did you mean 'sa_quadratic_cifar'"):
        sab.build_variants('sa_quadratic_cifr', [])


def _tensors_held(model: nn.Module) -> dict:
    """Every tensor a model holds between calls: parameters, buffers, plain tensor attributes, by module."""
    return {(name, key): t for name, module in model.named_modules()
            for key, t in [*module._parameters.items(), *module._buffers.items(), *vars(module).items()]
            if isinstance(t, torch.Tensor)}


@pytest.mark.parametrize('compare', ['self', 'paper', 'dense', 'vit_peer', 'sa_gen_cifar', 'resnet18_cifar'])
def test_compiled_steps_keep_no_tensor_of_theirs_in_the_model(compare):
    """What torch.compile(mode='reduce-overhead') needs of every variant the GPU device check times: a compiled
    call stores none of its own tensors in the model (a buffer cached in forward). CUDA graphs replay into the
    same output memory, so such a tensor is overwritten by the next step, which then fails reading it ("accessing
    tensor output of CUDAGraphs that has been overwritten"); dynamo's 'eager' backend shows it without a GPU.
    Steady calls reuse their graphs (a second graph per call would be recorded again each time)."""
    compare_kwargs = {'vit_peer': dict(embed_dim=12, depth=1, num_heads=3),
                      'resnet18_cifar': dict(channels=(8, 16, 32, 64))}
    torch.manual_seed(0)
    variants = sab.build_variants('sa_quadratic_cifar', [] if compare == 'self' else [compare],
                                  compare_kwargs=compare_kwargs, input_size=(3, 8, 8), **TINY)
    variant = variants[-1]
    runner = sab.StepRunner(variant, 2, (3, 8, 8), torch.device('cpu'), torchcompile='eager',
                         torchcompile_mode='reduce-overhead')
    before = _tensors_held(variant.model)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    for _ in range(2):
        runner.train_step()
        runner.infer_step()
    graphs = counters['stats']['unique_graphs']
    runner.train_step()
    runner.infer_step()
    after = _tensors_held(variant.model)
    assert after.keys() == before.keys()
    assert [key for key, t in after.items() if t is not before[key]] == [], 'tensors replaced by a compiled call'
    assert counters['stats']['unique_graphs'] == graphs, 'steady steps compiled again'


@pytest.mark.parametrize('name,switch', [('sa_gen_cifar', 'dense'), ('sa_gen_cifar', 'separable'),
                                         ('sa_content_cifar', 'fused'), ('resnet18_cifar', 'batched')])
def test_a_switch_that_would_change_nothing_is_refused(name, switch):
    """A model without the layer a switch changes (the generalized kind is always dense, the content kind never
    takes the kernel, the ResNet has no attention) would be timed against itself: a 1.00x that means nothing."""
    kwargs = {} if name == 'resnet18_cifar' else TINY
    with pytest.raises(sa_vision.errors.UserError, match=f'--compare {switch}: {name} has no'):
        sab.build_variants(name, [switch], **kwargs)
    assert len(sab.build_variants('sa_quadratic_cifar', [switch], **TINY)) == 2  # where it changes something


def test_projfirst_is_dense_projected_first_and_refused_where_nothing_runs_batched():
    """``projfirst`` times the same weights dense and projected first: refused for a model with no content-free layer
    and in float32 eager steps on the CPU (per head: it would run as ``dense``), timed under autocast."""
    with pytest.raises(sa_vision.errors.UserError, match='--compare projfirst: sa_content_cifar has no'):
        sab.build_variants('sa_content_cifar', ['projfirst'], **TINY)
    variants = sab.build_variants('sa_quadratic_cifar', ['dense', 'projfirst'], **TINY)
    layer = next(m for m in variants[2].model.modules() if isinstance(m, sa_vision.layers.PositionalAttention))
    with variants[2].context():
        assert layer.dense and layer.project_first
    assert layer.dense is None and layer.project_first is None
    run = lambda **setting: sab.benchmark_variants(  # noqa: E731
        variants, batch_size=2, input_size=(3, 8, 8), device='cpu', warmup=0, runs=1, measure_memory=False, **setting)
    with pytest.raises(sa_vision.errors.UserError, match='--compare projfirst: no attention layer of '
                                                         'sa_quadratic_cifar runs batched here'):
        run()
    assert [row['model'] for row in run(amp=True)] == [
        'sa_quadratic_cifar', 'sa_quadratic_cifar[dense]', 'sa_quadratic_cifar[projfirst]']


@pytest.mark.parametrize('switch,setting,changes', [
    ('batched', dict(), True),  # float32 eager on the CPU: one head at a time, unless switched
    ('batched', dict(amp=True), False),  # autocast, low precision and graphs always run batched
    ('batched', dict(precision='bfloat16'), False),
    ('batched', dict(torchcompile='eager'), False),
    ('dense', dict(amp=True), True),  # the CPU mixes separable kinds by their factors in every setting
    ('dense', dict(torchcompile='eager'), True),
    ('separable', dict(amp=True), False),  # the CPU's own form; on CUDA, dense by default, it is the other one
])
def test_a_switch_that_changes_no_path_in_the_steps_setting_is_refused(switch, setting, changes):
    """The switch is timed in the steps' setting: where the model's own steps already run every layer the way the
    switch asks (docs/attention.md, "Why each path": only float32 eager steps on the CPU take the per-head path),
    the pair would be the model against itself; the refusal names the setting."""
    variants = sab.build_variants('sa_quadratic_cifar', [switch], **TINY)
    run = lambda: sab.benchmark_variants(variants, batch_size=2, input_size=(3, 8, 8), device='cpu', warmup=0,
                                         runs=1, measure_memory=False, **setting)  # noqa: E731
    if changes:
        assert [row['model'] for row in run()] == ['sa_quadratic_cifar', f'sa_quadratic_cifar[{switch}]']
    else:
        with pytest.raises(sa_vision.errors.UserError, match=rf'--compare {switch}: sa_quadratic_cifar already '
                                                               rf'runs every attention layer that way here \(cpu, '):
            run()



@pytest.mark.skipif(not hasattr(torch._dynamo.config, 'trace_autograd_ops'), reason='torch without trace_autograd_ops')
def test_whole_step_variant_compiles_the_backward_into_the_graph_and_trains_like_eager():
    """A whole-step variant compiles forward, loss, backward and the SGD step as one function, dynamo tracing the
    backward (trace_autograd_ops, on only while it runs): its parameters after three steps are an eager runner's,
    and the only graph breaks are the optimizer step's own (torch.optim breaks around it on purpose), not one at
    ``loss.backward()``."""
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    model = timm.create_model('sa_quadratic_cifar', embed_dim=16, heads_per_layer=4, depth=2, mlp_hidden_dim=32,
                              num_classes=10, attn_drop_rate=0., proj_drop_rate=0.)

    def trained(whole_step: bool, torchcompile):
        variant = sab.Variant('v', copy.deepcopy(model), whole_step=whole_step)
        runner = sab.StepRunner(variant, 4, (3, 32, 32), torch.device('cpu'), torchcompile=torchcompile, lr=1e-2)
        for _ in range(3):
            runner.train_step()
        return [p.detach() for p in runner.train_model.parameters()]

    eager = trained(False, None)
    torch._dynamo.reset()
    # both runs on this CPU run the same ATen kernels on the same numbers, so the CPU's own rounding is common to
    # them: what may differ is only the order dynamo's traced backward accumulates in, a few ulps of each update
    counters.clear()
    whole = trained(True, 'eager')
    assert max((a - b).abs().max().item() for a, b in zip(eager, whole)) < 1e-5
    breaks = [reason for reason, n in counters['graph_break'].items() for _ in range(n)]
    assert breaks and all('graph_break()' in reason for reason in breaks), breaks
    assert counters['stats']['unique_graphs'] == 2  # the step up to the optimizer, the optimizer's update
    assert torch._dynamo.config.trace_autograd_ops is False


def test_a_torch_that_cannot_trace_the_backward_is_told_before_any_model_compiles(monkeypatch):
    """backward_tracing_problem tries a two-weight Linear: None on a torch whose dynamo traces loss.backward() (as
    the test above checks on a model), the reason where it does not (here: with the tracing left off, as a torch
    without it runs); a whole-step runner then stops before it compiles its model for minutes."""
    from torch._dynamo.utils import counters

    from sa_vision.measure import runner as runner_module
    if hasattr(torch._dynamo.config, 'trace_autograd_ops'):
        before = {name: dict(counter) for name, counter in counters.items()}
        rng = torch.random.get_rng_state()
        assert runner_module.backward_tracing_problem.__wrapped__() is None
        assert torch.equal(torch.random.get_rng_state(), rng)  # the caller's random stream untouched
        assert {name: dict(counter) for name, counter in counters.items() if counter} == \
            {name: counter for name, counter in before.items() if counter}  # its own graph left uncounted
        torch._dynamo.reset()  # dynamo's cache of the probe's code holds the graph traced above, whatever the flag
        assert 'Unsupported' in runner_module.backward_tracing_problem.__wrapped__(trace_autograd_ops=False)
    monkeypatch.setattr(runner_module, 'backward_tracing_problem', lambda: 'torch 9.9: no tracing')
    model = timm.create_model('sa_quadratic_cifar', embed_dim=16, heads_per_layer=4, depth=2, mlp_hidden_dim=32)
    compiled = []
    monkeypatch.setattr(torch, 'compile', lambda *a, **k: compiled.append(a) or a[0])
    with pytest.raises(sa_vision.errors.UserError, match='whole training step needs a torch whose dynamo traces the '
                                                         'backward into the graph: torch 9.9: no tracing'):
        sab.StepRunner(sab.Variant('v', model, whole_step=True), 4, (3, 32, 32), torch.device('cpu'),
                       torchcompile='inductor')
    assert len(compiled) == 2  # the model for training and inference, as every compiled runner; no step


def test_compiled_autograd_variant_traces_its_backward_and_trains_like_the_model_compiled_step():
    """A compiled-autograd variant runs its backward through compiled autograd (one capture, reused by the later
    steps) and leaves the optimizer outside: its parameters after three steps are those of the same weights with
    the model alone compiled (the same backend, so the same kernels: equal to float32's last bit here); without
    compilation the flag does nothing."""
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    model = timm.create_model('sa_quadratic_cifar', embed_dim=16, heads_per_layer=4, depth=2, mlp_hidden_dim=32,
                              num_classes=10, attn_drop_rate=0., proj_drop_rate=0.)

    def trained(compiled_autograd: bool, torchcompile='aot_eager'):
        variant = sab.Variant('v', copy.deepcopy(model), compiled_autograd=compiled_autograd)
        runner = sab.StepRunner(variant, 4, (3, 32, 32), torch.device('cpu'), torchcompile=torchcompile, lr=1e-2)
        for _ in range(3):
            runner.train_step()
        return [p.detach() for p in runner.train_model.parameters()]

    torch._dynamo.reset()
    counters.clear()
    model_compiled = trained(False)
    assert not counters['compiled_autograd']['captures']
    through_ca = trained(True)
    assert counters['compiled_autograd']['captures'] == 1
    assert all(torch.equal(a, b) for a, b in zip(model_compiled, through_ca))
    trained(True, None)
    assert counters['compiled_autograd']['captures'] == 1


def test_a_fused_optimizer_variant_steps_with_the_fused_sgd():
    """``fused_optimizer`` gives the runner torch's fused SGD (one launch, as the trainer's fused AdamW on CUDA),
    and only that variant; the fused step moves the weights as the foreach one does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 10))
    runners = [sab.StepRunner(sab.Variant(str(fused), copy.deepcopy(model), fused_optimizer=fused), 4, (3, 2, 2),
                           torch.device('cpu'), lr=1e-2) for fused in (True, False)]
    assert [r.optimizer.defaults.get('fused') for r in runners] == [True, None]
    for runner in runners:
        runner.train_step()
    for a, b in zip(*(r.train_model.parameters() for r in runners)):
        torch.testing.assert_close(a, b)


def test_unavoidable_macs_count_the_border_a_model_adds_itself():
    """A kept Fashion-MNIST export takes 28x28 and pads it to 32x32 itself: its 16x16 grid is counted, as for the
    same model fed 32x32 (the hand count of a padded 8x8 image here: 4x4 grid from 6x6 + a border of 1)."""
    padded = timm.create_model('sa_quadratic_cifar', input_padding=1, **TINY)
    assert sab.unavoidable_macs(padded, (3, 6, 6)) == SEPARABLE_MACS


def test_a_registered_model_is_measured_at_its_configs_input_size():
    """As timm's benchmark.py measures it: 224x224 for timm's ImageNet ViT, 32x32 for ours and the peers."""
    assert sab.input_size_of('vit_tiny_patch16_224') == (3, 224, 224)
    assert sab.input_size_of('sa_quadratic_cifar') == sab.input_size_of('vit_peer') == (3, 32, 32)


def test_a_model_whose_classifier_is_not_head_trains_with_fewer_classes(capsys):
    """resnet18_cifar's classifier is fc: --num-classes 5 draws its targets below 5 (not 10: a target of 7 would
    be out of bounds in the loss)."""
    cli = _load_cli()
    argv = ['--model', 'resnet18_cifar', '--model-kwargs', 'stem_width=8', '--num-classes', '5', '--img-size', '8',
            '-b', '2', '--runs', '1', '--num-warm-iter', '0', '--bench', 'train', '--no-memory', '--quiet']
    assert cli.main(argv) == 0 and 'resnet18_cifar' in capsys.readouterr().out


@pytest.mark.parametrize('argv, error', [
    (['--torchcompile', 'auto'], '--torchcompile auto chooses for a training run (sa-vision-train)'),
    (['--input-size', '3', '0', '0'], '--input-size 3 0 0: channels, height and width are at least 1'),
    (['--model', 'sa_quadratic_cifar', 'resnet18_cifarr'], "unknown model 'resnet18_cifarr'"),
    (['--model', 'sa_quadratic_cifar', 'resnet18_cifar'], "resnet18_cifar takes no keyword argument 'embed_dim'"),
])
def test_what_would_fail_after_timing_is_refused_before(argv, error, capsys):
    """A typo in the second model, a --model-kwargs the second model does not take, --torchcompile auto
    (sa-vision-train's choice) or a zero size: one line, before anything is timed (the first model's timings would
    be lost)."""
    from sa_vision.errors import run_cli
    cli = _load_cli()
    assert run_cli(cli.main, ['--model-kwargs', *TINY_ARGS, '-b', '2', '--runs', '1', *argv]) == 2
    err = capsys.readouterr().err
    assert error in err and 'run 1/1' not in err, err


def test_a_model_list_skips_indented_comments(tmp_path):
    cli = _load_cli()
    listed = tmp_path / 'models.txt'
    listed.write_text('sa_quadratic_cifar\n  # not now: sa_gen_cifar\n\n')
    assert cli._model_names(cli.build_parser().parse_args(['--model-list', str(listed)])) == ['sa_quadratic_cifar']


def test_the_benchmark_lets_dynamo_hold_every_compiled_copy(monkeypatch):
    """Each model the benchmark compiles is a copy of one class's code: past dynamo's default of 8 recompiles the
    later ones ran eagerly, timed as compiled. It held them by accident while `import sa_vision` imported
    timm.optim (which raises the limit); the benchmark raises it itself for its run, never lowering it."""
    import torch._dynamo

    from sa_vision.cli import benchmark as benchmark_cli
    from sa_vision.errors import UserError
    config = torch._dynamo.config
    monkeypatch.setattr(config, 'recompile_limit', 8)
    monkeypatch.setattr(config, 'cache_size_limit', 8)
    during = []

    def unknown(name):  # the models are checked after the settings, before any is built
        during.append((config.recompile_limit, config.cache_size_limit))
        raise UserError(f'no model {name}')
    monkeypatch.setattr(sab, 'check_model_name', unknown)
    with pytest.raises(UserError):
        benchmark_cli.main(['-m', 'sa_quadratic_cifar', '--device', 'cpu'])
    assert during == [(64, 64)]
    monkeypatch.setattr(config, 'recompile_limit', 1000)
    sab.hold_compiled_copies()
    assert config.recompile_limit == 1000


def test_the_benchmark_gives_back_the_callers_settings(tmp_path, monkeypatch):
    """--flush-denormal and the compiled copies the benchmark lets dynamo hold are for its run alone: called in a
    notebook's process, main leaves subnormal floats and dynamo's limits as they were."""
    cli = _load_cli()
    for name in ('recompile_limit', 'cache_size_limit'):
        monkeypatch.setattr(torch._dynamo.config, name, 8)  # torch's default (timm.optim's import sets 1,000,000)
    argv = ['--model', 'sa_quadratic_cifar', '--model-kwargs', *TINY_ARGS, '--img-size', '8', '-b', '2', '--runs',
            '1', '--num-warm-iter', '0', '--bench', 'inference', '--flush-denormal', '--quiet', '--results-file',
            str(tmp_path / 'r.json'), '--results-format', 'json']
    assert cli.main(argv) == 0
    assert float(torch.tensor([1e-39]) * 1.0) != 0  # a subnormal float32 survives
    assert (torch._dynamo.config.recompile_limit, torch._dynamo.config.cache_size_limit) == (8, 8)
