""" The zoo, reproduced: one resumable command from a dataset to the five trained, evaluated, exported models

Stages (``sa-vision-reproduce``): train four models from scratch; prune the trained ``sa_gen_cifar`` (paper App. A.1)
and fine-tune ``sa_gen_pruned`` from it; the results table (test split, float32); the Hub folders, figures and
attention explorer; publish (``publish=True``, a dry run otherwise). Each stage writes its result atomically and is
skipped when it exists; a killed training continues from its last epoch (docs/reproduction.md).
"""
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from ..io import atomic_write, atomic_write_text, plain_data
from ..models import SA_MODEL_ARGS
from ..models._pretrained import hub_repo_id
from ..paper import PAPER_RESULTS
from ..research.pruning import PRUNED_ARCH
from ..tables import markdown_table
from ..train.checkpoint import Checkpoint, read_checkpoint
from ..train.data import dataset_info
from ..train.recipes import load_recipe
from ..train.runtime import format_duration

__all__ = ['TRAINED_MODELS', 'PRUNED_MODEL', 'TABLE_ORDER', 'Profile', 'PROFILES', 'StageFailed', 'Reproduction',
           'evaluate_on_test_split', 'draw_figures', 'check_kept_models', 'record_kept_models', 'kept_guard_paths',
           'kept_subset_top1', 'logits_tolerance', 'EVAL_PRECISION', 'ACCURACY_TOLERANCE', 'GUARD_IMAGES',
           'SUBSET_IMAGES']

TABLE_ORDER = tuple(PAPER_RESULTS)  # the models of the paper's table, in its order
PRUNE_SOURCE = 'sa_gen_cifar'
PRUNED_MODEL = PRUNED_ARCH  # made from PRUNE_SOURCE; every other model of the table is trained from scratch
TRAINED_MODELS = tuple(model for model in TABLE_ORDER if model != PRUNED_MODEL)
# center_shift_median: median |final - initial centre| over all heads in grid units (empty without centres);
# top1 / top5 in float32: the same figures on any CPU, where bfloat16 depends on the CPU's arithmetic
TABLE_COLUMNS = ('model', 'dataset', 'epochs', 'parameters', 'macs_g', 'top1', 'top5', 'eval_precision',
                 'train_minutes', 'center_shift_median', 'amp', 'pos_lr_scale', 'paper_cifar10_top1')
EVAL_PRECISION = 'float32'
# a kept model's accuracy may differ from the table by one image in 10,000 (a float32 tie broken otherwise)
ACCURACY_TOLERANCE = 0.01
GUARD_IMAGES = 64  # the fixed batch whose logits guard a kept model
SUBSET_IMAGES = 500  # the test images whose recorded top-1 a quick check of another pipeline compares with


@dataclass(frozen=True)
class Profile:
    """How the five models are trained: recipe changes per model (``{}``: the paper's recipe unchanged)."""
    name: str
    description: str
    dataset: str  # the default dataset
    common: Dict[str, Any] = field(default_factory=dict)  # changes to every recipe
    per_model: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # and to one model's
    table_note: str = ''  # printed under the results table: how to read its numbers

    def recipe(self, model: str, dataset: str, epochs: Optional[int] = None) -> Dict[str, Any]:
        """The recipe of ``model``'s stage: the paper's recipe of the model with this profile's changes."""
        recipe = load_recipe(model)
        for changes in (self.common, self.per_model.get(model, {})):
            apply_recipe_changes(recipe, changes)
        info = dataset_info(dataset)
        recipe.update(dataset=info.name, val_split=info.eval_split, num_classes=info.num_classes or recipe.get(
            'num_classes'))
        if epochs is not None:
            recipe['epochs'] = epochs
            recipe['warmup_epochs'] = round(0.05 * epochs, 3)  # the paper's warm-up over 5 % of the steps
        recipe.pop('initial_checkpoint', None)  # given per run
        return recipe


# narrower attention models with the paper's depth (6 layers) and heads (9 per layer); positional defaults written out
_NARROW_SA = {'model_kwargs': {'embed_dim': 64, 'mlp_hidden_dim': 128, 'proj_drop_rate': 0.0, 'attn_drop_rate': 0.0,
                               'pos_init': 'paper', 'pos_init_alpha': 6.0}, 'pos_lr_scale': 1.0}
# few epochs: AdamW converges in far fewer steps than the paper's SGD at lr 0.1 (300 epochs)
_FEW_EPOCHS = dict(opt='adamw', lr=2e-3, weight_decay=0.05, momentum=0.9, batch_size=100, validation_batch_size=500,
                   sched='cosine', sched_on_updates=True, warmup_lr=0.0, min_lr=0.0, cooldown_epochs=0, workers=0,
                   log_interval=100)
_TINY_SA = {'model_kwargs': {'embed_dim': 16, 'depth': 2, 'heads_per_layer': 3, 'mlp_hidden_dim': 32,
                             'proj_drop_rate': 0.0, 'attn_drop_rate': 0.0}}

