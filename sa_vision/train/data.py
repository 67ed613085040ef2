""" Datasets and transforms for training and evaluating the CIFAR models (docs/training.md, "Datasets")

``digits`` and ``fashion-mnist`` are read in ``datasets.py``; the rest comes through timm's ``create_dataset``.
Transforms follow the paper's CIFAR-10 recipe (Sec. 4). """
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torchvision import transforms

from ..errors import DatasetError, DatasetNotFoundError
from ..paper import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD
from .datasets import (
    FASHION_MNIST_PAD,
    DigitsDataset,
    FashionMnistDataset,
    _check_digits_split,
    _fashion_mnist_files,
    _image_folder_split,
)

__all__ = [
    'DIGITS', 'DatasetInfo', 'dataset_info', 'dataset_for_tag', 'normalization', 'FASHION_MNIST',
    'check_dataset', 'image_folder_classes', 'create_cifar_transform', 'create_image_dataset', 'held_tensors',
    'known_dataset_names',
    'split_name',
]

DIGITS = 'digits'
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
    class_names: Tuple[str, ...] = ()  # label i is class_names[i]; empty for an image folder (its folder names)
    # the black border added around the dataset's own images (28x28 Fashion-MNIST -> the paper's 32x32); an export
    # moves it into the model (input_padding), so that timm's transform at the images' own size feeds it
    input_padding: int = 0


_DATASETS = {
    'torch/cifar10': DatasetInfo('torch/cifar10', 'cifar10', 'CIFAR-10', CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD,
                                 'test', 'cifar10', ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog',
                                                     'frog', 'horse', 'ship', 'truck')),
    DIGITS: DatasetInfo(DIGITS, 'digits', 'scikit-learn digits (8x8, upscaled to 32x32)', 10, CIFAR10_MEAN,
                        CIFAR10_STD, 'test', class_names=tuple(str(d) for d in range(10))),
    # mean / std of the 28x28 training pixels before the padding, as usually quoted (tests/test_data.py checks them)
    FASHION_MNIST: DatasetInfo(FASHION_MNIST, 'fashion_mnist', 'Fashion-MNIST (28x28 grey, padded to 32x32)', 10,
                               (0.2860,) * 3, (0.3530,) * 3, 'test', 'fashion_mnist',
                               ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker',
                                'Bag', 'Ankle boot'), input_padding=FASHION_MNIST_PAD),
}
_ALIASES = {'cifar10': 'torch/cifar10', 'fashion_mnist': FASHION_MNIST, 'fashionmnist': FASHION_MNIST}
# timm's create_dataset prefixes: '<type>/<name>' is passed on to timm as it is
_TIMM_DATASET_TYPES = ('torch/', 'tfds/', 'wds/', 'hfds/', 'hfids/')
# split names a held-out split may be asked for by, for the datasets with a fixed train/test split
_TEST_SPLIT_SYNONYMS = ('test', 'validation', 'val')


def known_dataset_names() -> Tuple[str, ...]:
    """The --dataset names this package knows (aliases included), for error messages and help."""
    return tuple(sorted(set(_DATASETS) | set(_ALIASES)))


def split_name(dataset: str, split: str) -> str:
    """The split ``split`` reads: the fixed-split datasets read 'test' for 'validation' / 'val'."""
    info = dataset_info(dataset)
    if info.num_classes is not None and info.eval_split == 'test' and split in _TEST_SPLIT_SYNONYMS:
        return 'test'
    return split


def normalization(dataset: str, data_cfg: Dict[str, Any]) -> Dict[str, Tuple[float, ...]]:
    """``mean`` / ``std``: a known dataset's own, for an image folder the model's (``data_cfg``)."""
    info = dataset_info(dataset)
    source = {'mean': info.mean, 'std': info.std} if info.num_classes else data_cfg
    return {'mean': tuple(source['mean']), 'std': tuple(source['std'])}


def dataset_for_tag(tag: str) -> str:
    """The --dataset of a pretrained tag ('fashion_mnist_custom' -> 'fashion-mnist'), '' for no known dataset."""
    for info in _DATASETS.values():
        if tag == info.tag or tag.startswith(info.tag + '_'):
            return info.name
    return ''


