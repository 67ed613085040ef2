""" Loading weights (sa_vision.train.checkpoint): every source gives its own weights, and a broken one a CheckpointError
that names the file and what is wrong """

import json
import re
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models._hub import save_for_hf

import sa_vision  # noqa: F401  (registers the models)
from sa_vision.models import SA_MODEL_ARGS, infer_cifar_resnet_args, infer_sa_model_args
from sa_vision.train.checkpoint import Checkpoint, CheckpointError, load_model, read_checkpoint

SMALL = dict(embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=24, num_classes=7)
KEPT_FOLDER = Path(__file__).resolve().parent.parent / 'zoo' / 'fashion-mnist-cpu' / 'sa_gen_cifar'


def _assert_same_weights(model, expected):
    state = model.state_dict()
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(state[key], value), key


def _hub_folder(tmp_path, name='sa_gen_cifar', **kwargs):
    torch.manual_seed(3)
    model = timm.create_model(name, **kwargs)
    folder = tmp_path / 'hub'
    save_for_hf(model, str(folder), model_args=kwargs, safe_serialization=True)
    return folder, model.state_dict()


def test_local_dir_name_loads_the_folder_weights(tmp_path):
    """load_model('local-dir:<folder>') is the folder's model, not a random one (what sa-vision-prune prunes)."""
    folder, expected = _hub_folder(tmp_path, **SMALL)
    _assert_same_weights(load_model(f'local-dir:{folder}'), expected)
    _assert_same_weights(load_model(str(folder)), expected)
    with pytest.raises(CheckpointError, match='not a folder'):
        load_model(f'local-dir:{tmp_path / "missing"}')


def test_unknown_name_is_a_checkpoint_error():
    with pytest.raises(CheckpointError, match="'no_such_model' is neither a file"):
        load_model('no_such_model')


def test_non_sa_timm_weights_load_into_the_named_timm_model(tmp_path):
    """A ViT state dict has patch_embed.proj.weight like ours, but its architecture is not read off its shapes."""
    torch.manual_seed(0)
    vit = timm.create_model('vit_tiny_patch16_224', num_classes=5, depth=2, img_size=32)
    path = tmp_path / 'vit.pth'
    torch.save(vit.state_dict(), path)
    ckpt = read_checkpoint(path, arch='vit_tiny_patch16_224', model_args=dict(depth=2, img_size=32))
    assert ckpt.arch == 'vit_tiny_patch16_224' and ckpt.model_args['num_classes'] == 5  # read off 'head.weight'
    _assert_same_weights(ckpt.create_model(), vit.state_dict())
    with pytest.raises(CheckpointError, match=r'pass the timm model name .*--model vit_tiny_patch16_224') as info:
        read_checkpoint(path)
    assert 'sa_gen_cifar' in str(info.value)  # the names read off the shapes


