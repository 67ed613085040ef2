""" Hub export, model cards and publishing

* :func:`export_hub_folder` writes a folder in timm's ``save_for_hf`` format (``config.json`` with
  ``architecture``, ``model_args`` and ``pretrained_cfg``; ``model.safetensors``) plus ``README.md`` rendered
  from ``model_cards/<arch>.md`` with the measured accuracy, and the training recipe (``recipe.yaml``).
  ``timm.create_model('local-dir:<folder>', pretrained=True)`` loads it; on the Hub, ``'hf-hub:<repo>'``.
* Labels say what the weights are (:func:`weights_label`): the tag is the dataset they were trained on
  (``digits``, ``fashion_mnist``, ``cifar10``), with ``_custom`` when the architecture is not the registered
  one. Only CIFAR-10 weights of the paper's architecture may go to the registered repository
  ``<HF_NAMESPACE>/<arch>.cifar10``, which ``timm.create_model('<arch>', pretrained=True)`` downloads for everyone.
* :func:`publish_hub_folder` uploads such a folder in one commit after checking token and permission.

Layering (layers -> models -> tools -> scripts, checked by ``tests/test_structure.py``): a tool; imports
:mod:`sa_vision.checkpoint` (weights of any kind), :mod:`sa_vision.models`, :mod:`sa_vision.data` (dataset facts),
:mod:`sa_vision.paper`, :mod:`sa_vision.recipes`; :mod:`sa_vision.plots` only when a card figure is drawn. Nothing
under ``sa_vision.models`` imports this module.
"""
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch

from .checkpoint import Checkpoint, CheckpointError, read_checkpoint, strip_runtime_args
from .data import DatasetInfo, dataset_info
from .models._pretrained import PRETRAINED_TAG, hub_repo_id, registered_hf_hub_id

__all__ = [
    'HUB_FOLDER_FILES', 'RECIPE_FILENAME', 'CARD_FIGURE_FILENAME', 'CUSTOM_SUFFIX', 'HubPublishError',
    'WeightsLabel', 'weights_label', 'is_registered_architecture', 'check_publish_target',
    'count_params_and_macs', 'generate_model_card', 'render_model_card', 'export_hub_folder',
    'resolve_token', 'publish_hub_folder',
]

RECIPE_FILENAME = 'recipe.yaml'
CARD_FIGURE_FILENAME = 'attention.png'
HUB_FOLDER_FILES = ('config.json', 'model.safetensors', 'README.md', RECIPE_FILENAME)  # + the figure if any
MODEL_CARD_DIR = Path(__file__).resolve().parent / 'model_cards'
CUSTOM_SUFFIX = '_custom'  # tag suffix of weights whose architecture differs from the registered one


class HubPublishError(RuntimeError):
    """Publishing cannot start: no token, no write permission, or a repository these weights may not go to."""


# ---------------------------------------------------------------------------------------------------------
# what the weights are

def is_registered_architecture(arch: str, model_args: Dict[str, Any]) -> bool:
    """The model has exactly the tensors of ``timm.create_model(arch)`` (the paper's configuration, 10 classes)."""
    import timm
    from . import models  # noqa: F401  registers the models
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


def check_publish_target(label: WeightsLabel, repo_id: str) -> None:
    """Refuse a repository that must not receive these weights (the registered one, another architecture's)."""
    import timm
    registered = registered_hf_hub_id(label.arch)
    if repo_id == registered and not label.is_reference:
        raise HubPublishError(
            f'refusing {repo_id}: timm.create_model({label.arch!r}, pretrained=True) downloads that repository for '
            f'everyone, and it takes only CIFAR-10 weights of the paper\'s architecture; these are {label.name} '
            f'({label.dataset.title}{"" if label.registered_architecture else ", a custom configuration"}). '
            f'Publish them to {label.default_repo_id} (the default) or your own --repo-id')
    name = repo_id.split('/')[-1].split('.')[0]
    if name != label.arch and timm.is_model(name):
        raise HubPublishError(
            f'the weights are a {label.arch} model but the repository {repo_id} is named for {name}; '
            f'publish to {label.default_repo_id} or pass weights of {name}')


