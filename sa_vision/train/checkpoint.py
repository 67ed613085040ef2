""" Checkpoints: one reader for every kind of weights file a user has (files are written through
:mod:`sa_vision.io`, read through :mod:`.weights_files`)

:func:`read_checkpoint` opens, without unpickling arbitrary objects (timm's ``argparse.Namespace`` is the one class
allowed beyond ``weights_only``): checkpoints of ``sa-vision-train`` and timm's ``train.py``, bare state dicts and
``.safetensors`` (a sa_vision attention model's architecture is read off the shapes) and Hub folders. """
import argparse
import os
import re
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from timm.models import clean_state_dict, is_model
from torch import Tensor, nn

from ..io import plain_data
from ..models import (
    DEFAULT_MODEL_OF_KIND,
    MODEL_NAMES,
    SA_MODEL_ARGS,
    SelfAttentionNet,
    UnknownModelError,
    create_named_model,
    infer_cifar_resnet_args,
    infer_sa_model_args,
    is_sa_state_dict,
    model_class,
    model_name_hint,
)
from ..models.sa_state_dict import SA_STATE_DICT_KEYS, rename_old_keys
from .args import RUNTIME_ARGS
from .checkpoint_record import TRAINING_PROCESSES, Checkpoint
from .recipes import recipe_if_any
from .timm_args import timm_data_flags, timm_model_args, timm_num_epochs
from .weights_files import (  # the file names: here for their readers, there for args.py, which this imports
    BEST_CHECKPOINT,
    RUN_CHECKPOINT,
    WEIGHT_SUFFIXES,
    CheckpointError,
    check_config_fields,
    read_json,
    read_safetensors,
    torch_load,
)

__all__ = ['CHECKPOINT_VERSION', 'CheckpointError', 'Checkpoint', 'RUN_CHECKPOINT', 'BEST_CHECKPOINT',
           'read_checkpoint', 'weights_path', 'load_model', 'infer_model_args',
           'strip_runtime_args', 'RUNTIME_ARGS', 'TRAINING_PROCESSES', 'WEIGHT_SUFFIXES']

# 2: model_args hold every argument given to timm.create_model (num_classes, drop rates, ...), 'recipe' added
# 3: 'epoch' is the last epoch done, from 0, as timm's CheckpointSaver writes it (up to 2: the epochs done)
CHECKPOINT_VERSION = 3
PathLike = Union[str, os.PathLike]

_STATE_DICT_KEYS = ('state_dict', 'model', 'state_dict_ema')
# where other trainers keep EMA weights: timm's load_state_dict(use_ema=True) takes them first, in this order
_EMA_KEYS = ('state_dict_ema', 'model_ema')
# weight names timm.create_model takes (it loads them, as with pretrained=True)
LOCAL_DIR_PREFIX, HF_HUB_PREFIX = 'local-dir:', 'hf-hub:'


def strip_runtime_args(args: Dict[str, Any]) -> Dict[str, Any]:
    """The training arguments of a run without :data:`~sa_vision.train.args.RUNTIME_ARGS`."""
    return {k: v for k, v in args.items() if k not in RUNTIME_ARGS}


def infer_model_args(state_dict: Dict[str, Tensor]) -> Dict[str, Any]:
    """Architecture kwargs (with ``attn_kind``) of a :class:`~sa_vision.models.SelfAttentionNet`, read off a state
    dict's shapes (:func:`~sa_vision.models.infer_sa_model_args`)."""
    args = infer_sa_model_args(state_dict)
    if args is None:
        missing = [k for k in SA_STATE_DICT_KEYS if k not in state_dict]
        raise CheckpointError(f'not a sa_vision self-attention state dict (no {", ".join(missing)}); the '
                              f'architecture of other weights cannot be read off their shapes, name it instead')
    return args


