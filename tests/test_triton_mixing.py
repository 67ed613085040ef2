"""The fused Triton kernel (``mix_and_project``) against the dense formula of Eq. (9) written here, and against the
model's own attention + Value layers.

On the CPU the kernels run in Triton's interpreter: the ``interpret`` fixture sets ``TRITON_INTERPRET=1`` for each
test, which the module reads when it first wraps its kernel in that mode, so this works in a process (a pytest-xdist
worker) that imported triton before. A slow test compiles the kernel for an H100 without a GPU; the CUDA case
runs it on one (skipped without).
"""
import importlib.util
import sys
from types import SimpleNamespace

import pytest
import torch
from float32_bounds import assert_float32_close

from sa_vision.errors import UserError
from sa_vision.layers import HeadsLinear, PositionalAttention, triton_mixing
from sa_vision.layers.triton_mixing import mix_and_project

needs_triton = pytest.mark.skipif(triton_mixing.triton is None, reason='triton is not installed')


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')


@pytest.fixture
def small_blocks(monkeypatch):
    """16x16 tiles: the tiny sizes below then take several blocks in every loop, and the masks of the last one."""
    monkeypatch.setattr(triton_mixing, 'MAX_BLOCK', 16)


@pytest.fixture(params=(0, 3, 1000), ids=('one-chunk', 'chunks', 'chunk-per-term'))
def term_chunks(request, monkeypatch):
    """Every launch's terms summed in one program, in chunks of one or two (the default, with the interpreter's 4
    SMs assumed), or one term per program; checks that the launches did split."""
    chosen, choose = [], triton_mixing._term_splits
    monkeypatch.setattr(triton_mixing, 'PROGRAMS_PER_SM', request.param)
    monkeypatch.setattr(triton_mixing, '_term_splits', lambda *a: chosen.append(choose(*a)) or chosen[-1])
    yield
    assert chosen and (max(chosen) > 1) == (request.param > 0), chosen


def reference(x, probs, weight, bias):
    """``bias + sum_n (P_n x) W_n^T``, each head mixed over all tokens by the dense formula."""
    H, W, B, D = x.shape
    heads = torch.einsum('nts,sbd->ntbd', probs, x.reshape(H * W, B, D))  # heads, tokens, B, D
    out = torch.einsum('ntbd,cnd->tbc', heads, weight.unflatten(1, (probs.shape[0], D)))
    return (out if bias is None else out + bias).view(H, W, B, -1)


def random_inputs(grid, batch, dim, num_heads, out_features, with_bias, dtype, device='cpu'):
    H, W = grid
    g = torch.Generator().manual_seed(0)
    x = torch.randn(H, W, batch, dim, generator=g, dtype=torch.float64)
    probs = (3 * torch.randn(num_heads, H * W, H * W, generator=g, dtype=torch.float64)).softmax(-1)
    weight = torch.randn(out_features, num_heads * dim, generator=g, dtype=torch.float64) / dim ** 0.5
    bias = torch.randn(out_features, generator=g, dtype=torch.float64) if with_bias else None
    grad_out = torch.randn(H, W, batch, out_features, generator=g, dtype=torch.float64)
    inputs = [t if t is None else t.to(device, dtype).requires_grad_() for t in (x, probs, weight, bias)]
    return inputs, grad_out.to(device, dtype)


def run(fn, inputs, grad_out):
    out = fn(*inputs)
    wanted = [t for t in inputs if t is not None]
    return [out] + list(torch.autograd.grad(out, wanted, grad_out))


GRIDS = ((4, 4), (3, 5))  # square, and a non-square grid (rows != columns)


@needs_triton
@pytest.mark.usefixtures('interpret', 'small_blocks', 'term_chunks')
@pytest.mark.parametrize('grid', GRIDS)
@pytest.mark.parametrize('with_bias', (True, False))
def test_float64_matches_dense_formula(grid, with_bias):
    inputs, grad_out = random_inputs(grid, 3, 20, 2, 18, with_bias, torch.float64)
    for got, want, name in zip(run(mix_and_project, inputs, grad_out), run(reference, inputs, grad_out),
                               ('output', 'grad x', 'grad probs', 'grad weight', 'grad bias')):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=lambda m, name=name: f'{name}: {m}')


