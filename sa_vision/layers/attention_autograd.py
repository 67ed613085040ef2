""" Hand-written autograd Functions of attention + Value (paper Sec. 4.2-4.3 scores, factorised over rows and
columns), eager-only (:mod:`sa_vision.layers.tracing`)

The per-head path's (float32 / float64 eager on the CPU): mix one head at a time and add its share of Value at once,
in cache-sized batch chunks, recomputing the heads in backward. The batched path's :func:`separable_mixing`: every
head's separable mixing, recomputing the row-mixed heads in backward. """
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .tracing import refuse_capture

__all__ = ['CPU_TOKENS_PER_CHUNK', 'separable_mixing']


def _project_heads(heads: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``bias + sum_n heads[n] @ weight[:, n*D:(n+1)*D]^T`` for ``heads`` of shape (heads, tokens, D)."""
    num_heads, _, D = heads.shape
    out = torch.mm(heads[0], weight[:, :D].t())
    for n in range(1, num_heads):
        # the out= form accumulates in place and, unlike addmm_, is seen by FLOP counters
        torch.addmm(out, heads[n], weight[:, n * D:(n + 1) * D].t(), out=out)
    if bias is not None:
        out.add_(bias)
    return out


def _project_heads_backward(heads: Tensor, weight: Tensor, grad_out: Tensor, needs: Tuple[bool, bool, bool]):
    """Gradients of :func:`_project_heads`, every head's block written straight into place (autograd's own
    backward of per-head slices would zero-fill and add full-size buffers once per head)."""
    num_heads, _, D = heads.shape
    grad_heads = grad_weight = grad_bias = None
    if needs[0]:
        grad_heads = heads.new_empty(heads.shape)
        for n in range(num_heads):
            torch.mm(grad_out, weight[:, n * D:(n + 1) * D], out=grad_heads[n])
    if needs[1]:
        # row blocks of the transposed gradient are contiguous: fill them in place
        grad_weight_t = weight.new_empty(weight.shape[1], weight.shape[0])
        for n in range(num_heads):
            torch.mm(heads[n].t(), grad_out, out=grad_weight_t[n * D:(n + 1) * D])
        grad_weight = grad_weight_t.t()
    if needs[2]:
        grad_bias = grad_out.sum(0)
    return grad_heads, grad_weight, grad_bias


class _HeadsLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, heads: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        refuse_capture('HeadsLinear\'s autograd Function')
        ctx.save_for_backward(heads, weight)
        ctx.has_bias = bias is not None
        return _project_heads(heads, weight, bias)

    @staticmethod
    @once_differentiable  # its hand-made backward would miss terms of a second derivative: that raises
    def backward(ctx, grad_out: Tensor):
        heads, weight = ctx.saved_tensors
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        return _project_heads_backward(heads, weight, grad_out, needs)


# tokens per chunk of _AttendThenProject on the CPU: one head's chunk (1024 x 400 float32 = 1.6 MB) and its
# intermediates stay in the core's L2 cache; whole-batch intermediates went to DRAM
CPU_TOKENS_PER_CHUNK = 1024


def _samples_per_chunk(x: Tensor) -> int:
    """Batch samples per chunk for grid-major ``x`` (``h x w x B x D``): the whole batch off the CPU, where an
    extra chunk is another round of kernel launches."""
    H, W, B = x.shape[0], x.shape[1], x.shape[2]
    if x.device.type != 'cpu':
        return B
    return max(1, min(B, CPU_TOKENS_PER_CHUNK // (H * W)))


class _HeadMixer:
    """Applies one head's content-free probabilities to a chunk ``h x w x b x D`` into reused buffers."""

    def __init__(self, probs: Sequence[Tensor], x: Tensor, max_samples: int):
        H, W, _, D = x.shape
        self.probs = probs
        self.separable = len(probs) == 2
        size = H * W * max_samples * D
        self.row_buffer = x.new_empty(size) if self.separable else None
        self.head_buffer = x.new_empty(size)

    def __call__(self, chunk: Tensor, n: int) -> Tuple[Optional[Tensor], Tensor]:
        """``(row-mixed chunk (h, w*b*D) or None, head n (h*w*b, D))``; both live in the buffers."""
        H, W, b, D = chunk.shape
        size = chunk.numel()
        head = self.head_buffer[:size]
        if not self.separable:
            torch.mm(self.probs[0][n], chunk.view(H * W, b * D), out=head.view(H * W, b * D))
            return None, head.view(H * W * b, D)
        row = self.row_buffer[:size].view(H, W * b * D)
        torch.mm(self.probs[0][n], chunk.view(H, W * b * D), out=row)
        # columns: (h, w, w) @ (h, w, b*D), the head's (w, w) matrix shared by every row
        torch.bmm(self.probs[1][n].expand(H, W, W), row.view(H, W, b * D), out=head.view(H, W, b * D))
        return row, head.view(H * W * b, D)


