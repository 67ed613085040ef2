""" The kernel match: an exact assignment (against scipy's), a 3x3 kernel's offsets written by hand, Theorem 1's
init at distance 0, and the command's table """
import itertools

import numpy as np
import pytest
import timm
import torch

import sa_vision  # noqa: F401
from sa_vision.cli import plot_attention
from sa_vision.errors import UserError
from sa_vision.research.kernel_match import (
    dilated_kernel_offsets,
    kernel_match,
    layer_kernel_matches,
    min_cost_assignment,
)

SMALL = dict(embed_dim=16, mlp_hidden_dim=16)


def hand_kernel(dilation):
    """``dilation * {-1, 0, 1}^2`` as a set of (row, col) pairs, written out."""
    return {(dilation * i, dilation * j) for i in (-1, 0, 1) for j in (-1, 0, 1)}


def scipy_mean_distance(centers, dilation):
    """The mean matched distance by scipy's assignment (rows or columns left out where the shapes differ)."""
    linear_sum_assignment = pytest.importorskip('scipy.optimize').linear_sum_assignment
    offsets = np.array(sorted(hand_kernel(dilation)), dtype=np.float64)
    cost = np.linalg.norm(centers.numpy()[:, None, :] - offsets[None], axis=-1)
    rows, cols = linear_sum_assignment(cost)
    return cost[rows, cols].mean()


@pytest.mark.parametrize('dilation', [1, 2, 3])
def test_offsets_are_the_dilated_3x3_kernel(dilation):
    offsets = dilated_kernel_offsets(dilation)
    assert offsets.shape == (9, 2) and {tuple(map(int, o)) for o in offsets.tolist()} == hand_kernel(dilation)


def test_assignment_has_scipys_optimum_on_random_costs():
    linear_sum_assignment = pytest.importorskip('scipy.optimize').linear_sum_assignment
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        rows = int(torch.randint(1, 10, (1,), generator=generator))
        cols = int(torch.randint(rows, 12, (1,), generator=generator))
        if trial % 2:  # small integers: many ties
            cost = torch.randint(0, 4, (rows, cols), generator=generator).double()
        else:
            cost = torch.randn(rows, cols, generator=generator, dtype=torch.float64) * 10
        columns = min_cost_assignment(cost)
        assert len(set(columns.tolist())) == rows and int(columns.max()) < cols
        ref_rows, ref_cols = linear_sum_assignment(cost.numpy())
        assert float(cost[torch.arange(rows), columns].sum()) == pytest.approx(
            float(cost.numpy()[ref_rows, ref_cols].sum()), abs=1e-9), (trial, cost)


def test_assignment_of_hand_made_costs():
    # scipy's documentation example: rows 0, 1, 2 -> columns 1, 0, 2, total 5
    assert min_cost_assignment(torch.tensor([[4., 1, 3], [2, 0, 5], [3, 2, 2]])).tolist() == [1, 0, 2]
    permutation = [3, 0, 8, 5, 1, 7, 2, 6, 4]
    assert min_cost_assignment(1 - torch.eye(9)[permutation]).tolist() == permutation
    with pytest.raises(ValueError, match='transpose'):
        min_cost_assignment(torch.zeros(3, 2))
    with pytest.raises(ValueError, match='finite'):
        min_cost_assignment(torch.tensor([[0., float('nan')]]))


@pytest.mark.parametrize('heads', [1, 4, 9, 13])
def test_mean_distance_matches_scipy_on_random_centres(heads):
    generator = torch.Generator().manual_seed(heads)
    for _ in range(10):
        centers = torch.randn(heads, 2, generator=generator, dtype=torch.float64) * 3
        match = kernel_match(centers)
        for dilation in (1, 2, 3):
            assert match.distances[dilation] == pytest.approx(scipy_mean_distance(centers, dilation), abs=1e-9)
        assert match.mean_distance == min(match.distances.values())


@pytest.mark.parametrize('dilation', [1, 2, 3])
def test_centres_on_a_dilated_kernel_are_at_distance_0(dilation):
    taps = sorted(hand_kernel(dilation))
    permutation = [4, 7, 0, 2, 8, 1, 6, 3, 5]
    centers = torch.tensor([taps[i] for i in permutation], dtype=torch.float64)
    match = kernel_match(centers + 0.01 * torch.tensor([[1., 0.]]))  # nudged: still nearest to its own tap
    assert match.dilation == dilation and match.mean_distance == pytest.approx(0.01)
    torch.testing.assert_close(match.offsets, centers)  # each head's own tap: the permutation recovered
    assert kernel_match([[float(r), float(c)] for r, c in centers]).dilation == dilation  # a list of centres too
    assert kernel_match(list(centers)).dilation == dilation  # or of tensors, one per head
    with pytest.raises(UserError, match=r"pass one layer's \(head_centers\(...\)\[i\]\), got a list of 2 tensors"):
        kernel_match([centers, centers[:5]])  # every layer's centres (a pruned model's differ in count)


