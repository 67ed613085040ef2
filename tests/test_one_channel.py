""" Weights of one input channel (``in_chans=1``, which timm's train.py trains with ``--in-chans 1``): evaluated,
explored and exported as timm does it. The reference is timm's own: its ``validate.py`` data path (images opened
grey, ``input_img_mode='L'``; the prefetcher's mean / std adapted to one channel) and its ``save_for_hf`` """
import argparse
import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file
from timm.models import save_for_hf
from timm.utils import CheckpointSaver

import sa_vision  # noqa: F401  (registers the models)
from sa_vision.research.explorer import explorer_data, resolve_explorer_model
from tests.helpers import command_here

SMALL = dict(embed_dim=16, depth=1, heads_per_layer=4, mlp_hidden_dim=32)
CLASSES = 4


@pytest.fixture(scope='module')
def images(tmp_path_factory):
    """An image folder of 4 classes: grey and RGB PNGs, one of another size (resized, as timm resizes it)."""
    root = tmp_path_factory.mktemp('images')
    rng = np.random.default_rng(0)
    for split, count in (('train', 2), ('validation', 3)):
        for c in range(CLASSES):
            folder = root / split / f'class{c}'
            folder.mkdir(parents=True)
            for i in range(count):
                size = 36 if i == 2 else 32
                shape, mode = ((size, size), 'L') if i % 2 else ((size, size, 3), 'RGB')
                Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(folder / f'{i}.png')
    return root


def _grey_model(seed=0, **kwargs):
    torch.manual_seed(seed)
    model = timm.create_model('sa_quadratic_cifar', in_chans=1, num_classes=CLASSES, **SMALL, **kwargs)
    with torch.no_grad():  # a head of zeros would predict class 0 whatever the input
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def _timm_logits(model, folder, data_config):
    """Logits of ``model`` on ``folder``'s validation images as timm's validate.py computes them: opened grey for a
    1-channel input, through timm's eval loader and its prefetcher (which adapts a 3-value mean / std)."""
    dataset = timm.data.create_dataset('', root=str(folder / 'validation'), split='validation',
                                       input_img_mode='L' if data_config['input_size'][0] == 1 else 'RGB')
    loader = timm.data.create_loader(dataset, data_config['input_size'], batch_size=8, use_prefetcher=True,
                                     interpolation=data_config['interpolation'], mean=data_config['mean'],
                                     std=data_config['std'], crop_pct=data_config['crop_pct'],
                                     crop_mode=data_config['crop_mode'], num_workers=0, device=torch.device('cpu'))
    with torch.no_grad():
        batches = [(model(x), y) for x, y in loader]
    return torch.cat([lo for lo, _ in batches]), torch.cat([y for _, y in batches])


def _validated(capsys, *args):
    status, out, err = command_here(capsys, 'validate', *args, '--threads', '1')
    assert status == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _agrees_with(result, logits, targets):
    """sa-vision-validate's result is that of ``logits``: the same top-1 image by image (else the count would differ
    too) and the same loss, to float32 rounding."""
    assert result['num_images'] == len(targets)
    assert result['top1'] == pytest.approx(100. * (logits.argmax(-1) == targets).float().mean().item())
    assert result['loss'] == pytest.approx(torch.nn.functional.cross_entropy(logits, targets).item(), abs=1e-5)


@pytest.fixture(scope='module')
def timm_run(tmp_path_factory, images):
    """The checkpoint timm's train.py writes of a run with --in-chans 1 --input-size 1 32 32 on the image folder."""
    run_dir = tmp_path_factory.mktemp('timm_run')
    args = argparse.Namespace(
        data_dir=str(images), dataset='', train_split='train', val_split='validation', model='sa_quadratic_cifar',
        pretrained=False, initial_checkpoint='', resume='', num_classes=CLASSES, gp=None, img_size=None, in_chans=1,
        input_size=[1, 32, 32], crop_pct=None, mean=None, std=None, interpolation='', batch_size=8,
        model_kwargs=dict(SMALL), drop=0.0, opt='sgd', lr=0.1, momentum=0.9, weight_decay=1e-4, sched='cosine',
        epochs=1, model_ema=False, amp=False, seed=42, output=str(run_dir), experiment='', device='cpu',
        world_size=1, rank=0, local_rank=0, distributed=False, prefetcher=True, torchcompile=None)
    model = _grey_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    saver = CheckpointSaver(model=model, optimizer=optimizer, args=args, checkpoint_dir=str(run_dir),
                            recovery_dir=str(run_dir), decreasing=False)
    saver.save_checkpoint(epoch=0, metric=25.)
    # what timm's validate.py resolves from the run's arguments: the registered cfg's CIFAR-10 mean / std (3 values),
    # which its prefetcher averages for the one channel
    data_config = timm.data.resolve_data_config(vars(args), model=model)
    assert data_config['input_size'] == (1, 32, 32) and len(data_config['mean']) == 3
    return run_dir / 'last.pth.tar', model, data_config


