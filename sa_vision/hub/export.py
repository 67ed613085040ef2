""" A Hub folder of trained weights in timm's ``save_for_hf`` format, with model card, recipe and figure

``timm.create_model('local-dir:<folder>', pretrained=True)`` loads it; on the Hub, ``'hf-hub:<repo>'``.
"""
import copy
import json
import os
from pathlib import Path
from shlex import quote
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
from timm.data import resolve_data_config
from torch import Tensor

from ..errors import UserError
from ..io import atomic_folder, partial_name, usual_file_mode
from ..models.input_pad import black_after_normalization
from ..models.sa_state_dict import rename_old_keys
from ..tables import plural
from ..train.checkpoint import TRAINING_PROCESSES, Checkpoint, CheckpointError, read_checkpoint
from ..train.data import DatasetInfo, input_channels, per_channel, trained_dataset
from ..train.positional_epochs import (
    POSITIONAL_EPOCHS_FILE,
    positional_params,
    save_positional_trajectory,
    weights_epochs,
)
from ..train.weights_files import nonfinite_tensors
from .card import CARD_METRICS, card_accuracy, render_model_card, weights_described_by_card
from .labels import CARD_FIGURE_FILENAME, EXPORT_FILES, RECIPE_FILENAME, WeightsLabel, weights_label
from .publish import check_publish_target
from .record import published_recipe, repeat_command, training_processes

__all__ = ['ExportExistsError', 'check_export_folder', 'check_finite_weights', 'export_hub_folder', 'exported_config',
           'exported_input_config']


class ExportExistsError(UserError, FileExistsError):
    """The folder to export into holds other files than an export of the same weights: it is never replaced."""


