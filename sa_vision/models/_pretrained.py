""" Where published weights live, and the error for ``pretrained=True`` weights that cannot be fetched

Weights trained with the paper's recipe are published at ``<HF_NAMESPACE>/<arch>.<PRETRAINED_TAG>``. Uncached,
the factories first ask the Hub once, bounded by ``HUB_PROBE_TIMEOUT``, and raise ``PretrainedWeightsUnavailable``
at once when it does not answer, instead of huggingface_hub's retries per file (docs/training.md, "`pretrained=True`
without a network"). No global setting is changed.
"""
import sys
import threading
from contextlib import contextmanager
from typing import Any, Dict, List, Optional

from ..errors import UserError

__all__ = ['HF_NAMESPACE', 'PRETRAINED_TAG', 'hub_repo_id', 'HUB_PROBE_TIMEOUT', 'PretrainedWeightsUnavailable',
           'registered_hf_hub_id', 'explain_unavailable_weights']

HF_NAMESPACE = 'sa-vision'
# the tag of the registered (published) weights: CIFAR-10, the paper's recipe and architecture
PRETRAINED_TAG = 'cifar10'
# seconds the Hub may take to answer before an uncached pretrained=True gives up (HF_HUB_ETAG_TIMEOUT overrides)
HUB_PROBE_TIMEOUT = 3.0


def hub_repo_id(arch: str, tag: str = PRETRAINED_TAG) -> str:
    """The repository of ``<arch>.<tag>`` weights in this project's namespace."""
    return f'{HF_NAMESPACE}/{arch}.{tag}'


class PretrainedWeightsUnavailable(UserError, RuntimeError):
    """``pretrained=True`` but the weights cannot be fetched from the Hub (offline, or not published); a
    RuntimeError like timm's loading failures, a UserError so the commands print one ``error:`` line."""


def registered_hf_hub_id(arch: str) -> Optional[str]:
    """The repository ``timm.create_model(arch, pretrained=True)`` downloads, or None for unknown names."""
    from timm.models import get_pretrained_cfg
    cfg = get_pretrained_cfg(f'{arch}.{PRETRAINED_TAG}')
    return getattr(cfg, 'hf_hub_id', None) if cfg is not None else None


def _hub_fetch_errors():
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    return EntryNotFoundError, LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError, \
        RevisionNotFoundError


def _hub_source(cfg: Dict[str, Any]) -> Optional[str]:
    """The Hub repository id (maybe ``id@revision``) timm's ``load_pretrained`` downloads for ``cfg``, or None
    (mirrors ``timm.models._builder``)."""
    if cfg.get('source') == 'hf-hub':
        return cfg.get('hf_hub_id')
    if cfg.get('source') == 'local-dir' or cfg.get('state_dict') is not None or cfg.get('file'):
        return None
    return cfg.get('hf_hub_id')


def _hub_weight_files(filename: Optional[str]) -> List[str]:
    """The files timm's ``load_state_dict_from_hf`` asks the Hub for, in order (safetensors first)."""
    filename = filename or 'pytorch_model.bin'
    if filename.endswith('.bin'):
        return ['model.safetensors' if filename == 'pytorch_model.bin' else filename[:-4] + '.safetensors', filename]
    return [filename]


def _is_network_error(error: BaseException) -> bool:
    if isinstance(error, OSError):  # socket errors; requests' ConnectionError and Timeout
        return True
    for name in ('httpx2', 'httpx'):  # the HTTP clients of huggingface_hub's versions
        module = sys.modules.get(name)
        if module is not None and isinstance(error, getattr(module, 'TransportError', ())):
            return True
    return False


