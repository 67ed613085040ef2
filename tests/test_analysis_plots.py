""" Head statistics and pictures, checked against hand formulas (not pixels) """
import copy
import json
import math
import subprocess

import numpy as np
import pytest
import timm
import torch
from helpers import command, command_here

import sa_vision  # noqa: F401
from sa_vision.errors import UserError
from sa_vision.research.analysis import (
    format_table,
    gaussian_contour,
    head_covariances,
    head_statistics,
    layer_summary,
    load_model,
    write_table,
)
from sa_vision.research.plots import plot_attention_maps, plot_center_trajectories, plot_centers, save_card_figure

SMALL = dict(embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=16)


def small(name, **kwargs):
    torch.manual_seed(0)
    return timm.create_model(name, **dict(SMALL, **kwargs)).eval()


def gaussian_map(center, precision, grid=(16, 16), query=(8, 8)):
    """Softmax over the grid of -1/2 (delta - mu)^T M (delta - mu), for one query, by hand (numpy)."""
    rows, cols = np.meshgrid(np.arange(grid[0]) - query[0], np.arange(grid[1]) - query[1], indexing='ij')
    d = np.stack([rows - center[0], cols - center[1]], -1)
    scores = -0.5 * np.einsum('hwi,ij,hwj->hw', d, precision, d)
    p = np.exp(scores - scores.max())
    return p / p.sum()


def argmax_shift(p, query=(8, 8)):
    """(row, col) shift from ``query`` of the largest probability of the map ``p``."""
    row, col = np.unravel_index(np.argmax(p), p.shape)
    return int(row) - query[0], int(col) - query[1]


def set_quadratic(model, layer, head, center, factor):
    with torch.no_grad():
        model.blocks[layer].attn.position.centers[head] = torch.tensor(center)
        model.blocks[layer].attn.position.precision_factors[head] = factor


def test_statistics_of_hard_and_soft_quadratic_heads():
    model = small('sa_quadratic_cifar')
    set_quadratic(model, 0, 0, (1., -1.), 20.)  # alpha = 200: hard on shift (1, -1)
    set_quadratic(model, 0, 1, (0.3, 0.2), 1.0)  # soft
    set_quadratic(model, 0, 2, (11.3, 0.6), 20.)  # centre beyond the grid's lower border (rows -8..7)
    rows = head_statistics(model)
    hard, soft, beyond = rows[0], rows[1], rows[2]
    assert hard['peak'] == pytest.approx(1.0, abs=1e-12) and hard['entropy'] == pytest.approx(0, abs=1e-12)
    assert (hard['peak_row'], hard['peak_col']) == (1, -1) and hard['r50'] == 0 and hard['r90'] == 0
    assert (beyond['peak_row'], beyond['peak_col']) == argmax_shift(gaussian_map((11.3, 0.6), 400 * np.eye(2)))
    p = gaussian_map((0.3, 0.2), np.eye(2))
    assert soft['peak'] == pytest.approx(p.max(), rel=1e-6)
    assert soft['entropy'] == pytest.approx(-(p * np.log(p)).sum(), rel=1e-6)
    assert soft['cov_rr'] == pytest.approx(1.0) and soft['cov_rc'] == 0
    # radius by hand: distances from the mean, sorted, cumulative mass
    rows_, cols_ = np.meshgrid(np.arange(16) - 8, np.arange(16) - 8, indexing='ij')
    mean = ((p * rows_).sum(), (p * cols_).sum())
    assert (soft['mean_row'], soft['mean_col']) == pytest.approx(mean, rel=1e-6)
    dist = np.hypot(rows_ - mean[0], cols_ - mean[1]).ravel()
    order = np.argsort(dist)
    cumulative = np.cumsum(p.ravel()[order])
    assert soft['r50'] == pytest.approx(dist[order][np.searchsorted(cumulative, 0.5)])
    assert soft['r90'] == pytest.approx(dist[order][np.searchsorted(cumulative, 0.9)])
    # layers and heads numbered from 1, as the figures and sa-vision-prune number them
    assert [(r['layer'], r['head']) for r in rows[:4]] == [(1, 1), (1, 2), (1, 3), (2, 1)]
    summary = layer_summary(rows)
    assert summary[0]['layer'] == 1 and summary[0]['hard_heads'] == 2 and summary[0]['distinct_shifts'] == 2
    assert not summary[0]['covers_3x3']
    assert summary[0]['shifts'] == [(1, -1), (7, 1)]


