""" What :func:`~sa_vision.train.checkpoint.read_checkpoint` gives: weights and what is known about them, and the
model they make (:class:`Checkpoint`) """
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from timm.models import is_model
from torch import Tensor, nn
from torch.random import fork_rng

from ..models import create_named_model
from ..models.factory import StoredArgsSource
from .timm_args import timm_data_flags
from .weights_files import CheckpointError, weights_misfit

if TYPE_CHECKING:
    from .data import DatasetInfo

__all__ = ['Checkpoint', 'TRAINING_PROCESSES']

# config.json's record of the processes an exported run trained on (its recipe's batch size is each process's)
TRAINING_PROCESSES = 'training_processes'


@dataclass
class Checkpoint:
    """Weights and what is known about them: ``model_args`` are every keyword ``timm.create_model(arch, ...)``
    takes (``given_args`` names those the caller gave, e.g. ``--model-kwargs``, rather than the file), ``meta``
    everything else the file holds (metrics, history, ...; its ``'epoch'``: the epochs done, in either trainer's)."""
    arch: str
    model_args: Dict[str, Any]
    state_dict: Dict[str, Tensor]
    source: str
    format: str
    meta: Dict[str, Any] = field(default_factory=dict)
    given_args: Tuple[str, ...] = ()

    @property
    def dataset(self) -> str:
        return self.meta.get('dataset') or ''

    @property
    def preprocessing(self) -> Dict[str, Any]:
        """The preprocessing the weights state: a Hub folder's or pruned file's (input size, mean / std, label names)
        as timm's local-dir: loading keeps it; a run's, what its training fed the model; {} where they state none."""
        fed = self.meta.get('data_config') or (
            timm_data_flags(self.meta.get('args') or {}, self.model_args) if self.format == 'timm' else {})
        return self.meta.get('pretrained_cfg') or {
            k: tuple(v) for k, v in fed.items() if k in ('input_size', 'mean', 'std')}

    def create_model(self, load_weights: bool = True) -> nn.Module:
        """The model with these weights (strictly loaded) in eval mode; else its random init (pretrained=False)."""
        if not is_model(self.arch):  # sa_vision's models are registered: this module imports them
            raise CheckpointError(f'{self.source} holds an unknown architecture {self.arch!r}; import the package '
                                  f'that registers it (--device-modules) or pass the right --model')
        overlay = self.preprocessing
        sources = {k: '--model-kwargs' if k in self.given_args else StoredArgsSource(self.source)
                   for k in self.model_args}
        try:  # the weights replace the random init: the caller's random state is left as it was
            with fork_rng(devices=[]) if load_weights else nullcontext():
                model = create_named_model(self.arch, kwargs_sources=sources, **self.model_args,
                                           **({'pretrained_cfg_overlay': overlay} if overlay else {}))
        except TypeError as e:
            raise CheckpointError(f'{self.source}: {self.arch} does not accept the stored arguments '
                                  f'{self.model_args} ({e})') from None
        try:
            if load_weights:
                model.load_state_dict(self.state_dict)
        except RuntimeError as e:
            raise CheckpointError(
                f'the weights in {self.source} do not fit {self.arch}({self.model_args}): '
                f'{weights_misfit(model, self.state_dict) or str(e).splitlines()[0]}. The file is of another '
                f'architecture or configuration, or was edited') from None
        if overlay or self.dataset:  # the registered cfg's names are CIFAR-10's: never kept for other weights
            model.pretrained_cfg['label_names'] = self.label_names(model.num_classes)
        return model.eval()

    def label_names(self, num_classes: int, dataset: Optional['DatasetInfo'] = None) -> Optional[Sequence[str]]:
        """timm's ``pretrained_cfg['label_names']`` of these weights: those they state (a Hub folder's, a run's on
        an image folder: its classes), else those of their dataset (``dataset``, by default the one they name) for
        ``num_classes`` classes, or None."""
        from .data import dataset_info, timm_label_order, trained_dataset
        stated = self.preprocessing.get('label_names') or (self.meta.get('args') or {}).get('label_names')
        trained_on = trained_dataset(self.meta)
        ours = self.format == 'sa_vision' or 'recipe' in self.meta or TRAINING_PROCESSES in self.meta
        if stated and ours and trained_on is not None and dataset_info(trained_on).is_image_folder:
            stated = timm_label_order(stated)  # an earlier sa_vision recorded an image folder's plainly sorted
        return stated or (dataset or dataset_info(self.dataset)).label_names(num_classes)