@needs_triton
@pytest.mark.usefixtures('interpret')
def test_an_empty_batch_gives_an_empty_result():
    """A batch of 0 images launches no program (its groups are the batch) and returns empty outputs, as the model's
    own path does, for the output and the gradients."""
    (x, probs, weight, bias), grad_out = random_inputs((4, 4), 0, 8, 2, 6, True, torch.float64)
    out = mix_and_project(x, probs, weight, bias)
    assert out.shape == (4, 4, 0, 6)
    out.backward(grad_out)
    assert x.grad.shape == x.shape and not weight.grad.abs().any() and not bias.grad.abs().any()


@needs_triton
@pytest.mark.usefixtures('interpret', 'small_blocks')
def test_strided_views():
    """Inputs and output gradient that are views with other strides (the kernel reads every operand through its
    strides): batch-major ``x`` permuted to grid-major, transposed probabilities and weight, a broadcast gradient."""
    (x, probs, weight, bias), grad_out = random_inputs((4, 5), 3, 20, 2, 18, True, torch.float64)
    views = [x.detach().permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3), probs.detach().mT.contiguous().mT,
             weight.detach().t().contiguous().t(), bias.detach()]
    assert not any(v.is_contiguous() for v in views[:3])
    views = [v.requires_grad_() for v in views]
    grad_out = grad_out[:, :, :1].expand_as(grad_out)  # stride 0 along the batch
    for got, want in zip(run(mix_and_project, views, grad_out), run(reference, views, grad_out)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@needs_triton
@pytest.mark.usefixtures('interpret', 'small_blocks')
@pytest.mark.parametrize('grid', GRIDS)
def test_float32_within_rounding_of_float64(grid):
    (H, W), B, D, heads, C = grid, 3, 20, 2, 18
    inputs, grad_out = random_inputs(grid, B, D, heads, C, True, torch.float32)
    reference_inputs = [t.detach().double().requires_grad_() for t in inputs]
    got = run(mix_and_project, inputs, grad_out)
    want = run(reference, reference_inputs, grad_out.double())
    T = H * W
    # each result's nested reductions: (mixing over tokens) then (projection), or the sums of a gradient
    lengths = {'output': T + heads * D, 'grad x': T + heads * C, 'grad probs': C + B * D,
               'grad weight': T + B * T, 'grad bias': B * T}
    for g, w, (name, n) in zip(got, want, lengths.items()):
        assert g.dtype == torch.float32
        assert_float32_close(g, w, n, msg=name)


@needs_triton
@pytest.mark.usefixtures('interpret', 'term_chunks')
@pytest.mark.parametrize('dtype', (torch.bfloat16, torch.float16))
def test_half_precision_within_its_rounding(dtype):
    """Within a few units of the dtype's rounding of the float64 formula on the same (rounded) inputs: the kernel
    rounds the mixed tile and the result once each, also where chunks of the terms are summed in float32 first
    (the interpreter rounds bfloat16 toward zero, the GPU to nearest), and a wrong formula misses by tens of
    percent."""
    inputs, grad_out = random_inputs((4, 5), 3, 20, 2, 18, True, dtype)
    reference_inputs = [t.detach().double().requires_grad_() for t in inputs]
    eps = torch.finfo(dtype).eps
    for g, w in zip(run(mix_and_project, inputs, grad_out), run(reference, reference_inputs, grad_out.double())):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), w, rtol=0, atol=3 * eps * w.abs().max().item())


@needs_triton
@pytest.mark.usefixtures('interpret')
def test_runs_in_the_autocast_dtype():
    """float32 inputs under autocast: the kernel runs in bfloat16, as the unfused products would."""
    inputs, grad_out = random_inputs((2, 3), 2, 5, 2, 4, True, torch.float32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = mix_and_project(*inputs)
    assert out.dtype == torch.bfloat16
    want = reference(*[t.detach().bfloat16().double() for t in inputs])
    eps = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(out.double(), want, rtol=0, atol=3 * eps * want.abs().max().item())
    out.backward(grad_out.bfloat16())
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in inputs)