def test_a_generalized_head_beyond_the_border_peaks_where_its_attention_does():
    # the rounded centre (-11, 6), clipped to the grid, is (-8, 6); the tilted Gaussian peaks at (-8, 7)
    model = small('sa_gen_cifar')
    s = torch.tensor([[0.9, 4.1], [-0.36, -1.6]])
    with torch.no_grad():
        model.blocks[0].attn.position.centers[1] = torch.tensor([-11.1, 6.2])
        model.blocks[0].attn.position.precision_factors[1] = s
    row = head_statistics(model)[1]
    expected = gaussian_map((-11.1, 6.2), (s @ s.T).double().numpy())
    assert (row['peak_row'], row['peak_col']) == argmax_shift(expected) == (-8, 7)
    assert row['peak'] == pytest.approx(expected.max(), rel=1e-6)
    assert layer_summary(head_statistics(model))[0]['shifts'].count((-8, 7)) == 1


def test_layer_summary_sees_a_full_3x3_kernel():
    model = small('sa_quadratic_cifar', depth=1, heads_per_layer=9)
    for head, (r, c) in enumerate((r, c) for r in (-1, 0, 1) for c in (-1, 0, 1)):
        set_quadratic(model, 0, head, (float(r), float(c)), 20.)
    summary = layer_summary(head_statistics(model))[0]
    assert summary['hard_heads'] == 9 and summary['distinct_shifts'] == 9 and summary['covers_3x3']


def test_heads_of_precision_near_0_are_counted_as_uniform():
    """A head whose precision fell to about 0 attends every key alike (the paper's App. A.1 saw such heads); a wide
    head whose largest probability stays below 1.5 / positions counts too, one above it does not (numpy maps)."""
    model = small('sa_quadratic_cifar')
    for head, factor in enumerate((0., 0.1, 0.2)):
        set_quadratic(model, 0, head, (0., 0.), factor)
    rows = head_statistics(model)
    peaks = [gaussian_map((0., 0.), factor ** 2 * np.eye(2)).max() * 256 for factor in (0., 0.1, 0.2)]
    assert peaks[0] == pytest.approx(1.0) and peaks[1] < 1.5 < peaks[2]
    assert [r['uniform'] for r in rows[:3]] == [True, True, False]
    assert rows[0]['entropy'] == pytest.approx(math.log(256), rel=1e-6)
    assert layer_summary(rows)[0]['uniform_heads'] == 2


def test_generalized_covariance_is_inverse_precision():
    model = small('sa_gen_cifar')
    s = torch.tensor([[1.5, 0.], [0.7, 0.4]])
    with torch.no_grad():
        model.blocks[1].attn.position.precision_factors[2] = s
        model.blocks[1].attn.position.precision_factors[0] = torch.tensor([[1., 1.], [1., 1.]])  # singular M
    cov = head_covariances(model)[1]
    expected = np.linalg.inv((s @ s.T).double().numpy())
    np.testing.assert_allclose(cov[2].numpy(), expected, rtol=1e-6)
    assert math.isinf(cov[0, 0, 0])
    row = head_statistics(model)[3 + 2]
    assert row['peak'] == pytest.approx(
        gaussian_map(model.blocks[1].attn.position.centers[2].tolist(), (s @ s.T).double().numpy()).max(), rel=1e-5)


