""" A user's own image folder: its classes are those timm's reader labels (natural, case-blind order; only folders
that hold images), every split is labelled as the training split's classes (a validation split may lack one, not
have another), stray images are named before anything is built, and a folder's name never reads back as a known
dataset's (its export would go to that dataset's repository) """
import json

import pytest
import timm
import torch
from helpers import command_here, run_result, train_here
from PIL import Image

from sa_vision.errors import DatasetError
from sa_vision.train.checkpoint import Checkpoint
from sa_vision.train.data import create_image_dataset, dataset_for_tag, dataset_info, image_folder_classes

TINY = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32']
COLOURS = {'a': (220, 30, 30), 'b': (30, 220, 30), 'c': (30, 30, 220)}


def _folder(root, splits):
    """``{split: {class: count}}`` of 8x8 PNGs, each class a colour of its own (COLOURS, else grey)."""
    for split, classes in splits.items():
        for name, count in classes.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.new('RGB', (8, 8), COLOURS.get(name, (128, 128, 128))).save(root / split / name / f'{i}.png')
    return root


def test_the_classes_are_those_timm_labels_in_its_order(tmp_path):
    """c1, c2, c10 in natural order and B among a, c regardless of case, as timm's reader numbers them; a folder
    without images (empty, or hidden with a .DS_Store) is no class."""
    root = _folder(tmp_path, {'train': {'c10': 1, 'c2': 1, 'c1': 1, 'B': 1, 'a': 1, 'c': 1}})
    (root / 'train' / 'empty').mkdir()
    (root / 'train' / '.ipynb_checkpoints').mkdir()
    (root / 'train' / '.ipynb_checkpoints' / '.DS_Store').write_bytes(b'\0')
    (root / 'train' / 'notes.txt').write_text('not an image')
    classes = image_folder_classes('', str(root), 'train')
    assert classes == ['a', 'B', 'c', 'c1', 'c2', 'c10']
    reader = timm.data.create_dataset('', root=str(root / 'train'), split='train').reader  # what training reads
    assert classes == sorted(reader.class_to_idx, key=reader.class_to_idx.get)


def test_images_beside_the_class_folders_are_named_before_anything_is_built(tmp_path, caplog, capsys):
    root = _folder(tmp_path / 'data', {'train': {'a': 2, 'b': 2}, 'validation': {'a': 1, 'b': 1}})
    Image.new('RGB', (8, 8)).save(root / 'train' / 'stray.png')
    status, log = train_here(caplog, capsys, '--dataset', '', '--data-dir', root, *TINY,
                             '--output', tmp_path / 'out', '--epochs', 1)
    assert status == 2 and log.strip().splitlines()[-1] == (
        f'error: {root / "train"} holds images beside its class folders (stray.png), which timm would label as a '
        f'class of their own: move them into the folder of their class'), log[-2000:]
    assert not (tmp_path / 'out').exists()


def test_a_split_without_images_is_named_before_anything_is_built(tmp_path, caplog, capsys):
    """Class folders of .webp files or none (timm reads .png, .jpg, .jpeg): timm's 'Found 0 images' ended training
    and validation in a traceback, after the model was built."""
    root = _folder(tmp_path / 'data', {'train': {'a': 2, 'b': 2}, 'validation': {'a': 0, 'b': 0}})
    (root / 'validation' / 'a' / '0.webp').write_bytes(b'RIFF')
    message = (f'error: {root / "validation"} holds no image timm reads (files ending in .jpeg, .jpg, .png, in a '
               f'subfolder per class: {root / "validation" / "<class>" / "<image>"}): put the images there, or name '
               f'the split that holds them')
    status, log = train_here(caplog, capsys, '--dataset', '', '--data-dir', root, *TINY,
                             '--output', tmp_path / 'out', '--epochs', 1)
    assert status == 2 and log.strip().splitlines()[-1] == message, log[-2000:]
    assert not (tmp_path / 'out').exists()
    status, out, err = command_here(capsys, 'validate', '--model', 'sa_quadratic_cifar', '--no-pretrained',
                                    '--dataset', '', '--data-dir', root, '--threads', 1)
    assert status == 2 and err.strip().splitlines()[-1] == message, err[-2000:]


