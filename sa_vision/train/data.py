""" The datasets, one entry each, and the transforms for training and evaluating the CIFAR models
(docs/training.md, "Datasets")

A dataset is one :class:`DatasetInfo` entry of ``_ENTRIES``: its labels and normalisation, and the reader and check
of ``datasets.py`` it is read with. A timm ``<type>/<name>`` and an image folder get a generic entry. Transforms
follow the authors' released CIFAR-10 code (the paper states no augmentation). """
import os
import unicodedata
from dataclasses import dataclass, field, replace
from http.client import HTTPException
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple

import timm
import torch
from torchvision import transforms

from ..errors import DatasetError, DatasetNotFoundError
from ..paper import CIFAR10_CLASSES, CIFAR10_LABEL_NAMES, CIFAR10_MEAN, CIFAR10_STD
from .datasets import (
    CIFAR100_LABEL_NAMES,
    FASHION_MNIST_PAD,
    TRAIN_TEST_SPLITS,
    Checker,
    DataSource,
    Reader,
    check_digits,
    check_fashion_mnist,
    check_timm,
    failed_download,
    read_digits,
    read_fashion_mnist,
    read_timm,
    torchvision_held_tensors,
)
from .image_folders import (
    check_image_folder,
    folder_classes,
    image_folder_split,
    read_image_folder,
    stray_images_problem,
    timm_label_order,
)

__all__ = [
    'DIGITS', 'DatasetInfo', 'dataset_info', 'dataset_for_tag', 'trained_dataset', 'UNKNOWN_DATASET', 'CUSTOM_SUFFIX',
    'normalization', 'FASHION_MNIST', 'check_dataset', 'image_folder_classes', 'create_cifar_transform',
    'create_image_dataset', 'held_tensors', 'known_dataset_names', 'named_datasets', 'datasets_held_out_as_test',
    'timm_label_order', 'image_folder_labels', 'split_name', 'input_channels', 'per_channel', 'IMAGE_MODES',
]

DIGITS = 'digits'
FASHION_MNIST = 'fashion-mnist'
# what an export says of weights that name no dataset: the tag `unknown`, not an image folder's `folder`
_UNKNOWN_TAG, _FOLDER_TAG = 'unknown', 'folder'
CUSTOM_SUFFIX = '_custom'  # tag suffix of weights whose architecture differs from the registered one
# input channels -> the PIL mode images are opened in for them, as timm's validate.py opens them (no other count)
IMAGE_MODES = {3: 'RGB', 1: 'L'}


@dataclass(frozen=True)
class DatasetInfo:
    """What the rest of the package needs to know about a dataset: labels for exports, normalisation, classes, and
    how it is read."""
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
    aliases: Tuple[str, ...] = ()  # other --dataset values that name it (lower case)
    read: Reader = read_image_folder  # datasets.py, image_folders.py: a split's dataset, without its transform
    check: Checker = check_image_folder  # raises what read would, before a model is built
    splits: Mapping[str, str] = field(default_factory=dict, hash=False)  # split asked for -> read; others as asked
    tensor_images: bool = False  # held as tensors: the transform takes tensors, a loader needs no worker processes
    # --data-dir: 'needed', 'optional' (the reader has a default folder) or 'unused' (it reads no files)
    data_dir: Literal['needed', 'optional', 'unused'] = 'needed'
    downloads: bool = False  # --dataset-download fetches it into --data-dir

    def label_names(self, num_classes: int) -> Optional[Tuple[str, ...]]:
        """timm's ``pretrained_cfg['label_names']`` of weights of ``num_classes`` classes trained on this dataset:
        its class names where they are as many, else None (an image folder's classes are its folders)."""
        return self.class_names if len(self.class_names) == num_classes else None

    @property
    def is_image_folder(self) -> bool:
        """An image folder: its classes are the folders of its splits."""
        return self.read is read_image_folder