def test_tables_csv_json(tmp_path):
    rows = head_statistics(small('sa_learned_cifar'))
    assert math.isnan(rows[0]['cov_rr'])
    assert 'peak' in format_table(rows).splitlines()[0]
    write_table(rows, str(tmp_path / 't.csv'))
    assert (tmp_path / 't.csv').read_text().count('\n') == 1 + 6
    summary = layer_summary(rows)
    write_table(summary, str(tmp_path / 's.json'))
    assert json.loads((tmp_path / 's.json').read_text())[1]['heads'] == 3
    with pytest.raises(ValueError, match='.csv or .json'):
        write_table(rows, str(tmp_path / 't.txt'))
    # a write that fails half-way (here: a value JSON cannot hold, a key the CSV header lacks) keeps the earlier table
    before = {name: (tmp_path / name).read_bytes() for name in ('t.csv', 's.json')}
    with pytest.raises(TypeError):
        write_table([*summary, {'heads': object()}], str(tmp_path / 's.json'))
    with pytest.raises(ValueError, match='not in fieldnames'):
        write_table([*rows, {**rows[0], 'extra': 1}], str(tmp_path / 't.csv'))
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ['s.json', 't.csv']  # no temporary file left


def test_contour_holds_the_gaussian_mass():
    # isotropic: the p-mass circle of N(mu, I/s^2) has radius sqrt(-2 log(1-p)) / s
    points = gaussian_contour(torch.tensor([1., 2.]), torch.eye(2) * 4.0, 0.9).numpy()
    radius = np.hypot(points[:, 0] - 1, points[:, 1] - 2)
    np.testing.assert_allclose(radius, math.sqrt(-2 * math.log(0.1)) / 2, rtol=1e-12)


def test_figure_a_draws_the_centres_and_contours():
    model = small('sa_gen_cifar')
    fig, data = plot_centers(model)
    for layer in range(2):
        centers = model.blocks[layer].attn.position.centers.detach().double().numpy()
        np.testing.assert_allclose(data['centers'][layer], centers)
        ax = fig.axes[layer]
        for head in range(3):
            s = model.blocks[layer].attn.position.precision_factors[head].detach().double()
            for mass in (0.5, 0.9):
                line = next(ln for ln in ax.lines if ln.get_gid() == f'contour-{layer}-{head}-{mass}')
                # every contour point x satisfies (x - mu)^T M (x - mu) = -2 log(1 - mass)
                d = np.stack([line.get_ydata() - centers[head, 0], line.get_xdata() - centers[head, 1]], -1)
                m = (s @ s.T).numpy()
                np.testing.assert_allclose(np.einsum("ni,ij,nj->n", d, m, d), -2 * math.log(1 - mass), rtol=1e-5)
            dot = next(ln for ln in ax.lines if ln.get_gid() == f'center-{layer}-{head}')
            assert (dot.get_ydata()[0], dot.get_xdata()[0]) == pytest.approx(tuple(centers[head]))
    with pytest.raises(ValueError, match='--figure maps'):
        plot_centers(small('sa_learned_cifar'))


def test_figure_a_draws_a_centre_beyond_its_axes_hollow_at_their_edge():
    """A head centred past the image (trained models have them: 4 of the gpu zoo's quadratic layer 6) stays in the
    figure, hollow at the axes' edge, numbered; the data keep the true centre."""
    model = small('sa_quadratic_cifar')
    set_quadratic(model, 0, 0, (1., 1.), 0.8)
    set_quadratic(model, 0, 1, (2., -11.), 0.8)
    fig, data = plot_centers(model, extent=4)
    np.testing.assert_allclose(data['centers'][0][1], [2., -11.])
    ax = fig.axes[0]
    beyond, inside = (next(ln for ln in ax.lines if ln.get_gid() == f'center-0-{head}') for head in (1, 0))
    assert (beyond.get_ydata()[0], beyond.get_xdata()[0]) == (2., -4.) and beyond.get_markerfacecolor() == 'none'
    assert inside.get_markerfacecolor() != 'none'
    assert any(t.get_text() == '2' and t.xy == (-4., 2.) for t in ax.texts)


def test_figure_c_ends_a_path_beyond_its_axes_hollow_at_their_edge():
    """A head that moved past the axes (to (2, -11), axes +-4) ended outside the figure, its cross never drawn:
    its path runs along the edge and ends there hollow, as figure (a) draws such a centre; the data keep it."""
    first = small('sa_quadratic_cifar')
    set_quadratic(first, 0, 0, (1., 1.), 0.8)  # a head that stays inside
    set_quadratic(first, 0, 1, (1., -1.), 0.8)
    second = copy.deepcopy(first)
    set_quadratic(second, 0, 1, (2., -11.), 0.8)
    fig, data = plot_center_trajectories([first, second], extent=4)
    np.testing.assert_allclose(data['centers'][-1, 0, 1], [2., -11.])
    lines = {ln.get_gid(): ln for ln in fig.axes[0].lines}
    path, end = lines['trajectory-0-1'], lines['end-0-1']
    assert path.get_xdata().tolist() == [-1., -4.] and path.get_ydata().tolist() == [1., 2.]
    assert (end.get_xdata()[0], end.get_ydata()[0]) == (-4., 2.) and end.get_markerfacecolor() == 'none'
    assert lines['end-0-0'].get_marker() == 'x'