def test_a_folder_of_git_lfs_pointers_is_named_before_anything_is_built(tmp_path, caplog, capsys):
    """A clone without git lfs holds text files named .png: timm skipped them one by one, then ended the first
    batch in a traceback ('Failed to load 10 consecutive samples'), the run folder already written."""
    root = _folder(tmp_path / 'data', {'train': {'a': 1}, 'validation': {'a': 1}})
    for path in (root / 'train' / 'a' / '0.png', root / 'validation' / 'a' / '0.png'):
        path.write_text('version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n')
    status, log = train_here(caplog, capsys, '--dataset', '', '--data-dir', root, *TINY,
                             '--output', tmp_path / 'out', '--epochs', 1)
    assert status == 2 and log.strip().splitlines()[-1].startswith(
        f'error: {root / "train" / "a" / "0.png"} is no image PIL reads ('), log[-2000:]
    assert 'a Git LFS pointer (git lfs pull fetches the images)' in log and not (tmp_path / 'out').exists()


def test_one_unreadable_image_among_readable_ones_is_left_to_timm_to_skip(tmp_path):
    """timm skips an image it cannot read (ten in a row end the run): one broken file, the first in sorted order,
    is no reason to refuse the folder; a folder of nothing readable (here a link to nothing) is one error line."""
    from sa_vision.train.data import check_dataset
    root = _folder(tmp_path / 'mixed', {'train': {'a': 3, 'b': 3}})
    (root / 'train' / 'a' / '0.png').write_bytes(b'\x89PNG broken')
    check_dataset('', str(root), train_split='train', eval_split='train')
    dangling = tmp_path / 'dangling' / 'train' / 'a'
    dangling.mkdir(parents=True)
    (dangling / '0.png').symlink_to(tmp_path / 'nothing.png')
    with pytest.raises(DatasetError, match=r"0.png is no image PIL reads \(.*No such file.*\); timm skips such"):
        check_dataset('', str(tmp_path / 'dangling'), train_split='train', eval_split='train')


def test_a_held_out_split_of_images_without_class_folders_is_refused(tmp_path):
    """Images straight in validation/, no class folder: timm labels them all as its one class '', label 0, and a
    model of classes a, b scored 0.00 % top-1 and 100 % top-5 on them, with exit status 0."""
    root = _folder(tmp_path, {'train': {'a': 2, 'b': 2}})
    (root / 'validation').mkdir()
    Image.new('RGB', (8, 8)).save(root / 'validation' / 'x.png')
    with pytest.raises(DatasetError, match='holds images beside its class folders'):
        create_image_dataset('', 'validation', is_training=False, data_dir=str(root), classes=['a', 'b'])


def test_a_split_lacking_a_class_is_labelled_as_the_training_split(tmp_path, caplog):
    """Validation without b: its c images are label 2, as in training (timm would number them 1); a validation
    class the model has no label for beside its own is an error naming it; a split of none of its classes is
    labelled by its own folders, as timm's validate.py labels any."""
    root = _folder(tmp_path, {'train': {'a': 1, 'b': 1, 'c': 1}, 'validation': {'a': 2, 'c': 2},
                              'test': {'a': 1, 'd': 1}, 'other': {'y': 1, 'x': 1}})
    for split, expected in (('validation', {'a': 0, 'c': 2}), ('other', {'x': 0, 'y': 1})):
        caplog.clear()
        ds = create_image_dataset('', split, is_training=False, data_dir=str(root), classes=['a', 'b', 'c'])
        assert {path.split('/')[-2]: target for path, target in ds.reader.samples} == expected
        assert ('has none of the classes the model has labels for (a, b, c)' in caplog.text) == (split == 'other')
    with pytest.raises(DatasetError, match=r"test has class folders the model has no label for \(d\): its labels "
                                           r"are the classes of the split it was trained on \(a, b, c\)"):
        create_image_dataset('', 'test', is_training=False, data_dir=str(root), classes=['a', 'b', 'c'])


