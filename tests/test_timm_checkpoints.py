""" Checkpoints written by timm's own train.py (timm.utils.CheckpointSaver) validate, export and stage """
import argparse
import json
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip('sklearn')

import timm  # noqa: E402
from timm.utils import CheckpointSaver, NativeScaler  # noqa: E402
from timm.utils.model_ema import ModelEmaV3  # noqa: E402

import sa_vision  # noqa: E402,F401
from sa_vision.cli import push_to_hub, validate  # noqa: E402
from sa_vision.paper import CIFAR10_MEAN, CIFAR10_STD  # noqa: E402
from sa_vision.train.checkpoint import CheckpointError, read_checkpoint  # noqa: E402
from sa_vision.train.datasets import DigitsDataset  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

MODEL_KWARGS = dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32)


def _timm_train_args(run_dir: Path) -> argparse.Namespace:
    """The args of timm train.py as it pickles them (a subset of its ~150 fields, with its runtime fields)."""
    return argparse.Namespace(
        data_dir=str(run_dir / 'data'), dataset='digits', train_split='train', val_split='validation',
        model='sa_quadratic_cifar', pretrained=False, initial_checkpoint='', resume='', no_resume_opt=False,
        num_classes=12, gp=None, img_size=None, in_chans=None, input_size=None, crop_pct=None, mean=None, std=None,
        interpolation='', batch_size=32, validation_batch_size=None, model_kwargs=dict(MODEL_KWARGS),
        drop=0.0, drop_path=None, drop_block=None, bn_momentum=None, bn_eps=None, opt='sgd', lr=0.1,
        momentum=0.9, weight_decay=1e-4, sched='cosine', epochs=2, model_ema=True, model_ema_decay=0.5,
        amp=False, amp_dtype='float16', eval_metric='top1', seed=42, workers=4, pin_mem=False,
        output=str(run_dir), experiment='', checkpoint_hist=10, log_interval=50, device='cuda:0',
        world_size=1, rank=0, local_rank=0, distributed=False, prefetcher=True, torchcompile=None,
    )


def _accuracy(model, num_classes_seen=10):
    """Top-1 on the digits test split, computed directly (independent of sa_vision.train.evaluation)."""
    test = DigitsDataset('test')
    mean, std = torch.tensor(CIFAR10_MEAN)[:, None, None], torch.tensor(CIFAR10_STD)[:, None, None]
    with torch.no_grad():
        predicted = model.eval()((test.images - mean) / std).argmax(-1)
    return 100. * (predicted == test.targets).float().mean().item()


