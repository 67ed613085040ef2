""" What exported weights are: ``<arch>.<tag>``, the tag being their dataset (``_custom``: not the paper's model) """
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Tuple

import torch

from ..io import plain_data
from ..models._pretrained import PRETRAINED_TAG, hub_repo_id
from ..train.checkpoint import Checkpoint
from ..train.data import CUSTOM_SUFFIX, UNKNOWN_DATASET, DatasetInfo, dataset_info, trained_dataset
from ..train.positional_epochs import POSITIONAL_EPOCHS_FILE

__all__ = ['HUB_FOLDER_FILES', 'EXPORT_FILES', 'RECIPE_FILENAME', 'CARD_FIGURE_FILENAME', 'CUSTOM_SUFFIX',
           'MODEL_CARD_DIR', 'WeightsLabel', 'weights_label', 'is_registered_architecture']

RECIPE_FILENAME = 'recipe.yaml'
CARD_FIGURE_FILENAME = 'attention.png'
# what every export holds; + the recipe of weights with a training record, the figure of attention models
HUB_FOLDER_FILES = ('config.json', 'model.safetensors', 'README.md')
# every file an export may hold: what a new export of the same weights replaces, and an upload replaces on the Hub
EXPORT_FILES = (*HUB_FOLDER_FILES, RECIPE_FILENAME, CARD_FIGURE_FILENAME, POSITIONAL_EPOCHS_FILE)
MODEL_CARD_DIR = Path(__file__).resolve().parent.parent / 'model_cards'  # package data


# is_registered_architecture's answers: an export asks for the label of the same weights several times (the command,
# the export, the card), and each answer builds two models and runs them (up to 0.7 s for the paper's models)
_REGISTERED: Dict[Tuple[str, str], bool] = {}


def is_registered_architecture(arch: str, model_args: Dict[str, Any]) -> bool:
    """``timm.create_model(arch)``, what ``pretrained=True`` builds, is the model of ``model_args``: the same
    tensors (the paper's configuration, 10 classes), and with the same weights the same logits in eval mode.
    Arguments such as ``input_padding`` or ``norm_eps`` change the logits without changing a tensor; drop rates
    and the initialisation change neither."""
    key = (arch, json.dumps(plain_data(model_args), sort_keys=True))
    if key not in _REGISTERED:
        _REGISTERED[key] = _same_model_as_registered(arch, model_args)
    return _REGISTERED[key]


def _same_model_as_registered(arch: str, model_args: Dict[str, Any]) -> bool:
    import timm

    from .. import models  # noqa: F401  registers the models
    with torch.device('meta'):  # shapes only, no memory or init cost
        reference = timm.create_model(arch).state_dict()
        built = timm.create_model(arch, **model_args).state_dict()
    if {k: v.shape for k, v in reference.items()} != {k: v.shape for k, v in built.items()}:
        return False
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # the caller's random state is left as it was
        torch.manual_seed(0)
        model = timm.create_model(arch, **model_args).eval()
        for param in model.parameters():  # no zero-initialised layer (a head) hides a difference
            param.add_(torch.randn_like(param) * 0.02)
        registered = timm.create_model(arch).eval()
        registered.load_state_dict(model.state_dict())
        x = torch.randn(1, *registered.pretrained_cfg['input_size'])
        return torch.equal(model(x), registered(x))


@dataclass(frozen=True)
class WeightsLabel:
    """How exported weights are named: ``<arch>.<tag>``, and where they go by default."""
    arch: str
    tag: str
    dataset: DatasetInfo
    registered_architecture: bool

    @property
    def name(self) -> str:
        return f'{self.arch}.{self.tag}'

    @property
    def default_repo_id(self) -> str:
        return hub_repo_id(self.arch, self.tag)

    @property
    def is_reference(self) -> bool:
        """The weights the registered repository stands for: CIFAR-10, the paper's architecture."""
        return self.registered_architecture and self.tag == PRETRAINED_TAG


def weights_label(ckpt: Checkpoint) -> WeightsLabel:
    dataset = trained_dataset(ckpt.meta)
    info = UNKNOWN_DATASET if dataset is None else dataset_info(dataset)
    registered = is_registered_architecture(ckpt.arch, ckpt.model_args)
    return WeightsLabel(ckpt.arch, info.tag + ('' if registered else CUSTOM_SUFFIX), info, registered)
