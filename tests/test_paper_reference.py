""" The packaged reference of the paper's dense formulation (sa_vision.research.paper_reference) against our models.

The reference computes the released code's way (relative-encoding einsum over the whole (h, w, heads, h, w) grid,
the original Linear embedding, plain autograd); our models compute separably, cached and chunked, with hand-written
backward passes. Equal outputs and gradients in float64 for the same weights check both. """
import itertools

import pytest
import timm
import torch

import sa_vision  # noqa: F401
from sa_vision.research.paper_reference import PaperDenseSA, kind_of_state_dict, paper_state_dict, relative_encoding

SMALL = dict(embed_dim=8, depth=2, mlp_hidden_dim=16, num_classes=7)
CASES = {  # model, its kwargs; a non-square 6x5 grid; the learned tables clip shifts beyond 2
    'quadratic': ('sa_quadratic_cifar', dict(heads_per_layer=3)),
    'generalized': ('sa_gen_cifar', dict(heads_per_layer=3)),
    'learned': ('sa_learned_cifar', dict(heads_per_layer=3, max_rel_shift=2)),
    'pruned': ('sa_gen_pruned', dict(heads_per_layer=(2, 3))),
}
IMAGE = (3, 3, 12, 10)


def _ours(case, **kwargs):
    name, case_kwargs = CASES[case]
    torch.manual_seed(0)
    model = timm.create_model(name, **SMALL, **case_kwargs, **kwargs).double()
    with torch.no_grad():  # away from the initialisation (s near 1, S near I)
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _assert_equal(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize('case', list(CASES))
def test_reference_equals_our_model_in_float64(case):
    model = _ours(case).eval()
    reference = PaperDenseSA.from_state_dict(model.state_dict()).eval()
    assert reference.kind == ('generalized' if case == 'pruned' else case)
    assert reference.heads_per_layer == model.heads_per_layer
    x = torch.randn(*IMAGE, dtype=torch.float64)
    with torch.no_grad():
        _assert_equal(reference.forward_features(x), model.forward_features(x))
        _assert_equal(reference(x), model(x))
        for ours, theirs in zip(model.blocks, reference.blocks):  # the attention probabilities themselves
            probs = theirs.attn.probs(6, 5)  # query row, query col, head, key row, key col
            expected = probs.permute(2, 0, 1, 3, 4).reshape(ours.num_heads, 30, 30)
            _assert_equal(ours.attn.position_probs(6, 5), expected)


@pytest.mark.parametrize('case', ['quadratic', 'generalized', 'learned'])
def test_training_gradients_equal_the_reference(case):
    """Our hand-written backward passes (attention + Value, MLP) against autograd through the reference."""
    model = _ours(case, proj_drop_rate=0., attn_drop_rate=0.).train()
    reference = PaperDenseSA.from_state_dict(model.state_dict(), proj_drop=0., attn_drop=0.).train()
    x = torch.randn(*IMAGE, dtype=torch.float64)
    weights = torch.randn(IMAGE[0], SMALL['num_classes'], dtype=torch.float64)
    (model(x) * weights).sum().backward()
    (reference(x) * weights).sum().backward()
    ours = paper_state_dict({name: p.grad for name, p in model.named_parameters()})
    theirs = {name: p.grad for name, p in reference.named_parameters()}
    assert ours.keys() == theirs.keys()
    for name in ours:
        _assert_equal(ours[name], theirs[name])


def test_state_dict_layout_and_conversion():
    model = _ours('quadratic')
    ours, converted = model.state_dict(), paper_state_dict(model.state_dict())
    reference = PaperDenseSA.from_state_dict(ours)
    assert set(reference.state_dict()) == set(converted)  # strict: every weight, nothing else
    assert set(ours) - set(converted) == {'patch_embed.proj.weight', 'patch_embed.proj.bias'}
    # the original's embedding order: Linear input 6*di + 3*dj + c holds pixel (2i + di, 2j + dj), colour c
    kernel = ours['patch_embed.proj.weight']
    for di, dj, c in itertools.product((0, 1), (0, 1), range(3)):
        assert torch.equal(converted['patch_embed.weight'][:, 6 * di + 3 * dj + c], kernel[:, c, di, dj])
    assert paper_state_dict(converted).keys() == converted.keys()  # a reference state dict passes through
    assert kind_of_state_dict(_ours('learned').state_dict()) == 'learned'


def test_reference_scores_are_the_spec_gaussians():
    """The relative-encoding einsum against Eq. (9) and App. A.1 written out for one head and query."""
    torch.manual_seed(1)
    for kind in ('quadratic', 'generalized'):
        reference = PaperDenseSA(kind, (2,), embed_dim=4, mlp_hidden_dim=4).double()
        attn = reference.blocks[0].attn
        probs = attn.probs(4, 3)
        mu, factor = attn.position.centers[1].detach(), attn.position.precision_factors[1].detach()
        precision = factor ** 2 * torch.eye(2, dtype=torch.float64) if kind == 'quadratic' else factor @ factor.T
        qi, qj = 2, 1
        shifts = [torch.tensor([k - qi, j - qj], dtype=torch.float64) for k in range(4) for j in range(3)]
        scores = torch.stack([-0.5 * (d - mu) @ precision @ (d - mu) for d in shifts])
        _assert_equal(probs[qi, qj, 1].reshape(-1).detach(), scores.softmax(0))
    r = relative_encoding(3, 2, dtype=torch.float64)
    assert r.shape == (3, 2, 3, 2, 5) and r[0, 1, 2, 0].tolist() == [2., -1., 4., 1., -2.]


def test_content_attention_has_no_paper_formulation():
    model = timm.create_model('sa_content_cifar', embed_dim=8, depth=1, heads_per_layer=2, mlp_hidden_dim=16)
    with pytest.raises(ValueError, match='content'):
        PaperDenseSA.from_state_dict(model.state_dict())
    with pytest.raises(ValueError, match='learned'):
        PaperDenseSA.from_state_dict(_ours('quadratic').state_dict(), kind='learned')
