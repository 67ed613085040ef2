""" The attention explorer: one self-contained HTML page to look into every head of every layer (paper Figs. 3-6)

Needs no server (``explorer.html`` here is the template); the page computes the positional kinds' probabilities
from their parameters, so every query works and the page stays small (docs/reproduction.md). """
import base64
import contextlib
import json
import os
import shlex
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from timm.data import resolve_data_config
from torch import Tensor, nn

from ..errors import UserError
from ..io import atomic_write
from ..layers import PositionalAttention
from ..models._pretrained import hub_unreachable
from ..models.input_pad import model_input_padding
from ..models.sa_state_dict import CENTERS, PRECISION_FACTORS, block_key
from ..train.checkpoint import (
    HF_HUB_PREFIX,
    load_model,
    read_checkpoint,
    weights_path,
)
from ..train.data import (
    create_image_dataset,
    dataset_info,
    image_folder_labels,
    input_channels,
    normalization,
    split_name,
    trained_dataset,
)
from ..train.positional_epochs import POSITIONAL_EPOCHS_FILE, load_positional_trajectory, weights_epochs
from ..train.recipes import recorded_arg
from .analysis import GAUSSIAN_KINDS, UNIFORM_PEAK_RATIO, attention_layers

__all__ = ['ExplorerModel', 'resolve_explorer_model', 'hub_epochs', 'gallery_indices', 'explorer_data',
           'write_explorer', 'write_explorer_page', 'PAGE_SIZE_WARNING', 'page_size_note']

_PLACEHOLDER = '/*SA_EXPLORER_DATA*/null'
# bytes past which the command warns: browsers open such a page slowly or, on a small machine, not at all
PAGE_SIZE_WARNING = 50e6


@dataclass
class ExplorerModel:
    """A model to show, with where it came from and what it was trained on."""
    name: str
    model: nn.Module
    dataset: Optional[str] = None  # None when unknown (random or bare weights); '' an image folder of no name
    epochs: Dict[str, Dict[str, Tensor]] = field(default_factory=dict)  # label -> positional state dict
    trained: bool = True  # False for random weights: the page says so instead of showing chance predictions as such
    data_dir: Optional[str] = None  # the --data-dir of the run that trained the weights (an image folder's)
    val_split: Optional[str] = None  # that run's --val-split: a folder's held-out split may have another name


def resolve_explorer_model(spec: Union[str, os.PathLike], pretrained: bool = True) -> ExplorerModel:
    """Anything ``sa-vision-validate`` takes, with its epoch parameters where they are kept (a run folder's
    ``epoch-*.safetensors`` or a Hub folder's :data:`POSITIONAL_EPOCHS_FILE`); ``pretrained=False``: its
    architecture at random (of weights: on the dataset they were trained on)."""
    spec = os.fspath(spec) if isinstance(spec, os.PathLike) else spec
    path = weights_path(spec)
    if path is not None:
        ckpt = read_checkpoint(path)
        dataset = trained_dataset(ckpt.meta)
        run = dict(data_dir=recorded_arg(ckpt.meta, 'data_dir'), val_split=recorded_arg(ckpt.meta, 'val_split'))
        if not pretrained:
            return ExplorerModel(spec, ckpt.create_model(load_weights=False), dataset, trained=False, **run)
        # an export's, or a run's up to the weights' own epoch (model_best's may be earlier than its last)
        return ExplorerModel(spec, ckpt.create_model(), dataset, weights_epochs(ckpt), **run)
    if not pretrained:
        return ExplorerModel(spec, load_model(spec, pretrained=False), trained=False)
    model = load_model(spec, pretrained=True)
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    epochs = {}
    if spec.startswith(HF_HUB_PREFIX):
        epochs = hub_epochs(spec[len(HF_HUB_PREFIX):])
    return ExplorerModel(spec, model, trained_dataset({'pretrained_cfg': cfg}), epochs)


