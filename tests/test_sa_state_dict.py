""" Weights saved under an old key name (``spreads``, now ``precision_factors``) load through every loader

Each test saves a model's weights under the old names, written by hand here (``OLD_NAMES``, not the table it guards),
loads them through one loader, and compares with the model that holds the same tensors under today's names: the
outputs must be equal, bit for bit (same tensors, same computation). """
import json

import pytest
import timm
import torch
from safetensors.torch import save_file
from torch import nn

import sa_vision  # noqa: F401  registers the models
from sa_vision.models import infer_sa_model_args
from sa_vision.models.sa_state_dict import checkpoint_filter_fn

SMALL = dict(embed_dim=16, depth=2, mlp_hidden_dim=32, heads_per_layer=3, num_classes=10)
GAUSSIAN_MODELS = ['sa_quadratic_cifar', 'sa_gen_cifar']
# today's name -> the name weights were saved under before, as the tail of a key
OLD_NAMES = {'.attn.position.precision_factors': '.attn.position.spreads'}


def _old_names(state_dict):
    """``state_dict`` as saved before the rename, written out by hand."""
    old = {_old_name(k): v for k, v in state_dict.items()}
    assert len(old) == len(state_dict) and sum(k != _old_name(k) for k in state_dict) == SMALL['depth'] * len(OLD_NAMES)
    return old


def _old_name(key):
    for new, old in OLD_NAMES.items():
        if key.endswith(new):
            return key[:-len(new)] + old
    return key


def _trained(arch):
    """A model away from its initialisation (every parameter random), in eval mode, and its input."""
    torch.manual_seed(0)
    model = timm.create_model(arch, **SMALL).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model, torch.randn(2, 3, 8, 8)


def _fresh(arch):
    torch.manual_seed(1)  # other weights than _trained's: a key that does not load shows in the output
    return timm.create_model(arch, **SMALL).eval()


def _assert_same_model(loaded, reference, x):
    with torch.no_grad():
        assert torch.equal(loaded(x), reference(x))
    assert list(loaded.state_dict()) == list(reference.state_dict())


@pytest.mark.parametrize('arch', GAUSSIAN_MODELS)
def test_torch_load_state_dict_takes_the_old_names(arch):
    reference, x = _trained(arch)
    model = _fresh(arch)
    with torch.no_grad():
        assert not torch.equal(model(x), reference(x))
    old = _old_names(reference.state_dict())
    model.load_state_dict(old)  # strict: a key left over or missing raises
    assert any(k.endswith(tuple(OLD_NAMES.values())) for k in old)  # the caller's dict is not changed
    _assert_same_model(model, reference, x)


@pytest.mark.parametrize('prefix', ['module.', '_orig_mod.'])
def test_a_wrapped_model_takes_the_old_names_under_its_prefix(prefix):
    """DDP names its model 'module', torch.compile '_orig_mod' (the wrapper is built, never run: no compile)."""
    reference, x = _trained('sa_gen_cifar')
    if prefix == 'module.':
        wrapper = nn.Module()
        wrapper.module = _fresh('sa_gen_cifar')
        inner = wrapper.module
    else:
        wrapper = torch.compile(_fresh('sa_gen_cifar'))
        inner = wrapper._orig_mod
    assert all(k.startswith(prefix) for k in wrapper.state_dict())
    wrapper.load_state_dict({prefix + k: v for k, v in _old_names(reference.state_dict()).items()})
    _assert_same_model(inner, reference, x)


def test_a_state_dict_with_both_names_is_refused_by_a_strict_load():
    reference, _ = _trained('sa_quadratic_cifar')
    both = {**reference.state_dict(), **_old_names(reference.state_dict())}
    with pytest.raises(RuntimeError, match='Unexpected key'):
        _fresh('sa_quadratic_cifar').load_state_dict(both)


@pytest.mark.parametrize('arch', GAUSSIAN_MODELS)
def test_checkpoint_filter_fn_renames(arch):
    reference, _ = _trained(arch)
    filtered = checkpoint_filter_fn(_old_names(reference.state_dict()), _fresh(arch))
    assert list(filtered) == list(reference.state_dict())
    for key, value in reference.state_dict().items():  # each tensor under its own new name, not another's
        assert torch.equal(filtered[key], value), key


