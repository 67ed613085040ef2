""" Model cards: the templates ``sa_vision/model_cards/<arch>.md`` and the README.md of an export """
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from timm.models import is_model, model_entrypoint

from ..models._pretrained import PRETRAINED_TAG, hub_repo_id, registered_hf_hub_id
from ..models.input_pad import model_input_padding
from ..train.checkpoint import Checkpoint
from ..train.data import dataset_for_tag, dataset_info, input_channels, split_name
from ..train.recipes import recorded_arg
from .labels import CARD_FIGURE_FILENAME, MODEL_CARD_DIR, WeightsLabel
from .record import picked_note, recipe_section, training_record, training_summary

__all__ = ['CARD_METRICS', 'card_accuracy', 'count_params_and_macs', 'generate_model_card', 'write_model_cards',
           'render_model_card', 'usage_section', 'card_usage', 'card_for_repository', 'weights_described_by_card']


def count_params_and_macs(model: torch.nn.Module, img_size: int = 32) -> Dict[str, int]:
    """Parameters and multiply-accumulates of one ``in_chans x img_size x img_size`` image, attention included,
    counted by :func:`sa_vision.measure.macs.count_macs` (on the model's device)."""
    from ..measure.macs import count_macs
    in_chans = getattr(model, 'in_chans', 3)
    size = img_size - 2 * model_input_padding(model)  # a model that pads its input reaches img_size inside
    return {'params': sum(p.numel() for p in model.parameters()),
            'macs': count_macs(model, (in_chans, size, size))}


_ATTENTION_FORMULAS = {
    'quadratic': 'isotropic Gaussian: `A_h(δ) = -(s_h²/2) ‖δ - μ_h‖²` over the relative shift δ = key - query '
                 '(content-free: no query/key, softmax over all keys)',
    'generalized': 'non-isotropic Gaussian: `A_h(δ) = -½ (δ - μ_h)ᵀ S_h S_hᵀ (δ - μ_h)` '
                   '(content-free, softmax over all keys)',
    'learned': 'learned relative encoding without content: `A_h(δ) = k_v(E_v[δ₁])_h + k_u(E_u[δ₂])_h` '
               '(softmax over all keys)',
    'content': 'content plus learned relative encoding: `A_h(q, k) = q_hᵀ k_h / √D + k_v(E_v[δ₁])_h + k_u(E_u[δ₂])_h`',
    None: 'none (convolutional baseline): 3x3 convolutions, BasicBlocks of 64/128/256/512 channels '
          'in the registered model',
}


# sa_vision is installed from its source (README.md), as the package sa-vision; no package index is named
INSTALL_LINE = ('Needs `sa_vision`, installed from its source: `pip install -e .` in a clone of its repository (its '
                'README.md); `import sa_vision` registers the models with timm.')


_TEMPLATE_MARK = '<!-- sa_vision:usage -->'  # a card template of this generator holds this section


def _section(name: str, body: str) -> str:
    return f'<!-- sa_vision:{name} -->\n{body.strip()}\n<!-- /sa_vision:{name} -->'


def _replace_section(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf'<!-- sa_vision:{name} -->.*?<!-- /sa_vision:{name} -->', re.S)
    if not pattern.search(text):
        return text.rstrip() + '\n\n' + _section(name, body) + '\n'
    return pattern.sub(lambda _: _section(name, body), text)


def _section_body(text: str, name: str) -> str:
    match = re.search(rf'<!-- sa_vision:{name} -->(.*?)<!-- /sa_vision:{name} -->', text, re.S)
    return match.group(1) if match else ''


def _size_section(counts: Dict[str, int], note: str = '') -> str:
    return (f'- Parameters: {counts["params"]:,}\n'
            f'- MACs at 32x32, batch 1: {counts["macs"] / 1e9:.3f} G (every matrix product this implementation runs, '
            f'attention included; counted with `torch.utils.flop_counter`, MACs = FLOPs / 2){note}')


def _results_section(arch: str, measured: Optional[str]) -> str:
    from ..paper import PAPER_RESULTS
    paper = PAPER_RESULTS.get(arch)
    paper_top1 = f'{paper.top1} %' if paper else '-'
    return ('| | CIFAR-10 top-1 |\n|---|---|\n'
            f'| paper (Cordonnier et al., 2020) | {paper_top1} |\n'
            f'| this repository | {measured or "not yet trained on CIFAR-10"} |')


