""" sa_vision.train.datasets: the fashion-mnist dataset (IDX files, padding, splits, normalisation, errors) """
import gzip
import os
import struct
from pathlib import Path

import pytest
import torch

from sa_vision.train.data import create_image_dataset, dataset_info
from sa_vision.train.datasets import FASHION_MNIST_DIR, FashionMnistDataset

MEAN, STD = 0.2860, 0.3530  # the registry's fashion-mnist values, restated to check the registry too
FILES = {  # split -> (images, labels)
    'train': ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte'),
    'test': ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte'),
}


def idx_bytes(values: torch.Tensor) -> bytes:
    """An IDX file of unsigned bytes, written by hand: 0, 0, type 0x08, ndim, big-endian uint32 sizes, data."""
    return struct.pack('>BBBB', 0, 0, 0x08, values.dim()) + struct.pack(f'>{values.dim()}I', *values.shape) + \
        bytes(values.flatten().tolist())


def fake_images(n: int, seed: int) -> torch.Tensor:
    # distinct known values per image: pixel (i, r, c) = (seed + 7 i + 3 r + 5 c) mod 256, up to 255
    i, r, c = torch.meshgrid(torch.arange(n), torch.arange(28), torch.arange(28), indexing='ij')
    return ((seed + 7 * i + 3 * r + 5 * c) % 256).to(torch.uint8)


@pytest.fixture(params=['gz', 'raw'])
def fake_dir(request, tmp_path):
    """5 train and 3 test images with known pixels and labels, as .gz or uncompressed files."""
    data = {'train': (fake_images(5, 0), torch.tensor([3, 0, 9, 1, 7], dtype=torch.uint8)),
            'test': (fake_images(3, 100), torch.tensor([2, 8, 5], dtype=torch.uint8))}
    for split, (images_name, labels_name) in FILES.items():
        for name, values in zip((images_name, labels_name), data[split]):
            raw = idx_bytes(values)
            if request.param == 'gz':
                (tmp_path / (name + '.gz')).write_bytes(gzip.compress(raw))
            else:
                (tmp_path / name).write_bytes(raw)
    return tmp_path, data


@pytest.mark.parametrize('split, source', [('train', 'train'), ('test', 'test'), ('validation', 'test'),
                                           ('val', 'test')])
@pytest.mark.parametrize('name', ['fashion-mnist', 'fashion_mnist', 'FashionMNIST'])
def test_fake_files_through_create_image_dataset(fake_dir, split, source, name):
    folder, data = fake_dir
    images, labels = data[source]
    ds = create_image_dataset(name, split, is_training=False, data_dir=folder)
    assert isinstance(ds, FashionMnistDataset)
    assert len(ds) == len(labels)
    for k in range(len(ds)):
        img, target = ds[k]
        assert isinstance(target, int) and target == int(labels[k])
        assert img.shape == (3, 32, 32) and img.dtype == torch.float32
        background = (0. - MEAN) / STD  # a zero pixel after normalisation
        border = torch.ones(3, 32, 32, dtype=torch.bool)
        border[:, 2:30, 2:30] = False
        torch.testing.assert_close(img[border], torch.full_like(img[border], background))
        expected = ((images[k].double() / 255. - MEAN) / STD).float().expand(3, -1, -1)
        torch.testing.assert_close(img[:, 2:30, 2:30], expected, rtol=0, atol=1e-5)


def test_mean_std_defaults_and_explicit(fake_dir):
    folder, data = fake_dir
    assert dataset_info('fashion-mnist').mean == (MEAN,) * 3 and dataset_info('fashion-mnist').std == (STD,) * 3
    img, _ = create_image_dataset('fashion-mnist', 'test', is_training=False, data_dir=folder,
                                  mean=(0.,) * 3, std=(1.,) * 3)[0]  # explicit values win
    torch.testing.assert_close(img[0, 2:30, 2:30], data['test'][0][0].float() / 255.)
    assert float(img[:, :2].abs().max()) == 0.