PROFILES: Dict[str, Profile] = {
    'paper': Profile(
        'paper', "CIFAR-10 with the paper's recipes unchanged (300 epochs; a GPU and the CIFAR-10 download)",
        'torch/cifar10'),
    'cpu': Profile(
        'cpu', "narrower models (embedding 64, MLP 128; the paper's 6 layers of 9 heads; ResNet18 at half width), "
               "AdamW, a few epochs: Fashion-MNIST (or digits) on a 2-core CPU in about 100 minutes",
# why each choice: docs/reproduction.md ("The `cpu` profile", "Choosing the profile"); torchcompile is speed only
        'fashion-mnist', common={**_FEW_EPOCHS, 'amp': 'auto', 'torchcompile': 'auto', 'batch_size': 50,
                                 'train_crop_padding': 0},
        per_model={
            # pos_lr_scale 30: otherwise the Gaussian centres stay at their random start (paper Figs. 2-4)
            'sa_quadratic_cifar': {**_NARROW_SA, 'pos_lr_scale': 30.0, 'epochs': 6, 'warmup_epochs': 0.3},
            'sa_gen_cifar': {**_NARROW_SA, 'pos_lr_scale': 30.0, 'epochs': 5, 'warmup_epochs': 0.25},
            'sa_learned_cifar': {**_NARROW_SA, 'epochs': 6, 'warmup_epochs': 0.3},
            # as many epochs as the quadratic model: the comparison is at equal epochs
            'resnet18_cifar': {'model_kwargs': {'channels': (32, 64, 128, 256), 'stem_width': 32}, 'epochs': 6,
                               'warmup_epochs': 0.3},
            # the pruned model's architecture comes from the pruned weights: only regularisation is set here
            'sa_gen_pruned': {'model_kwargs': {'proj_drop_rate': 0.0, 'attn_drop_rate': 0.0}, 'pos_lr_scale': 30.0,
                              'epochs': 1, 'lr': 5e-4, 'warmup_epochs': 0.05},
        },
        table_note=('Choices of the `cpu` profile (`sa_vision.reproduce.PROFILES[\'cpu\']`): AdamW lr 2e-3, batch 50, '
                    'cosine per step, no pad-and-crop (horizontal flips only) because a few epochs underfit rather '
                    'than overfit; `pos_lr_scale` 30 for the Gaussian kinds so that their centres and spreads learn '
                    '(one learning rate leaves them at their random start); `amp: auto` decided bf16 or float32 by '
                    'measuring the CPU (the `amp` column), and `torchcompile: auto` compiled the training step only '
                    'where a probe measured it faster (speed only). The ResNet trains as many epochs as the quadratic '
                    'model.')),
    'tiny': Profile(
        'tiny', 'tiny models, 2 epochs each: the mechanics in about two minutes (CI)', 'digits',
        table_note=('The `tiny` profile checks the mechanics (training, resuming, pruning, fine-tuning, export), not '
                    'the models: attention models of 2 layers of 3 heads of width 16 trained for 2 epochs stay close '
                    'to chance (10 % top-1 on digits; the small ResNet learns faster), and their heads rarely become '
                    'degenerate, so the pruned model usually keeps every head (pruning.json). This is expected; the '
                    '`cpu` and `paper` profiles train real models.'),
        common={**_FEW_EPOCHS, 'batch_size': 64, 'validation_batch_size': 360, 'log_interval': 10, 'hflip': 0.0,
                'train_crop_padding': 0},
        per_model={
            **{model: {**_TINY_SA, 'epochs': 2, 'warmup_epochs': 0.1}
               for model in TRAINED_MODELS if model in SA_MODEL_ARGS},
            'resnet18_cifar': {'model_kwargs': {'channels': (8, 16, 32, 64), 'stem_width': 8}, 'epochs': 2,
                               'warmup_epochs': 0.1},
            'sa_gen_pruned': {'model_kwargs': {'proj_drop_rate': 0.0, 'attn_drop_rate': 0.0}, 'epochs': 1,
                              'lr': 5e-4, 'warmup_epochs': 0.05},
        }),
}
def apply_recipe_changes(recipe: Dict[str, Any], changes: Dict[str, Any]) -> Dict[str, Any]:
    """``recipe`` with ``changes`` set in place; ``model_kwargs`` are updated key by key, as ``--model-kwargs`` does."""
    for key, value in changes.items():
        if key == 'model_kwargs':
            recipe['model_kwargs'] = {**(recipe.get('model_kwargs') or {}), **value}
        else:
            recipe[key] = value
    return recipe


# the ablation of the positional parameters (paper Sec. 4.2): random or Theorem 1 init, base or 30x positional lr
ABLATION_MODEL = 'sa_quadratic_cifar'
ABLATION_POS_LR_SCALE = 30.0
ABLATION_VARIANTS: Dict[str, Dict[str, Any]] = {
    'paper init': {'model_kwargs': {'pos_init': 'paper'}, 'pos_lr_scale': 1.0},
    f'paper init, positional lr x{ABLATION_POS_LR_SCALE:g}': {
        'model_kwargs': {'pos_init': 'paper'}, 'pos_lr_scale': ABLATION_POS_LR_SCALE},
    'conv init (Theorem 1)': {'model_kwargs': {'pos_init': 'conv'}, 'pos_lr_scale': 1.0},
    f'conv init (Theorem 1), positional lr x{ABLATION_POS_LR_SCALE:g}': {
        'model_kwargs': {'pos_init': 'conv'}, 'pos_lr_scale': ABLATION_POS_LR_SCALE},
}
ABLATION_COLUMNS = ('variant', 'run', 'model', 'dataset', 'epochs', 'pos_init', 'pos_lr_scale', 'amp', 'top1', 'top5',
                    'center_shift_median', 'train_minutes')