def test_a_pruned_layer_is_matched_into_a_subset_of_the_offsets():
    centers = torch.tensor([[-2., 2], [0, 2], [2, 0], [2.5, 2.5]])  # three taps of d = 2 and one between
    match = kernel_match(centers)
    assert match.dilation == 2
    assert match.mean_distance == pytest.approx((0 + 0 + 0 + 2 ** 0.5 / 2) / 4)
    torch.testing.assert_close(match.offsets, torch.tensor([[-2., 2], [0, 2], [2, 0], [2, 2]], dtype=torch.float64))


def test_heads_beyond_the_nine_offsets_are_left_out():
    kernel = torch.tensor(sorted(hand_kernel(1)), dtype=torch.float64)
    far = torch.tensor([[7., 7], [-6, 0], [0, 9]], dtype=torch.float64)
    match = kernel_match(torch.cat([far[:1], kernel, far[1:]]))
    assert match.dilation == 1 and match.mean_distance == 0.0  # the mean is over the 9 matched offsets
    assert match.offsets[[0, 10, 11]].isnan().all() and not match.offsets[1:10].isnan().any()
    with pytest.raises(UserError, match='at least one head'):
        kernel_match(torch.zeros(0, 2))
    with pytest.raises(UserError, match=r'NaN or infinite value \(1 of 12 heads\): the weights diverged'):
        kernel_match(torch.cat([far[:1] * float('nan'), kernel, far[1:]]))


@pytest.mark.parametrize('name', ['sa_quadratic_cifar', 'sa_gen_cifar'])
def test_theorem_1_init_is_a_3x3_kernel_in_every_layer(name):
    torch.manual_seed(0)
    model = timm.create_model(name, pos_init='conv', **SMALL)
    rows = layer_kernel_matches(model)
    assert len(rows) == 6
    assert [row['layer'] for row in rows] == [1, 2, 3, 4, 5, 6]
    for block, row in zip(model.blocks, rows):
        centers = block.attn.position.centers.detach()
        assert {tuple(map(int, c)) for c in centers.round().tolist()} == hand_kernel(1)  # the construction
        assert row['heads'] == 9 and row['best_dilation'] == 1 and row['mean_distance'] == 0.0
        assert row['distance_d2'] > 0 and row['distance_d3'] > row['distance_d2']


def test_theorem_1_init_of_a_pruned_layer_is_a_2x2_corner_of_the_kernel():
    torch.manual_seed(0)
    model = timm.create_model('sa_quadratic_cifar', pos_init='conv', depth=2, heads_per_layer=(4, 9), **SMALL)
    first = layer_kernel_matches(model)[0]
    assert first['heads'] == 4 and first['best_dilation'] == 1 and first['mean_distance'] == 0.0


def test_kinds_without_centres_are_refused():
    with pytest.raises(UserError, match='Gaussian centres'):
        layer_kernel_matches(timm.create_model('sa_learned_cifar', depth=1, **SMALL))


def test_command_prints_the_table_without_a_picture(tmp_path, capsys):
    from safetensors.torch import save_file
    torch.manual_seed(0)
    model = timm.create_model('sa_quadratic_cifar', pos_init='conv', depth=2, **SMALL)
    with torch.no_grad():
        model.blocks[1].attn.position.centers.mul_(2)  # the second layer: the kernel of dilation 2
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / 'm.safetensors'))
    assert plot_attention.main([str(tmp_path / 'm.safetensors'), '--kernel-match']) == 0
    out = capsys.readouterr().out
    rows = [line.strip('|').split('|') for line in out.splitlines() if line.startswith('|')]
    assert [c.strip() for c in rows[0]][:4] == ['layer', 'heads', 'best_dilation', 'mean_distance']
    cells = [[c.strip() for c in row] for row in rows[2:]]
    # layers counted from 1, as sa-vision-prune and the figures count them
    assert [row[:4] for row in cells] == [['1', '9', '1', '0'], ['2', '9', '2', '0']]
    assert not list(tmp_path.glob('*.png'))


def test_command_without_out_or_kernel_match_is_refused(capsys):
    with pytest.raises(SystemExit):
        plot_attention.main(['sa_quadratic_cifar'])
    assert '--out is required' in capsys.readouterr().err


def test_itertools_brute_force_agrees_on_a_5x9_layer():
    """A second reference that needs no scipy: every injection of 5 heads into the 9 offsets."""
    generator = torch.Generator().manual_seed(1)
    centers = torch.randn(5, 2, generator=generator, dtype=torch.float64) * 2
    offsets = torch.tensor(sorted(hand_kernel(2)), dtype=torch.float64)
    cost = torch.cdist(centers, offsets)
    best = min(float(cost[range(5), list(p)].sum()) for p in itertools.permutations(range(9), 5))
    assert kernel_match(centers, dilations=(2,)).mean_distance == pytest.approx(best / 5, abs=1e-12)
