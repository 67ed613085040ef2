""" Where published weights live, and the error for ``pretrained=True`` weights that cannot be fetched

Weights trained with the paper's recipe are published at ``<HF_NAMESPACE>/<arch>.<PRETRAINED_TAG>``; only the
architectures in ``PUBLISHED`` carry that repository in their pretrained cfg, so ``timm.list_pretrained`` lists only
weights that exist, and ``pretrained=True`` for any other says they are not published and where trained ones are.
Uncached, the factories first ask the Hub once, bounded by ``HUB_PROBE_TIMEOUT``, and raise
``PretrainedWeightsUnavailable`` when it does not answer, instead of huggingface_hub's minute of retries
(docs/training.md, "`pretrained=True` without a network"). No global setting is changed.
"""
from contextlib import contextmanager
from typing import Any, Dict, FrozenSet, Optional, Sequence

from ..errors import UserError

__all__ = ['HF_NAMESPACE', 'PRETRAINED_TAG', 'PUBLISHED', 'KEPT_ZOO', 'hub_repo_id', 'published_source',
           'HUB_PROBE_TIMEOUT', 'PretrainedWeightsUnavailable', 'registered_hf_hub_id', 'explain_unavailable_weights',
           'training_commands']

HF_NAMESPACE = 'sa-vision'
# the tag of the registered (published) weights: CIFAR-10, the paper's recipe and architecture
PRETRAINED_TAG = 'cifar10'
# the architectures whose <arch>.<PRETRAINED_TAG> weights are on the Hub: add one once its upload is done (docs/hub.md)
PUBLISHED: FrozenSet[str] = frozenset()
# where a clone of the repository keeps the weights trained here (docs/reproduction.md): named by the errors only,
# since the installed package reads nothing outside itself
KEPT_ZOO = 'zoo/fashion-mnist-cpu'
# seconds one request may take before an uncached pretrained=True gives up (HF_HUB_ETAG_TIMEOUT overrides)
HUB_PROBE_TIMEOUT = 3.0


def hub_repo_id(arch: str, tag: str = PRETRAINED_TAG) -> str:
    """The repository of ``<arch>.<tag>`` weights in this project's namespace."""
    return f'{HF_NAMESPACE}/{arch}.{tag}'


class PretrainedWeightsUnavailable(UserError, RuntimeError):
    """``pretrained=True`` but the weights cannot be fetched from the Hub (offline, or not published); a
    RuntimeError like timm's loading failures, a UserError so the commands print one ``error:`` line."""


def published_source(arch: str) -> Dict[str, str]:
    """The pretrained cfg entries that point ``<arch>.<PRETRAINED_TAG>`` at its Hub repository, once published."""
    return {'hf_hub_id': hub_repo_id(arch)} if arch in PUBLISHED else {}


def registered_hf_hub_id(arch: str) -> Optional[str]:
    """The repository ``timm.create_model(arch, pretrained=True)`` downloads once published (None for names without
    a ``<PRETRAINED_TAG>`` cfg): publishing refuses other weights there."""
    from timm.models import get_pretrained_cfg
    try:
        cfg = get_pretrained_cfg(f'{arch}.{PRETRAINED_TAG}')
    except RuntimeError:  # timm's 'Invalid pretrained tag' for a model of its own (resnet10t) without the tag
        return None
    return hub_repo_id(arch) if cfg is not None else None


# what the Hub client's errors for a repository it cannot read mean for a user, the most specific first
# (GatedRepoError is a RepositoryNotFoundError, LocalEntryNotFoundError an EntryNotFoundError, every HfHubHTTPError
# an HTTPError: the HTTP client's base class, which huggingface_hub >= 1.0 re-exports); names the installed
# huggingface_hub lacks are skipped
_HUB_ERRORS = (
    ('OfflineModeIsEnabled', 'HF_HUB_OFFLINE is set'),
    ('LocalEntryNotFoundError', 'the Hub could not be reached, or HF_HUB_OFFLINE is set, and the file is not in the '
                                'local Hub cache'),
    ('GatedRepoError', 'a gated repository: accept its conditions on the Hub and log in with hf auth login'),
    ('RepositoryNotFoundError', 'no such repository, or a private one: check the name, or log in with hf auth login'),
    ('RevisionNotFoundError', 'no such revision (the part after @)'),
    ('EntryNotFoundError', 'the repository lacks a file timm reads (config.json, the weights)'),
    ('HfHubHTTPError', 'the Hub answered with an error'),
    ('HTTPError', 'no answer from the Hub: no network, or a proxy or firewall in the way'),
)


def hub_read_errors() -> Dict[type, str]:
    """The installed huggingface_hub's error classes for a repository it cannot read, most specific first, with
    what each means for a user."""
    from huggingface_hub import errors
    return {getattr(errors, n): meaning for n, meaning in _HUB_ERRORS if hasattr(errors, n)}