def _usage_section(arch: str, repo_id: str, registered: bool, input_size: int = 32, padding: int = 0,
                   label_names: Optional[Sequence[str]] = None, num_classes: Optional[int] = 10,
                   exported: bool = False, in_chans: int = 3) -> str:
    """How to run the weights with timm's own preprocessing (``input_size``: what ``resolve_data_config`` says;
    ``padding``: the black border the model adds itself; ``label_names``: the config's, in the order of the
    logits); ``exported``: the card of an export folder, which the Hub name loads only once it is published (its
    upload rebuilds this section without the note); ``in_chans``: the channels the weights take."""
    # an export folder's card says how to load the folder in its note (below) instead
    local = '' if exported else "`timm.create_model('local-dir:<folder>', pretrained=True)`"
    if registered:
        create = f"timm.create_model('{arch}', pretrained=True).eval()  # weights from {repo_id}"
        also = (f"The same weights load with `timm.create_model('hf-hub:{repo_id}', pretrained=True)`"
                + (f" or, exported locally, {local}." if local else '.'))
    else:
        create = f"timm.create_model('hf-hub:{repo_id}', pretrained=True).eval()"
        also = (f"These are not the weights of `timm.create_model('{arch}', pretrained=True)`."
                + (f" Exported locally they load with {local}." if local else ''))
    border = (f'\n# {input_size}x{input_size} input: the model adds the {padding}-pixel black border of its training '
              f'images itself' if padding else '')
    names = "\nprint(model.pretrained_cfg['label_names'][logits.argmax()])" if label_names else ''
    count = num_classes or len(label_names or ())  # a config.json of another tool's may state none
    numbered = f' (`0` to `{count - 1}` sort so)' if count else ''
    # timm's validate.py builds its model with 3 channels unless told, and opens images grey for one
    chans = f' --in-chans {in_chans}' if in_chans != 3 else ''
    image = ("Image.open('image.png').convert('L')  # grey: the weights take one channel, as timm's validate.py "
             "opens images for them" if in_chans == 1 else
             "Image.open('image.png').convert('RGB')  # RGB, as timm's ImageDataset opens images (grey ones too)")
    if not label_names:
        order = f"the order of the classes these weights were trained on{numbered}"
    elif len(label_names) <= _LISTED_LABELS:
        order = f"the order of their labels, {', '.join(f'`{name}`' for name in label_names)}{numbered}"
    else:
        order = f"the order of `model.pretrained_cfg['label_names']`{numbered}"
    # a copy of the folder (a kept zoo, a shared export) is read where the name does not load yet
    note = (f"This folder is an export: the name below loads it once `sa-vision-push-to-hub` has published it to "
            f"`{repo_id}`. Until then, load the folder itself with "
            f"`timm.create_model('local-dir:<this folder>', pretrained=True)`.\n\n" if exported else '')
    return f"""{note}```python
import timm, torch
from PIL import Image
import sa_vision  # registers the models with timm

model = {create}
cfg = timm.data.resolve_data_config({{}}, model=model)  # input size and normalisation of these weights{border}
transform = timm.data.create_transform(**cfg)  # resizes any image to the input size
image = {image}
logits = model(transform(image).unsqueeze(0)){names}
```
{INSTALL_LINE} {also} timm's own `validate.py` evaluates them on an image folder as
`python -m sa_vision.train.run_timm path/to/timm/validate.py --data-dir <folder> --model <the name above>{chans}`
(the launcher imports `sa_vision` first; `validate.py` runs on CUDA unless given `--device cpu`). timm numbers the
classes by their folders' names in natural order (numbers by value, `2` before `10`; letters in either case alike):
name the folders so that they sort in {order}."""


# the most label names a card's usage lists (CIFAR-100's hundred are in the config)
_LISTED_LABELS = 20


