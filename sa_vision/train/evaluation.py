""" Evaluation: loss, top-1 and top-5 of a model over a loader, summed over processes under DDP

The running totals stay on the images' device (no host sync per batch) and are all-reduced there (NCCL needs CUDA).
The model may be a compiled one (the training loop evaluates through the module it trains, except on CUDA:
:func:`evaluation_module`).
"""
import json
import math
from contextlib import nullcontext
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..errors import TrainingDiverged
from .runtime import host_sync_allowed

__all__ = ['EVAL_METRICS', 'metric_text', 'result_json', 'evaluate', 'evaluate_compiled', 'evaluate_epoch',
           'evaluated_after', 'evaluation_module']

EVAL_METRICS = ('loss', 'top1', 'top5', 'num_images')  # what :func:`evaluate` returns, in summary.csv's order

# why the training loop evaluates uncompiled on CUDA (evaluation_module), as its log says it
CUDA_EVAL_UNCOMPILED = (
    'evaluation runs uncompiled on CUDA: inductor\'s evaluation graph of sa_quadratic_cifar gave wrong results on an '
    'H100 and an H200 (torch 2.11), with CUDA graphs and without (docs/training.md, "Precision and compilation")')


def evaluation_module(model: nn.Module, compiled: nn.Module, device) -> Tuple[nn.Module, Optional[str]]:
    """What the training loop evaluates through, and why where it is not ``compiled`` (the training's module).

    On CUDA the model itself: inductor's evaluation graph of ``sa_quadratic_cifar`` gave wrong results on two GPUs,
    with CUDA graphs and without, while its training graph and its weights are right; the cause is not known
    (docs/training.md, "Precision and compilation", has the evidence). The price is the eager forward's speed. On
    other devices no fault was seen: the compiled module, checked by :func:`evaluate_compiled`."""
    if compiled is model or torch.device(device).type != 'cuda':
        return compiled, None
    return model, CUDA_EVAL_UNCOMPILED


@torch.no_grad()
def evaluate(model: nn.Module, loader, device, amp_ctx: Callable = nullcontext, channels_last: bool = False,
             distributed: bool = False, pad_last_batch: bool = False) -> Dict[str, float]:
    """Loss, top-1 and top-5 (percent) over the loader; under DDP over every process's disjoint shard.

    ``pad_last_batch`` (for a compiled ``model``) pads a short batch with zero images to the loader's batch size
    (the first batch's where the loader has none) and counts only its real rows. The compiled model then sees one
    shape, compiled once in the first epoch, and CUDA graphs record once; a short batch would compile a second
    graph (a dynamic-shape one) or record a second CUDA graph. Marking the batch dimension dynamic instead would
    trade static-shape kernels for it. The cost: at most one batch of padding per evaluation."""
    model.eval()
    # loss sum, top-1 hits, top-5 hits; float64 so that hit counts stay exact
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    batch_size, num_images = getattr(loader, 'batch_size', None), 0
    for images, targets in loader:
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        rows = images.size(0)
        batch_size = batch_size or rows
        if pad_last_batch and rows < batch_size:
            images = torch.cat([images, images.new_zeros(batch_size - rows, *images.shape[1:])])
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with amp_ctx():
            logits = model(images)
        logits = logits[:rows].float()
        k = min(5, logits.shape[-1])
        hits = logits.topk(k, dim=-1).indices == targets[:, None]  # (B, k)
        totals += torch.stack([
            F.cross_entropy(logits, targets, reduction='sum').double(),
            hits[:, 0].sum().double(),
            hits.any(dim=-1).sum().double(),
        ])
        num_images += rows
    # the image count joins the totals on the device (filled from a Python number: no copy that waits)
    totals = torch.cat([totals, totals.new_full((1,), float(num_images))])
    if distributed:
        dist.all_reduce(totals)
    with host_sync_allowed():
        loss_sum, top1, top5, num_images = totals.tolist()  # the one host sync
    count = max(num_images, 1.)
    return dict(zip(EVAL_METRICS, (loss_sum / count, 100. * top1 / count, 100. * top5 / count, int(round(num_images)))))


def evaluate_compiled(eval_model: nn.Module, model: nn.Module, loader, device, log: Callable[[str], None],
                      **kwargs) -> Tuple[Dict[str, float], nn.Module]:
    """:func:`evaluate` through ``eval_model``, the compiled ``model`` (or ``model`` itself), and the module to
    evaluate through from then on.

    Where the compiled module's loss is not finite while ``model``'s own, on the same weights, is, the compiled
    evaluation is at fault and not the training: a warning gives both, and ``model`` evaluates from then on. Seen
    on an H100 (docs/training.md, "Precision and compilation"), where the cause is not known yet. A loss that is
    not finite uncompiled too is the training's, and is reported as it is."""
    metrics = evaluate(eval_model, loader, device, pad_last_batch=eval_model is not model, **kwargs)
    if eval_model is model or math.isfinite(metrics['loss']):
        return metrics, eval_model
    uncompiled = evaluate(model, loader, device, **kwargs)
    if not math.isfinite(uncompiled['loss']):
        return metrics, eval_model
    log(f'warning: evaluating through the compiled model gave loss {metrics["loss"]:.4f} (top-1 '
        f'{metrics["top1"]:.2f} %), the model uncompiled loss {uncompiled["loss"]:.4f} (top-1 '
        f'{uncompiled["top1"]:.2f} %) with the same weights: a fault of the compiled evaluation, not of the '
        f'training; evaluating uncompiled from now on (docs/training.md, "Precision and compilation")')
    return uncompiled, model


def evaluated_after(epoch: int, val_interval: int, num_epochs: int) -> bool:
    """Whether epoch ``epoch`` (from 0) ends with an evaluation: every ``val_interval``-th, and the last, as in timm's
    train.py (``--val-interval``)."""
    return (epoch + 1) % val_interval == 0 or epoch + 1 == num_epochs


def evaluate_epoch(epoch: int, eval_model: nn.Module, model: nn.Module, loader, args, log: Callable[[str], None],
                   amp_ctx: Callable) -> Tuple[Dict[str, float], nn.Module]:
    """:func:`evaluate_compiled` as the training loop's arguments ask, with the epoch's ``Eval:`` line in the log."""
    metrics, eval_model = evaluate_compiled(eval_model, model, loader, args.device, log, amp_ctx=amp_ctx,
                                            channels_last=args.channels_last, distributed=args.distributed)
    log(f'Eval: {epoch}  Loss: {metrics["loss"]:.4f}  Acc@1: {metrics["top1"]:.2f}  '
        f'Acc@5: {metrics["top5"]:.2f}  ({metrics["num_images"]} images)')
    if not math.isfinite(metrics['loss']):  # its weights give no numbers: the epoch is neither saved nor the best
        raise TrainingDiverged(f'the evaluation loss after epoch {epoch} is {metrics["loss"]}: its weights give no '
                               f'numbers (the run diverged), and are not saved as that epoch')
    return metrics, eval_model


def metric_text(name: str, value: float) -> str:
    """A metric as the Eval lines print it: a loss to 4 decimals, an accuracy (in %) to 2."""
    return f'{value:.4f}' if name == 'loss' else f'{value:.2f}'


def result_json(result: Dict[str, object], **dump_args) -> str:
    """A result as JSON, a number that is not finite (the loss of weights that hold NaN) as null: JSON has no
    NaN, and Python's own ``NaN`` in its place is refused by other readers (jq, JavaScript)."""
    return json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in result.items()},
                      **dump_args)
