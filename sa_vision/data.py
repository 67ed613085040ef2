""" Datasets and transforms for training and evaluating the CIFAR models

* ``torch/cifar10``: CIFAR-10 through timm's ``create_dataset`` (torchvision underneath, ``download=True``
  fetches it into ``data_dir``).
* an ImageFolder (``data_dir/<split>/<class>/*.png``) through timm's ``create_dataset``.
* ``digits``: the 1,797 8x8 handwritten digits that ship with scikit-learn, upscaled to 32x32 and repeated to
  3 channels, with a fixed stratified train/test split. Fully offline: the embedded default for trying things.

Transforms follow the paper's CIFAR-10 recipe (SPEC 6): train = random 32x32 crop of the 4-pixel zero-padded
image + horizontal flip + normalise; eval = normalise only. Mean and std come from :mod:`sa_vision.paper`.
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset
from torchvision import transforms

from .paper import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD

__all__ = [
    'DIGITS', 'DIGITS_TEST_FRACTION', 'DIGITS_SPLIT_SEED', 'DigitsDataset', 'DatasetInfo', 'dataset_info',
    'create_cifar_transform', 'create_image_dataset', 'default_eval_split',
]

DIGITS = 'digits'
DIGITS_IMG_SIZE = 32
DIGITS_TEST_FRACTION = 0.2  # 1437 train / 360 test images
DIGITS_SPLIT_SEED = 0  # fixed, so every run and every test sees the same split
FASHION_MNIST = 'fashion-mnist'


@dataclass(frozen=True)
class DatasetInfo:
    """What the rest of the package needs to know about a dataset: labels for exports, normalisation, classes."""
    name: str  # the --dataset value
    tag: str  # pretrained tag of weights trained on it: timm.create_model('<arch>.<tag>')
    title: str  # for people (model cards, tables)
    num_classes: Optional[int]  # None: whatever the folder holds
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    eval_split: str  # the held-out split evaluated by default
    hub_dataset: Optional[str] = None  # Hugging Face dataset id for the card's `datasets:` metadata


_DATASETS = {
    'torch/cifar10': DatasetInfo('torch/cifar10', 'cifar10', 'CIFAR-10', CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD,
                                 'test', 'cifar10'),
    DIGITS: DatasetInfo(DIGITS, 'digits', 'scikit-learn digits (8x8, upscaled to 32x32)', 10, CIFAR10_MEAN,
                        CIFAR10_STD, 'test'),
    # mean / std of the 60,000 training images (grey, repeated to 3 channels)
    FASHION_MNIST: DatasetInfo(FASHION_MNIST, 'fashion_mnist', 'Fashion-MNIST (28x28 grey, padded to 32x32)', 10,
                               (0.2860,) * 3, (0.3530,) * 3, 'test', 'fashion_mnist'),
}
_ALIASES = {'cifar10': 'torch/cifar10', 'fashion_mnist': FASHION_MNIST, 'fashionmnist': FASHION_MNIST}


def dataset_info(dataset: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of a --dataset value; an ImageFolder ('' or any other name) gets a generic one."""
    key = _ALIASES.get(dataset.lower(), dataset.lower()) if dataset else ''
    if key in _DATASETS:
        return _DATASETS[key]
    tag = ''.join(c if c.isalnum() else '_' for c in (dataset or 'folder').split('/')[-1].lower()).strip('_')
    return DatasetInfo(dataset, tag or 'folder', dataset or 'image folder', None, CIFAR10_MEAN, CIFAR10_STD,
                       'validation')


