""" pos_init='conv': every head starts where the construction of Theorem 1 / Lemma 2 puts it

Checked against offsets written out here (not the library's kernel_offsets) and against the dense softmax of the
paper's score -alpha ||delta - Delta||^2 (Eq. 14) computed here with plain loops.
"""
import math

import pytest
import timm
import torch
from helpers import CONTENT_FREE_MODELS, GAUSSIAN_MODELS

import sa_vision  # noqa: F401  registers the models

# the 3x3 kernel of Theorem 1 in (row, col) grid units, head h = 3 * i + j, written out by hand
KERNEL_3X3 = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 0), (0, 1), (1, -1), (1, 0), (1, 1)]
# 5 heads: K = floor(sqrt(5)) = 2, shifts {-1, 0}^2 for the first 4 heads, the 5th keeps the paper's init
KERNEL_2X2 = [(-1, -1), (-1, 0), (0, -1), (0, 0)]
GRID = 10
SMALL = dict(embed_dim=16, depth=2, mlp_hidden_dim=32, proj_drop_rate=0.0, attn_drop_rate=0.0)


def _dense_gaussian_probs(offset, alpha, query, grid=GRID, cap=None):
    """softmax over the grid's keys of -alpha ||(key - query) - offset||^2 (per axis capped at `cap` if given)."""
    scores = {}
    for r in range(grid):
        for c in range(grid):
            terms = [(r - query[0] - offset[0]) ** 2, (c - query[1] - offset[1]) ** 2]
            if cap is not None:
                terms = [min(t, cap) for t in terms]
            scores[(r, c)] = -alpha * sum(terms)
    top = max(scores.values())
    z = sum(math.exp(s - top) for s in scores.values())
    probs = torch.zeros(grid * grid, dtype=torch.float64)
    for (r, c), s in scores.items():
        probs[r * grid + c] = math.exp(s - top) / z
    return probs


def _interior_queries(grid=GRID, margin=2):
    return [(r, c) for r in range(margin, grid - margin, 3) for c in range(margin, grid - margin, 3)]


@pytest.mark.parametrize('arch', CONTENT_FREE_MODELS)
def test_conv_init_puts_each_head_on_its_kernel_shift(arch):
    model = timm.create_model(arch, pos_init='conv', **SMALL)
    for layer in (blk.attn for blk in model.blocks):
        if arch != 'sa_learned_cifar':
            assert layer.position.centers.tolist() == [list(map(float, o)) for o in KERNEL_3X3]
        probs = layer.position_probs(GRID, GRID).double()  # heads, queries, keys
        for head, (dr, dc) in enumerate(KERNEL_3X3):
            for qr, qc in _interior_queries():
                row = probs[head, qr * GRID + qc]
                key = (qr + dr) * GRID + (qc + dc)
                assert row.argmax().item() == key
                assert row[key].item() >= 0.99, (head, (qr, qc), row[key].item())


@pytest.mark.parametrize('arch', GAUSSIAN_MODELS)
@pytest.mark.parametrize('alpha', [1.0, 6.0])
def test_gaussian_conv_init_has_the_score_of_lemma_2(arch, alpha):
    """The whole probability row equals the softmax of -alpha ||delta - Delta||^2: alpha is the paper's alpha_h."""
    model = timm.create_model(arch, pos_init='conv', pos_init_alpha=alpha, **SMALL)
    probs = model.blocks[0].attn.position_probs(GRID, GRID).double()
    for head, offset in enumerate(KERNEL_3X3):
        for query in [(0, 0), (4, 5), (9, 9)]:  # borders included: the formula holds everywhere
            expected = _dense_gaussian_probs(offset, alpha, query)
            got = probs[head, query[0] * GRID + query[1]]
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-4)


