""" A user's own image folder (``<data_dir>/<split>/<class>/<image>``), read by timm's ``create_dataset`` as timm's
scripts read it: its split found by timm's names for it, its classes those timm's reader labels, in its order, and
every split labelled by the classes of the split the model was trained on (docs/training.md, "Datasets") """
import itertools
import logging
import os
from typing import List, Optional, Sequence, Tuple

from torch.utils.data import Dataset

from ..errors import DatasetError, DatasetNotFoundError
from .datasets import TRAIN_TEST_SPLITS, DataSource

__all__ = ['image_folder_split', 'timm_label_order', 'folder_classes', 'stray_images_problem', 'read_image_folder',
           'check_image_folder']


def image_folder_split(root: str, split: str, is_training: bool = False, dataset: str = '') -> str:
    """The subfolder of an image folder that holds ``split``, as timm's ``_search_split`` finds it (by its name or
    a synonym from timm's tables); a missing one raises naming the synonyms timm would have taken and the flag that
    reads a subfolder of the kind asked for (training or held-out) where one is present, or the torchvision
    dataset that the folder's ``dataset`` name was meant for. The split ``.`` (or ``''``, as timm reads it) is the
    folder itself: its subfolders are the classes."""
    from timm.data.dataset_factory import _EVAL_SYNONYM, _TORCH_BASIC_DS, _TRAIN_SYNONYM, _search_split
    if split in ('', '.') and os.path.isdir(root):
        return root
    folder = _search_split(root, split)
    if os.path.normpath(folder) != os.path.normpath(root):
        return folder
    found = sorted(e.name for e in os.scandir(root) if e.is_dir()) if os.path.isdir(root) else []
    name = split.split('[')[0]  # as timm reads a split such as 'train[:90%]'
    synonyms = [s for table in (_TRAIN_SYNONYM, _EVAL_SYNONYM) if name in table for s in table if s != name]
    taken = (f'nor {", ".join(s + "/" for s in synonyms)}, which timm takes for it' if synonyms else
             f'timm takes no other name for {name!r}')
    # the commands that take the flag (sa-vision-reproduce reads the dataset's own splits)
    flag, commands = (('--train-split', '(sa-vision-train)') if is_training else
                      ('--val-split', '(sa-vision-train, sa-vision-validate, sa-vision-explore)'))
    # the subfolders of the kind asked for: training ones, or held-out ones (timm's and the fixed-split datasets')
    kind = set(_TRAIN_SYNONYM) if is_training else set(_EVAL_SYNONYM) | (set(TRAIN_TEST_SPLITS) - {'train'})
    usable = [f for f in found if f in kind]
    if usable:
        advice = (f'pass {flag} {usable[0]}' + (f' (or {", ".join(usable[1:])})' if usable[1:] else '') +
                  f' to read {os.path.join(root, usable[0])}/ {commands}, or rename that folder {split}/')
    else:
        advice = (f'put the {split} images in {os.path.join(root, split)}/<class>/ or name the folder that holds '
                  f'them with {flag} {commands}; {flag} . reads {root} itself, its subfolders as the classes')
        if not is_training:
            advice += '; the training images are never evaluated as a held-out split'
    if dataset.lower() in _TORCH_BASIC_DS:  # e.g. cifar100, which timm reads only as torch/cifar100
        advice = (f'--dataset {dataset} names an image folder here; torchvision\'s is --dataset '
                  f'torch/{dataset.lower()} (with --dataset-download to fetch it). Otherwise ' + advice)
    listed = found[:_LISTED_SUBFOLDERS] + [f'... {len(found) - _LISTED_SUBFOLDERS} more'] * (
        len(found) > _LISTED_SUBFOLDERS)
    raise DatasetNotFoundError(f'the image folder {root} has no {split!r} subfolder ({taken}); its subfolders '
                               f'are {listed}: {advice}')


_LISTED_SUBFOLDERS = 12  # an error names that many of a folder's subfolders (--data-dir /tmp holds hundreds)


def timm_label_order(names: Sequence[str]) -> List[str]:
    """The class names recorded for weights of an image folder, label by label. Runs and exports of earlier
    versions (before 2026-11-28) recorded them sorted plainly (c1, c10, c2), while the model learned timm's labels
    (natural, case-blind: c1, c2, c10): such a record is put in timm's order. Names in any other order are a record
    of their own and kept as they are. Only for sa_vision's records: another tool's (torchvision's ImageFolder sorts
    plainly) names label i by its i-th name, as timm reads it."""
    from timm.utils.misc import natural_key
    return sorted(names, key=natural_key) if list(names) == sorted(names) else list(names)


def folder_classes(folder: str) -> List[str]:
    """The classes timm's image-folder reader finds in ``folder``, in its label order: the names of the folders
    that hold images (a nested one by its own name, as timm takes it; '' for images in ``folder`` itself)."""
    from timm.data.readers.reader_image_folder import find_images_and_targets
    _, class_to_idx = find_images_and_targets(folder, sort=False)
    return sorted(class_to_idx, key=class_to_idx.get)


def _image_names(folder: str) -> Tuple[List[str], List[str]]:
    """(the image files in ``folder`` itself, its subfolders), by name: one look at the folder, not a walk."""
    from timm.data import get_img_extensions
    kinds, images, folders = get_img_extensions(as_set=True), [], []
    for entry in os.scandir(folder):
        if entry.is_dir():
            folders.append(entry.name)
        elif os.path.splitext(entry.name)[1].lower() in kinds:
            images.append(entry.name)
    return sorted(images), sorted(folders)