def ablation_run_name(variant: str) -> str:
    """The run folder of an ablation variant: ``ablation-paper-init-positional-lr-x30``, ..."""
    slug = ''.join(c if c.isalnum() else '-' for c in variant.lower())
    return 'ablation-' + '-'.join(part for part in slug.split('-') if part)


class StageFailed(RuntimeError):
    """A stage of the reproduction failed; the finished stages are kept."""


def _say(msg: str) -> None:
    print(msg, flush=True)


class Reproduction:
    """The stages above for one profile, dataset and output folder (see :meth:`run`); ``epochs`` overrides every
    training stage's epochs but the fine-tuning's; ``train_args`` (``sa-vision-train`` arguments, e.g. the device
    and speed flags) follow the recipe on every training stage's command line, so they win over it."""

    def __init__(self, out_dir, profile: str = 'cpu', dataset: Optional[str] = None, data_dir: Optional[str] = None,
                 download: bool = False, epochs: Optional[int] = None, train_args: Sequence[str] = ()):
        if profile not in PROFILES:
            raise ValueError(f'unknown profile {profile!r}; choose one of {sorted(PROFILES)}')
        self.profile = PROFILES[profile]
        self.dataset = dataset_info(dataset or self.profile.dataset).name
        self.out = Path(out_dir)
        self.data_dir, self.download, self.epochs = data_dir, download, epochs
        self.train_args = list(train_args)
        self.started = time.time()
        self._noted_ignored_keys = False

    def _check_same_setup(self) -> None:
        """A folder holds one reproduction: the same command (profile, dataset, epochs) continues it."""
        setup = {'profile': self.profile.name, 'dataset': self.dataset, 'epochs': self.epochs}
        path = self.out / 'reproduction.json'
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved != setup:
                raise StageFailed(f'{self.out} holds a reproduction of {saved}, not {setup}; continue it with the '
                                  f'same options or choose another --out')
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(setup, indent=1))

    def run_dir(self, model: str) -> Path:
        return self.out / 'runs' / model

    def _header(self, index: int, count: int, text: str) -> None:
        elapsed = time.time() - self.started
        _say(f'\n== [{index}/{count}] {text}  (elapsed {elapsed / 60:.1f} min) ==')

    def train(self, model: str, initial_checkpoint: Optional[Path] = None, run: Optional[str] = None,
              changes: Optional[Dict[str, Any]] = None) -> Path:
        """Train one model into ``runs/<run or model>`` with ``changes`` to the profile's recipe; skipped when done."""
        run = run or model
        recipe = self.profile.recipe(model, self.dataset, None if model == PRUNED_MODEL else self.epochs)
        apply_recipe_changes(recipe, changes or {})
        recipe['save_epoch_weights'] = model in SA_MODEL_ARGS  # centre trajectories of the attention models
        # keys that only timm's train.py reads: left out of the stage recipes and noted once
        read = _training_script_keys()
        ignored = {k: v for k, v in recipe.items() if k not in read}
        if ignored and not self._noted_ignored_keys:
            _say(f'note: recipe keys that only timm\'s train.py reads are left out of the stage recipes: '
                 f'{sorted(ignored)}')
            self._noted_ignored_keys = True
        recipe_path = self.out / 'recipes' / f'{run}.yaml'
        recipe_path.parent.mkdir(parents=True, exist_ok=True)
        header = (f"# left out, only timm's train.py reads them: "
                  f"{yaml.safe_dump(plain_data(ignored), default_flow_style=True, width=10**6).strip()}\n"
                  if ignored else '')
        atomic_write_text(recipe_path, header + yaml.safe_dump(
            plain_data({k: v for k, v in recipe.items() if k in read}), sort_keys=False))
        last = self.run_dir(run) / 'last.pth.tar'
        cmd = [sys.executable, '-m', 'sa_vision.cli.train', '-c', str(recipe_path), '--output', str(self.out / 'runs'),
               '--experiment', run]
        if self.data_dir:
            cmd += ['--data-dir', str(self.data_dir)]
        if self.download:
            cmd.append('--dataset-download')
        cmd += self.train_args
        if last.is_file():
            meta = read_checkpoint(last).meta
            if meta['epoch'] >= meta.get('num_epochs', recipe['epochs']):
                _say(f'{run}: finished ({meta["epoch"]} epochs), skipped')
                return last
            _say(f'{run}: continuing the killed run at epoch {meta["epoch"]}')
            cmd += ['--resume', str(last)]
        else:
            if self.run_dir(run).exists():  # killed before its first checkpoint: sa-vision-train starts only anew
                _say(f'{run}: {self.run_dir(run)} holds no finished epoch, removed; training from the start')
                shutil.rmtree(self.run_dir(run))
            if initial_checkpoint is not None:
                cmd += ['--initial-checkpoint', str(initial_checkpoint)]
        _say(f'{run}: {recipe["epochs"]} epochs of {model} on {self.dataset}, recipe {recipe_path}')
        proc = subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED='1'), preexec_fn=_die_with_parent)
        if proc.returncode != 0:
            raise StageFailed(f'the training process exited with status {proc.returncode} (its output is above)')
        return last

    def prune(self) -> Path:
        """Prune the trained generalized model's degenerate heads; the pruned model is evaluated as it is."""
        out, report_path = self.out / 'pruned.pth', self.out / 'pruning.json'
        if out.is_file() and report_path.is_file():
            _say(f'pruning: done ({json.loads(report_path.read_text())["kept_heads_per_layer"]} heads kept), '
                 f'skipped')
            return out
        from ..research.pruning import find_degenerate_heads, prune_heads, save_pruned, select_heads_to_prune
        source_path = self.run_dir(PRUNE_SOURCE) / 'last.pth.tar'
        _say(f'pruning: reading {source_path}')
        source = read_checkpoint(source_path)
        model = source.create_model()
        degenerate = find_degenerate_heads(model)
        heads = select_heads_to_prune(model)  # a layer keeps at least its least degenerate head
        _say(f'pruning: degenerate heads per layer {degenerate}, pruning {heads} (released thresholds; a layer '
             f'keeps at least one head)')
        pruned = prune_heads(model, heads)
        info = dataset_info(self.dataset)
        _say(f'pruning: evaluating the pruned model ({list(pruned.heads_per_layer)} heads) on the {info.title} '
             f'{info.eval_split} split ...')
        started = time.time()
        after = self._evaluate(pruned)
        _say(f'pruning: evaluated {after.get("num_images", "")} images in {time.time() - started:.0f} s; writing {out}')
        save_pruned(pruned, out, heads)
        report = {
            'source': str(self.run_dir(PRUNE_SOURCE) / 'last.pth.tar'),
            'degenerate_heads': degenerate, 'pruned_heads': heads,
            'heads_removed_per_layer': [len(h) for h in heads],
            'kept_heads_per_layer': list(pruned.heads_per_layer),
            'top1_before_pruning': source.meta['metrics']['top1'], 'top1_after_pruning': after['top1'],
            'top5_before_pruning': source.meta['metrics']['top5'], 'top5_after_pruning': after['top5'],
        }
        atomic_write_text(report_path, json.dumps(report, indent=1))
        _say(f'pruning: removed {report["heads_removed_per_layer"]} heads per layer, kept '
             f'{report["kept_heads_per_layer"]}; top-1 {report["top1_before_pruning"]:.2f} % before, '
             f'{after["top1"]:.2f} % after pruning (before fine-tuning)')
        return out

    def _evaluate(self, model) -> Dict[str, float]:
        return evaluate_on_test_split(model, self.dataset, self.data_dir, self.download)

    def _final_metrics(self, run: str, ckpt) -> Dict[str, float]:
        """Top-1 / top-5 of a run's final weights in :data:`EVAL_PRECISION`, cached in ``final_eval.json``."""
        last = self.run_dir(run) / 'last.pth.tar'
        path = self.run_dir(run) / 'final_eval.json'
        stamp = f'{last.stat().st_mtime_ns}:{last.stat().st_size}'
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved.get('checkpoint') == stamp:
                return saved
        metrics = {**self._evaluate(ckpt.create_model()), 'checkpoint': stamp, 'precision': EVAL_PRECISION}
        atomic_write_text(path, json.dumps(metrics, indent=1))
        return metrics

    def table(self, models=TABLE_ORDER, quiet: bool = False) -> List[Dict[str, Any]]:
        """The results of the finished runs of ``models``, written as results.md and results.csv (and printed)."""
        from ..hub import count_params_and_macs
        rows = []
        for model in (m for m in TABLE_ORDER if m in models):
            last = self.run_dir(model) / 'last.pth.tar'
            if not last.is_file():
                continue
            ckpt = read_checkpoint(last)
            meta = ckpt.meta
            if meta['epoch'] < meta.get('num_epochs', meta['epoch']):
                continue  # still training
            counts = count_params_and_macs(ckpt.create_model())
            paper = PAPER_RESULTS.get(model)
            metrics = self._final_metrics(model, ckpt)
            rows.append({
                'model': model, 'dataset': self.dataset, 'epochs': meta['epoch'], 'parameters': counts['params'],
                'macs_g': round(counts['macs'] / 1e9, 4), 'top1': round(metrics['top1'], 2),
                'top5': round(metrics['top5'], 2), 'eval_precision': EVAL_PRECISION,
                'train_minutes': round(sum(h.get('train_time', 0.) for h in meta.get('history', [])) / 60, 3),
                'center_shift_median': self._center_shift_median(model, ckpt.state_dict),
                'amp': _training_precision(meta.get('args') or {}),
                'pos_lr_scale': (meta.get('args') or {}).get('pos_lr_scale', 1.0),
                'paper_cifar10_top1': paper.top1 if paper else None,
            })
        _write_csv_atomic(self.out / 'results.csv', TABLE_COLUMNS, rows)
        markdown = _markdown_table(rows, dataset_info(self.dataset).title)
        if self.profile.table_note:
            markdown += f'\n{self.profile.table_note}\n'
        atomic_write_text(self.out / 'results.md', markdown)
        if not quiet:
            _say(markdown)
        return rows

    def ablation(self) -> List[Dict[str, Any]]:
        """Train :data:`ABLATION_MODEL` once per :data:`ABLATION_VARIANTS`; writes ``ablation.md`` / ``.csv``."""
        self._check_same_setup()
        _say(f'Ablation of the positional parameters: {ABLATION_MODEL}, profile {self.profile.name!r}, {self.dataset}')
        rows = []
        for index, (variant, changes) in enumerate(ABLATION_VARIANTS.items(), 1):
            self._header(index, len(ABLATION_VARIANTS), f'ablation: {variant}')
            run = ablation_run_name(variant)
            last = self.train(ABLATION_MODEL, run=run, changes=changes)
            ckpt = read_checkpoint(last)
            meta = ckpt.meta
            args = meta.get('args') or {}
            rows.append({
                'variant': variant, 'run': run, 'model': ABLATION_MODEL, 'dataset': self.dataset,
                'epochs': meta['epoch'], 'pos_init': ckpt.model_args.get('pos_init', 'paper'),
                'pos_lr_scale': args.get('pos_lr_scale', 1.0), 'amp': _training_precision(args),
                'top1': round(meta['metrics']['top1'], 2), 'top5': round(meta['metrics']['top5'], 2),
                'center_shift_median': self._center_shift_median(run, ckpt.state_dict),
                'train_minutes': round(sum(h.get('train_time', 0.) for h in meta.get('history', [])) / 60, 3),
            })
        _write_csv_atomic(self.out / 'ablation.csv', ABLATION_COLUMNS, rows)
        markdown = markdown_table(
            ['variant', 'epochs', 'top-1 %', 'top-5 %', 'median centre shift (grid units)', 'training time'],
            [[r['variant'], r['epochs'], f'{r["top1"]:.2f}', f'{r["top5"]:.2f}',
              '-' if r['center_shift_median'] is None else f'{r["center_shift_median"]:.2f}',
              _duration(r['train_minutes'])] for r in rows], 'lrrrrr') + '\n'
        atomic_write_text(self.out / 'ablation.md', markdown)
        _say(markdown)
        return rows

    def _center_shift_median(self, run: str, final_state) -> Optional[float]:
        """Median centre shift of the run ``run`` (grid units, 3 decimals); None without centres or epoch-000."""
        from ..research.analysis import center_shift_median
        initial = self.run_dir(run) / 'epoch-000.safetensors'  # written by the trainer before the first step
        if not initial.is_file():
            return None
        shift = center_shift_median(read_checkpoint(initial).state_dict, final_state)
        return None if shift is None else round(shift, 3)

    def export(self, models=TABLE_ORDER) -> List[Path]:
        """A Hub folder per trained model (re-exported when its checkpoint is newer).

        Written under ``.partial/`` and renamed when complete, so a killed export is redone, not taken for done.
        """
        from ..hub import export_hub_folder, weights_label
        from ..research.explorer import run_epochs
        folders = []
        for model in (m for m in TABLE_ORDER if m in models):
            last = self.run_dir(model) / 'last.pth.tar'
            ckpt = read_checkpoint(last)
            folder = self.out / 'hub' / weights_label(ckpt).name
            card = folder / 'README.md'  # written last (a folder of an older sa_vision may lack it)
            if card.is_file() and card.stat().st_mtime >= last.stat().st_mtime:
                _say(f'export {folder.name}: up to date, skipped')
            else:
                partial = self.out / '.partial' / folder.name
                if partial.exists():  # left by a killed export
                    shutil.rmtree(partial)
                partial.parent.mkdir(parents=True, exist_ok=True)
                export_hub_folder(ckpt, partial, epochs=run_epochs(self.run_dir(model)))
                if folder.exists():  # an export of an older checkpoint
                    shutil.rmtree(folder)
                folder.parent.mkdir(parents=True, exist_ok=True)
                os.replace(partial, folder)  # the folder appears complete, or not at all
                _say(f'export {folder.name}: {folder}')
            folders.append(folder)
        return folders

    def hub_folders(self) -> List[Path]:
        """The exported Hub folders (``hub/<model>.<tag>``), in the table's order."""
        found = {f.name.split('.')[0]: f for f in sorted((self.out / 'hub').glob('*.*')) if f.is_dir()}
        return [found[m] for m in TABLE_ORDER if m in found]

    def figures(self) -> List[Path]:
        """The paper's figures of the trained attention models (centres, maps, centre trajectories)."""
        return draw_figures(self.hub_folders(), self.out / 'figures')

    def explorer(self) -> Path:
        """``explorer.html``: the attention explorer page of the trained attention models."""
        from ..research.explorer import resolve_explorer_model, write_explorer
        path = self.out / 'explorer.html'
        folders = [f for f in self.hub_folders() if f.name.split('.')[0] in SA_MODEL_ARGS]
        newest = max(f.joinpath('README.md').stat().st_mtime for f in folders)
        if path.is_file() and path.stat().st_mtime >= newest:
            _say(f'explorer: {path} up to date, skipped')
            return path
        write_explorer([resolve_explorer_model(str(f)) for f in folders], path, data_dir=self.data_dir,
                       title=f'sa_vision zoo, profile {self.profile.name!r}: attention explorer')
        _say(f'explorer: {path} ({path.stat().st_size / 1e6:.2f} MB); open it in a browser')
        return path

    def keep(self, dest) -> List[Path]:
        """Copy the exported Hub folders to ``dest/<model>/`` (the zoo as kept in a repository)."""
        kept = []
        for folder in self.hub_folders():
            target = Path(dest) / folder.name.split('.')[0]
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(folder, target)
            kept.append(target)
        _say(f'kept {len(kept)} Hub folders in {dest}')
        return kept

    def publish(self, folders: List[Path], publish: bool) -> None:
        from ..hub import publish_hub_folder
        for folder in folders:
            repo_id = hub_repo_id(*folder.name.split('.', 1))  # the export named it <arch>.<tag>
            if not publish:
                _say(f'dry run: would publish {folder} to {repo_id} ({len(list(folder.iterdir()))} files)')
                continue
            commit = publish_hub_folder(folder, repo_id)
            _say(f'published {repo_id}: {getattr(commit, "commit_url", commit)}')

    def run(self, publish: bool = False) -> List[Dict[str, Any]]:
        """All stages; a failing one raises :class:`StageFailed` naming it (earlier results stay)."""
        self._check_same_setup()
        _say(f'Reproduction {self.profile.name!r} on {self.dataset} in {self.out}: {self.profile.description}')
        results: Dict[str, Any] = {}
        # the table grows after each training: the models trained so far
        stages = [(f'train {model}', lambda i=i: (self.train(TRAINED_MODELS[i]), self.table(TRAINED_MODELS[:i + 1])))
                  for i, model in enumerate(TRAINED_MODELS)]
        stages += [
            ('prune sa_gen_cifar', lambda: results.update(pruned=self.prune())),
            (f'fine-tune {PRUNED_MODEL}', lambda: self.train(PRUNED_MODEL, initial_checkpoint=results['pruned'])),
            ('results table', lambda: results.update(rows=self.table())),
            ('export Hub folders', lambda: results.update(folders=self.export())),
            ('figures', self.figures),
            ('explorer', self.explorer),
            ('publish' if publish else 'publish (dry run)', lambda: self.publish(results['folders'], publish)),
        ]
        for index, (name, stage) in enumerate(stages, 1):
            self._header(index, len(stages), name)
            try:
                stage()
            except Exception as e:  # e.g. a failed training process or an unreadable checkpoint: stop, naming it
                what = str(e) if isinstance(e, StageFailed) else f'{type(e).__name__}: {e}'
                raise StageFailed(f'stage {name!r} failed: {what}') from e
        _say(f'\nDone: {self.out / "results.md"}, {len(results["folders"])} Hub folders in {self.out / "hub"}')
        return results['rows']