def test_training_transform_and_storage(fake_dir):
    folder, data = fake_dir
    ds = create_image_dataset('fashion-mnist', 'train', is_training=True, data_dir=folder)
    img, target = ds[2]
    assert img.shape == (3, 32, 32) and target == 9
    # stored compactly: uint8 N x 1 x 32 x 32, the 28x28 image in the middle
    assert ds.images.dtype == torch.uint8 and ds.images.shape == (5, 1, 32, 32)
    assert torch.equal(ds.images[:, 0, 2:30, 2:30], data['train'][0])


def test_bad_split(fake_dir):
    with pytest.raises(ValueError, match="'train' and 'test'"):
        FashionMnistDataset('holdout', data_dir=fake_dir[0])


def test_missing_files_message(tmp_path):
    (tmp_path / 'train-labels-idx1-ubyte.gz').write_bytes(gzip.compress(idx_bytes(torch.zeros(1, dtype=torch.uint8))))
    with pytest.raises(FileNotFoundError) as e:
        create_image_dataset('fashion-mnist', 'train', is_training=True, data_dir=tmp_path)
    msg = str(e.value)
    assert 'train-images-idx3-ubyte' in msg and 'train-labels' not in msg.split('not found')[0]
    assert str(tmp_path) in msg and 'apt-get install dataset-fashion-mnist' in msg and '--data-dir' in msg
    # a --data-dir of images (as timm reads it) for a model trained on fashion-mnist: the flag that reads them
    assert msg.endswith(f"; to read {tmp_path} as an image folder pass --dataset ''"), msg
    with pytest.raises(FileNotFoundError, match='t10k-images-idx3-ubyte.* and t10k-labels-idx1-ubyte'):
        FashionMnistDataset('test', data_dir=tmp_path)


@pytest.mark.parametrize('damage', ['magic', 'truncated', 'gzip'])
def test_malformed_file_names_it(fake_dir, damage):
    folder, _ = fake_dir
    path = next(p for p in folder.iterdir() if p.name.startswith('t10k-images'))
    raw = gzip.decompress(path.read_bytes()) if path.suffix == '.gz' else path.read_bytes()
    if damage == 'magic':
        raw = struct.pack('>BBBB', 0, 0, 0x0D, 3) + raw[4:]  # float32 instead of unsigned bytes
    elif damage == 'truncated':
        raw = raw[:-10]
    if damage == 'gzip':
        if path.suffix != '.gz':
            pytest.skip('only a .gz file can be a broken gzip file')
        path.write_bytes(gzip.compress(raw)[:-20])
    else:
        path.write_bytes(gzip.compress(raw) if path.suffix == '.gz' else raw)
    with pytest.raises(ValueError, match=path.name):
        create_image_dataset('fashion-mnist', 'test', is_training=False, data_dir=folder)


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_DIR), reason=f'{FASHION_MNIST_DIR} not installed')
def test_real_files_and_registry_stats():
    train = create_image_dataset('fashion-mnist', 'train', is_training=False)  # the default folder
    test = create_image_dataset('fashion-mnist', 'test', is_training=False)
    assert len(train) == 60000 and len(test) == 10000
    assert train.targets.unique().tolist() == list(range(10)) and test.targets.unique().tolist() == list(range(10))
    assert train[0][0].shape == (3, 32, 32)

    # the raw 28x28 pixels, read independently of the loader: IDX header of 16 bytes, then the data
    raw = gzip.decompress((Path(FASHION_MNIST_DIR) / 'train-images-idx3-ubyte.gz').read_bytes())
    pixels = torch.frombuffer(bytearray(raw), dtype=torch.uint8, offset=16).view(60000, 28, 28)
    assert torch.equal(train.images[:, 0, 2:30, 2:30], pixels)
    # exact per-pixel mean / std of the unpadded pixels / 255, from the histogram of the 47M values
    counts = torch.bincount(pixels.flatten(), minlength=256).double()
    values = torch.arange(256, dtype=torch.float64) / 255.
    mean = float((counts * values).sum() / counts.sum())
    std = float(((counts * (values - mean) ** 2).sum() / counts.sum()).sqrt())
    info = dataset_info('fashion-mnist')
    assert round(mean, 3) == round(info.mean[0], 3) == MEAN and round(std, 3) == round(info.std[0], 3) == STD


