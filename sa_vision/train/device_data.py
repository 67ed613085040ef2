""" Data held on the device, shuffled and augmented there in whole batches (docs/training.md, "Data on the device")

A loader that transforms one image at a time in Python cannot keep up with a GPU that trains tens of thousands of
images a second, while CIFAR-10 or Fashion-MNIST fits in its memory many times over. :class:`DeviceTrainLoader`
holds the training split as it is stored (uint8 N x C x H x W; digits float) and draws each epoch what
:func:`~sa_vision.train.data.create_cifar_transform` draws per image: the released code's augmentation (the paper
states none), a crop at an offset uniform in ``[0, 2 * padding]`` of each axis of the zero-padded image and a
horizontal flip with probability ``hflip``, then float conversion and the dataset's normalisation. The order of the
images is ``DistributedSampler(..., shuffle=True, drop_last=True)``'s, so every rank trains its disjoint slice; the
augmentation is drawn on the CPU from (seed, epoch, rank), so a CPU and a GPU run see the same crops and flips.
"""
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from ..errors import UserError
from .data import held_tensors

__all__ = ['AUGMENT_BLOCK_IMAGES', 'AUTO_MAX_FREE_FRACTION', 'DeviceTrainLoader', 'DeviceEvalLoader',
           'device_data_bytes', 'resolve_device_data', 'set_epoch']

# --device-data auto holds the data only within this share of the free device memory: the rest is the model's
AUTO_MAX_FREE_FRACTION = 0.25
# the training images augmented at once (whole batches, at least one): 100 MB of float32 CIFAR images, about 4.5x
# that at the peak (device_data_bytes)
AUGMENT_BLOCK_IMAGES = 8192

Batch = Tuple[torch.Tensor, torch.Tensor]


def _augmentation_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of an epoch's crops and flips on one rank: numpy's SeedSequence mixes the three (it takes no
    negative number: a negative --seed, which the DataLoader's path takes modulo 2**32, is taken modulo 2**64)."""
    # shifted as a Python int: numpy 1.x refuses uint64 >> int
    return int(np.random.SeedSequence([seed % 2 ** 64, epoch, rank]).generate_state(1, np.uint64)[0]) >> 1


def _normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, channels: int) -> torch.Tensor:
    """Float, grey repeated to ``channels``, normalised: the float32 operations of ToTensor and Normalize."""
    x = images.float().div(255.) if images.dtype == torch.uint8 else images.float()
    if x.size(1) != channels:
        x = x.expand(-1, channels, -1, -1)
    return (x - mean) / std