@pytest.mark.parametrize('model_args, match', [
    ('{"embed_dim": 16,', "metadata 'model_args' is not valid JSON"),
    ('[16, 2]', "metadata 'model_args' must be a JSON object"),
])
def test_safetensors_with_broken_metadata_is_a_checkpoint_error(tmp_path, model_args, match):
    model = timm.create_model('sa_gen_pruned', **dict(SMALL, heads_per_layer=(2, 1)))
    path = tmp_path / 'pruned.safetensors'
    save_file(model.state_dict(), str(path), metadata={'arch': 'sa_gen_pruned', 'model_args': model_args})
    with pytest.raises(CheckpointError, match=match) as info:
        read_checkpoint(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize('cfg, match', [('[1]', '"pretrained_cfg" must be an object'),
                                        ('{"label_names": [1, 2]}', '"label_names" must be a list of names')])
def test_safetensors_with_a_broken_pretrained_cfg_is_a_checkpoint_error(tmp_path, cfg, match):
    model = timm.create_model('sa_gen_cifar', **SMALL)
    path = tmp_path / 'pruned.safetensors'
    save_file(model.state_dict(), str(path), metadata={'arch': 'sa_gen_cifar', 'pretrained_cfg': cfg})
    with pytest.raises(CheckpointError, match=match) as info:
        read_checkpoint(path).create_model()
    assert str(path) in str(info.value)


@pytest.mark.parametrize('config, match', [
    ('{"architecture": "sa_gen_cifar", ', 'config.json is not valid JSON'),
    ('["sa_gen_cifar"]', 'must hold a JSON object'),
    ('{"architecture": "sa_gen_cifar", "model_args": [1]}', '"model_args" must be an object'),
    ('{"architecture": ["sa_gen_cifar"]}', '"architecture" must be a model name'),
    ('{"architecture": "sa_gen_cifar", "pretrained_cfg": [1]}', '"pretrained_cfg" must be an object'),
    ('{"architecture": "sa_gen_cifar", "pretrained_cfg": {"tag": 5}}', 'pretrained_cfg "tag" must be a name'),
    ('{"architecture": "sa_gen_cifar", "label_names": "abc"}', '"label_names" must be a list of names'),
    ('{"architecture": "sa_gen_cifar", "num_classes": "7"}', '"num_classes" must be a whole number'),
    ('{"architecture": "sa_gen_cifar", "pretrained_cfg": {"input_size": [3, 100000, 100000]}}',
     r'"input_size" must be three whole numbers \[channels, height, width\], each 1 to 8192, got \[3, 100000'),
    ('{"architecture": "sa_gen_cifar", "pretrained_cfg": {"std": [0.5, 0, 0.5]}}', '"std" must be a list of pos'),
])
def test_hub_folder_with_broken_config_is_a_checkpoint_error(tmp_path, config, match):
    folder, _ = _hub_folder(tmp_path, **SMALL)
    (folder / 'config.json').write_text(config)
    for source in (str(folder), f'local-dir:{folder}'):
        with pytest.raises(CheckpointError, match=match) as info:
            load_model(source)
        assert str(folder) in str(info.value)


@pytest.mark.parametrize('stored', [{'checkpoint_path': 'other.pth'}, {'pretrained': True},
                                    {'pretrained_cfg': {'file': 'other.pth'}}])
def test_weights_whose_stored_arguments_name_other_weights_are_refused(tmp_path, monkeypatch, stored):
    """Arguments stored with weights (a Hub folder's model_args, a file's metadata) build the model: one of timm's
    that loads weights from elsewhere (another file, the Hub) is refused before timm reads anything; the same
    keyword given by the caller is timm's to take."""
    import timm.models._builder
    import timm.models._factory

    from sa_vision.errors import UserError
    from sa_vision.models.factory import create_named_model
    torch.save(timm.create_model('sa_gen_cifar', **SMALL).state_dict(), tmp_path / 'other.pth')
    monkeypatch.chdir(tmp_path)
    read = []
    for module in (timm.models._factory, timm.models._builder):  # where timm loads a checkpoint_path / pretrained
        for name in ('load_checkpoint', 'load_pretrained'):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, lambda *a, _name=name, **k: read.append(_name))
    folder, state_dict = _hub_folder(tmp_path, **SMALL)
    config = json.loads((folder / 'config.json').read_text())
    config['model_args'].update(stored)
    (folder / 'config.json').write_text(json.dumps(config))
    file = tmp_path / 'weights.safetensors'
    save_file(state_dict, str(file), metadata={'arch': 'sa_gen_cifar', 'model_args': json.dumps({**SMALL, **stored})})
    for source in (f'local-dir:{folder}', str(file)):
        with pytest.raises(UserError, match=f'{next(iter(stored))}=.* says where to load weights from') as info:
            load_model(source)
        assert str(folder if 'local-dir' in source else file) in str(info.value)
    assert read == []
    if 'checkpoint_path' in stored:  # the spy sees what timm loads
        create_named_model('sa_gen_cifar', **SMALL, **stored)
        assert read == ['load_checkpoint']