@pytest.fixture(scope='module')
def timm_run(tmp_path_factory):
    """A model, its EMA and the checkpoint files timm's train.py would write after epoch 0."""
    run_dir = tmp_path_factory.mktemp('timm_run')
    args = _timm_train_args(run_dir)
    torch.manual_seed(0)
    model = timm.create_model(args.model, num_classes=args.num_classes, drop_rate=args.drop, **args.model_kwargs)
    ema = ModelEmaV3(model, decay=args.model_ema_decay)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    train = DigitsDataset('train')
    for step in range(3):  # a few steps, so that the model and its EMA differ
        images, targets = train.images[step * 32:(step + 1) * 32], train.targets[step * 32:(step + 1) * 32]
        loss = torch.nn.functional.cross_entropy(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.update(model, step=step)
    saver = CheckpointSaver(model=model, optimizer=optimizer, args=args, model_ema=ema, amp_scaler=NativeScaler(),
                            checkpoint_dir=str(run_dir), recovery_dir=str(run_dir), decreasing=False)
    saver.save_checkpoint(epoch=0, metric=_accuracy(model))
    return run_dir, model, ema.module


def test_saver_wrote_the_files_timm_train_writes(timm_run):
    run_dir, _, _ = timm_run
    assert {'checkpoint-0.pth.tar', 'last.pth.tar', 'model_best.pth.tar'} <= {p.name for p in run_dir.iterdir()}
    with pytest.raises(Exception, match='Namespace'):  # plain weights_only refuses timm's args
        torch.load(run_dir / 'last.pth.tar', weights_only=True)


@pytest.mark.parametrize('name', ['checkpoint-0.pth.tar', 'last.pth.tar', 'model_best.pth.tar'])
def test_timm_checkpoint_opens_with_its_model_and_arguments(timm_run, name):
    run_dir, model, _ = timm_run
    ckpt = read_checkpoint(run_dir / name)
    assert ckpt.format == 'timm' and ckpt.arch == 'sa_quadratic_cifar'
    assert ckpt.model_args == {**MODEL_KWARGS, 'num_classes': 12, 'drop_rate': 0.0}
    loaded = ckpt.create_model()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert 'data_dir' not in ckpt.meta['recipe'] and 'device' not in ckpt.meta['recipe']


@pytest.mark.parametrize('flag', ['--checkpoint', '--model'])  # --model: weights named by their path
@pytest.mark.parametrize('use_ema', [False, True])
def test_validate_script_evaluates_a_timm_checkpoint(timm_run, capsys, use_ema, flag):
    run_dir, model, ema_model = timm_run
    argv = [flag, str(run_dir / 'last.pth.tar'), '--dataset', 'digits', '-j', '0']
    assert validate.main(argv + (['--use-ema'] if use_ema else [])) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result['num_images'] == 360
    assert result['top1'] == pytest.approx(_accuracy(ema_model if use_ema else model), abs=1e-6)


def test_a_timm_fine_tune_of_a_local_dir_folder_opens_as_that_folders_model(tmp_path):
    """train.py --model local-dir:<kept folder> records that name as its arch: the checkpoint opens as the folder's
    architecture and arguments (its border inside), fed the folder's input size and mean / std under the run's own
    flags, without the folder's label names (the fine-tune may be of other classes); a folder gone is one error."""
    kept = Path(__file__).resolve().parent.parent / 'zoo' / 'fashion-mnist-cpu' / 'sa_quadratic_cifar'
    folder = tmp_path / 'kept'
    folder.mkdir()
    for name in ('config.json', 'model.safetensors'):
        (folder / name).write_bytes((kept / name).read_bytes())
    model = timm.create_model(f'local-dir:{folder}', pretrained=True).eval()
    args = _timm_train_args(tmp_path)
    args.model, args.dataset, args.model_kwargs, args.model_ema, args.num_classes = f'local-dir:{folder}', '', {}, \
        False, None
    args.std = [0.5]
    CheckpointSaver(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), args=args,
                    checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path)).save_checkpoint(epoch=0, metric=0.)
    ckpt = read_checkpoint(tmp_path / 'last.pth.tar')
    opened = ckpt.create_model()
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        assert torch.equal(opened(x), model(x))
    assert ckpt.arch == 'sa_quadratic_cifar' and ckpt.model_args['input_padding'] == 2
    assert ckpt.preprocessing == {'input_size': (3, 28, 28), 'mean': tuple(model.pretrained_cfg['mean']),
                                  'std': (0.5,)}
    assert 'label_names' not in ckpt.preprocessing
    for name in ('config.json', 'model.safetensors'):
        (folder / name).unlink()
    with pytest.raises(CheckpointError, match='whose config.json is gone: pass --model with its architecture'):
        read_checkpoint(tmp_path / 'last.pth.tar')


def test_ema_of_a_model_name_is_refused_not_ignored(capsys):
    """Without weights of timm's train.py there are no EMA weights: the plain ones' score would pass for them."""
    from sa_vision.errors import run_cli
    assert run_cli(validate.main, ['--model', 'sa_quadratic_cifar', '--no-pretrained', '--use-ema']) == 2
    assert 'the model sa_quadratic_cifar holds none: drop --use-ema' in capsys.readouterr().err


def test_ema_of_a_checkpoint_without_one_is_a_clear_error(tmp_path):
    model = timm.create_model('sa_quadratic_cifar', **MODEL_KWARGS)
    saver = CheckpointSaver(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                            args=_timm_train_args(tmp_path), checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path))
    saver.save_checkpoint(epoch=0, metric=1.0)
    with pytest.raises(CheckpointError, match="without 'state_dict_ema'.*--model-ema"):
        read_checkpoint(tmp_path / 'last.pth.tar', use_ema=True)


@pytest.mark.parametrize('keys', [('state_dict', 'state_dict_ema'), ('model', 'model_ema')])
def test_the_ema_of_another_trainers_dict_is_taken_as_timm_takes_it(tmp_path, keys):
    """A dict of plain and EMA weights that is no checkpoint of timm's train.py (another trainer's, e.g. DeiT's
    'model' / 'model_ema'): the weights read are those timm's load_state_dict takes, the EMA unless use_ema is
    False (None: as --initial-checkpoint takes them, as timm's load_checkpoint does by default)."""
    from timm.models import load_state_dict
    plain, ema = (timm.create_model('sa_quadratic_cifar', **MODEL_KWARGS).state_dict() for _ in range(2))
    assert not torch.equal(plain['head.weight'], ema['head.weight'])
    torch.save({keys[0]: plain, keys[1]: ema, 'epoch': 5}, tmp_path / 'trained.pth')
    for use_ema in (None, True, False):
        expected = load_state_dict(str(tmp_path / 'trained.pth'), use_ema=use_ema is not False)
        ckpt = read_checkpoint(tmp_path / 'trained.pth', use_ema=use_ema)
        assert ckpt.state_dict.keys() == expected.keys(), use_ema
        assert all(torch.equal(ckpt.state_dict[k], v) for k, v in expected.items()), use_ema
        assert bool(ckpt.meta.get('ema_weights')) == (use_ema is not False)
    torch.save({keys[0]: plain}, tmp_path / 'plain.pth')
    with pytest.raises(CheckpointError, match='without EMA weights.*drop --use-ema'):
        read_checkpoint(tmp_path / 'plain.pth', use_ema=True)


