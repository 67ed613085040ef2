""" Datasets and transforms for training and evaluating the CIFAR models (docs/training.md, "Datasets")

``digits`` and ``fashion-mnist`` (zero-padded 28x28 -> 32x32, so the paper's architectures run unchanged on their
16x16 grid) are read here, repeated to 3 channels; the rest comes through timm's ``create_dataset``. Transforms
follow the paper's CIFAR-10 recipe (Sec. 4). """
import gzip
import os
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset
from torchvision import transforms

from ..errors import DatasetError, DatasetNotFoundError
from ..paper import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD

__all__ = [
    'DIGITS', 'DIGITS_TEST_FRACTION', 'DIGITS_SPLIT_SEED', 'DigitsDataset', 'DatasetInfo', 'dataset_info',
    'dataset_for_tag', 'normalization',
    'FASHION_MNIST', 'FASHION_MNIST_DIR', 'FashionMnistDataset',
    'check_dataset', 'image_folder_classes', 'create_cifar_transform', 'create_image_dataset', 'held_tensors',
    'known_dataset_names',
    'split_name',
]

DIGITS = 'digits'
DIGITS_IMG_SIZE = 32
DIGITS_TEST_FRACTION = 0.2  # 1437 train / 360 test images
DIGITS_SPLIT_SEED = 0  # fixed, so every run and every test sees the same split
FASHION_MNIST = 'fashion-mnist'
FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'  # where Debian's dataset-fashion-mnist puts the IDX files
FASHION_MNIST_SIZE = 28
FASHION_MNIST_PAD = 2  # 28x28 -> 32x32


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


def _check_digits_split(split: str) -> None:
    """Raise for a split digits lacks or a missing scikit-learn (found, not imported)."""
    import importlib.util
    if importlib.util.find_spec('sklearn') is None:
        raise DatasetError("the 'digits' dataset needs scikit-learn: pip install scikit-learn")
    if split not in ('train', 'test', 'validation', 'val'):
        raise DatasetError(f"digits has the splits 'train' and 'test', got {split!r}")


class DigitsDataset(Dataset):
    """scikit-learn's handwritten digits as 3 x 32 x 32 float images in [0, 1] with a fixed train/test split."""

    def __init__(self, split: str = 'train', transform=None):
        _check_digits_split(split)
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
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


_FASHION_MNIST_FILES = {  # split -> (images, labels), without the .gz
    'train': ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte'),
    'test': ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte'),
}
_FASHION_MNIST_SPLITS = {'train': 'train', 'test': 'test', 'validation': 'test', 'val': 'test'}


def _read_idx_uint8(path: str, ndim: int) -> torch.Tensor:
    """An IDX file of unsigned bytes, gzip'd or not, as a uint8 tensor; a malformed file raises naming the path
    (torchvision's readers ``assert`` and take no gzip)."""
    with open(path, 'rb') as f:
        data = f.read()
    if path.endswith('.gz'):
        try:
            data = gzip.decompress(data)  # in memory: no unpacked copy on disk
        except (OSError, EOFError, zlib.error) as e:
            raise DatasetError(f'{path} is not a valid gzip file ({e}); fetch it again') from None
    # header: 2 zero bytes, type 0x08 (unsigned byte), ndim, then each size as big-endian uint32
    header = 4 + 4 * ndim
    if len(data) < header or data[:4] != bytes((0, 0, 0x08, ndim)):
        raise DatasetError(f'{path} is not an IDX file of unsigned bytes with {ndim} dimension(s): its magic number is '
                         f'{data[:4].hex() or "missing"}, expected {bytes((0, 0, 0x08, ndim)).hex()}')
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim)]
    numel = 1
    for n in shape:
        numel *= n
    if len(data) != header + numel:
        raise DatasetError(f'{path} is truncated or corrupt: its header says {"x".join(map(str, shape))} values '
                         f'({header + numel} bytes), the file holds {len(data)} bytes; fetch it again')
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=header).view(*shape)