@needs_triton
@pytest.mark.usefixtures('interpret')
@pytest.mark.parametrize('kind,grid', [('quadratic', (4, 4)), ('learned', (3, 5)), ('generalized', (3, 5))])
def test_equals_the_model_layers(kind, grid):
    """The layers' own path, ``value(attn.mix(x))``, in float64 eval mode: the output and the gradients of every
    parameter, through the probabilities' ``[row, col]`` (separable kinds) or ``[grid]`` list."""
    (H, W), B, D, heads = grid, 2, 6, 3
    torch.manual_seed(0)
    attn = PositionalAttention(D, heads, kind=kind, grid_major=True, max_shift=4, dtype=torch.float64).eval()
    value = HeadsLinear(heads * D, D, dtype=torch.float64)
    x = torch.randn(H, W, B, D, dtype=torch.float64, requires_grad=True)
    params = [x, *attn.parameters(), *value.parameters()]
    probs = attn.mixing_probs(H, W)
    assert len(probs) == (1 if kind == 'generalized' else 2)
    out = mix_and_project(x, probs, value.weight, value.bias)
    want = value(attn(x))
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    grad_out = torch.randn_like(out)
    got_grads = torch.autograd.grad(out, params, grad_out)
    want_grads = torch.autograd.grad(want, params, grad_out)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


class GridRecorder:
    """Stands in for the kernel: ``kernel[grid](...)`` records the grid and computes nothing."""

    def __init__(self, grids):
        self.grids = grids

    def __getitem__(self, grid):
        self.grids.append(grid)
        return lambda *args, **kwargs: None


