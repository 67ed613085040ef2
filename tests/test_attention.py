"""The fast attention paths against a plain dense reference written here from the paper's Eq. (9) and App. A.1.

The reference builds every score from its formula over all (query, key) pairs of the grid, takes a
softmax over all keys and a weighted sum of the raw input; it shares only the parameter tensors with
the layer under test.

The exactness tests also run on CUDA (the ``device`` fixture of conftest.py) with TF32 off: there the
batched-heads path is the default (``choose_path``) and the content kind goes through CUDA's fused attention.
"""
import contextlib
import copy
import math

import pytest
import torch
from float32_bounds import assert_float32_close, assert_float32_gradients_close
from helpers import assert_bf16_close, exact_float32

from sa_vision.layers import PositionalAttention, dense_attention

KINDS = ('quadratic', 'generalized', 'learned', 'content')
# image sizes from the issue: 32x32 and the non-square 24x40, i.e. token grids 16x16 and 12x20
GRIDS = ((16, 16), (12, 20))


def grid_coordinates(grid_h, grid_w, dtype, device='cpu'):
    """(row, col) of every grid position in row-major order, (h*w, 2)."""
    coords = [(i, j) for i in range(grid_h) for j in range(grid_w)]
    return torch.tensor(coords, dtype=dtype, device=device)


def reference_scores(layer, x):
    """Scores [head, query, key] ([batch, head, query, key] with content) straight from Eq. (9) and App. A.1."""
    B, H, W, D = x.shape
    coords = grid_coordinates(H, W, x.dtype, x.device)
    delta = coords[None, :, :] - coords[:, None, :]  # key - query, (hw, hw, 2)
    pos = layer.position
    if layer.kind == 'quadratic':
        alpha = pos.precision_factors ** 2 / 2
        diff = delta[None] - pos.centers[:, None, None, :]
        return -alpha[:, None, None] * (diff ** 2).sum(-1)
    if layer.kind == 'generalized':
        M = torch.einsum('hij,hkj->hik', pos.precision_factors, pos.precision_factors)
        diff = delta[None] - pos.centers[:, None, None, :]
        return -0.5 * torch.einsum('hqki,hij,hqkj->hqk', diff, M, diff)
    # learned (and the positional part of content): tables indexed by the clipped shift per axis
    r = pos.max_shift
    dy = delta[..., 0].long().clamp(-r, r) + r
    dx = delta[..., 1].long().clamp(-r, r) + r
    rows = pos.row_shift_embed.weight[dy] @ pos.row_keys.weight.T  # hw, hw, heads
    cols = pos.col_shift_embed.weight[dx] @ pos.col_keys.weight.T
    scores = (rows + cols).permute(2, 0, 1)
    if layer.kind == 'learned':
        return scores
    tokens = x.reshape(B, H * W, D)
    q = (tokens @ layer.content.query.weight.T + layer.content.query.bias).view(B, H * W, -1, D)
    k = (tokens @ layer.content.key.weight.T + layer.content.key.bias).view(B, H * W, -1, D)
    return torch.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(D) + scores[None]


def reference_attention(layer, x):
    B, H, W, D = x.shape
    probs = reference_scores(layer, x).softmax(dim=-1)
    tokens = x.reshape(B, H * W, D)
    if probs.dim() == 3:
        out = torch.einsum('hqk,bkd->bqhd', probs, tokens)
    else:
        out = torch.einsum('bhqk,bkd->bqhd', probs, tokens)
    return out.reshape(B, H, W, -1)


def make_layer(kind, dtype, dim=6, num_heads=3, seed=0, device='cpu'):
    torch.manual_seed(seed)
    layer = PositionalAttention(dim, num_heads, kind, attn_drop=0.1).to(dtype).eval()
    with torch.no_grad():
        if kind in ('quadratic', 'generalized'):
            # precision factors that make the heads neither uniform nor one-hot, centres off the grid points
            layer.position.centers.copy_(torch.randn(num_heads, 2, dtype=dtype) * 2)
            layer.position.precision_factors.mul_(0.7)
    return layer.to(device)


def float64_copy(module, *tensors):
    """The float64 reference's inputs: a float64 copy of ``module`` and of each tensor, as new leaves."""
    return (copy.deepcopy(module).double(),) + tuple(t.detach().double().requires_grad_(t.requires_grad)
                                                     for t in tensors)