@pytest.mark.parametrize('with_ema', [True, False])
def test_an_initial_checkpoint_of_timm_starts_from_its_ema_as_timm_train_does(timm_run, tmp_path, with_ema):
    """timm's train.py --initial-checkpoint (create_model(checkpoint_path=) -> load_checkpoint(use_ema=True))
    starts from a --model-ema checkpoint's EMA, from the plain weights of one without; it started from the plain
    weights of either, and said nothing of what it loaded."""
    from sa_vision.train.state import load_initial_weights, parse_run_args, resolve_model_args
    run_dir, model, ema_model = timm_run
    path = run_dir / 'last.pth.tar'
    if not with_ema:
        path = tmp_path / 'last.pth.tar'
        CheckpointSaver(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        args=_timm_train_args(tmp_path), checkpoint_dir=str(tmp_path),
                        recovery_dir=str(tmp_path)).save_checkpoint(epoch=0, metric=0.)
    args = parse_run_args(['--model', 'sa_quadratic_cifar', '--dataset', 'digits', '--initial-checkpoint',
                           str(path)])[0]
    log = []
    initial, sources = resolve_model_args(args, {}, None, log.append)
    started = timm.create_model(args.model, **args.model_kwargs)
    load_initial_weights(started, initial, args, log.append, sources)
    expected = (ema_model if with_ema else model).state_dict()
    assert not all(torch.equal(value, ema_model.state_dict()[key]) for key, value in model.state_dict().items())
    for key, value in expected.items():
        assert torch.equal(started.state_dict()[key], value), key
    loaded = [line for line in log if line.startswith('Loaded ')]
    assert len(loaded) == 1 and str(path) in loaded[0] and ('state_dict_ema' in loaded[0]) == with_ema, log


def test_push_to_hub_stages_a_timm_checkpoint(timm_run, tmp_path, capsys):
    run_dir, model, _ = timm_run
    out = tmp_path / 'staged'
    assert push_to_hub.main([str(run_dir / 'model_best.pth.tar'), '--dry-run', '--out-dir', str(out),
                             '--no-figure']) == 0
    printed = capsys.readouterr().out
    assert 'sa_quadratic_cifar.digits_custom' in printed and 'nothing uploaded' in printed
    config = json.loads((out / 'config.json').read_text())
    assert config['architecture'] == 'sa_quadratic_cifar' and config['num_classes'] == 12
    recipe = yaml.safe_load((out / 'recipe.yaml').read_text())
    assert recipe['model'] == 'sa_quadratic_cifar' and recipe['model_kwargs'] == MODEL_KWARGS
    assert not {'data_dir', 'output', 'device', 'rank', 'world_size'} & set(recipe)
    assert 'timm `train.py`' in (out / 'README.md').read_text()
    reloaded = timm.create_model(f'local-dir:{out}', pretrained=True)
    for key, value in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value), key


def test_bare_state_dict_and_safetensors_open_with_their_architecture(tmp_path):
    from safetensors.torch import save_file
    model = timm.create_model('sa_gen_cifar', num_classes=7, **MODEL_KWARGS)
    torch.save({'model': model.state_dict()}, tmp_path / 'wrapped.pth')
    save_file(model.state_dict(), tmp_path / 'weights.safetensors')
    resnet = timm.create_model('resnet18_cifar', num_classes=3)
    torch.save(resnet.state_dict(), tmp_path / 'resnet.pth')
    for name, arch in (('wrapped.pth', 'sa_gen_cifar'), ('weights.safetensors', 'sa_gen_cifar'),
                       ('resnet.pth', 'resnet18_cifar')):
        ckpt = read_checkpoint(tmp_path / name)
        assert ckpt.arch == arch, name
        loaded = ckpt.create_model()
        source = model if arch == 'sa_gen_cifar' else resnet
        assert loaded.num_classes == source.num_classes
        assert all(torch.equal(loaded.state_dict()[k], v) for k, v in source.state_dict().items())
    with pytest.raises(CheckpointError, match='holds a sa_gen_cifar model .*, not sa_learned_cifar'):
        read_checkpoint(tmp_path / 'wrapped.pth', arch='sa_learned_cifar')
    torch.save({'epoch': 3, 'notes': 'x'}, tmp_path / 'empty.pth')
    with pytest.raises(CheckpointError, match='holds no weights'):
        read_checkpoint(tmp_path / 'empty.pth')


