""" Training: a sa_vision model (or any timm model) with timm's library parts, no timm checkout needed

``sa-vision-train`` runs :func:`main` on a recipe (``-c``) in timm ``train.py``'s argument names, overridden by the
command line; it writes ``last.pth.tar`` every epoch, which ``--resume`` continues, and ``model_best.pth.tar`` when
an epoch is the best by ``--eval-metric`` (docs/training.md).
"""
import math
import sys
import time
from functools import partial
from pathlib import Path
from shlex import quote
from typing import Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.loss import LabelSmoothingCrossEntropy
from timm.models import model_parameters
from timm.utils import NativeScaler, dispatch_clip_grad, distribute_bn, is_primary

from .. import models  # noqa: F401  registers the models
from ..errors import TrainingDiverged, UserError, run_cli
from ..io import atomic_duplicate, atomic_torch_save
from ..tables import format_duration, plural
from .caller_settings import caller_settings_kept
from .checkpoint import BEST_CHECKPOINT, RUN_CHECKPOINT, read_checkpoint
from .data import split_name
from .device_data import set_epoch
from .epoch_files import checkpoint_dict, save_epoch, save_start_records
from .evaluation import evaluate_epoch, evaluated_after, metric_text, result_json
from .run_folder import repair_run_files, run_folder, training_in, write_run_files
from .run_setup import (
    create_loaders,
    create_model,
    create_optimizer,
    create_scheduler,
    log_primary,
    num_classes_of_folder,
    precision,
    set_up_process,
    training_model,
)
from .runtime import host_sync_allowed, seed_epoch
from .state import parse_run_args, resolve_model_args, restore
from .weights_files import nonfinite_tensors


def _finished_note(epochs_done: int, num_epochs: int) -> str:
    """What the resume line adds for a run that has done all its epochs: only its evaluation is reported again."""
    return (f': the run is finished ({plural(num_epochs, "epoch")}), nothing is left to train (a larger --epochs '
            f'goes on); its result follows' if epochs_done >= num_epochs else '')


def _log_resumed(args, run_dir: Path, resume_ckpt, start_epoch: int, num_updates: int, num_epochs: int,
                 updates_per_epoch: int) -> None:
    """Where the run goes on and from which epoch, how an epoch's updates changed (the run's saved count against
    ``updates_per_epoch`` now), and that an earlier export stays unless --export replaces it."""
    saved_updates = resume_ckpt.meta['num_updates']
    log_primary(args, f'Resuming {run_dir} at epoch {start_epoch}, update {num_updates}'
                      f'{_finished_note(start_epoch, num_epochs)}')
    if num_updates != saved_updates and start_epoch:
        log_primary(args, f'note: an epoch is now {updates_per_epoch} updates, {saved_updates // start_epoch} before '
                          f'(--batch-size or the processes changed): the schedule goes on from update {num_updates}, '
                          f'the start of epoch {start_epoch}')
    if (run_dir / 'hub').is_dir() and not args.export:
        log_primary(args, f'note: {run_dir / "hub"} stays the export of an earlier epoch (its README.md says which); '
                          f'--export replaces it')


# what a finished run resumed with other values of evaluates anew: its checkpoint's metrics are of the old ones
_EVALUATION_ARGS = {'dataset', 'data_dir', 'val_split'}


def _resumed_evaluation(args, run_dir: Path, resume_ckpt, best: Optional[dict], log,
                        trains: bool) -> Tuple[Optional[dict], Optional[dict]]:
    """(the evaluation a resumed run reports where it has no epoch left to train, its best epoch so far): its own,
    unless the command line asks for another evaluation (_EVALUATION_ARGS): then neither, the last weights are
    evaluated anew and the best is counted on that evaluation from the next epoch on."""
    if resume_ckpt is None or not _EVALUATION_ARGS & set(args.resume_changes):
        if resume_ckpt is not None and 'eval_metric' in args.resume_changes and best is not None:
            best = _best_by_new_metric(args, run_dir, resume_ckpt, best, log, trains)
        return (resume_ckpt.meta.get('metrics') if resume_ckpt else None), best
    if best is not None:
        log(f'note: the evaluation changed ({", ".join(sorted(_EVALUATION_ARGS & set(args.resume_changes)))}): the '
            f'best epoch is counted anew on it ({BEST_CHECKPOINT}, epoch {best["epoch"]} by the old one, stays until '
            f'an epoch is evaluated)')
    return None, None