def _check_against_reference(kind, grid, dtype, dense, device):
    H, W = grid
    B = 2
    layer = make_layer(kind, dtype, device=device)
    layer.dense = dense
    x = torch.randn(B, H, W, layer.dim, dtype=dtype, device=device, requires_grad=True)
    # float32 is compared against float64 (a float32 reference is as inexact as the code under test)
    ref_layer, ref_x = float64_copy(layer, x)
    with exact_float32():  # float32 means float32 on a GPU too (no TF32)
        out = layer(x)
        ref = reference_attention(ref_layer, ref_x)
        assert out.shape == (B, H, W, layer.num_heads * layer.dim)
        weights = torch.randn_like(ref)
        params = [p for p in layer.parameters()]
        grads = torch.autograd.grad((out * weights.to(dtype)).sum(), [x] + params)
        ref_grads = torch.autograd.grad((ref * weights).sum(), [ref_x] + list(ref_layer.parameters()))
    if dtype == torch.float64:
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
        for g, rg in zip(grads, ref_grads):
            torch.testing.assert_close(g, rg, rtol=1e-9, atol=1e-11)
        return
    # an output sums over every key (and over the head dimension for content scores); a parameter's
    # gradient sums over the batch, every query and every key, then over the head dimension
    assert_float32_close(out, ref, reduction_length=H * W + layer.dim)
    assert_float32_gradients_close(grads, ref_grads, reduction_length=B * (H * W) ** 2 + layer.dim)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('grid', GRIDS, ids=lambda g: f'{g[0]}x{g[1]}')
@pytest.mark.parametrize('kind', KINDS)
def test_default_path_equals_dense_reference(kind, grid, dtype, device):
    _check_against_reference(kind, grid, dtype, dense=False, device=device)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('grid', GRIDS, ids=lambda g: f'{g[0]}x{g[1]}')
@pytest.mark.parametrize('kind', KINDS)
def test_dense_switch_equals_dense_reference(kind, grid, dtype, device):
    _check_against_reference(kind, grid, dtype, dense=True, device=device)


@pytest.mark.parametrize('kind', ('quadratic', 'learned'))
def test_separable_path_never_builds_the_full_matrix(kind, monkeypatch):
    layer = make_layer(kind, torch.float32)

    def forbidden(*args, **kwargs):
        raise AssertionError('the separable path built (h*w) x (h*w) scores')
    monkeypatch.setattr(layer.position, 'grid_scores', forbidden)
    x = torch.randn(1, 16, 16, layer.dim)
    largest = []

    def record(t):
        largest.append(t.numel())
    # nothing saved for backward is as large as the dense probabilities, heads x (h*w)^2
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (record(t), t)[1], lambda t: t):
        layer.train()(x.requires_grad_())
    assert max(largest) < layer.num_heads * (16 * 16) ** 2


@pytest.mark.parametrize('kind', ('quadratic', 'generalized', 'learned'))
def test_grid_scores_hold_one_grid_sized_tensor_at_a_time(kind):
    """The whole-grid scores (dense mixing, the generalized kind always) are built from per-axis terms: building
    them, with the graph for backward, holds the scores and less than half again their size. Grid-sized offsets
    and their products peaked at 5.2x (quadratic) and 8.2x (generalized): a dense layer's training step on a 32x32
    grid, 9 heads, batch 8, peaked at 325 MB, 155 MB per-axis."""
    from sa_vision.measure.memory import LiveTensorMemory
    layer = make_layer(kind, torch.float32)
    with LiveTensorMemory() as tracker:
        scores = layer.position.grid_scores(12, 20)
    assert scores.shape == (layer.num_heads, 12 * 20, 12 * 20) and scores.requires_grad
    assert tracker.peak < 1.5 * scores.nbytes


def test_generalized_applies_all_heads_in_one_product(monkeypatch):
    layer = make_layer('generalized', torch.float32)
    calls = []
    real_matmul = torch.matmul

    def counting_matmul(a, b):
        calls.append((tuple(a.shape), tuple(b.shape)))
        return real_matmul(a, b)
    monkeypatch.setattr(torch, 'matmul', counting_matmul)
    layer.grid_major = True
    layer(torch.randn(16, 16, 4, layer.dim))  # grid-major, as the models call it
    assert calls == [((layer.num_heads, 16 * 16, 16 * 16), (16 * 16, 4 * layer.dim))]


@pytest.mark.parametrize('kind', ('quadratic', 'generalized', 'learned'))
@pytest.mark.parametrize('dense', (False, True))
def test_one_dropout_mask_for_the_whole_batch(kind, dense):
    layer = make_layer(kind, torch.float64)
    layer.attn_drop = 0.5
    layer.dense = dense
    layer.train()
    sample = torch.randn(1, 8, 8, layer.dim, dtype=torch.float64)
    out = layer(sample.expand(4, -1, -1, -1).contiguous())
    # identical samples see the same mask, so give identical outputs ...
    for b in range(1, 4):
        torch.testing.assert_close(out[b], out[0], rtol=0, atol=0)
    # ... and dropout was active
    assert not torch.allclose(out[0], layer.eval()(sample)[0])