# ---------------------------------------------------------------------------------------------------------
# model cards

def count_params_and_macs(model: torch.nn.Module, img_size: int = 32) -> Dict[str, int]:
    """Parameters and multiply-accumulates of one ``in_chans x img_size x img_size`` image, attention included,
    counted by :func:`sa_vision.benchmark.count_macs` (on the model's device)."""
    from .benchmark import count_macs
    in_chans = getattr(model, 'in_chans', 3)
    return {'params': sum(p.numel() for p in model.parameters()),
            'macs': count_macs(model, (in_chans, img_size, img_size))}


_ATTENTION_FORMULAS = {
    'quadratic': 'isotropic Gaussian: `A_h(δ) = -(s_h²/2) ‖δ - μ_h‖²` over the relative shift δ = key - query '
                 '(content-free: no query/key, softmax over all keys)',
    'generalized': 'non-isotropic Gaussian: `A_h(δ) = -½ (δ - μ_h)ᵀ S_h S_hᵀ (δ - μ_h)` '
                   '(content-free, softmax over all keys)',
    'learned': 'learned relative encoding without content: `A_h(δ) = k_v(E_v[δ₁])_h + k_u(E_u[δ₂])_h` '
               '(softmax over all keys)',
    'content': 'content plus learned relative encoding: `A_h(q, k) = q_hᵀ k_h / √D + k_v(E_v[δ₁])_h + k_u(E_u[δ₂])_h`',
    None: 'none (convolutional baseline): 3x3 convolutions, BasicBlocks 64/128/256/512',
}


def _section(name: str, body: str) -> str:
    return f'<!-- sa_vision:{name} -->\n{body.strip()}\n<!-- /sa_vision:{name} -->'


def _replace_section(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf'<!-- sa_vision:{name} -->.*?<!-- /sa_vision:{name} -->', re.S)
    if not pattern.search(text):
        return text.rstrip() + '\n\n' + _section(name, body) + '\n'
    return pattern.sub(lambda _: _section(name, body), text)


def _size_section(counts: Dict[str, int], note: str = '') -> str:
    return (f'- Parameters: {counts["params"]:,}\n'
            f'- MACs at 32x32, batch 1: {counts["macs"] / 1e9:.3f} G (every matrix product this implementation runs, '
            f'attention included; counted with `torch.utils.flop_counter`, MACs = FLOPs / 2){note}')


def _results_section(arch: str, measured: Optional[str]) -> str:
    from .paper import PAPER_RESULTS
    paper = PAPER_RESULTS.get(arch)
    paper_top1 = f'{paper.top1} %' if paper else '-'
    return ('| | CIFAR-10 top-1 |\n|---|---|\n'
            f'| paper (Cordonnier et al., 2020) | {paper_top1} |\n'
            f'| this repository | {measured or "not yet trained on CIFAR-10"} |')


def _usage_section(arch: str, repo_id: str, registered: bool) -> str:
    if registered:
        create = f"timm.create_model('{arch}', pretrained=True).eval()  # weights from {repo_id}"
        also = (f"The same weights load with `timm.create_model('hf-hub:{repo_id}', pretrained=True)` or, exported "
                f"locally, `timm.create_model('local-dir:<folder>', pretrained=True)`.")
    else:
        create = f"timm.create_model('hf-hub:{repo_id}', pretrained=True).eval()"
        also = (f"These are not the weights of `timm.create_model('{arch}', pretrained=True)`. Exported locally they "
                f"load with `timm.create_model('local-dir:<folder>', pretrained=True)`.")
    return f"""```python
import timm, torch
import sa_vision  # registers the models with timm

model = {create}
cfg = timm.data.resolve_data_config({{}}, model=model)
transform = timm.data.create_transform(**cfg)  # the normalisation these weights were trained with
logits = model(transform(image).unsqueeze(0))  # image: a 32x32 PIL image
```
{also}"""


