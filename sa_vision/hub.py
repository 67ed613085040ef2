""" Checkpoints, Hub export and publishing, and the error for pretrained weights that cannot be fetched

* Training checkpoints (``scripts/train.py``) are written atomically and read with ``torch.load(weights_only=True)``
  (or safetensors): loading never unpickles arbitrary objects.
* :func:`export_hub_folder` writes a folder in timm's ``save_for_hf`` format (``config.json`` with
  ``architecture``, ``model_args`` and ``pretrained_cfg``; ``model.safetensors``) plus ``README.md`` rendered
  from ``model_cards/<arch>.md`` with the measured accuracy, and the recipe used (``recipe.yaml``).
  ``timm.create_model('local-dir:<folder>', pretrained=True)`` loads it; on the Hub, ``'hf-hub:<repo>'`` and, for
  ``<HF_NAMESPACE>/<arch>.<PRETRAINED_TAG>``, ``timm.create_model('<arch>', pretrained=True)``.
* :func:`publish_hub_folder` uploads such a folder in one commit after checking token and permission.

This module imports no model code at import time (the model factories import it).
"""
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch

__all__ = [
    'CHECKPOINT_VERSION', 'HUB_FOLDER_FILES', 'RECIPE_FILENAME', 'CARD_FIGURE_FILENAME',
    'CheckpointError', 'HubPublishError', 'PretrainedWeightsUnavailable',
    'atomic_torch_save', 'load_training_checkpoint', 'load_weights', 'model_from_checkpoint',
    'count_params_and_macs', 'generate_model_card', 'render_model_card', 'export_hub_folder',
    'resolve_token', 'publish_hub_folder', 'explain_unavailable_weights', 'default_repo_id',
]

