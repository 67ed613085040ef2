""" The readers of the datasets (docs/training.md, "Datasets"): each ``DatasetInfo`` entry of ``data.py`` names one
``read`` and one ``check`` of this module.

``digits`` (scikit-learn's) and ``fashion-mnist`` (Fashion-MNIST's IDX files, zero-padded 28x28 -> 32x32, so the
paper's architectures run unchanged on their 16x16 grid) are held in memory as tensors and repeated to 3 channels;
timm's ``create_dataset`` reads its ``<type>/<name>`` datasets and the image folders (:mod:`.image_folders`). """
import gzip
import importlib.util
import os
import zlib
from types import MappingProxyType
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch.utils.data import Dataset

from ..errors import DatasetError, DatasetNotFoundError

__all__ = [
    'DataSource', 'Reader', 'Checker', 'TRAIN_TEST_SPLITS', 'CIFAR100_LABEL_NAMES', 'torchvision_held_tensors',
    'DIGITS_TEST_FRACTION', 'DIGITS_SPLIT_SEED', 'DigitsDataset', 'read_digits', 'check_digits',
    'FASHION_MNIST_DIR', 'FashionMnistDataset', 'read_fashion_mnist', 'check_fashion_mnist',
    'read_timm', 'check_timm', 'failed_download',
]

DIGITS_IMG_SIZE = 32  # the size the 8x8 digits are upscaled to unless --img-size asks for another
DIGITS_TEST_FRACTION = 0.2  # 1437 train / 360 test images
DIGITS_SPLIT_SEED = 0  # fixed, so every run and every test sees the same split
FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'  # where Debian's dataset-fashion-mnist puts the IDX files
FASHION_MNIST_SIZE = 28
FASHION_MNIST_PAD = 2  # 28x28 -> 32x32
# the split asked for -> the split read, for a dataset with a fixed train / test split
# CIFAR-100's 100 fine labels, in the order of its files' meta (alphabetical): label i is the i-th
CIFAR100_LABEL_NAMES = (
    'apple', 'aquarium_fish', 'baby', 'bear', 'beaver', 'bed', 'bee', 'beetle', 'bicycle', 'bottle', 'bowl', 'boy',
    'bridge', 'bus', 'butterfly', 'camel', 'can', 'castle', 'caterpillar', 'cattle', 'chair', 'chimpanzee', 'clock',
    'cloud', 'cockroach', 'couch', 'crab', 'crocodile', 'cup', 'dinosaur', 'dolphin', 'elephant', 'flatfish',
    'forest', 'fox', 'girl', 'hamster', 'house', 'kangaroo', 'keyboard', 'lamp', 'lawn_mower', 'leopard', 'lion',
    'lizard', 'lobster', 'man', 'maple_tree', 'motorcycle', 'mountain', 'mouse', 'mushroom', 'oak_tree', 'orange',
    'orchid', 'otter', 'palm_tree', 'pear', 'pickup_truck', 'pine_tree', 'plain', 'plate', 'poppy', 'porcupine',
    'possum', 'rabbit', 'raccoon', 'ray', 'road', 'rocket', 'rose', 'sea', 'seal', 'shark', 'shrew', 'skunk',
    'skyscraper', 'snail', 'snake', 'spider', 'squirrel', 'streetcar', 'sunflower', 'sweet_pepper', 'table', 'tank',
    'telephone', 'television', 'tiger', 'tractor', 'train', 'trout', 'tulip', 'turtle', 'wardrobe', 'whale',
    'willow_tree', 'wolf', 'woman', 'worm')
TRAIN_TEST_SPLITS = MappingProxyType({'train': 'train', 'test': 'test', 'validation': 'test', 'val': 'test'})


class DataSource(NamedTuple):
    """Where a dataset is read from: its --dataset name (aliases resolved), folder, whether timm may download, and
    for an image folder the classes of the model's labels (its training split's, in timm's label order), which
    every split is labelled by; None: the split's own folders. ``img_mode``: how timm's readers open its images (PIL's
    mode: 'L' for a model of one input channel, as timm's validate.py opens them for one)."""
    name: str
    data_dir: Optional[str]
    download: bool = False
    classes: Optional[Tuple[str, ...]] = None
    img_mode: str = 'RGB'


