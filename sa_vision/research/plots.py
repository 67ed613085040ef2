""" Pictures of where the attention heads look (paper Figs. 3-6)

(a) :func:`plot_centers`: centres with their 50 % / 90 % contours, Gaussian kinds (Figs. 3-4); (b)
:func:`plot_attention_maps`: the attention of one query pixel per layer and head (Figs. 5-6); (c)
:func:`plot_center_trajectories`: how the centres moved (Fig. 3). Each returns ``(figure, data)``, built without
pyplot (no global state). Axes: x = column shift (right), y = row shift (down), in grid units (2 image pixels).
"""
import math
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor, nn

from ..errors import UserError
from ..io import atomic_write
from .analysis import (
    GAUSSIAN_KINDS,
    analysed_grid,
    attention_layers,
    attention_probs,
    default_grid_size,
    gaussian_contour,
    head_centers,
    head_precisions,
    interior_query,
    load_model,
    query_maps,
)

__all__ = ['plot_centers', 'plot_attention_maps', 'plot_center_trajectories', 'save_card_figure', 'picture_problem']

CONTOUR_MASSES = (0.5, 0.9)
CONTOUR_STYLES = ('-', ':')


def _layer_grid(num_layers: int, max_cols: int = 3, panel: float = 3.2) -> Tuple[Figure, List[Any]]:
    cols = min(max_cols, num_layers)
    rows = math.ceil(num_layers / cols)
    fig = Figure(figsize=(panel * cols, panel * rows + 0.4), layout='constrained')
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    for ax in axes[num_layers:]:
        ax.set_visible(False)
    return fig, list(axes[:num_layers])


def _head_colors(num_heads: int) -> List[Any]:
    from matplotlib import colormaps
    cmap = colormaps['tab10' if num_heads <= 10 else 'tab20']
    return [cmap(i % cmap.N) for i in range(num_heads)]


def _shift_axes(ax, extent: float, title: str) -> None:
    ax.set_xlim(-extent, extent)
    ax.set_ylim(extent, -extent)  # rows grow downwards, as in the image
    ax.set_aspect('equal')
    ax.set_title(title, fontsize=10)
    ax.axhline(0, color='0.85', lw=0.6, zorder=0)
    ax.axvline(0, color='0.85', lw=0.6, zorder=0)
    ax.tick_params(labelsize=7)


def _query_square(ax, row: float = 0., col: float = 0., color: str = 'black', fill: bool = True) -> None:
    ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, facecolor=color if fill else 'none', edgecolor=color,
                           lw=1.2, zorder=3))


def picture_problem(path: str) -> Optional[str]:
    """What would stop a figure from being saved to ``path`` (a format matplotlib does not write, a folder that
    cannot be made), in words, or None."""
    from ..io import file_problem
    formats = Figure().canvas.get_supported_filetypes()
    suffix = os.path.splitext(path)[1].lower().lstrip('.')
    if suffix not in formats:
        return f'{path} names no picture format matplotlib writes (end it in one of: .{", .".join(sorted(formats))})'
    tex = matplotlib.rcParams['pgf.texsystem']
    if suffix == 'pgf' and shutil.which(tex) is None:  # matplotlib lays out a PGF figure's text with TeX
        return f'{path}: matplotlib writes .pgf with {tex}, which is not installed: install it, or end it in .pdf'
    problem = file_problem(path)
    return f'{path}: {problem}' if problem and not problem.startswith(str(path)) else problem


def _save(fig: Figure, path: Optional[str]) -> None:
    if path is not None:
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        with atomic_write(path) as tmp:
            fig.savefig(tmp, dpi=110)