def hub_epochs(repo: str) -> Dict[str, Dict[str, Tensor]]:
    """A Hub repository's (``id[@revision]``, as timm names it) kept epoch parameters, or none: it has no such file,
    or the Hub does not answer at once. The file is optional: no waiting through huggingface_hub's retries (a
    minute, or for ever where a connection hangs) when the model itself loaded from the cache."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    repo_id, _, revision = repo.partition('@')
    cached = try_to_load_from_cache(repo_id, POSITIONAL_EPOCHS_FILE, revision=revision or None)
    if isinstance(cached, str):
        return load_positional_trajectory(cached)
    if cached is not None or hub_unreachable(repo, [POSITIONAL_EPOCHS_FILE]):  # not None: known to be missing
        return {}
    try:
        return load_positional_trajectory(hf_hub_download(repo_id, POSITIONAL_EPOCHS_FILE, revision=revision or None))
    except (EntryNotFoundError, LocalEntryNotFoundError):
        return {}


def gallery_indices(targets: Sequence[int], count: int) -> List[int]:
    """``count`` images of the split, taking the classes in turn (the first image of each class, then the second...)."""
    by_class: Dict[int, List[int]] = {}
    for index, target in enumerate(targets):
        by_class.setdefault(int(target), []).append(index)
    order = sorted(by_class)
    picked: List[int] = []
    rank = 0
    while len(picked) < count and any(rank < len(v) for v in by_class.values()):
        picked += [by_class[c][rank] for c in order if rank < len(by_class[c])][:count - len(picked)]
        rank += 1
    return picked


def _b64(tensor: Tensor, dtype: torch.dtype) -> str:
    """Little-endian bytes of ``tensor`` in ``dtype`` as base64 (a Float64Array / Float32Array / Uint8Array in JS)."""
    return base64.b64encode(tensor.detach().to('cpu', dtype).contiguous().numpy().tobytes()).decode('ascii')


def _layer_record(layer: PositionalAttention, params: Optional[Dict[str, Tensor]] = None) -> Dict[str, Any]:
    """What the page needs to compute a layer's positional scores: float64 values of the model's parameters."""
    position = layer.position
    if layer.kind in GAUSSIAN_KINDS:
        centers = params['centers'] if params else position.centers
        factors = params['precision_factors'] if params else position.precision_factors
        return {'centers': _b64(centers, torch.float64), 'precisionFactors': _b64(factors, torch.float64)}
    with torch.no_grad():  # the tables after their key maps, (2m+1, heads): head h's score for the shift d - m
        row = position.row_shift_embed.weight.double() @ position.row_keys.weight.double().t()
        col = position.col_shift_embed.weight.double() @ position.col_keys.weight.double().t()
    record = {'row': _b64(row.t(), torch.float64), 'col': _b64(col.t(), torch.float64),
              'maxShift': position.max_shift}
    if layer.content is not None:
        content = layer.content
        record.update(wq=_b64(content.query.weight, torch.float32), bq=_b64(content.query.bias, torch.float32),
                      wk=_b64(content.key.weight, torch.float32), bk=_b64(content.key.bias, torch.float32))
    return record


def _layer_inputs(model: nn.Module, images: Tensor) -> List[Tensor]:
    """Each attention layer's input tokens ``(B, h*w, D)`` for ``images`` (what the content kind's scores read)."""
    layers = attention_layers(model)
    blocks = {id(m.attn): m for m in model.modules() if isinstance(getattr(m, 'attn', None), PositionalAttention)}
    captured: List[Tensor] = []

    def capture(block: nn.Module, args: Tuple[Tensor, ...]) -> None:
        x = args[0]  # grid-major h x w x B x D (the models' layout)
        captured.append(x.reshape(-1, x.shape[2], x.shape[3]).transpose(0, 1).detach().float())

    handles = [blocks[id(layer)].register_forward_pre_hook(capture) for layer in layers]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def _epoch_records(layers: List[PositionalAttention], epochs: Dict[str, Dict[str, Tensor]]) -> Optional[Dict[str, Any]]:
    """Every layer's centres and precision factors at every kept epoch, when they fit the model (same heads)."""
    if not epochs or layers[0].kind not in GAUSSIAN_KINDS:
        return None
    records = []
    for label, params in epochs.items():
        per_layer = []
        for i, layer in enumerate(layers):
            centers, factors = params.get(block_key(i, CENTERS)), params.get(block_key(i, PRECISION_FACTORS))
            if centers is None or factors is None or centers.shape != layer.position.centers.shape:
                return None  # e.g. the pruned model's fine-tuning kept the unpruned heads
            per_layer.append(_layer_record(layer, {'centers': centers, 'precision_factors': factors}))
        records.append({'label': label, 'layers': per_layer})
    return {'epochs': records}


