""" What the training record stored with weights says about them, for their card: the epoch (counted from 1, as
sa-vision-train counts; timm's train.py stores the N-th epoch as N - 1), whether they are the best epoch, picked
for being the best, or the EMA, whose score the record holds, and the training arguments. Bare tensors and a Hub
folder carry no record. """
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..tables import markdown_table, plural
from ..train.checkpoint import BEST_CHECKPOINT, TRAINING_PROCESSES, Checkpoint, strip_runtime_args
from ..train.data import dataset_info
from ..train.recipes import repeat_run_args
from .labels import RECIPE_FILENAME, WeightsLabel

__all__ = ['TrainingRecord', 'training_record', 'published_recipe', 'training_summary', 'recipe_section',
           'picked_note', 'training_processes', 'repeat_command']

# what a card says of weights saved without a training record, by the checkpoint's format
_NO_RECORD = {'state_dict': 'a state dict', 'safetensors': 'a safetensors file', 'hub_folder': 'a Hub folder'}



def published_recipe(ckpt: Checkpoint) -> Dict[str, Any]:
    """The training arguments to publish: no local paths, no machine or process fields; {} without a record."""
    return strip_runtime_args(ckpt.meta.get('recipe') or ckpt.meta.get('args') or {})


def training_processes(ckpt: Checkpoint) -> int:
    """The processes the run of ``ckpt`` trained on: its arguments' ``world_size``, or what an export's config.json
    keeps of it (:data:`~sa_vision.train.checkpoint.TRAINING_PROCESSES`)."""
    return int((ckpt.meta.get('args') or {}).get('world_size') or ckpt.meta.get(TRAINING_PROCESSES) or 1)


def repeat_command(ckpt: Checkpoint, recipe_file: str, data_dirs: Tuple[str, ...] = ('needed',)) -> str:
    """The command that repeats the run of ``ckpt`` from its recipe file: under torchrun with the run's process
    count where it ran on several, since the recipe's batch size is each process's; with ``--data-dir DIR`` where
    the dataset's reading of one is in ``data_dirs`` (a recipe keeps no local path: an image folder needs it)."""
    processes = training_processes(ckpt)
    runner = f'torchrun --nproc_per_node {processes} -m sa_vision.cli.train' if processes > 1 else 'sa-vision-train'
    data_dir = ' --data-dir DIR' if dataset_info(ckpt.dataset).data_dir in data_dirs else ''
    return f'{runner} {repeat_run_args(ckpt.arch, recipe_file)}{data_dir}'


@dataclass(frozen=True)
class TrainingRecord:
    """The run the weights come from, as far as their checkpoint says."""
    trainer: str  # the command that saved them
    epoch: int  # epochs done when they were saved, from 1
    num_epochs: int  # epochs the run was to train
    steps_per_epoch: Optional[int]
    eval_metric: str
    best: bool  # the best epoch by eval_metric so far
    picked: bool  # chosen for being the best: model_best.pth.tar
    ema: Optional[bool]  # a run with an EMA (timm --model-ema): whether these are the EMA weights; None: no EMA
    scored_ema: Optional[bool]  # whose score the checkpoint's metric is (timm); None: not recorded

    @property
    def epoch_text(self) -> str:
        return f'epoch {self.epoch} of {self.num_epochs}'