@pytest.mark.parametrize('fused', (False, True), ids=('explicit', 'sdpa'))
def test_content_attention_drops_probabilities_at_the_asked_rate(fused):
    """The content kind's attention dropout, through SDPA or the explicit formula (``fused_attn``): with the tokens
    the standard basis (D = h*w), every head's output is its row of probabilities itself, dropped. In training a
    fraction ``attn_drop`` of them is zero (within 6 standard errors) and the others are the reference softmax
    (Eq. 8 from the formula here) over ``1 - attn_drop``; in eval the reference softmax."""
    p, H, W = 0.3, 4, 4
    layer = make_layer('content', torch.float64, dim=H * W, num_heads=3)
    layer.fused_attn = fused
    layer.attn_drop = p
    B = 4
    x = torch.eye(H * W, dtype=torch.float64).reshape(1, H, W, H * W).expand(B, -1, -1, -1).contiguous()
    probs = reference_scores(layer, x).softmax(-1)  # batch, head, query, key
    assert probs.min() > 0, 'a zero probability would read as a dropped one'

    def as_probs(out):  # B, h, w, heads*D -> batch, head, query, key
        return out.reshape(B, H * W, layer.num_heads, H * W).permute(0, 2, 1, 3)
    with torch.no_grad():
        torch.testing.assert_close(as_probs(layer.eval()(x)), probs)
        torch.manual_seed(0)
        dropped = as_probs(layer.train()(x))
    zeros = dropped == 0
    torch.testing.assert_close(dropped[~zeros], probs[~zeros] / (1 - p))
    assert abs(zeros.double().mean().item() - p) <= 6 * (p * (1 - p) / zeros.numel()) ** 0.5, zeros.double().mean()


@pytest.mark.parametrize('dense', (False, True))
def test_dropout_keeps_the_expectation(dense):
    """Averaged over many masks the output approaches the dropout-free output."""
    torch.manual_seed(0)
    layer = make_layer('quadratic', torch.float64)
    layer.attn_drop = 0.3
    layer.dense = dense
    x = torch.randn(1, 6, 6, layer.dim, dtype=torch.float64)
    expected = layer.eval()(x)
    layer.train()
    mean = sum(layer(x) for _ in range(2000)) / 2000
    assert (mean - expected).abs().max() < 0.05 * expected.abs().max()


def test_large_precision_factor_peaks_at_the_centre():
    """A head's probabilities are a Gaussian centred at mu: for a sharp head the argmax is the nearest
    grid point to query + mu, and the probabilities fall off with the distance from it."""
    layer = PositionalAttention(4, 3, 'quadratic')
    centers = torch.tensor([[1.3, -2.2], [0.0, 0.0], [-3.6, 2.4]])
    with torch.no_grad():
        layer.position.centers.copy_(centers)
        layer.position.precision_factors.fill_(3.0)
    H = W = 16
    query = (8, 7)
    probs = layer.position_probs(H, W).detach()[:, query[0] * W + query[1]].reshape(3, H, W)
    for head, (dy, dx) in enumerate(centers.tolist()):
        peak = divmod(int(probs[head].argmax()), W)
        assert peak == (query[0] + round(dy), query[1] + round(dx))
        # isotropic: log-probability differences equal -alpha * (squared-distance differences)
        alpha = 3.0 ** 2 / 2
        target = (query[0] + dy, query[1] + dx)
        p1 = probs[head, peak[0], peak[1]]
        p2 = probs[head, peak[0] + 1, peak[1]]
        d1 = (peak[0] - target[0]) ** 2 + (peak[1] - target[1]) ** 2
        d2 = (peak[0] + 1 - target[0]) ** 2 + (peak[1] - target[1]) ** 2
        assert math.isclose(float(torch.log(p1 / p2)), alpha * (d2 - d1), rel_tol=1e-4)


@pytest.mark.parametrize('kind', ['quadratic', 'generalized'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_a_model_cast_to_16_bits_keeps_sharp_heads_finite_on_a_large_grid(kind, dtype):
    """``model.half()`` with trained, sharp precisions on a 30x30 grid: a far shift's squared distance times the
    precision overflows float16 (the generalized form's inf - inf was NaN), and bf16 lost whole units; the
    probabilities are those of Eq. 9 / App. A.1 in float64 from the same (rounded) parameters, to the dtype's
    rounding, and the forward is finite."""
    layer = PositionalAttention(4, 2, kind)
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor([[1.5, -2.0], [0.0, 3.0]]))
        layer.position.precision_factors.copy_(torch.tensor([8.0, 6.5]) if kind == 'quadratic' else
                                               torch.tensor([[[9.0, 0.5], [-8.0, 3.0]], [[5.0, 2.0], [0.0, 7.0]]]))
    layer = layer.to(dtype).eval()
    x = torch.randn(1, 30, 30, 4, dtype=dtype)
    reference = reference_scores(copy.deepcopy(layer).double(), x.double()).softmax(-1)
    probs = layer.position_probs(30, 30)
    assert probs.dtype == dtype and torch.isfinite(probs).all()
    assert (probs.double() - reference).abs().max() < 2 ** -7
    assert torch.isfinite(layer(x)).all()


def test_probabilities_renormalise_at_the_border():
    """No padding: a corner query's distribution sums to one over the keys that exist."""
    layer = PositionalAttention(4, 2, 'generalized')
    probs = layer.position_probs(5, 7)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 35))


def is_subnormal(t):
    return (t != 0) & (t.abs() < torch.finfo(t.dtype).tiny)


