""" :class:`Reproduction`: one resumable command from a dataset to the five trained, evaluated, exported models

Stages (``sa-vision-reproduce``): train four models from scratch; prune the trained ``sa_gen_cifar`` (paper App. A.1)
and fine-tune ``sa_gen_pruned`` from it; the results table (test split, float32); the Hub folders, figures and
attention explorer; publish (``publish=True``, a dry run otherwise). Each stage writes its result atomically and is
skipped when it exists and was made as this stage asks (:mod:`.provenance`); a killed training continues from its
last epoch (docs/reproduction.md).
"""
import dataclasses
import json
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from ..errors import TERMINATED_STATUS, write_failure
from ..io import atomic_write_text, plain_data
from ..models._pretrained import hub_repo_id
from ..paper import PAPER_RESULTS
from ..tables import plural
from ..train.checkpoint import RUN_CHECKPOINT, read_checkpoint
from ..train.data import TRAIN_SPLIT, check_dataset, dataset_info
from .processes import Trainings, run_training
from .profiles import (
    ABLATION_MODEL,
    ABLATION_VARIANTS,
    PROFILES,
    PRUNED_MODEL,
    TABLE_ORDER,
    TRAINED_MODELS,
    ReproductionError,
    StageFailed,
    StageStopped,
    ablation_run_name,
    apply_recipe_changes,
    keeps_epoch_positions,
)
from .provenance import (
    check_run_arguments,
    check_setup,
    stage_arguments,
    training_overrides,
    write_setup,
)
from .prune_stage import prune_stage
from .report import (
    ABLATION_COLUMNS,
    EVAL_PRECISION,
    RESULT_COLUMNS,
    draw_figures,
    evaluate_on_test_split,
    run_row,
    say,
    write_table,
    write_zoo_explorer,
)

__all__ = ['Reproduction']