def _best_by_new_metric(args, run_dir: Path, ckpt, best: dict, log, trains: bool) -> Optional[dict]:
    """The best epoch of a run resumed with another --eval-metric, by the new metric's values in its history: the
    epoch in ``BEST_CHECKPOINT`` or, where the run ``trains`` on (its next checkpoints record the new metric), the
    last one, whose weights are at hand too: copied there where it wins, the two files recording the new metric. A
    later epoch must beat it. None where the history has neither value."""
    old, new = args.resume_changes['eval_metric']
    values = {r['epoch']: r.get(f'eval_{new}') for r in ckpt.meta.get('history', [])}
    last, kept = ckpt.meta['epoch'] - 1, values.get(best['epoch'])  # epochs counted from 0, as the history counts
    last_wins = values.get(last) is not None and (kept is None or is_better(new, values[last], kept))
    where = f'in {BEST_CHECKPOINT}'
    if last_wins and trains:
        best, kept, where = {'epoch': last}, values[last], f'the last, now in {BEST_CHECKPOINT}'
        if is_primary(args):
            saved, record = torch.load(ckpt.source, map_location='cpu', weights_only=True), {'eval_metric': new}
            # the checkpoint resumed too: a run stopped before its next epoch's files leaves the two agreeing
            atomic_torch_save({**saved, 'best': {'metric': kept, 'epoch': last}, 'metric': kept,
                               'args': {**saved['args'], **record},
                               'recipe': {**(saved.get('recipe') or {}), **record}}, Path(ckpt.source))
            atomic_duplicate(Path(ckpt.source), run_dir / BEST_CHECKPOINT)
    elif last_wins:  # a finished run's files keep the metric they were judged by
        where += (f'; the last epoch, {last}, has the better {new} ({metric_text(new, values[last])}): it is in '
                  f'{RUN_CHECKPOINT}, and a run trained on with a larger --epochs keeps it as the best')
    log(f'note: --eval-metric {old} -> {new}: the best epoch by {new} of those whose weights are kept is '
        + (f'epoch {best["epoch"]} ({where}), {metric_text(new, kept)}: the one to beat from now on'
           if kept is not None else f'unknown (no {new} in the run\'s history): the next evaluated epoch is'))
    return None if kept is None else {'metric': kept, 'epoch': best['epoch']}


def _check_weights_are_numbers(model: nn.Module, epoch: int) -> None:
    """Refuse to save an epoch whose weights hold NaN or inf (its last steps broke them, its loss still logged)."""
    with host_sync_allowed():  # read on purpose, once an epoch (CUDA's sync debug mode is for the steps)
        broken = nonfinite_tensors(model.state_dict())
    if broken:
        raise TrainingDiverged(f'the weights after epoch {epoch} hold NaN or inf ({plural(len(broken), "tensor")}, '
                               f'{broken[0]} the first): the run diverged, and this epoch is not saved')


def is_better(metric: str, value: float, best: float) -> bool:
    """Whether ``value`` of ``metric`` beats ``best``: lower is better for a loss, higher for accuracies."""
    return value < best if metric == 'loss' else value > best


def _check_export(args, export, run_dir: Path) -> None:
    """Refuse an ``--export`` this entry point cannot write, or (``export.check``, where it has one) one whose
    folder it could not replace, before any epoch rather than after them."""
    if args.export and export is None:
        raise UserError('--export writes a Hub folder, which this entry point cannot: run sa-vision-train '
                        '(python -m sa_vision.cli.train) instead')
    if args.export and hasattr(export, 'check'):
        try:
            export.check(run_dir / 'hub')
        except UserError as e:
            raise UserError(f'{e}. sa-vision-train --export writes {run_dir / "hub"}: move what is in the way out of '
                            f'it, or leave out --export') from None