# read(source, split, is_training, img_size) -> the dataset, without a transform (create_image_dataset sets it)
Reader = Callable[[DataSource, str, bool, int], Dataset]
# check(source, split, is_training) raises the DatasetError read would raise, without reading an image
Checker = Callable[[DataSource, str, bool], None]


def _check_digits_split(split: str) -> None:
    """Raise for a split digits lacks or a missing scikit-learn (found, not imported)."""
    import importlib.util
    if importlib.util.find_spec('sklearn') is None:
        raise DatasetError("the 'digits' dataset needs scikit-learn: pip install scikit-learn")
    if split not in TRAIN_TEST_SPLITS:
        raise DatasetError(f"digits has the splits 'train' and 'test', got {split!r}")


class DigitsDataset(Dataset):
    """scikit-learn's handwritten digits as 3 x ``img_size`` x ``img_size`` float images in [0, 1] (upscaled from
    8 x 8) with a fixed train/test split."""

    def __init__(self, split: str = 'train', transform=None, img_size: int = DIGITS_IMG_SIZE):
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
            images[idx].unsqueeze(1), size=(img_size, img_size), mode='bilinear',
            align_corners=False).clamp_(0., 1.)
        self.images = images.expand(-1, 3, -1, -1).contiguous()
        self.targets = targets[idx]
        self.transform = transform
        self.split = split

    def __len__(self) -> int:
        return len(self.targets)

    def held_tensors(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(images N x 1 x H x W float in [0, 1], targets): its 3 channels are one expanded."""
        return self.images[:, :1], self.targets

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        img = self.images[index]
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.targets[index])


_FASHION_MNIST_FILES = {  # split -> (images, labels), without the .gz
    'train': ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte'),
    'test': ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte'),
}


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
    if split not in TRAIN_TEST_SPLITS:
        raise DatasetError(f"fashion-mnist has the splits 'train' and 'test' ('validation' and 'val' are 'test'), "
                           f"got {split!r}")
    folder = os.fspath(data_dir) if data_dir else FASHION_MNIST_DIR
    paths, missing = [], []
    for name in _FASHION_MNIST_FILES[TRAIN_TEST_SPLITS[split]]:
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
            f"https://github.com/zalandoresearch/fashion-mnist)" + (
                # as timm reads --data-dir: the images of a model trained on fashion-mnist, in class subfolders
                f"; to read {folder} as an image folder pass --dataset ''" if data_dir else ''))
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

    def held_tensors(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(images N x 1 x H x W uint8, padded, targets), as stored."""
        return self.images, self.targets

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        # repeat copies: transforms may work in place, which an expand()ed view would not allow
        img = self.images[index].float().div_(255.).repeat(3, 1, 1)
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.targets[index])


def read_digits(source: DataSource, split: str, is_training: bool, img_size: int) -> DigitsDataset:
    return DigitsDataset(split, img_size=img_size)


def check_digits(source: DataSource, split: str, is_training: bool) -> None:
    _check_digits_split(split)


def read_fashion_mnist(source: DataSource, split: str, is_training: bool, img_size: int) -> FashionMnistDataset:
    return FashionMnistDataset(split, data_dir=source.data_dir, img_size=img_size)


def check_fashion_mnist(source: DataSource, split: str, is_training: bool) -> None:
    _fashion_mnist_files(split, source.data_dir)


def read_timm(source: DataSource, split: str, is_training: bool, img_size: int) -> Dataset:
    """A timm ``<type>/<name>`` dataset (torch/cifar10, tfds/..., ...) through timm's ``create_dataset``."""
    from timm.data import create_dataset
    try:
        return create_dataset(source.name, root=source.data_dir, split=split, is_training=is_training,
                              download=source.download, input_img_mode=source.img_mode)
    except RuntimeError as e:
        # torchvision's datasets say so when their files are missing (and name download=True, a Python argument)
        if source.download or 'download=True' not in str(e):
            raise
        cifar = _torchvision_cifar(source)
        if cifar is None:
            raise _timm_dataset_not_found(source, str(e).strip()) from None
        check_timm(source, split, is_training)  # raises where a file is missing: else their contents are wrong
        folder = os.path.join(source.data_dir or '', cifar.base_folder)
        raise DatasetError(f'{source.name}: the files in {folder} fail torchvision\'s MD5 check (a download cut '
                           f'short, or files of another source): delete {folder} and add --dataset-download, or put '
                           f'the original files there') from None