def test_figure_b_draws_the_query_attention():
    model = small('sa_quadratic_cifar')
    set_quadratic(model, 1, 1, (2., -1.), 0.8)
    fig, data = plot_attention_maps(model, query=(3, 12), zoom=4)
    assert data['maps'].shape == (2, 3, 9, 9)
    s = 0.8
    expected = gaussian_map((2., -1.), np.eye(2) * s * s, query=(3, 12))
    window = np.full((9, 9), np.nan)
    window[1:, :] = np.pad(expected[0:8, 8:16], ((0, 0), (0, 1)), constant_values=np.nan)  # rows -1..7, cols 8..16
    np.testing.assert_allclose(data['maps'][1, 1], window, rtol=1e-6, equal_nan=True)
    image = next(im for im in fig.axes[1 * 3 + 1].images if im.get_gid() == 'map-1-1')
    np.testing.assert_allclose(np.ma.filled(image.get_array(), np.nan), window, rtol=1e-6, equal_nan=True)


def test_figure_b_content_kind_averages_a_batch():
    model = small('sa_content_cifar')
    images = torch.randn(4, 3, 16, 16)
    _, data = plot_attention_maps(model, images=images, zoom=3)
    # by hand: the first layer sees the embedding of the images
    tokens = model.patch_embed(images)  # grid-major or batch-major depending on the model layout
    tokens = tokens.permute(2, 0, 1, 3) if tokens.shape[2] == 4 else tokens
    x = tokens.reshape(4, 64, 16).double()
    attn = model.blocks[0].attn
    q = (x @ attn.content.query.weight.double().T + attn.content.query.bias.double()).view(4, 64, 3, 16)
    k = (x @ attn.content.key.weight.double().T + attn.content.key.bias.double()).view(4, 64, 3, 16)
    scores = torch.einsum('bqhd,bkhd->bhqk', q, k) / 4.0 + attn.position.grid_scores(8, 8).double()[None]
    probs = scores.softmax(-1).mean(0)[:, 4 * 8 + 4].reshape(3, 8, 8)
    np.testing.assert_allclose(data['maps'][0][:, :7, :7], probs[:, 1:8, 1:8].detach().numpy(), rtol=1e-5, atol=1e-9)


def test_content_maps_of_a_model_that_pads_its_input_are_of_its_grid(tmp_path):
    """A content model trained on 12x12 images that it pads to 16x16 itself (as a Fashion-MNIST export pads 28 to
    32): its maps average images of its input size, 12x12 (the grid counts the border), for the plot and the card
    figure alike."""
    torch.manual_seed(0)
    model = timm.create_model('sa_content_cifar', **SMALL, input_padding=2,
                              pretrained_cfg_overlay=dict(input_size=(3, 12, 12))).eval()
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape[-2:])))
    _, data = plot_attention_maps(model, zoom=3)
    assert seen == [(12, 12)] and data['maps'][0].shape[-2:] == (7, 7)  # a 8x8 grid, zoomed to 3 around the query
    assert (tmp_path / 'card.png').samefile(save_card_figure(model, str(tmp_path / 'card.png')))