_ENTRIES = (
    DatasetInfo('torch/cifar10', 'cifar10', 'CIFAR-10', CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, 'test', 'cifar10',
                CIFAR10_LABEL_NAMES, aliases=('cifar10',), read=read_timm, check=check_timm, splits=TRAIN_TEST_SPLITS,
                downloads=True),
    # CIFAR-10's normalisation, as the authors' code and the registered models take it
    DatasetInfo('torch/cifar100', 'cifar100', 'CIFAR-100', len(CIFAR100_LABEL_NAMES), CIFAR10_MEAN, CIFAR10_STD,
                'test', 'cifar100', CIFAR100_LABEL_NAMES, read=read_timm, check=check_timm, splits=TRAIN_TEST_SPLITS,
                downloads=True),
    # mean / std of the 28x28 training pixels before the padding, as usually quoted (tests/test_data.py checks them)
    DatasetInfo(FASHION_MNIST, 'fashion_mnist', 'Fashion-MNIST (28x28 grey, padded to 32x32)', 10, (0.2860,) * 3,
                (0.3530,) * 3, 'test', 'fashion_mnist', ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat',
                                                         'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot'),
                input_padding=FASHION_MNIST_PAD, aliases=('fashion_mnist', 'fashionmnist'), read=read_fashion_mnist,
                check=check_fashion_mnist, splits=TRAIN_TEST_SPLITS, tensor_images=True, data_dir='optional'),
    DatasetInfo(DIGITS, 'digits', 'scikit-learn digits (8x8, upscaled to 32x32)', 10, CIFAR10_MEAN, CIFAR10_STD,
                'test', class_names=tuple(str(d) for d in range(10)), read=read_digits, check=check_digits,
                splits=TRAIN_TEST_SPLITS, tensor_images=True, data_dir='unused'),
)
TRAIN_SPLIT = 'train'  # --train-split's default, as timm's train.py has it
_DATASETS = {name: info for info in _ENTRIES for name in (info.name, *info.aliases)}  # every --dataset value
# timm's create_dataset prefixes: '<type>/<name>' is passed on to timm as it is
_TIMM_DATASET_TYPES = ('torch/', 'tfds/', 'wds/', 'hfds/', 'hfids/')
# weights that name no dataset: an image folder of no name (dataset_info('')) but for its tag and title
UNKNOWN_DATASET = DatasetInfo('', _UNKNOWN_TAG, 'an unknown dataset', None, CIFAR10_MEAN, CIFAR10_STD, 'validation')


def known_dataset_names() -> Tuple[str, ...]:
    """The --dataset names this package knows (aliases included), for error messages and help."""
    return tuple(sorted(_DATASETS))


def named_datasets() -> Tuple['DatasetInfo', ...]:
    """The datasets this package knows by name, one entry each (aliases aside), by name: for help texts."""
    return tuple(dataset_info(name) for name in sorted({dataset_info(n).name for n in known_dataset_names()}))


def datasets_held_out_as_test() -> str:
    """The named datasets whose held-out split is 'test' (which they also read for 'validation'), for help texts."""
    return ', '.join(info.name for info in named_datasets() if info.eval_split == 'test')


def split_name(dataset: str, split: str) -> str:
    """The split ``split`` reads: the fixed-split datasets read 'test' for 'validation' / 'val'."""
    return dataset_info(dataset).splits.get(split, split)


def normalization(dataset: str, data_cfg: Dict[str, Any], channels: int = 3) -> Dict[str, Tuple[float, ...]]:
    """``mean`` / ``std`` of ``channels`` input channels (:func:`per_channel`): a known dataset's own, for an image
    folder the model's (``data_cfg``)."""
    info = dataset_info(dataset)
    source = {'mean': info.mean, 'std': info.std} if info.num_classes else data_cfg
    return {'mean': per_channel(source['mean'], channels), 'std': per_channel(source['std'], channels)}


def per_channel(values: Sequence[float], channels: int) -> Tuple[float, ...]:
    """A mean or std for ``channels`` input channels as timm's loaders adapt one of another count (``adapt_to_chs``,
    and ``save_for_hf`` writes it so): one value repeated, others averaged; equal values are kept as they are (the
    average of three equal floats may round off them)."""
    values = tuple(values)
    if len(values) == channels:
        return values
    if len(set(values)) == 1:
        return values[:1] * channels
    return (sum(values) / len(values),) * channels


