""" Where the attention heads look: per-head statistics of a trained (or random) SA model (paper Sec. 4)

:func:`head_statistics` reports per layer and head (both numbered from 1, as the paper's figures number layers and
``sa-vision-prune`` and our figures number both: ``blocks[layer - 1]``, head index ``head - 1``), from the attention
of one interior query pixel:
``center_row/col`` (``mu_h`` for the Gaussian kinds, else the mean shift), ``mean_row/col`` (the probability-weighted
mean shift, which differs from ``mu_h`` near borders), ``cov_*`` (``M_h^-1``, Gaussian kinds only, NaN otherwise),
``r50`` / ``r90`` (radius around the mean holding 50 / 90 % of the mass), ``peak`` (the largest probability),
``entropy`` (nats), ``peak_row/col`` (the grid shift holding ``peak``: a centre beyond the grid's border peaks on
the border) and ``uniform`` (no key gets more than :data:`UNIFORM_PEAK_RATIO` times the uniform ``1 / positions``:
the head averages the whole grid, as the paper's App. A.1 found heads of precision near 0 do).
:func:`layer_summary` says per layer how convolutional it is (docs/research.md).
Shifts are (row, col) = (down, right) in grid units; one grid unit is 2 image pixels (space-to-depth).
"""
import csv
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..io import atomic_write
from ..layers import PositionalAttention
from ..models import SA_MODEL_ARGS
from ..models.input_pad import model_input_padding
from ..models.sa_state_dict import CENTERS
from ..tables import markdown_table
from ..train.checkpoint import infer_model_args, load_model  # noqa: F401  (re-exported: the scripts' one loader)

__all__ = [
    'GAUSSIAN_KINDS', 'UNIFORM_PEAK_RATIO', 'attention_layers', 'center_shifts', 'center_shift_median',
    'default_grid_size', 'analysed_grid',
    'interior_query', 'attention_probs', 'query_maps', 'head_centers', 'head_precisions', 'head_covariances',
    'mass_radius', 'gaussian_contour', 'head_statistics', 'layer_summary', 'format_table', 'table_format',
    'write_table', 'load_model', 'infer_model_args',
]

GAUSSIAN_KINDS = ('quadratic', 'generalized')
# our threshold: a head whose largest probability is below 1.5 / positions spreads over nearly every key (the kept
# zoos' heads are at 1.0-1.15 or above 2.4)
UNIFORM_PEAK_RATIO = 1.5


def attention_layers(model: nn.Module) -> List[PositionalAttention]:
    """The positional attention layers of ``model``, in order."""
    layers = [m for m in model.modules() if isinstance(m, PositionalAttention)]
    if not layers:
        raise UserError(
            f'{type(model).__name__} has no PositionalAttention layer; pass one of sa_vision\'s attention models '
            f'({", ".join(SA_MODEL_ARGS)}) or weights of one')
    return layers


def default_grid_size(model: nn.Module) -> Tuple[int, int]:
    """Token grid of the model's default input (half the image size), 16x16 for 32x32 CIFAR images."""
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    _, height, width = cfg.get('input_size', (3, 32, 32))
    pad = model_input_padding(model)  # a border the model adds itself (Fashion-MNIST exports: 28 + 2 x 2)
    return (height + 2 * pad) // 2, (width + 2 * pad) // 2