CHECKPOINT_VERSION = 1
RECIPE_FILENAME = 'recipe.yaml'
CARD_FIGURE_FILENAME = 'attention.png'
HUB_FOLDER_FILES = ('config.json', 'model.safetensors', 'README.md', RECIPE_FILENAME)  # + the figure if any
MODEL_CARD_DIR = Path(__file__).resolve().parent.parent / 'model_cards'
_CHECKPOINT_KEYS = ('arch', 'model_args', 'state_dict')


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, of another architecture or not of this format."""


class HubPublishError(RuntimeError):
    """Publishing cannot start: no token, no write permission, or an invalid repository."""


class PretrainedWeightsUnavailable(RuntimeError):
    """``pretrained=True`` but the weights cannot be fetched from the Hub (offline, or not published)."""


# ---------------------------------------------------------------------------------------------------------
# checkpoints

def atomic_torch_save(obj: Any, path: Union[str, os.PathLike]) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename over it: a crash never leaves a half file."""
    path = Path(path)
    tmp = path.with_name(f'.{path.name}.tmp{os.getpid()}')
    try:
        torch.save(obj, tmp)
        with open(tmp, 'rb') as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_training_checkpoint(path: Union[str, os.PathLike], map_location='cpu') -> Dict[str, Any]:
    """A checkpoint of ``scripts/train.py``, read without unpickling objects (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f'checkpoint {path} does not exist; train one with scripts/train.py')
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated zip, random bytes, or pickled objects that weights_only refuses
        raise CheckpointError(
            f'checkpoint {path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:200]}); '
            f'it is corrupted or truncated, or not a checkpoint of scripts/train.py. '
            f'Use the last.pth.tar of a finished epoch or retrain') from None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in _CHECKPOINT_KEYS):
        found = sorted(ckpt)[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(
            f'{path} is not a checkpoint of scripts/train.py (expected the keys {list(_CHECKPOINT_KEYS)}, '
            f'found {found}); for a bare state dict use load_weights()')
    return ckpt


def load_weights(path: Union[str, os.PathLike], expected_arch: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """A state dict from a ``.safetensors`` file or a training checkpoint (checked against ``expected_arch``)."""
    path = Path(path)
    if path.suffix == '.safetensors':
        from safetensors.torch import load_file
        if not path.is_file():
            raise CheckpointError(f'weights file {path} does not exist')
        try:
            return load_file(path)
        except Exception as e:
            raise CheckpointError(f'{path} is not a readable safetensors file ({e}); it is corrupted') from None
    ckpt = load_training_checkpoint(path)
    check_arch(ckpt, expected_arch, path)
    return ckpt['state_dict']


def check_arch(ckpt: Dict[str, Any], expected_arch: Optional[str], path='checkpoint') -> None:
    if expected_arch and ckpt['arch'] != expected_arch:
        raise CheckpointError(
            f'{path} holds a {ckpt["arch"]} model, not {expected_arch}; '
            f'pass a checkpoint of {expected_arch} or use --model {ckpt["arch"]}')


def model_from_checkpoint(ckpt: Dict[str, Any], path='checkpoint') -> torch.nn.Module:
    """The trained model of a checkpoint (architecture and args from the checkpoint), in eval mode."""
    import timm
    import sa_vision  # noqa: F401  registers the models
    if not timm.is_model(ckpt['arch']):
        raise CheckpointError(f'{path} holds an unknown architecture {ckpt["arch"]!r}')
    model = timm.create_model(ckpt['arch'], **ckpt['model_args'])
    try:
        model.load_state_dict(ckpt['state_dict'])
    except RuntimeError as e:
        raise CheckpointError(
            f'the weights in {path} do not fit {ckpt["arch"]}({ckpt["model_args"]}): '
            f'{str(e).splitlines()[0]} ... The checkpoint is of another architecture or was edited') from None
    return model.eval()


# ---------------------------------------------------------------------------------------------------------
# model cards

def count_params_and_macs(model: torch.nn.Module, img_size: int = 32) -> Dict[str, int]:
    """Parameters and multiply-accumulates of one ``3 x img_size x img_size`` image, attention included.

    Counted with ``torch.utils.flop_counter.FlopCounterMode`` (every matmul, attention sums too); MACs = FLOPs / 2.
    """
    from torch.utils.flop_counter import FlopCounterMode
    was_training = model.training
    model.eval()
    x = torch.zeros(1, model.in_chans if hasattr(model, 'in_chans') else 3, img_size, img_size)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    model.train(was_training)
    return {'params': sum(p.numel() for p in model.parameters()), 'macs': counter.get_total_flops() // 2}


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
    from .models.sa_cifar import HF_NAMESPACE, PRETRAINED_TAG
    paper_flops = ''
    if paper and paper.gflops:
        paper_flops = f' The paper reports {paper.gflops} GFLOPs' + (
            ', counting only the Linear layers.' if attn_kind else '.')
    description = paper.description if paper else arch
    description = description[:1].upper() + description[1:]
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
# {arch}.{PRETRAINED_TAG}

{description} — a model of Cordonnier, Loukas & Jaggi, *On the Relationship between Self-Attention and
Convolutional Layers* (ICLR 2020), implemented as a timm model in
`sa_vision` (10 classes, 32x32 input; the authors' original code: https://github.com/epfml/attention-cnn).

Attention: {_ATTENTION_FORMULAS[attn_kind]}.

## Size
{_section('size', _size_section(counts, '.' + paper_flops))}

## Results
{_section('results', _results_section(arch, None))}

## Training recipe
{_section('recipe', recipe)}

{_section('training', 'Not yet trained: no training run has been exported into this card.')}

## Usage
```python
import timm, torch
import sa_vision  # registers the models with timm

model = timm.create_model('{arch}', pretrained=True).eval()  # weights from {HF_NAMESPACE}/{arch}.{PRETRAINED_TAG}
cfg = timm.data.resolve_data_config({{}}, model=model)
transform = timm.data.create_transform(**cfg)  # normalise with the CIFAR-10 mean / std
logits = model(transform(image).unsqueeze(0))  # image: a 32x32 PIL image
```
The same folder loads with `timm.create_model('hf-hub:{HF_NAMESPACE}/{arch}.{PRETRAINED_TAG}', pretrained=True)` or, exported
locally, `timm.create_model('local-dir:<folder>', pretrained=True)`.

## Citation
```bibtex
{PAPER_CITATION}
```
"""