@pytest.mark.parametrize('saved_args', [dict(depth=3), dict(embed_dim=20)])
def test_weights_that_do_not_fit_their_stored_arguments_name_what_differs(tmp_path, saved_args):
    """A checkpoint whose weights are not those of its model_args (edited, or saved by other code) names the first
    key that does not fit and how many do not, as the --initial-checkpoint error does: it showed only the header
    line of torch's error (the model's class name)."""
    saved = timm.create_model('sa_gen_cifar', **{**SMALL, **saved_args}).state_dict()
    path = tmp_path / 'w.pth'
    torch.save({'version': 3, 'arch': 'sa_gen_cifar', 'model_args': SMALL, 'state_dict': saved}, path)
    with pytest.raises(CheckpointError, match='do not fit sa_gen_cifar') as info:
        read_checkpoint(path).create_model()
    if 'depth' in saved_args:  # a third block the model has not
        extra = [k for k in saved if k.startswith('blocks.2.')]
        what, counts = f'unexpected key {extra[0]}', f'0 keys of another shape, 0 missing, {len(extra)} unexpected'
    else:  # every tensor of the embedding width (no other size is 20): not the heads' centres, nor fc1.bias
        wide = [k for k, v in saved.items() if 20 in v.shape]
        what = 'size mismatch for patch_embed.proj.weight: [20, 3, 2, 2] in the weights, [16, 3, 2, 2] in the model'
        counts = f'{len(wide)} keys of another shape, 0 missing, 0 unexpected'
    assert what in str(info.value) and f'({counts})' in str(info.value), str(info.value)


@pytest.mark.parametrize('wrap', [torch.nn.DataParallel, torch.compile,
                                  lambda model: torch.compile(torch.nn.DataParallel(model))],
                         ids=['module', '_orig_mod', '_orig_mod.module'])
def test_a_checkpoint_of_a_wrapped_model_loads_as_bare_weights_of_one_do(tmp_path, wrap):
    """A checkpoint {version, arch, model_args, state_dict} saved from a wrapped model (DDP / DataParallel's
    'module.', torch.compile's '_orig_mod.' keys) loads, as its bare state dict does and as timm's load_checkpoint
    takes it; it was refused as weights that do not fit."""
    torch.manual_seed(0)
    model = timm.create_model('sa_gen_cifar', **SMALL)
    saved = wrap(model).state_dict()
    assert set(saved) != set(model.state_dict())  # the wrapper's prefix
    path = tmp_path / 'w.pth'
    torch.save({'version': 3, 'arch': 'sa_gen_cifar', 'model_args': SMALL, 'state_dict': saved}, path)
    _assert_same_weights(read_checkpoint(path).create_model(), model.state_dict())


def test_validate_evaluates_the_weights_of_every_source(tmp_path, capsys):
    """sa-vision-validate's --model local-dir:, --checkpoint <folder> / <file> and --checkpoint with the expected
    --model all evaluate the same weights: the accuracy counted here, image by image, over the digits test split."""
    import json

    from sa_vision.cli import validate
    from sa_vision.paper import CIFAR10_MEAN, CIFAR10_STD
    from sa_vision.train.datasets import DigitsDataset
    folder, state_dict = _hub_folder(tmp_path, **dict(SMALL, num_classes=10))
    weights = tmp_path / 'weights.pth'
    torch.save(state_dict, weights)
    model = timm.create_model('sa_gen_cifar', **dict(SMALL, num_classes=10)).eval()
    model.load_state_dict(state_dict)
    test = DigitsDataset('test')
    mean, std = torch.tensor(CIFAR10_MEAN)[:, None, None], torch.tensor(CIFAR10_STD)[:, None, None]
    with torch.no_grad():
        predicted = model((test.images - mean) / std).argmax(-1)
    expected = 100. * (predicted == test.targets).float().mean().item()
    for source in (['--model', f'local-dir:{folder}'], ['--checkpoint', str(folder)], ['--checkpoint', str(weights)],
                   ['--checkpoint', str(weights), '--model', 'sa_gen_cifar']):
        assert validate.main([*source, '--dataset', 'digits', '--threads', '1', '-b', '360']) == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert result['num_images'] == len(test) and result['top1'] == pytest.approx(expected, abs=1e-6), source
    with pytest.raises(CheckpointError, match='holds a sa_gen_cifar model'):
        validate.main(['--checkpoint', str(weights), '--model', 'sa_quadratic_cifar', '--dataset', 'digits'])


