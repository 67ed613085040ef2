""" Graph capture: the layers' plain tensor path for exporters and tracers

``torch.export`` specialises on Python ints from shapes (a chunk count fixes the batch size) and the TorchScript
tracer loses ``out=`` products into reused buffers, so while :func:`is_capturing` every layer takes a plain path.
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