def evaluate_on_test_split(model, dataset: str, data_dir: Optional[str] = None, download: bool = False,
                           precision: str = EVAL_PRECISION) -> Dict[str, float]:
    """Top-1 / top-5 / loss of ``model`` on ``dataset``'s held-out split, on the CPU, in ``precision``."""
    import contextlib

    import torch

    from ..train.data import create_image_dataset
    from ..train.evaluation import evaluate
    info = dataset_info(dataset)
    ds = create_image_dataset(info.name, info.eval_split, is_training=False, data_dir=data_dir, download=download,
                              img_size=_input_size(model))
    loader = torch.utils.data.DataLoader(ds, batch_size=500, shuffle=False)
    dtype = {'float32': None, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[precision]
    amp_ctx = (lambda: torch.autocast('cpu', dtype=dtype)) if dtype else contextlib.nullcontext
    return evaluate(model.float(), loader, 'cpu', amp_ctx=amp_ctx)


def draw_figures(folders: List[Path], out: Path, redraw: bool = False) -> List[Path]:
    """The paper's figures of the attention models in ``folders``: centres (Figs. 3-4), maps (Figs. 5-6) and, where
    the folder keeps its epochs, centre trajectories (Fig. 2). Existing files are kept unless ``redraw``."""
    from ..research.analysis import GAUSSIAN_KINDS
    from ..research.explorer import POSITIONAL_EPOCHS_FILE, load_positional_trajectory, models_at_epochs
    from ..research.plots import plot_attention_maps, plot_center_trajectories, plot_centers
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    made = []

    def figure(name, draw):
        path = out / name
        if redraw or not path.is_file():  # sa_vision.research.plots draws on its own Figure objects (no pyplot state)
            with atomic_write(path) as tmp:
                draw(str(tmp))
        made.append(path)

    for folder in folders:
        model_name = folder.name.split('.')[0]
        if model_name not in SA_MODEL_ARGS:
            continue
        trained = read_checkpoint(folder).create_model()
        gaussian = SA_MODEL_ARGS[model_name].get('attn_kind', 'quadratic') in GAUSSIAN_KINDS
        if gaussian:
            figure(f'centers_{model_name}.png', lambda p, m=trained: plot_centers(m, p))
        figure(f'maps_{model_name}.png', lambda p, m=trained: plot_attention_maps(m, p))
        epochs_file = folder / POSITIONAL_EPOCHS_FILE
        if gaussian and model_name in TRAINED_MODELS and epochs_file.is_file():  # not the fine-tuned pruning
            epochs = load_positional_trajectory(epochs_file)
            figure(f'trajectories_{model_name}.png', lambda p, m=trained, e=epochs: plot_center_trajectories(
                models_at_epochs(m, e), p, labels=list(e)))
    _say(f'figures: {", ".join(p.name for p in made)} in {out}')
    return made


def _input_size(model) -> int:
    """The image size a model takes (a kept model that pads its input takes the dataset's unpadded images)."""
    from timm.data import resolve_data_config
    return resolve_data_config({}, model=model)['input_size'][-1]


def kept_guard_paths(table: Path) -> Dict[str, Path]:
    """The guard of a kept zoo, beside its table: the weights' SHA-256 digests (``sha256sum -c`` reads the file
    in the table's folder) and the logits of a fixed batch of test images per model."""
    table = Path(table)
    return {'digests': table.with_name(f'{table.stem}_weights.sha256'),
            'logits': table.with_name(f'{table.stem}_logits.safetensors')}


def _sha256(path: Path) -> str:
    import hashlib
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def _read_digests(path: Path) -> Dict[str, str]:
    """``{file name as written: digest}`` of a ``sha256sum`` file."""
    digests = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            digests[name.lstrip('*')] = digest
    return digests


def _guard_batch(dataset: str, data_dir: Optional[str], img_size: int):
    """The first :data:`GUARD_IMAGES` images of the test split and their labels, in the training pipeline's
    preprocessing at ``img_size``."""
    import torch

    from ..train.data import create_image_dataset
    info = dataset_info(dataset)
    ds = create_image_dataset(info.name, info.eval_split, is_training=False, data_dir=data_dir, img_size=img_size)
    items = [ds[i] for i in range(GUARD_IMAGES)]
    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def logits_tolerance(model, scale: float) -> float:
    """How far two float32 runs of ``model`` may differ, from float32 rounding alone: each reduction of ``n`` terms
    of size ``scale`` is within ``4 sqrt(n) u scale`` (u = 2**-24) of the exact sum, the errors of the reductions
    along the network add up, and two runs (the recorded one and this one) double it (tests/float32_bounds.py
    explains the bound; it holds whatever order a CPU sums in)."""
    import math

    from torch import nn

    from ..layers import PositionalAttention
    lengths = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            lengths.append(module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1])
        elif isinstance(module, nn.Linear):
            lengths.append(module.in_features)
        elif isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
            lengths.append(module.normalized_shape[0] if isinstance(module, nn.LayerNorm) else 1)
        elif isinstance(module, PositionalAttention):  # a weighted sum over every key of the 16x16 grid
            lengths.append(16 * 16)
    lengths.append(32 * 32)  # the global average pool (at most 32x32 positions)
    return 2 * sum(4. * math.sqrt(n) * 2. ** -24 * scale for n in lengths)