def stray_images_problem(folder: str) -> Optional[str]:
    """What is wrong where images lie in ``folder`` itself, beside its class folders (timm would make them a class
    named ''), or None."""
    stray = _image_names(folder)[0]
    if not stray:
        return None
    return (f'{folder} holds images beside its class folders ({", ".join(stray[:3])}{", ..." if stray[3:] else ""}), '
            f'which timm would label as a class of their own: move them into the folder of their class')


def _first_images(folder: str, count: int) -> List[str]:
    """The first ``count`` files timm's reader would take as images in ``folder`` or below it, walked in sorted
    order (the same ones on any file system); fewer where it holds fewer."""
    from timm.data import get_img_extensions
    kinds = get_img_extensions(as_set=True)

    def images():
        for root, folders, files in os.walk(folder, followlinks=True):
            folders.sort()
            yield from (os.path.join(root, f) for f in sorted(files) if os.path.splitext(f)[1].lower() in kinds)
    return list(itertools.islice(images(), count))


def _holds_images(folder: str) -> bool:
    """Whether timm's reader would find an image in ``folder`` or below it."""
    return bool(_first_images(folder, 1))


# timm's reader skips an image it cannot read, and ends the run after this many in a row
_UNREADABLE_IN_A_ROW = 10


def _unreadable_image_problem(path: str) -> Optional[str]:
    """Why PIL, which timm's reader opens images with, cannot read ``path``, or None."""
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(path) as image:
            image.convert('RGB')
    except (UnidentifiedImageError, OSError, ValueError) as e:
        try:
            with open(path, 'rb') as f:
                lfs = f.read(64).startswith(b'version https://git-lfs')
        except OSError:  # a link to nothing, a file it may not read
            lfs = False
        return f'{e}{": a Git LFS pointer (git lfs pull fetches the images)" * lfs}'
    return None


def _class_map(folder: str, classes: Sequence[str]):
    """timm's ``class_map`` that labels ``folder``'s images as ``classes`` (a model's labels) where its class
    folders are among them; a split with some of them and others raises; a split with none of them keeps its own
    labels ('': timm numbers its folders), with a warning, as timm's validate.py labels any folder. Looks at the
    class folders alone (timm's reader walks the split once after): a nested folder is labelled as timm labels it."""
    stray, folders = _image_names(folder)
    if stray:  # of no class: with no known class folder, timm labels them all as its first
        raise DatasetError(stray_images_problem(folder))
    known = [c for c in folders if c in classes]
    if not known:
        logging.getLogger(__name__).warning(
            f'note: {folder} has none of the classes the model has labels for ({", ".join(classes[:5])}'
            f'{", ..." if classes[5:] else ""}): its images are labelled by its own folders, as timm\'s validate.py '
            f'labels a folder; its scores mean something only where those are the same classes in that order')
        return ''
    extra = [c for c in folders if c not in classes and _holds_images(os.path.join(folder, c))]
    if extra:
        raise DatasetError(
            f'{folder} has class folders the model has no label for ({", ".join(extra[:5])}'
            f'{", ..." if extra[5:] else ""}): its labels are the classes of the split it was trained on '
            f'({", ".join(classes[:10])}{", ..." if classes[10:] else ""}). Evaluate a folder of those classes '
            f'(named as they are; any may be missing)')
    return {name: label for label, name in enumerate(classes)}


def read_image_folder(source: DataSource, split: str, is_training: bool, img_size: int) -> Dataset:
    """The image folder ``<data_dir>/<split>/<class>/<image>`` through timm's ``create_dataset``; a missing split
    raises (timm would fall back to the root, i.e. evaluate on the training images). Labelled by
    ``source.classes`` (:func:`_class_map`: a split lacking a class is labelled as the model's labels are, not by
    its own folders)."""
    from timm.data import create_dataset
    folder = check_image_folder(source, split, is_training)
    class_map = _class_map(folder, source.classes) if source.classes else ''
    return create_dataset(source.name, root=folder, split=split, is_training=is_training, download=source.download,
                          class_map=class_map, input_img_mode=source.img_mode)


def check_image_folder(source: DataSource, split: str, is_training: bool) -> str:
    """The subfolder of ``split`` (:func:`image_folder_split`), or a DatasetError where timm's reader would find no
    image in it (its own error is a traceback after the model is built)."""
    from timm.data import get_img_extensions
    folder = image_folder_split(source.data_dir, split, is_training, source.name)
    first = _first_images(folder, _UNREADABLE_IN_A_ROW)
    problems = [problem for path in first if (problem := _unreadable_image_problem(path))]
    if first and len(problems) == len(first):  # all of them: timm would end the first batch in a traceback
        after = f', nor are the {len(first) - 1} after it' if len(first) > 1 else ''
        raise DatasetError(f'{first[0]} is no image PIL reads ({problems[0]}){after}; timm skips such files and stops '
                           f'after {_UNREADABLE_IN_A_ROW} in a row: replace the unreadable files')
    if not first:
        raise DatasetError(f'{folder} holds no image timm reads (files ending in '
                           f'{", ".join(sorted(get_img_extensions(as_set=True)))}, in a subfolder per class: '
                           f'{os.path.join(folder, "<class>", "<image>")}): put the images there, or name the split '
                           f'that holds them')
    return folder