@needs_triton
@pytest.mark.parametrize('width,split', [(64, ('grad probs', 'grad weight')), (400, ('grad probs',))])
def test_launch_splits_the_batch_where_programs_are_few(monkeypatch, width, split):
    """The launches of the narrow (width 64) and full-size (400) models, 9 heads on a 16x16 grid at batch 128, on
    an H100's 132 SMs: where a launch has at most 2 programs per SM (gradients with the heads as groups), its
    terms, the batch, are split so that it has 2 to 4; elsewhere (the batch as groups) it has one chunk."""
    sms, T, B, heads = 132, 16 * 16, 128, 9
    grids = []  # one (tiles, groups, chunks) per launch
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda device: SimpleNamespace(multi_processor_count=sms))
    monkeypatch.setattr(triton_mixing, '_compiled_kernel', lambda interpret: GridRecorder(grids))
    x, g, probs, weight = (torch.empty(*shape, dtype=torch.bfloat16)
                           for shape in ((T, B, width), (T, B, width), (heads, T, T), (width, heads * width)))
    token_blocks, width_blocks = -(-T // triton_mixing.MAX_BLOCK), -(-width // triton_mixing.MAX_BLOCK)
    products = {'output': (lambda: triton_mixing._forward(x, probs, weight, None), token_blocks * width_blocks, B),
                'grad x': (lambda: triton_mixing._grad_x(g, probs, weight), token_blocks * width_blocks, B),
                'grad probs': (lambda: triton_mixing._grad_probs(g, x, weight), token_blocks ** 2, heads),
                'grad weight': (lambda: triton_mixing._grad_weight(g, x, probs), width_blocks ** 2, heads)}
    for name, (launch, tiles, groups) in products.items():
        launch()
        got_tiles, got_groups, chunks = grids.pop()
        assert (got_tiles, got_groups) == (tiles, groups), name
        programs = tiles * groups
        if name in split:
            assert programs <= 2 * sms and 1 < chunks <= B and 2 * sms <= programs * chunks <= 4 * sms, (name, chunks)
        else:
            assert programs > 2 * sms and chunks == 1, (name, chunks)


@needs_triton
def test_tf32_follows_torch_through_either_api(monkeypatch):
    """float32 products in TF32 exactly where torch allows it, set through its new API (``fp32_precision``, after
    which reading the legacy ``allow_tf32`` raises) or the legacy one, and on a torch with only the legacy one."""
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    matmul = torch.backends.cuda.matmul

    def precision():
        return triton_mixing._constants(torch.float32, (16, 16, 16, 16), False)['INPUT_PRECISION']

    before = matmul.fp32_precision
    try:
        for value in ('tf32', 'ieee'):
            matmul.fp32_precision = value
            assert precision() == value
        for allowed in (True, False):
            matmul.allow_tf32 = allowed
            assert precision() == ('tf32' if allowed else 'ieee')
    finally:
        matmul.fp32_precision = before
    for allowed in (True, False):
        monkeypatch.setattr(torch.backends.cuda, 'matmul', SimpleNamespace(allow_tf32=allowed))
        assert precision() == ('tf32' if allowed else 'ieee')


def test_imports_without_triton_and_refuses_to_run(monkeypatch):
    """A fresh copy of the module with triton unimportable: it imports, and calling it says what is missing."""
    monkeypatch.setitem(sys.modules, 'triton', None)  # None in sys.modules: the import raises ImportError
    monkeypatch.setitem(sys.modules, 'triton.language', None)
    spec = importlib.util.spec_from_file_location('sa_vision.layers._triton_mixing_copy', triton_mixing.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.triton is None and not module.triton_available()
    (x, probs, weight, bias), _ = random_inputs((2, 2), 1, 3, 1, 2, True, torch.float32)
    with pytest.raises(UserError, match='needs triton'):
        module.mix_and_project(x, probs, weight, bias)


@needs_triton
def test_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    (x, probs, weight, bias), _ = random_inputs((2, 2), 1, 3, 1, 2, True, torch.float32)
    with pytest.raises(UserError, match='CUDA tensors'):
        mix_and_project(x, probs, weight, bias)


@needs_triton
@pytest.mark.usefixtures('interpret')
def test_refuses_mismatched_shapes():
    (x, probs, weight, bias), _ = random_inputs((2, 3), 1, 3, 2, 4, True, torch.float32)
    with pytest.raises(UserError, match='probs'):
        mix_and_project(x, probs[:, :4, :4], weight, bias)
    with pytest.raises(UserError, match='weight'):
        mix_and_project(x, probs, weight[:, :5], bias)


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize('dtype,has_bias,split', [(torch.bfloat16, True, False), (torch.bfloat16, False, False),
                                                   (torch.bfloat16, False, True), (torch.float32, True, False)])
def test_compiles_for_an_h100(monkeypatch, tmp_path, dtype, has_bias, split):
    """The kernel as the narrow model's forward and backward launch it, compiled for sm_90 (H100) without a GPU,
    also writing a float32 partial sum from bfloat16 inputs (a launch whose terms are split): the interpreter
    accepts what the GPU compiler may refuse (tile shapes, dtypes of a dot), and a kernel whose shared memory
    exceeds the H100's 227 KiB per block compiles but cannot launch."""
    pytest.importorskip('triton.backends.nvidia')
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setenv('TRITON_CACHE_DIR', str(tmp_path))
    kernel = triton_mixing._compiled_kernel(False)
    pointer = {torch.bfloat16: '*bf16', torch.float32: '*fp32'}[dtype]
    signature = {p.name: 'constexpr' if p.is_constexpr else pointer if p.name.endswith('_ptr') else 'i32'
                 for p in kernel.params}
    if split:
        signature['out_ptr'] = '*fp32'
    constants = triton_mixing._constants(dtype, (16 * 16, 16 * 16, 64, 64), has_bias)
    compiled = triton_mixing.triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget('cuda', 90, 32))
    assert 'cubin' in compiled.asm
    assert compiled.metadata.shared <= 227 * 1024


@pytest.mark.cuda
@needs_triton
@pytest.mark.parametrize('dtype', (torch.float32, torch.bfloat16))
def test_cuda_compiled_kernel(monkeypatch, dtype):
    """The compiled kernel at the narrow model's sizes (16x16 grid, D=64, 9 heads), against float64 on the GPU."""
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setattr(torch.backends.cuda.matmul, 'allow_tf32', False)
    (H, W), B, D, heads, C = (16, 16), 4, 64, 9, 64
    inputs, grad_out = random_inputs((H, W), B, D, heads, C, True, dtype, device='cuda')
    reference_inputs = [t.detach().double().requires_grad_() for t in inputs]
    got = run(mix_and_project, inputs, grad_out)
    want = run(reference, reference_inputs, grad_out.double())
    for g, w in zip(got, want):
        assert g.dtype == dtype
        if dtype == torch.float32:
            # the longest reduction of any result: a weight's gradient sums tokens x batch after a token mixing
            assert_float32_close(g, w, H * W + B * H * W)
        else:
            torch.testing.assert_close(g.double(), w, rtol=0, atol=3 * torch.finfo(dtype).eps * w.abs().max().item())


# ---- the kernel wired into the models: fused_mix_and_project

def tiny_model(name):
    import timm

    import sa_vision  # noqa: F401  (registers the models)
    torch.manual_seed(0)
    return timm.create_model(name, embed_dim=8, depth=2, heads_per_layer=2, mlp_hidden_dim=16, num_classes=3,
                             max_rel_shift=3).double()


@pytest.fixture
def kernel_launches(monkeypatch):
    """How many times the Triton kernel was launched since the test began (a list, one entry per launch)."""
    launches, launch = [], triton_mixing._chain
    monkeypatch.setattr(triton_mixing, '_chain', lambda *a, **k: launches.append(1) or launch(*a, **k))
    return launches


def step(model, x, switched, seed=1):
    """The output and every parameter's gradient of one training forward and backward (dropout on, same seed)."""
    from sa_vision.layers import fused_mix_and_project
    with fused_mix_and_project(model, switched):
        torch.manual_seed(seed)
        out = model(x)
        grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    return [out, *grads]


MODEL_CASES = [('sa_quadratic_cifar', (8, 8)), ('sa_learned_cifar', (8, 10)), ('sa_gen_cifar', (8, 10))]


@needs_triton
@pytest.mark.usefixtures('interpret')
@pytest.mark.parametrize('name,image', MODEL_CASES)
def test_switched_model_equals_the_model(name, image, kernel_launches):
    """The whole model in float64 training (dropout on, the same seed) with every layer through the kernel equals
    the model on its own path (the per-head Functions here): the output and every parameter's gradient. Separable
    kinds on a square and a non-square grid hand the kernel their dropped-out ``[row, col]`` factors."""
    model = tiny_model(name).train()
    x = torch.randn(2, 3, *image, dtype=torch.float64)
    want = step(model, x, False)
    assert not kernel_launches
    got = step(model, x, True)
    assert len(kernel_launches) == 2 * 4, 'two layers, each one forward and three backward products'
    for g, w, what in zip(got, want, ['output'] + [n for n, _ in model.named_parameters()]):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12, msg=lambda m, what=what: f'{what}: {m}')
    assert not any(m.fused_kernel for m in model.modules() if hasattr(m, 'fused_kernel')), 'switch restored'