def _describe(arch: str, model: Optional[torch.nn.Module] = None, registered: bool = True,
              model_args: Optional[Dict[str, Any]] = None) -> str:
    """One sentence on what the model is; a custom configuration is described as what it is."""
    from .paper import PAPER_RESULTS
    paper = PAPER_RESULTS.get(arch)
    if registered or model is None:
        text = paper.description if paper else arch
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


def generate_model_card(arch: str) -> str:
    """The card template ``model_cards/<arch>.md``: facts from :mod:`sa_vision.paper`, counted size, recipe."""
    import timm
    import sa_vision  # noqa: F401
    from .paper import PAPER_CITATION, PAPER_RESULTS
    from .recipes import recipe_path
    model = timm.create_model(arch)
    counts = count_params_and_macs(model)
    paper = PAPER_RESULTS.get(arch)
    attn_kind = getattr(model, 'attn_kind', None)
    try:
        recipe_file = recipe_path(arch)
        recipe = f'`scripts/configs/{recipe_file.name}` (timm `train.py` argument names):\n\n```yaml\n' \
                 f'{recipe_file.read_text().strip()}\n```'
    except FileNotFoundError:
        recipe = 'no recipe in this repository'
    paper_flops = ''
    if paper and paper.gflops:
        paper_flops = f' The paper reports {paper.gflops} GFLOPs' + (
            ', counting only the Linear layers.' if attn_kind else '.')
    repo_id = hub_repo_id(arch)
    return f"""---
library_name: timm
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
(ICLR 2020), implemented as a timm model in `sa_vision` (32x32 input; the authors' original code:
https://github.com/epfml/attention-cnn).

Attention: {_ATTENTION_FORMULAS[attn_kind]}.

## Size
{_section('size', _size_section(counts, '.' + paper_flops))}

## Results
{_section('results', _results_section(arch, None))}

## Training recipe
{_section('recipe', recipe)}

{_section('training', 'Not yet trained: no training run has been exported into this card.')}

## Usage
{_section('usage', _usage_section(arch, repo_id, registered=True))}

## Citation
```bibtex
{PAPER_CITATION}
```
"""


def write_model_cards(archs=None, out_dir: Union[str, os.PathLike] = MODEL_CARD_DIR) -> List[Path]:
    """(Re)generate the card templates ``model_cards/<arch>.md`` (default: the paper's five models)."""
    from .paper import PAPER_RESULTS
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for arch in archs or PAPER_RESULTS:
        path = out_dir / f'{arch}.md'
        path.write_text(generate_model_card(arch), encoding='utf-8')
        paths.append(path)
    return paths


def _recipe(ckpt: Checkpoint) -> Dict[str, Any]:
    """The training arguments to publish: no local paths, no machine or process fields."""
    return strip_runtime_args(ckpt.meta.get('recipe') or ckpt.meta.get('args') or {})


