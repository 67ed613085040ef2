"""Float32 tolerances that follow from the size of the reductions, for comparisons against a float64 reference.

A float32 sum of ``n`` terms, in any order and with any blocking, is within ``gamma_n * sum|terms|`` of the exact
sum (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Sec. 3.1); for rounding errors that
behave randomly the error grows like ``sqrt(n) * u`` instead of ``n * u`` (Higham & Mary, SIAM J. Sci. Comput.
41(5), 2019), with ``u = 2**-24`` the unit roundoff of float32. Nested reductions add their lengths. The bound
used here is ``SAFETY * sqrt(n) * u * scale``, where ``scale`` stands for ``max|term|``: the largest magnitude of
the reference tensor, or for gradients the largest reference gradient of the same computation (a gradient that
cancels to zero, like a key bias's under a softmax, still sums terms of that size).

``SAFETY`` covers the few extra roundings per term (exp, a product, a division) and the difference between
the typical and the largest error over many elements. Measured on an AMD EPYC (Zen 5) the attention layers'
float32 paths reach at most 0.7 of ``sqrt(n) * u * scale`` for outputs and 0.05 for gradients, so 4 leaves
a margin of more than 5x for another CPU's summation order, while a wrong formula misses by orders of
magnitude. The reference must be float64: a float32 reference carries an error as large as the code under
test, and the comparison then measures the reference.
"""
import math
from typing import List, Optional, Sequence

import torch

FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24
SAFETY = 4.0


def float32_atol(reduction_length: int, scale: float) -> float:
    """The largest error allowed for a float32 result of ``reduction_length`` summed terms of size ``scale``."""
    return SAFETY * math.sqrt(reduction_length) * FLOAT32_UNIT_ROUNDOFF * float(scale)


def assert_float32_close(actual: torch.Tensor, reference: torch.Tensor, reduction_length: int,
                         scale: Optional[float] = None, msg: str = '') -> None:
    """``actual`` (float32) within the float32 bound of ``reference`` (float64)."""
    assert reference.dtype == torch.float64, 'compare float32 against a float64 reference'
    scale = reference.abs().max().item() if scale is None else scale
    atol = float32_atol(reduction_length, scale)
    torch.testing.assert_close(actual.double(), reference, rtol=0, atol=atol,
                               msg=lambda m: f'{msg} (float32 bound: n={reduction_length}, scale={scale:.3g})\n{m}')


def assert_float32_gradients_close(grads: Sequence[torch.Tensor], reference_grads: Sequence[torch.Tensor],
                                   reduction_length: int) -> None:
    """Gradients of one computation, each within the float32 bound at the scale of the largest reference gradient."""
    scale = max(g.abs().max().item() for g in reference_grads)
    for i, (g, rg) in enumerate(zip(grads, reference_grads)):
        assert_float32_close(g, rg, reduction_length, scale, msg=f'gradient {i}')


def sa_model_reduction_lengths(model: torch.nn.Module, tokens: int) -> List[int]:
    """The reductions along one path through a sa_vision attention model, in order: per block the attention
    over ``tokens`` keys (plus the head dimension for content scores), the Value over the concatenated heads,
    the output projection, the first LayerNorm, the two MLP layers and the second LayerNorm; then the pooled
    classifier."""
    lengths = []
    for block in model.blocks:
        dim, heads = block.attn.dim, block.attn.num_heads
        lengths += [tokens + dim, heads * dim, dim, dim, dim, block.mlp.fc1.out_features, dim]
    return lengths + [tokens + model.num_features]


def network_float32_atol(reduction_lengths: Sequence[int], scale: float) -> float:
    """A network's float32 error: to first order the errors of its successive reductions add up."""
    return sum(float32_atol(n, scale) for n in reduction_lengths)


def assert_network_float32_close(actual: torch.Tensor, reference: torch.Tensor, reduction_lengths: Sequence[int],
                                 msg: str = '') -> None:
    """A float32 network output within the sum of its reductions' float32 bounds of a float64 reference.

    Measured on small sa_vision models the outputs reach 0.03 of the sum of ``sqrt(n) * u * scale`` and the
    gradients (whose chain is the forward one twice plus the sum over the batch's tokens) 0.07."""
    assert reference.dtype == torch.float64, 'compare float32 against a float64 reference'
    atol = network_float32_atol(reduction_lengths, reference.abs().max().item())
    torch.testing.assert_close(actual.double(), reference, rtol=0, atol=atol,
                               msg=lambda m: f'{msg} (float32 bound over {len(reduction_lengths)} reductions)\n{m}')


def sa_model_gradient_reduction_lengths(model: torch.nn.Module, tokens: int, batch: int) -> List[int]:
    """Backward runs the forward chain in reverse, and each weight's gradient then sums over the batch's tokens."""
    forward = sa_model_reduction_lengths(model, tokens)
    return forward + forward + [batch * tokens]


def assert_network_gradients_close(model: torch.nn.Module, reference_model: torch.nn.Module,
                                   reduction_lengths: Sequence[int]) -> None:
    """Every ``.grad`` of a float32 model within the network bound of its float64 copy's, at the scale of the
    largest reference gradient."""
    scale = max(p.grad.abs().max().item() for p in reference_model.parameters())
    atol = network_float32_atol(reduction_lengths, scale)
    for (name, p), q in zip(model.named_parameters(), reference_model.parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=0, atol=atol, msg=lambda m, name=name: f'{name}: {m}')