def record_kept_models(zoo: Path, table: Path, data_dir: Optional[str] = None) -> Dict[str, Path]:
    """Write the guard of the models of ``table`` kept in ``zoo``: each weights file's SHA-256, and each model's
    float32 logits of the first :data:`GUARD_IMAGES` test images plus its top-1 on the first
    :data:`SUBSET_IMAGES`, both through the training pipeline (the dataset's own zero padding, the model as it was
    trained, without ``input_padding``)."""
    import torch
    from safetensors.torch import save_file

    from ..train.evaluation import evaluate
    paths = kept_guard_paths(table)
    with open(table, newline='') as f:
        rows = list(csv.DictReader(f))
    digests, logits, subset_top1 = [], {}, {}
    for row in rows:
        folder = Path(zoo) / row['model']
        weights = folder / 'model.safetensors'
        digests.append(f'{_sha256(weights)}  {os.path.relpath(weights, paths["digests"].parent)}')
        ckpt = read_checkpoint(folder)
        trained_args = {k: v for k, v in ckpt.model_args.items() if k not in ('input_padding', 'input_pad_value')}
        model = Checkpoint(ckpt.arch, trained_args, ckpt.state_dict, ckpt.source, 'state_dict').create_model()
        images, _ = _guard_batch(row['dataset'], data_dir, 32)
        with torch.no_grad():
            logits[row['model']] = model(images).float().contiguous()
        from ..train.data import create_image_dataset
        info = dataset_info(row['dataset'])
        ds = create_image_dataset(info.name, info.eval_split, is_training=False, data_dir=data_dir)
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, range(SUBSET_IMAGES)), batch_size=500)
        subset_top1[row['model']] = round(evaluate(model, loader, 'cpu')['top1'], 2)
        _say(f'{row["model"]}: recorded; top-1 {subset_top1[row["model"]]:.2f} on the first {SUBSET_IMAGES} images')
    atomic_write_text(paths['digests'], '\n'.join(digests) + '\n')
    with atomic_write(paths['logits']) as tmp:
        save_file(logits, str(tmp), metadata={'images': f'the first {GUARD_IMAGES} of the test split',
                                              'subset_images': str(SUBSET_IMAGES),
                                              'subset_top1': json.dumps(subset_top1)})
    return paths