def render_model_card(ckpt: Checkpoint, model: torch.nn.Module, label: WeightsLabel, repo_id: str,
                      has_figure: bool = False) -> str:
    """README.md of an export: the card template with the labels, measured size, accuracy and training summary."""
    import yaml
    arch, metrics, info = ckpt.arch, ckpt.meta.get('metrics') or {}, label.dataset
    template_path = MODEL_CARD_DIR / f'{arch}.md'
    text = template_path.read_text(encoding='utf-8') if template_path.is_file() else generate_model_card(arch)
    match = re.match(r'^---\n(.*?)\n---\n', text, re.S)
    meta = yaml.safe_load(match.group(1)) if match else {}
    body = text[match.end():] if match else text
    if info.hub_dataset:
        meta['datasets'] = [info.hub_dataset]
    else:
        meta.pop('datasets', None)  # no Hub dataset id for it: claim none
    scores = [(key, name) for key, name in (('top1', 'Top-1 accuracy'), ('top5', 'Top-5 accuracy')) if key in metrics]
    if scores:
        meta['model-index'] = [{
            'name': label.name,
            'results': [{
                'task': {'type': 'image-classification', 'name': 'Image Classification'},
                'dataset': {'type': info.hub_dataset or info.tag, 'name': info.title, 'split': info.eval_split},
                'metrics': [{'type': 'accuracy', 'name': name, 'value': round(float(metrics[key]), 2)}
                            for key, name in scores],
            }],
        }]
    body = _replace_section(body, 'title', f'# {label.name}')
    body = _replace_section(body, 'description', _describe(
        arch, model, label.registered_architecture, ckpt.model_args) + '.')
    counts = count_params_and_macs(model)
    body = _replace_section(body, 'size', _size_section(
        counts, f'\n- Architecture arguments of these weights: `{ckpt.model_args}`' if ckpt.model_args else ''))
    on_cifar = info.tag == dataset_info('cifar10').tag  # the dataset, whatever the registered tag is called
    measured = f'{metrics["top1"]:.2f} %' if 'top1' in metrics and label.is_reference else None
    results = _results_section(arch, measured)
    if 'top1' in metrics and not label.is_reference:
        what = info.title if label.registered_architecture else f'{info.title} with a custom configuration'
        results += (f'\n\nThese weights were trained on **{what}**'
                    + ('' if on_cifar else ', not CIFAR-10')
                    + ': ' + ', '.join(f'{name.lower()} {float(metrics[key]):.2f} %' for key, name in scores)
                    + f' on its {info.eval_split} split.')
    body = _replace_section(body, 'results', results)
    body = _replace_section(body, 'training', _training_summary(ckpt, label))
    body = _replace_section(body, 'recipe', _used_recipe_section(ckpt))
    body = _replace_section(body, 'usage', _usage_section(arch, repo_id, repo_id == registered_hf_hub_id(arch)))
    if has_figure:
        body = _replace_section(body, 'figure', f'## Attention heads\n![attention of every head]({CARD_FIGURE_FILENAME})')
    header = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip()
    return f'---\n{header}\n---\n{body}'


def _used_recipe_section(ckpt: Checkpoint) -> str:
    """The arguments these weights were trained with (the template shows the paper's recipe instead)."""
    import yaml
    from .recipes import recipe_path
    try:
        reference = f' The paper\'s CIFAR-10 recipe is `scripts/configs/{recipe_path(ckpt.arch).name}` in sa_vision.'
    except FileNotFoundError:
        reference = ''
    tool = 'timm `train.py`' if ckpt.format == 'timm' else '`scripts/train.py`'
    used = yaml.safe_dump(_recipe(ckpt), sort_keys=False).strip()
    return (f'These weights were trained with the arguments below ({tool}; `{RECIPE_FILENAME}` in this repository: '
            f'`-c {RECIPE_FILENAME}` repeats the run).{reference}\n\n```yaml\n{used}\n```')