# non-default values of every argument the weights' names and shapes carry, per family
SA_SHAPE_ARGS = dict(in_chans=1, num_classes=7, embed_dim=12, depth=2, heads_per_layer=(2, 3), mlp_hidden_dim=20)
RELATIVE_SHIFT_KINDS = ('learned', 'content')  # the kinds with tables of relative shifts, sized by max_rel_shift


@pytest.mark.parametrize('name', [*SA_MODEL_ARGS, 'resnet18_cifar'])
def test_the_model_arguments_are_read_back_off_the_weights(name, tmp_path):
    """Each registered family built with non-default arguments: the inference beside the model's key names
    recovers them, and bare weights read as a checkpoint rebuild the model that holds them."""
    if name == 'resnet18_cifar':
        given = dict(in_chans=1, num_classes=5)
        model = timm.create_model(name, **given)
        assert infer_cifar_resnet_args(model.state_dict()) == given
        assert infer_sa_model_args(model.state_dict()) is None
    else:
        kind = SA_MODEL_ARGS[name].get('attn_kind', 'quadratic')
        given = dict(SA_SHAPE_ARGS, **({'max_rel_shift': 4} if kind in RELATIVE_SHIFT_KINDS else {}))
        model = timm.create_model(name, **given)
        assert infer_sa_model_args(model.state_dict()) == dict(given, attn_kind=kind)
        assert infer_cifar_resnet_args(model.state_dict()) is None
    torch.save(model.state_dict(), tmp_path / 'weights.pth')
    rebuilt = read_checkpoint(tmp_path / 'weights.pth').create_model()  # strict load: every shape must fit
    assert type(rebuilt) is type(model)
    assert sum(p.numel() for p in rebuilt.parameters()) == sum(p.numel() for p in model.parameters())


def test_timms_own_resnet_weights_are_not_taken_for_the_cifar_resnet(tmp_path):
    """timm's ImageNet ResNet has the CIFAR ResNet's key names (conv1, fc) but a 7x7 stem: its bare weights are
    unnamed weights, which need --model, and open as timm's model when named."""
    torch.manual_seed(0)
    source = timm.create_model('resnet18', num_classes=10)
    assert source.conv1.kernel_size == (7, 7)
    assert infer_cifar_resnet_args(source.state_dict()) is None
    torch.save(source.state_dict(), tmp_path / 'resnet18.pth')
    with pytest.raises(CheckpointError, match='pass the timm model name they are of'):
        read_checkpoint(tmp_path / 'resnet18.pth')
    loaded = read_checkpoint(tmp_path / 'resnet18.pth', arch='resnet18').create_model()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in source.state_dict().items())


class _RunsCode:
    """A pickle that calls a function on load (harmless here: os.getcwd), as a malicious file would."""

    def __reduce__(self):
        import os
        return os.getcwd, ()


def test_a_refused_pickle_names_the_blocked_object_and_never_advises_unsafe_loading(tmp_path):
    """torch's own message advises re-running with weights_only=False, which would run the pickled call: the
    error passes on only the object torch blocked."""
    import os
    model = timm.create_model('sa_quadratic_cifar', **SMALL)
    torch.save({'state_dict': model.state_dict(), 'payload': _RunsCode()}, tmp_path / 'evil.pth.tar')
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(tmp_path / 'evil.pth.tar')
    message = str(refused.value)
    assert f'{os.getcwd.__module__}.{os.getcwd.__name__}' in message and 'run any code' in message, message
    assert 'weights_only' not in message and 'False' not in message and 'succeed' not in message, message


