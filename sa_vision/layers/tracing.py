""" Graph capture: the layers' plain tensor path for exporters and tracers

The eager layers are written for speed: hand-written autograd Functions, products that write into
reused buffers (``out=``) and, on the CPU, a batch split into chunks whose count Python computes from the
batch size. None of that survives graph capture:

* ``torch.export`` (and the default ``torch.onnx.export``, which is built on it) specialises the graph on
  every Python int it computes from a shape, so a chunk count fixes the batch size;
* the TorchScript tracer (``torch.jit.trace``, ``torch.onnx.export(..., dynamo=False)``) records products
  written into views of a buffer (``out=``) without the write reaching the buffer: the buffer, which the
  exporter then folds into a constant holding the example's values, becomes the result. The graph
  silently returns the example input's attention output for every input.

While a graph is being captured (:func:`is_capturing`), every layer therefore takes a plain path: whole-batch
matrix products, out-of-place, no autograd Function and no cache. It computes the same function as the
eager path (to float rounding). For the attention layers that plain path is the batched-heads path (see
:func:`sa_vision.layers.attention.use_batched_heads`). Imports only torch.
"""
import torch

__all__ = ['is_capturing', 'refuse_capture']


def is_capturing() -> bool:
    """True while ``torch.export`` / dynamo ONNX export, the TorchScript tracer or ``torch.onnx`` is running."""
    return bool(torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())


def refuse_capture(what: str) -> None:
    """Raise instead of letting a tracer or exporter record ``what`` (an eager-only kernel) into a wrong graph."""
    if is_capturing():
        raise RuntimeError(
            f'{what} is an eager-only kernel and cannot be captured into a graph: the TorchScript tracer loses '
            f'its products written with out= into reused buffers and folds the result into a constant of the '
            f'example\'s values (the graph would differ from the model), and torch.export would fix the batch '
            f'size it splits the batch by. This is a bug in sa_vision: while a graph is captured the layers '
            f'must take their plain path (sa_vision.layers.tracing.is_capturing).')