def analysed_grid(model: nn.Module, grid_size: Union[int, Tuple[int, int], None] = None,
                  images: Optional[Tensor] = None) -> Tuple[int, int]:
    """The token grid of an analysis: that of ``images`` where given, with the border the model adds itself
    (Fashion-MNIST exports; a ``grid_size`` that is not theirs is refused), else ``grid_size`` (an int: a square), else
    the model's own (:func:`default_grid_size`)."""
    grid_size = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
    if images is not None:
        pad = model_input_padding(model)
        images_grid = ((images.shape[-2] + 2 * pad) // 2, (images.shape[-1] + 2 * pad) // 2)
        if grid_size is not None and tuple(grid_size) != images_grid:
            raise UserError(f'grid_size {tuple(grid_size)} is not the {images_grid[0]}x{images_grid[1]} token grid of '
                            f'the images given ({images.shape[-2]}x{images.shape[-1]} pixels): leave grid_size out')
        return images_grid
    return tuple(grid_size or default_grid_size(model))


def interior_query(grid_size: Tuple[int, int]) -> Tuple[int, int]:
    """The query pixel used for the statistics: the grid centre, as far from every border as possible."""
    return grid_size[0] // 2, grid_size[1] // 2


@torch.no_grad()
def attention_probs(
        model: nn.Module,
        grid_size: Optional[Tuple[int, int]] = None,
        images: Optional[Tensor] = None,
) -> List[Tensor]:
    """Per layer, the attention probabilities ``(heads, h*w, h*w)`` as ``[head, query, key]`` (float64).

    The ``content`` kind's depend on the input: averaged over ``images`` (default 16 standard-normal images, seed 0).
    """
    layers = attention_layers(model)
    kind = layers[0].kind
    if kind != 'content':
        grid_h, grid_w = grid_size or default_grid_size(model)
        return [layer.position_probs(grid_h, grid_w).double() for layer in layers]
    if images is None:
        cfg = getattr(model, 'pretrained_cfg', None) or {}
        chans, height, width = cfg.get('input_size', (3, 32, 32))
        if grid_size is not None:  # the images whose grid it is, less the border the model adds itself
            pad = model_input_padding(model)
            height, width = 2 * grid_size[0] - 2 * pad, 2 * grid_size[1] - 2 * pad
            if min(height, width) < 1:
                raise UserError(f'a {grid_size[0]}x{grid_size[1]} grid is smaller than the border of {pad} pixels '
                                f'this model adds to its input: ask for a larger grid')
        generator = torch.Generator().manual_seed(0)
        ref = next(model.parameters())
        images = torch.randn(16, chans, height, width, generator=generator).to(ref.device, ref.dtype)
    captured: List[Tensor] = []

    def capture_for(layer: PositionalAttention):
        def capture(block: nn.Module, args: Tuple[Tensor, ...]) -> None:
            # the block's input is the attention's input (the block may call the attention's parts directly)
            captured.append(layer.content_probs(args[0]).double().mean(dim=0))
        return capture

    parents = {id(m.attn): m for m in model.modules() if isinstance(getattr(m, 'attn', None), PositionalAttention)}
    if any(id(layer) not in parents for layer in layers):
        raise UserError('content attention maps need each attention layer to be the .attn of a block module')
    handles = [parents[id(layer)].register_forward_pre_hook(capture_for(layer)) for layer in layers]
    was_training = model.training
    try:
        model.eval()
        model(images)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return captured


def query_maps(probs: Tensor, grid_size: Tuple[int, int], query: Optional[Tuple[int, int]] = None) -> Tensor:
    """The attention of one query pixel as images ``(heads, h, w)`` (``query`` default: grid centre)."""
    grid_h, grid_w = grid_size
    if probs.shape[-1] != grid_h * grid_w:  # content probabilities of images of another size
        raise UserError(f'these attention probabilities have {probs.shape[-1]} keys, not the {grid_h * grid_w} of a '
                        f'{grid_h}x{grid_w} token grid: give the grid of the images they were computed from')
    row, col = query if query is not None else interior_query(grid_size)
    if not (0 <= row < grid_h and 0 <= col < grid_w):
        raise UserError(f'query pixel {(row, col)} is outside the {grid_h}x{grid_w} token grid')
    return probs[:, row * grid_w + col].reshape(-1, grid_h, grid_w)


def head_centers(model: nn.Module, grid_size: Optional[Tuple[int, int]] = None) -> List[Tensor]:
    """Per layer, the heads' centres ``(heads, 2)`` as (row, col) shifts: ``mu_h`` for the Gaussian kinds,
    otherwise the mean shift of the (positional) attention of the interior query."""
    layers = attention_layers(model)
    if layers[0].kind in GAUSSIAN_KINDS:
        return [layer.position.centers.detach().double().cpu() for layer in layers]
    grid_size = grid_size or default_grid_size(model)
    centers = []
    for layer in layers:
        maps = query_maps(layer.position_probs(*grid_size).detach().double().cpu(), grid_size)
        centers.append(_mean_shift(maps, grid_size))
    return centers


def center_shifts(initial: Dict[str, Tensor], final: Dict[str, Tensor]) -> Tensor:
    """How far every head's centre moved between two state dicts of one run, ``|final mu_h - initial mu_h|`` in grid
    units, ``(all heads,)`` float64; empty for models without centres."""
    keys = [k for k in final if k.endswith(CENTERS)]
    if sorted(keys) != sorted(k for k in initial if k.endswith(CENTERS)):
        raise ValueError('the initial and final state dicts hold centres of different layers; pass two states of '
                         'the same run (e.g. epoch-000.safetensors and last.pth.tar)')
    shifts = []
    for key in keys:
        start, end = initial[key].detach().double().cpu(), final[key].detach().double().cpu()
        if start.shape != end.shape:
            raise ValueError(f'{key}: initial centres {tuple(start.shape)} and final {tuple(end.shape)} differ in '
                             f'shape (heads pruned in between?); pass two states of the same run')
        shifts.append((end - start).norm(dim=-1))
    return torch.cat(shifts) if shifts else torch.zeros(0, dtype=torch.float64)


def center_shift_median(initial: Dict[str, Tensor], final: Dict[str, Tensor]) -> Optional[float]:
    """Median over all heads of :func:`center_shifts` (the mean of the two middle values, unlike ``torch.median``);
    None for a model without centres."""
    shifts = center_shifts(initial, final)
    if shifts.numel() == 0:
        return None
    return float(shifts.quantile(0.5))


def head_precisions(model: nn.Module) -> List[Tensor]:
    """Per layer, the Gaussian precision ``M_h`` ``(heads, 2, 2)``: ``S_h S_h^T`` (generalized), ``s_h^2 I``
    (quadratic), formed in float64 (a float32 product loses a near-singular head's small eigenvalue)."""
    layers = attention_layers(model)
    kind = layers[0].kind
    if kind not in GAUSSIAN_KINDS:
        raise UserError(f'precisions exist for the Gaussian kinds {GAUSSIAN_KINDS} only, this model is {kind!r}')
    if kind == 'quadratic':
        eye = torch.eye(2, dtype=torch.float64)[None]
        return [eye * (layer.position.precision_factors.detach().double().cpu() ** 2)[:, None, None]
                for layer in layers]
    factors = [layer.position.precision_factors.detach().double().cpu() for layer in layers]
    return [s @ s.transpose(-1, -2) for s in factors]


def head_covariances(model: nn.Module) -> List[Tensor]:
    """Per layer, the Gaussian covariance ``Sigma_h = M_h^-1`` ``(heads, 2, 2)`` (Gaussian kinds only):
    ``I / s_h^2`` for ``quadratic``; entries are ``inf`` where ``M_h`` is singular."""
    covariances = []
    for precisions in head_precisions(model):
        m_rr, m_rc, m_cr, m_cc = precisions[:, 0, 0], precisions[:, 0, 1], precisions[:, 1, 0], precisions[:, 1, 1]
        det = m_rr * m_cc - m_rc * m_cr
        adjugate = torch.stack([torch.stack([m_cc, -m_rc], -1), torch.stack([-m_cr, m_rr], -1)], -2)
        cov = adjugate / det[:, None, None]
        cov[det.abs() <= 1e-300] = math.inf
        covariances.append(cov)
    return covariances


def _shift_grid(grid_size: Tuple[int, int], query: Tuple[int, int], device=None) -> Tuple[Tensor, Tensor]:
    """Row and column shift ``(h, w)`` of every key from ``query`` (float64, on ``device``)."""
    rows = torch.arange(grid_size[0], dtype=torch.float64, device=device) - query[0]
    cols = torch.arange(grid_size[1], dtype=torch.float64, device=device) - query[1]
    return torch.meshgrid(rows, cols, indexing='ij')


def _mean_shift(maps: Tensor, grid_size: Tuple[int, int], query: Optional[Tuple[int, int]] = None) -> Tensor:
    dy, dx = _shift_grid(grid_size, query or interior_query(grid_size), device=maps.device)
    return torch.stack([(maps * dy).sum((-2, -1)), (maps * dx).sum((-2, -1))], dim=-1)


def mass_radius(query_map: Tensor, center: Tuple[float, float], mass: float, query: Tuple[int, int]) -> float:
    """Smallest radius ``r`` (grid units) such that the keys within distance ``r`` of ``center`` (a shift
    from ``query``) hold at least ``mass`` of the probabilities ``query_map`` (``h x w``)."""
    dy, dx = _shift_grid(tuple(query_map.shape), query, device=query_map.device)
    distance = ((dy - center[0]) ** 2 + (dx - center[1]) ** 2).sqrt().flatten()
    order = distance.argsort()
    cumulative = query_map.double().flatten()[order].cumsum(0)
    index = torch.searchsorted(cumulative, mass * cumulative[-1:] - 1e-12).clamp(max=distance.numel() - 1)
    return float(distance[order][index])


def gaussian_contour(center: Tensor, precision: Tensor, mass: float, num_points: int = 100,
                     max_radius: float = 1e3) -> Tensor:
    """Points ``(num_points, 2)`` (row, col) of the ellipse holding ``mass`` of ``N(center, M^-1)``: chi-square
    with 2 dof, ``c = -2 log(1 - mass)``; semi-axes capped at ``max_radius`` (a singular ``M`` has an infinite one)."""
    if not 0 < mass < 1:
        raise UserError(f'mass must be in (0, 1), got {mass}')
    scale = math.sqrt(-2.0 * math.log1p(-mass))
    eigenvalues, eigenvectors = torch.linalg.eigh(precision.double())
    semi_axes = (scale / eigenvalues.clamp(min=1e-300).sqrt()).clamp(max=max_radius)
    angle = torch.linspace(0, 2 * math.pi, num_points, dtype=torch.float64, device=precision.device)
    circle = torch.stack([angle.cos(), angle.sin()], dim=0)  # 2, n
    return center.double()[None] + (eigenvectors @ (semi_axes[:, None] * circle)).T


@torch.no_grad()
def head_statistics(
        model: nn.Module,
        grid_size: Optional[Tuple[int, int]] = None,
        query: Optional[Tuple[int, int]] = None,
        images: Optional[Tensor] = None,
) -> List[Dict[str, Any]]:
    """One row per layer and head with the statistics described in the module docstring."""
    layers = attention_layers(model)
    kind = layers[0].kind
    grid_size = analysed_grid(model, grid_size, images)
    query = tuple(query or interior_query(grid_size))
    probs = attention_probs(model, grid_size, images=images)
    centers = head_centers(model, grid_size) if kind in GAUSSIAN_KINDS else None
    covariances = head_covariances(model) if kind in GAUSSIAN_KINDS else None
    rows = []
    for layer_index, layer_probs in enumerate(probs):
        maps = query_maps(layer_probs.cpu(), grid_size, query)
        means = _mean_shift(maps, grid_size, query)
        peaks = maps.flatten(1).argmax(dim=1)  # the first of tied maxima (a uniform head: the top-left key)
        for head, head_map in enumerate(maps):
            mean = means[head]
            center = centers[layer_index][head] if centers is not None else mean
            cov = covariances[layer_index][head] if covariances is not None else torch.full((2, 2), math.nan)
            flat = head_map.flatten()
            entropy = -float((flat * flat.clamp(min=1e-300).log()).sum())
            rows.append({
                'layer': layer_index + 1, 'head': head + 1, 'kind': kind,
                'center_row': float(center[0]), 'center_col': float(center[1]),
                'mean_row': float(mean[0]), 'mean_col': float(mean[1]),
                'cov_rr': float(cov[0, 0]), 'cov_rc': float(cov[0, 1]), 'cov_cc': float(cov[1, 1]),
                'r50': mass_radius(head_map, (float(mean[0]), float(mean[1])), 0.5, query),
                'r90': mass_radius(head_map, (float(mean[0]), float(mean[1])), 0.9, query),
                'peak': float(flat.max()), 'entropy': entropy,
                'peak_row': int(peaks[head]) // grid_size[1] - query[0],
                'peak_col': int(peaks[head]) % grid_size[1] - query[1],
                'uniform': float(flat.max()) * flat.numel() <= UNIFORM_PEAK_RATIO,
            })
    return rows


def layer_summary(rows: Sequence[Dict[str, Any]], hard_threshold: float = 0.5) -> List[Dict[str, Any]]:
    """Per layer, how convolutional it is: ``hard_heads`` are near-hard, their ``peak`` is ``hard_threshold`` or more
    (our threshold; Lemma 1's heads put probability exactly 1 on their shift), ``distinct_shifts`` counts the grid
    shifts they peak on, ``peak_row/col`` (a ``K x K`` convolution needs ``K*K``); ``uniform_heads`` average the
    whole grid (``uniform``)."""
    summary = []
    for layer in sorted({r['layer'] for r in rows}):
        heads = [r for r in rows if r['layer'] == layer]
        hard = [r for r in heads if r['peak'] >= hard_threshold]
        shifts = {(r['peak_row'], r['peak_col']) for r in hard}
        kernel_3x3 = {(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)}
        summary.append({
            'layer': layer, 'heads': len(heads), 'hard_heads': len(hard),
            'uniform_heads': sum(r['uniform'] for r in heads), 'distinct_shifts': len(shifts),
            'covers_3x3': kernel_3x3 <= shifts,
            'mean_entropy': sum(r['entropy'] for r in heads) / len(heads),
            'shifts': sorted(shifts),
        })
    return summary


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f'{value:.3g}' if math.isfinite(value) else str(value)
    return str(value)


def format_table(rows: Sequence[Dict[str, Any]], columns: Optional[Sequence[str]] = None) -> str:
    """``rows`` (dicts) as a Markdown table aligned for printing."""
    if not rows:
        return '(no rows)'
    columns = list(columns or rows[0].keys())
    return markdown_table(columns, [[_format_value(row[c]) for c in columns] for row in rows], 'r' * len(columns),
                          pad=True)


def table_format(path: str) -> str:
    """The format of a per-head table file by its name, 'csv' or 'json'; a UserError for another."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in ('.csv', '.json'):
        raise UserError(f'table path {path!r} must end in .csv or .json')
    return suffix[1:]


def write_table(rows: Sequence[Dict[str, Any]], path: str) -> str:
    """Write ``rows`` to ``path`` as CSV (``.csv``) or JSON (``.json``), its folder created; returns ``path``."""
    suffix = '.' + table_format(path)
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    with atomic_write(path) as tmp, open(tmp, 'w', encoding='utf-8', newline='') as f:
        if suffix == '.json':
            json.dump([{k: (list(map(list, v)) if k == 'shifts' else v) for k, v in r.items()} for r in rows], f,
                      indent=1)
        else:
            writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
    return path