def test_a_file_that_is_no_checkpoint_is_called_unreadable_not_a_refused_pickle(tmp_path):
    """Text, or a cut checkpoint: torch's message for any file it cannot unpickle under weights_only names
    weights_only, which is no reason to call the file a refused Python object."""
    torch.save(timm.create_model('sa_quadratic_cifar', **SMALL).state_dict(), tmp_path / 'whole.pth')
    whole = (tmp_path / 'whole.pth').read_bytes()
    torch.save({'w': torch.ones(3)}, tmp_path / 'legacy.pth', _use_new_zipfile_serialization=False)
    legacy = (tmp_path / 'legacy.pth').read_bytes()
    (tmp_path / 'text.pth').write_text('x\n')
    (tmp_path / 'cut.pth').write_bytes(whole[:len(whole) // 2])
    (tmp_path / 'cut_legacy.pth').write_bytes(legacy[:len(legacy) // 2])
    for name in ('text.pth', 'cut.pth', 'cut_legacy.pth'):
        with pytest.raises(CheckpointError) as refused:
            read_checkpoint(tmp_path / name)
        message = str(refused.value)
        if name == 'text.pth':  # no file torch.save writes: not called corrupted, nor told to retrain
            assert message.startswith(f'{tmp_path / name} is not a PyTorch checkpoint (torch.save writes a zip '
                                      f'archive or a pickle; this file is neither): pass a checkpoint'), message
        else:
            assert message.startswith(f'{tmp_path / name} cannot be read (') and 'corrupted or truncated' in message
        assert 'pickled' not in message and 'weights_only' not in message, message


def test_changed_bytes_inside_a_tensor_are_refused_by_the_archives_checksum(tmp_path):
    """40 bytes of a weight zeroed (a faulty disk or copy): torch reads them as weights (the model then scored
    9.72 %, loss nan); in the pickle, they read as a refused Python object. The CRC-32 of the zip archive's entry
    names them. The whole file still loads."""
    import struct
    import zipfile
    torch.save({'state_dict': timm.create_model('sa_quadratic_cifar', **SMALL).state_dict()}, tmp_path / 'ok.pth.tar')
    read_checkpoint(tmp_path / 'ok.pth.tar')
    with zipfile.ZipFile(tmp_path / 'ok.pth.tar') as archive:
        entries = archive.infolist()
    largest_tensor = max((e for e in entries if '/data/' in e.filename), key=lambda e: e.file_size)
    pickle = next(e for e in entries if e.filename.endswith('data.pkl'))
    for entry in (largest_tensor, pickle):
        data = bytearray((tmp_path / 'ok.pth.tar').read_bytes())
        # its bytes start after its local header: 30 bytes, then its name and extra field, whose lengths end it
        name_length, extra_length = struct.unpack_from('<HH', data, entry.header_offset + 26)
        start = entry.header_offset + 30 + name_length + extra_length
        data[start + 64:start + 104] = bytes(40)
        (tmp_path / 'bad.pth.tar').write_bytes(data)
        with pytest.raises(CheckpointError, match=rf'bad.pth.tar is corrupted: its part {entry.filename} does not '
                                                  r'match the checksum torch.save wrote'):
            read_checkpoint(tmp_path / 'bad.pth.tar')
    # saved without CRCs (torch writes 0 for each part): read as torch reads it
    torch.serialization.set_crc32_options(False)
    try:
        torch.save({'state_dict': timm.create_model('sa_quadratic_cifar', **SMALL).state_dict()},
                   tmp_path / 'no_crc.pth.tar')
    finally:
        torch.serialization.set_crc32_options(True)
    assert len(read_checkpoint(tmp_path / 'no_crc.pth.tar').state_dict) > 0


def test_an_empty_weights_file_is_called_cut_short(tmp_path):
    """A 0-byte last.pth.tar (a full disk, a killed copy) is a save cut short, not 'no PyTorch checkpoint'."""
    (tmp_path / 'last.pth.tar').write_bytes(b'')
    with pytest.raises(CheckpointError, match=r'last.pth.tar is empty: a save or a copy of it was cut short'):
        read_checkpoint(tmp_path / 'last.pth.tar')


def test_an_epochs_file_names_the_folder_it_goes_with(tmp_path):
    """A Hub folder's or a run's positional_epochs.safetensors holds the kept epochs' centres alone: not 'bare
    weights of a timm model to name', but the folder whose model.safetensors or last.pth.tar it goes with."""
    from sa_vision.train.positional_epochs import (
        POSITIONAL_EPOCHS_FILE,
        positional_params,
        save_positional_trajectory,
    )
    model = timm.create_model('sa_quadratic_cifar', **SMALL)
    path = save_positional_trajectory({'epoch-000': positional_params(model.state_dict())},
                                      tmp_path / POSITIONAL_EPOCHS_FILE)
    with pytest.raises(CheckpointError, match=rf'^{re.escape(str(path))} holds the centres and precision factors of '
                                              rf"kept epochs \(\d+ tensors\), not a model's weights: pass the folder "
                                              rf'it is in \(local-dir:{re.escape(str(tmp_path))}\), whose '
                                              rf'model.safetensors they go with$'):
        read_checkpoint(path)
    # a run's (sa-vision-train --save-epoch-positions): a run folder reads as its last.pth.tar
    (tmp_path / 'last.pth.tar').write_bytes(b'the run\'s checkpoint')
    with pytest.raises(CheckpointError, match=rf"not a model's weights: pass the folder it is in "
                                              rf'\({re.escape(str(tmp_path))}\), whose last.pth.tar they go with$'):
        read_checkpoint(path)


def test_an_unknown_model_name_is_called_unknown(tmp_path):
    """--model with a typo: 'unknown model' and the registered name meant, not 'pass weights of <the typo>'."""
    from sa_vision.models import UnknownModelError
    torch.save(timm.create_model('sa_quadratic_cifar', **SMALL).state_dict(), tmp_path / 'weights.pth')
    for typo in ('sa_quadratic_cifa', 'not_a_model'):
        with pytest.raises(UnknownModelError, match=f"unknown model '{typo}'") as refused:
            read_checkpoint(tmp_path / 'weights.pth', arch=typo)
        assert 'pass weights of' not in str(refused.value)
    with pytest.raises(UnknownModelError, match="did you mean 'sa_quadratic_cifar'"):
        read_checkpoint(tmp_path / 'weights.pth', arch='sa_quadratic_cifa')


def test_a_folder_without_weights_says_what_it_lacks(tmp_path):
    (tmp_path / 'empty').mkdir()
    with pytest.raises(CheckpointError, match='neither the last.pth.tar of a run .* nor the config.json') as e:
        read_checkpoint(tmp_path / 'empty')
    assert 'sa-vision-push-to-hub' not in str(e.value)
    best_only = tmp_path / 'best_only'
    best_only.mkdir()
    torch.save(timm.create_model('sa_quadratic_cifar', **SMALL).state_dict(), best_only / 'model_best.pth.tar')
    with pytest.raises(CheckpointError, match=f'holds model_best.pth.tar: pass that file, {best_only}'):
        read_checkpoint(best_only)


def test_a_run_folder_with_no_finished_epoch_says_so_to_every_command(tmp_path, capsys):
    """A run killed in its first epoch leaves its args.yaml and recipe.yaml, no checkpoint: each command that reads
    weights says that no epoch finished and to start the run again, not to pass the run folder it was given."""
    from helpers import command_here
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'args.yaml').write_text('model: sa_quadratic_cifar\ndataset: digits\n', encoding='utf-8')
    (run / 'recipe.yaml').write_text('model: sa_quadratic_cifar\n', encoding='utf-8')
    for name, *args in (('validate', '--model', f'local-dir:{run}'), ('push_to_hub', run, '--dry-run'),
                        ('train', '--resume', run, '--export')):
        status, _, err = command_here(capsys, name, *args)
        assert status == 2 and err.count('error:') == 1, (name, err)
        assert 'no epoch has finished' in err and 'start the run again' in err, (name, err)
        assert 'pass a checkpoint file, a run folder' not in err, (name, err)
    assert sorted(p.name for p in run.iterdir()) == ['args.yaml', 'recipe.yaml']
    # one whose epochs did end, its last.pth.tar moved away since, is no such run: its kept weights are named
    (run / 'summary.csv').write_text('epoch,train_loss\n0,2.3\n', encoding='utf-8')
    save_file({'w': torch.zeros(1)}, str(run / 'epoch-001.safetensors'))
    status, _, err = command_here(capsys, 'validate', '--model', f'local-dir:{run}')
    assert status == 2 and 'no epoch has finished' not in err, err
    assert f'pass one of them, e.g. {run / "epoch-001.safetensors"}' in err, err


def _names(cfg):
    return None if cfg.get('label_names') is None else list(cfg['label_names'])


def test_a_hub_folders_label_names_are_those_timm_reads_off_it(tmp_path):
    """A Hub folder's model has the label names and tag timm's local-dir: loading gives it (config.json keeps the
    names at its top level), not the registered cfg's CIFAR-10 ones; a folder of no known dataset has none."""
    torch.manual_seed(3)
    model = timm.create_model('sa_gen_cifar', **SMALL)
    model.pretrained_cfg = {**model.pretrained_cfg, 'label_names': None}  # as the export writes such weights
    for name, names in (('named', list('abcdefg')), ('unnamed', None)):
        save_for_hf(model, str(tmp_path / name), model_args=SMALL, safe_serialization=True, model_config={
            'pretrained_cfg': {'tag': 'own_images'}, **({'label_names': names} if names else {})})
    for folder, named in ((KEPT_FOLDER, True), (tmp_path / 'named', True), (tmp_path / 'unnamed', False)):
        ours = read_checkpoint(folder).create_model().pretrained_cfg
        timms = timm.create_model(f'local-dir:{folder}', pretrained=True).pretrained_cfg
        assert (_names(ours), ours['tag']) == (_names(timms), timms['tag']), folder
        assert (_names(ours) is not None) == named


def test_weights_of_another_dataset_never_get_cifar10s_label_names():
    """Weights that name their dataset but carry no label names (a training checkpoint) get that dataset's names
    (those the kept Fashion-MNIST export holds), or none where it has not as many classes as the model."""
    fashion_names = json.loads((KEPT_FOLDER / 'config.json').read_text())['label_names']
    for num_classes, expected in ((10, fashion_names), (7, None)):
        args = {**SMALL, 'num_classes': num_classes}
        state_dict = timm.create_model('sa_quadratic_cifar', **args).state_dict()
        ckpt = Checkpoint('sa_quadratic_cifar', args, state_dict, 'run', 'sa_vision', {'dataset': 'fashion-mnist'})
        assert _names(ckpt.create_model().pretrained_cfg) == expected


def test_a_run_checkpoint_is_evaluated_at_the_size_it_was_trained_at(tmp_path):
    """A run with --img-size 16 saved the preprocessing its training fed the model (``data_config``): the model
    built from its checkpoint takes it, so that sa-vision-validate and timm's resolve_data_config resize to 16."""
    state_dict = timm.create_model('sa_quadratic_cifar', **SMALL).state_dict()
    trained = {'input_size': [3, 16, 16], 'mean': [0.1, 0.2, 0.3], 'std': [0.3, 0.2, 0.1]}
    ckpt = Checkpoint('sa_quadratic_cifar', SMALL, state_dict, 'run', 'sa_vision', {'data_config': trained})
    data_config = timm.data.resolve_data_config({}, model=ckpt.create_model())
    assert {k: list(data_config[k]) for k in trained} == trained


def test_loading_weights_leaves_the_callers_random_state_as_it_was(tmp_path):
    """The model is built with a random init its weights then replace: a notebook's seeded random stream goes on as
    if nothing were loaded (timm's own create_model draws it; sa_vision's loader keeps it)."""
    from sa_vision.train.checkpoint import read_checkpoint
    save_for_hf(timm.create_model('sa_quadratic_cifar', embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32),
                tmp_path, safe_serialization=True)
    checkpoint = read_checkpoint(tmp_path)
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    checkpoint.create_model()
    assert torch.equal(torch.rand(3), expected)


def test_bare_weights_of_each_kind_are_the_papers_model_whatever_variants_exist():
    """Bare weights name no architecture: each attention kind's read back as the paper's model of that kind
    (sa_content_cifar: ours, the paper has none). A variant a contributor adds to SA_MODEL_ARGS (a narrower
    sa_quadratic, say) took them over when this was 'the last model of the kind'."""
    from sa_vision.models import DEFAULT_MODEL_OF_KIND
    from sa_vision.paper import PAPER_RESULTS
    assert set(DEFAULT_MODEL_OF_KIND) == {args['attn_kind'] for args in SA_MODEL_ARGS.values()}
    for kind, name in DEFAULT_MODEL_OF_KIND.items():
        assert SA_MODEL_ARGS[name] == {'attn_kind': kind} and name in (*PAPER_RESULTS, 'sa_content_cifar')


def test_a_kept_folders_weights_by_file_overlay_warn_that_the_folder_states_its_own_config():
    """pretrained_cfg_overlay=dict(file=<kept folder>/model.safetensors) keeps the registered CIFAR-10 cfg, which
    classifies the kept Fashion-MNIST model's test split at 60.57 % where its card says 89.50 %: a warning names
    what the folder's config.json states and local-dir:, which loads the folder whole and warns of nothing."""
    import warnings
    config = json.loads((KEPT_FOLDER / 'config.json').read_text(encoding='utf-8'))
    with pytest.warns(UserWarning, match=r"input_size \[3, 28, 28\] there, \[3, 32, 32\] here; mean .* "
                                         rf"timm.create_model\('local-dir:{re.escape(str(KEPT_FOLDER))}'"):
        timm.create_model('sa_gen_cifar', pretrained=True, **config['model_args'],
                          pretrained_cfg_overlay=dict(file=str(KEPT_FOLDER / 'model.safetensors')))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        model = timm.create_model(f'local-dir:{KEPT_FOLDER}', pretrained=True)
    assert list(model.pretrained_cfg['input_size']) == config['pretrained_cfg']['input_size']


@pytest.mark.parametrize('mean', [None, 0.5, ['a', 'b', 'c'], 'IMAGENET_DEFAULT_MEAN'])
def test_a_file_overlay_beside_a_config_of_no_preprocessing_we_read_loads_quietly(mean, tmp_path):
    """A config.json beside the weights whose mean is no list of numbers (another tool's, or hand-made) states
    nothing the overlay's warning compares: the weights load as timm loads them, without a word."""
    import warnings
    torch.manual_seed(0)
    ten_classes = {k: v for k, v in SMALL.items() if k != 'num_classes'}  # the registered cfg's: timm keeps the head
    model = timm.create_model('sa_quadratic_cifar', **ten_classes)
    save_file(model.state_dict(), str(tmp_path / 'model.safetensors'))
    (tmp_path / 'config.json').write_text(json.dumps({'pretrained_cfg': {'mean': mean}}), encoding='utf-8')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        loaded = timm.create_model('sa_quadratic_cifar', pretrained=True, **ten_classes,
                                   pretrained_cfg_overlay=dict(file=str(tmp_path / 'model.safetensors')))
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())