@pytest.mark.parametrize('kind', ['quadratic', 'generalized'])
def test_far_probabilities_are_zero_not_subnormal(kind):
    """Subnormal probabilities make every product with them slow on x86; they are zeroed, and the
    probabilities still equal a float64 softmax: relatively where they are kept (float32 scores near
    -100 carry ~1e-5 relative error into exp), absolutely below 1e-20 where they are dropped."""
    layer = PositionalAttention(4, 2, kind)  # default init: precision factor ~1, far keys underflow
    with torch.no_grad():
        layer.position.centers.zero_()
    exact = reference_scores(layer.double(), torch.zeros(1, 16, 16, 4, dtype=torch.float64)).softmax(-1)
    layer.float()
    plain_softmax = reference_scores(layer, torch.zeros(1, 16, 16, 4)).softmax(-1)
    assert is_subnormal(plain_softmax).any(), 'the scenario must produce subnormals without the guard'
    probs = layer.position_probs(16, 16)
    assert not is_subnormal(probs).any()
    torch.testing.assert_close(probs.double(), exact, rtol=1e-4, atol=1e-20)
    if layer.separable:
        with torch.no_grad():
            row_probs, col_probs = layer.eval().mixing_probs(16, 16)
        assert not is_subnormal(row_probs).any() and not is_subnormal(col_probs).any()

def test_a_layer_scripted_after_an_eval_forward_equals_eager():
    """TorchScript after the eval cache has been filled (it cannot hold the cache; the scripted layer recomputes)."""
    layer = make_layer('quadratic', torch.float64)
    x = torch.randn(2, 5, 4, layer.dim, dtype=torch.float64)
    with torch.no_grad():
        expected = layer(x)
        assert layer._probs_cache, 'the scenario needs a filled cache'
        torch.testing.assert_close(torch.jit.script(layer)(x), expected, rtol=1e-12, atol=1e-14)


def test_learned_clips_shifts_beyond_its_table():
    layer = make_layer('learned', torch.float64)
    scores = layer.position.grid_scores(1, 40)  # shifts up to 39 along columns, table holds 15
    # every key 15 or more columns to the right of query 0 gets the same score
    far = scores[:, 0, 15:]
    torch.testing.assert_close(far, far[:, :1].expand_as(far))


def test_dense_attention_context_manager_restores_the_mode():
    model = torch.nn.Sequential(make_layer('quadratic', torch.float32), make_layer('learned', torch.float32))
    for enabled in (True, False):
        with dense_attention(model, enabled):
            assert all(m.dense is enabled for m in model)
        assert all(m.dense is None for m in model), 'the device default again'


def test_unknown_kind_is_a_clear_error():
    with pytest.raises(ValueError, match='quadratic'):
        PositionalAttention(4, 2, 'gaussian')


@pytest.mark.parametrize('bias', (True, False))
def test_heads_linear_equals_linear_over_concatenated_heads(bias):
    from sa_vision.layers import HeadsLinear
    torch.manual_seed(0)
    heads, D, out_features = 3, 5, 4
    layer = HeadsLinear(heads * D, out_features, bias=bias).double()
    stacked = torch.randn(heads, 2, 6, 7, D, dtype=torch.float64, requires_grad=True)
    out = layer(stacked)
    # reference: concatenate the heads along channels (head-major) and apply a plain Linear
    concatenated = stacked.permute(1, 2, 3, 0, 4).reshape(2, 6, 7, heads * D)
    ref = torch.nn.functional.linear(concatenated, layer.weight, layer.bias)
    torch.testing.assert_close(out, ref)
    weights = torch.randn_like(ref)
    params = [stacked] + list(layer.parameters())
    for g, rg in zip(torch.autograd.grad((out * weights).sum(), params),
                     torch.autograd.grad((ref * weights).sum(), params)):
        torch.testing.assert_close(g, rg)
    torch.autograd.gradcheck(lambda t: layer(t), (stacked[:, :1, :2, :2].detach().requires_grad_(),))


def test_gelu_mlp_equals_linear_gelu_linear_and_saves_one_hidden_tensor():
    from sa_vision.layers import GeluMlp
    torch.manual_seed(0)
    mlp = GeluMlp(6, 10, drop=0.).double()
    x = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    out = mlp(x)
    # reference: the plain composition with the exact erf GELU written out
    hidden = x @ mlp.fc1.weight.T + mlp.fc1.bias
    activation = 0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))
    ref = activation @ mlp.fc2.weight.T + mlp.fc2.bias
    torch.testing.assert_close(out, ref)
    params = [x] + list(mlp.parameters())
    weights = torch.randn_like(ref)
    for g, rg in zip(torch.autograd.grad((out * weights).sum(), params),
                     torch.autograd.grad((ref * weights).sum(), params)):
        torch.testing.assert_close(g, rg)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(tuple(t.shape)), t)[1], lambda t: t):
        mlp(x)
    assert saved.count((3, 4, 10)) == 1  # the pre-activation; the activation is recomputed