def exported_input_config(info: DatasetInfo, trained_input_size: Sequence[int], model_args: Dict[str, Any],
                          mean: Sequence[float], std: Sequence[float]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(model_args to add, data config) of weights trained on ``info``'s images at ``trained_input_size``, such
    that timm's ``resolve_data_config`` + ``create_transform`` feed the exported model what training fed it.

    A dataset padded with black for training (Fashion-MNIST 28 -> 32) is exported with the border inside the model
    (``input_padding``, filled with black's value after the normalisation) and the images' own size as
    ``input_size``: timm's transforms can only stretch or pad with the mean's grey."""
    data_config = {'mean': tuple(mean), 'std': tuple(std), 'crop_pct': 1.0}
    pad = info.input_padding
    if not pad or model_args.get('input_padding'):  # nothing padded, or the model pads already
        return {}, data_config
    channels, height, width = trained_input_size
    data_config['input_size'] = (channels, height - 2 * pad, width - 2 * pad)
    return {'input_padding': pad, 'input_pad_value': black_after_normalization(mean, std)}, data_config


def exported_config(ckpt: Checkpoint, model, label: Optional[WeightsLabel] = None
                    ) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    """What exported weights say of themselves beyond their tensors, as ``save_for_hf`` takes it: (model_config:
    the tag and label names, model_args to add: the border of a padded dataset, data config: input size, mean /
    std). The Hub export writes it to config.json and its card's usage, ``sa-vision-prune`` to the pruned file's
    metadata. The preprocessing is the source's where it says one: what sa-vision-train fed the model, the
    ``pretrained_cfg`` of a Hub folder or a pruned file, or timm train.py's arguments; else the dataset's."""
    label = label or weights_label(ckpt)
    given = ckpt.meta.get('pretrained_cfg') or {}
    timm_args = ckpt.meta.get('args')  # what train.py resolved its data config from, as here
    source = ckpt.meta.get('data_config') or given or (resolve_data_config(timm_args, model=model) if timm_args else {})
    # the channels the weights take, which a registered cfg's (3, 32, 32) does not say of weights of in_chans=1; its
    # mean / std as timm's loaders fed them (a timm run's 3 values averaged) or as timm's save_for_hf writes them
    channels = input_channels(model)
    input_size = (channels, *(source.get('input_size') or model.pretrained_cfg['input_size'])[1:])
    pad_args, input_cfg = exported_input_config(
        label.dataset, input_size, ckpt.model_args, per_channel(source.get('mean') or label.dataset.mean, channels),
        per_channel(source.get('std') or label.dataset.std, channels))
    input_cfg.setdefault('input_size', tuple(input_size))  # a border inside the model already, or none
    # how timm's loaders crop and resize for these weights, where the source says: never guessed
    input_cfg.update({k: source[k] for k in ('crop_pct', 'crop_mode', 'interpolation') if source.get(k) is not None
                      and 'input_padding' not in pad_args})
    model_config = {'pretrained_cfg': {'tag': label.tag}}
    names = ckpt.label_names(model.num_classes, label.dataset)
    if names:
        model_config['label_names'] = list(names)
    return model_config, pad_args, input_cfg


def _save_card_figure(model, path: Path) -> bool:
    """The attention figure of ``sa_vision.research.plots`` for SA models (the baseline has none)."""
    from ..models.sa_cifar import SelfAttentionNet
    from ..research.plots import save_card_figure  # matplotlib, imported only when a card is written
    if not isinstance(model, SelfAttentionNet):
        return False
    save_card_figure(model, path)
    return path.is_file()


# what a file browser leaves in a folder it showed (macOS, Windows): no file of the user's, replaced with the rest
_DESKTOP_FILES = ('.DS_Store', 'Thumbs.db', 'desktop.ini')


def check_export_folder(out_dir: Union[str, os.PathLike]) -> None:
    """Refuse a folder no export may replace (:class:`ExportExistsError`): a file, or a folder holding files of no
    export (in a folder a link names, or a mounted volume, say). A missing folder is fine."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ExportExistsError(f'{out_dir} is a file, not a folder: move it, or export into another folder')
    passed_over = (*EXPORT_FILES, partial_name(out_dir), *_DESKTOP_FILES)
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in passed_over)
    if foreign:
        raise ExportExistsError(f'{out_dir} holds files that are not part of an export ({foreign}); '
                                f'choose an empty or new folder')


def _check_replaceable(out_dir: Path, tensors: Dict[str, Tensor], source: str, replace: bool,
                       record: Set[str]) -> None:
    """Refuse to write into ``out_dir`` unless what it holds is an export of exactly ``tensors`` (re-staged, e.g.
    with a new card) with no more of a training record than ``record`` (:func:`_export_record`), of no weights at
    all, or (``replace``) of any weights: an export of other weights is never replaced silently, nor one whose
    record the new export would lose, nor a file of no export (:func:`check_export_folder`)."""
    check_export_folder(out_dir)
    weights = out_dir / 'model.safetensors'
    if replace or not weights.is_file():
        return
    card = out_dir / 'README.md'
    held = weights_described_by_card(card.read_text(encoding='utf-8')) if card.is_file() else ''
    if _same_tensors(weights, tensors):
        lost = [what for what in _held_record(out_dir) if what not in record]
        if not lost:
            return
        # the same tensors without their run's record: a kept epoch's file of the epoch --export took, say
        raise ExportExistsError(
            f'{out_dir} already holds an export of the same weights as {source} with {", ".join(lost)}, which an '
            f'export of that file would not have: it is not replaced. Publish that folder as it is '
            f'(sa-vision-push-to-hub {quote(str(out_dir))}), export the checkpoint of the run these weights are of '
            f'(its model_best.pth.tar or last.pth.tar, which carry the record), or stage these weights in another '
            f'folder')
    raise ExportExistsError(
        f'{out_dir} already holds an export of other weights than {source} ({held or "its card names none"}), '
        f'and is not replaced. Publish that folder as it is (sa-vision-push-to-hub {quote(str(out_dir))}), stage these '
        f'weights in another folder, or remove {quote(str(out_dir))} first')


# what an export holds of its weights' training record, in the words of the refusal to lose it
_RECIPE, _EPOCHS, _NAMES, _DATASET, _ACCURACY = (
    f'its recipe ({RECIPE_FILENAME})', f'the centres of its kept epochs ({POSITIONAL_EPOCHS_FILE})',
    'its label names', 'the dataset it names', 'the accuracy its card records')


def _export_record(ckpt: Checkpoint, recipe: Dict[str, Any], epochs: Dict[str, Dict[str, Tensor]],
                   names: Optional[Sequence[str]]) -> Set[str]:
    """What of a training record an export of ``ckpt`` holds (:func:`_held_record` reads it back)."""
    metrics = ckpt.meta.get('metrics') or {}
    return {what for what, held in (
        (_RECIPE, recipe), (_EPOCHS, any(positional_params(sd) for sd in epochs.values())), (_NAMES, names),
        (_DATASET, trained_dataset(ckpt.meta) is not None), (_ACCURACY, any(k in metrics for k, _ in CARD_METRICS)),
    ) if held}


def _held_record(out_dir: Path) -> List[str]:
    """What of a training record the export in ``out_dir`` holds (unreadable files hold none)."""
    try:
        config = json.loads((out_dir / 'config.json').read_text(encoding='utf-8'))
        cfg = config.get('pretrained_cfg') or {}
    except Exception:  # noqa: BLE001  a broken config.json records nothing
        config, cfg = {}, {}
    try:
        accuracy = card_accuracy((out_dir / 'README.md').read_text(encoding='utf-8'))
    except Exception:  # noqa: BLE001  nor a card of no model-index
        accuracy = {}
    return [what for what, held in (
        (_RECIPE, (out_dir / RECIPE_FILENAME).is_file()), (_EPOCHS, (out_dir / POSITIONAL_EPOCHS_FILE).is_file()),
        (_NAMES, config.get('label_names')), (_DATASET, trained_dataset({'pretrained_cfg': cfg}) is not None),
        (_ACCURACY, accuracy),
    ) if held]


def check_finite_weights(state_dict: Dict[str, Tensor], source: str) -> None:
    """Refuse weights that hold NaN or inf (a run that diverged): an export or a push would publish them."""
    broken = nonfinite_tensors(state_dict)
    if broken:
        named = ', '.join(broken[:3]) + (', ...' if len(broken) > 3 else '')
        raise CheckpointError(f'{source} holds weights that are not numbers (NaN or inf in '
                              f'{plural(len(broken), "tensor")}: {named}): weights of a run that diverged, which '
                              f'nothing exports. Train again with a lower --lr')


def _check_not_the_source(out_dir: Path, ckpt: Checkpoint) -> None:
    """Refuse to export into the folder the weights are read from (an export of an export, a Hub cache's)."""
    read_from = Path(ckpt.source).resolve()
    if out_dir.resolve() in (read_from, *read_from.parents):
        raise ExportExistsError(
            f'{out_dir} holds the weights to export ({ckpt.source}): an export there would replace its card, '
            f'recipe and figures with ones made from the weights alone. Publish the folder as it is '
            f'(sa-vision-push-to-hub {quote(str(ckpt.source))}), or stage a copy of it in another folder '
            f'(--out-dir DIR)')


def _same_tensors(path: Path, tensors: Dict[str, Tensor]) -> bool:
    from safetensors.torch import load_file
    try:
        held = load_file(str(path))
    except Exception:  # noqa: BLE001  an unreadable file holds no weights we could match
        return False
    held = rename_old_keys(held)  # an export of an earlier sa_vision, e.g. the kept zoo's
    return held.keys() == tensors.keys() and all(
        held[k].dtype == t.dtype and torch.equal(held[k], t.cpu()) for k, t in tensors.items())


def export_hub_folder(
        source: Union[str, os.PathLike, Checkpoint],
        out_dir: Union[str, os.PathLike],
        expected_arch: Optional[str] = None,
        repo_id: Optional[str] = None,
        figure: bool = True,
        use_ema: bool = False,
        epochs: Optional[Dict[str, Dict[str, Tensor]]] = None,
        dtype: Union[str, torch.dtype, None] = None,
        replace: bool = False,
) -> List[str]:
    """Write a Hub folder of trained weights (an earlier export of the same weights is replaced, and with
    ``replace`` one of other weights, as ``--export`` replaces a run's; else one of other weights, or files of no
    export, are an :class:`ExportExistsError`); return the names of the files written. ``epochs``
    keeps the centres and precision factors per epoch (paper Fig. 3), by default those the weights' run kept up to
    their epoch, or those a Hub folder keeps (:func:`~sa_vision.train.positional_epochs.weights_epochs`). ``dtype``
    (e.g. ``'bfloat16'``: half the bytes; a name or a torch.dtype) stores the floating weights in that dtype; a
    float32 model loads them as they were rounded."""
    import yaml
    from timm.models import save_for_hf
    ckpt = source if isinstance(source, Checkpoint) else read_checkpoint(source, arch=expected_arch, use_ema=use_ema)
    if expected_arch and ckpt.arch != expected_arch:
        raise CheckpointError(f'{ckpt.source} holds a {ckpt.arch} model, not {expected_arch}')
    model = ckpt.create_model()  # fails on weights that do not fit the architecture
    check_finite_weights(model.state_dict(), ckpt.source)
    epochs = weights_epochs(ckpt) if epochs is None else epochs
    label = weights_label(ckpt)
    repo_id = repo_id or label.default_repo_id
    check_publish_target(label, repo_id)
    dtype = _stored_dtype(dtype)
    saved = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
    out_dir = Path(out_dir)
    _check_not_the_source(out_dir, ckpt)
    recipe = published_recipe(ckpt)
    record = _export_record(ckpt, recipe, epochs, ckpt.label_names(model.num_classes, label.dataset))
    _check_replaceable(out_dir, saved.state_dict(), ckpt.source, replace, record)  # a missing folder is fine
    with atomic_folder(out_dir) as folder:  # an earlier export stays whole until this one is
        model_config, pad_args, input_cfg = exported_config(ckpt, model, label)
        if recipe:  # kept for an export of this export, whose recipe.yaml repeats the run
            model_config[TRAINING_PROCESSES] = training_processes(ckpt)
        # the registered cfg's label_names are CIFAR-10's: never carried over to weights of another dataset
        saved.pretrained_cfg = {**saved.pretrained_cfg, 'label_names': None}
        save_for_hf(saved, folder, safe_serialization=True, model_config=model_config, model_args=pad_args,
                    data_config=input_cfg)
        if recipe:  # weights without a training record have no run to repeat (an empty recipe starts the default one)
            with open(folder / RECIPE_FILENAME, 'w', encoding='utf-8') as f:
                trainer = 'timm train.py' if ckpt.format == 'timm' else 'sa-vision-train'
                f.write(f'# training arguments of {label.name} ({trainer} argument names): '
                        f'{repeat_command(ckpt, RECIPE_FILENAME, ("needed", "optional"))} repeats the run\n')
                yaml.safe_dump(recipe, f, sort_keys=False)
        if epochs and any(positional_params(sd) for sd in epochs.values()):
            save_positional_trajectory(epochs, folder / POSITIONAL_EPOCHS_FILE)
        has_figure = figure and _save_card_figure(model, folder / CARD_FIGURE_FILENAME)
        readme = render_model_card(ckpt, model, label, repo_id, input_cfg['input_size'][-1], has_figure=has_figure,
                                   exported_args=pad_args, stored_dtype=dtype)
        (folder / 'README.md').write_text(readme, encoding='utf-8')
        written = sorted(folder.iterdir())
        for path in written:  # safetensors writes through a temporary file of mode 0600
            usual_file_mode(path)
    return [path.name for path in written]


def _stored_dtype(dtype: Union[str, torch.dtype, None]) -> torch.dtype:
    """A name of torch's ('bfloat16', 'half') or a torch.dtype of a floating type."""
    stored = torch.float32 if dtype is None else getattr(torch, str(dtype).removeprefix('torch.'), None)
    if stored not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise ValueError(f'dtype={dtype!r}: the weights are stored as float32, float16, bfloat16 or float64 (a name '
                         f'or a torch.dtype)')
    return stored