def _timm_dataset_not_found(source: DataSource, detail: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f'{source.name} is not in {source.data_dir or "the current folder"} ({detail}). Add --dataset-download to '
        f'download it there, or point --data-dir at the folder that holds it; for an image folder of your own '
        f"(train/<class>/, validation/<class>/), pass --dataset ''")


def failed_download(error: BaseException) -> Optional[Dict[str, str]]:
    """Where torchvision was fetching when ``error`` was raised inside its ``download_url`` (``url``, ``root``,
    ``filename``), or by the MNIST family's download after every mirror failed (it catches the first error and
    raises its own); None when ``error`` came from elsewhere: then it is no failed download."""
    from torchvision.datasets import MNIST
    from torchvision.datasets.utils import download_url
    found, tb = None, error.__traceback__
    while tb is not None:  # the innermost call of either on the way to the raise
        frame = tb.tb_frame
        if frame.f_code is download_url.__code__:
            found = {k: os.fspath(frame.f_locals[k]) for k in ('url', 'root', 'filename')}
        elif frame.f_code is MNIST.download.__code__ and tb.tb_next is None and 'filename' in frame.f_locals:
            dataset, filename = frame.f_locals['self'], frame.f_locals['filename']
            found = {'url': f'{dataset.mirrors[0]}{filename}', 'root': dataset.raw_folder, 'filename': filename}
        tb = tb.tb_next
    return found


# timm's readers of the <type>/ datasets beyond torchvision's, and the packages they import as they read
_TIMM_READER_PACKAGES = {'tfds/': ('tensorflow', 'tensorflow_datasets'), 'wds/': ('webdataset',),
                         'hfds/': ('datasets',), 'hfids/': ('datasets',)}
_PIP_NAMES = {'tensorflow_datasets': 'tensorflow-datasets'}


def check_timm(source: DataSource, split: str, is_training: bool) -> None:
    """torchvision's CIFAR-10 / CIFAR-100 (``torch/cifar10``, ``torch/cifar100``) without a file of ``split``, as
    :func:`read_timm` would say, by their names (torchvision checks their contents when it reads them); other timm
    datasets are checked as they are read, once the package timm reads their kind with is there."""
    packages = next((packages for prefix, packages in _TIMM_READER_PACKAGES.items()
                     if source.name.lower().startswith(prefix)), ())
    missing = [package for package in packages if importlib.util.find_spec(package) is None]
    if missing:
        raise DatasetError(f'{source.name}: timm reads {source.name.split("/")[0]}/ datasets with '
                           f'{" and ".join(map(repr, packages))}, not installed here (pip install '
                           f'{" ".join(_PIP_NAMES.get(package, package) for package in missing)})')
    cifar = _torchvision_cifar(source)
    if cifar is None:
        return
    if split not in TRAIN_TEST_SPLITS and split != 'training':  # timm would read any other name as the test batch
        raise DatasetError(f"{source.name} has the splits 'train' and 'test' ('validation' and 'val' read the test "
                           f"batch), got {split!r}")
    if source.download:
        return
    # timm's create_dataset reads the training files for 'train' / 'training', else the test batch
    files = cifar.train_list if split in ('train', 'training') else cifar.test_list
    folder = os.path.join(source.data_dir or '', cifar.base_folder)
    missing = [name for name, _ in files if not os.path.isfile(os.path.join(folder, name))]
    if missing:
        raise _timm_dataset_not_found(source, f'{folder} has no {", ".join(missing)}')


def _torchvision_cifar(source: DataSource):
    """torchvision's class of ``torch/cifar10`` / ``torch/cifar100``, else None."""
    from torchvision.datasets import CIFAR10, CIFAR100
    return {'torch/cifar10': CIFAR10, 'torch/cifar100': CIFAR100}.get(source.name.lower())


def torchvision_held_tensors(dataset) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(images N x 3 x H x W uint8, targets) of torchvision's CIFAR-10 / CIFAR-100 (timm's ``torch/`` names), which
    keep H x W x C uint8 arrays and turn them into PIL images of the same pixels per item; None for another."""
    from torchvision.datasets import CIFAR10  # CIFAR100 is a subclass
    if isinstance(dataset, CIFAR10):
        return torch.from_numpy(dataset.data).permute(0, 3, 1, 2), torch.as_tensor(dataset.targets, dtype=torch.long)
    return None