def _describe(arch: str, model: Optional[torch.nn.Module] = None, registered: bool = True,
              model_args: Optional[Dict[str, Any]] = None) -> str:
    """One sentence on what the model is; a custom configuration is described as what it is."""
    from ..paper import PAPER_RESULTS
    paper = PAPER_RESULTS.get(arch)
    if registered or model is None:  # a registered model outside the paper's table: its factory's docstring
        doc = (model_entrypoint(arch).__doc__ or '').strip() if is_model(arch) else ''
        text = paper.description if paper else doc.splitlines()[0].rstrip('.') if doc else arch
        return text[:1].upper() + text[1:]
    params = sum(p.numel() for p in model.parameters())
    heads = getattr(model, 'heads_per_layer', None)
    if heads is not None:
        shape = (f'{len(heads)} layer(s) with {", ".join(map(str, heads))} heads, embedding {model.embed_dim}, '
                 f'{model.num_classes} classes')
    else:
        shape = f'built with `{model_args or {}}`, {model.num_classes} classes'
    reference = f' (the paper\'s configuration has {paper.params:,})' if paper else ''
    return (f'A custom configuration of {arch}, not the paper\'s: {shape}; {params:,} parameters{reference}. '
            f'Architecture arguments are in config.json')


def _shipped_recipe_text(arch: str) -> str:
    """The card's recipe section of a template: the recipe shipped for ``arch``, in full."""
    from ..train.recipes import recipe_path, repeat_run_args
    try:
        recipe_file = recipe_path(arch)
    except FileNotFoundError:
        return 'no recipe in this repository'
    recipe = recipe_file.read_text(encoding='utf-8').strip()
    return (f'`sa-vision-train {repeat_run_args(arch, recipe_file.stem)}`: the recipe '
            f'`sa_vision/configs/{recipe_file.name}` shipped in the package (timm `train.py` argument names):'
            f'\n\n```yaml\n{recipe}\n```')


def generate_model_card(arch: str) -> str:
    """The card template ``sa_vision/model_cards/<arch>.md``: facts of :mod:`sa_vision.paper`, counted size, recipe."""
    import timm

    import sa_vision  # noqa: F401

    from ..paper import CIFAR10_LABEL_NAMES, PAPER_CITATION, PAPER_RESULTS
    model = timm.create_model(arch)
    counts = count_params_and_macs(model)
    paper = PAPER_RESULTS.get(arch)
    attn_kind = getattr(model, 'attn_kind', None)
    recipe = _shipped_recipe_text(arch)
    paper_flops = ''
    if paper and paper.gflops:
        paper_flops = f' The paper reports {paper.gflops} GFLOPs' + (
            ', which matches counting only the Linear layers (our reading; it does not say).' if attn_kind else '.')
    repo_id = hub_repo_id(arch)
    return f"""---
library_name: timm
pipeline_tag: image-classification
license: apache-2.0
tags:
- image-classification
- timm
- sa_vision
datasets:
- cifar10
---
{_section('title', f'# {arch}.{PRETRAINED_TAG}')}

{_section('description', _describe(arch) + '.')}

A model of Cordonnier, Loukas & Jaggi, *On the Relationship between Self-Attention and Convolutional Layers*
(ICLR 2020), implemented as a timm model in `sa_vision` (the registered model takes CIFAR-10's 32x32 images; the
authors' original code: https://github.com/epfml/attention-cnn).

Attention: {_ATTENTION_FORMULAS[attn_kind]}.

## Size
{_section('size', _size_section(counts, '.' + paper_flops))}

## Results
{_section('results', _results_section(arch, None))}

## Training recipe
{_section('recipe', recipe)}

{_section('training', 'Not yet trained: no training run has been exported into this card.')}

## Usage
{_section('usage', _usage_section(arch, repo_id, registered=True, label_names=CIFAR10_LABEL_NAMES))}

## Citation
```bibtex
{PAPER_CITATION}
```
"""


def write_model_cards(archs=None, out_dir: Union[str, os.PathLike] = MODEL_CARD_DIR) -> List[Path]:
    """(Re)generate the card templates ``sa_vision/model_cards/<arch>.md`` (default: the paper's five models and
    every template already in ``out_dir``, a contributor's model's too)."""
    from ..paper import PAPER_RESULTS
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    templates = [p.stem for p in sorted(out_dir.glob('*.md')) if is_model(p.stem) and _TEMPLATE_MARK in
                 p.read_text(encoding='utf-8')]  # not a README.md, nor a card of another tool's
    for arch in archs or dict.fromkeys([*PAPER_RESULTS, *templates]):
        path = out_dir / f'{arch}.md'
        path.write_text(generate_model_card(arch), encoding='utf-8')
        paths.append(path)
    return paths


# the metrics a card's model-index holds: (key in the checkpoint's metrics, the Hub's metric name)
CARD_METRICS = (('top1', 'Top-1 accuracy'), ('top5', 'Top-5 accuracy'))