def input_channels(model: torch.nn.Module) -> int:
    """The channels of the images ``model`` takes, as timm's ``save_for_hf`` reads them: its ``in_chans``, which
    its ``pretrained_cfg`` may not say (weights built with ``in_chans=1`` keep the registered (3, 32, 32))."""
    from timm.models._input import get_model_input_config  # timm's own reading of a model's input
    return int(get_model_input_config(model)['input_size'][0])


def dataset_for_tag(tag: str, num_classes: Optional[int] = None) -> str:
    """The --dataset of a pretrained tag: a known dataset's ('fashion_mnist_custom' -> 'fashion-mnist'), else the
    name of the image folder it was given (--dataset flowers: 'flowers_custom' -> 'flowers', which
    :func:`dataset_info` tags as before); '' for an image folder of no name ('folder'), for weights of no dataset
    ('unknown') and for no tag. Weights of another ``num_classes`` than the known dataset's are an image folder's
    of that name, as an earlier version tagged one named 'cifar100' before CIFAR-100 was known."""
    for info in _ENTRIES:
        # not a prefix: an image folder 'cifar10-subset' is none
        if tag in (info.tag, info.tag + CUSTOM_SUFFIX) and num_classes in (None, info.num_classes):
            return info.name
    name = tag[:-len(CUSTOM_SUFFIX)] if tag.endswith(CUSTOM_SUFFIX) else tag
    return '' if name in (_FOLDER_TAG, _UNKNOWN_TAG) else name


def trained_dataset(meta: Mapping[str, Any]) -> Optional[str]:
    """The --dataset that weights were trained on, from what their file says (a checkpoint's ``meta``): a name (an
    image folder's as --dataset named it, which its export's tag keeps), '' for an image folder of no name (a run's
    --dataset '' with a --data-dir, its export tagged ``folder``), None where they name none (a bare state dict or
    .safetensors file, or an export of one, tagged ``unknown``)."""
    if meta.get('dataset'):
        return meta['dataset']
    tag = (meta.get('pretrained_cfg') or {}).get('tag') or ''
    if 'dataset' in meta and (meta.get('args') or {}).get('data_dir'):
        return ''
    if not tag or tag == _UNKNOWN_TAG or tag.startswith(_UNKNOWN_TAG + '_'):
        return None
    return dataset_for_tag(tag, (meta.get('pretrained_cfg') or {}).get('num_classes'))