def test_gelu_mlp_drops_out_after_fc2_in_training():
    """The layers' dropout after the MLP's second Linear (``proj_drop``, 0.1 in App. A.4): in training each output
    is ``fc2(gelu(fc1(x)))`` (torch's functions on the module's weights) times 0 or ``1 / (1 - p)``, about a
    fraction p of them zero; in eval nothing is dropped."""
    import torch.nn.functional as F

    from sa_vision.layers import GeluMlp
    torch.manual_seed(0)
    mlp = GeluMlp(6, 10, drop=0.5).double()
    x = torch.randn(64, 4, 6, dtype=torch.float64)
    ref = F.linear(F.gelu(F.linear(x, mlp.fc1.weight, mlp.fc1.bias)), mlp.fc2.weight, mlp.fc2.bias)
    torch.testing.assert_close(mlp.eval()(x), ref)
    out = mlp.train()(x)  # with autograd: the path that saves only the hidden pre-activation
    zeros = out == 0
    torch.testing.assert_close(out[~zeros], 2 * ref[~zeros])
    # a binomial count of zeroed outputs: within 6 standard errors of one half
    assert abs(zeros.double().mean().item() - 0.5) <= 6 * (0.25 / zeros.numel()) ** 0.5


# --- the batched-heads path: attention + Value with every head in one product and one Value GEMM ---

def reference_attend_then_project(layer, value, x, probs=None):
    """Value(concatenated heads) for grid-major x (h, w, B, D), from the dense formula: every head's softmax
    over all keys (or the given dense probabilities), a weighted sum of the raw input, the heads concatenated
    head-major along channels and one plain Linear."""
    H, W, B, D = x.shape
    channels_last = x.permute(2, 0, 1, 3)  # B, h, w, D
    if probs is None:
        heads = reference_attention(layer, channels_last)  # B, h, w, heads*D
    else:
        heads = torch.einsum('hqk,bkd->bqhd', probs, channels_last.reshape(B, H * W, D)).reshape(B, H, W, -1)
    out = torch.nn.functional.linear(heads, value.weight, value.bias)  # B, h, w, out
    return out.permute(1, 2, 0, 3)


def make_attention_and_value(kind, dtype, dense, device='cpu'):
    from sa_vision.layers import HeadsLinear
    layer = make_layer(kind, dtype, device=device)
    layer.dense = dense
    value = HeadsLinear(layer.num_heads * layer.dim, 5).to(device, dtype)
    return layer, value


def assert_outputs_and_gradients_match(out, ref, inputs, tol):
    torch.testing.assert_close(out, ref, **tol)
    weights = torch.randn_like(ref)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * weights).sum(), inputs)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, **tol)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('grid', GRIDS, ids=lambda g: f'{g[0]}x{g[1]}')
@pytest.mark.parametrize('dense', (False, True), ids=('separable', 'dense'))
@pytest.mark.parametrize('kind', ('quadratic', 'generalized', 'learned'))
def test_batched_heads_path_equals_dense_reference(kind, dense, grid, dtype, device):
    """Forward and gradients (input, positional parameters, Value) of the batched path, without dropout."""
    from sa_vision.layers import attend_then_project, batched_heads
    layer, value = make_attention_and_value(kind, dtype, dense, device)
    layer.train()
    layer.attn_drop = 0.
    x = torch.randn(*grid, 3, layer.dim, dtype=dtype, device=device, requires_grad=True)  # h, w, B, D
    calls = []
    value.register_forward_pre_hook(lambda m, args: calls.append('per-head Value'))
    pair = torch.nn.ModuleList([layer, value])
    with batched_heads(pair), exact_float32():
        out = attend_then_project(layer, value, x)
        assert not calls, 'the batched path must not go through the per-head HeadsLinear.forward'
        if dtype == torch.float64:
            ref = reference_attend_then_project(layer, value, x)
            assert_outputs_and_gradients_match(out, ref, [x] + list(pair.parameters()),
                                               dict(rtol=1e-10, atol=1e-12))
            return
        ref_pair, ref_x = float64_copy(pair, x)
        ref = reference_attend_then_project(ref_pair[0], ref_pair[1], ref_x)
        weights = torch.randn_like(ref)
        grads = torch.autograd.grad((out * weights.float()).sum(), [x] + list(pair.parameters()))
        ref_grads = torch.autograd.grad((ref * weights).sum(), [ref_x] + list(ref_pair.parameters()))
    # the Value output sums every key of every head: heads * (h*w) terms, then heads * D; a parameter's
    # gradient sums over the batch, every query and every key, then over the Value's outputs and D
    H, W, B, D = x.shape
    heads, outputs = layer.num_heads, value.weight.shape[0]
    assert_float32_close(out, ref, reduction_length=heads * (H * W + D))
    assert_float32_gradients_close(grads, ref_grads, reduction_length=B * (H * W) ** 2 + outputs * D)


