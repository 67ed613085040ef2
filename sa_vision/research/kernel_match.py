""" How close a layer's Gaussian centres come to a 3x3 convolution's kernel (paper Theorem 1, Lemma 2, Figs. 3-4)

Theorem 1's construction puts the ``K*K`` heads of a layer one to one on the shifts of a ``K x K`` kernel. A trained
layer's centres ``mu_h`` (Sec. 4.2's ``Delta^(h)``) are compared with the offsets ``d * {-1, 0, 1}^2`` of a 3x3
kernel of dilation ``d``: :func:`kernel_match` matches heads and offsets one to one at the smallest total distance
(an exact assignment, :func:`min_cost_assignment`) and reports the mean matched Euclidean distance in grid units
(tokens; one token is 2 image pixels), per dilation and at the best one. :func:`layer_kernel_matches` does it for
every layer of a Gaussian model.

A layer with fewer heads than the kernel's 9 offsets (a pruned layer) is matched into a subset of the offsets: each
head gets its own offset, and the mean is over its heads. A layer with more heads than 9 gives each offset its own
head: the 9 heads of the best matching are the kernel, the others are left out (as Theorem 1 needs only ``K*K``
heads), and the mean is over the 9 offsets.
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..layers.scores import kernel_offsets
from .analysis import GAUSSIAN_KINDS, attention_layers, head_centers

__all__ = ['KERNEL_DILATIONS', 'KERNEL_TAPS', 'KernelMatch', 'min_cost_assignment', 'dilated_kernel_offsets',
           'kernel_match', 'layer_kernel_matches', 'KERNEL_MATCH_COLUMNS']

KERNEL_DILATIONS = (1, 2, 3)
KERNEL_TAPS = 9  # a 3x3 kernel's offsets
KERNEL_MATCH_COLUMNS = ('layer', 'heads', 'best_dilation', 'mean_distance') + tuple(
    f'distance_d{d}' for d in KERNEL_DILATIONS)


@dataclass(frozen=True)
class KernelMatch:
    """One layer against a 3x3 kernel: the ``dilation`` with the smallest ``mean_distance`` (the smaller dilation
    on a tie), the mean at every dilation tried (``distances``) and, at the best dilation, the offset matched to each
    head (``offsets``, ``(heads, 2)``; NaN for a head left out when the layer has more than 9)."""
    dilation: int
    mean_distance: float
    distances: Dict[int, float]
    offsets: Tensor


def min_cost_assignment(cost: Tensor) -> Tensor:
    """The exact minimum-cost one-to-one assignment of the ``n`` rows of ``cost`` ``(n, m)``, ``n <= m``, to distinct
    columns: the Hungarian algorithm with potentials and shortest augmenting paths, ``O(n^2 m)``. Returns the column
    of each row, ``(n,)`` int64 (the same optimum as ``scipy.optimize.linear_sum_assignment``)."""
    n, m = cost.shape
    if n > m:
        raise ValueError(f'cost has more rows ({n}) than columns ({m}); pass its transpose')
    if not bool(torch.isfinite(cost).all()):
        raise ValueError('cost holds a NaN or infinite entry; the assignment needs finite costs')
    c = cost.detach().double().cpu().tolist()
    # 1-based rows and columns; column 0 is the augmenting path's virtual start, p[j] the row on column j (0: none)
    u, v, p, way = [0.0] * (n + 1), [0.0] * (m + 1), [0] * (m + 1), [0] * (m + 1)
    for row in range(1, n + 1):
        p[0], j0 = row, 0
        min_reduced, used = [math.inf] * (m + 1), [False] * (m + 1)
        while p[j0] != 0:
            used[j0] = True
            i0, delta, j1 = p[j0], math.inf, 0
            for j in range(1, m + 1):
                if not used[j]:
                    reduced = c[i0 - 1][j - 1] - u[i0] - v[j]
                    if reduced < min_reduced[j]:
                        min_reduced[j], way[j] = reduced, j0
                    if min_reduced[j] < delta:
                        delta, j1 = min_reduced[j], j
            for j in range(m + 1):
                if used[j]:
                    u[p[j]] += delta
                    v[j] -= delta
                else:
                    min_reduced[j] -= delta
            j0 = j1
        while j0:  # flip the augmenting path
            p[j0] = p[way[j0]]
            j0 = way[j0]
    columns = [0] * n
    for j in range(1, m + 1):
        if p[j]:
            columns[p[j] - 1] = j - 1
    return torch.tensor(columns, dtype=torch.int64)


def dilated_kernel_offsets(dilation: int) -> Tensor:
    """The offsets ``dilation * {-1, 0, 1}^2`` of a 3x3 kernel, ``(9, 2)`` (row, col) float64, in Theorem 1's
    order (the heads' order of ``pos_init='conv'``)."""
    return dilation * kernel_offsets(KERNEL_TAPS)


def _matched_offsets(centers: Tensor, offsets: Tensor) -> Tensor:
    """The offset matched to each centre, ``(heads, 2)``, NaN for a centre left out (more centres than offsets)."""
    distance = torch.cdist(centers, offsets)
    matched = torch.full_like(centers, math.nan)
    if len(centers) <= len(offsets):
        matched[:] = offsets[min_cost_assignment(distance)]
    else:
        matched[min_cost_assignment(distance.T)] = offsets
    return matched


def kernel_match(centers: Tensor, dilations: Sequence[int] = KERNEL_DILATIONS) -> KernelMatch:
    """One layer's centres ``(heads, 2)`` (grid units) against a 3x3 kernel of each dilation (module docstring)."""
    if isinstance(centers, (list, tuple)) and centers and torch.is_tensor(centers[0]):
        if len({tuple(c.shape) for c in centers}) > 1 or centers[0].ndim != 1:  # head_centers' layers, say
            raise UserError(f'centres must be (heads, 2): pass one layer\'s (head_centers(...)[i]), got a list of '
                            f'{len(centers)} tensors of shapes {sorted({tuple(c.shape) for c in centers})}')
        centers = torch.stack(list(centers))
    centers = torch.as_tensor(centers).detach().double().cpu()  # a list or an array of centres too
    if centers.ndim != 2 or centers.shape[1] != 2 or len(centers) == 0:
        raise UserError(f'centres must be (heads, 2) with at least one head, got {tuple(centers.shape)}')
    if not dilations:
        raise UserError('give at least one dilation')
    if not torch.isfinite(centers).all():
        raise UserError(f'centres hold a NaN or infinite value ({int((~torch.isfinite(centers)).any(-1).sum())} of '
                        f'{len(centers)} heads): the weights diverged or are damaged; match an earlier checkpoint')
    matches, distances = {}, {}
    for dilation in dilations:
        matched = _matched_offsets(centers, dilated_kernel_offsets(dilation))
        kept = ~matched[:, 0].isnan()
        matches[dilation] = matched
        distances[dilation] = float((centers[kept] - matched[kept]).norm(dim=-1).mean())
    best = min(dilations, key=lambda d: (distances[d], d))
    return KernelMatch(best, distances[best], distances, matches[best])


def layer_kernel_matches(model: nn.Module, dilations: Sequence[int] = KERNEL_DILATIONS) -> List[Dict[str, Any]]:
    """Per layer of a Gaussian model (``layer`` counted from 1, as the paper's figures count them: ``blocks[layer -
    1]``), its heads, best dilation, mean distance there and at every dilation: the columns
    :data:`KERNEL_MATCH_COLUMNS` (for ``dilations`` = the default)."""
    kind = attention_layers(model)[0].kind
    if kind not in GAUSSIAN_KINDS:
        raise UserError(f'the kernel match needs Gaussian centres ({", ".join(GAUSSIAN_KINDS)} kinds); this model '
                        f'is {kind!r}')
    rows = []
    for layer, centers in enumerate(head_centers(model)):
        match = kernel_match(centers, dilations)
        rows.append({'layer': layer + 1, 'heads': len(centers), 'best_dilation': match.dilation,
                     'mean_distance': match.mean_distance,
                     **{f'distance_d{d}': match.distances[d] for d in dilations}})
    return rows