def _training_summary(ckpt: Checkpoint, label: WeightsLabel) -> str:
    meta = ckpt.meta
    args, metrics, history = meta.get('args') or {}, meta.get('metrics') or {}, meta.get('history') or []
    epochs = meta.get('epoch')
    lines = ['## Training summary']
    if ckpt.format == 'hub_folder' or epochs is None:
        lines.append(f'- Exported from {ckpt.format.replace("_", " ")} weights; no training record.')
        return '\n'.join(lines)
    steps = meta.get('num_updates')
    lines.append(
        f'- Data: {label.dataset.title}; {epochs} epochs'
        + (f' of {steps // max(epochs, 1)} steps' if steps else '')
        + f', batch {args.get("batch_size")} x {args.get("world_size", 1)} process(es) on `{args.get("device")}`, '
          f'seed {args.get("seed")}; the arguments are `{RECIPE_FILENAME}`.')
    if args.get('initial_checkpoint'):
        lines.append('- Started from earlier weights (`--initial-checkpoint`), e.g. a pruned model.')
    if {'top1', 'top5', 'loss'} <= set(metrics):
        lines.append(f'- Final evaluation ({metrics.get("num_images")} images): top-1 {metrics["top1"]:.2f} %, '
                     f'top-5 {metrics["top5"]:.2f} %, loss {metrics["loss"]:.4f}.')
    if history:
        lines += ['', '| epoch | train loss | lr | eval loss | top-1 |', '|---|---|---|---|---|']
        lines += [f'| {h["epoch"]} | {h["train_loss"]:.4f} | {h["lr"]:.2e} | {h["eval_loss"]:.4f} | {h["eval_top1"]:.2f} |'
                  for h in history]
    return '\n'.join(lines)


# ---------------------------------------------------------------------------------------------------------
# export and publish

def _save_card_figure(model, path: Path) -> bool:
    """The attention figure of ``sa_vision.plots`` for SA models (the baseline has none)."""
    from .models.sa_cifar import SelfAttentionNet
    from .plots import save_card_figure  # matplotlib, imported only when a card is written
    if not isinstance(model, SelfAttentionNet):
        return False
    save_card_figure(model, path)
    return path.is_file()


def export_hub_folder(
        source: Union[str, os.PathLike, Checkpoint],
        out_dir: Union[str, os.PathLike],
        expected_arch: Optional[str] = None,
        repo_id: Optional[str] = None,
        figure: bool = True,
        use_ema: bool = False,
) -> List[str]:
    """Write a Hub folder of trained weights; return the names of the files written.

    Args:
        source: Weights of any kind :func:`~sa_vision.checkpoint.read_checkpoint` opens (``last.pth.tar`` of
            ``scripts/train.py`` or timm's ``train.py``, ...), or an opened :class:`~sa_vision.checkpoint.Checkpoint`.
        out_dir: Folder to (re)write. Files of an earlier export are replaced; other files are an error.
        expected_arch: Fail unless the weights are of this architecture.
        repo_id: Repository the folder is meant for (default: ``<HF_NAMESPACE>/<arch>.<tag>``); a repository the
            weights must not go to is refused (:func:`check_publish_target`).
        figure: Add the attention figure of ``sa_vision.plots`` when available.
        use_ema: Export the EMA weights of a timm train.py checkpoint.
    """
    import yaml
    from timm.models import save_for_hf
    ckpt = source if isinstance(source, Checkpoint) else read_checkpoint(source, arch=expected_arch, use_ema=use_ema)
    if expected_arch and ckpt.arch != expected_arch:
        raise CheckpointError(f'{ckpt.source} holds a {ckpt.arch} model, not {expected_arch}')
    model = ckpt.create_model()  # fails on weights that do not fit the architecture
    label = weights_label(ckpt)
    repo_id = repo_id or label.default_repo_id
    check_publish_target(label, repo_id)

    out_dir = Path(out_dir)
    if out_dir.exists():
        ours = set(HUB_FOLDER_FILES) | {CARD_FIGURE_FILENAME}
        foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in ours)
        if foreign:
            raise FileExistsError(f'{out_dir} holds files that are not part of an export ({foreign}); '
                                  f'choose an empty or new folder')
        for name in ours:
            (out_dir / name).unlink(missing_ok=True)
    data_cfg = ckpt.meta.get('data_config') or {'mean': label.dataset.mean, 'std': label.dataset.std}
    save_for_hf(model, out_dir, safe_serialization=True, model_config={'pretrained_cfg': {'tag': label.tag}},
                data_config={k: tuple(v) for k, v in data_cfg.items() if k in ('mean', 'std')})
    with open(out_dir / RECIPE_FILENAME, 'w') as f:
        f.write(f'# training arguments of {label.name} ({"timm train.py" if ckpt.format == "timm" else "scripts/train.py"}'
                f' names): python scripts/train.py -c {RECIPE_FILENAME} --data-dir DIR repeats the run\n')
        yaml.safe_dump(_recipe(ckpt), f, sort_keys=False)
    has_figure = figure and _save_card_figure(model, out_dir / CARD_FIGURE_FILENAME)
    readme = render_model_card(ckpt, model, label, repo_id, has_figure=has_figure)
    (out_dir / 'README.md').write_text(readme, encoding='utf-8')
    return sorted(p.name for p in out_dir.iterdir())