@pytest.mark.parametrize('released_embedding', [False, True], ids=['our_embedding', 'released_embedding'])
@pytest.mark.parametrize('arch', GAUSSIAN_MODELS)
def test_create_model_pretrained_from_a_file_of_old_names(arch, released_embedding, tmp_path):
    """timm.create_model(pretrained=True) from a local file, also with the released code's Linear embedding
    ``(D, 4*C)``, input index ``(2*di + dj) * C + c``, written here from our conv kernel ``(D, C, di, dj)``."""
    reference, x = _trained(arch)
    old = _old_names(reference.state_dict())
    if released_embedding:
        kernel = old.pop('patch_embed.proj.weight')
        old['patch_embed.weight'] = kernel.permute(0, 2, 3, 1).reshape(kernel.shape[0], -1)
        old['patch_embed.bias'] = old.pop('patch_embed.proj.bias')
    path = tmp_path / 'model.safetensors'
    save_file({k: v.contiguous() for k, v in old.items()}, str(path))
    torch.manual_seed(1)
    model = timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **SMALL).eval()
    _assert_same_model(model, reference, x)


@pytest.mark.parametrize('loader', ['load_checkpoint', 'resume_checkpoint'])
def test_timms_checkpoint_loaders_take_the_old_names(loader, tmp_path):
    """What timm's train.py --initial-checkpoint / validate.py --checkpoint (load_checkpoint) and train.py --resume
    (resume_checkpoint) call: model.load_state_dict, no filter."""
    from timm.models import load_checkpoint, resume_checkpoint
    reference, x = _trained('sa_gen_cifar')
    path = tmp_path / 'last.pth.tar'
    torch.save({'epoch': 3, 'arch': 'sa_gen_cifar', 'state_dict': _old_names(reference.state_dict()),
                'version': 2}, path)
    model = _fresh('sa_gen_cifar')
    (load_checkpoint if loader == 'load_checkpoint' else resume_checkpoint)(model, str(path))
    _assert_same_model(model, reference, x)


@pytest.mark.parametrize('arch, kind', [('sa_quadratic_cifar', 'quadratic'), ('sa_gen_cifar', 'generalized')])
def test_infer_sa_model_args_reads_the_old_names(arch, kind):
    reference, _ = _trained(arch)
    assert infer_sa_model_args(_old_names(reference.state_dict())) == dict(
        in_chans=3, embed_dim=16, depth=2, heads_per_layer=(3, 3), attn_kind=kind, mlp_hidden_dim=32, num_classes=10)


def test_the_checkpoint_reader_gives_todays_names(tmp_path):
    from sa_vision.train.checkpoint import read_checkpoint
    reference, x = _trained('sa_gen_cifar')
    path = tmp_path / 'weights.safetensors'
    save_file({k: v.contiguous() for k, v in _old_names(reference.state_dict()).items()}, str(path))
    ckpt = read_checkpoint(path)
    assert ckpt.arch == 'sa_gen_cifar' and sorted(ckpt.state_dict) == sorted(reference.state_dict())
    _assert_same_model(ckpt.create_model(), reference, x)


def test_a_trajectory_of_old_names_loads_under_todays(tmp_path):
    """positional_epochs.safetensors as the kept zoo holds it: per-epoch tensors stacked, labels in metadata."""
    from sa_vision.train.positional_epochs import load_positional_trajectory
    first, _ = _trained('sa_quadratic_cifar')
    second = _fresh('sa_quadratic_cifar')
    epochs = [{k: v for k, v in m.state_dict().items() if k.endswith(('.attn.position.centers', *OLD_NAMES))}
              for m in (first, second)]
    stacked = {_old_name(k): torch.stack([e[k] for e in epochs]) for k in epochs[0]}
    path = tmp_path / 'positional_epochs.safetensors'
    save_file(stacked, str(path), metadata={'epochs': json.dumps(['epoch-000', 'epoch-001'])})
    loaded = load_positional_trajectory(path)
    assert list(loaded) == ['epoch-000', 'epoch-001']
    for label, expected in zip(loaded, epochs):
        assert sorted(loaded[label]) == sorted(expected)
        assert all(torch.equal(loaded[label][k], v) for k, v in expected.items())


@pytest.mark.parametrize('arch', GAUSSIAN_MODELS)
def test_the_paper_reference_takes_the_old_names(arch):
    from sa_vision.research.paper_reference import PaperDenseSA
    reference, x = _trained(arch)
    old = PaperDenseSA.from_state_dict(_old_names(reference.state_dict())).eval()
    new = PaperDenseSA.from_state_dict(reference.state_dict()).eval()
    with torch.no_grad():
        assert torch.equal(old(x), new(x))