def _from_state_dict(state_dict: Dict[str, Tensor], path: Path, fmt: str, arch: Optional[str],
                     model_args: Dict[str, Any], meta: Dict[str, Any]) -> Checkpoint:
    """A checkpoint of bare weights: the architecture from ``arch`` / stored args, or read off SA shapes."""
    state_dict = clean_state_dict(state_dict)
    if is_sa_state_dict(state_dict):
        inferred = infer_model_args(state_dict)
        kind = inferred.pop('attn_kind')  # the registered model of a kind sets it itself
        if arch in SA_MODEL_ARGS and SA_MODEL_ARGS[arch]['attn_kind'] != kind:
            raise CheckpointError(f'{path} holds a {DEFAULT_MODEL_OF_KIND[kind]} model ({kind} attention), not {arch}; '
                                  f'pass weights of {arch} or use --model {DEFAULT_MODEL_OF_KIND[kind]}')
        if arch is None or not issubclass(model_class(arch) or SelfAttentionNet, SelfAttentionNet):
            arch = DEFAULT_MODEL_OF_KIND[kind]  # not an attention model (e.g. resnet18_cifar): read_checkpoint says so
        model_args = {**inferred, **model_args}
    elif arch is None and (resnet_args := infer_cifar_resnet_args(state_dict)) is not None:
        arch = 'resnet18_cifar'
        model_args = {**resnet_args, **model_args}
    if arch is None and 'epochs' in meta:  # a positional_epochs.safetensors: a run's, or a Hub folder's (explorer's)
        run = (path.parent / RUN_CHECKPOINT).is_file()
        raise CheckpointError(
            f'{path} holds the centres and precision factors of kept epochs ({len(state_dict)} tensors), not a '
            f"model's weights: pass the folder it is in ({'' if run else 'local-dir:'}{path.parent}), whose "
            f"{RUN_CHECKPOINT if run else 'model.safetensors'} they go with")
    if arch is None:
        raise CheckpointError(
            f'{path} holds bare weights ({len(state_dict)} tensors, e.g. {sorted(state_dict)[:3]}) that are '
            f'neither of a sa_vision model ({", ".join(MODEL_NAMES)}: read off the '
            f'shapes) nor named; pass the timm model name they are of, e.g. --model vit_tiny_patch16_224 '
            f'(timm.list_models() lists them)')
    if arch not in SA_MODEL_ARGS and 'num_classes' not in model_args:
        model_args = {**_classifier_width(arch, state_dict), **model_args}
    return Checkpoint(arch, model_args, state_dict, str(path), fmt, meta)


def _classifier_width(arch: str, state_dict: Dict[str, Tensor]) -> Dict[str, Any]:
    """``num_classes`` of timm model ``arch`` read off its classifier weight (as timm's loading does), or {}."""
    import timm
    from timm.models import get_pretrained_cfg_value
    try:
        classifier = get_pretrained_cfg_value(arch, 'classifier') if timm.is_model(arch) else None
    except Exception:  # noqa: BLE001 -- a model without a pretrained cfg: num_classes stays its default
        classifier = None
    names = classifier if isinstance(classifier, (list, tuple)) else [classifier] if classifier else []
    weights = [state_dict.get(f'{name}.weight') for name in names]
    if weights and weights[0] is not None and weights[0].dim() >= 1:
        return {'num_classes': int(weights[0].shape[0])}
    return {}