def kept_subset_top1(table: Path) -> Dict[str, float]:
    """The recorded top-1 of each kept model on the first :data:`SUBSET_IMAGES` test images (training pipeline)."""
    from safetensors import safe_open
    with safe_open(str(kept_guard_paths(table)['logits']), 'pt') as f:
        return json.loads(f.metadata()['subset_top1'])


def check_kept_models(zoo: Path, table: Path, data_dir: Optional[str] = None,
                      accuracy: bool = True) -> List[Dict[str, Any]]:
    """Check the models of ``table`` (a results CSV) kept in ``zoo/<model>/``: their weights' SHA-256 and their
    logits of a fixed batch against the guard beside the table (where it exists, :func:`record_kept_models`), and,
    with ``accuracy``, top-1 / top-5 on the whole test split against the table (minutes per model on a CPU)."""
    import torch
    from safetensors.torch import load_file
    with open(table, newline='') as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise StageFailed(f'{table} holds no results')
    guard = kept_guard_paths(table)
    guarded = all(p.is_file() for p in guard.values())
    if not guarded and not accuracy:
        raise StageFailed(f'{table} has no guard beside it ({guard["digests"].name}, {guard["logits"].name}): '
                          f'record it with sa-vision-reproduce --check {zoo} --table {table} --record')
    digests = _read_digests(guard['digests']) if guarded else {}
    recorded = load_file(str(guard['logits'])) if guarded else {}
    checked = []
    for row in rows:
        folder = Path(zoo) / row['model']
        if not folder.is_dir():
            raise StageFailed(f'{table} lists {row["model"]} but {folder} does not exist: keep the zoo with '
                              f'sa-vision-reproduce --keep {zoo}')
        ckpt = read_checkpoint(folder)
        model = ckpt.create_model()
        result, notes = {'model': row['model']}, []
        if guarded:
            weights = folder / 'model.safetensors'
            expected = [d for name, d in digests.items() if Path(name).parts[-2:] == weights.parts[-2:]]
            result['digest_ok'] = expected == [_sha256(weights)]
            images, _ = _guard_batch(row['dataset'], data_dir, _input_size(model))
            with torch.no_grad():
                logits = model.float()(images).float()
            reference = recorded[row['model']]
            result['logits_max_diff'] = (logits - reference).abs().max().item()
            result['logits_tolerance'] = logits_tolerance(model, reference.abs().max().item())
            result['logits_ok'] = result['logits_max_diff'] <= result['logits_tolerance']
            notes.append(f'weights {"ok" if result["digest_ok"] else "CHANGED (SHA-256)"}, logits of '
                         f'{GUARD_IMAGES} images within {result["logits_max_diff"]:.1e} '
                         f'(tolerance {result["logits_tolerance"]:.1e})')
        if accuracy:
            precision = row.get('eval_precision') or EVAL_PRECISION
            start = time.monotonic()
            measured = evaluate_on_test_split(model, row['dataset'], data_dir, precision=precision)
            result['accuracy_seconds'] = round(time.monotonic() - start, 1)
            result.update(precision=precision, num_images=measured.get('num_images'))
            for key in ('top1', 'top5'):
                result[key], result[f'{key}_table'] = round(measured[key], 2), float(row[key])
            result['accuracy_ok'] = all(abs(result[k] - result[f'{k}_table']) <= ACCURACY_TOLERANCE + 1e-9
                                        for k in ('top1', 'top5'))
            notes.append(f'top-1 {result["top1"]:.2f} (table {result["top1_table"]:.2f}), top-5 '
                         f'{result["top5"]:.2f} (table {result["top5_table"]:.2f}) in {precision} on '
                         f'{result["num_images"]} images ({result["accuracy_seconds"]:.0f} s)')
        result['ok'] = all(result[k] for k in ('digest_ok', 'logits_ok', 'accuracy_ok') if k in result)
        _say(f'{row["model"]}: {"; ".join(notes)}: {"ok" if result["ok"] else "DIFFERS"}')
        checked.append(result)
    return checked