@pytest.mark.parametrize('grid', GRIDS, ids=lambda g: f'{g[0]}x{g[1]}')
@pytest.mark.parametrize('kind', ('quadratic', 'learned'))
def test_apply_mixing_on_the_separable_path_equals_dense_reference(kind, grid, device):
    """The separable batched product of :func:`apply_mixing` (rows of every head, then each head's column matrix
    replicated per row), which inference and graph capture run: the training path above goes through
    ``separable_mixing`` instead. Eval without autograd through ``attend_then_project``, and with autograd
    through ``mix`` as a captured graph runs it."""
    from sa_vision.layers import attend_then_project, batched_heads
    layer, value = make_attention_and_value(kind, torch.float64, dense=False, device=device)
    x = torch.randn(*grid, 3, layer.dim, dtype=torch.float64, device=device, requires_grad=True)  # h, w, B, D
    tol = dict(rtol=1e-10, atol=1e-12)
    with batched_heads(torch.nn.ModuleList([layer, value])):
        with torch.no_grad():
            inferred = attend_then_project(layer, value, x)
            torch.testing.assert_close(inferred, reference_attend_then_project(layer, value, x), **tol)
        out = value.forward_batched(layer.mix(x))
    ref = reference_attend_then_project(layer, value, x)
    assert_outputs_and_gradients_match(out, ref, [x] + list(layer.parameters()) + list(value.parameters()), tol)


@pytest.mark.parametrize('dense', (False, True), ids=('separable', 'dense'))
@pytest.mark.parametrize('kind', ('quadratic', 'generalized', 'learned'))
def test_batched_heads_path_with_dropout_equals_dense_reference(kind, dense, device):
    """With attention dropout: the reference draws the same masks from the same seed on probabilities it
    computes itself. Dense: one (heads, h*w, h*w) mask. Separable on a square grid: one mask over the row
    and column factors stacked as (2, heads, n, n), each kept with sqrt(1 - p); the grid probabilities are
    the Kronecker product of the dropped factors."""
    from sa_vision.layers import attend_then_project, batched_heads
    if kind == 'generalized' and not dense:
        pytest.skip('generalized attention has no separable form')
    layer, value = make_attention_and_value(kind, torch.float64, dense, device)
    layer.train()
    layer.attn_drop = 0.3
    n = 6
    x = torch.randn(n, n, 3, layer.dim, dtype=torch.float64, device=device, requires_grad=True)
    torch.manual_seed(7)
    with batched_heads(torch.nn.ModuleList([layer, value])):
        out = attend_then_project(layer, value, x)

    scores = reference_scores(layer, x.detach().permute(2, 0, 1, 3))  # heads, n*n, n*n
    torch.manual_seed(7)
    if dense:
        probs = torch.nn.functional.dropout(scores.softmax(-1), 0.3, True)
    else:
        heads = layer.num_heads
        # a separable score is row[i, k] + col[j, l]: read both factors off the grid scores
        grid = scores.view(heads, n, n, n, n)  # head, query row, query col, key row, key col
        row, col = grid[:, :, 0, :, 0], grid[:, 0, :, 0, :]
        row = row - row[:, :, :1]  # the softmax ignores a per-query constant
        factors = torch.stack([row, col]).softmax(-1)  # 2, heads, n, n
        factors = torch.nn.functional.dropout(factors, 1 - math.sqrt(1 - 0.3), True)
        probs = torch.einsum('hik,hjl->hijkl', factors[0], factors[1]).reshape(heads, n * n, n * n)
    ref = reference_attend_then_project(layer, value, x, probs)
    assert not torch.allclose(ref, reference_attend_then_project(layer, value, x)), 'dropout must be active'
    assert_outputs_and_gradients_match(out, ref, [x] + list(layer.parameters()) + list(value.parameters()),
                                       dict(rtol=1e-10, atol=1e-12))


@pytest.mark.parametrize('kind', ('quadratic', 'learned'))
def test_batched_training_keeps_one_heads_sized_tensor(kind):
    """The separable batched path keeps for backward only the concatenated heads that Value needs, not also
    the row-mixed heads the column product would keep in plain autograd (recomputed instead)."""
    from sa_vision.layers import attend_then_project, batched_heads
    layer, value = make_attention_and_value(kind, torch.float32, dense=False)
    layer.train()
    x = torch.randn(4, 6, 3, layer.dim, requires_grad=True)  # h, w, B, D
    heads_sized = layer.num_heads * x.numel()
    saved = []
    with batched_heads(torch.nn.ModuleList([layer, value])), torch.autograd.graph.saved_tensors_hooks(
            lambda t: (saved.append(t.numel()), t)[1], lambda t: t):
        attend_then_project(layer, value, x)
    assert saved.count(heads_sized) == 1 and max(saved) == heads_sized, saved


