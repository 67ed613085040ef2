""" Positional attention scores of Cordonnier, Loukas & Jaggi (ICLR 2020, Sec. 2.3; Sec. 3, Eq. 9; App. A.1)

Scores are ``[head, query, key]`` of the shift ``delta = key - query`` (grid units); a Gaussian head's
``precision_factors`` hold a factor of its precision (``s_h`` with ``alpha_h = s_h^2 / 2``, or ``S_h`` with
``M_h = S_h S_h^T``): larger is narrower. """
import math
from typing import Tuple

import torch
from torch import Tensor, nn

__all__ = [
    'QuadraticScores', 'GeneralizedScores', 'LearnedScores', 'ContentScores', 'relative_shifts',
    'POSITION_INITS', 'CONV_INIT_ALPHA', 'kernel_offsets', 'check_position_init',
]

POSITION_INITS = ('paper', 'conv')
# Lemma 2 takes alpha -> infinity; 6 is the smallest integer alpha that puts >= 99 % of a head's mass on its grid
# shift (1 / (1 + 2 e^-6)^2 = 0.990)
CONV_INIT_ALPHA = 6.0


def kernel_offsets(num_heads: int) -> Tensor:
    """The shifts of Theorem 1's kernel, ``(K*K, 2)`` as (row, col), ``K = floor(sqrt(num_heads))``; heads after the
    first ``K*K`` keep the paper's init, as in ConViT's ``local_init``."""
    k = math.isqrt(num_heads)
    steps = torch.arange(k, dtype=torch.float64) - k // 2
    return torch.stack(torch.meshgrid(steps, steps, indexing='ij'), dim=-1).reshape(k * k, 2)


def check_position_init(init: str, alpha: float) -> None:
    """Raise a ValueError naming the choices unless ``init`` is one of :data:`POSITION_INITS` and ``alpha > 0``."""
    if init not in POSITION_INITS:
        raise ValueError(f'pos_init {init!r} is not one of {POSITION_INITS}')
    if not alpha > 0:
        raise ValueError(f'pos_init_alpha must be > 0 (the sharpness of the conv init), got {alpha}')


def _exact(param: Tensor) -> Tensor:
    """``param`` in float32 where it is a 16-bit float (a model cast with ``.half()``): a far shift's squared
    distance times a trained precision overflows float16 (the generalized form's inf - inf is NaN) and loses whole
    units in bfloat16, as under autocast, which the attention turns off for the scores (docs/attention.md); their
    softmax runs in float32 too, and the probabilities are rounded to :meth:`param_dtype`."""
    if param.dtype == torch.float16 or param.dtype == torch.bfloat16:
        return param.float()
    return param


