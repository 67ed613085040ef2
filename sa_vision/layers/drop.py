""" Stochastic depth on the grid-major ``h x w x B x D`` tokens of the attention models """
from torch import Tensor, nn

__all__ = ['SampleDropPath']


class SampleDropPath(nn.Module):
    """Stochastic depth on the grid-major ``h x w x B x D``: timm's ``DropPath`` would draw per grid row."""

    def __init__(self, drop_prob: float = 0.):
        """
        Args:
            drop_prob: Probability that a sample skips the branch in training; the kept samples are scaled by
                ``1 / (1 - drop_prob)``.
        """
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        if self.drop_prob == 0. or not self.training:
            return x
        keep_prob = 1. - self.drop_prob
        keep = x.new_empty(1, 1, x.shape[2], 1).bernoulli_(keep_prob)  # the batch is dim 2 of h x w x B x D
        if keep_prob > 0.:  # as timm's drop_path: at rate 1 every sample is dropped, nothing is rescaled
            keep.div_(keep_prob)
        return x * keep