def test_checkpoint_of_a_newer_format_is_refused(tmp_path):
    from sa_vision.train.checkpoint import CHECKPOINT_VERSION
    model = timm.create_model('sa_quadratic_cifar', **MODEL_KWARGS)
    for version in (CHECKPOINT_VERSION, CHECKPOINT_VERSION + 1):
        torch.save({'version': version, 'arch': 'sa_quadratic_cifar', 'model_args': MODEL_KWARGS,
                    'state_dict': model.state_dict()}, tmp_path / f'v{version}.pth.tar')
    assert read_checkpoint(tmp_path / f'v{CHECKPOINT_VERSION}.pth.tar').format == 'sa_vision'
    with pytest.raises(CheckpointError, match=f'newer sa_vision .*version {CHECKPOINT_VERSION + 1}'):
        read_checkpoint(tmp_path / f'v{CHECKPOINT_VERSION + 1}.pth.tar')


@pytest.mark.parametrize('version, saved_epoch', [(2, 3), (3, 2)])
def test_a_checkpoint_of_either_epoch_count_reads_as_the_epochs_done(tmp_path, version, saved_epoch):
    """Up to version 2 'epoch' counted the epochs done; from 3 it is the last one done, from 0, as timm's
    CheckpointSaver writes it: both files saved after three epochs read as three."""
    model = timm.create_model('sa_quadratic_cifar', **MODEL_KWARGS)
    torch.save({'version': version, 'arch': 'sa_quadratic_cifar', 'model_args': MODEL_KWARGS, 'epoch': saved_epoch,
                'num_epochs': 5, 'state_dict': model.state_dict()}, tmp_path / 'last.pth.tar')
    assert read_checkpoint(tmp_path / 'last.pth.tar').meta['epoch'] == 3


def test_a_version_1_checkpoint_is_built_with_the_classes_its_arguments_name(tmp_path):
    """Version 1 (sa_vision's first trainer) kept only --model-kwargs as 'model_args' and built the model with
    --num-classes and the drop rates of its 'args' too: the file as it wrote it rebuilds the model it trained."""
    torch.manual_seed(0)
    trained = timm.create_model('sa_quadratic_cifar', num_classes=12, drop_path_rate=0.1, **MODEL_KWARGS).eval()
    args = {'model': 'sa_quadratic_cifar', 'model_kwargs': MODEL_KWARGS, 'num_classes': 12, 'drop': None,
            'drop_path': 0.1, 'dataset': 'digits', 'epochs': 2}
    torch.save({'version': 1, 'arch': 'sa_quadratic_cifar', 'model_args': dict(MODEL_KWARGS),
                'state_dict': trained.state_dict(), 'epoch': 2, 'args': args, 'dataset': 'digits'},
               tmp_path / 'last.pth.tar')
    ckpt = read_checkpoint(tmp_path / 'last.pth.tar')
    assert ckpt.model_args == {**MODEL_KWARGS, 'num_classes': 12, 'drop_path_rate': 0.1}
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(ckpt.create_model()(images), trained(images))


@pytest.mark.parametrize('force_cpu', [False, True])
def test_the_saved_score_belongs_to_the_weights_train_py_scored(tmp_path, force_cpu):
    """timm's train.py with --model-ema evaluates the EMA and saves its score as the checkpoint's ``metric``
    (with --model-ema-force-cpu it evaluates only the model): the score is read as the exported weights' only
    where they are the weights scored."""
    args = _timm_train_args(tmp_path)
    args.model_ema_force_cpu = force_cpu
    torch.manual_seed(0)
    model = timm.create_model(args.model, num_classes=args.num_classes, **args.model_kwargs)
    ema = ModelEmaV3(model, decay=args.model_ema_decay)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    scored = model if force_cpu else ema.module  # what train.py's validate() ran on last
    saver = CheckpointSaver(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), args=args,
                            model_ema=ema, checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path), decreasing=False)
    saver.save_checkpoint(epoch=0, metric=_accuracy(scored))
    for use_ema, weights in ((False, model), (True, ema.module)):
        meta = read_checkpoint(tmp_path / 'last.pth.tar', use_ema=use_ema).meta
        if weights is scored:
            assert meta['metrics'] == {'top1': pytest.approx(_accuracy(weights), abs=1e-6)}
        else:
            assert 'metrics' not in meta, (use_ema, meta.get('metrics'))