class Reproduction:
    """The stages above for one profile, dataset and output folder (see :meth:`run`); ``epochs`` overrides every
    training stage's epochs but the fine-tuning's; ``train_args`` (``sa-vision-train`` arguments, e.g. the device
    and speed flags) follow the recipe on every training stage's command line, so they win over it; ``kept_dtype``
    overrides the profile's (the dtype of the exported weights, whose accuracy the table reports)."""

    def __init__(self, out_dir, profile: str = 'cpu', dataset: Optional[str] = None, data_dir: Optional[str] = None,
                 download: bool = False, epochs: Optional[int] = None, train_args: Sequence[str] = (),
                 kept_dtype: Optional[str] = None):
        if profile not in PROFILES:
            raise ValueError(f'unknown profile {profile!r}; choose one of {sorted(PROFILES)}')
        self.profile = PROFILES[profile]
        if kept_dtype:
            self.profile = dataclasses.replace(self.profile, kept_dtype=kept_dtype)
        # a misspelt or unreadable --dataset fails here, before the folder or a recipe is written
        info = dataset_info(dataset or self.profile.dataset)
        check_dataset(dataset or self.profile.dataset, data_dir, download, TRAIN_SPLIT, info.eval_split)
        self.dataset = info.name
        self.out = Path(out_dir)
        if epochs is not None and all(self.profile.recipe(m, self.dataset, epochs) == self.profile.recipe(
                m, self.dataset) for m in TRAINED_MODELS):
            epochs = None  # the profile's own epochs and warm-up: the same reproduction as without --epochs
        self.data_dir, self.download, self.epochs = data_dir, download, epochs
        self.train_args = list(train_args)
        self.started = time.time()
        self._noted_ignored_keys = False
        self.tag_output = False  # prefix each line of a training's output with its run (trainings side by side)
        self._trainings = Trainings()

    def stop(self) -> None:
        """End the running trainings (SIGTERM) and start no other: each run folder keeps its last finished epoch
        (``last.pth.tar``), which the next :meth:`train` of that folder continues; the stopped :meth:`train` calls
        raise :class:`StageStopped`. For a caller with a deadline (a lent GPU's call)."""
        self._trainings.stop()

    @property
    def stopped(self) -> bool:
        return self._trainings.stopped.is_set()

    def _check_same_setup(self) -> None:
        """A folder holds one reproduction: the same options (profile, dataset, epochs, the training arguments
        ``train_args`` set, runtime ones aside) continue it. The options are checked first, every training stage's
        arguments as ``sa-vision-train`` would take them; ``reproduction.json`` is written only then."""
        setup = {'profile': self.profile.name, 'dataset': self.dataset, 'epochs': self.epochs,
                 'train_args': training_overrides(self.train_args)}
        to_write = check_setup(self.out, setup)
        for model in TRAINED_MODELS:
            stage_arguments(self._recipe(model), self.train_args)
        if to_write:
            write_setup(self.out, setup)

    def _recipe(self, model: str, changes: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The recipe of ``model``'s stage: the profile's, with ``changes`` and this reproduction's epochs."""
        recipe = self.profile.recipe(model, self.dataset, None if model == PRUNED_MODEL else self.epochs)
        apply_recipe_changes(recipe, changes or {})
        recipe['save_epoch_positions'] = keeps_epoch_positions(model)
        return recipe

    def run_dir(self, model: str) -> Path:
        return self.out / 'runs' / model

    def _header(self, index: int, count: int, text: str) -> None:
        elapsed = time.time() - self.started
        say(f'\n== [{index}/{count}] {text}  (elapsed {elapsed / 60:.1f} min) ==')

    def train(self, model: str, initial_checkpoint: Optional[Path] = None, run: Optional[str] = None,
              changes: Optional[Dict[str, Any]] = None) -> Path:
        """Train one model into ``runs/<run or model>`` with ``changes`` to the profile's recipe; skipped when done."""
        run = run or model
        if self.stopped:
            raise StageStopped(f'{run}: not started, the reproduction was stopped')
        recipe = self._recipe(model, changes)
        # keys that only timm's train.py reads: left out of the stage recipes and noted once
        read = _training_script_keys()
        ignored = {k: v for k, v in recipe.items() if k not in read}
        if ignored and not self._noted_ignored_keys:
            say(f'note: recipe keys that only timm\'s train.py reads are left out of the stage recipes: '
                 f'{sorted(ignored)}')
            self._noted_ignored_keys = True
        recipe_path = self.out / 'recipes' / f'{run}.yaml'
        recipe_path.parent.mkdir(parents=True, exist_ok=True)
        header = (f"# left out, only timm's train.py reads them: "
                  f"{yaml.safe_dump(plain_data(ignored), default_flow_style=True, width=10**6).strip()}\n"
                  if ignored else '')
        atomic_write_text(recipe_path, header + yaml.safe_dump(
            plain_data({k: v for k, v in recipe.items() if k in read}), sort_keys=False))
        last = self.run_dir(run) / RUN_CHECKPOINT
        cmd = [sys.executable, '-m', 'sa_vision.cli.train', '-c', str(recipe_path), '--output', str(self.out / 'runs'),
               '--experiment', run]
        if self.data_dir:
            cmd += ['--data-dir', str(self.data_dir)]
        if self.download:
            cmd.append('--dataset-download')
        if last.is_file():  # a run keeps its own epoch files' flags: one begun before 2026-11-29 kept whole weights
            cmd += ['--no-save-epoch-weights', '--save-epoch-positions' if recipe['save_epoch_positions'] else
                    '--no-save-epoch-positions']
        cmd += self.train_args
        initial = ['--initial-checkpoint', str(initial_checkpoint)] if initial_checkpoint is not None else []
        if last.is_file():
            ckpt = read_checkpoint(last)
            # skipped or continued only as the run of this stage's arguments (epochs, model, recipe, --train-args)
            check_run_arguments(self.run_dir(run), ckpt, stage_arguments(recipe, cmd[3:] + initial))
            meta = ckpt.meta
            if meta['epoch'] >= meta.get('num_epochs', recipe['epochs']):
                say(f'{run}: finished ({plural(meta["epoch"], "epoch")}), skipped')
                return last
            say(f'{run}: continuing the killed run at epoch {meta["epoch"]}')
            cmd += ['--resume', str(last)]
        else:
            if self.run_dir(run).exists():  # killed before its first checkpoint: sa-vision-train starts only anew
                if not (self.run_dir(run) / 'args.yaml').is_file():  # what a run writes first: not a killed run
                    raise ReproductionError(f'{self.run_dir(run)} holds neither a run of sa-vision-train nor its '
                                            f'args.yaml: move what it holds elsewhere, then run this again')
                say(f'{run}: {self.run_dir(run)} holds no finished epoch, removed; training from the start')
                shutil.rmtree(self.run_dir(run))
            cmd += initial
        say(f'{run}: {plural(recipe["epochs"], "epoch")} of {model} on {self.dataset}, recipe {recipe_path}')
        status = run_training(cmd, f'[{run}] ' if self.tag_output else None, self._trainings)
        if status != 0 and (self.stopped or status in (-signal.SIGTERM, TERMINATED_STATUS)):
            done = read_checkpoint(last).meta['epoch'] if last.is_file() else 0
            raise StageStopped(f'{run}: stopped after {done} of {plural(recipe["epochs"], "epoch")}; '
                               f'{self.run_dir(run)} keeps them for the next run to continue')
        if status != 0:
            raise StageFailed(f'the training process of {run} exited with status {status} (its output is above)')
        return last

    def prune(self, source_path: Optional[Path] = None, before: Optional[Dict[str, Any]] = None) -> Path:
        """Prune the trained generalized model's degenerate heads; the pruned model is evaluated as it is.
        ``source_path``: the weights to prune (a Hub folder of a kept zoo, say), by default its run's last
        checkpoint; ``before``: the source's ``top1`` / ``top5`` where the weights keep none (a Hub folder)."""
        return prune_stage(self, source_path, before)

    def _evaluate(self, model) -> Dict[str, float]:
        return evaluate_on_test_split(model, self.dataset, self.data_dir, self.download)

    def _final_metrics(self, run: str, ckpt) -> Dict[str, float]:
        """Top-1 / top-5 of a run's final weights in :data:`EVAL_PRECISION`, cached in ``final_eval.json``."""
        last = self.run_dir(run) / RUN_CHECKPOINT
        path = self.run_dir(run) / 'final_eval.json'
        stamp = f'{last.stat().st_mtime_ns}:{last.stat().st_size}'
        if path.is_file():
            saved = json.loads(path.read_text(encoding='utf-8'))
            if saved.get('checkpoint') == stamp and saved.get('kept_dtype', 'float32') == self.profile.kept_dtype:
                return saved
        metrics = {**self._evaluate(self.as_kept(ckpt.create_model())), 'checkpoint': stamp,
                   'precision': EVAL_PRECISION, 'kept_dtype': self.profile.kept_dtype}
        atomic_write_text(path, json.dumps(metrics, indent=1))
        return metrics

    def as_kept(self, model):
        """``model`` with its weights rounded to the profile's ``kept_dtype``, as the export stores them (float32:
        unchanged), in float32: the weights whose accuracy the table reports."""
        import torch
        return model.to(getattr(torch, self.profile.kept_dtype)).float()

    def table(self, models=TABLE_ORDER, quiet: bool = False, write: bool = True) -> List[Dict[str, Any]]:
        """The results of the finished runs of ``models``, written as results.md and results.csv (``write``) and
        printed (unless ``quiet``)."""
        from ..hub import count_params_and_macs
        rows = []
        for model in (m for m in TABLE_ORDER if m in models):
            last = self.run_dir(model) / RUN_CHECKPOINT
            if not last.is_file():
                continue
            ckpt = read_checkpoint(last)
            meta = ckpt.meta
            if meta['epoch'] < meta.get('num_epochs', meta['epoch']):
                continue  # still training
            counts = count_params_and_macs(ckpt.create_model())
            paper = PAPER_RESULTS.get(model)
            rows.append({'model': model, **run_row(ckpt, self.run_dir(model), self.dataset,
                                                     self._final_metrics(model, ckpt)),
                         'parameters': counts['params'], 'macs_g': round(counts['macs'] / 1e9, 4),
                         'eval_precision': EVAL_PRECISION, 'paper_cifar10_top1': paper.top1 if paper else None})
        if write:
            markdown = write_table(self.out, 'results', RESULT_COLUMNS, rows, self.profile.table_note)
            if not quiet:  # the note once, under the whole table
                complete = set(models) >= set(TABLE_ORDER) and self.profile.table_note
                say(markdown + (f'\n{self.profile.table_note}\n' if complete else ''))
        return rows

    def ablation(self) -> List[Dict[str, Any]]:
        """Train :data:`ABLATION_MODEL` once per :data:`ABLATION_VARIANTS`; writes ``ablation.md`` / ``.csv``."""
        self._check_same_setup()
        say(f'Ablation of the positional parameters: {ABLATION_MODEL}, profile {self.profile.name!r}, {self.dataset}')
        rows = []
        for index, (variant, changes) in enumerate(ABLATION_VARIANTS.items(), 1):
            self._header(index, len(ABLATION_VARIANTS), f'ablation: {variant}')
            run = ablation_run_name(variant)
            last = self.train(ABLATION_MODEL, run=run, changes=changes)
            ckpt = read_checkpoint(last)
            rows.append({'variant': variant, 'run': run, 'model': ABLATION_MODEL,
                         'pos_init': ckpt.model_args.get('pos_init', 'paper'),
                         **run_row(ckpt, self.run_dir(run), self.dataset, ckpt.meta['metrics'])})
        say(write_table(self.out, 'ablation', ABLATION_COLUMNS, rows))
        return rows

    def export(self, models=TABLE_ORDER) -> List[Path]:
        """A Hub folder per trained model (re-exported when its checkpoint is newer). Written beside its folder and
        swapped in when complete (:func:`~sa_vision.io.atomic_folder`), so a killed export is redone, not taken for
        done."""
        from ..hub import export_hub_folder, weights_label
        folders = []
        for model in (m for m in TABLE_ORDER if m in models):
            last = self.run_dir(model) / RUN_CHECKPOINT
            ckpt = read_checkpoint(last)
            folder = self.out / 'hub' / weights_label(ckpt).name
            card = folder / 'README.md'  # written last (a folder of an older sa_vision may lack it)
            if card.is_file() and card.stat().st_mtime >= last.stat().st_mtime:
                say(f'export {folder.name}: up to date, skipped')
            else:
                # replaces an export of an older checkpoint (whole, or not at all), never files of no export; with
                # the epochs its run kept (export_hub_folder reads them beside the checkpoint)
                export_hub_folder(ckpt, folder, dtype=self.profile.kept_dtype, replace=True)
                say(f'export {folder.name}: {folder}')
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
        return write_zoo_explorer(self.hub_folders(), self.out / 'explorer.html', self.data_dir,
                                  f'sa_vision zoo, profile {self.profile.name!r}: attention explorer')

    def keep(self, dest) -> List[Path]:
        """Copy the exported Hub folders to ``dest/<model>/`` (the zoo as kept in a repository)."""
        kept = []
        for folder in self.hub_folders():
            target = Path(dest) / folder.name.split('.')[0]
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(folder, target)
            kept.append(target)
        say(f'kept {len(kept)} Hub folders in {dest}')
        return kept

    def publish(self, folders: List[Path], publish: bool) -> None:
        from ..hub import publish_hub_folder
        for folder in folders:
            repo_id = hub_repo_id(*folder.name.split('.', 1))  # the export named it <arch>.<tag>
            if not publish:
                say(f'dry run: would publish {folder} to {repo_id} ({len(list(folder.iterdir()))} files)')
                continue
            published = publish_hub_folder(folder, repo_id)
            say(f'published {published.repo_id}: {getattr(published.commit, "commit_url", published.commit)}')

    def run(self, publish: bool = False) -> List[Dict[str, Any]]:
        """All stages; a failing one raises :class:`StageFailed` naming it, a stopped one :class:`StageStopped`
        (earlier results stay)."""
        if publish:  # without a token the last stage would fail, after every training (checked before any writing)
            from ..hub import resolve_token
            resolve_token()
        self._check_same_setup()
        say(f'Reproduction {self.profile.name!r} on {self.dataset} in {self.out}: {self.profile.description}')
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
            except (ReproductionError, StageStopped):  # other options, or stop(): said as raised, not as a failure
                raise
            except Exception as e:  # e.g. a failed training process or an unreadable checkpoint: stop, naming it
                what = str(e) if isinstance(e, StageFailed) else write_failure(e) or f'{type(e).__name__}: {e}'
                raise StageFailed(f'stage {name!r} failed: {what}') from e
        say(f'\nDone: {self.out / "results.md"}, {len(results["folders"])} Hub folders in {self.out / "hub"}')
        return results['rows']


def _training_script_keys() -> frozenset:
    """The recipe keys ``sa-vision-train`` reads: the ``dest`` of each of its arguments, from its parser built in
    this process (the training itself runs in a subprocess)."""
    from ..train.args import argument_names
    return argument_names()