@needs_triton
@pytest.mark.usefixtures('interpret')
def test_content_kind_and_captured_graphs_do_not_take_the_kernel(kernel_launches):
    """The content kind has no content-free probabilities to hand over; a TorchScript trace cannot record a
    Triton launch: both run their own path under the switch (and equal the model without it)."""
    from sa_vision.layers import fused_mix_and_project
    content = tiny_model('sa_content_cifar').eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    want = content(x)
    with fused_mix_and_project(content):
        torch.testing.assert_close(content(x), want, rtol=0, atol=0)
    model = tiny_model('sa_quadratic_cifar').eval()
    want = model(x)
    with fused_mix_and_project(model), torch.no_grad():
        traced = torch.jit.trace(model, (x,), check_trace=False)  # the check reruns the model in eager
    assert not kernel_launches
    torch.testing.assert_close(traced(x), want, rtol=0, atol=1e-12)


@needs_triton
@pytest.mark.usefixtures('interpret')
@pytest.mark.parametrize('backend', ('eager', 'aot_eager', pytest.param('inductor', marks=pytest.mark.slow)))
def test_compiled_switched_model_runs_the_kernel_and_matches_eager(backend, kernel_launches):
    """``torch.compile`` keeps the kernel's custom operators as calls in its graph (no graph break; aot_eager also
    runs their shape functions; inductor, as on a GPU, lays out their inputs and outputs itself, here with C++
    kernels around them): the compiled switched model launches it and equals the eager one."""
    import torch._inductor.config
    from torch._dynamo.utils import counters
    model = tiny_model('sa_quadratic_cifar').train()
    x = torch.randn(2, 3, 8, 10, dtype=torch.float64)
    want = step(model, x, True)
    kernel_launches.clear()
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch(fallback_random=True):  # inductor's dropout masks drawn as eager draws them
        got = step(torch.compile(model, backend=backend), x, True)
    assert len(kernel_launches) == 2 * 4
    assert not counters['graph_break'], dict(counters['graph_break'])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@needs_triton