def dataset_info(dataset: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of a --dataset value; a timm ``<type>/<name>`` and an ImageFolder ('' or any other
    name) get a generic one, tagged in ASCII letters, digits and _ as a Hub repository's name allows ('été': 'ete')."""
    key = dataset.lower() if dataset else ''
    if key in _DATASETS:
        return _DATASETS[key]
    name = unicodedata.normalize('NFKD', (dataset or _FOLDER_TAG).replace('\\', '/').split('/')[-1].lower())
    tag = ''.join(c if c.isascii() and c.isalnum() else '_' for c in name if not unicodedata.combining(c)).strip('_')
    if key.startswith(_TIMM_DATASET_TYPES):
        return replace(DatasetInfo(dataset, tag, dataset, None, CIFAR10_MEAN, CIFAR10_STD, 'validation'),
                       read=read_timm, check=check_timm, downloads=True)
    # an image folder named as a known dataset ('Fashion MNIST'), or as no dataset, is tagged apart
    if dataset and (dataset_for_tag(tag) in _DATASETS or tag in (_FOLDER_TAG, _UNKNOWN_TAG)):
        tag += '_folder'
    return DatasetInfo(dataset, tag or _FOLDER_TAG, dataset or 'image folder', None, CIFAR10_MEAN, CIFAR10_STD,
                       'validation')


class FirstChannel:
    """The first channel of a C x H x W tensor: the grey of a grey dataset's images, held repeated to 3 channels."""

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img[:1]


def create_cifar_transform(is_training: bool, img_size: int = 32, crop_padding: int = 4, hflip: float = 0.5,
                           mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
                           tensor_input: bool = False, in_chans: int = 3):
    """The released code's transform: pad-and-crop + flip for training, normalise only for evaluation; PIL images of
    another size are first resized (shorter side to ``img_size``, centre square). ``in_chans`` 1: grey images, PIL's
    ``convert('L')`` (what timm's readers give in mode 'L'; a torch/ dataset's own RGB images converted so too), a
    grey tensor dataset's one channel."""
    tfl = []
    if in_chans == 1:
        tfl.append(FirstChannel() if tensor_input else transforms.Grayscale(1))
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


def _dataset_source(dataset: str, data_dir: Optional[str], download: bool, classes: Optional[Sequence[str]] = None,
                    img_mode: str = 'RGB') -> Tuple[DatasetInfo, DataSource]:
    """(info, where to read it) of a --dataset value, or its DatasetError; ``classes``: an image folder's labels
    (:class:`DataSource`)."""
    info = dataset_info(dataset)
    if data_dir and info.data_dir != 'unused' and not os.path.isdir(data_dir) and not (info.downloads and download):
        raise DatasetNotFoundError(f'--data-dir {data_dir} ' + (
            'is a file, not a folder' if os.path.exists(data_dir) else 'does not exist' + (
                ' (a ~ is not expanded after "=": write --data-dir ~/...)' if str(data_dir).startswith('~') else
                ' (add --dataset-download to download the dataset there)' if info.downloads else '')))
    if info.is_image_folder and dataset and not data_dir:
        if not os.path.isdir(dataset):
            raise DatasetError(f'unknown dataset {dataset!r}: not one of {", ".join(known_dataset_names())}, not a '
                               f'timm <type>/<name> (torch/cifar100, ...) and not an existing folder. For an image '
                               f'folder pass --data-dir <folder> (with --dataset \'\' or a name for it)')
        data_dir = dataset  # --dataset <folder>: an image folder named by its path
    if info.data_dir == 'needed' and not data_dir:
        without = ' and '.join(f'--dataset {e.name}' for e in _ENTRIES if e.data_dir != 'needed')
        what = f'dataset {dataset!r}' if dataset else "an image folder (--dataset '')"
        raise DatasetError(f'{what} needs --data-dir (the download target or the image folder); {without} are read '
                           f'without one')
    return info, DataSource(info.name, data_dir, download, tuple(classes) if classes else None, img_mode)


def image_folder_classes(dataset: str, data_dir: Optional[str], split: str) -> Optional[List[str]]:
    """The class subfolders of an image folder's ``split`` (``<split>/<class>/<image>``, timm's layout), in
    timm's label order; None for a named dataset (its classes are fixed) or a timm ``<type>/<name>``, whose
    folder is not looked at here: --dataset-download may yet create it."""
    if not dataset_info(dataset).is_image_folder:
        return None
    info, source = _dataset_source(dataset, data_dir, download=False)
    folder = image_folder_split(source.data_dir, split, is_training=True, dataset=source.name)
    problem = stray_images_problem(folder)
    if problem:
        raise DatasetError(problem)
    classes = folder_classes(folder)
    if not classes:
        raise DatasetError(f'{folder} holds no images in class folders ({folder}/<class>/<image>, of the kinds '
                           f'timm reads: .png, .jpg, ...)')
    return classes


def image_folder_labels(model: torch.nn.Module, trained_on: Optional[str]) -> Optional[List[str]]:
    """The classes of weights trained on an image folder (``trained_on``: :func:`trained_dataset`), in their label
    order, which label any split they are evaluated on (``create_image_dataset(classes=...)``); None for others
    (CIFAR-10's names label no folder: a folder of CIFAR-10 images keeps its own order, as timm's validate.py)."""
    if trained_on is None or not dataset_info(trained_on).is_image_folder:
        return None
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    names = cfg.get('label_names')
    # the architecture's registered names (CIFAR-10's) are no record of the weights' (timm's train.py records none)
    registered = getattr(timm.models.get_pretrained_cfg(cfg.get('architecture') or ''), 'label_names', None)
    if names is None or tuple(names) == tuple(registered or ()) or len(names) != getattr(model, 'num_classes', 0):
        return None
    return list(names)


def check_dataset(dataset: str, data_dir: Optional[str] = None, download: bool = False,
                  train_split: Optional[str] = None, eval_split: Optional[str] = None) -> None:
    """Raise the DatasetError :func:`create_image_dataset` would raise for these splits, without reading an image
    (run before a model is built; torch/ datasets' files are checked by torchvision later), and for a --data-dir that
    the dataset never reads: timm's scripts read it as an image folder by default, here it would be ignored."""
    info, source = _dataset_source(dataset, data_dir, download)
    if data_dir and info.data_dir == 'unused':
        raise DatasetError(f'--data-dir {data_dir}: --dataset {info.name} reads no files (it ships with its '
                           f'package); for the image folder there pass --dataset \'\' (timm\'s default), or drop '
                           f'--data-dir')
    for split, is_training in ((train_split, True), (eval_split, False)):
        if split is not None:
            info.check(source, split, is_training)


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
        classes: Optional[Sequence[str]] = None,
        in_chans: int = 3,
):
    """A dataset with the released code's transform attached: 'digits', 'fashion-mnist', a timm name such as
    'torch/cifar10', or '' for an ImageFolder in ``data_dir``; ``mean`` / ``std`` None: the dataset's own.
    ``classes``: the labels of a model trained on an image folder (its training split's classes, in timm's
    label order), which the image folder's split is labelled by; ignored for a named dataset. ``in_chans``: the
    images' channels, 3 (RGB) or 1 (grey, as timm's validate.py reads them for a model of one: ``IMAGE_MODES``)."""
    if in_chans not in IMAGE_MODES:
        raise DatasetError(f'the datasets give images of 3 channels (RGB) or 1 (grey), not {in_chans}: feed a model '
                           f'of in_chans={in_chans} tensors of your own')
    info, source = _dataset_source(dataset, data_dir, download, classes, IMAGE_MODES[in_chans])
    try:
        ds = info.read(source, split, is_training, img_size)
    except (OSError, HTTPException, RuntimeError) as e:  # RuntimeError: torchvision's check of what it fetched
        target = failed_download(e) if source.download else None
        if target is None:
            raise
        raise DatasetError(_download_failure(info, target, e)) from e
    ds.transform = create_cifar_transform(
        is_training, img_size=img_size, crop_padding=crop_padding, hflip=hflip,
        mean=per_channel(info.mean if mean is None else mean, in_chans),
        std=per_channel(info.std if std is None else std, in_chans), tensor_input=info.tensor_images, in_chans=in_chans)
    return ds