def resolve_token(token: Optional[str] = None) -> str:
    """The token given, else ``HF_TOKEN`` or the ``hf auth login`` one; never printed."""
    from huggingface_hub import get_token
    token = token or os.environ.get('HF_TOKEN') or get_token()
    if not token:
        raise HubPublishError(
            'no Hugging Face token: set the HF_TOKEN environment variable to a token with write access '
            '(https://huggingface.co/settings/tokens) or run `hf auth login`; nothing was uploaded')
    return token


def publish_hub_folder(
        folder: Union[str, os.PathLike],
        repo_id: str,
        token: Optional[str] = None,
        private: bool = False,
        commit_message: str = 'Add weights trained with sa_vision',
        create_pr: bool = False,
):
    """Upload an exported folder to ``repo_id`` in one commit, after checking files, token and permission."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    folder = Path(folder)
    missing = [name for name in HUB_FOLDER_FILES if not (folder / name).is_file()]
    if missing:
        raise HubPublishError(f'{folder} is not a complete export (missing {missing}); run the export first')
    _check_folder_target(folder, repo_id)
    token = resolve_token(token)
    api = HfApi(token=token, library_name='timm')
    try:
        who = api.whoami()
    except HfHubHTTPError as e:
        raise HubPublishError(f'the Hugging Face token was refused ({_status(e)}); create a new token with '
                              f'write access and set HF_TOKEN; nothing was uploaded') from None
    namespace = repo_id.split('/')[0] if '/' in repo_id else who.get('name')
    role = ((who.get('auth') or {}).get('accessToken') or {}).get('role')
    allowed = {who.get('name')} | {org.get('name') for org in who.get('orgs', [])}
    if role == 'read' or namespace not in allowed:
        raise HubPublishError(
            f'{who.get("name")} cannot write to {repo_id} (token role {role!r}, namespaces {sorted(allowed)}); '
            f'use a write token of a member of {namespace!r} or another --repo-id; nothing was uploaded')
    try:
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    except HfHubHTTPError as e:
        raise HubPublishError(f'cannot create or access {repo_id} ({_status(e)}); check the token\'s '
                              f'permission on {namespace!r}; nothing was uploaded') from None
    return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                             create_pr=create_pr)


def _check_folder_target(folder: Path, repo_id: str) -> None:
    """The registered repository takes only folders labelled as the reference weights (tag 'cifar10')."""
    import json
    config = json.loads((folder / 'config.json').read_text())
    arch, tag = config.get('architecture', ''), (config.get('pretrained_cfg') or {}).get('tag')
    if arch and repo_id == registered_hf_hub_id(arch) and tag != PRETRAINED_TAG:
        raise HubPublishError(
            f'refusing {repo_id}: timm.create_model({arch!r}, pretrained=True) downloads that repository for '
            f'everyone, and {folder} holds {arch}.{tag} weights, not CIFAR-10 weights of the paper\'s architecture; '
            f'publish to {hub_repo_id(arch, tag)} or your own --repo-id; nothing was uploaded')


def _status(error) -> str:
    response = getattr(error, 'response', None)
    return f'HTTP {response.status_code}' if response is not None else type(error).__name__