def test_learned_conv_init_scores_like_a_quadratic_head_capped_at_distance_2():
    model = timm.create_model('sa_learned_cifar', pos_init='conv', pos_init_alpha=2.0, **SMALL)
    probs = model.blocks[1].attn.position_probs(GRID, GRID).double()
    for head, offset in enumerate(KERNEL_3X3):
        for query in [(1, 1), (5, 4)]:
            expected = _dense_gaussian_probs(offset, 2.0, query, cap=4)
            torch.testing.assert_close(probs[head, query[0] * GRID + query[1]], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize('arch', GAUSSIAN_MODELS)
def test_non_square_head_count_fills_the_largest_square_kernel(arch):
    torch.manual_seed(0)
    model = timm.create_model(arch, pos_init='conv', heads_per_layer=5, **SMALL)
    centers = model.blocks[0].attn.position.centers
    assert centers[:4].tolist() == [list(map(float, o)) for o in KERNEL_2X2]
    assert centers[4].tolist() not in [list(map(float, o)) for o in KERNEL_2X2]  # paper's random draw


@pytest.mark.parametrize('arch', CONTENT_FREE_MODELS)
def test_conv_init_keeps_names_shapes_and_the_default_stays_the_papers(arch):
    torch.manual_seed(0)
    default = timm.create_model(arch, **SMALL).state_dict()
    torch.manual_seed(0)
    paper = timm.create_model(arch, pos_init='paper', **SMALL).state_dict()
    conv = timm.create_model(arch, pos_init='conv', **SMALL).state_dict()
    assert [(k, v.shape) for k, v in conv.items()] == [(k, v.shape) for k, v in default.items()]
    for key in default:  # the default is the paper's init, drawn from the same random stream as before
        assert torch.equal(default[key], paper[key]), key
    if arch != 'sa_learned_cifar':
        # the paper's init: random centres (standard deviation 2 per coordinate), not on a kernel
        assert default['blocks.0.attn.position.centers'].tolist() != [list(map(float, o)) for o in KERNEL_3X3]


def _assert_normal_sample(values, mean, std, what):
    """The sample mean and standard deviation of ``values`` against a normal law's, each within 6 of its standard
    errors (std / sqrt(n) for the mean, std / sqrt(2 n) for the standard deviation)."""
    values = values.detach().double().flatten()
    n = values.numel()
    assert abs(values.mean().item() - mean) <= 6 * std / math.sqrt(n), (what, values.mean().item())
    assert abs(values.std().item() - std) <= 6 * std / math.sqrt(2 * n), (what, values.std().item())


def test_paper_init_draws_the_authors_gaussian_parameters():
    """The default ('paper') start of the Gaussian heads, as the authors' released values give it (Sec. 4.2 writes
    the centres' law N(0, 2 I_2); the release draws gaussian_init_mu_std = 2 per coordinate and
    gaussian_init_sigma_std = 0.01): centres N(0, 2^2) per coordinate; the isotropic precision factor s_h =
    1 + N(0, 0.01^2); the non-isotropic S_h = I + N(0, 0.01^2) entrywise (App. A.1). Checked on 4000 heads."""
    from sa_vision.layers import GeneralizedScores, QuadraticScores
    heads = 4000
    torch.manual_seed(0)
    quadratic = QuadraticScores(heads, dtype=torch.float64)
    _assert_normal_sample(quadratic.centers, 0., 2., 'quadratic centres')
    _assert_normal_sample(quadratic.precision_factors, 1., 0.01, 's_h')
    generalized = GeneralizedScores(heads, dtype=torch.float64)
    _assert_normal_sample(generalized.centers, 0., 2., 'generalized centres')
    S = generalized.precision_factors
    _assert_normal_sample(S[:, [0, 1], [0, 1]], 1., 0.01, 'diagonal of S_h')
    _assert_normal_sample(S[:, [0, 1], [1, 0]], 0., 0.01, 'off-diagonal of S_h')


def test_bad_init_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="pos_init 'gauss' is not one of"):
        timm.create_model('sa_quadratic_cifar', pos_init='gauss', **SMALL)
    with pytest.raises(ValueError, match='pos_init_alpha must be > 0'):
        timm.create_model('sa_quadratic_cifar', pos_init='conv', pos_init_alpha=0., **SMALL)
    with pytest.raises(ValueError, match='dim >= num_heads'):
        timm.create_model('sa_learned_cifar', pos_init='conv', **{**SMALL, 'embed_dim': 8})