@pytest.mark.parametrize('kind', ('quadratic', 'generalized', 'learned'))
def test_batched_training_step_under_bfloat16_autocast(kind):
    """A training step of the batched path under CPU bf16 autocast: output in bf16, gradients in the
    parameters' dtype and within bf16 rounding of the float32 step."""
    from sa_vision.layers import attend_then_project, batched_heads
    layer, value = make_attention_and_value(kind, torch.float32, dense=False)
    layer.train()
    layer.attn_drop = 0.
    x = torch.randn(4, 4, 3, layer.dim)
    params = list(layer.parameters()) + list(value.parameters())
    weights = torch.randn(4, 4, 3, 5)
    with batched_heads(torch.nn.ModuleList([layer, value])):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = attend_then_project(layer, value, x)
        grads = torch.autograd.grad((out.float() * weights).sum(), params)
    ref = reference_attend_then_project(layer, value, x)
    ref_grads = torch.autograd.grad((ref * weights).sum(), params)
    assert_bf16_close(out, ref, grads, ref_grads, params)


def test_batched_value_accumulates_the_heads_in_float32_under_autocast():
    """Under bfloat16 autocast the Value rounds once: its error against float64 is no larger than that of one
    autocast Linear over the concatenated heads (summing 9 heads in bfloat16 one by one was ~30 % worse)."""
    from sa_vision.layers import HeadsLinear
    torch.manual_seed(0)
    heads, D = 9, 64
    value = HeadsLinear(heads * D, 48)
    stacked = torch.randn(heads, 8, 8, 8, D).bfloat16()  # what the attention hands on under autocast
    concatenated = stacked.permute(1, 2, 3, 0, 4).reshape(8, 8, 8, heads * D)
    exact = torch.nn.functional.linear(concatenated.double(), value.weight.double(), value.bias.double())
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = value(stacked)
        bound = torch.nn.functional.linear(concatenated, value.weight, value.bias)
    assert out.dtype == torch.bfloat16
    error = (out.double() - exact).norm() / exact.norm()
    bound_error = (bound.double() - exact).norm() / exact.norm()
    assert error <= bound_error * 1.01, (float(error), float(bound_error))


def path(device_type='cpu', dtype=torch.float32, autocast=False, compiling=False, capturing=False, grad=True,
         training=True, separable=True, content=False, dense=None, batched=False, fused=False, cuda_dense=False):
    from sa_vision.layers import choose_path
    return choose_path(device_type, dtype, autocast, compiling, capturing, grad, training, separable, content, dense,
                       batched, fused, cuda_dense)


def test_choose_path_batches_everything_but_float32_and_float64_eager_on_the_cpu():
    assert not path().batched and not path(dtype=torch.float64).batched
    batched = [dict(batched=True), dict(dtype=torch.bfloat16), dict(dtype=torch.float16), dict(device_type='cuda'),
               dict(device_type='meta'), dict(autocast=True), dict(compiling=True), dict(capturing=True)]
    for case in batched:
        assert path(**case).batched, case


def test_choose_path_mixing_form_and_its_overrides():
    """Separable kinds mix by their factors unless forced dense, or on CUDA where ``cuda_dense`` (the constant
    ``CUDA_DENSE_MIXING``) says so; the generalized and content kinds are always dense; an override wins."""
    from sa_vision.layers import CUDA_DENSE_MIXING
    assert CUDA_DENSE_MIXING is True, 'dense on CUDA, as the compiled pair measured on an H100 (attention_path.py)'
    assert not path().dense and path(dense=True).dense
    assert path(separable=False).dense and path(separable=False, dense=False).dense
    assert path(content=True, separable=False).dense
    assert not path(device_type='cuda').dense and path(device_type='cuda', cuda_dense=True).dense
    assert not path(device_type='cpu', cuda_dense=True).dense
    assert not path(device_type='cuda', cuda_dense=True, dense=False).dense
    assert path(device_type='cuda', dense=True).dense


def test_choose_path_functions_and_cache():
    """Which hand-written Function runs: per head, attention + Value in one Function where recomputing the heads
    is cheap (separable) or there is no backward; batched, separable_mixing in eager training only. The eval
    cache only on the CPU, without autograd, in eval mode, outside graphs."""
    assert path().attend_then_project and path(grad=False, separable=False).attend_then_project
    assert not path(separable=False).attend_then_project and not path(dense=True).attend_then_project
    assert not path(content=True, separable=False, grad=False).attend_then_project
    assert not path(batched=True, grad=False).attend_then_project
    assert path(batched=True).recompute_mixing and path(device_type='cuda', autocast=True).recompute_mixing
    for case in (dict(), dict(batched=True, grad=False), dict(batched=True, dense=True), dict(compiling=True),
                 dict(capturing=True), dict(device_type='cuda', cuda_dense=True)):
        assert not path(**case).recompute_mixing, case
    assert path(grad=False, training=False).cache_probs
    for case in (dict(grad=False), dict(training=False), dict(grad=False, training=False, device_type='cuda'),
                 dict(grad=False, training=False, compiling=True), dict(grad=False, training=False, capturing=True)):
        assert not path(**case).cache_probs, case


