""" What an exported card says: the usage that runs, the epoch and weights it names (EMA or not, best or last,
picked by the accuracy it reports), and no claim where there is no training record """
import json
import re

import pytest
import timm
import torch
from safetensors.torch import save_file

import sa_vision  # noqa: F401  (registers the models)
from sa_vision.hub import export_hub_folder
from sa_vision.hub.card import usage_section
from sa_vision.train.data import dataset_info

SMALL = dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32)
# CIFAR-10's classes, label i first, as its batches.meta (and torchvision's CIFAR10.classes) list them
CIFAR10_CLASSES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck')


def _usage_code(card_text: str) -> str:
    return re.search(r'```python\n(.*?)```', card_text, re.S).group(1)


@pytest.mark.parametrize('arch', ['sa_quadratic_cifar', 'resnet18_cifar'])
def test_the_reference_cards_usage_runs_on_the_registered_model(arch, tmp_path, capsys):
    """The usage of CIFAR-10 weights published to the registered repository loads them by the registered name
    (pretrained=True; here the weights come from a file, the cfg stays the registered one) and prints the class
    name of the prediction: the registered cfg must carry CIFAR-10's label names."""
    from PIL import Image
    code = _usage_code(usage_section(arch, f'sa-vision/{arch}.cifar10', dataset_info('cifar10'), 10, 32))
    assert f"timm.create_model('{arch}', pretrained=True)" in code and "pretrained_cfg['label_names']" in code
    torch.manual_seed(0)
    save_file(timm.create_model(arch).state_dict(), str(tmp_path / 'w.safetensors'))
    Image.new('RGB', (32, 32), (200, 30, 30)).save(tmp_path / 'image.png')
    code = code.replace('pretrained=True)', f'pretrained=True, pretrained_cfg_overlay=dict(file='
                                            f'{str(tmp_path / "w.safetensors")!r}))')
    exec(compile(code.replace("'image.png'", repr(str(tmp_path / 'image.png'))), 'usage', 'exec'), {})
    assert capsys.readouterr().out.strip() in CIFAR10_CLASSES
    assert tuple(timm.create_model(arch).pretrained_cfg['label_names']) == CIFAR10_CLASSES


def test_weights_of_no_known_dataset_claim_no_class_names(tmp_path):
    """10-class weights with no dataset named (bare safetensors): the export's config.json names no classes, not
    the registered cfg's CIFAR-10 ones, and timm's loading of the folder has none."""
    torch.manual_seed(0)
    save_file(timm.create_model('sa_quadratic_cifar', **SMALL).state_dict(), str(tmp_path / 'w.safetensors'))
    export_hub_folder(tmp_path / 'w.safetensors', tmp_path / 'hub', figure=False)
    config = json.loads((tmp_path / 'hub' / 'config.json').read_text())
    assert 'label_names' not in config and 'label_names' not in config['pretrained_cfg'], config
    loaded = timm.create_model(f'local-dir:{tmp_path / "hub"}', pretrained=True)
    assert loaded.num_classes == 10 and not loaded.pretrained_cfg.get('label_names')
    assert "label_names" not in _usage_code((tmp_path / 'hub' / 'README.md').read_text())
