""" Where published weights live, and the error for ``pretrained=True`` weights that cannot be fetched

Weights trained on CIFAR-10 with the paper's recipe and architecture are published at
``<HF_NAMESPACE>/<arch>.<PRETRAINED_TAG>``; that repository is what ``timm.create_model('<arch>', pretrained=True)``
downloads. This module imports only huggingface_hub and timm (the model factories import it; it imports no
sa_vision code).
"""
from contextlib import contextmanager
from typing import Optional

__all__ = ['HF_NAMESPACE', 'PRETRAINED_TAG', 'PretrainedWeightsUnavailable', 'registered_hf_hub_id',
           'explain_unavailable_weights']

HF_NAMESPACE = 'sa-vision'
# the tag of the registered (published) weights: CIFAR-10, the paper's recipe and architecture
PRETRAINED_TAG = 'cifar10'


class PretrainedWeightsUnavailable(RuntimeError):
    """``pretrained=True`` but the weights cannot be fetched from the Hub (offline, or not published)."""


def registered_hf_hub_id(arch: str) -> Optional[str]:
    """The repository ``timm.create_model(arch, pretrained=True)`` downloads, or None for unknown names."""
    from timm.models import get_pretrained_cfg
    cfg = get_pretrained_cfg(f'{arch}.{PRETRAINED_TAG}')
    return getattr(cfg, 'hf_hub_id', None) if cfg is not None else None


def _hub_fetch_errors():
    from huggingface_hub.errors import (
        EntryNotFoundError, LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError,
        RevisionNotFoundError)
    return EntryNotFoundError, LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError, \
        RevisionNotFoundError


@contextmanager
def explain_unavailable_weights(variant: str, pretrained: bool, pretrained_cfg=None):
    """Turn the Hub client's errors for unreachable ``pretrained=True`` weights into one clear message."""
    if not pretrained:
        yield
        return
    try:
        yield
    except _hub_fetch_errors() as e:
        cfg = pretrained_cfg
        if cfg is None or isinstance(cfg, str):
            from timm.models import get_pretrained_cfg
            cfg = get_pretrained_cfg(variant if cfg is None else f'{variant}.{cfg}')
        hf_hub_id = cfg.get('hf_hub_id') if isinstance(cfg, dict) else getattr(cfg, 'hf_hub_id', None)
        raise PretrainedWeightsUnavailable(
            f'pretrained weights for {variant} could not be fetched from the Hugging Face Hub repository '
            f'{hf_hub_id!r} ({type(e).__name__}: offline, or not published yet). Train them with '
            f'`python scripts/train.py -c scripts/configs/{variant}.yaml --data-dir data --dataset-download`, '
            f"or load local weights: timm.create_model('local-dir:<exported folder>', pretrained=True) or "
            f"timm.create_model('{variant}', pretrained=True, "
            f"pretrained_cfg_overlay=dict(file='<folder>/model.safetensors'))") from None