def training_record(ckpt: Checkpoint) -> Optional[TrainingRecord]:
    """The record of a checkpoint of sa-vision-train or timm's train.py; None for weights without one."""
    meta, args = ckpt.meta, ckpt.meta.get('args') or {}
    if meta.get('epoch') is None or ckpt.format not in ('sa_vision', 'timm'):
        return None
    eval_metric = args.get('eval_metric', 'top1')
    named_best = Path(ckpt.source).name == BEST_CHECKPOINT
    if ckpt.format == 'timm':
        epoch = meta['epoch']
        num_epochs = meta.get('num_epochs') or args.get('epochs') or epoch
        # its CheckpointSaver keeps no record of the best epoch but the file it copies it to
        return TrainingRecord('timm train.py', epoch, num_epochs, None, eval_metric, named_best,
                              _picked(named_best, epoch, num_epochs),
                              bool(meta.get('ema_weights')) if args.get('model_ema') else None,
                              meta['scored_weights'] == 'ema' if 'scored_weights' in meta else None)
    epoch, num_epochs = meta['epoch'], meta.get('num_epochs') or meta['epoch']
    best = (meta.get('best') or {}).get('epoch') == epoch - 1  # the record's best epoch counts from 0
    steps = meta['num_updates'] // epoch if meta.get('num_updates') else None
    # picked: only model_best.pth.tar is written for being the best; last.pth.tar (of a killed run too) is the
    # latest epoch, and the same bytes as model_best when that epoch is the best: the file name is what tells
    return TrainingRecord('sa-vision-train', epoch, num_epochs, steps, eval_metric, best,
                          _picked(named_best and best, epoch, num_epochs), None, None)


def _picked(best_file: bool, epoch: int, num_epochs: int) -> bool:
    """Whether the evaluation chose these weights: a best-epoch file of an epoch before the run's last (the last
    epoch's weights are the run's result whatever their score, so its accuracy is no choice's)."""
    return best_file and epoch < num_epochs


def picked_note(record: Optional[TrainingRecord]) -> str:
    """What a reported accuracy is worth where the epoch was picked by that evaluation: '' where it was not."""
    if record is None or not record.picked:
        return ''
    return (f' This epoch was picked as the best by `--eval-metric {record.eval_metric}` on this same split, so '
            f'the accuracy is optimistic.')


def _weights_line(record: TrainingRecord) -> str:
    text = f'- Weights: after {record.epoch_text}'
    if record.trainer == 'timm train.py':
        text += f' (timm `train.py` numbers it {record.epoch - 1}, counting from 0)'
    if record.best:
        by = 'the EMA\'s ' if record.scored_ema and record.ema is False else ''
        text += (f', the best by {by}`--eval-metric {record.eval_metric}`'
                 + (f' (`{BEST_CHECKPOINT}`)' if record.trainer == 'timm train.py' else ''))
    if record.ema is not None:
        text += ('; the EMA of the weights (`--model-ema`), exported with `--use-ema`' if record.ema else
                 '; the weights themselves, not their EMA (`--model-ema`; `--use-ema` exports that)')
    return text + '.'


def _evaluation_lines(ckpt: Checkpoint, record: TrainingRecord, rounded_to: str = ''):
    metrics = ckpt.meta.get('metrics') or {}
    # an export stored in bfloat16 holds the evaluated float32 weights rounded
    these = f'these weights in float32, before they were rounded to {rounded_to}' if rounded_to else 'these weights'
    if {'top1', 'top5', 'loss'} <= set(metrics):
        top5 = (f'top-5 {metrics["top5"]:.2f} %, ' if ckpt.model_args.get('num_classes', 10) > 5 else '')  # else 100
        autocast = (ckpt.meta.get('args') or {}).get('amp_used')
        # the training evaluated under its autocast: these 16-bit rounded sums score a few hundredths of a point
        # apart from the same weights in float32 (sa-vision-validate), enough to differ in a card's two decimals
        precision = f', under {autocast} autocast as in training' if autocast else ''
        yield (f'- Evaluation of {these} ({metrics.get("num_images")} images{precision}): top-1 '
               f'{metrics["top1"]:.2f} %, {top5}loss {metrics["loss"]:.4f}.')
    elif metrics:
        scores = ', '.join(f'{name} {value:.4g}' for name, value in metrics.items())
        yield f'- Evaluation of {these} (timm `train.py`): {scores}.'
    elif record.trainer == 'sa-vision-train' and (ckpt.meta.get('args') or {}).get('val_interval', 1) > 1:
        yield (f'- These weights were not evaluated: `--val-interval {ckpt.meta["args"]["val_interval"]}` left their '
               f'epoch out (`sa-vision-validate` measures them).')
    elif 'metric' in ckpt.meta and record.scored_ema is not None:
        scored = 'the EMA of the weights' if record.scored_ema else 'the weights themselves'
        yield (f'- timm `train.py` recorded {record.eval_metric} {ckpt.meta["metric"]:.4g} for {scored}, not for '
               f'these: their own accuracy is not recorded (`sa-vision-validate` measures it).')