def _fashion_mnist_files(split: str, data_dir: Optional[str] = None) -> List[str]:
    """The (images, labels) IDX files of a fashion-mnist split, or the error saying where to get them."""
    if split not in _FASHION_MNIST_SPLITS:
        raise DatasetError(f"fashion-mnist has the splits 'train' and 'test' ('validation' and 'val' are 'test'), "
                           f"got {split!r}")
    folder = os.fspath(data_dir) if data_dir else FASHION_MNIST_DIR
    paths, missing = [], []
    for name in _FASHION_MNIST_FILES[_FASHION_MNIST_SPLITS[split]]:
        found = [p for p in (os.path.join(folder, name + '.gz'), os.path.join(folder, name)) if os.path.isfile(p)]
        if found:
            paths.append(found[0])
        else:
            missing.append(f'{name}.gz (or {name})')
    if missing:
        raise DatasetNotFoundError(
            f"fashion-mnist: {' and '.join(missing)} not found in {folder}. Install Debian's package "
            f"(apt-get install dataset-fashion-mnist, into {FASHION_MNIST_DIR}) or pass --data-dir, a folder "
            f"holding the four standard files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
            f"t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz, e.g. from "
            f"https://github.com/zalandoresearch/fashion-mnist)")
    return paths


class FashionMnistDataset(Dataset):
    """Fashion-MNIST as 3 x 32 x 32 float images in [0, 1]: 28x28 grey, zero-padded by 2, repeated to 3 channels
    (``img_size`` 28: unpadded, for a model that pads its input itself, ``input_padding=2``).

    Kept as padded uint8 grey (N x 1 x 32 x 32, 12x smaller than float RGB) and converted per item.
    """

    def __init__(self, split: str = 'train', transform=None, data_dir: Optional[str] = None, img_size: int = 32):
        if img_size < FASHION_MNIST_SIZE or (img_size - FASHION_MNIST_SIZE) % 2:
            raise DatasetError(f'fashion-mnist images are {FASHION_MNIST_SIZE}x{FASHION_MNIST_SIZE}, zero-padded '
                               f'evenly to the input size: {img_size} is not {FASHION_MNIST_SIZE} + an even number '
                               f'(32, the paper\'s size, or 28 for a model with input_padding=2)')
        paths = _fashion_mnist_files(split, data_dir)
        images = _read_idx_uint8(paths[0], 3)
        targets = _read_idx_uint8(paths[1], 1).long()
        if images.shape[1:] != (FASHION_MNIST_SIZE, FASHION_MNIST_SIZE):
            raise DatasetError(
                f'{paths[0]} holds {images.shape[1]}x{images.shape[2]} images, Fashion-MNIST\'s are 28x28')
        if len(images) != len(targets):
            raise DatasetError(f'{paths[0]} holds {len(images)} images but {paths[1]} {len(targets)} labels')
        if len(targets) and int(targets.max()) >= 10:
            raise DatasetError(f'{paths[1]} holds label {int(targets.max())}, Fashion-MNIST has the classes 0..9')
        p = (img_size - FASHION_MNIST_SIZE) // 2
        self.images = torch.nn.functional.pad(images.unsqueeze(1), (p, p, p, p))  # zeros = black border
        self.targets = targets
        self.transform = transform
        self.split = split

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        # repeat copies: transforms may work in place, which an expand()ed view would not allow
        img = self.images[index].float().div_(255.).repeat(3, 1, 1)
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


def _image_folder_split(root: str, split: str, is_training: bool = False) -> str:
    """The subfolder of an image folder that holds ``split`` (timm's synonyms: val/valid/validation/eval/...)."""
    from timm.data.dataset_factory import _search_split
    folder = _search_split(root, split)
    if os.path.normpath(folder) == os.path.normpath(root):
        found = sorted(e.name for e in os.scandir(root) if e.is_dir()) if os.path.isdir(root) else []
        if is_training:
            advice = 'or name the training folder with --train-split'
        else:
            advice = ('or name the held-out folder with --val-split; the training images are never evaluated as a '
                      'held-out split')
        raise DatasetNotFoundError(
            f'the image folder {root} has no {split!r} subfolder (nor a synonym such as val/, validation/, eval/ '
            f'or train/); its subfolders are {found}. Put the {split} images in {os.path.join(root, split)}/<class>/ '
            f'{advice}')
    return folder


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