class DigitsDataset(Dataset):
    """scikit-learn's handwritten digits as 3 x 32 x 32 float images in [0, 1] with a fixed train/test split."""

    def __init__(self, split: str = 'train', transform=None):
        try:
            from sklearn.datasets import load_digits
            from sklearn.model_selection import train_test_split
        except ImportError:
            raise ImportError(
                "the 'digits' dataset needs scikit-learn: pip install scikit-learn") from None
        if split not in ('train', 'test', 'validation', 'val'):
            raise ValueError(f"digits has the splits 'train' and 'test', got {split!r}")
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32) / 16.  # 8x8, values 0..16
        targets = torch.tensor(digits.target, dtype=torch.long)
        train_idx, test_idx = train_test_split(
            list(range(len(targets))),
            test_size=DIGITS_TEST_FRACTION,
            random_state=DIGITS_SPLIT_SEED,
            stratify=digits.target,
        )
        idx = torch.tensor(train_idx if split == 'train' else test_idx)
        images = torch.nn.functional.interpolate(
            images[idx].unsqueeze(1), size=(DIGITS_IMG_SIZE, DIGITS_IMG_SIZE), mode='bilinear',
            align_corners=False).clamp_(0., 1.)
        self.images = images.expand(-1, 3, -1, -1).contiguous()
        self.targets = targets[idx]
        self.transform = transform
        self.split = split

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        img = self.images[index]
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.targets[index])


def create_cifar_transform(
        is_training: bool,
        img_size: int = 32,
        crop_padding: int = 4,
        hflip: float = 0.5,
        mean: Sequence[float] = CIFAR10_MEAN,
        std: Sequence[float] = CIFAR10_STD,
        tensor_input: bool = False,
):
    """The paper's transform: pad-and-crop + flip for training, normalise only for evaluation.

    Args:
        is_training: Add the random augmentation.
        img_size: Output size (images are expected at this size already).
        crop_padding: Zero padding before the random crop, 0 for no crop.
        hflip: Probability of a horizontal flip.
        mean, std: Normalisation.
        tensor_input: The dataset yields float tensors in [0, 1] (digits) rather than PIL images.
    """
    tfl = []
    if is_training:
        if crop_padding > 0:
            tfl.append(transforms.RandomCrop(img_size, padding=crop_padding))
        if hflip > 0:
            tfl.append(transforms.RandomHorizontalFlip(hflip))
    if not tensor_input:
        tfl.append(transforms.ToTensor())
    tfl.append(transforms.Normalize(mean, std))
    return transforms.Compose(tfl)


def default_eval_split(dataset: str) -> str:
    """Name of the held-out split of a dataset ('test' for CIFAR-10 and digits, 'validation' for folders)."""
    return 'test' if dataset.lower() in (DIGITS, 'torch/cifar10', 'torch/cifar100') else 'validation'


def create_image_dataset(
        dataset: str,
        split: str,
        is_training: bool,
        data_dir: Optional[str] = None,
        download: bool = False,
        img_size: int = 32,
        crop_padding: int = 4,
        hflip: float = 0.5,
        mean: Sequence[float] = CIFAR10_MEAN,
        std: Sequence[float] = CIFAR10_STD,
):
    """A dataset with the paper's transform attached.

    Args:
        dataset: 'digits', a timm dataset name such as 'torch/cifar10', or '' for an ImageFolder in ``data_dir``.
        split: 'train', 'test' / 'validation' (timm maps the torch/ splits).
        is_training: Attach the training augmentation.
        data_dir: Root folder (download target for torch/ datasets, the folder for ImageFolder).
        download: Download torch/ datasets that are missing.
    """
    tensor_input = dataset.lower() == DIGITS
    transform = create_cifar_transform(
        is_training, img_size=img_size, crop_padding=crop_padding, hflip=hflip, mean=mean, std=std,
        tensor_input=tensor_input)
    if tensor_input:
        return DigitsDataset(split, transform=transform)

    from timm.data import create_dataset
    if not data_dir:
        raise ValueError(f'dataset {dataset!r} needs --data-dir (the download target or the image folder)')
    ds = create_dataset(dataset, root=data_dir, split=split, is_training=is_training, download=download)
    ds.transform = transform
    return ds