@caller_settings_kept()
def main(argv=None, export: Optional[Callable[[Path, Path], List[str]]] = None):
    """Train as the command line says; ``export(checkpoint, folder)`` writes the Hub folder of ``--export``, in place
    of an earlier one (``sa_vision.cli.train`` passes ``sa_vision.hub.export_hub_folder``: the Hub is a tier above
    training; its ``check(folder)`` refuses a folder it could not replace before the epochs)."""
    args, recipe, resume_ckpt = parse_run_args(argv)
    run_dir = run_folder(args, resume_ckpt)  # before anything is written
    _check_export(args, export, run_dir)
    set_up_process(args)
    log = partial(log_primary, args)
    if resume_ckpt is None:
        num_classes_of_folder(args, recipe, log)
    initial, kwargs_sources = resolve_model_args(args, recipe, resume_ckpt, log)
    seed_epoch(args.seed, 0, args.rank)
    model, data_cfg = create_model(args, initial, kwargs_sources, resume_ckpt)
    optimizer = create_optimizer(model, args)
    train_loader, eval_loader = create_loaders(args, data_cfg)
    lr_scheduler, num_epochs = create_scheduler(optimizer, args, len(train_loader), resume_ckpt)
    loss_fn = LabelSmoothingCrossEntropy(args.smoothing) if args.smoothing > 0 else nn.CrossEntropyLoss()
    amp_ctx, loss_scaler = precision(model, args)

    start_epoch, num_updates, history, best = 0, 0, [], None
    if resume_ckpt is not None:
        start_epoch, num_updates, history, best = restore(resume_ckpt, model, optimizer, lr_scheduler, loss_scaler,
                                                          len(train_loader), args.eval_metric)
        _log_resumed(args, run_dir, resume_ckpt, start_epoch, num_updates, num_epochs, len(train_loader))
    train_model, eval_model = training_model(model, args, data_cfg, loss_fn, amp_ctx,
                                             steps_left=(num_epochs - start_epoch) * len(train_loader))
    if is_primary(args):
        run_dir = write_run_files(args, run_dir, new_run=resume_ckpt is None, trains=start_epoch < num_epochs,
                                  resumed=resume_ckpt)
    with training_in(run_dir, export=bool(getattr(args, 'export', False))):  # held from here, let go at its end
        if is_primary(args):
            repair_run_files(run_dir, resume_ckpt, log)
            log(f'Run folder {run_dir}; {plural(num_epochs, "epoch")} of {len(train_loader)} steps, '
                f'{args.world_size} process(es) on {args.device}, amp={args.amp_used}')
        metrics, best = _resumed_evaluation(args, run_dir, resume_ckpt, best, log, start_epoch < num_epochs)
        if is_primary(args):
            save_start_records(model, args, run_dir, start_epoch, num_epochs)
        for epoch in range(start_epoch, num_epochs):
            seed_epoch(args.seed, epoch, args.rank)
            set_epoch(train_loader, epoch)
            train_metrics, num_updates = train_one_epoch(
                epoch, train_model, train_loader, optimizer, loss_fn, lr_scheduler, args, num_updates, amp_ctx,
                loss_scaler, num_epochs)
            # end to end: the epoch's wall time with its data loading, evaluation apart
            train_metrics['img_per_s'] = len(train_loader) * args.batch_size * args.world_size / train_metrics['time']
            log(f'Epoch {epoch}: {train_metrics["img_per_s"]:,.0f} img/s end to end ('
                f'{"data on the device" if args.device_data_used else "DataLoader"}, evaluation apart)')
            if evaluated_after(epoch, args.val_interval, num_epochs):
                metrics, eval_model = evaluate_epoch(epoch, eval_model, model, eval_loader, args, log, amp_ctx)
                if best is None or is_better(args.eval_metric, metrics[args.eval_metric], best['metric']):
                    best = {'metric': metrics[args.eval_metric], 'epoch': epoch}
            else:  # this checkpoint's weights were not evaluated: no metrics of an earlier epoch go with them
                metrics = None
                log(f'Eval: {epoch}  skipped (--val-interval {args.val_interval}: the next at epoch '
                    f'{min(epoch + args.val_interval - (epoch + 1) % args.val_interval, num_epochs - 1)})')
                _check_weights_are_numbers(model, epoch)  # what its evaluation would have found
            if lr_scheduler is not None:  # plateau steps on the evaluation metric (none: no step), the others not
                lr_scheduler.step(epoch + 1, metrics[args.eval_metric] if args.sched == 'plateau' and metrics else None)
            history.append({'epoch': epoch, 'train_loss': train_metrics['loss'], 'lr': train_metrics['lr'],
                            'train_time': train_metrics['time'], 'train_img_per_s': train_metrics['img_per_s'],
                            **{f'eval_{k}': v for k, v in (metrics or {}).items()}})
            if is_primary(args):
                save_epoch(checkpoint_dict(args, model, optimizer, lr_scheduler, loss_scaler, epochs_done=epoch + 1,
                                           num_epochs=num_epochs, num_updates=num_updates, data_config=data_cfg,
                                           metrics=metrics, history=history, best=best),
                           model, args, run_dir, log)
            if args.distributed:
                dist.barrier()
        if metrics is None and start_epoch > 0:
            # resumed with no epoch left to train, after an epoch --val-interval left unevaluated (--epochs lowered)
            # or asking for another evaluation (_EVALUATION_ARGS)
            metrics, eval_model = evaluate_epoch(start_epoch - 1, eval_model, model, eval_loader, args, log, amp_ctx)
        if is_primary(args) and metrics is not None:  # its Hub folder too: still held
            _report(args, metrics, num_epochs, run_dir, export, best)
    if args.distributed:
        dist.destroy_process_group()
    if args.target_top1 is not None and metrics is not None and metrics['top1'] < args.target_top1:
        log(f'top-1 {metrics["top1"]:.2f}% is below --target-top1 {args.target_top1}')
        sys.exit(1)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, lr_scheduler, args, num_updates, amp_ctx,
                    loss_scaler: Optional[NativeScaler] = None, num_epochs=None):
    model.train()
    # the running loss stays on the device: reading it is a host sync, done only for the log lines. Every batch
    # has the same size (both loaders drop the last short one), so the mean is over batches: one operation a step
    loss_sum = torch.zeros((), dtype=torch.float64, device=args.device)
    loss_avg = float('nan')
    start = batch_start = time.time()
    num_batches, seen = len(loader), 0
    for batch_idx, (images, targets) in enumerate(loader):
        images = images.to(args.device, non_blocking=True)
        targets = targets.to(args.device, non_blocking=True)
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with amp_ctx():
            loss = loss_fn(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        # timm's train.py leaves the classifier out of adaptive clipping (agc)
        clipped = model_parameters(model, exclude_head='agc' in args.clip_mode)
        second_order = getattr(optimizer, 'is_second_order', False)  # adahessian: as timm's train.py passes it
        if loss_scaler is not None:
            loss_scaler(loss, optimizer, clip_grad=args.clip_grad, clip_mode=args.clip_mode, parameters=clipped,
                        create_graph=second_order)
        else:
            loss.backward(create_graph=second_order)
            if args.clip_grad is not None:
                dispatch_clip_grad(clipped, value=args.clip_grad, mode=args.clip_mode)
            optimizer.step()
        num_updates += 1
        lr = optimizer.param_groups[0]['lr']  # the step's, logged as timm's train.py logs it
        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates)
        loss = loss.detach()
        loss_sum.add_(loss)  # float64, as the loss promotes
        seen += images.size(0)
        # the first step too, as timm's train.py logs: a paper recipe's first line (--log-interval 100) would
        # come after 100 steps, over an hour on a CPU
        if batch_idx in (0, num_batches - 1) or (batch_idx + 1) % args.log_interval == 0:
            losses = torch.stack([loss.double(), loss_sum / (batch_idx + 1)])
            if args.distributed:  # every process's batches, as timm's train.py logs them
                dist.all_reduce(losses)
                losses /= args.world_size
            with host_sync_allowed():
                loss_val, loss_avg = losses.tolist()  # the one sync
            now = time.time()
            rate = seen * args.world_size / max(now - batch_start, 1e-9)
            # time left in this run at this epoch's pace so far (evaluation not counted)
            batches_left = num_batches - batch_idx - 1 + ((num_epochs or epoch + 1) - epoch - 1) * num_batches
            eta = (now - start) / (batch_idx + 1) * batches_left
            log_primary(args,
                 f'Train: {epoch} [{batch_idx + 1:>4d}/{num_batches} ({100. * (batch_idx + 1) / num_batches:>3.0f}%)]  '
                 f'Loss: {loss_val:#.3g} ({loss_avg:#.3g})  LR: {lr:.3e}  {rate:>7.1f} img/s'
                 + (f'  ETA {format_duration(eta)}' if batch_idx else ''))  # the first: compiling, warming up
            if loss_scaler is None and not math.isfinite(loss_avg):  # a scaler skips the steps of inf gradients
                raise TrainingDiverged(f'the training loss is {loss_avg} at epoch {epoch}, step {batch_idx + 1} of '
                                       f'{num_batches} (LR {lr:.3e}): the run diverged, its weights are lost')
            batch_start, seen = time.time(), 0
    if args.distributed:  # the BatchNorm statistics each process ran, averaged: evaluated and saved alike
        distribute_bn(model, args.world_size, reduce=True)  # as timm's train.py (--dist-bn reduce)
    return {'loss': loss_avg, 'lr': optimizer.param_groups[0]['lr'], 'time': time.time() - start}, num_updates