def test_choose_path_fused_kernel_only_when_asked_outside_captured_graphs():
    """The Triton kernel only when asked for (never a default: it lost on an H100's layer), for content-free kinds,
    in eager and under torch.compile but in no captured graph; it replaces the other Functions, not the mixing
    form."""
    for case in (dict(), dict(device_type='cuda'), dict(device_type='cuda', autocast=True), dict(grad=False)):
        assert not path(**case).fused_kernel, case
    for case in (dict(), dict(device_type='cuda'), dict(separable=False), dict(compiling=True), dict(grad=False),
                 dict(dtype=torch.float64), dict(device_type='cuda', dtype=torch.bfloat16, autocast=True)):
        chosen = path(fused=True, **case)
        assert chosen.fused_kernel and not chosen.attend_then_project and not chosen.recompute_mixing, case
        assert chosen.dense == path(**case).dense, case
    for case in (dict(content=True, separable=False), dict(capturing=True), dict(capturing=True, compiling=True)):
        assert not path(fused=True, **case).fused_kernel, case


def test_the_layers_ask_choose_path_with_the_runtime_state():
    """What the layers pass: autocast, grad, the model's switches (the device type and dtype are the input's)."""
    from sa_vision.layers import HeadsLinear, batched_heads, fused_mix_and_project
    layer = make_layer('quadratic', torch.float32)
    x = torch.zeros(2, 2, 1, layer.dim)
    assert not layer.path(x).batched and layer.path(x).attend_then_project
    assert layer.path(x.double()).dense is False and layer.path(x, batched=True).batched
    assert layer.path(x.bfloat16()).batched
    assert layer.path(torch.zeros(2, 2, 1, 3, device='meta')).batched
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert layer.path(x).batched
    with torch.no_grad():
        assert layer.eval().path(x).cache_probs and not layer.train().path(x).cache_probs
    with batched_heads(torch.nn.ModuleList([layer, HeadsLinear(4, 4)])):
        assert layer.path(x).batched
    with dense_attention(layer):
        assert layer.path(x).dense and not layer.path(x).attend_then_project
    with fused_mix_and_project(layer):
        assert layer.path(x).fused_kernel and layer.path(x.bfloat16()).fused_kernel
        assert not torch.jit.script(layer).path(x).fused_kernel  # a scripted model launches no Triton kernel
    assert not layer.fused_kernel and not layer.path(x).fused_kernel
    assert 'fused_kernel' not in str(list(layer.state_dict()))


def test_batched_heads_context_manager_restores_the_mode():
    from sa_vision.layers import HeadsLinear, batched_heads
    model = torch.nn.Sequential(make_layer('quadratic', torch.float32), HeadsLinear(18, 4))
    with batched_heads(model):
        assert all(m.batched_heads for m in model)
    assert not any(m.batched_heads for m in model)


def _second_derivative_of(output: torch.Tensor, *inputs: torch.Tensor) -> None:
    """Differentiate ``output`` twice (a gradient penalty's graph): sum of the squared first derivatives, backward."""
    grads = torch.autograd.grad(output.pow(3).sum(), inputs, create_graph=True)
    sum(g.pow(2).sum() for g in grads).backward()


@pytest.mark.parametrize('function', ['gelu_linear', 'heads_linear', 'separable_mixing'])
def test_a_hand_made_backward_refuses_a_second_derivative_it_would_get_wrong(function):
    """The autograd Functions' backward passes are no graph of their forward: a second derivative through them
    (gradient penalties, Hessian-vector products) came out silently wrong or partly None. It raises, naming why."""
    from sa_vision.layers.attention_autograd import _HeadsLinearFunction, _SeparableMixing
    from sa_vision.layers.mlp import _GeluLinear
    gen = torch.Generator().manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    inputs, apply = {
        'gelu_linear': ((leaf(5, 6), leaf(4, 6), leaf(4)), _GeluLinear.apply),
        'heads_linear': ((leaf(3, 5, 4), leaf(2, 12), leaf(2)), _HeadsLinearFunction.apply),
        'separable_mixing': ((leaf(3, 4, 2, 5), leaf(2, 3, 3).softmax(-1), leaf(2, 4, 4).softmax(-1)),
                             _SeparableMixing.apply),
    }[function]
    with pytest.raises(RuntimeError, match='once_differentiable'):
        _second_derivative_of(apply(*inputs), *inputs)


@pytest.mark.parametrize('kind', ['quadratic', 'learned'])
def test_a_model_refuses_a_second_derivative_on_every_eager_training_path(kind):
    """The model in training, per head (float32 on the CPU: attention and Value in one Function) and on the batched
    path, refuses a gradient penalty rather than computing it wrong."""
    import timm

    from sa_vision.layers import batched_heads
    model = timm.create_model(f'sa_{kind}_cifar', embed_dim=8, depth=1, heads_per_layer=2, mlp_hidden_dim=8).train()
    for switch in (lambda m: contextlib.nullcontext(), batched_heads):
        x = torch.randn(2, 3, 8, 8, requires_grad=True)
        with switch(model), pytest.raises(RuntimeError, match='once_differentiable'):
            _second_derivative_of(model(x), x)