def test_training_and_validation_score_a_split_lacking_a_class_by_the_models_labels(tmp_path, caplog, capsys):
    """The run's evaluation and sa-vision-validate of its export give the top-1 of the model's own predictions
    against the classes of the folders (computed here on the images), not against the split's own numbering."""
    root = _folder(tmp_path / 'data', {'train': {'a': 4, 'b': 4, 'c': 4}, 'validation': {'a': 2, 'c': 2}})
    status, log = train_here(caplog, capsys, '--dataset', '', '--data-dir', root, *TINY, '--epochs', 3, '-b', 4,
                             '--lr', 0.01, '--warmup-epochs', 0, '--output', tmp_path / 'out', '--experiment', 'run',
                             '--workers', 0, '--export')
    assert status == 0, log[-3000:]
    model = timm.create_model(f'local-dir:{tmp_path / "out" / "run" / "hub"}', pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
    images = [(name, transform(Image.open(path).convert('RGB')))
              for name in ('a', 'c') for path in sorted((root / 'validation' / name).iterdir())]
    with torch.no_grad():
        predicted = model(torch.stack([x for _, x in images])).argmax(1).tolist()
    top1 = 100 * sum(p == 'abc'.index(name) for p, (name, _) in zip(predicted, images)) / len(images)
    result = run_result(log)
    assert result['top1'] == pytest.approx(top1) and result['num_images'] == 4
    status, out, err = command_here(capsys, 'validate', '--model', f'local-dir:{tmp_path / "out" / "run" / "hub"}',
                                    '--data-dir', root, '--threads', 1)
    assert status == 0 and json.loads(out.strip().splitlines()[-1])['top1'] == pytest.approx(top1), err
    # the run's checkpoint finds its folder by itself, until the folder is moved: then the error names it
    status, out, err = command_here(capsys, 'validate', '--checkpoint', tmp_path / 'out' / 'run', '--threads', 1)
    assert status == 0 and json.loads(out.strip().splitlines()[-1])['top1'] == pytest.approx(top1), err
    root.rename(tmp_path / 'moved')
    status, out, err = command_here(capsys, 'validate', '--checkpoint', tmp_path / 'out' / 'run', '--threads', 1)
    assert status == 2 and f'trained on an image folder, {root}, which is not there any more: pass --data-dir' in \
        err, err


@pytest.mark.parametrize('name, tag, read_back', [
    ('cifar10-subset', 'cifar10_subset', 'cifar10_subset'),
    ('digits_v2', 'digits_v2', 'digits_v2'),
    ('Fashion MNIST', 'fashion_mnist_folder', 'fashion_mnist_folder'),  # its tag would be Fashion-MNIST's
    ('flowers', 'flowers', 'flowers'),
    ('unknown', 'unknown_folder', 'unknown_folder'),  # 'unknown' and 'folder' alone read back as no name
    ('imgs/fleurs été', 'fleurs_ete', 'fleurs_ete'),  # a Hub repository's name is ASCII letters, digits and _
    ('D:\\data\\pets', 'pets', 'pets'),  # a Windows path: its last folder
    ('花', 'folder', ''),  # no ASCII letter left: an unnamed image folder's tag
])
def test_an_image_folders_name_never_reads_back_as_a_known_dataset(name, tag, read_back):
    """Weights trained with --dataset <name> on an image folder: their export's tag reads back as that folder,
    never as CIFAR-10 (whose registered repository takes only CIFAR-10 weights of the paper's architecture)."""
    from sa_vision.hub.labels import weights_label
    assert dataset_info(name).tag == tag
    for exported in (tag, tag + '_custom'):
        assert dataset_for_tag(exported) == read_back
    label = weights_label(Checkpoint('sa_quadratic_cifar', {}, {}, 'x', 'sa_vision', {'dataset': name}))
    assert label.tag == tag and not label.is_reference
    # the known datasets' own tags still read back as them
    assert [dataset_for_tag(t) for t in ('cifar10', 'fashion_mnist_custom', 'digits')] == \
        ['torch/cifar10', 'fashion-mnist', 'digits']


def test_a_run_folder_named_for_a_dataset_path_is_one_folder_windows_accepts(tmp_path):
    """Without --experiment the run folder is named for the dataset: a path there (D:\\data\\pets on Windows,
    imgs/pets) gives one folder's name with none of the characters Windows refuses (a drive's colon)."""
    from types import SimpleNamespace

    from sa_vision.train.run_folder import run_folder
    for dataset in ('D:\\data\\pets', 'imgs/pets', 'C:/x?y'):
        args = SimpleNamespace(output=str(tmp_path), experiment=None, model='sa_quadratic_cifar', dataset=dataset)
        folder = run_folder(args, None)
        assert folder.parent == tmp_path and not set(folder.name) & set('\\/:*?"<>|'), folder


def test_a_run_of_an_earlier_version_keeps_its_labels(tmp_path, caplog, capsys):
    """A run before the fix recorded its classes sorted plainly (c1, c10, c2) while the model learned timm's labels
    (c1, c2, c10): sa-vision-validate and --resume read such a record in timm's order, so a model that classifies
    every image right still scores 100 % and trains on."""
    names = {'c1': (220, 30, 30), 'c10': (30, 220, 30), 'c2': (30, 30, 220)}
    for split in ('train', 'validation'):
        for name, colour in names.items():
            (tmp_path / 'data' / split / name).mkdir(parents=True)
            for i in range(4):
                Image.new('RGB', (8, 8), colour).save(tmp_path / 'data' / split / name / f'{i}.png')
    run = tmp_path / 'out' / 'run'
    status, log = train_here(caplog, capsys, '--dataset', '', '--data-dir', tmp_path / 'data', *TINY, '--epochs', 6,
                             '-b', 4, '--lr', 0.01, '--warmup-epochs', 0, '--output', tmp_path / 'out',
                             '--experiment', 'run', '--workers', 0)
    assert status == 0 and run_result(log)['top1'] \
        == 100.0, log[-3000:]  # one colour a class: learned in a few epochs
    ckpt = torch.load(run / 'last.pth.tar', weights_only=True)
    assert ckpt['args']['label_names'] == ['c1', 'c2', 'c10']
    ckpt['args']['label_names'] = ['c1', 'c10', 'c2']  # as the earlier version recorded them
    torch.save(ckpt, run / 'last.pth.tar')
    status, out, err = command_here(capsys, 'validate', '--checkpoint', run / 'last.pth.tar', '--threads', 1)
    assert status == 0 and json.loads(out.strip().splitlines()[-1])['top1'] == 100.0, err
    status, log = train_here(caplog, capsys, '--resume', run, '--epochs', 7)
    result = run_result(log)
    assert status == 0 and result['top1'] == 100.0, log[-3000:]


def test_weights_of_timm_train_py_label_a_folder_in_its_own_order(tmp_path, capsys):
    """timm's train.py records no label names: its weights of a folder of classes 'airplane' and 'truck' learned them
    as 0 and 1, the folder's order. The architecture's registered (CIFAR-10) names are no record of theirs: with
    them, 'truck' was label 9 of a 2-class model ("Target 9 is out of bounds")."""
    from test_timm_checkpoints import _timm_train_args
    from timm.utils import CheckpointSaver

    from sa_vision.train.data import image_folder_labels
    data = _folder(tmp_path / 'data', {'train': {'airplane': 2, 'truck': 2}, 'validation': {'airplane': 3, 'truck': 1}})
    args = _timm_train_args(tmp_path)
    args.dataset, args.data_dir, args.num_classes, args.model_ema = '', str(data), 2, False
    torch.manual_seed(0)
    model = timm.create_model(args.model, num_classes=2, **args.model_kwargs).eval()
    saver = CheckpointSaver(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), args=args,
                            checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path))
    saver.save_checkpoint(epoch=0, metric=0.)
    assert image_folder_labels(model, '') is None  # its names are the registered cfg's
    recorded = timm.create_model(args.model, num_classes=2, pretrained_cfg_overlay=dict(label_names=('x', 'y')),
                                 **args.model_kwargs)
    assert image_folder_labels(recorded, '') == ['x', 'y']
    # every image is the same grey: the model predicts one class for all, right for 3 airplanes (0) or 1 truck (1)
    dataset = create_image_dataset('', 'validation', is_training=False, data_dir=str(data))
    with torch.no_grad():
        predicted = model(dataset[0][0][None]).argmax(-1).item()
    expected = 75. if predicted == 0 else 25.
    status, out, err = command_here(capsys, 'validate', '--checkpoint', tmp_path / 'last.pth.tar', '--data-dir', data)
    assert status == 0, err
    assert json.loads(out.strip().splitlines()[-1])['top1'] == pytest.approx(expected)