@torch.no_grad()
def plot_centers(
        model: nn.Module,
        path: Optional[str] = None,
        extent: Optional[float] = None,
        masses: Sequence[float] = CONTOUR_MASSES,
) -> Tuple[Figure, Dict[str, Any]]:
    """Figure (a): per layer, every head's centre ``mu_h`` and its Gaussian's 50 % / 90 % contours; data
    ``{'centers': [(heads, 2)], 'contours': {mass: [(heads, n, 2)]}}`` per layer, as (row, col)."""
    kind = attention_layers(model)[0].kind
    if kind not in GAUSSIAN_KINDS:
        raise UserError(
            f'figure (a) shows Gaussian centres and contours, which {kind!r} attention does not have; '
            f'draw its attention maps, figure (b) (sa-vision-plot --figure maps, or plot_attention_maps)')
    centers = head_centers(model)
    precisions = head_precisions(model)
    if extent is None:
        grid_h, grid_w = default_grid_size(model)
        extent = max(grid_h, grid_w) / 2
    contours = {m: [torch.stack([gaussian_contour(c, p, m) for c, p in zip(cs, ps)]).numpy()
                    for cs, ps in zip(centers, precisions)] for m in masses}
    fig, axes = _layer_grid(len(centers))
    for layer, ax in enumerate(axes):
        colors = _head_colors(len(centers[layer]))
        _shift_axes(ax, extent, f'layer {layer + 1}')
        for head, center in enumerate(centers[layer].numpy()):
            for mass, style in zip(masses, CONTOUR_STYLES * len(masses)):
                points = contours[mass][layer][head]
                ax.plot(points[:, 1], points[:, 0], style, color=colors[head], lw=1.2,
                        label=f'head {head + 1} {int(round(100 * mass))}%', gid=f'contour-{layer}-{head}-{mass}')
            # a centre beyond the axes (a head attending past the image's border) is drawn hollow at their edge
            shown = np.clip(center, -extent, extent)
            beyond = bool((shown != center).any())
            ax.plot(shown[1], shown[0], 'o', color=colors[head], ms=4, mfc='none' if beyond else colors[head],
                    clip_on=not beyond, gid=f'center-{layer}-{head}')
            ax.annotate(str(head + 1), (shown[1], shown[0]), xytext=(3, 3), textcoords='offset points',
                        fontsize=7, color=colors[head], annotation_clip=False)
        _query_square(ax)
    masses_text = ' / '.join(f'{int(round(100 * m))}%' for m in masses)
    fig.suptitle(f'{kind} attention: head centres (numbers) and {masses_text} contours (solid / dotted), '
                 f'query pixel in black; axes in grid units\n'
                 f'a hollow centre lies beyond the axes, drawn at their edge', fontsize=9)
    _save(fig, path)
    return fig, {'centers': [c.numpy() for c in centers], 'contours': contours}


@torch.no_grad()
def plot_attention_maps(
        model: nn.Module,
        path: Optional[str] = None,
        query: Optional[Tuple[int, int]] = None,
        zoom: int = 6,
        grid_size: Optional[Tuple[int, int]] = None,
        images: Optional[Tensor] = None,
) -> Tuple[Figure, Dict[str, Any]]:
    """Figure (b): layers x heads grid of the attention of the ``query`` pixel (default the grid centre), cropped to
    ``zoom`` grid units around it; NaN where a layer has fewer heads or the window leaves the grid."""
    if zoom < 1:
        raise UserError(f'zoom is {zoom}: the window shows at least 1 grid unit around the query')
    kind = attention_layers(model)[0].kind
    grid_size = analysed_grid(model, grid_size, images)
    query = tuple(query or interior_query(grid_size))
    probs = attention_probs(model, grid_size, images=images)
    layer_maps = [query_maps(p.cpu(), grid_size, query).numpy() for p in probs]
    max_heads = max(m.shape[0] for m in layer_maps)
    size = 2 * zoom + 1
    maps = np.full((len(layer_maps), max_heads, size, size), np.nan)
    grid_h, grid_w = grid_size
    row0, col0 = query[0] - zoom, query[1] - zoom
    src_rows = slice(max(row0, 0), min(row0 + size, grid_h))
    src_cols = slice(max(col0, 0), min(col0 + size, grid_w))
    dst_rows = slice(src_rows.start - row0, src_rows.stop - row0)
    dst_cols = slice(src_cols.start - col0, src_cols.stop - col0)
    for layer, m in enumerate(layer_maps):
        maps[layer, :m.shape[0], dst_rows, dst_cols] = m[:, src_rows, src_cols]

    panel = 1.25
    fig = Figure(figsize=(panel * max_heads + 0.6, panel * len(layer_maps) + 0.6), layout='constrained')
    axes = fig.subplots(len(layer_maps), max_heads, squeeze=False)
    for layer in range(len(layer_maps)):
        for head in range(max_heads):
            ax = axes[layer, head]
            ax.set_xticks([])
            ax.set_yticks([])
            if head >= layer_maps[layer].shape[0]:
                ax.set_frame_on(False)
                continue
            panel_map = maps[layer, head]
            ax.imshow(panel_map, cmap='Blues', vmin=0, vmax=np.nanmax(panel_map), extent=(
                -zoom - 0.5, zoom + 0.5, zoom + 0.5, -zoom - 0.5), interpolation='nearest', gid=f'map-{layer}-{head}')
            _query_square(ax, color='red', fill=False)
            if layer == 0:
                ax.set_title(f'head {head + 1}', fontsize=8)
            if head == 0:
                ax.set_ylabel(f'layer {layer + 1}', fontsize=8)
    what = 'averaged over a batch of images' if kind == 'content' else 'content-free'
    fig.suptitle(f'{kind} attention of query pixel {query} (red) on a {grid_h}x{grid_w} grid, {what}; '
                 f'window +-{zoom}, each panel scaled to its maximum', fontsize=8)
    _save(fig, path)
    return fig, {'maps': maps, 'query': query, 'grid_size': grid_size}