def _read_hub_folder(folder: Path) -> Checkpoint:
    config_path = folder / 'config.json'
    # what a run writes once an epoch has ended (with last.pth.tar, which may have been moved since): summary.csv,
    # --save-epoch-weights' files after epoch-000 (the initialisation)
    kept = sorted(p for p in folder.glob('epoch-*.safetensors') if p.name != 'epoch-000.safetensors')
    if (not config_path.is_file() and not (folder / BEST_CHECKPOINT).is_file() and (folder / 'args.yaml').is_file()
            and not kept and not (folder / 'summary.csv').is_file()):
        # the folder of a run (sa-vision-train, timm train.py) whose first epoch has not ended: no weights yet
        raise CheckpointError(
            f'{folder} is a run folder (args.yaml) in which no epoch has finished: it holds no {RUN_CHECKPOINT} yet. '
            f'A run still in its first epoch writes it when that epoch ends; a run killed before then has nothing '
            f'to resume, export or evaluate: delete {folder} and start the run again (docs/training.md, "Run '
            f'folders and checkpoints")')
    if not config_path.is_file():
        best = folder / BEST_CHECKPOINT
        raise CheckpointError(
            f'{folder} holds neither the {RUN_CHECKPOINT} of a run (sa-vision-train, timm train.py) nor the '
            f'config.json of a Hub folder'
            + (f'; it holds {BEST_CHECKPOINT}: pass that file, {best}' if best.is_file() else
               f'; it holds the weights of epochs it kept: pass one of them, e.g. {kept[-1]}' if kept else
               ': pass a checkpoint file, a run folder or an exported Hub folder'))
    weights = folder / 'model.safetensors'
    if weights.is_file():
        state_dict = read_safetensors(weights)[0]
    elif (folder / 'pytorch_model.bin').is_file():
        state_dict = torch_load(folder / 'pytorch_model.bin', 'cpu')
    else:
        raise CheckpointError(f'Hub folder {folder} has no model.safetensors (nor pytorch_model.bin)')
    hub = _read_hub_config(config_path)
    hub.state_dict = state_dict
    return hub


def _read_hub_config(config_path: Path) -> Checkpoint:
    """A Hub folder's config.json as a Checkpoint without weights: architecture, model_args, pretrained meta."""
    folder = config_path.parent
    config = read_json(config_path.read_text(encoding='utf-8'), config_path, 'config.json')
    if 'architecture' not in config:
        raise CheckpointError(f'{config_path} names no architecture: not a timm config.json')
    check_config_fields(config, config_path, 'config.json')
    model_args = dict(config.get('model_args') or {})
    if 'num_classes' in config:
        model_args.setdefault('num_classes', config['num_classes'])
    # the top-level fields timm's local-dir: loading folds into the pretrained_cfg (timm.models._hub)
    meta = _pretrained_meta({**(config.get('pretrained_cfg') or {}),
                             **{k: config[k] for k in ('num_classes', 'label_names', 'label_descriptions')
                                if k in config}})
    if recipe := recipe_if_any(folder / 'recipe.yaml'):  # an export's training arguments
        meta['recipe'] = recipe
    if TRAINING_PROCESSES in config:
        meta[TRAINING_PROCESSES] = config[TRAINING_PROCESSES]
    return Checkpoint(config['architecture'], model_args, {}, str(folder), 'hub_folder', meta)


def _fine_tuned_folder(name: str, path: Path, args: Dict[str, Any]) -> Tuple[str, Dict[str, Any], Dict[str, Any]]:
    """(architecture, model_args, data config) of timm train.py weights fine-tuned from ``local-dir:<folder>``,
    as train.py built and fed them: the folder's config.json, under the run's own flags (--input-size, --mean, ...).
    Not its label names: train.py records none of what it fine-tuned on."""
    folder = Path(name[len(LOCAL_DIR_PREFIX):]) / 'config.json'
    if not folder.is_file():
        raise CheckpointError(f'{path} was fine-tuned by timm\'s train.py from {name}, whose config.json is gone: '
                              f'pass --model with its architecture (and --model-kwargs with its arguments), or put '
                              f'the folder back')
    hub = _read_hub_config(folder)
    cfg = {k: hub.meta['pretrained_cfg'][k] for k in ('input_size', 'mean', 'std')
           if k in hub.meta.get('pretrained_cfg', {})}
    return hub.arch, hub.model_args, {**cfg, **timm_data_flags(args, hub.model_args)}