class _ToyDataset(torch.utils.data.Dataset):
    """Two 1 x 2 x 2 float images in memory, as a reader of sa_vision/train/datasets.py returns them."""

    def __init__(self):
        self.images, self.targets, self.transform = torch.tensor([[[[0., .5], [1., .25]]], [[[1., 1.], [0., 0.]]]]), \
            torch.tensor([1, 0]), None

    def __len__(self):
        return 2

    def held_tensors(self):
        return self.images, self.targets

    def __getitem__(self, index):
        return self.transform(self.images[index].repeat(3, 1, 1)), int(self.targets[index])


def test_a_dataset_is_one_entry(monkeypatch, tmp_path):
    """An entry alone (no other edit) makes a dataset readable, checkable, split-mapped and held by name."""
    from sa_vision.errors import DatasetError
    from sa_vision.train import data
    reads = []

    def read(source, split, is_training, img_size):
        reads.append((source.name, source.data_dir, split, is_training, img_size))
        return _ToyDataset()

    def check(source, split, is_training):
        if split not in ('train', 'test', 'val'):
            raise DatasetError(f'toy has no split {split!r}')

    info = data.DatasetInfo('toy', 'toy', 'Toy', 2, (.5,) * 3, (.25,) * 3, 'test', aliases=('toy-set',), read=read,
                            check=check, splits={'val': 'test'}, tensor_images=True, data_dir='unused')
    for name in ('toy', 'toy-set'):
        monkeypatch.setitem(data._DATASETS, name, info)
    missing = str(tmp_path / 'nope')  # --data-dir is unused: not an error
    ds = create_image_dataset('Toy-Set', 'val', is_training=False, data_dir=missing, img_size=2)
    assert reads == [('toy', missing, 'val', False, 2)]
    img, target = ds[0]  # the tensor transform: normalisation only, with the entry's mean and std
    torch.testing.assert_close(img, ((torch.tensor([[0., .5], [1., .25]]) - .5) / .25).expand(3, -1, -1))
    assert target == 1 and data.held_tensors(ds)[0] is ds.images
    assert data.split_name('toy', 'val') == 'test' and data.split_name('toy', 'train') == 'train'
    assert data.image_folder_classes('toy', None, 'train') is None and 'toy-set' in data.known_dataset_names()
    data.check_dataset('toy', train_split='train', eval_split='val')
    with pytest.raises(DatasetError, match="toy has no split 'holdout'"):
        data.check_dataset('toy', eval_split='holdout')


@pytest.mark.parametrize('dataset', ['cifar10', 'CIFAR10', 'torch/cifar10'])
def test_cifar10_alias_reads_torchvisions_cifar10(dataset, monkeypatch, tmp_path):
    """The alias is timm's torch/cifar10 (timm's create_dataset would read a bare 'cifar10' as an image folder)."""
    import timm.data
    asked = []
    monkeypatch.setattr(timm.data, 'create_dataset', lambda name, **kwargs: asked.append((name, kwargs)) or
                        torch.utils.data.TensorDataset(torch.zeros(1)))
    create_image_dataset(dataset, 'test', is_training=False, data_dir=str(tmp_path), download=True)
    assert asked == [('torch/cifar10', {'root': str(tmp_path), 'split': 'test', 'is_training': False,
                                        'download': True, 'input_img_mode': 'RGB'})]


def test_cifar_files_are_checked_by_name_before_they_are_read(tmp_path):
    """torch/cifar10's batches, named as torchvision reads them, are looked for before a run starts: the training
    split needs data_batch_1-5, the test split test_batch; with --dataset-download none is needed yet."""
    from sa_vision.errors import DatasetNotFoundError
    from sa_vision.train.data import check_dataset
    batches = tmp_path / 'cifar-10-batches-py'
    batches.mkdir()
    (batches / 'test_batch').write_bytes(b'')
    check_dataset('torch/cifar10', str(tmp_path), eval_split='test')
    with pytest.raises(DatasetNotFoundError, match=r'cifar-10-batches-py has no data_batch_1, .*data_batch_5\). '
                                                   r'Add --dataset-download'):
        check_dataset('torch/cifar10', str(tmp_path), train_split='train')
    check_dataset('torch/cifar10', str(tmp_path), download=True, train_split='train')
    for i in range(1, 6):
        (batches / f'data_batch_{i}').write_bytes(b'')
    check_dataset('torch/cifar10', str(tmp_path), train_split='train', eval_split='test')
    with pytest.raises(DatasetNotFoundError, match='cifar-100-python has no test'):
        check_dataset('torch/cifar100', str(tmp_path), eval_split='validation')


