""" A registered model built from a name and keywords a user typed: ``timm.create_model``, with a
:class:`~sa_vision.errors.UserError` for an unknown name (the registered names closest to it) or a keyword the model
does not take (where it came from and the closest the model takes), or a value the model refuses, the mistakes
timm reports only as a ``RuntimeError``, ``TypeError`` or ``ValueError`` from deep inside """
import difflib
import inspect
import re
from contextlib import contextmanager
from typing import List, Mapping, Optional

import timm
from timm.models import is_model, model_entrypoint, parse_model_name
from torch import nn

from ..errors import UserError
from ._pretrained import PretrainedWeightsUnavailable, hub_error_reason, hub_read_errors, hub_unreachable

__all__ = ['UnknownModelError', 'StoredArgsSource', 'RATE_KEYWORD', 'model_name_hint', 'model_class',
           'model_keywords', 'create_named_model']

_UNEXPECTED_KEYWORD = re.compile(r"got an unexpected keyword argument '(\w+)'")
_PYTHON_SUGGESTION = re.compile(r"\.? ?Did you mean '[^']*'\?$")  # Python 3.13 adds it to the TypeError
_UNKNOWN_MODEL = re.compile(r'Unknown model \((.*)\)')


class UnknownModelError(UserError):
    """A model name timm has not registered: a typo, or the package that registers it is not imported."""


class StoredArgsSource(str):
    """Where a keyword stored with weights came from, as an error names it (a ``kwargs_sources`` value of
    :func:`create_named_model`): the arguments stored with ``weights`` (a file, a Hub folder). Its type, not its
    text, tells it from a source a user gave (``--model-kwargs``, a recipe's model_kwargs)."""

    def __new__(cls, weights: object):
        return super().__new__(cls, f'the arguments stored with {weights}')


def model_name_hint(name: str) -> str:
    """What to tell a user whose model name timm does not know: the registered names closest to it."""
    near = difflib.get_close_matches(name, timm.list_models(), n=1, cutoff=0.6)
    if near:
        return f'did you mean {near[0]!r}?'
    return 'timm.list_models() lists the registered names'


def model_class(name: str) -> Optional[type]:
    """The class registered model ``name`` builds, read off the return annotation of timm's entry point (timm's
    models and ours have one), or None where there is none."""
    if not is_model(name):
        return None
    cls = inspect.signature(model_entrypoint(name)).return_annotation
    return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


