"""The dense content-free attention + Value projected first (``project_then_mix``) against the dense formula
written here: every head's Gaussian scores (paper Eq. 9) softmaxed over all keys, applied to the raw input, the
heads concatenated head-major and one Linear; its choice in ``choose_path``, its switch, and that it makes no copy
of the heads-sized tensor."""
import pytest
import torch
from float32_bounds import (
    assert_float32_close,
    assert_float32_gradients_close,
    network_float32_atol,
    sa_model_gradient_reduction_lengths,
    sa_model_reduction_lengths,
)
from helpers import assert_bf16_close, exact_float32
from torch.utils._python_dispatch import TorchDispatchMode

from sa_vision.layers import (
    HeadsLinear,
    PositionalAttention,
    attend_then_project,
    batched_heads,
    choose_path,
    dense_attention,
    project_first,
)

HEADS, DIM, OUT = 4, 6, 5


def make_pair(dtype, device='cpu'):
    torch.manual_seed(0)
    layer = PositionalAttention(DIM, HEADS, 'quadratic', grid_major=True).to(device, dtype).train()
    with torch.no_grad():  # heads neither uniform nor one-hot, centres off the grid points
        layer.position.centers.copy_(torch.randn(HEADS, 2, dtype=dtype) * 2)
        layer.position.precision_factors.mul_(0.7)
    return torch.nn.ModuleList([layer, HeadsLinear(HEADS * DIM, OUT).to(device, dtype)])


def reference(pair, x):
    """``out[q, b, o] = bias[o] + sum_n sum_k A_n[q, k] sum_d x[k, b, d] W[o, n*D + d]`` for grid-major ``x``, with
    ``A_n`` the softmax over the keys of Eq. 9's scores ``-(s_n^2 / 2) ||(key - query) - mu_n||^2``."""
    H, W, B, D = x.shape
    rows, cols = torch.meshgrid(torch.arange(H), torch.arange(W), indexing='ij')
    coords = torch.stack([rows.reshape(-1), cols.reshape(-1)], -1).to(x)  # (h*w, 2), row-major
    delta = coords[None, :, :] - coords[:, None, :]  # [query, key] = key - query
    position = pair[0].position
    scores = -(position.precision_factors ** 2 / 2)[:, None, None] * (
        (delta[None] - position.centers[:, None, None, :]) ** 2).sum(-1)
    weight = pair[1].weight.view(-1, HEADS, D)  # [o, n, d]
    out = torch.einsum('nqk,kbd,ond->qbo', scores.softmax(-1), x.reshape(H * W, B, D), weight) + pair[1].bias
    return out.view(H, W, B, -1)


@pytest.fixture
def no_heads_copy(monkeypatch):
    """The dense path's Value over the concatenated heads must not run."""
    def refuse(self, x):
        raise AssertionError('HeadsLinear.forward_batched ran: the path was not projected first')
    monkeypatch.setattr(HeadsLinear, 'forward_batched', refuse)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('grid', [(4, 4), (3, 5)], ids=lambda g: f'{g[0]}x{g[1]}')
def test_project_then_mix_equals_the_dense_formula(no_heads_copy, grid, dtype, device):
    """Forward and the gradients of the input, the Value's weight and bias and the positional parameters."""
    pair = make_pair(dtype, device)
    pair[0].attn_drop = 0.
    x = torch.randn(*grid, 3, DIM, dtype=dtype, device=device, requires_grad=True)  # h, w, B, D
    ref_pair = pair if dtype == torch.float64 else make_pair(torch.float64, device)
    ref_pair.load_state_dict(pair.state_dict())
    ref_x = x.detach().double().requires_grad_()
    with batched_heads(pair), dense_attention(pair), project_first(pair), exact_float32():
        assert pair[0].path(x, True).project_first
        out = attend_then_project(pair[0], pair[1], x)
        ref = reference(ref_pair, ref_x)
        weights = torch.randn_like(ref)
        grads = torch.autograd.grad((out * weights.to(dtype)).sum(), [x] + list(pair.parameters()))
        ref_grads = torch.autograd.grad((ref * weights).sum(), [ref_x] + list(ref_pair.parameters()))
    assert len(grads) == 5  # x, centres, precision factors, weight, bias
    if dtype == torch.float64:
        tol = dict(rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out, ref, **tol)
        for g, rg in zip(grads, ref_grads):
            torch.testing.assert_close(g, rg, **tol)
        return
    H, W, B, _ = x.shape  # the output sums heads * (h*w) * D terms; a parameter's gradient also the batch and out
    assert_float32_close(out, ref, reduction_length=HEADS * H * W * DIM)
    assert_float32_gradients_close(grads, ref_grads, reduction_length=B * (H * W) ** 2 * HEADS + OUT * DIM)