def test_cifar100_weights_are_labelled_and_their_tag_reads_back_as_torchvisions_dataset():
    """An export of a CIFAR-100 run names its classes (timm's inference.py prints them) in the order of the
    dataset's files (alphabetical: 'apple' is 0, 'worm' 99), and its tag reads back as torch/cifar100, not as an
    image folder named 'cifar100' (whose tag is its own)."""
    from sa_vision.train.data import dataset_info, trained_dataset
    names = dataset_info('torch/cifar100').label_names(100)
    assert len(set(names)) == 100 and list(names) == sorted(names) and (names[0], names[99]) == ('apple', 'worm')
    assert dataset_info('torch/cifar100').label_names(10) is None
    for tag in ('cifar100', 'cifar100_custom'):
        assert trained_dataset({'pretrained_cfg': {'tag': tag}}) == 'torch/cifar100'
    # an image folder named 'cifar100' an earlier version tagged so: its class count says it is none
    cfg = {'tag': 'cifar100_custom', 'num_classes': 3}
    assert trained_dataset({'pretrained_cfg': cfg}) == 'cifar100' and dataset_info('cifar100').is_image_folder
    assert dataset_info('cifar100').tag == 'cifar100_folder'  # as an image folder named 'fashion_mnist' is
    assert dataset_info(trained_dataset({'pretrained_cfg': {'tag': 'cifar100_folder'}})).tag == 'cifar100_folder'


def test_a_split_cifar_lacks_is_named_not_read_as_its_test_batch(tmp_path):
    """timm reads any split name but 'train' / 'training' as CIFAR's test batch: --val-split foo evaluated the test
    batch and recorded "foo". It is refused as the other fixed-split datasets refuse it, before any file is read."""
    from sa_vision.errors import DatasetError
    from sa_vision.train.data import check_dataset
    for dataset in ('torch/cifar10', 'torch/cifar100'):
        with pytest.raises(DatasetError, match=f"{dataset} has the splits 'train' and 'test'.*got 'foo'"):
            check_dataset(dataset, str(tmp_path), download=True, eval_split='foo')
    check_dataset('torch/cifar10', str(tmp_path), download=True, train_split='training', eval_split='val')


def test_cifar_files_that_fail_torchvisions_md5_are_said_to_and_missing_ones_named(tmp_path):
    """Every file there but of other contents (a download cut short): torchvision says "not found or corrupted";
    the error says which, and what to do (it said the dataset was not there)."""
    from sa_vision.errors import DatasetError, DatasetNotFoundError
    from sa_vision.train.data import create_image_dataset
    batches = tmp_path / 'cifar-10-batches-py'
    batches.mkdir()
    for name in ('test_batch', 'batches.meta'):
        (batches / name).write_bytes(b'cut short')
    with pytest.raises(DatasetError, match=r"files in .*cifar-10-batches-py fail torchvision's MD5 check .* delete"):
        create_image_dataset('torch/cifar10', 'test', is_training=False, data_dir=str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match='has no data_batch_1'):
        create_image_dataset('torch/cifar10', 'train', is_training=True, data_dir=str(tmp_path))


def test_weights_of_no_dataset_are_an_unnamed_image_folder_tagged_unknown():
    """What an export says of weights that name no dataset: an image folder of no name in all but its tag
    ('unknown', not 'folder': such weights were trained on nothing known) and its title."""
    from dataclasses import replace

    from sa_vision.train.data import UNKNOWN_DATASET, trained_dataset
    assert (UNKNOWN_DATASET.tag, UNKNOWN_DATASET.title) == ('unknown', 'an unknown dataset')
    assert dataset_info('').tag == 'folder' and UNKNOWN_DATASET.is_image_folder
    assert UNKNOWN_DATASET == replace(dataset_info(''), tag='unknown', title='an unknown dataset')
    assert trained_dataset({'pretrained_cfg': {'tag': UNKNOWN_DATASET.tag}}) is None