@pytest.mark.parametrize('size_flag', [{'input_size': [3, 8, 8]}, {'img_size': 8}])
def test_weights_of_timm_train_py_are_fed_as_its_flags_fed_them(size_flag, tmp_path, capsys):
    """train.py --input-size (or --img-size), --mean and --std (one value for every channel) fed what the weights
    learned from: validate feeds an image folder so (it fed the architecture's 32x32 CIFAR-10 config), the loss
    computed here from the images' pixels."""
    from test_timm_checkpoints import _timm_train_args
    from timm.utils import CheckpointSaver
    data = _folder(tmp_path / 'data', {'train': {'a': 1, 'b': 1, 'c': 1}})
    pixels = torch.randint(0, 256, (4, 8, 8, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    for i, name in enumerate('aabc'):  # patterns: an input of another size would give other logits
        (data / 'validation' / name).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[i].numpy()).save(data / 'validation' / name / f'{i}.png')
    args = _timm_train_args(tmp_path)
    args.dataset, args.data_dir, args.num_classes, args.model_ema = '', str(data), 3, False
    args.mean, args.std = [0.2], [0.4]
    vars(args).update(size_flag)
    torch.manual_seed(0)
    model = timm.create_model(args.model, num_classes=3, **args.model_kwargs).eval()
    CheckpointSaver(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), args=args,
                    checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path)).save_checkpoint(epoch=0, metric=0.)
    with torch.no_grad():
        logits = model((pixels.permute(0, 3, 1, 2) / 255. - 0.2) / 0.4)
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 0, 1, 2])).item()
    status, out, err = command_here(capsys, 'validate', '--checkpoint', tmp_path / 'last.pth.tar', '--data-dir', data)
    assert status == 0, err
    assert json.loads(out.strip().splitlines()[-1])['loss'] == pytest.approx(expected, rel=1e-5)


def test_a_training_split_of_one_class_is_refused_before_anything_is_built(tmp_path, caplog, capsys):
    """One class folder: the loss is 0 from the first step, nothing trains, and the card advertised 100 % top-1
    (timm's train.py does the same)."""
    root = _folder(tmp_path / 'data', {'train': {'a': 2}, 'validation': {'a': 1}})
    status, log = train_here(caplog, capsys, '--dataset', '', '--data-dir', root, *TINY,
                             '--output', tmp_path / 'out', '--epochs', 1)
    assert status == 2 and log.strip().splitlines()[-1] == (
        f"error: the training split of the image folder {root} has one class folder ('a'): a classifier needs two "
        f"or more, each class's images in a folder of its own (<split>/<class>/<image>)"), log[-2000:]
    assert not (tmp_path / 'out').exists()