@pytest.mark.usefixtures('interpret')
def test_compiled_switched_model_never_asks_whether_autocast_exists(monkeypatch, kernel_launches):
    """Dynamo before torch 2.14 cannot trace ``torch.amp.is_autocast_available``, which the kernel's inputs ask
    before they are cast: a graph break in every layer of the compiled model there. Under bf16 autocast, with that
    call made a graph break, the compiled switched model compiles whole (``fullgraph``) and launches the kernel."""
    from helpers import untraceable_autocast_availability

    from sa_vision.layers import fused_mix_and_project
    untraceable_autocast_availability(monkeypatch)
    model = tiny_model('sa_quadratic_cifar').float().train()
    torch._dynamo.reset()
    with fused_mix_and_project(model), torch.autocast('cpu', dtype=torch.bfloat16):
        out = torch.compile(model, backend='eager', fullgraph=True)(torch.randn(2, 3, 8, 8))
    assert out.dtype == torch.bfloat16 and len(kernel_launches) == 2  # two layers' forward, in bf16
    torch._dynamo.reset()


@needs_triton
def test_switched_model_refuses_to_run_where_triton_cannot(monkeypatch):
    """No silent fallback to the model's own path (a benchmark would compare the model with itself)."""
    from sa_vision.layers import fused_mix_and_project
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    model = tiny_model('sa_quadratic_cifar')
    with fused_mix_and_project(model), pytest.raises(UserError, match='needs triton'):
        model(torch.randn(1, 3, 8, 8, dtype=torch.float64))


@needs_triton
@pytest.mark.usefixtures('interpret')
def test_mac_count_of_the_switched_model_is_the_dense_paths():
    """The benchmark's MAC column (FlopCounterMode) counts the kernel's products: every head mixed densely, then
    the Value projection, the products of the dense path (dense_attention) counted from its own matrix products."""
    from sa_vision.layers import dense_attention, fused_mix_and_project
    from sa_vision.measure.macs import count_macs
    model = tiny_model('sa_quadratic_cifar')
    with dense_attention(model):
        dense = count_macs(model, (3, 8, 10))
    with fused_mix_and_project(model):
        assert count_macs(model, (3, 8, 10)) == dense
    assert count_macs(model, (3, 8, 10)) < dense  # separable: fewer


@needs_triton
@pytest.mark.usefixtures('interpret', 'small_blocks')
@pytest.mark.parametrize('with_bias', (True, False))
def test_custom_operators_pass_torch_library_opcheck(with_bias):
    """What torch.compile relies on for each of the kernel's four operators: the schema, the fake (shape, dtype and
    strides of the outputs, as inductor lays them out), the autograd registration and AOT dispatch."""
    (x, probs, weight, bias), grad_out = random_inputs((4, 4), 2, 8, 2, 6, with_bias, torch.float64)
    T, B, D, C = 16, 2, 8, 6
    x, grad_out = x.detach().reshape(T, B, D).requires_grad_(), grad_out.reshape(T, B, C)
    ops = torch.ops.sa_vision
    cases = [(ops.mix_and_project, (x, probs, weight, bias)),
             (ops.mix_and_project_grad_x, (grad_out, probs.detach(), weight.detach())),
             (ops.mix_and_project_grad_probs, (grad_out, x.detach(), weight.detach())),
             (ops.mix_and_project_grad_weight, (grad_out, x.detach(), probs.detach()))]
    for op, args in cases:
        torch.library.opcheck(op, args)