@pytest.mark.parametrize('use_ema', [False, True])
def test_the_card_of_a_timm_checkpoint_names_its_epoch_and_weights(timm_run, tmp_path, use_ema):
    """timm's train.py passes its 0-based loop index to CheckpointSaver: the fixture's checkpoint, saved after the
    first of 2 epochs as epoch 0, is 'after epoch 1 of 2'. With --model-ema the saved score is the EMA's: it is
    the card's number (model-index, picked by it, so optimistic) only for the EMA weights, and the card of the
    model's own weights says whose score it is instead."""
    run_dir, _, _ = timm_run
    with torch.serialization.safe_globals([argparse.Namespace]):  # train.py pickles its args as a Namespace
        saved = torch.load(run_dir / 'model_best.pth.tar', map_location='cpu', weights_only=True)
    assert saved['epoch'] == 0 and saved['args'].epochs == 2 and saved['args'].model_ema
    argv = [str(run_dir / 'model_best.pth.tar'), '--dry-run', '--out-dir', str(tmp_path / 'hub'), '--no-figure']
    assert push_to_hub.main(argv + (['--use-ema'] if use_ema else [])) == 0
    card = (tmp_path / 'hub' / 'README.md').read_text()
    front = yaml.safe_load(card.split('---\n')[1])
    training = card.split('## Training summary')[1]
    assert 'after epoch 1 of 2' in training and '2 epochs' in training and 'after epoch 0' not in training
    assert 'the best by' in training and 'model_best.pth.tar' in training
    if use_ema:
        assert 'the EMA of the weights' in training
        assert front['model-index'][0]['results'][0]['metrics'][0]['value'] == round(saved['metric'], 2)
        assert 'so the accuracy is optimistic' in card
    else:
        assert 'the weights themselves, not their EMA' in training
        assert 'model-index' not in front and 'optimistic' not in card
        assert f'recorded top1 {saved["metric"]:.4g} for the EMA of the weights, not for these' in training


@pytest.mark.parametrize('schedule, epochs', [
    (dict(sched='cosine', cooldown_epochs=1), 3),  # a cycle schedule adds the cooldown
    (dict(sched='step', cooldown_epochs=1, decay_epochs=1), 2),  # others do not
    (dict(sched='cosine', warmup_epochs=1, warmup_prefix=True), 3),  # --warmup-prefix adds the warmup
    (dict(sched='cosine', warmup_epochs=1), 2)])
def test_the_epochs_of_a_timm_run_are_those_its_scheduler_trains(tmp_path, schedule, epochs):
    """A timm train.py checkpoint keeps no epoch count: the record's is what train.py's create_scheduler_v2 returns
    for the run's arguments (--epochs 2 with the schedule's cooldown and warmup)."""
    from timm.scheduler import create_scheduler_v2, scheduler_kwargs

    from sa_vision.hub.record import training_record
    args = _timm_train_args(tmp_path)
    vars(args).update(schedule)
    model = timm.create_model(args.model, num_classes=args.num_classes, **args.model_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    assert create_scheduler_v2(optimizer, **scheduler_kwargs(args), updates_per_epoch=10)[1] == epochs
    CheckpointSaver(model=model, optimizer=optimizer, args=args, checkpoint_dir=str(tmp_path),
                    recovery_dir=str(tmp_path)).save_checkpoint(epoch=0, metric=0.)
    assert training_record(read_checkpoint(tmp_path / 'last.pth.tar')).num_epochs == epochs


def test_a_checkpoint_of_another_script_without_a_schedule_still_opens(tmp_path):
    """timm's checkpoint layout with arguments of another script (no --sched): it opens, and its record counts the
    epochs its arguments name, not timm's default schedule of 100."""
    import argparse

    from sa_vision.hub.record import training_record
    model = timm.create_model('sa_quadratic_cifar', **MODEL_KWARGS)
    args = argparse.Namespace(model='sa_quadratic_cifar', epochs=3, model_kwargs=MODEL_KWARGS, num_classes=10)
    torch.save({'epoch': 2, 'arch': 'sa_quadratic_cifar', 'state_dict': model.state_dict(), 'args': args},
               tmp_path / 'ck.pth.tar')
    ckpt = read_checkpoint(tmp_path / 'ck.pth.tar')
    assert training_record(ckpt).num_epochs == 3
    for key, value in model.state_dict().items():
        assert torch.equal(ckpt.state_dict[key], value), key