def _model_parameters(name: str) -> Optional[List[inspect.Parameter]]:
    """The keyword parameters of the class of registered model ``name`` (its ``__init__``'s, and its bases' as far
    as ``**kwargs`` passes them on), or None where the class is not known (:func:`model_class`)."""
    cls = model_class(name)
    if cls is None:
        return None
    found: List[inspect.Parameter] = []
    for klass in cls.__mro__:
        if klass is nn.Module:
            break
        params = list(inspect.signature(klass.__init__).parameters.values())[1:]  # without self
        found += [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and all(p.name != q.name for q in found)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return found


def model_keywords(name: str) -> Optional[List[str]]:
    """The keyword arguments the class of registered model ``name`` takes, or None where the class is not known."""
    params = _model_parameters(name)
    return None if params is None else [p.name for p in params]


def _check_number_keywords(name: str, kwargs: Mapping, kwargs_sources: Optional[Mapping[str, str]]) -> None:
    """A text value for a keyword whose default is a number (``--model-kwargs embed_dim=abc``, parsed as text where
    it is no literal) fails deep inside a layer's construction: say which keyword wants a number."""
    for param in _model_parameters(name) or ():
        value = kwargs.get(param.name)
        if isinstance(value, str) and type(param.default) in (int, float, bool):
            source = (kwargs_sources or {}).get(param.name, '--model-kwargs')
            wanted = {int: 'a whole number', float: 'a number', bool: 'True or False'}[type(param.default)]
            raise UserError(f'{name}: {param.name}={value!r} (from {source}) is text, but {param.name} takes '
                            f'{wanted} (default {param.default!r})')


# timm.create_model's keywords that say where weights are loaded from, rather than how the model is built
WEIGHTS_SOURCE_KEYWORDS = ('pretrained', 'pretrained_cfg', 'pretrained_cfg_overlay', 'checkpoint_path', 'cache_dir')


def _check_stored_keywords(name: str, kwargs: Mapping, kwargs_sources: Optional[Mapping[str, str]]) -> None:
    """Keywords stored with weights (a Hub folder's ``model_args``, a file's metadata) build the model. One that
    says where to load weights from would make a downloaded file read other files or ask the Hub: refused."""
    for key in WEIGHTS_SOURCE_KEYWORDS:
        source = (kwargs_sources or {}).get(key, '--model-kwargs')
        if key in kwargs and source != '--model-kwargs':
            raise UserError(f'{name}: {key}={kwargs[key]!r} (from {source}) says where to load weights from, not '
                            f'how to build the model, and is not taken from a file: remove it there, or pass it '
                            f'yourself (--model-kwargs) if you trust what it names')


# the dropout and stochastic-depth probabilities of timm's models and ours (drop_rate, proj_drop_rate, ...)
RATE_KEYWORD = re.compile(r'(^|_)drop(_path)?_rate$')


def _check_rate_keywords(name: str, kwargs: Mapping, kwargs_sources: Optional[Mapping[str, str]]) -> None:
    """A dropout probability outside [0, 1] fails inside ``nn.Dropout`` with a message that names no keyword:
    say which one."""
    for key, value in kwargs.items():
        if RATE_KEYWORD.search(key) and isinstance(value, (int, float)) and not 0 <= value <= 1:
            source = (kwargs_sources or {}).get(key, '--model-kwargs')
            raise UserError(f'{name}: {key}={value!r} (from {source}) is a probability: it must be between 0 and 1')


def _hub_repo(name: str, kwargs: Mapping) -> Optional[str]:
    """The Hub repository ``timm.create_model(name, pretrained=True, **kwargs)`` reads, None where none is named."""
    source, model_id = parse_model_name(name)
    if source == 'hf-hub':
        return model_id
    from timm.models import resolve_pretrained_cfg
    cfg = resolve_pretrained_cfg(name, pretrained_cfg=kwargs.get('pretrained_cfg'),
                                 pretrained_cfg_overlay=kwargs.get('pretrained_cfg_overlay'))
    return getattr(cfg, 'hf_hub_id', None)


def _unreadable_repo(name: str, repo: Optional[str], why: str) -> PretrainedWeightsUnavailable:
    return PretrainedWeightsUnavailable(
        f'{name}: the Hugging Face Hub repository {repr(repo) if repo else "of its weights"} could not be read '
        f'({why}). Connect to '
        f'the network with HF_HUB_OFFLINE unset, or set HF_HUB_CACHE to a cache that holds it, or copy its files '
        f'(config.json, model.safetensors) into a folder and name that local-dir:<folder>')


@contextmanager
def _hub_errors(name: str, kwargs: Mapping):
    """The Hub client's "cannot reach / not found / not cached" errors for an ``hf-hub:`` name or pretrained
    weights as one :class:`PretrainedWeightsUnavailable` naming the repository and what to do; an ``hf-hub:``
    name whose config.json is not cached fails after one bounded request to a Hub that does not answer, not
    after huggingface_hub's minute of retries."""
    source, repo = parse_model_name(name)
    if source == 'hf-hub':
        reason = hub_unreachable(repo, ['config.json'], kwargs.get('cache_dir'), 'its config.json is')
        if reason is not None:
            raise _unreadable_repo(name, repo, reason)
    known = hub_read_errors()
    try:
        yield
    except tuple(known) as e:
        raise _unreadable_repo(name, _hub_repo(name, kwargs), hub_error_reason(e, known)) from e


def create_named_model(name: str, pretrained: bool = False, kwargs_sources: Optional[Mapping[str, str]] = None,
                       **kwargs) -> nn.Module:
    """``timm.create_model(name, pretrained, **kwargs)``; ``kwargs_sources`` says where each keyword came from
    (``--model-kwargs`` where it does not), for the error of a keyword the model does not take."""
    _check_stored_keywords(name, {**kwargs, 'pretrained': pretrained} if pretrained else kwargs, kwargs_sources)
    _check_number_keywords(name, kwargs, kwargs_sources)
    _check_rate_keywords(name, kwargs, kwargs_sources)
    try:
        with _hub_errors(name, kwargs):
            return timm.create_model(name, pretrained=pretrained, **kwargs)
    except RuntimeError as e:
        unknown = _UNKNOWN_MODEL.search(str(e))
        if not unknown:
            raise
        if unknown.group(1) != name:  # local-dir: / hf-hub: weights of an architecture nothing imported registers
            raise UnknownModelError(
                f'{name} holds a {unknown.group(1)!r} model, which no imported package registers: import the package '
                f'that does (--device-modules PACKAGE), or {model_name_hint(unknown.group(1))}') from None
        raise UnknownModelError(f'unknown model {name!r}: {model_name_hint(name)}') from None
    except TypeError as e:
        match = _UNEXPECTED_KEYWORD.search(str(e))
        accepted = model_keywords(name)
        # a keyword the model takes, refused further down (a layer it builds), is no typo of the user's
        if not match or match.group(1) not in kwargs or match.group(1) in (accepted or ()):
            raise
        key = match.group(1)
        source = (kwargs_sources or {}).get(key, '--model-kwargs')
        near = difflib.get_close_matches(key, accepted or [], n=1, cutoff=0.75)
        # the reason the model's builder gives, where it gives one (Python 3.13's own ". Did you mean" is not one)
        own = _PYTHON_SUGGESTION.sub('', str(e)[match.end():]).strip(' :')
        hint = own or (f'did you mean {near[0]!r}?' if near else f'it takes {", ".join(accepted)}' if accepted else
                       str(e))
        raise UserError(f'{name} takes no keyword argument {key!r} ({key}={kwargs[key]!r}, from {source}): '
                        f'{hint}') from None
    except ValueError as e:
        if isinstance(e, UserError):
            raise
        # a value the model's own checks refuse (sa_args, the layers, timm's models) names its keyword; any other
        # ValueError is no mistake of the user's to report as one
        named = [f'{key}={value!r}, from {(kwargs_sources or {}).get(key, "--model-kwargs")}'
                 for key, value in kwargs.items() if re.search(rf'\b{re.escape(key)}\b', str(e))]
        if not named:
            raise
        raise UserError(f'{name} cannot be built ({"; ".join(named)}): {e}') from e