def _batch_chunks(x: Tensor) -> List[Tuple[int, int]]:
    B, step = x.shape[2], _samples_per_chunk(x)
    # an empty batch is one empty chunk: its products give the empty output (and gradients) every module gives
    return [(start, min(start + step, B)) for start in range(0, B, step)] or [(0, 0)]


class _AttendThenProject(torch.autograd.Function):
    """``Value(apply_mixing(x, probs))`` one head at a time, keeping only ``x`` and the probabilities: backward
    recomputes each head (cheap) in cache-sized batch chunks, so no heads-sized tensor ever exists."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], *probs: Tensor) -> Tensor:
        refuse_capture('the attention + Value autograd Function')
        H, W, B, D = x.shape
        num_heads, out_features = probs[0].shape[0], weight.shape[0]
        chunks = _batch_chunks(x)
        mix = _HeadMixer(probs, x, chunks[0][1])
        out = x.new_empty(H, W, B, out_features)
        for start, end in chunks:
            chunk = x[:, :, start:end].contiguous()  # h, w, b, D
            out_chunk = out.view(H * W * B, out_features) if len(chunks) == 1 else \
                x.new_empty(H * W * (end - start), out_features)
            for n in range(num_heads):
                _, head = mix(chunk, n)
                # addmm(out=) accumulates in place and, unlike addmm_, is seen by FLOP counters
                torch.addmm(out_chunk, head, weight[:, n * D:(n + 1) * D].t(), beta=0. if n == 0 else 1.,
                            out=out_chunk)
            if bias is not None:
                out_chunk.add_(bias)
            if len(chunks) > 1:
                out[:, :, start:end] = out_chunk.view(H, W, end - start, out_features)
        ctx.save_for_backward(x, weight, *probs)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    @once_differentiable  # its hand-made backward would miss terms of a second derivative: that raises
    def backward(ctx, grad_out: Tensor):
        x, weight, *probs = ctx.saved_tensors
        H, W, B, D = x.shape
        num_heads, out_features = probs[0].shape[0], weight.shape[0]
        needs_x, needs_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        needs_probs = ctx.needs_input_grad[3:]
        separable = len(probs) == 2
        grad_x = x.new_empty(x.shape) if needs_x else None  # contiguous, whatever the layout of x
        # row blocks of the transposed weight gradient are contiguous: every head accumulates in place
        grad_weight_t = weight.new_zeros(weight.shape[1], out_features) if needs_weight else None
        grad_probs = [torch.zeros_like(p) if needed else None for p, needed in zip(probs, needs_probs)]
        needs_head_grad = needs_x or any(needs_probs)
        chunks = _batch_chunks(x)
        mix = _HeadMixer(probs, x, chunks[0][1])
        head_grad_buffer = x.new_empty(mix.head_buffer.shape)
        row_grad_buffer = x.new_empty(mix.head_buffer.shape) if separable else None
        for start, end in chunks:
            b = end - start
            chunk = x[:, :, start:end].contiguous()  # h, w, b, D
            grad_chunk = grad_out[:, :, start:end].reshape(H * W * b, out_features)
            grad_x_chunk = grad_x.view(H * W, B * D) if needs_x and len(chunks) == 1 else \
                (x.new_empty(H * W, b * D) if needs_x else None)
            for n in range(num_heads):
                row, head = mix(chunk, n)
                if grad_weight_t is not None:
                    block = grad_weight_t[n * D:(n + 1) * D]
                    torch.addmm(block, head.t(), grad_chunk, out=block)
                if not needs_head_grad:
                    continue
                head_grad = head_grad_buffer[:chunk.numel()].view(H * W * b, D)
                torch.mm(grad_chunk, weight[:, n * D:(n + 1) * D], out=head_grad)
                first = 0. if n == 0 else 1.
                if separable:
                    head_grad = head_grad.view(H, W, b * D)
                    row_probs, col_probs = probs
                    if needs_probs[1]:
                        # d/dcol[j, l] = sum over rows i of head_grad[i, j, :] . row[i, l, :]
                        grad_probs[1][n] += torch.bmm(head_grad, row.view(H, W, b * D).transpose(1, 2)).sum(0)
                    row_grad = row_grad_buffer[:chunk.numel()].view(H, W, b * D)
                    torch.bmm(col_probs[n].t().expand(H, W, W), head_grad, out=row_grad)
                    row_grad = row_grad.view(H, W * b * D)
                    if needs_probs[0]:
                        grad_probs[0][n] += torch.mm(row_grad, chunk.view(H, W * b * D).t())
                    if grad_x_chunk is not None:
                        rows = grad_x_chunk.view(H, -1)
                        torch.addmm(rows, row_probs[n].t(), row_grad, beta=first, out=rows)
                else:
                    head_grad = head_grad.view(H * W, b * D)
                    if needs_probs[0]:
                        grad_probs[0][n] += torch.mm(head_grad, chunk.view(H * W, b * D).t())
                    if grad_x_chunk is not None:
                        torch.addmm(grad_x_chunk, probs[0][n].t(), head_grad, beta=first, out=grad_x_chunk)
            if grad_x is not None and len(chunks) > 1:
                grad_x[:, :, start:end] = grad_x_chunk.view(H, W, b, D)
        grad_weight = grad_weight_t.t() if grad_weight_t is not None else None
        grad_bias = grad_out.reshape(-1, out_features).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return (grad_x, grad_weight, grad_bias, *grad_probs)



class _SeparableMixing(torch.autograd.Function):
    """Every head's separable mixing of grid-major ``x`` (``h x w x B x D -> heads x h x w x B x D``), the products
    of :func:`~sa_vision.layers.attention.apply_mixing`, keeping only ``x`` and the probabilities for backward:
    autograd would keep the heads-sized row-mixed heads on top of the concatenated heads Value keeps."""

    @staticmethod
    def forward(ctx, x: Tensor, row_probs: Tensor, col_probs: Tensor) -> Tensor:
        refuse_capture('the separable mixing\'s autograd Function')
        H, W, B, D = x.shape
        heads = row_probs.shape[0]
        tokens = x.reshape(H, W * B * D)
        all_rows = row_probs.reshape(heads * H, H)
        # each head's (W, W) column probabilities once per grid row, for one bmm: (heads*H, W, W)
        col_per_row = col_probs.repeat(1, H, 1).view(heads * H, W, W)
        # rows of every head, (heads*H, H) @ (H, W*B*D), then columns, (heads*H, W, W) @ (heads*H, W, B*D)
        rows = torch.mm(all_rows, tokens).view(heads * H, W, B * D)
        ctx.save_for_backward(tokens, all_rows, col_per_row)
        ctx.grid = (H, W, B, D)
        return torch.bmm(col_per_row, rows).view(heads, H, W, B, D)

    @staticmethod
    @once_differentiable  # its hand-made backward would miss terms of a second derivative: that raises
    def backward(ctx, grad_out: Tensor):
        tokens, all_rows, col_per_row = ctx.saved_tensors
        H, W, B, D = ctx.grid
        heads = all_rows.shape[0] // H
        grad_out = grad_out.reshape(heads * H, W, B * D)
        grad_x = grad_row = grad_col = None
        if ctx.needs_input_grad[2]:
            rows = torch.mm(all_rows, tokens).view(heads * H, W, B * D)  # recomputed
            # d/dcol[n, j, l] = sum over rows i of grad_out[n, i, j, :] . rows[n, i, l, :]
            grad_col = torch.bmm(grad_out, rows.transpose(1, 2)).view(heads, H, W, W).sum(1)
        grad_rows = torch.bmm(col_per_row.transpose(1, 2), grad_out).view(heads * H, W * B * D)
        if ctx.needs_input_grad[1]:
            grad_row = torch.mm(grad_rows, tokens.t()).view(heads, H, H)
        if ctx.needs_input_grad[0]:
            grad_x = torch.mm(all_rows.t(), grad_rows).view(H, W, B, D)
        return grad_x, grad_row, grad_col


def separable_mixing(x: Tensor, row_probs: Tensor, col_probs: Tensor) -> Tensor:
    """:class:`_SeparableMixing` (the heads ``heads x h x w x B x D``), for eager training on the batched path."""
    return _SeparableMixing.apply(x, row_probs, col_probs)