def relative_shifts(size: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``shifts[q, k] = k - q`` along one axis of ``size`` positions, ``(size, size)``."""
    positions = torch.arange(size, device=device, dtype=dtype)
    return positions - positions[:, None]  # (size,) broadcasts as the key index


def _on_grid(row: Tensor, col: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-axis terms ``(heads, h, h)`` and ``(heads, w, w)`` as views that broadcast to ``(heads, h, w, h, w)``,
    ``[head, query row, query col, key row, key col]``: their sum, reshaped, is the grid's ``[head, query, key]``."""
    return row[:, :, None, :, None], col[:, None, :, None, :]


class QuadraticScores(nn.Module):
    """Isotropic Gaussian scores (Eq. 9), ``A_h(delta) = -(s_h^2 / 2) ||delta - mu_h||^2``: the paper's
    ``alpha_h = s_h^2 / 2``, ``Delta_h = mu_h`` (``centers``). Separable. ``init='conv'``: kernel shifts, ``alpha``."""
    separable: bool = True

    def __init__(self, num_heads: int, init: str = 'paper', init_alpha: float = CONV_INIT_ALPHA,
                 device=None, dtype=None):
        """
        Args:
            num_heads: Heads N_h, each with a centre Delta_h (row, column; grid cells) and a precision factor s_h,
                Eq. 9's alpha_h = s_h^2 / 2.
            init: 'paper': centres with standard deviation 2 per coordinate, s_h = 1 + N(0, 0.01^2): the authors'
                released values (gaussian_init_mu_std = 2, gaussian_init_sigma_std = 0.01); Sec. 4.2 writes the
                centres' law N(0, 2 I_2) (standard deviation sqrt(2) if read literally) and gives none for s_h;
                'conv': the first K*K heads, K = floor(sqrt(N_h)), centred on the shifts of Theorem 1's K x K
                kernel with alpha_h = ``init_alpha``, the others as 'paper'.
            init_alpha: 'conv' only: the kernel heads' alpha_h (> 0).
        """
        super().__init__()
        check_position_init(init, init_alpha)
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.init, self.init_alpha = init, init_alpha
        self.centers = nn.Parameter(torch.empty(num_heads, 2, **dd))
        self.precision_factors = nn.Parameter(torch.empty(num_heads, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.centers, std=2.0)
        nn.init.normal_(self.precision_factors, mean=1.0, std=0.01)
        if self.init == 'conv':
            with torch.no_grad():
                offsets = kernel_offsets(self.num_heads)
                self.centers[:len(offsets)] = offsets.to(self.centers)
                self.precision_factors[:len(offsets)] = math.sqrt(2.0 * self.init_alpha)  # alpha_h = s_h^2 / 2

    def param_dtype(self) -> torch.dtype:
        """The parameters' dtype, which the probabilities take (the scores are float32 for 16-bit ones)."""
        return self.centers.dtype

    def axis_scores(self, grid_h: int, grid_w: int) -> Tuple[Tensor, Tensor]:
        """Row scores ``(heads, h, h)`` and column scores ``(heads, w, w)``, indexed ``[head, query, key]``."""
        centers, factors = _exact(self.centers), _exact(self.precision_factors)
        scale = -0.5 * factors.square()[:, None, None]  # -alpha_h from the precision factor s_h
        dy = relative_shifts(grid_h, centers.device, centers.dtype)
        dx = relative_shifts(grid_w, centers.device, centers.dtype)
        row = scale * (dy - centers[:, 0, None, None]).square()
        col = scale * (dx - centers[:, 1, None, None]).square()
        return row, col

    def square_axis_scores(self, size: int) -> Tensor:
        """Row and column scores of a ``size x size`` grid stacked, ``(2, heads, size, size)`` (half the small ops)."""
        centers, factors = _exact(self.centers), _exact(self.precision_factors)
        shifts = relative_shifts(size, centers.device, centers.dtype)  # size, size
        offsets = shifts - centers.t().reshape(2, self.num_heads, 1, 1)  # 2, heads, size, size
        return offsets.square() * factors.square().mul(-0.5).view(self.num_heads, 1, 1)

    def grid_scores(self, grid_h: int, grid_w: int) -> Tensor:
        """Scores over the whole grid, ``(heads, h*w, h*w)`` indexed ``[head, query, key]``."""
        row, col = _on_grid(*self.axis_scores(grid_h, grid_w))
        return (row + col).reshape(self.num_heads, grid_h * grid_w, grid_h * grid_w)


class GeneralizedScores(nn.Module):
    """Non-isotropic Gaussian scores (App. A.1), ``A_h(delta) = -1/2 (delta - mu_h)^T M_h (delta - mu_h)``,
    ``M_h = S_h S_h^T`` (``precision_factors`` holds ``S_h``); the cross term makes it non-separable."""
    separable: bool = False

    def __init__(self, num_heads: int, init: str = 'paper', init_alpha: float = CONV_INIT_ALPHA,
                 device=None, dtype=None):
        """
        Args:
            num_heads: Heads N_h, each with a centre Delta_h (row, column; grid cells) and a 2 x 2 factor S_h of
                its precision M_h = S_h S_h^T (App. A.1's Sigma^-1/2, Eq. 16).
            init: 'paper': centres with standard deviation 2 per coordinate, S_h = I + N(0, 0.01^2) entrywise: the
                authors' released values (gaussian_init_mu_std = 2, gaussian_init_sigma_std = 0.01); App. A.1 writes
                Delta ~ N(0, 2 I_2) and Sigma^1/2 = I_2 + N(0, 0.01 I_2), standard deviations sqrt(2) and 0.1 if
                read literally;
                'conv': the first K*K heads, K = floor(sqrt(N_h)), centred on the shifts of Theorem 1's K x K
                kernel with M_h = 2 ``init_alpha`` I (Eq. 9's alpha_h = ``init_alpha``), the others as 'paper'.
            init_alpha: 'conv' only: the kernel heads' alpha_h (> 0).
        """
        super().__init__()
        check_position_init(init, init_alpha)
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.init, self.init_alpha = init, init_alpha
        self.centers = nn.Parameter(torch.empty(num_heads, 2, **dd))
        self.precision_factors = nn.Parameter(torch.empty(num_heads, 2, 2, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.centers, std=2.0)
        with torch.no_grad():
            eye = torch.eye(2, device=self.precision_factors.device, dtype=self.precision_factors.dtype)
            nn.init.normal_(self.precision_factors, std=0.01)
            self.precision_factors.add_(eye)
            if self.init == 'conv':
                offsets = kernel_offsets(self.num_heads)
                self.centers[:len(offsets)] = offsets.to(self.centers)
                self.precision_factors[:len(offsets)] = math.sqrt(2.0 * self.init_alpha) * eye

    def param_dtype(self) -> torch.dtype:
        """The parameters' dtype, which the probabilities take (the scores are float32 for 16-bit ones)."""
        return self.centers.dtype

    def precisions(self) -> Tensor:
        """The precision matrices ``M_h = S_h S_h^T``, ``(heads, 2, 2)``."""
        return self.precision_factors @ self.precision_factors.transpose(-1, -2)

    def axis_scores(self, grid_h: int, grid_w: int) -> Tuple[Tensor, Tensor]:
        raise RuntimeError('generalized (non-isotropic) Gaussian scores are not separable')

    def square_axis_scores(self, size: int) -> Tensor:
        raise RuntimeError('generalized (non-isotropic) Gaussian scores are not separable')

    def grid_scores(self, grid_h: int, grid_w: int) -> Tensor:
        centers, factors = _exact(self.centers), _exact(self.precision_factors)
        precisions = factors @ factors.transpose(-1, -2)
        dy = relative_shifts(grid_h, centers.device, centers.dtype) - centers[:, 0, None, None]  # heads, h, h
        dx = relative_shifts(grid_w, centers.device, centers.dtype) - centers[:, 1, None, None]  # heads, w, w
        # -1/2 offset^T M offset for the symmetric 2x2 M: only the cross term -m_yx dy dx needs the whole grid, so
        # it is built once and the per-axis terms are added in place, one grid-sized tensor instead of five
        row_cross, col_cross = _on_grid(-precisions[:, 0, 1, None, None] * dy, dx)
        row, col = _on_grid(-0.5 * precisions[:, 0, 0, None, None] * dy.square(),
                            -0.5 * precisions[:, 1, 1, None, None] * dx.square())
        scores = (row_cross * col_cross).add_(row).add_(col)
        return scores.reshape(self.num_heads, grid_h * grid_w, grid_h * grid_w)


class LearnedScores(nn.Module):
    """Learned relative-position scores without content (Sec. 4.3), ``A_h(delta) = k_v(E_v[delta_row])_h +
    k_u(E_u[delta_col])_h``, shifts clipped at ``max_shift``. ``init='conv'``: a least-norm correction of the
    tables gives each kernel head ``-alpha min((d - mu_h)^2, 4)`` per axis (capped so it still trains)."""
    separable: bool = True

    def __init__(self, dim: int, num_heads: int, max_shift: int = 15, init: str = 'paper',
                 init_alpha: float = CONV_INIT_ALPHA, device=None, dtype=None):
        """
        Args:
            dim: Width of each axis's shift embedding: the row and column parts of Sec. 4.3's r_delta, each ``dim``
                wide and each layer's own (the text reads floor(D_p/2)-wide and shared, Sec. 2.3; these give the
                paper's 12.3 M parameters, docs/models.md).
            num_heads: Heads N_h: a key map per axis turns an embedding into one score per head.
            max_shift: The largest shift per axis, in grid cells, with its own embedding; longer shifts share the
                last one (each table has ``2 * max_shift + 1`` rows).
            init: 'paper': PyTorch's default initialisation of the tables and key maps; 'conv': then a least-norm
                correction of the tables gives the first K*K heads, K = floor(sqrt(N_h)), the scores
                ``-init_alpha min((d - Delta_h)^2, 4)`` per axis around Theorem 1's kernel shifts Delta_h (needs
                ``dim >= num_heads``).
            init_alpha: 'conv' only: the kernel heads' sharpness (> 0).
        """
        super().__init__()
        check_position_init(init, init_alpha)
        if init == 'conv' and dim < num_heads:
            raise ValueError(f'the conv init of the learned kind needs dim >= num_heads (a key map of full rank), '
                             f'got dim={dim}, num_heads={num_heads}; use pos_init=\'paper\' or a wider model')
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.max_shift = max_shift
        self.init, self.init_alpha = init, init_alpha
        self.row_shift_embed = nn.Embedding(2 * max_shift + 1, dim, **dd)
        self.col_shift_embed = nn.Embedding(2 * max_shift + 1, dim, **dd)
        self.row_keys = nn.Linear(dim, num_heads, bias=False, **dd)
        self.col_keys = nn.Linear(dim, num_heads, bias=False, **dd)
        if init == 'conv':
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Redraw the tables and keys (PyTorch's defaults) and, for ``init='conv'``, set the kernel's scores."""
        for module in (self.row_shift_embed, self.col_shift_embed, self.row_keys, self.col_keys):
            module.reset_parameters()
        if self.init != 'conv':
            return
        offsets = kernel_offsets(self.num_heads)
        shifts = torch.arange(-self.max_shift, self.max_shift + 1, dtype=torch.float64)  # table row d: shift d
        with torch.no_grad():
            for axis, (table, keys) in enumerate(((self.row_shift_embed, self.row_keys),
                                                  (self.col_shift_embed, self.col_keys))):
                # target[d, h]: the wanted term of head h at shift d; random (unchanged) for heads off the kernel
                weights = keys.weight.double()  # heads, dim
                current = table.weight.double() @ weights.t()  # shifts, heads
                target = current.clone()
                target[:, :len(offsets)] = -self.init_alpha * (
                    shifts[:, None] - offsets[None, :, axis]).square().clamp(max=4.0)
                # least-norm change of the table rows: E += (target - E W^T) (W W^T)^-1 W
                correction = torch.linalg.solve(weights @ weights.t(), (target - current).t()).t() @ weights
                table.weight.add_(correction.to(table.weight))

    def param_dtype(self) -> torch.dtype:
        """The parameters' dtype, the scores' and the probabilities'."""
        # the table's, not its Linear's: torch's dynamic quantization swaps a Linear whose .weight is then a method
        return self.row_shift_embed.weight.dtype

    def _table_index(self, size: int) -> Tensor:
        shifts = relative_shifts(size, self.row_shift_embed.weight.device, torch.float32).long()
        return shifts.clamp(-self.max_shift, self.max_shift) + self.max_shift

    def axis_scores(self, grid_h: int, grid_w: int) -> Tuple[Tensor, Tensor]:
        row = self.row_keys(self.row_shift_embed(self._table_index(grid_h)))  # h, h, heads
        col = self.col_keys(self.col_shift_embed(self._table_index(grid_w)))  # w, w, heads
        return row.permute(2, 0, 1), col.permute(2, 0, 1)

    def square_axis_scores(self, size: int) -> Tensor:
        """Row and column scores of a ``size x size`` grid in one tensor, ``(2, heads, size, size)``."""
        return torch.stack(self.axis_scores(size, size))

    def grid_scores(self, grid_h: int, grid_w: int) -> Tensor:
        row, col = _on_grid(*self.axis_scores(grid_h, grid_w))
        return (row + col).reshape(self.num_heads, grid_h * grid_w, grid_h * grid_w)


class ContentScores(nn.Module):
    """Query/key content scores ``q_h . k_h / sqrt(D)`` with ``q = X W_q + b``, ``k = X W_k + b``."""

    def __init__(self, dim: int, num_heads: int, device=None, dtype=None):
        """
        Args:
            dim: Token width D, also the width of each head's queries and keys.
            num_heads: Heads N_h; the query and key maps are ``Linear(D, N_h * D)``.
        """
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.query = nn.Linear(dim, num_heads * dim, **dd)
        self.key = nn.Linear(dim, num_heads * dim, **dd)

    def forward(self, tokens: Tensor) -> Tuple[Tensor, Tensor]:
        """Queries and keys ``(B, heads, N, D)`` for tokens ``(B, N, D)``."""
        B, N, D = tokens.shape
        q = self.query(tokens).view(B, N, self.num_heads, D).transpose(1, 2)
        k = self.key(tokens).view(B, N, self.num_heads, D).transpose(1, 2)
        return q, k