def _probe_hub(url: str, timeout: float) -> Optional[str]:
    """Ask the Hub once for ``url``'s metadata; None when it answered (any HTTP status), else why it did not.

    Runs in a daemon thread bounded by ``timeout`` in all: the client's timeout is per request and does not bound a
    hanging name lookup."""
    from huggingface_hub import get_hf_file_metadata
    from huggingface_hub.errors import HfHubHTTPError
    outcome = {}

    def ask():
        try:
            get_hf_file_metadata(url, timeout=timeout)
        except BaseException as e:  # noqa: B036, BLE001  handed to the caller
            outcome['error'] = e

    thread = threading.Thread(target=ask, name='sa_vision-hub-probe', daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return f'no answer within {timeout:g} s'
    error = outcome.get('error')
    if error is not None and not isinstance(error, HfHubHTTPError) and _is_network_error(error):
        return f'{type(error).__name__}: {error}'
    return None  # the server answered (any status), or an error that timm's download is left to report


def _fail_fast_if_hub_unreachable(variant: str, cfg: Dict[str, Any], cache_dir=None) -> None:
    """Raise ``PretrainedWeightsUnavailable`` within about ``HUB_PROBE_TIMEOUT`` s when uncached weights would be
    downloaded and the Hub does not answer."""
    from huggingface_hub import constants, hf_hub_url, try_to_load_from_cache
    hub_id = _hub_source(cfg)
    if hub_id is None or constants.HF_HUB_OFFLINE:
        return  # not a Hub download, or huggingface_hub answers from the cache alone
    repo_id, _, revision = hub_id.partition('@')  # timm's hf_split
    revision = revision or None
    files = _hub_weight_files(cfg.get('hf_hub_filename'))
    cached = [isinstance(try_to_load_from_cache(repo_id, f, cache_dir=cache_dir, revision=revision), str)
              for f in files]
    if cached[0]:
        return
    timeout = HUB_PROBE_TIMEOUT
    if constants.HF_HUB_ETAG_TIMEOUT != constants.DEFAULT_ETAG_TIMEOUT:
        timeout = float(constants.HF_HUB_ETAG_TIMEOUT)
    reason = _probe_hub(hf_hub_url(repo_id, files[0], revision=revision), timeout)
    if reason is None or any(cached):  # reachable; or a later file is cached and the download falls back to it
        return
    raise PretrainedWeightsUnavailable(_unavailable_message(
        variant, hub_id, f'the Hub at {constants.ENDPOINT} could not be reached ({reason}) and the weights are not '
        f'in the local Hub cache ({cache_dir or constants.HF_HUB_CACHE}); connect to the network, or set '
        f'HF_HUB_CACHE to a cache that holds them'))


def _unavailable_message(variant: str, hf_hub_id: Optional[str], reason: str) -> str:
    return (
        f'pretrained weights for {variant} could not be fetched from the Hugging Face Hub repository '
        f'{hf_hub_id!r} ({reason}). Train them with '
        f'`sa-vision-train -c {variant} --data-dir data --dataset-download` (or '
        f'`python -m sa_vision.cli.train -c {variant} ...`), '
        f"or load local weights: timm.create_model('local-dir:<exported folder>', pretrained=True) or "
        f"timm.create_model('{variant}', pretrained=True, "
        f"pretrained_cfg_overlay=dict(file='<folder>/model.safetensors'))")


def _resolved_cfg(variant: str, pretrained_cfg=None, pretrained_cfg_overlay=None) -> Dict[str, Any]:
    """The pretrained cfg ``build_model_with_cfg`` will use, as a dict ({} for unknown variants)."""
    from timm.models import resolve_pretrained_cfg
    try:
        cfg = resolve_pretrained_cfg(variant, pretrained_cfg=pretrained_cfg,
                                     pretrained_cfg_overlay=pretrained_cfg_overlay)
    except Exception:  # noqa: BLE001 -- timm reports a bad cfg itself in build_model_with_cfg
        return {}
    return cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg or {})


@contextmanager
def explain_unavailable_weights(variant: str, pretrained: bool, pretrained_cfg=None, pretrained_cfg_overlay=None,
                                cache_dir=None):
    """For ``pretrained=True``: fail fast when uncached weights cannot be downloaded, and turn the Hub client's
    errors into one clear message."""
    if not pretrained:
        yield
        return
    cfg = _resolved_cfg(variant, pretrained_cfg, pretrained_cfg_overlay)
    _fail_fast_if_hub_unreachable(variant, cfg, cache_dir)
    try:
        yield
    except _hub_fetch_errors() as e:
        raise PretrainedWeightsUnavailable(_unavailable_message(
            variant, cfg.get('hf_hub_id'), f'{type(e).__name__}: offline, or not published yet')) from None