def _download_failure(info: DatasetInfo, target: Mapping[str, str], error: BaseException) -> str:
    """What failed in a --dataset-download (the dataset, the file, why) and how to do without it."""
    reason = ' '.join(f'{type(error).__name__}: {error}'.split())
    offline = ', '.join(f'--dataset {e.name}' for e in _ENTRIES if not e.downloads)
    return (f'downloading {info.name} from {target["url"]} into {target["root"]} failed ({reason}). Download that '
            f'file elsewhere, copy it to {os.path.join(target["root"], target["filename"])} and run the same command: '
            f'torchvision checks that file and uses it (unpacked where needed) instead of downloading it. Or use a '
            f"dataset read without a network: {offline}, or an image folder of your own (--dataset '' --data-dir "
            f'<folder>)')


def held_tensors(dataset) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(images N x C x H x W, targets) of a dataset whose images are in memory, as its transform receives them
    (uint8, or float in [0, 1] for digits), else None (an image folder reads its files per item).

    Grey datasets give one channel (their items repeat it to 3): a reader's in-memory dataset says what it holds
    (its ``held_tensors()``); torchvision's CIFAR-10 / CIFAR-100 (``torch/`` names) keep H x W x C uint8 arrays,
    which its items turn into PIL images of the same pixels."""
    held = getattr(dataset, 'held_tensors', None)
    return held() if callable(held) else torchvision_held_tensors(dataset)