def _report(args, metrics: dict, num_epochs: int, run_dir: Path, export, best_epoch: Optional[dict]) -> None:
    """The result line (and the Hub folder of --export: the best epoch's weights), and the best epoch's checkpoint
    (``best_epoch``: the run's record of it, epoch and metric)."""
    log = partial(log_primary, args)
    checkpoint, best = run_dir / RUN_CHECKPOINT, run_dir / BEST_CHECKPOINT
    split = split_name(args.dataset, args.val_split)
    result = {'model': args.model, 'dataset': args.dataset or 'folder', 'split': split, 'epochs': num_epochs,
              **metrics, 'amp': args.amp_used, 'amp_reason': args.amp_reason, 'torchcompile': args.torchcompile_used,
              'torchcompile_mode': args.torchcompile_mode_used, 'opt_fused': args.opt_fused_used,
              'device_data': args.device_data_used, 'checkpoint': str(checkpoint),
              'best_checkpoint': str(best) if best.is_file() else None}
    if args.export:
        # the best epoch, as a timm user publishes model_best.pth.tar; where it is gone (removed: a resume writes it
        # again only where the best is the epoch resumed from, repair_run_files), the last epoch
        exported = best if best.is_file() else checkpoint
        saved = read_checkpoint(exported).meta
        done = saved['epoch']
        recorded = (saved.get('best') or {}).get('epoch')  # counted from 0
        if exported == checkpoint and recorded is not None and recorded != done - 1:
            log(f'warning: no {best.name} in {run_dir}: '
                f'exporting the last epoch, {done}, although its record names epoch {recorded + 1} '
                f'as the best by {args.eval_metric} ({metric_text(args.eval_metric, saved["best"]["metric"])})')
        log(f'Exporting {exported.name}: the weights after epoch {done} of {num_epochs} '
            f'({args.eval_metric} {metric_text(args.eval_metric, saved["metrics"][args.eval_metric])}'
            f'{", the best" if exported == best else ""})')
        export_dir = run_dir / 'hub'
        try:
            staged = export(exported, export_dir)  # never half a folder, nor two exports mixed, nor other files lost
        except UserError as e:  # e.g. hub/ holds files of no export
            raise UserError(f'{e}. The run\'s epochs are saved: then --resume {quote(str(checkpoint))} --export '
                            f'exports without training') from None
        result['hub_folder'], result['hub_epoch'] = str(export_dir), done
        log(f'Exported Hub folder {export_dir}: {", ".join(staged)}')
    if is_primary(args):  # on stdout, where timm's train.py prints its --result and sa-vision-validate its own
        print(result_json(result), flush=True)
    if best_epoch is not None and best.is_file():  # timm's train.py ends with "*** Best metric"
        log(f'Best {args.eval_metric} {metric_text(args.eval_metric, best_epoch["metric"])} at epoch '
            f'{best_epoch["epoch"]} ({best_epoch["epoch"] + 1}/{num_epochs} done): {best}; sa-vision-validate '
            f'--checkpoint {quote(str(best))} evaluates it')
    log(f'Top-1 on the {args.dataset or "folder"} {split} split: {metrics["top1"]:.2f}%  '
        f'(checkpoint {checkpoint})')


if __name__ == '__main__':
    sys.exit(run_cli(main))