def _pretrained_meta(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """The meta of weights that carry timm's ``pretrained_cfg`` (a Hub folder's config.json, a pruned file's
    metadata): the cfg, and the dataset its tag names (``fashion_mnist_custom`` -> fashion-mnist)."""
    from .data import dataset_for_tag
    return {'pretrained_cfg': cfg, 'dataset': dataset_for_tag(cfg.get('tag') or '', cfg.get('num_classes'))}


def read_checkpoint(source: PathLike, arch: Optional[str] = None, model_args: Optional[Dict[str, Any]] = None,
                    use_ema: Optional[bool] = False, map_location='cpu') -> Checkpoint:
    """Open weights of any supported kind (see the module docstring); ``source`` may be a run folder, ``arch``
    names bare weights and is checked against the file's, ``model_args`` override what the shapes say; ``use_ema``
    None takes a timm checkpoint's EMA where it holds one, as timm's ``load_checkpoint`` does. The state dict holds
    today's key names (:data:`~sa_vision.models.sa_state_dict.RENAMED_KEYS`)."""
    path = Path(source)
    if arch is not None and not is_model(arch):  # else "holds X, not <typo>; pass weights of <typo>"
        raise UnknownModelError(f'unknown model {arch!r}: {model_name_hint(arch)}')
    if path.is_dir() and not (path / 'config.json').is_file() and (path / RUN_CHECKPOINT).is_file():
        path = path / RUN_CHECKPOINT  # a run folder of sa-vision-train: its latest checkpoint
    if path.is_dir():
        ckpt = _read_hub_folder(path)
        ckpt.model_args.update(model_args or {})
    elif not path.is_file():
        raise CheckpointError(f'{path} does not exist: pass a checkpoint file (last.pth.tar of a run, a state dict, '
                              f'a .safetensors file), a run folder or an exported Hub folder')
    elif path.suffix == '.safetensors':
        state_dict, metadata = read_safetensors(path)
        stored_args = (read_json(metadata['model_args'], path, "metadata 'model_args'")
                       if 'model_args' in metadata else {})
        if not isinstance(stored_args, dict):
            raise CheckpointError(f"{path}: metadata 'model_args' must be a JSON object of create_model keywords, "
                                  f'got {type(stored_args).__name__}; re-save the file with sa-vision-prune or '
                                  f'drop the metadata and name the model')
        meta = {k: v for k, v in metadata.items() if k not in ('arch', 'model_args', 'pretrained_cfg')}
        if 'pretrained_cfg' in metadata:  # sa-vision-prune's: the preprocessing of the weights it pruned
            cfg = read_json(metadata['pretrained_cfg'], path, "metadata 'pretrained_cfg'")
            check_config_fields({'pretrained_cfg': cfg}, path, 'metadata')
            meta.update(_pretrained_meta(cfg))
        ckpt = _from_state_dict(state_dict, path, 'safetensors', metadata.get('arch') or arch,
                                {**stored_args, **(model_args or {})}, meta)
    else:
        obj = torch_load(path, map_location)
        if not isinstance(obj, dict) or not obj:
            raise CheckpointError(f'{path} holds a {type(obj).__name__}, not a checkpoint or a state dict')
        ckpt = _from_loaded_dict(obj, path, arch, model_args or {}, use_ema)
    if use_ema and ckpt.meta.get('ema_weights') is not True:
        raise CheckpointError(f'{path} is a {ckpt.format} checkpoint without EMA weights (a checkpoint of timm '
                              f"train.py's --model-ema holds them, or a dict under {' or '.join(_EMA_KEYS)}); "
                              f'drop --use-ema')
    if arch and ckpt.arch != arch:
        raise CheckpointError(f'{path} holds a {ckpt.arch} model, not {arch}; pass weights of {arch} or use '
                              f'--model {ckpt.arch}')
    ckpt.given_args = tuple(model_args or ())
    ckpt.state_dict = rename_old_keys(dict(ckpt.state_dict))  # weights saved under an old name: today's names
    return ckpt


def _from_loaded_dict(obj: Dict[str, Any], path: Path, arch: Optional[str], model_args: Dict[str, Any],
                      use_ema: Optional[bool]) -> Checkpoint:
    if all(isinstance(v, Tensor) for v in obj.values()):
        return _from_state_dict(obj, path, 'state_dict', arch, model_args, {})
    if isinstance(obj.get('args'), argparse.Namespace) or obj.get('version') == 2 and 'saver' in obj:
        # timm train.py: {'epoch', 'arch', 'state_dict', 'optimizer', 'version': 2, 'args': Namespace, ...}
        args = vars(obj['args']) if isinstance(obj.get('args'), argparse.Namespace) else {}
        use_ema = obj.get('state_dict_ema') is not None if use_ema is None else use_ema
        key = 'state_dict_ema' if use_ema else 'state_dict'
        if key not in obj:
            raise CheckpointError(f'{path} is a timm train.py checkpoint without {key!r}'
                                  + (' (trained without --model-ema); drop --use-ema' if use_ema else ''))
        meta = {k: v for k, v in obj.items() if k not in ('args', 'state_dict', 'state_dict_ema')}
        if 'epoch' in meta and int(obj.get('version', 1)) > 1:  # from 0, as timm's resume_checkpoint reads it
            meta['epoch'] += 1
        meta['args'] = plain_data(args)
        meta['recipe'] = strip_runtime_args(meta['args'])
        meta['dataset'] = args.get('dataset', '')
        meta['num_epochs'] = timm_num_epochs(args) if args else None
        meta['ema_weights'] = use_ema
        if 'metric' in obj:
            # train.py saves the score of the EMA where it evaluates one (--model-ema without
            # --model-ema-force-cpu): a score is the exported weights' only where they are the weights scored
            meta['scored_weights'] = 'ema' if args.get('model_ema') and not args.get('model_ema_force_cpu') else 'model'
            if (meta['scored_weights'] == 'ema') == use_ema:
                meta['metrics'] = {args.get('eval_metric', 'top1'): obj['metric']}
        stored = timm_model_args(args) if args else {}
        trained_arch = obj.get('arch') or args.get('model') or arch
        if trained_arch and trained_arch.startswith(LOCAL_DIR_PREFIX):  # a fine-tune of --model local-dir:<folder>
            trained_arch, folder_args, meta['data_config'] = _fine_tuned_folder(trained_arch, path, args)
            stored = {**folder_args, **stored}
        return Checkpoint(trained_arch, {**stored, **model_args}, clean_state_dict(obj[key]), str(path), 'timm', meta)
    if all(k in obj for k in ('arch', 'model_args', 'state_dict')):
        if int(obj.get('version', 1)) > CHECKPOINT_VERSION:
            raise CheckpointError(f'{path} was written by a newer sa_vision (checkpoint version {obj["version"]}, '
                                  f'this one reads up to {CHECKPOINT_VERSION}); upgrade sa_vision')
        meta = {k: v for k, v in obj.items() if k not in ('arch', 'model_args', 'state_dict')}
        if 'epoch' in meta and int(obj.get('version', 1)) >= 3:  # counted from 0 (CHECKPOINT_VERSION)
            meta['epoch'] += 1
        stored = {**obj['model_args'], **_version_1_flags(obj)}
        # a wrapped model's keys (DDP's 'module.', torch.compile's '_orig_mod.'), as the other formats take them
        return Checkpoint(obj['arch'], {**stored, **model_args}, clean_state_dict(obj['state_dict']),
                          str(path), 'sa_vision', meta)
    return _from_wrapped_state_dict(obj, path, arch, model_args, use_ema)


def _from_wrapped_state_dict(obj: Dict[str, Any], path: Path, arch: Optional[str], model_args: Dict[str, Any],
                             use_ema: Optional[bool]) -> Checkpoint:
    """Weights under one of the keys other trainers use; their EMA's first unless ``use_ema`` is False, as
    timm's ``load_checkpoint`` (and its train.py's --initial-checkpoint) takes them."""
    for key in (*_EMA_KEYS, *_STATE_DICT_KEYS) if use_ema is not False else _STATE_DICT_KEYS:
        if isinstance(obj.get(key), dict) and obj[key] and all(isinstance(v, Tensor) for v in obj[key].values()):
            stored = obj.get('model_args') if isinstance(obj.get('model_args'), dict) else {}
            ema = {'ema_weights': True, 'ema_key': key} if key in _EMA_KEYS else {}
            return _from_state_dict(obj[key], path, 'state_dict', obj.get('arch') or arch, {**stored, **model_args},
                                    ema)
    raise CheckpointError(
        f'{path} is a dict of {sorted(obj)[:8]} but holds no weights under any of {list(_STATE_DICT_KEYS)}: not a '
        f'checkpoint of sa-vision-train or timm train.py, nor a state dict')


def _version_1_flags(obj: Dict[str, Any]) -> Dict[str, Any]:
    """The create_model keywords a version 1 checkpoint keeps only in its training ``'args'``: its ``'model_args'``
    were the --model-kwargs alone, and training added --num-classes, --drop and --drop-path where given."""
    args = obj.get('args')
    if int(obj.get('version', 1)) >= 2 or not isinstance(args, dict):
        return {}
    flags = (('num_classes', 'num_classes'), ('drop_rate', 'drop'), ('drop_path_rate', 'drop_path'))
    return {key: args[name] for key, name in flags if args.get(name) is not None}


def weights_path(source: Union[str, os.PathLike]) -> Optional[Path]:
    """The file or folder of weights that ``source`` names for :func:`load_model` (``local-dir:<folder>``, a path,
    a name with a weights suffix or a folder separator), or None for a model name."""
    if isinstance(source, os.PathLike):  # a Path, as a glob gives
        return Path(source)
    if not isinstance(source, str):
        raise TypeError(f'expected a file, a folder or a model name (a str or a path), not a {type(source).__name__}')
    if source.startswith(LOCAL_DIR_PREFIX):
        folder = Path(source[len(LOCAL_DIR_PREFIX):])
        if not folder.is_dir():
            raise CheckpointError(f'{source}: {folder} is not a folder; local-dir: names an exported Hub folder '
                                  f'(config.json + model.safetensors), e.g. <run>/hub of sa-vision-train --export')
        return folder
    path = Path(source)
    # a path that is not there (timm would only say it has no source prefix): read_checkpoint names it
    if path.exists() or source.endswith(WEIGHT_SUFFIXES) or _looks_like_path(source):
        return path
    return None


def load_model(source: Union[str, os.PathLike], pretrained: bool = False, use_ema: bool = False, **kwargs) -> nn.Module:
    """A model in eval mode from a file or Hub folder (:func:`read_checkpoint`), a timm model name, or a name of
    weights (``local-dir:<folder>``, ``hf-hub:<repo>``: always loaded); ``kwargs`` are construction arguments."""
    path = weights_path(source)
    if path is not None:
        return read_checkpoint(path, model_args=kwargs, use_ema=use_ema).create_model()
    pretrained = pretrained or source.startswith(HF_HUB_PREFIX)
    try:
        return create_named_model(source, pretrained=pretrained, **kwargs).eval()
    except UnknownModelError:
        raise CheckpointError(f'{source!r} is neither a file, a Hub folder, local-dir:<folder>, hf-hub:<repo> nor '
                              f'a timm model name ({model_name_hint(source)})') from None


def _looks_like_path(source: str) -> bool:
    """A name with a folder separator and no ``<source>:`` prefix, which timm refuses as a model name."""
    return any(sep in source for sep in ('/', os.sep)) and not re.match(r'[a-zA-Z][a-zA-Z0-9+.\-_]+:', source)