def card_accuracy(card_text: str) -> Dict[str, float]:
    """The accuracies a card's model-index claims (:func:`render_model_card`), keyed as the checkpoint's metrics
    (``top1``, ``top5``); empty for a card without them."""
    from huggingface_hub import ModelCard
    names = {name: key for key, name in CARD_METRICS}
    # a name may say which weights were evaluated: 'Top-1 accuracy (float32 weights, before rounding to bfloat16)'
    return {names[r.metric_name.split(' (')[0]]: float(r.metric_value)
            for r in ModelCard(card_text).data.eval_results or [] if r.metric_name.split(' (')[0] in names}


def render_model_card(ckpt: Checkpoint, model: torch.nn.Module, label: WeightsLabel, repo_id: str, input_size: int,
                      has_figure: bool = False, exported_args: Optional[Dict[str, Any]] = None,
                      stored_dtype: Optional[torch.dtype] = None) -> str:
    """README.md of an export: the card template with the labels, measured size, accuracy and training summary;
    ``input_size`` and ``exported_args`` (model arguments added to the checkpoint's, e.g. the border of a padded
    dataset): the exported config's (:func:`sa_vision.hub.export.exported_config`); ``stored_dtype``: the dtype
    the weights are stored in, where the export rounded them (bfloat16, float16)."""
    from huggingface_hub import EvalResult, ModelCard
    arch, metrics, info = ckpt.arch, ckpt.meta.get('metrics') or {}, label.dataset
    # the recorded accuracy is of the float32 weights trained: the rounded ones were never evaluated here
    rounded_to = str(stored_dtype).removeprefix('torch.') if stored_dtype in (torch.bfloat16, torch.float16) else ''
    of_float32 = f' (float32 weights, before rounding to {rounded_to})' if rounded_to else ''
    template_path = MODEL_CARD_DIR / f'{arch}.md'
    template = template_path.read_text(encoding='utf-8') if template_path.is_file() else generate_model_card(arch)
    card = ModelCard(template)  # YAML front matter as ModelCardData, the markdown as card.text
    card.data.datasets = [info.hub_dataset] if info.hub_dataset else None  # no Hub dataset id for it: claim none
    card.data.pipeline_tag = 'image-classification'  # the Hub's task filter (templates of earlier versions lack it)
    # top-5 of 5 classes or fewer is always 100 %
    scores = [(key, name) for key, name in CARD_METRICS if key in metrics and (key != 'top5' or model.num_classes > 5)]
    if scores:  # the Hub's model-index
        card.data.model_name = label.name
        split = evaluated_split(ckpt, info)
        card.data.eval_results = [EvalResult(
            task_type='image-classification', task_name='Image Classification',
            # an image folder is no Hub dataset: the type of the Hub's own loader of one, never a public id ('beans')
            dataset_type=info.hub_dataset or ('imagefolder' if info.is_image_folder else info.tag),
            dataset_name=info.title, dataset_split=split,
            metric_type='accuracy', metric_name=name + of_float32, metric_value=round(float(metrics[key]), 2))
            for key, name in scores]
    body = card.text
    body = _replace_section(body, 'title', f'# {label.name}')
    body = _replace_section(body, 'description', _describe(
        arch, model, label.registered_architecture, ckpt.model_args) + '.')
    counts = count_params_and_macs(model)
    # all of them: the model built from fewer (say, without the border it adds to 28x28 images) loads the weights
    # without a word and classifies worse
    model_args = {**ckpt.model_args, **(exported_args or {})}
    stored = (f'\n- Stored in {rounded_to}: the trained float32 weights rounded to half the bytes, which a float32 '
              f'model loads as rounded; their accuracy may differ from the recorded one, of the float32 weights '
              f'(`sa-vision-validate --model local-dir:<folder>` measures them)' if rounded_to else '')
    body = _replace_section(body, 'size', _size_section(
        counts, (f'\n- Architecture arguments of these weights: `{model_args}`' if model_args else '') + stored))
    body = _replace_section(body, 'results', _measured_results(ckpt, label, scores, of_float32))
    body = _replace_section(body, 'training', training_summary(ckpt, label, rounded_to))
    body = _replace_section(body, 'recipe', recipe_section(ckpt))
    body = _replace_section(body, 'usage', usage_section(
        arch, repo_id, info, model.num_classes, input_size, ckpt.label_names(model.num_classes, info), exported=True,
        in_chans=input_channels(model)))
    if has_figure:
        figure = f'## Attention heads\n![attention of every head]({CARD_FIGURE_FILENAME})'
        body = _replace_section(body, 'figure', figure)
    card.text = body
    return str(card)