def dataset_info(dataset: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of a --dataset value; an ImageFolder ('' or any other name) gets a generic one."""
    key = _ALIASES.get(dataset.lower(), dataset.lower()) if dataset else ''
    if key in _DATASETS:
        return _DATASETS[key]
    tag = ''.join(c if c.isalnum() else '_' for c in (dataset or 'folder').split('/')[-1].lower()).strip('_')
    return DatasetInfo(dataset, tag or 'folder', dataset or 'image folder', None, CIFAR10_MEAN, CIFAR10_STD,
                       'validation')


def create_cifar_transform(
        is_training: bool,
        img_size: int = 32,
        crop_padding: int = 4,
        hflip: float = 0.5,
        mean: Sequence[float] = CIFAR10_MEAN,
        std: Sequence[float] = CIFAR10_STD,
        tensor_input: bool = False,
):
    """The paper's transform: pad-and-crop + flip for training, normalise only for evaluation; PIL images of
    another size are first resized (shorter side to ``img_size``, centre square)."""
    tfl = []
    if not tensor_input:
        # as timm's eval transform with crop_pct=1 (PIL returns a 32x32 image unchanged)
        tfl += [transforms.Resize(img_size), transforms.CenterCrop(img_size)]
    if is_training:
        if crop_padding > 0:
            tfl.append(transforms.RandomCrop(img_size, padding=crop_padding))
        if hflip > 0:
            tfl.append(transforms.RandomHorizontalFlip(hflip))
    if not tensor_input:
        tfl.append(transforms.ToTensor())
    tfl.append(transforms.Normalize(mean, std))
    return transforms.Compose(tfl)



def _dataset_source(dataset: str, data_dir: Optional[str], download: bool) -> Tuple[DatasetInfo, str, Optional[str]]:
    """(info, resolved name, folder to read) of a --dataset value, or its DatasetError."""
    info = dataset_info(dataset)
    name = info.name.lower() if info.name else ''  # aliases resolved ('fashion_mnist' -> 'fashion-mnist')
    known = info.num_classes is not None
    if (data_dir and name != DIGITS and not os.path.isdir(data_dir)
            and not (name.startswith(_TIMM_DATASET_TYPES) and download)):
        raise DatasetNotFoundError(f'--data-dir {data_dir} does not exist' + (
            ' (add --dataset-download to download the dataset there)' if name.startswith(_TIMM_DATASET_TYPES) else ''))
    if name and not known and not name.startswith(_TIMM_DATASET_TYPES):
        if os.path.isdir(dataset) and not data_dir:
            data_dir = dataset  # --dataset <folder>: an image folder named by its path
        elif not data_dir:
            raise DatasetError(f'unknown dataset {dataset!r}: not one of {", ".join(known_dataset_names())}, not a '
                               f'timm <type>/<name> (torch/cifar100, ...) and not an existing folder. For an image '
                               f'folder pass --data-dir <folder> (with --dataset \'\' or a name for it)')
    if name not in (DIGITS, FASHION_MNIST) and not data_dir:
        raise DatasetError(f'dataset {dataset or "(image folder)"!r} needs --data-dir (the download target or the '
                           f'image folder); --dataset {FASHION_MNIST} and --dataset {DIGITS} are read without one')
    return info, name, data_dir


def image_folder_classes(dataset: str, data_dir: Optional[str], split: str) -> Optional[List[str]]:
    """The class subfolders of an image folder's ``split`` (``<split>/<class>/<image>``, timm's layout), in
    timm's label order; None for a named dataset (its classes are fixed) or a timm ``<type>/<name>``."""
    _, name, data_dir = _dataset_source(dataset, data_dir, download=False)
    if name in (DIGITS, FASHION_MNIST) or name.startswith(_TIMM_DATASET_TYPES) or dataset_info(dataset).num_classes:
        return None
    folder = _image_folder_split(data_dir, split, is_training=True)
    return sorted(e.name for e in os.scandir(folder) if e.is_dir())


def check_dataset(dataset: str, data_dir: Optional[str] = None, download: bool = False,
                  train_split: Optional[str] = None, eval_split: Optional[str] = None) -> None:
    """Raise the DatasetError :func:`create_image_dataset` would raise for these splits, without reading an image
    (run before a model is built; torch/ datasets' files are checked by torchvision later)."""
    _, name, data_dir = _dataset_source(dataset, data_dir, download)
    for split, is_training in ((train_split, True), (eval_split, False)):
        if split is None:
            continue
        if name == DIGITS:
            _check_digits_split(split)
        elif name == FASHION_MNIST:
            _fashion_mnist_files(split, data_dir)
        elif not name.startswith(_TIMM_DATASET_TYPES):
            _image_folder_split(data_dir, split, is_training)


def create_image_dataset(
        dataset: str,
        split: str,
        is_training: bool,
        data_dir: Optional[str] = None,
        download: bool = False,
        img_size: int = 32,
        crop_padding: int = 4,
        hflip: float = 0.5,
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
):
    """A dataset with the paper's transform attached: 'digits', 'fashion-mnist', a timm name such as
    'torch/cifar10', or '' for an ImageFolder in ``data_dir``; ``mean`` / ``std`` None: the dataset's own."""
    info, name, data_dir = _dataset_source(dataset, data_dir, download)
    tensor_input = name in (DIGITS, FASHION_MNIST)
    transform = create_cifar_transform(
        is_training, img_size=img_size, crop_padding=crop_padding, hflip=hflip,
        mean=info.mean if mean is None else mean, std=info.std if std is None else std, tensor_input=tensor_input)
    if name == DIGITS:
        return DigitsDataset(split, transform=transform)
    if name == FASHION_MNIST:
        return FashionMnistDataset(split, transform=transform, data_dir=data_dir, img_size=img_size)

    from timm.data import create_dataset
    if not name.startswith(_TIMM_DATASET_TYPES):  # an image folder: timm would fall back to the root, i.e.
        data_dir = _image_folder_split(data_dir, split, is_training)  # evaluate on the training images
    ds = create_dataset(dataset, root=data_dir, split=split, is_training=is_training, download=download)
    ds.transform = transform
    return ds


def held_tensors(dataset) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(images N x C x H x W, targets) of a dataset whose images are in memory, as its transform receives them
    (uint8, or float in [0, 1] for digits), else None (an image folder reads its files per item).

    Grey datasets give one channel (their items repeat it to 3); torchvision's CIFAR-10 / CIFAR-100 (``torch/``
    names) keep H x W x C uint8 arrays, which its items turn into PIL images of the same pixels."""
    if isinstance(dataset, DigitsDataset):
        return dataset.images[:, :1], dataset.targets  # its 3 channels are one expanded
    if isinstance(dataset, FashionMnistDataset):
        return dataset.images, dataset.targets
    from torchvision.datasets import CIFAR10  # CIFAR100 is a subclass
    if isinstance(dataset, CIFAR10):
        return torch.from_numpy(dataset.data).permute(0, 3, 1, 2), torch.as_tensor(dataset.targets, dtype=torch.long)
    return None