def test_a_timm_run_of_one_channel_is_validated_as_timms_validate_py_does(timm_run, images, capsys):
    checkpoint, model, data_config = timm_run
    _agrees_with(_validated(capsys, '--checkpoint', checkpoint, '--data-dir', images),
                 *_timm_logits(model, images, data_config))


def test_a_timm_run_of_one_channel_exports_as_timms_save_for_hf_and_loads_as_it_was(timm_run, images, tmp_path,
                                                                                    capsys):
    checkpoint, model, data_config = timm_run
    out = tmp_path / 'hub'
    status, _, err = command_here(capsys, 'push_to_hub', checkpoint, '--out-dir', out, '--dry-run', '--no-figure')
    assert status == 0, err
    exported = json.loads((out / 'config.json').read_text())['pretrained_cfg']
    # timm's own export of the model: input_size of its channels, mean / std averaged to one value
    save_for_hf(model, tmp_path / 'timm')
    by_timm = json.loads((tmp_path / 'timm' / 'config.json').read_text())['pretrained_cfg']
    assert exported['input_size'] == by_timm['input_size'] == [1, 32, 32]
    assert exported['mean'] == pytest.approx(by_timm['mean']) and len(exported['mean']) == 1
    assert exported['std'] == pytest.approx(by_timm['std']) and len(exported['std']) == 1
    # loaded back by timm with its own data config: the logits timm's validate.py had of the run's checkpoint
    reloaded = timm.create_model(f'local-dir:{out}', pretrained=True).eval()
    logits, targets = _timm_logits(reloaded, images, timm.data.resolve_data_config({}, model=reloaded))
    expected, _ = _timm_logits(model, images, data_config)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    _agrees_with(_validated(capsys, '--model', f'local-dir:{out}', '--data-dir', images), logits, targets)
    card = (out / 'README.md').read_text()  # timm's validate.py builds 3 channels unless told
    assert ".convert('L')" in card and '--model <the name above> --in-chans 1`' in card


def test_bare_weights_of_one_channel_are_validated_explored_and_exported(images, tmp_path, capsys):
    """Weights that name neither dataset nor preprocessing: the registered cfg's, as timm adapts it."""
    model = _grey_model(seed=1)
    bare = tmp_path / 'grey.safetensors'
    save_file(model.state_dict(), bare)
    data_config = timm.data.resolve_data_config({'in_chans': 1, 'input_size': (1, 32, 32)}, model=model)
    logits, targets = _timm_logits(model, images, data_config)
    _agrees_with(_validated(capsys, '--checkpoint', bare, '--dataset', '', '--data-dir', images), logits, targets)
    data = explorer_data([resolve_explorer_model(bare)], dataset='', data_dir=str(images), num_images=12)
    shown = [top[0][0] for top in data['models'][0]['predictions']]
    assert shown == logits.argmax(-1)[data['images']['indices']].tolist()
    out = tmp_path / 'hub'
    status, _, err = command_here(capsys, 'push_to_hub', bare, '--out-dir', out, '--dry-run', '--no-figure')
    assert status == 0, err
    save_for_hf(model, tmp_path / 'timm')
    exported, by_timm = (json.loads((folder / 'config.json').read_text())['pretrained_cfg']
                         for folder in (out, tmp_path / 'timm'))
    assert exported['input_size'] == by_timm['input_size'] == [1, 32, 32]
    assert (exported['mean'], exported['std']) == pytest.approx((by_timm['mean'], by_timm['std']))


def test_a_grey_dataset_feeds_a_one_channel_model_its_grey(tmp_path, capsys):
    """digits, held as 3 equal channels: a 1-channel model gets the one, normalised with the dataset's mean / std
    as timm adapts 3 values to 1 (their average)."""
    pytest.importorskip('sklearn')
    from sa_vision.paper import CIFAR10_MEAN, CIFAR10_STD
    from sa_vision.train.datasets import DigitsDataset
    torch.manual_seed(0)
    model = timm.create_model('sa_quadratic_cifar', in_chans=1, **SMALL).eval()
    bare = tmp_path / 'grey.safetensors'
    save_file(model.state_dict(), bare)
    test = DigitsDataset('test')
    mean, std = sum(CIFAR10_MEAN) / 3, sum(CIFAR10_STD) / 3
    with torch.no_grad():
        logits = model((test.images[:, :1] - mean) / std)
    _agrees_with(_validated(capsys, '--checkpoint', bare, '--dataset', 'digits', '-b', '360'), logits, test.targets)


def test_weights_of_another_channel_count_are_refused_in_one_line(tmp_path, capsys):
    torch.manual_seed(0)
    bare = tmp_path / 'two.safetensors'
    save_file(timm.create_model('resnet18_cifar', in_chans=2).state_dict(), bare)
    status, _, err = command_here(capsys, 'validate', '--checkpoint', bare, '--model', 'resnet18_cifar',
                                  '--model-kwargs', 'in_chans=2', '--dataset', 'digits', '--threads', '1')
    assert status == 2 and err.count('\n') == 1
    assert 'images of 3 channels (RGB) or 1 (grey), not 2' in err
