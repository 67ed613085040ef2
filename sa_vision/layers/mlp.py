""" The post-norm layers' MLP: Linear -> exact GELU -> Linear -> Dropout, with timm ``Mlp``'s names; training
saves only the hidden pre-activation and recomputes the GELU in backward (one hidden-sized tensor less per layer) """
import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .autocast import autocast_inputs
from .tracing import is_capturing, refuse_capture

__all__ = ['GeluMlp']


class _GeluLinear(torch.autograd.Function):
    """``F.linear(gelu(hidden), weight, bias)`` saving ``hidden`` only."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        refuse_capture('the MLP\'s autograd Function')
        ctx.save_for_backward(hidden, weight)
        return F.linear(F.gelu(hidden), weight, bias)

    @staticmethod
    @once_differentiable  # its hand-made backward would miss terms of a second derivative: that raises
    def backward(ctx, grad_out: Tensor):
        hidden, weight = ctx.saved_tensors
        grad_hidden = grad_weight = grad_bias = None
        with torch.enable_grad():
            hidden_in = hidden.detach().requires_grad_(ctx.needs_input_grad[0])
            activation = F.gelu(hidden_in)
        grad_2d = grad_out.reshape(-1, grad_out.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_weight = grad_2d.t() @ activation.detach().reshape(-1, activation.shape[-1])
        if ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0)
        if ctx.needs_input_grad[0]:
            grad_hidden, = torch.autograd.grad(activation, hidden_in, grad_out @ weight)
        return grad_hidden, grad_weight, grad_bias


class GeluMlp(Mlp):
    """timm's ``Mlp`` as the original post-norm layers have it: ``Dropout(fc2(GELU(fc1(x))))``, exact (erf) GELU,
    dropout only after ``fc2``; training saves only the hidden pre-activation (see the module docstring)."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0., device=None, dtype=None):
        """
        Args:
            dim: Input and output width D.
            hidden_dim: Hidden width (the intermediate dimension, 512 in App. A.4).
            drop: Dropout probability after ``fc2`` (none after the GELU).
        """
        super().__init__(dim, hidden_dim, act_layer=nn.GELU, drop=(0., drop), device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.fc1(x)
        if not torch.jit.is_scripting() and self._saves_only_hidden():
            out = _GeluLinear.apply(*autocast_inputs(hidden, self.fc2.weight, self.fc2.bias))
        else:
            # one line whatever the grad mode: torch.jit.trace's check re-runs the model under another grad mode
            # and compares the graphs' source lines
            out = self.fc2(F.gelu(hidden))
        return self.drop2(out)

    @torch.jit.unused
    def _saves_only_hidden(self) -> bool:
        # export / tracing / torch.compile take no autograd Function (a compiled backward cannot trace the
        # torch.autograd.grad call in _GeluLinear.backward; inductor decides what to save by itself)
        return torch.is_grad_enabled() and not (is_capturing() or torch.compiler.is_compiling())