class _HeldSplit:
    """What both loaders share: the split's images and targets on the device, the normalisation."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, batch_size: int, mean: Sequence[float],
                 std: Sequence[float], device, channels: int = 3):
        if batch_size < 1:
            raise UserError(f'the batch size must be at least 1, got {batch_size}')
        self.device = torch.device(device)
        self.images = images.to(self.device).contiguous()
        self.targets = targets.to(self.device, torch.long)
        self.batch_size = batch_size
        self.channels = channels
        self.mean = torch.tensor(mean, dtype=torch.float32, device=self.device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=self.device).view(1, -1, 1, 1)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class DeviceTrainLoader(_HeldSplit):
    """Batches ``(images, targets)`` of the training split, on the device, shuffled and augmented per epoch.

    ``images``: N x C x H x W, uint8 or float in [0, 1], as the CPU transform receives them (C = 1 is repeated to
    ``channels``). Per epoch (:meth:`set_epoch`): ``DistributedSampler``'s order for ``(seed, epoch)`` with
    ``drop_last=True`` (this rank's slice of ``N // world_size`` images), full batches only, augmented
    ``block_images`` at a time (rounded down to whole batches, at least one) and handed out as views of the block.
    """

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, batch_size: int, mean: Sequence[float],
                 std: Sequence[float], device, hflip: float = 0.5, crop_padding: int = 4, seed: int = 0,
                 rank: int = 0, world_size: int = 1, channels: int = 3, block_images: int = AUGMENT_BLOCK_IMAGES):
        if crop_padding < 0 or not 0. <= hflip <= 1.:
            raise UserError(f'--train-crop-padding must be >= 0 and --hflip in [0, 1], got {crop_padding} and '
                            f'{hflip}')
        p = crop_padding
        # padded once: each batch is then one gather from the zero border (the value RandomCrop pads with)
        super().__init__(F.pad(images, (p, p, p, p)) if p else images, targets, batch_size, mean, std, device,
                         channels)
        height, width = images.shape[-2:]
        self._rows, self._cols = torch.arange(height, device=self.device), torch.arange(width, device=self.device)
        self._channels = torch.arange(images.size(1), device=self.device)
        self.hflip, self.crop_padding = hflip, crop_padding
        self.seed, self.rank = seed, rank
        self.block_images = block_images
        self.sampler = DistributedSampler(range(len(targets)), num_replicas=world_size, rank=rank, shuffle=True,
                                          seed=seed, drop_last=True)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def epoch_draws(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indices, crop offsets n x 2 (row, column), flips) of this rank's epoch, on the CPU."""
        indices = torch.tensor(list(self.sampler), dtype=torch.long)
        gen = torch.Generator().manual_seed(_augmentation_seed(self.seed, self.epoch, self.rank))
        offsets = torch.randint(0, 2 * self.crop_padding + 1, (len(indices), 2), generator=gen)
        flips = torch.rand(len(indices), generator=gen) < self.hflip  # as RandomHorizontalFlip: rand < p
        return indices, offsets, flips

    def augment(self, indices: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
        """The crops at ``offsets`` of the padded images ``indices``, mirrored where ``flips``, normalised."""
        rows = offsets[:, :1] + self._rows
        cols = offsets[:, 1:] + self._cols
        cols = torch.where(flips[:, None], cols.flip(1), cols)
        crops = self.images[indices[:, None, None, None], self._channels[None, :, None, None], rows[:, None, :, None],
                            cols[:, None, None, :]]
        return _normalize(crops, self.mean, self.std, self.channels)

    def __iter__(self) -> Iterator[Batch]:
        indices, offsets, flips = (t.to(self.device, non_blocking=True) for t in self.epoch_draws())
        # several batches augmented at once, then handed out as views: a training step on a GPU is a few
        # milliseconds of host work, which a dozen small operations per batch would lengthen
        block = max(1, self.block_images // self.batch_size) * self.batch_size
        end = len(self) * self.batch_size
        for start in range(0, end, block):
            part = slice(start, min(start + block, end))
            images = self.augment(indices[part], offsets[part], flips[part])
            yield from zip(images.split(self.batch_size), self.targets[indices[part]].split(self.batch_size))


class DeviceEvalLoader(_HeldSplit):
    """Batches ``(images, targets)`` of this rank's shard of an evaluation split (``rank::world_size``, as the
    DataLoader path), on the device, normalised, in order; the last batch may be short."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, batch_size: int, mean: Sequence[float],
                 std: Sequence[float], device, rank: int = 0, world_size: int = 1, channels: int = 3):
        super().__init__(images[rank::world_size], targets[rank::world_size], batch_size, mean, std, device,
                         channels)

    def __len__(self) -> int:
        return -(-len(self.targets) // self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        for start in range(0, len(self.targets), self.batch_size):
            batch = slice(start, start + self.batch_size)
            yield _normalize(self.images[batch], self.mean, self.std, self.channels), self.targets[batch]


def set_epoch(loader, epoch: int) -> None:
    """Start ``epoch`` of a device loader or of a DataLoader with a ``DistributedSampler``."""
    if hasattr(loader, 'set_epoch'):
        loader.set_epoch(epoch)
    else:
        loader.sampler.set_epoch(epoch)


def device_data_bytes(train: Tuple[torch.Tensor, torch.Tensor], evaluation: Tuple[torch.Tensor, torch.Tensor],
                      crop_padding: int, channels: int = 3) -> int:
    """Device memory the two loaders hold: the padded training images, the evaluation images, the targets, and
    the augmentation's block at its peak, counted as 4.5 float32 blocks of ``channels`` x h x w per image (the
    float copy, its difference to the mean, the result, the block before it, which the last batch handed out still
    views, and the crops and their indices: 4.3 measured for uint8 CIFAR-sized images, tests/test_device_data.py).
    A batch of more images than :data:`AUGMENT_BLOCK_IMAGES` makes a larger block than counted here."""
    images, targets = train
    n, c, h, w = images.shape
    padded = n * c * (h + 2 * crop_padding) * (w + 2 * crop_padding) * images.element_size()
    block = int(4.5 * min(AUGMENT_BLOCK_IMAGES, n) * channels * h * w * 4)
    return padded + block + targets.numel() * 8 + evaluation[0].numel() * evaluation[0].element_size() + \
        evaluation[1].numel() * 8


def _gib(num_bytes: float) -> str:
    return f'{num_bytes / 2 ** 30:.2f} GiB'


def resolve_device_data(requested: str, device, train_ds, eval_ds, img_size: int,
                        crop_padding: int) -> Tuple[Optional[Tuple[Tuple[torch.Tensor, torch.Tensor], ...]], str]:
    """(the (train, eval) tensors to hold, or None for the DataLoader; why) for ``--device-data requested``.

    'on' raises a :class:`UserError` where the data cannot be held; 'auto' holds it with CUDA when both splits are
    in memory and fit in ``AUTO_MAX_FREE_FRACTION`` of the free device memory, and never on a CPU, where it was
    measured no faster (docs/training.md)."""
    if requested == 'off':
        return None, '--device-data off: DataLoader'
    held = [held_tensors(ds) for ds in (train_ds, eval_ds)]
    problem = ''
    if any(h is None for h in held):
        problem = 'the dataset is not held in memory (an image folder, or a torch/ dataset other than CIFAR-10/100)'
    elif any(tuple(h[0].shape[-2:]) != (img_size, img_size) for h in held):
        size = 'x'.join(map(str, held[0][0].shape[-2:]))
        problem = f'its images are {size}, the model takes {img_size}x{img_size}'
    device, room = torch.device(device), ''
    if not problem and device.type == 'cuda':
        needed = device_data_bytes(held[0], held[1], crop_padding)
        free, total = torch.cuda.mem_get_info(device)
        limit = free * (AUTO_MAX_FREE_FRACTION if requested == 'auto' else 1.)
        if needed > limit:
            problem = (f'it needs {_gib(needed)} of device memory and {device} has {_gib(free)} free of '
                       f'{_gib(total)}' + (f' (auto holds data in at most {AUTO_MAX_FREE_FRACTION:.0%} of it)'
                                           if requested == 'auto' else ''))
        room = f' ({_gib(needed)} of {_gib(free)} free)'
    if requested == 'on':
        if problem:
            raise UserError(f'--device-data on cannot hold this dataset on {device}: {problem}. Use --device-data off '
                            f'(or auto)')
        return held, f'--device-data on: dataset held on {device}{room}'
    if problem:
        return None, f'--device-data auto: DataLoader, {problem}'
    if device.type != 'cuda':
        return None, f'--device-data auto: DataLoader on {device.type} (held data only with CUDA; on a CPU it was no ' \
                     f'faster)'
    return held, f'--device-data auto: dataset held on {device}{room}'