def evaluated_split(ckpt: Checkpoint, info) -> str:
    """The split the recorded accuracy is of: the run's --val-split as its dataset reads it (the fixed-split
    datasets read 'test' for 'validation'), else the dataset's held-out split."""
    split = recorded_arg(ckpt.meta, 'val_split')
    return split_name(info.name, split) if split else info.eval_split


def _measured_results(ckpt: Checkpoint, label: WeightsLabel, scores, of_float32: str = '') -> str:
    """The results table, with the accuracy of these weights where recorded: for the reference weights in the
    table, for others below it; said to be optimistic where the same evaluation picked the epoch, and
    (``of_float32``) to be of the float32 weights where the export rounded them."""
    metrics, info = ckpt.meta.get('metrics') or {}, label.dataset
    measured = f'{metrics["top1"]:.2f} %{of_float32}' if 'top1' in metrics and label.is_reference else None
    results = _results_section(ckpt.arch, measured)
    if 'top1' in metrics and not label.is_reference:
        what = info.title if label.registered_architecture else f'{info.title} with a custom configuration'
        on_cifar = info.tag == dataset_info('cifar10').tag  # the dataset, whatever the registered tag is called
        results += (f'\n\nThese weights were trained on **{what}**'
                    + ('' if on_cifar else ', not CIFAR-10')
                    + ': ' + ', '.join(f'{name.lower()} {float(metrics[key]):.2f} %' for key, name in scores)
                    + f' on its {evaluated_split(ckpt, info)} split{of_float32}.')
    if 'top1' in metrics:
        results += ('' if label.is_reference else '\n') + picked_note(training_record(ckpt)).lstrip()
    return results.rstrip()


def usage_section(arch: str, repo_id: str, info, num_classes: int, input_size: int,
                  label_names: Optional[Sequence[str]] = None, exported: bool = False, in_chans: int = 3) -> str:
    """The usage text of an export of weights of ``info``'s dataset, published to ``repo_id``; ``input_size`` and
    ``label_names``: the exported config's (the border inside the model where the dataset had one,
    :func:`sa_vision.hub.export.exported_input_config`); ``exported``: the export folder's own card, not yet the
    uploaded one; ``in_chans``: the channels the weights take (the config's ``input_size[0]``)."""
    return _usage_section(arch, repo_id, repo_id == registered_hf_hub_id(arch), input_size=input_size,
                          padding=info.input_padding, label_names=label_names, num_classes=num_classes,
                          exported=exported, in_chans=in_chans)


def card_usage(card_text: str) -> str:
    """The usage section of a card of this package ('' for another card): what loads the weights."""
    return _section_body(card_text, 'usage').strip()


def card_for_repository(card_text: str, config: Dict[str, Any], repo_id: str) -> str:
    """An export's card (``config``: its config.json) with the usage naming ``repo_id``, the repository it is
    published to; a card without sa_vision's usage section is returned as it is."""
    if not _section_body(card_text, 'usage'):
        return card_text
    cfg = config.get('pretrained_cfg') or {}
    info = dataset_info(dataset_for_tag(cfg.get('tag') or '', cfg.get('num_classes')))
    input_size = cfg.get('input_size', (3, 32, 32))
    usage = usage_section(config['architecture'], repo_id, info, config.get('num_classes', cfg.get('num_classes')),
                          input_size[-1], config.get('label_names'), in_chans=input_size[0])
    return _replace_section(card_text, 'usage', usage)


# the lines of a card's training summary that say which weights the export holds
_WEIGHTS_LINES = ('- Weights:', '- Evaluation of these weights', '- Exported from')


def weights_described_by_card(card_text: str) -> str:
    """Which weights an export holds, as its card's training summary says (the epoch, whether the best, their
    evaluation): its lines joined for a message, or '' for a card without them."""
    lines = _section_body(card_text, 'training').splitlines()
    return '; '.join(line[2:].rstrip('.') for line in lines if line.startswith(_WEIGHTS_LINES))