@contextlib.contextmanager
def _in_float32_eval(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode and float32 for the block, then in its mode and dtypes again (no copy: a notebook's
    model may hold what cannot be copied, and a copy would double its memory)."""
    training = model.training
    dtypes = {name: t.dtype for name, t in (*model.named_parameters(), *model.named_buffers())}
    try:
        yield model.eval().float()
    finally:
        model.train(training)
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            if t.dtype != dtypes.get(name, t.dtype):
                t.data = t.data.to(dtypes[name])


def _model_record(entry: ExplorerModel, images: Tensor, normalized: Tensor, class_names: Sequence[str],
                  top: int = 3, gallery_dataset: str = '') -> Dict[str, Any]:
    with _in_float32_eval(entry.model) as model:
        return _float32_model_record(entry, model, images, normalized, class_names, top, gallery_dataset)


def _float32_model_record(entry: ExplorerModel, model: nn.Module, images: Tensor, normalized: Tensor,
                          class_names: Sequence[str], top: int, gallery_dataset: str) -> Dict[str, Any]:
    layers = attention_layers(model)
    pad = model_input_padding(model)  # the model adds the dataset's border itself: it gets the images without it
    if pad:
        normalized = normalized[..., pad:normalized.shape[-2] - pad, pad:normalized.shape[-1] - pad]
    with torch.no_grad():
        logits = model(normalized)
    if not torch.isfinite(logits).all():  # NaN is no JSON: the page would not open, blank
        raise UserError(f'{entry.name} gives non-finite outputs (NaN or inf) on the gallery\'s images: its weights '
                        f'diverged in training. Explore weights saved before that (an earlier epoch or checkpoint '
                        f'of the run), or train again with a lower learning rate')
    probs = logits.softmax(dim=-1)
    top_probs, top_classes = probs.topk(min(top, probs.shape[-1]), dim=-1)
    grid = (images.shape[-2] // 2, images.shape[-1] // 2)  # the 2x2 patch embedding (paper Sec. 4)
    record = {
        'name': entry.name,
        'arch': getattr(model, 'pretrained_cfg', {}).get('architecture') or type(model).__name__,
        'kind': layers[0].kind,
        'grid': list(grid),
        'heads': [layer.num_heads for layer in layers],
        'dim': layers[0].dim,
        'parameters': sum(p.numel() for p in model.parameters()),
        'trained': entry.trained,
        'predictions': [[[int(c), float(p)] for c, p in zip(cs, ps)] for cs, ps in zip(top_classes, top_probs)],
        'layers': [_layer_record(layer) for layer in layers],
    }
    # '' is a dataset too: an image folder of no name
    other_data = entry.dataset is not None and dataset_info(entry.dataset).name != gallery_dataset
    if entry.trained and other_data:
        # trained on other data: its top classes are of its own classes, shown by their names and not scored
        own = dataset_info(entry.dataset).class_names or image_folder_labels(model, entry.dataset) or ()
        record.update(trained_on=_data_name(entry.dataset),
                      classes=list(own) or [str(c) for c in range(probs.shape[-1])])
    elif len(class_names) and probs.shape[-1] < len(class_names):  # more: the page names the others by number
        advice = (f'it is of {_data_name(entry.dataset)}: show it with --dataset {shlex.quote(entry.dataset)}'
                  if other_data else 'pass --dataset with the data it was trained on')
        raise UserError(f'{entry.name} has {probs.shape[-1]} classes but the images come from a dataset of '
                        f'{len(class_names)}; {advice}')
    if layers[0].kind == 'content':  # image-dependent: each image's layer inputs, from one pass over the batch
        inputs = _layer_inputs(model, normalized)
        record['tokens'] = [[_b64(tokens[i], torch.float32) for tokens in inputs] for i in range(len(images))]
    epochs = _epoch_records(layers, entry.epochs)
    if epochs:
        record.update(epochs)
    return record


def _data_name(dataset: str) -> str:
    """What the page and the command call the data of a --dataset value ('' names no image folder)."""
    return dataset or 'an image folder'


def _check_one_image_folder(own: Sequence[ExplorerModel], data_dir: Optional[str]) -> None:
    """Models trained on image folders share a gallery only where they are one folder: the same label names and,
    unless --data-dir names the gallery's folder, the same folder (the folder or names a model does not record
    match any)."""
    folders = sorted({os.path.realpath(m.data_dir) for m in own if m.data_dir}) if data_dir is None else []
    labels = sorted({tuple(names) for m in own if (names := image_folder_labels(m.model, m.dataset))})
    if len(labels) > 1:
        raise UserError(f'the models were trained on image folders of different classes '
                        f'({"; ".join(", ".join(names)[:60] for names in labels)}): show them on separate pages')
    if len(folders) > 1:
        raise UserError(f'the models were trained on different image folders ({", ".join(folders)}): show them '
                        f'on separate pages, or name the folder to show them all on with --data-dir')


def _model_inputs(models: Sequence[ExplorerModel], dataset: str, images: Tensor, indices: Sequence[int],
                  gallery) -> List[Tensor]:
    """The gallery's ``images`` (RGB in [0, 1]) as each model takes them, normalised as sa-vision-validate
    normalises them for it (an image folder: with each model's own mean and std, whatever the others'): a grey
    model's are the gallery's images read grey (``gallery(1)``)."""
    pixels: Dict[int, Tensor] = {3: images}
    inputs = []
    for model in (m.model for m in models):
        channels = input_channels(model)
        if channels not in pixels:
            pixels[channels] = torch.stack([gallery(channels)[i][0] for i in indices])
        norm = normalization(dataset, resolve_data_config({}, model=model), channels)
        mean, std = (torch.tensor(norm[k])[:, None, None] for k in ('mean', 'std'))
        inputs.append((pixels[channels] - mean) / std)
    return inputs


def explorer_data(models: Sequence[ExplorerModel], dataset: Optional[str] = None, num_images: int = 24,
                  data_dir: Optional[str] = None, download: bool = False,
                  title: str = 'sa_vision attention explorer', val_split: Optional[str] = None) -> Dict[str, Any]:
    """The page's data: the gallery of ``num_images`` held-out images and one record per model; ``val_split``
    None: the split the models of the gallery's dataset were evaluated on in training, else the dataset's own."""
    if not models:
        raise UserError('give at least one model to explore')
    datasets = {m.dataset for m in models if m.dataset is not None}
    if dataset is None:
        if len(datasets) > 1:
            names = ', '.join(sorted(map(_data_name, datasets)))
            raise UserError(f'the models were trained on different datasets ({names}): pass --dataset to show them '
                            f'on one')
        if not datasets:
            raise UserError('the dataset of these models is unknown: random weights have none, and bare weights '
                            'name none (a Hub folder\'s config.json does: pass local-dir:<folder>, not its '
                            'model.safetensors); pass --dataset')
        dataset = datasets.pop()
    info = dataset_info(dataset)
    own = [m for m in models if m.dataset == dataset]  # an image folder's run: where it read it, its classes
    if info.is_image_folder:
        _check_one_image_folder(own, data_dir)
    if data_dir is None:  # as sa-vision-validate finds it (an image folder's, CIFAR's, ...)
        data_dir = next((m.data_dir for m in own if m.data_dir and os.path.isdir(m.data_dir)), None)
    label_names = next((names for m in own if (names := image_folder_labels(m.model, m.dataset))), None)
    split = split_name(info.name, val_split or next((m.val_split for m in own if m.val_split), info.eval_split))
    # the images as the models see them: a model that adds the dataset's border itself is shown it (and given the
    # images without it, _float32_model_record)
    sizes = {resolve_data_config({}, model=m.model)['input_size'][-1] + 2 * model_input_padding(m.model)
             for m in models}
    if len(sizes) > 1:  # one gallery of images for every model
        raise UserError(f'the models take images of different sizes ({", ".join(map(str, sorted(sizes)))} px): show '
                        f'them on separate pages')
    size = sizes.pop()

    def gallery(in_chans: int = 3):  # pixels in [0, 1], as shown; grey ones for a grey model, as validate reads them
        return create_image_dataset(info.name, split, is_training=False, data_dir=data_dir, download=download,
                                    img_size=size, mean=(0.,), std=(1.,), classes=label_names, in_chans=in_chans)
    raw = gallery()
    targets = getattr(raw, 'targets', None)
    if targets is None:
        targets = [raw[i][1] for i in range(len(raw))]
    indices = gallery_indices([int(t) for t in targets], num_images)
    images = torch.stack([raw[i][0] for i in indices])  # B, 3, H, W
    inputs = _model_inputs(models, info.name, images, indices, gallery)
    grey = bool((images[:, :1] == images).all())
    pixels = (images[:, :1] if grey else images).mul(255).round().clamp(0, 255).to(torch.uint8)
    class_names = list(info.class_names or label_names or ()) or [str(c) for c in range(max(map(int, targets)) + 1)]
    return {
        'title': title,
        'dataset': {'name': info.name, 'title': info.title, 'split': split, 'classes': class_names},
        'images': {'count': len(indices), 'channels': pixels.shape[1], 'height': pixels.shape[2],
                   'width': pixels.shape[3], 'pixels': _b64(pixels, torch.uint8), 'indices': indices,
                   'labels': [int(targets[i]) for i in indices]},
        'models': [_model_record(m, images, normalized, class_names, gallery_dataset=info.name)
                   for m, normalized in zip(models, inputs)],
        'uniform_peak_ratio': UNIFORM_PEAK_RATIO,  # the page names a head uniform as head_statistics does
    }


def write_explorer(models: Sequence[ExplorerModel], out, **kwargs) -> Path:
    """Write the explorer page for ``models`` to ``out`` (see :func:`explorer_data` for the options)."""
    return write_explorer_page(explorer_data(models, **kwargs), out)


def write_explorer_page(data: Dict[str, Any], out) -> Path:
    """Write the page of :func:`explorer_data`'s ``data`` to ``out``."""
    template = resources.files(__package__).joinpath('explorer.html').read_text(encoding='utf-8')
    # no '<' at all inside the script element: '</script' would end it and '<!--' change how the HTML parser reads it
    payload = json.dumps(data, separators=(',', ':'), allow_nan=False).replace('<', '\\u003c')
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out) as tmp:
        tmp.write_text(template.replace(_PLACEHOLDER, payload), encoding='utf-8')
    return out