def test_attention_dropout_drops_as_the_dense_path(device):
    """The same seed draws the same ``(heads, h*w, h*w)`` mask: outputs and gradients as the dense path's."""
    pair = make_pair(torch.float64, device)
    pair[0].attn_drop = 0.3
    x = torch.randn(5, 3, 2, DIM, dtype=torch.float64, device=device, requires_grad=True)
    results = []
    for projected in (False, True):
        torch.manual_seed(7)
        with batched_heads(pair), dense_attention(pair), project_first(pair, projected):
            assert pair[0].path(x, True).project_first == projected
            out = attend_then_project(pair[0], pair[1], x)
        results.append([out] + list(torch.autograd.grad(out.square().sum(), [x] + list(pair.parameters()))))
    torch.manual_seed(8)
    with batched_heads(pair), dense_attention(pair):
        assert not torch.allclose(attend_then_project(pair[0], pair[1], x), results[0][0]), 'dropout is off'
    for projected, dense in zip(results[1], results[0]):
        torch.testing.assert_close(projected, dense, rtol=1e-10, atol=1e-12)


def test_training_under_bfloat16_autocast():
    """Under CPU bf16 autocast: the output in bf16 (the bias added in it, as ``F.linear`` does), the gradients in the
    parameters' dtype and within bf16 rounding of the dense formula."""
    pair = make_pair(torch.float32)
    pair[0].attn_drop = 0.
    x = torch.randn(4, 4, 3, DIM)
    params = list(pair.parameters())
    weights = torch.randn(4, 4, 3, OUT)
    with batched_heads(pair), dense_attention(pair), project_first(pair):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            assert pair[0].path(x, True).project_first
            out = attend_then_project(pair[0], pair[1], x)
        grads = torch.autograd.grad((out.float() * weights).sum(), params)
    ref = reference(pair, x)
    ref_grads = torch.autograd.grad((ref * weights).sum(), params)
    assert_bf16_close(out, ref, grads, ref_grads, params)


class _HeadsSizedWrites(TorchDispatchMode):
    """The ops (not views) that write a heads-sized tensor (``heads`` times ``x`` or times the Value's output)."""

    def __init__(self, sizes):
        super().__init__()
        self.sizes, self.ops = sizes, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliases = func.is_view or func.overloadpacket.__name__ == '_unsafe_view'
        if not aliases and any(isinstance(t, torch.Tensor) and t.numel() in self.sizes
                               for t in torch.utils._pytree.tree_leaves(out)):
            self.ops.append(func.overloadpacket.__name__)
        return out