def hub_error_reason(error: BaseException, known: Dict[type, str]) -> str:
    """``error``'s class and what it means (``known``: :func:`hub_read_errors`)."""
    return f'{type(error).__name__}: {next(m for cls, m in known.items() if isinstance(error, cls))}'


def _probe_hub(url: str, timeout: float) -> Optional[str]:
    """Ask the Hub once, without retries, for ``url``'s metadata: None when it answered (any HTTP status, a 404
    too: timm's download reports that), else why it did not."""
    from huggingface_hub import get_hf_file_metadata
    from huggingface_hub.errors import HfHubHTTPError
    try:
        get_hf_file_metadata(url, timeout=timeout)
    except HfHubHTTPError:
        pass
    except (TypeError, AttributeError, NameError):  # a huggingface_hub whose API changed: a bug, not the network
        raise
    except Exception as e:  # noqa: BLE001  no answer: a refused or timed-out connection, a failed name lookup
        return f'{type(e).__name__}: {e}'
    return None


def hub_unreachable(repo: str, files: Sequence[str], cache_dir=None, what: str = 'the files are') -> Optional[str]:
    """Why a download of ``files`` (the first one probed) from the Hub repository ``repo`` (``id[@revision]``)
    would fail only after huggingface_hub's retries (about a minute): none of them is cached and the Hub did not
    answer one bounded request. None where it answers at once: offline mode, a cached file, a Hub that answers."""
    from huggingface_hub import constants, hf_hub_url, try_to_load_from_cache
    if constants.HF_HUB_OFFLINE:
        return None  # huggingface_hub answers from the cache alone
    repo_id, _, revision = repo.partition('@')  # timm's hf_split
    revision = revision or None
    if any(isinstance(try_to_load_from_cache(repo_id, f, cache_dir=cache_dir, revision=revision), str)
           for f in files):
        return None
    timeout = HUB_PROBE_TIMEOUT
    if constants.HF_HUB_ETAG_TIMEOUT != constants.DEFAULT_ETAG_TIMEOUT:
        timeout = float(constants.HF_HUB_ETAG_TIMEOUT)
    reason = _probe_hub(hf_hub_url(repo_id, files[0], revision=revision), timeout)
    if reason is None:
        return None
    return (f'the Hub at {constants.ENDPOINT} could not be reached ({reason}) and {what} not in the local Hub '
            f'cache ({cache_dir or constants.HF_HUB_CACHE})')


def _fail_fast_if_hub_unreachable(variant: str, cfg: Dict[str, Any], cache_dir=None) -> None:
    """Raise ``PretrainedWeightsUnavailable`` after one bounded request when timm would download uncached weights
    from a Hub that does not answer (:func:`hub_unreachable`)."""
    from timm.models._builder import _resolve_pretrained_source  # where timm's load_pretrained takes them from
    from timm.models._hub import _get_safe_alternatives  # the files timm asks for, safetensors first
    load_from, location = _resolve_pretrained_source(cfg)
    if load_from != 'hf-hub':
        return
    hub_id, filename = location if isinstance(location, tuple) else (location, 'pytorch_model.bin')
    reason = hub_unreachable(hub_id, [*_get_safe_alternatives(filename), filename], cache_dir, 'the weights are')
    if reason is not None:
        raise PretrainedWeightsUnavailable(_unavailable_message(
            variant, hub_id, f'{reason}; connect to the network, or set HF_HUB_CACHE to a cache that holds them'))


def training_commands(arch: str) -> str:
    """The commands that make ``arch``'s CIFAR-10 weights with its recipe, exported to
    ``output/train/<arch>/hub``. A pruned model is made as the paper made it (App. A.1): its source model trained,
    its degenerate heads pruned (``sa-vision-prune``), then fine-tuned from the pruned weights."""
    from ..paper import PRUNED_FROM

    def train(name: str) -> str:
        return f'sa-vision-train -c {name} --data-dir data --dataset-download --experiment {name}'
    source = PRUNED_FROM.get(arch)
    if source is None:
        return f'`{train(arch)} --export`'
    pruned = f'output/{arch}.pth'
    return (f'train {source} (`{train(source)}`), prune its degenerate heads (`sa-vision-prune '
            f'output/train/{source}/last.pth.tar --out {pruned}`) and fine-tune the pruned weights (`{train(arch)} '
            f'--initial-checkpoint {pruned} --export`), as the paper made {arch} (App. A.1)')


def _train_advice(arch: str) -> str:
    return (f"{training_commands(arch)}, then timm.create_model('local-dir:output/train/{arch}/hub', "
            f"pretrained=True)")