def test_statistics_of_given_images_are_of_the_grid_the_model_runs_on():
    """Images given to head_statistics set its grid, with the border the model adds itself: 12x12 images padded to
    16x16 are an 8x8 grid of tokens. A grid_size that is not theirs is refused (it reshaped the maps to it)."""
    torch.manual_seed(0)
    images = torch.randn(2, 3, 12, 12)
    quadratic = small('sa_quadratic_cifar', input_padding=2)
    assert head_statistics(quadratic, images=images) == head_statistics(quadratic, grid_size=(8, 8))
    content = small('sa_content_cifar', input_padding=2)
    rows = head_statistics(content, images=images)
    assert [(r['layer'], r['head']) for r in rows] == [(layer, head) for layer in (1, 2) for head in (1, 2, 3)]
    assert all(0 < r['entropy'] <= math.log(64) + 1e-9 and r['peak'] <= 1 for r in rows)  # one query's 64 keys
    with pytest.raises(UserError, match=r'grid_size \(6, 6\) is not the 8x8 token grid of the images given'):
        head_statistics(content, grid_size=(6, 6), images=images)
    from sa_vision.research.analysis import attention_probs, query_maps
    with pytest.raises(UserError, match='have 64 keys, not the 36 of a 6x6 token grid'):
        query_maps(attention_probs(content, images=images)[0], (6, 6))
    for model in (quadratic, content):  # figure (b) of the same images: the same grid, query (4, 4) at its centre
        _, data = plot_attention_maps(model, images=images, zoom=8)  # the whole grid around the query
        rows = head_statistics(model, images=images)
        assert np.allclose(np.nanmax(data['maps'], axis=(2, 3)).ravel(), [r['peak'] for r in rows])


def test_weights_are_named_by_a_path_as_well_as_by_a_string(tmp_path):
    """A notebook globs its checkpoints (Path objects): load_model and the trajectory figure take them as they take
    strings; what is neither a path nor a name is refused in words."""
    from safetensors.torch import save_file
    first, second = small('sa_quadratic_cifar'), small('sa_quadratic_cifar')
    with torch.no_grad():
        second.blocks[0].attn.position.centers.add_(1.0)
    for index, model in enumerate((first, second)):
        save_file(model.state_dict(), str(tmp_path / f'epoch-{index}.safetensors'))
    paths = sorted(tmp_path.glob('epoch-*.safetensors'))
    assert torch.equal(load_model(paths[1]).blocks[0].attn.position.centers, second.blocks[0].attn.position.centers)
    _, data = plot_center_trajectories(paths)
    _, expected = plot_center_trajectories([first, second])
    assert np.array_equal(data['centers'], expected['centers'])
    from sa_vision.research.explorer import resolve_explorer_model
    assert resolve_explorer_model(paths[0]).name == str(paths[0])
    with pytest.raises(TypeError, match='expected a file, a folder or a model name .* not a SelfAttentionNet'):
        load_model(first)


def test_figure_c_and_card(tmp_path):
    first = small('sa_quadratic_cifar')
    second = small('sa_quadratic_cifar')
    with torch.no_grad():
        second.blocks[0].attn.position.centers.add_(1.0)
    fig, data = plot_center_trajectories([first, second], str(tmp_path / 'c.svg'))
    assert data['centers'].shape == (2, 2, 3, 2)
    line = next(ln for ln in fig.axes[0].lines if ln.get_gid() == 'trajectory-0-1')
    c0 = first.blocks[0].attn.position.centers[1].tolist()
    np.testing.assert_allclose(line.get_xdata(), [c0[1], c0[1] + 1], rtol=1e-6)
    np.testing.assert_allclose(line.get_ydata(), [c0[0], c0[0] + 1], rtol=1e-6)
    assert (tmp_path / 'c.svg').stat().st_size > 0
    for name in ('sa_gen_cifar', 'sa_learned_cifar'):
        path = save_card_figure(small(name), str(tmp_path / f'{name}.png'))
        assert open(path, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def test_load_model_from_checkpoints_and_hub_folder(tmp_path):
    from safetensors.torch import save_file
    model = small('sa_gen_cifar', heads_per_layer=(2, 3))
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        ref = model(x)
    torch.save({'model': model.state_dict(), 'model_args': {'attn_drop_rate': 0.0}}, tmp_path / 'a.pth')
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / 'b.safetensors'))
    timm.models.save_for_hf(model, str(tmp_path / 'hub'), model_config={'architecture': 'sa_gen_cifar'},
                            model_args=dict(SMALL, heads_per_layer=[2, 3]))
    for source in ('a.pth', 'b.safetensors', 'hub'):
        loaded = load_model(str(tmp_path / source))
        assert loaded.heads_per_layer == (2, 3)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), ref)
    assert load_model(str(tmp_path / 'a.pth')).blocks[0].attn.attn_drop == 0.0
    with pytest.raises(ValueError, match='does not exist'):
        load_model(str(tmp_path / 'missing.pth'))