def page_size_note(data: Dict[str, Any], size: int) -> Optional[str]:
    """What makes a page of :func:`explorer_data`'s ``data`` and ``size`` bytes big, and how to make it smaller;
    None up to :data:`PAGE_SIZE_WARNING`. Only the content kind grows with the images (its query and key scores,
    paper Eq. 8, read each image's tokens), and its query and key weights are the bulk of what does not."""
    if size <= PAGE_SIZE_WARNING:
        return None
    content = [m for m in data['models'] if m['kind'] == 'content']
    if not content:
        return f'the page is {size / 1e6:.3g} MB: show fewer models on one page'
    per_images = sum(len(tokens) for m in content for image in m['tokens'] for tokens in image)
    fixed = sum(len(layer[k]) for m in content for layer in m['layers'] for k in ('wq', 'bq', 'wk', 'bk'))
    return (f'the page is {size / 1e6:.3g} MB, which a browser opens slowly: the content kind '
            f'({", ".join(m["name"] for m in content)}) brings every layer\'s input for each image '
            f'({per_images / 1e6:.3g} MB for {data["images"]["count"]} images) and its query and key weights '
            f'({fixed / 1e6:.3g} MB whatever the images). Pass fewer --images, or explore a narrower model (a '
            f'smaller embed_dim)')
