""" What exported weights are: ``<arch>.<tag>``, the tag being their dataset (``_custom``: not the paper's model) """
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict

import torch

from ..models._pretrained import PRETRAINED_TAG, hub_repo_id
from ..train.checkpoint import Checkpoint
from ..train.data import DatasetInfo, dataset_info

__all__ = ['HUB_FOLDER_FILES', 'RECIPE_FILENAME', 'CARD_FIGURE_FILENAME', 'CUSTOM_SUFFIX', 'MODEL_CARD_DIR',
           'WeightsLabel', 'weights_label', 'is_registered_architecture']

RECIPE_FILENAME = 'recipe.yaml'
CARD_FIGURE_FILENAME = 'attention.png'
HUB_FOLDER_FILES = ('config.json', 'model.safetensors', 'README.md', RECIPE_FILENAME)  # + the figure if any
MODEL_CARD_DIR = Path(__file__).resolve().parent.parent / 'model_cards'  # package data
CUSTOM_SUFFIX = '_custom'  # tag suffix of weights whose architecture differs from the registered one


def is_registered_architecture(arch: str, model_args: Dict[str, Any]) -> bool:
    """The model has exactly the tensors of ``timm.create_model(arch)`` (the paper's configuration, 10 classes)."""
    import timm

    from .. import models  # noqa: F401  registers the models
    with torch.device('meta'):  # shapes only, no memory or init cost
        reference = timm.create_model(arch).state_dict()
        built = timm.create_model(arch, **model_args).state_dict()
    return {k: v.shape for k, v in reference.items()} == {k: v.shape for k, v in built.items()}


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
    info = dataset_info(ckpt.dataset)
    registered = is_registered_architecture(ckpt.arch, ckpt.model_args)
    return WeightsLabel(ckpt.arch, info.tag + ('' if registered else CUSTOM_SUFFIX), info, registered)