def training_summary(ckpt: Checkpoint, label: WeightsLabel, rounded_to: str = '') -> str:
    """The card's training summary: the run, which weights these are, their evaluation (``rounded_to``: of the
    float32 weights the export rounded to that dtype), the epochs (from 1)."""
    record, args = training_record(ckpt), ckpt.meta.get('args') or {}
    lines = ['## Training summary']
    if record is None:
        source = _NO_RECORD.get(ckpt.format, ckpt.format)
        lines.append(f'- Exported from {source}, which keeps the training arguments (`{RECIPE_FILENAME}`) but no '
                     f'record of the epochs or their evaluation.' if published_recipe(ckpt) else
                     f'- Exported from {source}, which holds no training record: how these weights were trained is '
                     f'not known here.')
        return '\n'.join(lines)
    steps = f' of {record.steps_per_epoch} steps' if record.steps_per_epoch else ''
    lines.append(f'- Data: {label.dataset.title}; {plural(record.num_epochs, "epoch")}{steps}, batch '
                 f'{args.get("batch_size")} x {training_processes(ckpt)} process(es) on `{args.get("device")}`, '
                 f'seed {args.get("seed")}; the arguments are `{RECIPE_FILENAME}`.')
    lines.append(_weights_line(record))
    if args.get('initial_checkpoint'):
        lines.append('- Started from earlier weights (`--initial-checkpoint`), e.g. a pruned model.')
    lines += _evaluation_lines(ckpt, record, rounded_to)
    history = ckpt.meta.get('history') or []
    if history:  # the record counts its epochs from 0
        lines += ['', markdown_table(['epoch', 'train loss', 'lr', 'eval loss', 'top-1'], [
            [h['epoch'] + 1, f'{h["train_loss"]:.4f}', f'{h["lr"]:.2e}',
             # an epoch that --val-interval left unevaluated has no eval_ entries
             f'{h["eval_loss"]:.4f}' if 'eval_loss' in h else '-',
             f'{h["eval_top1"]:.2f}' if 'eval_top1' in h else '-'] for h in history])]
    return '\n'.join(lines)


def recipe_section(ckpt: Checkpoint) -> str:
    """The arguments these weights were trained with (the template shows the paper's recipe instead), or that
    there are none to repeat."""
    import yaml

    from ..train.recipes import recipe_path
    try:
        name = recipe_path(ckpt.arch).stem
        reference = (f' The paper\'s CIFAR-10 recipe ships with sa_vision: `sa-vision-train '
                     f'{repeat_run_args(ckpt.arch, name)}` (`sa_vision/configs/{name}.yaml`).')
    except FileNotFoundError:
        reference = ''
    used = published_recipe(ckpt)
    if not used:
        return (f'No training record came with these weights, so no `{RECIPE_FILENAME}` is published and there is '
                f'no run to repeat.{reference}')
    tool = 'timm `train.py`' if ckpt.format == 'timm' else '`sa-vision-train`'
    used = yaml.safe_dump(used, sort_keys=False).strip()
    return (f'These weights were trained with the arguments below ({tool}; `{RECIPE_FILENAME}` in this repository: '
            f'`{repeat_command(ckpt, RECIPE_FILENAME)}` repeats the run).{reference}\n\n```yaml\n{used}\n```')
