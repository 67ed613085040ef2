""" What a run writes into its folder (:mod:`.run_folder`) after every epoch: its checkpoint, ``last.pth.tar``
and ``model_best.pth.tar``, a row of ``summary.csv``, and with --save-epoch-weights / --save-epoch-positions the
epoch's weights or centres """
import csv
import json
from pathlib import Path
from typing import Tuple

import torch.nn as nn
from timm.utils import update_summary

from ..io import atomic_duplicate, atomic_torch_save, atomic_write, plain_data
from .checkpoint import BEST_CHECKPOINT, CHECKPOINT_VERSION, RUN_CHECKPOINT
from .evaluation import EVAL_METRICS, metric_text
from .positional_epochs import epoch_label, record_epoch_positions
from .state import Log, args_as_saved, run_recipe

__all__ = ['checkpoint_dict', 'save_epoch_records', 'save_start_records', 'save_epoch', 'SUMMARY', 'summary_metrics',
           'write_summary_row']


def checkpoint_dict(args, model, optimizer, lr_scheduler, loss_scaler, *, epochs_done: int, num_epochs: int,
                    num_updates: int, data_config: dict, metrics: dict, history: list, best: dict) -> dict:
    """What ``last.pth.tar`` holds: the model with its arguments, and everything ``--resume`` needs."""
    return {
        'version': CHECKPOINT_VERSION,
        'arch': args.model,
        'model_args': dict(args.model_kwargs),
        'state_dict': model.state_dict(),
        'optimizer': optimizer.state_dict(),
        'scheduler': lr_scheduler.state_dict() if lr_scheduler is not None else None,
        'epoch': epochs_done - 1,  # counted from 0, as timm's CheckpointSaver saves it (CHECKPOINT_VERSION 3)
        'num_epochs': num_epochs,
        'num_updates': num_updates,
        'loss_scaler': loss_scaler.state_dict() if loss_scaler is not None else None,
        'args': args_as_saved(args),
        'recipe': run_recipe(args),
        'data_config': data_config,
        'metrics': metrics,
        # timm's CheckpointSaver's key, of evaluated epochs only (its avg_checkpoints.py ranks checkpoints by it)
        **({'metric': metrics[args.eval_metric]} if metrics else {}),
        'history': history,
        'best': best,
        'dataset': args.dataset,
    }


def save_epoch_records(model: nn.Module, args, run_dir: Path, epochs_done: int) -> None:
    """What the run keeps of every epoch: with --save-epoch-weights, the weights after ``epochs_done`` epochs, with
    arch / model_args in the safetensors metadata; with --save-epoch-positions, the centres and precision factors."""
    from safetensors.torch import save_file
    if args.save_epoch_weights:
        state_dict = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        metadata = {'arch': args.model, 'model_args': json.dumps(plain_data(args.model_kwargs))}
        with atomic_write(run_dir / f'{epoch_label(epochs_done)}.safetensors') as tmp:
            save_file(state_dict, str(tmp), metadata=metadata)
    if args.save_epoch_positions:
        record_epoch_positions(model, run_dir, epochs_done)


def save_start_records(model: nn.Module, args, run_dir: Path, start_epoch: int, num_epochs: int) -> None:
    """What a run keeps before its first step: a new run's records of its initialisation, a resume's centres of the
    epoch it starts from (--save-epoch-positions): where the run kept none before, its trajectory starts there."""
    if start_epoch == 0:
        save_epoch_records(model, args, run_dir, 0)
    elif args.save_epoch_positions and start_epoch < num_epochs:
        record_epoch_positions(model, run_dir, start_epoch)


SUMMARY = 'summary.csv'


def summary_metrics(record: dict) -> Tuple[dict, dict]:
    """The ``train_`` and ``eval_`` columns (timm's update_summary prefixes them) of an epoch of the run's history,
    the ``eval_`` ones empty where --val-interval left the epoch unevaluated."""
    train = {'loss': record['train_loss'], 'lr': record['lr'], 'time': record.get('train_time', ''),
             'img_per_s': record.get('train_img_per_s', '')}  # the last two: not in the history of older runs
    return train, {k: record.get(f'eval_{k}', '') for k in EVAL_METRICS}


def write_summary_row(summary: Path, record: dict, write_header: bool) -> None:
    """An epoch's row of ``summary.csv`` as timm's train.py writes it, its last column ``lr`` where the file is new
    or has one (an older sa_vision's has only ``train_lr``: a row of more columns would not fit it)."""
    has_lr = write_header
    if not write_header:
        with open(summary, encoding='utf-8', newline='') as f:
            has_lr = 'lr' in next(csv.reader(f), [])
    update_summary(record['epoch'], *summary_metrics(record), summary, lr=record['lr'] if has_lr else None,
                   write_header=write_header)


def save_epoch(ckpt: dict, model, args, run_dir: Path, log: Log) -> None:
    """An epoch's files: its records (:func:`save_epoch_records`), ``last.pth.tar``, ``model_best.pth.tar`` when the
    epoch is the best so far, a row of ``summary.csv`` (its ``eval_`` columns empty where --val-interval left the
    epoch unevaluated: timm's train.py writes no row then, but a row per epoch keeps the file's columns and count).
    ``last.pth.tar`` comes first: what a stop leaves unwritten after it, ``run_folder.repair_run_files`` writes."""
    epoch, num_epochs = ckpt['epoch'], ckpt['num_epochs']
    is_best = ckpt['best'] is not None and ckpt['best']['epoch'] == epoch
    # a write the system refuses (a full disk) ends the run in one line, with how to go on: run_folder.training_in
    save_epoch_records(model, args, run_dir, epoch + 1)
    atomic_torch_save(ckpt, run_dir / RUN_CHECKPOINT)
    if is_best:  # the whole checkpoint, as timm's CheckpointSaver keeps model_best
        atomic_duplicate(run_dir / RUN_CHECKPOINT, run_dir / BEST_CHECKPOINT)
    summary = run_dir / SUMMARY
    write_summary_row(summary, ckpt['history'][-1], write_header=not summary.is_file())
    # said once every file of the epoch is written; the epoch counted from 0, as the Train: and Eval: lines count it
    log(f'Saved checkpoint of epoch {epoch} ({epoch + 1}/{num_epochs} done) to {run_dir / RUN_CHECKPOINT}')
    if is_best:
        log(f'Best {args.eval_metric} so far ({metric_text(args.eval_metric, ckpt["best"]["metric"])}): '
            f'{run_dir / BEST_CHECKPOINT}')