def _not_published_message(variant: str) -> str:
    from ..paper import PAPER_RESULTS  # the paper's five models: the ones the zoo trains and keeps
    arch = variant.split('.')[0]
    kept = (f"Trained here on Fashion-MNIST, they are kept in the repository: from a clone, "
            f"timm.create_model('local-dir:{KEPT_ZOO}/{arch}', pretrained=True) (docs/reproduction.md). "
            if arch in PAPER_RESULTS else '')
    return (
        f'pretrained weights for {arch}.{PRETRAINED_TAG} are not published yet (they will be at '
        f'{hub_repo_id(arch)}). {kept}Or make them yourself: {_train_advice(arch)}')


def _unavailable_message(variant: str, hf_hub_id: Optional[str], reason: str) -> str:
    return (
        f'pretrained weights for {variant} could not be fetched from the Hugging Face Hub repository '
        f'{hf_hub_id!r} ({reason}). Make them yourself: {_train_advice(variant.split(".")[0])}; '
        f"or load local weights: timm.create_model('local-dir:<exported folder>', pretrained=True) (it builds the "
        f"architecture the folder's config.json names), or, for weights of {variant}'s own configuration, "
        f"timm.create_model('{variant}', pretrained=True, pretrained_cfg_overlay=dict(file='<file>.safetensors'))")


def _resolved_cfg(variant: str, pretrained_cfg=None, pretrained_cfg_overlay=None) -> Dict[str, Any]:
    """The pretrained cfg ``build_model_with_cfg`` will use, as a dict ({} for unknown variants)."""
    from timm.models import resolve_pretrained_cfg
    try:
        cfg = resolve_pretrained_cfg(variant, pretrained_cfg=pretrained_cfg,
                                     pretrained_cfg_overlay=pretrained_cfg_overlay)
    except Exception:  # noqa: BLE001 -- timm reports a bad cfg itself in build_model_with_cfg
        return {}
    return cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg or {})


# what an export's config.json states of the preprocessing its weights need, which a file= overlay leaves out
_PREPROCESSING = ('input_size', 'mean', 'std')


def _warn_of_the_folders_own_config(cfg: Dict[str, Any]) -> None:
    """Warn where ``pretrained_cfg_overlay=dict(file=...)`` names the weights of an exported folder whose
    ``config.json`` states another preprocessing than the cfg they are loaded with (a kept Fashion-MNIST model's
    28x28 grey normalisation under the registered CIFAR-10 cfg: 60.57 % where its card says 89.50 %): timm's
    ``local-dir:`` takes the folder's config whole. ``local-dir:`` itself, which names the file too, agrees."""
    import json
    from pathlib import Path
    if not cfg.get('file'):
        return
    source = Path(cfg['file'])
    config = (source if source.is_dir() else source.parent) / 'config.json'  # local-dir: names the folder
    try:
        stated = json.loads(config.read_text(encoding='utf-8')).get('pretrained_cfg') or {}
    except (OSError, ValueError, AttributeError):  # no exported folder: nothing states otherwise
        return
    try:
        differ = [f'{key} {list(stated[key])} there, {list(cfg.get(key) or ())} here' for key in _PREPROCESSING
                  if key in stated and [float(v) for v in stated[key]] != [float(v) for v in cfg.get(key) or ()]]
    except (TypeError, ValueError):  # not a config of ours (a null or a name for a mean): it states nothing we read
        return
    if differ:
        import warnings
        warnings.warn(f"{cfg['file']} is the weights of the exported folder {config.parent}, whose config.json "
                      f"states other preprocessing than this model gets ({'; '.join(differ)}), and perhaps other "
                      f"model arguments: load the folder whole with timm.create_model('local-dir:{config.parent}', "
                      f"pretrained=True)", UserWarning, stacklevel=4)


@contextmanager
def explain_unavailable_weights(variant: str, pretrained: bool, pretrained_cfg=None, pretrained_cfg_overlay=None,
                                cache_dir=None):
    """For ``pretrained=True``: fail fast when uncached weights cannot be downloaded, and turn the Hub client's
    errors into one clear message."""
    if not pretrained:
        yield
        return
    cfg = _resolved_cfg(variant, pretrained_cfg, pretrained_cfg_overlay)
    _warn_of_the_folders_own_config(cfg)
    from timm.models._builder import _resolve_pretrained_source
    if cfg and not _resolve_pretrained_source(cfg)[0]:
        # timm would warn and return random weights: for a registered name that means "not published"
        raise PretrainedWeightsUnavailable(_not_published_message(variant))
    _fail_fast_if_hub_unreachable(variant, cfg, cache_dir)
    known = hub_read_errors()
    try:
        yield
    except tuple(known) as e:
        raise PretrainedWeightsUnavailable(_unavailable_message(
            variant, cfg.get('hf_hub_id'), hub_error_reason(e, known))) from None