def write_model_cards(archs=('sa_quadratic_cifar', 'sa_gen_cifar', 'sa_gen_pruned', 'sa_learned_cifar',
                             'resnet18_cifar'), out_dir: Union[str, os.PathLike] = MODEL_CARD_DIR) -> List[Path]:
    """(Re)generate the card templates ``model_cards/<arch>.md``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for arch in archs:
        path = out_dir / f'{arch}.md'
        path.write_text(generate_model_card(arch), encoding='utf-8')
        paths.append(path)
    return paths


def _dataset_meta(dataset: str) -> Dict[str, str]:
    if dataset.lower() in ('torch/cifar10', 'cifar10'):
        return {'type': 'cifar10', 'name': 'CIFAR-10', 'split': 'test'}
    if dataset.lower() == 'digits':
        return {'type': 'digits', 'name': 'scikit-learn digits (8x8, upscaled to 32x32)', 'split': 'test'}
    return {'type': 'imagefolder', 'name': dataset or 'image folder', 'split': 'validation'}


def render_model_card(ckpt: Dict[str, Any], model: torch.nn.Module, repo_name: str, has_figure: bool = False) -> str:
    """README.md of an export: the card template with the measured size, accuracy and training summary."""
    import yaml
    arch, dataset, metrics = ckpt['arch'], ckpt.get('dataset', ''), ckpt.get('metrics') or {}
    template_path = MODEL_CARD_DIR / f'{arch}.md'
    text = template_path.read_text(encoding='utf-8') if template_path.is_file() else generate_model_card(arch)
    match = re.match(r'^---\n(.*?)\n---\n', text, re.S)
    meta = yaml.safe_load(match.group(1)) if match else {}
    body = text[match.end():] if match else text
    ds = _dataset_meta(dataset)
    on_cifar = ds['type'] == 'cifar10'
    if on_cifar:
        meta['datasets'] = ['cifar10']
    else:
        meta.pop('datasets', None)  # trained on something else: claim no CIFAR-10 weights
    if metrics:
        meta['model-index'] = [{
            'name': repo_name,
            'results': [{
                'task': {'type': 'image-classification', 'name': 'Image Classification'},
                'dataset': ds,
                'metrics': [
                    {'type': 'accuracy', 'name': 'Top-1 accuracy', 'value': round(metrics['top1'], 2)},
                    {'type': 'accuracy', 'name': 'Top-5 accuracy', 'value': round(metrics['top5'], 2)},
                ],
            }],
        }]
    counts = count_params_and_macs(model)
    model_args = ckpt.get('model_args') or {}
    body = _replace_section(body, 'size', _size_section(
        counts, f'\n- Architecture arguments of these weights: `{model_args}`' if model_args else ''))
    measured = f'{metrics["top1"]:.2f} %' if metrics and on_cifar else None
    results = _results_section(arch, measured)
    if metrics and not on_cifar:
        results += (f'\n\nThese weights were trained on **{ds["name"]}**, not CIFAR-10 (a smoke test of the '
                    f'pipeline): top-1 {metrics["top1"]:.2f} %, top-5 {metrics["top5"]:.2f} % on its '
                    f'{ds["split"]} split.')
    body = _replace_section(body, 'results', results)
    body = _replace_section(body, 'training', _training_summary(ckpt))
    body = _replace_section(body, 'recipe', _used_recipe_section(ckpt))
    if has_figure:
        body = _replace_section(body, 'figure', f'## Attention heads\n![attention of every head]({CARD_FIGURE_FILENAME})')
    header = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip()
    return f'---\n{header}\n---\n{body}'


def _used_recipe_section(ckpt: Dict[str, Any]) -> str:
    """The arguments these weights were trained with (the template shows the paper's recipe instead)."""
    import yaml
    from .recipes import recipe_path
    try:
        reference = f' The paper\'s CIFAR-10 recipe is `scripts/configs/{recipe_path(ckpt["arch"]).name}` in sa_vision.'
    except FileNotFoundError:
        reference = ''
    used = yaml.safe_dump(ckpt.get('args', {}), sort_keys=False).strip()
    return (f'These weights were trained with the arguments below (`{RECIPE_FILENAME}` in this repository, '
            f'`scripts/train.py` names).{reference}\n\n```yaml\n{used}\n```')


def _training_summary(ckpt: Dict[str, Any]) -> str:
    args, metrics, history = ckpt.get('args', {}), ckpt.get('metrics') or {}, ckpt.get('history', [])
    lines = [
        '## Training summary',
        f'- Data: `{ckpt.get("dataset", "")}`, {ckpt["epoch"]} epochs of {ckpt.get("num_updates", 0) // max(ckpt["epoch"], 1)} '
        f'steps, batch {args.get("batch_size")} x {args.get("world_size", 1)} process(es) on `{args.get("device")}`, '
        f'seed {args.get("seed")}, recipe `{RECIPE_FILENAME}` (the arguments used).',
    ]
    if metrics:
        lines.append(f'- Final evaluation ({metrics.get("num_images")} images): top-1 {metrics["top1"]:.2f} %, '
                     f'top-5 {metrics["top5"]:.2f} %, loss {metrics["loss"]:.4f}.')
    if history:
        lines += ['', '| epoch | train loss | lr | eval loss | top-1 |', '|---|---|---|---|---|']
        lines += [f'| {h["epoch"]} | {h["train_loss"]:.4f} | {h["lr"]:.2e} | {h["eval_loss"]:.4f} | {h["eval_top1"]:.2f} |'
                  for h in history]
    return '\n'.join(lines)


# ---------------------------------------------------------------------------------------------------------
# export and publish

def default_repo_id(arch: str) -> str:
    """``<HF_NAMESPACE>/<arch>.<PRETRAINED_TAG>``: where ``create_model(arch, pretrained=True)`` looks."""
    from .models.sa_cifar import HF_NAMESPACE, PRETRAINED_TAG
    return f'{HF_NAMESPACE}/{arch}.{PRETRAINED_TAG}'


def _check_repo_arch(repo_id: str, arch: str) -> None:
    """A repository named after an architecture must receive that architecture."""
    import timm
    name = repo_id.split('/')[-1].split('.')[0]
    if name != arch and timm.is_model(name):
        raise CheckpointError(
            f'the checkpoint holds a {arch} model but the repository {repo_id} is for {name}; '
            f'publish to {default_repo_id(arch)} or pass a checkpoint of {name}')


def _save_card_figure(model, path: Path) -> bool:
    """The attention figure of ``sa_vision.plots`` for SA models (the baseline has none)."""
    from .models.sa_cifar import SelfAttentionNet
    from .plots import save_card_figure  # matplotlib, imported only when a card is written
    if not isinstance(model, SelfAttentionNet):
        return False
    save_card_figure(model, path)
    return path.is_file()


def export_hub_folder(
        checkpoint: Union[str, os.PathLike],
        out_dir: Union[str, os.PathLike],
        expected_arch: Optional[str] = None,
        repo_id: Optional[str] = None,
        figure: bool = True,
) -> List[str]:
    """Write a Hub folder of a training checkpoint; return the names of the files written.

    Args:
        checkpoint: ``last.pth.tar`` of ``scripts/train.py``.
        out_dir: Folder to (re)write. Files of an earlier export are replaced; other files are an error.
        expected_arch: Fail unless the checkpoint holds this architecture.
        repo_id: Repository the folder is meant for (named in the card and checked against the architecture).
        figure: Add the attention figure of ``sa_vision.plots`` when available.
    """
    import yaml
    from timm.models import save_for_hf
    ckpt = load_training_checkpoint(checkpoint)
    check_arch(ckpt, expected_arch, checkpoint)
    repo_id = repo_id or default_repo_id(ckpt['arch'])
    _check_repo_arch(repo_id, ckpt['arch'])
    model = model_from_checkpoint(ckpt, checkpoint)  # fails on weights that do not fit the architecture

    out_dir = Path(out_dir)
    if out_dir.exists():
        ours = set(HUB_FOLDER_FILES) | {CARD_FIGURE_FILENAME}
        foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in ours)
        if foreign:
            raise FileExistsError(f'{out_dir} holds files that are not part of an export ({foreign}); '
                                  f'choose an empty or new folder')
        for name in ours:
            (out_dir / name).unlink(missing_ok=True)
    save_for_hf(model, out_dir, safe_serialization=True)
    with open(out_dir / RECIPE_FILENAME, 'w') as f:
        f.write(f'# arguments of scripts/train.py for {ckpt["arch"]} (timm train.py names)\n')
        yaml.safe_dump(ckpt.get('args', {}), f, sort_keys=False)
    has_figure = figure and _save_card_figure(model, out_dir / CARD_FIGURE_FILENAME)
    readme = render_model_card(ckpt, model, repo_id.split('/')[-1], has_figure=has_figure)
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


def _status(error) -> str:
    response = getattr(error, 'response', None)
    return f'HTTP {response.status_code}' if response is not None else type(error).__name__


# ---------------------------------------------------------------------------------------------------------
# pretrained=True without reachable weights

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