@pytest.mark.slow
def test_plot_script_on_random_init(tmp_path):
    """Into folders not made yet, as the other commands' outputs."""
    out = tmp_path / 'figs' / 'fig.png'
    result = subprocess.run(
        [*command('plot_attention'), 'sa_quadratic_cifar', '--out', str(out),
         '--table', str(tmp_path / 'tables' / 'heads.csv')], check=True, capture_output=True, text=True)
    assert out.stat().st_size > 10_000 and 'wrote' in result.stdout
    assert (tmp_path / 'tables' / 'heads.csv').read_text().count('\n') == 1 + 54


def test_kernel_match_writes_its_table_without_a_picture_and_a_bad_query_draws_nothing(tmp_path, capsys):
    table, picture = tmp_path / 'heads.csv', tmp_path / 'q.png'
    status, out, _ = command_here(capsys, 'plot_attention', 'sa_quadratic_cifar', '--kernel-match', '--table', table)
    assert status == 0 and 'dilation' in out and table.read_text().count('\n') == 1 + 54
    # figure (a) takes no query: the statistics, which do, refuse it before the picture is drawn
    status, _, err = command_here(capsys, 'plot_attention', 'sa_quadratic_cifar', '--query', 40, 40, '--out', picture)
    assert status == 2 and 'outside the 16x16 token grid' in err and not picture.exists()


class _MetaScalars(torch.utils._python_dispatch.TorchDispatchMode):
    """Answers reads of a value of a 'meta' tensor with 0, so a function that ends in ``float(...)`` runs to its
    end on 'meta' (the stand-in for a device other than the CPU) and shows whether it mixes in CPU tensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == 'meta':
            return 0
        return func(*args, **(kwargs or {}))


def test_helpers_compute_on_the_device_of_their_input():
    from sa_vision.research.analysis import _mean_shift, mass_radius
    contour = gaussian_contour(torch.tensor([1., 2.], device='meta'), torch.eye(2, device='meta') * 4, 0.9)
    assert contour.device.type == 'meta' and contour.shape == (100, 2)
    maps = torch.full((3, 5, 5), 1 / 25, device='meta')
    assert _mean_shift(maps, (5, 5)).device.type == 'meta'
    with _MetaScalars():
        assert mass_radius(maps[0], (0., 0.), 0.5, (2, 2)) == 0.


def test_center_shift_median_of_a_hand_made_pair_of_state_dicts():
    from sa_vision.research.analysis import center_shift_median, center_shifts
    initial = {
        'blocks.0.attn.position.centers': torch.tensor([[0., 0.], [1., 1.], [2., -1.]]),
        'blocks.0.attn.position.precision_factors': torch.ones(3),
        'blocks.1.attn.position.centers': torch.zeros(3, 2),
        'head.weight': torch.zeros(10, 4),
    }
    final = dict(initial)
    # moves of 5 (3-4-5), 0, 1 in layer 0 and 2, 0.5, 3 in layer 1
    final['blocks.0.attn.position.centers'] = torch.tensor([[3., 4.], [1., 1.], [2., 0.]])
    final['blocks.1.attn.position.centers'] = torch.tensor([[0., 2.], [-0.5, 0.], [0., -3.]])
    final['head.weight'] = torch.ones(10, 4)  # not a centre: ignored
    assert center_shifts(initial, final).tolist() == [5., 0., 1., 2., 0.5, 3.]
    assert center_shift_median(initial, final) == pytest.approx(1.5)  # (1 + 2) / 2 of 0, 0.5, 1, 2, 3, 5
    learned = {'blocks.0.attn.position.row_keys.weight': torch.zeros(3, 4)}
    assert center_shift_median(learned, learned) is None  # no centres: empty column
    with pytest.raises(ValueError, match='same run'):
        center_shift_median(initial, {**final, 'blocks.1.attn.position.centers': torch.zeros(2, 2)})
