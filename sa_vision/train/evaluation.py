""" Evaluation: loss, top-1 and top-5 of a model over a loader, summed over processes under DDP

The running totals stay on the images' device (no host sync per batch) and are all-reduced there (NCCL needs CUDA).
"""
from contextlib import nullcontext
from typing import Callable, Dict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ['evaluate']


@torch.no_grad()
def evaluate(model: nn.Module, loader, device, amp_ctx: Callable = nullcontext, channels_last: bool = False,
             distributed: bool = False) -> Dict[str, float]:
    """Loss, top-1 and top-5 (percent) over the loader; under DDP over every process's disjoint shard."""
    model.eval()
    # loss sum, top-1 hits, top-5 hits, images; float64 so that hit counts stay exact
    totals = torch.zeros(4, dtype=torch.float64, device=device)
    for images, targets in loader:
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with amp_ctx():
            logits = model(images)
        logits = logits.float()
        k = min(5, logits.shape[-1])
        hits = logits.topk(k, dim=-1).indices == targets[:, None]  # (B, k)
        totals += torch.stack([
            F.cross_entropy(logits, targets, reduction='sum').double(),
            hits[:, 0].sum().double(),
            hits.any(dim=-1).sum().double(),
            torch.tensor(float(images.size(0)), dtype=torch.float64, device=totals.device),
        ])
    if distributed:
        dist.all_reduce(totals)
    loss_sum, top1, top5, num_images = totals.tolist()  # the one host sync
    count = max(num_images, 1.)
    return {
        'loss': loss_sum / count,
        'top1': 100. * top1 / count,
        'top5': 100. * top5 / count,
        'num_images': int(round(num_images)),
    }