@torch.no_grad()
def plot_center_trajectories(
        checkpoints: Sequence[Union[nn.Module, str, os.PathLike]],
        path: Optional[str] = None,
        labels: Optional[Sequence[str]] = None,
        extent: Optional[float] = None,
) -> Tuple[Figure, Dict[str, Any]]:
    """Figure (c): per layer, the path of every head's centre over ``checkpoints`` (models or anything
    :func:`~sa_vision.research.analysis.load_model` opens, in training order); data ``{'centers': (checkpoints,
    layers, heads, 2)}``."""
    if len(checkpoints) < 1:
        raise UserError('give at least one checkpoint (two or more to see the centres move)')
    models = [load_model(c) if isinstance(c, (str, os.PathLike)) else c for c in checkpoints]
    kinds = [attention_layers(m)[0].kind for m in models]
    if len(set(kinds)) != 1:  # a quadratic centre and a learned mean shift are not one head's path
        raise UserError(f'all checkpoints must be of one attention kind to follow the heads, got {kinds}: give the '
                        f'checkpoints of one run')
    heads = [tuple(m.heads_per_layer) for m in models]
    if len(set(heads)) != 1:
        raise UserError(f'all checkpoints must have the same heads per layer to follow the heads, got {heads}')
    centers = np.stack([np.stack([c.numpy() for c in head_centers(m)]) if len(set(heads[0])) == 1 else
                        _ragged(head_centers(m)) for m in models])
    if extent is None:
        grid_h, grid_w = default_grid_size(models[0])
        extent = max(grid_h, grid_w) / 2
    fig, axes = _layer_grid(centers.shape[1])
    for layer, ax in enumerate(axes):
        colors = _head_colors(centers.shape[2])
        _shift_axes(ax, extent, f'layer {layer + 1}')
        for head in range(centers.shape[2]):
            path_rc = centers[:, layer, head]
            if np.isnan(path_rc).all():
                continue
            # as in plot_centers: a path beyond the axes runs along their edge, and ends there in a hollow circle
            shown = np.clip(path_rc, -extent, extent)
            ax.plot(shown[:, 1], shown[:, 0], '-', color=colors[head], lw=1.0, alpha=0.8,
                    gid=f'trajectory-{layer}-{head}')
            ax.plot(shown[0, 1], shown[0, 0], 'o', color=colors[head], ms=2.5, clip_on=False)
            beyond = bool((shown[-1] != path_rc[-1]).any())
            ax.plot(shown[-1, 1], shown[-1, 0], 'o' if beyond else 'x', color=colors[head], ms=5,
                    mfc='none' if beyond else colors[head], clip_on=False, gid=f'end-{layer}-{head}')
        _query_square(ax)
    span = f'{labels[0]} -> {labels[-1]}' if labels else f'{len(models)} checkpoints'
    fig.suptitle(f'centres of attention during training ({span}): dot = first, cross = last; query pixel in black\n'
                 f'a path beyond the axes runs along their edge and ends there in a hollow circle', fontsize=9)
    _save(fig, path)
    return fig, {'centers': centers}


def _ragged(centers: List[Tensor]) -> np.ndarray:
    out = np.full((len(centers), max(len(c) for c in centers), 2), np.nan)
    for layer, c in enumerate(centers):
        out[layer, :len(c)] = c.numpy()
    return out


def save_card_figure(model: nn.Module, path: str) -> str:
    """One picture for a model card: figure (a) for the Gaussian kinds, figure (b) otherwise; returns ``path``."""
    if attention_layers(model)[0].kind in GAUSSIAN_KINDS:
        plot_centers(model, path)
    else:
        plot_attention_maps(model, path)
    return path