def _die_with_parent() -> None:
    """End the training process with the reproduction (Linux): no orphan writes the checkpoint the next run resumes."""
    if sys.platform.startswith('linux'):
        import ctypes
        import signal
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _training_precision(args: Dict[str, Any]) -> str:
    """A run's precision: its autocast dtype, or float32 where ``--amp auto`` turned autocast off (``amp_used``)."""
    used = args.get('amp_used', args.get('amp'))
    if used is True or used == 'auto':
        return args.get('amp_dtype', 'bfloat16')
    return used if isinstance(used, str) and used else 'float32'


def _duration(minutes: float) -> str:
    return format_duration(minutes * 60)


def _training_script_keys() -> frozenset:
    """The argument names of ``sa-vision-train`` (the stages run it in a subprocess; only its parser is read)."""
    from ..train.args import argument_names
    return argument_names()


def _write_csv_atomic(path: Path, columns, rows: List[Dict[str, Any]]) -> None:
    with atomic_write(path) as tmp, open(tmp, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _markdown_table(rows: List[Dict[str, Any]], dataset_title: str) -> str:
    header = ['model', 'dataset', 'epochs', 'parameters', 'MACs (G)', 'top-1 %', 'top-5 %', 'training time',
              'median centre shift', 'precision', 'positional lr scale', 'paper, CIFAR-10 top-1 %']
    cells = [[f'`{r["model"]}`', dataset_title, r['epochs'], f'{r["parameters"]:,}', f'{r["macs_g"]:.3f}',
              f'{r["top1"]:.2f}', f'{r["top5"]:.2f}', _duration(r['train_minutes']),
              '-' if r.get('center_shift_median') is None else f'{r["center_shift_median"]:.2f}',
              r.get('amp') or '-', f'{r.get("pos_lr_scale", 1.0):g}',
              '-' if r['paper_cifar10_top1'] is None else r['paper_cifar10_top1']] for r in rows]
    return markdown_table(header, cells, 'llrrrrrrrlrr') + '\n'