@pytest.mark.parametrize('autocast', (False, True), ids=('float32', 'bf16_autocast'))
@pytest.mark.parametrize('projected', (False, True), ids=('dense', 'projected_first'))
def test_no_copy_of_the_heads_sized_tensor(projected, autocast):
    """Projected first, only products write a heads-sized tensor (forward: the projection; backward: its input's
    gradient per head, then the mixing's gradient); the dense path copies the heads for the Value and back. Under
    autocast too, where a cast of the broadcast input would write it heads times."""
    pair = make_pair(torch.float32)
    x = torch.randn(4, 4, 3, DIM, requires_grad=True)
    sizes = {HEADS * x.numel(), HEADS * x.numel() // DIM * OUT}
    with batched_heads(pair), dense_attention(pair), project_first(pair, projected), \
            torch.autocast('cpu', torch.bfloat16, enabled=autocast):
        with _HeadsSizedWrites(sizes) as forward:
            out = attend_then_project(pair[0], pair[1], x)
        with _HeadsSizedWrites(sizes) as backward:
            out.float().sum().backward()
    if projected:
        assert forward.ops == ['bmm'] and sorted(backward.ops) == ['bmm', 'mm'], (forward.ops, backward.ops)
    else:
        assert forward.ops == ['mm', 'clone'] and 'clone' in backward.ops, (forward.ops, backward.ops)


def path(device_type='cuda', dense=True, project_first=None, cuda_project_first=False, **kwargs):
    args = dict(dtype=torch.float32, autocast=False, compiling=False, capturing=False, grad=True, training=True,
                separable=True, content=False, batched=False, fused=False, cuda_dense=False)
    args.update(kwargs)
    return choose_path(device_type, args['dtype'], args['autocast'], args['compiling'], args['capturing'],
                       args['grad'], args['training'], args['separable'], args['content'], dense, args['batched'],
                       args['fused'], args['cuda_dense'], project_first, cuda_project_first)


def test_choose_path_projects_first_where_dense_batched_content_free_and_not_fused():
    """Off by default (``CUDA_PROJECT_FIRST``: slower on an H100); the constant turns it on for CUDA only, the
    override wins either way; never on the separable, per-head, content or fused paths; in graphs as in eager."""
    from sa_vision.layers import CUDA_PROJECT_FIRST
    assert CUDA_PROJECT_FIRST is False, 'off: it lost on an H100 (docs/probes/gpu/device_check.md, 2026-11-26b)'
    assert not path().project_first and path(cuda_project_first=True).project_first
    assert not path(cuda_project_first=True, project_first=False).project_first
    assert not path('cpu', cuda_project_first=True).project_first and path('cpu', project_first=True,
                                                                           batched=True).project_first
    for case in (dict(dense=False), dict(device_type='cpu'), dict(content=True, separable=False),
                 dict(fused=True)):
        assert not path(**{'project_first': True, **case}).project_first, case
    for case in (dict(compiling=True), dict(capturing=True), dict(autocast=True), dict(separable=False, dense=None),
                 dict(grad=False, training=False)):
        chosen = path(project_first=True, **case)
        assert chosen.project_first and chosen.batched and not chosen.recompute_mixing, case


def test_the_layer_passes_its_switch_and_a_scripted_layer_never_projects_first():
    layer = make_pair(torch.float32)[0]
    x = torch.zeros(2, 2, 1, DIM)
    assert layer.project_first is None and not layer.path(x, True).project_first
    with dense_attention(layer), project_first(layer):
        assert layer.path(x, True).project_first and not layer.path(x).project_first  # per head on the CPU
        assert not torch.jit.script(layer).path(x, True).project_first
    assert layer.project_first is None


@pytest.mark.slow
def test_compiled_training_with_the_switch_equals_the_dense_path():
    """The narrow model trains under ``torch.compile(fullgraph=True)`` projected first (no graph break) with the loss
    and gradients of the dense path compiled the same way (float32: within a bound of the float32 rounding)."""
    import timm
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = timm.create_model('sa_quadratic_cifar', embed_dim=64, mlp_hidden_dim=128, drop_rate=0.,
                              attn_drop_rate=0., proj_drop_rate=0.).train()
    images, targets = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])
    import sa_vision.layers.attention as attention
    calls, results = [], []
    for projected in (False, True):
        step = torch.compile(lambda m: torch.nn.functional.cross_entropy(m(images), targets), backend='eager',
                             fullgraph=True)
        with dense_attention(model), project_first(model, projected), pytest.MonkeyPatch.context() as patch:
            patch.setattr(attention, 'project_then_mix',
                          lambda *a, original=attention.project_then_mix: (calls.append(1), original(*a))[1])
            loss = step(model)
        results.append([loss] + list(torch.autograd.grad(loss, list(model.parameters()))))
        assert bool(calls) == projected
    # each within the network's float32 bound of the exact values, so within twice that of each other
    tokens = 16 * 16
    lengths = [sa_model_reduction_lengths(model, tokens)] + [
        sa_model_gradient_reduction_lengths(model, tokens, len(images))] * (len(results[0]) - 1)
    grad_scale = max(g.abs().max().item() for g in results[0][1:])
    for i, (projected, dense, n) in enumerate(zip(results[1], results[0], lengths)):
        atol = 2 * network_float32_atol(n, dense.abs().max().item() if i == 0 else grad_scale)
        torch.testing.assert_close(projected, dense, rtol=0, atol=atol, msg=lambda m, i=i: f'result {i}: {m}')
