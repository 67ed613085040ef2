""" Training: a sa_vision model (or any timm model) with timm's library parts, no timm checkout needed

``sa-vision-train`` runs :func:`main` on a recipe (``-c``) in timm ``train.py``'s argument names, overridden by the
command line; it writes ``last.pth.tar`` every epoch, which ``--resume`` continues, and ``model_best.pth.tar`` when
an epoch is the best by ``--eval-metric`` (docs/training.md).
"""
import json
import logging
import sys
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Callable, List, Optional

import timm
import torch
import torch.distributed as dist
import torch.nn as nn
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import NativeScaler, dispatch_clip_grad, is_primary
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from .. import models  # noqa: F401  registers the models
from ..errors import UserError, run_cli
from ..io import atomic_folder
from ..models import create_named_model, param_groups_pos_lr
from ..models.input_pad import model_input_padding
from ..tables import plural
from .arg_values import check_compile_backend, check_scheduler, check_value_bounds
from .checkpoint import BEST_CHECKPOINT, RUN_CHECKPOINT, Checkpoint, read_checkpoint
from .data import (
    check_dataset,
    check_model_takes_data,
    create_image_dataset,
    normalization,
    num_classes_of_folder,
    pad_value_note,
    split_name,
)
from .device_data import DeviceEvalLoader, DeviceTrainLoader, resolve_device_data, set_epoch
from .evaluation import evaluate_epoch, evaluated_after, evaluation_module
from .optimizer import resolve_opt_fused
from .run_folder import run_folder, training_in, write_run_files
from .runtime import (
    apply_threads,
    configure_backends,
    format_duration,
    host_sync_allowed,
    import_device_modules,
    init_distributed,
    probe_compile,
    probe_size,
    resolve_amp,
    resolve_torchcompile,
    retain_freed_memory,
    seed_epoch,
    uses_channels_last,
)
from .state import (
    checkpoint_dict,
    load_initial_weights,
    metric_text,
    parse_run_args,
    resolve_model_args,
    restore,
    save_epoch,
    save_epoch_weights,
)

_logger = logging.getLogger('train')

def _finished_note(epochs_done: int, num_epochs: int) -> str:
    """What the resume line adds for a run that has done all its epochs: only its evaluation is reported again."""
    return (f': the run is finished ({plural(num_epochs, "epoch")}), nothing is left to train (a larger --epochs '
            f'goes on); its result follows' if epochs_done >= num_epochs else '')


def _log(args, msg):
    if is_primary(args):
        _logger.info(msg)


def is_better(metric: str, value: float, best: float) -> bool:
    """Whether ``value`` of ``metric`` beats ``best``: lower is better for a loss, higher for accuracies."""
    return value < best if metric == 'loss' else value > best


def main(argv=None, export: Optional[Callable[[Path, Path], List[str]]] = None):
    """Train as the command line says; ``export(checkpoint, folder)`` writes the Hub folder of ``--export``
    (``sa_vision.cli.train`` passes ``sa_vision.hub.export_hub_folder``: the Hub is a tier above training)."""
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    args, recipe, resume_ckpt = parse_run_args(argv)
    if args.export and export is None:
        raise UserError('--export writes a Hub folder, which this entry point cannot: run sa-vision-train '
                        '(python -m sa_vision.cli.train) instead')
    run_dir = run_folder(args, resume_ckpt)  # before anything is written
    _set_up_process(args)
    log = partial(_log, args)
    if resume_ckpt is None:
        num_classes_of_folder(args, recipe, log)
    initial, kwargs_sources = resolve_model_args(args, recipe, resume_ckpt, log)
    seed_epoch(args.seed, 0, args.rank)
    model, data_cfg = _create_model(args, initial, kwargs_sources, resume_ckpt)
    optimizer = _create_optimizer(model, args)
    train_loader, eval_loader = _create_loaders(args, data_cfg)
    lr_scheduler, num_epochs = _create_scheduler(optimizer, args, len(train_loader), resume_ckpt)
    loss_fn = LabelSmoothingCrossEntropy(args.smoothing) if args.smoothing > 0 else nn.CrossEntropyLoss()
    amp_ctx, loss_scaler = _precision(model, args)

    start_epoch, num_updates, history, best = 0, 0, [], None
    if resume_ckpt is not None:
        start_epoch, num_updates, history, best = restore(resume_ckpt, model, optimizer, lr_scheduler, loss_scaler)
        log(f'Resuming {run_dir} at epoch {start_epoch}, update {num_updates}{_finished_note(start_epoch, num_epochs)}')
        if (run_dir / 'hub').is_dir() and not args.export:
            log(f'note: {run_dir / "hub"} stays the export of an earlier epoch (its README.md says which); '
                f'--export replaces it')
    train_model, eval_model = _training_model(model, args, data_cfg, loss_fn, amp_ctx,
                                              steps_left=(num_epochs - start_epoch) * len(train_loader))
    if is_primary(args):
        run_dir = write_run_files(args, run_dir, new_run=resume_ckpt is None)
        log(f'Run folder {run_dir}; {plural(num_epochs, "epoch")} of {len(train_loader)} steps, '
            f'{args.world_size} process(es) on {args.device}, amp={args.amp_used}')
        if args.save_epoch_weights and start_epoch == 0:
            save_epoch_weights(model, args, run_dir, 0)
    metrics = resume_ckpt.meta.get('metrics') if resume_ckpt else None
    with training_in(run_dir):
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
            if lr_scheduler is not None:  # plateau steps on the evaluation metric (none: no step), the others not
                lr_scheduler.step(epoch + 1, metrics[args.eval_metric] if args.sched == 'plateau' and metrics else None)
            history.append({'epoch': epoch, 'train_loss': train_metrics['loss'], 'lr': train_metrics['lr'],
                            'train_time': train_metrics['time'], 'train_img_per_s': train_metrics['img_per_s'],
                            **{f'eval_{k}': v for k, v in (metrics or {}).items()}})
            if is_primary(args):
                save_epoch(checkpoint_dict(args, model, optimizer, lr_scheduler, loss_scaler, epochs_done=epoch + 1,
                                           num_epochs=num_epochs, num_updates=num_updates, data_config=data_cfg,
                                           metrics=metrics, history=history, best=best),
                           model, args, run_dir, train_metrics, log)
            if args.distributed:
                dist.barrier()

    if metrics is None and start_epoch > 0:
        # resumed after an epoch that --val-interval left unevaluated, with no epoch left to train (--epochs lowered)
        metrics, eval_model = evaluate_epoch(start_epoch - 1, eval_model, model, eval_loader, args, log, amp_ctx)
    if is_primary(args) and metrics is not None:
        _report(args, metrics, num_epochs, run_dir, export)
    if args.distributed:
        dist.destroy_process_group()
    if args.target_top1 is not None and metrics is not None and metrics['top1'] < args.target_top1:
        log(f'top-1 {metrics["top1"]:.2f}% is below --target-top1 {args.target_top1}')
        sys.exit(1)


def _set_up_process(args) -> None:
    """Check what would only fail once the model and the data are built, then set up this process: threads,
    devices and DDP, the modules of --device-modules, backend switches, the allocator."""
    check_value_bounds(args)
    check_scheduler(args.sched, args.sched_on_updates, args.val_interval, args.warmup_epochs)
    check_dataset(args.dataset, data_dir=args.data_dir, download=args.dataset_download,
                  train_split=args.train_split, eval_split=args.val_split)
    threads = apply_threads(args)
    import_device_modules(args.device_modules)
    check_compile_backend(args.torchcompile)
    init_distributed(args)
    configure_backends(args)
    _log(args, f'Threads: {threads} (--threads {args.threads or "default"})')
    if args.retain_freed_memory and not retain_freed_memory():
        _log(args, '--retain-freed-memory: the C library is not glibc; freed memory is returned as usual')
        args.retain_freed_memory = False


def _create_model(args, initial, kwargs_sources=None, resumed=None):
    """The model on its device, and its data config (input size, with the dataset's normalisation, an image
    folder's that of the weights trained on: ``initial`` or the ``resumed`` run's); ``kwargs_sources`` says where
    each of ``args.model_kwargs`` came from (:func:`resolve_model_args`)."""
    model = create_named_model(args.model, pretrained=args.pretrained, kwargs_sources=kwargs_sources,
                               **args.model_kwargs)
    if initial is not None:
        load_initial_weights(model, initial, args, partial(_log, args), kwargs_sources)
    num_params = sum(p.numel() for p in model.parameters())
    _log(args, f'Model {args.model} {args.model_kwargs or ""} created, {num_params:,} parameters')
    data_cfg = timm.data.resolve_data_config({'img_size': args.img_size} if args.img_size else {}, model=model)
    weights = resumed or initial
    stated = weights.preprocessing if weights else {}
    data_cfg.update({key: stated[key] for key in ('mean', 'std') if key in stated})  # e.g. Fashion-MNIST's
    data_cfg = {**normalization(args.dataset, data_cfg), 'input_size': list(data_cfg['input_size'])}
    border = model_input_padding(model)
    if border and not args.img_size:  # e.g. a kept Fashion-MNIST model: it pads the unpadded images itself
        data_cfg['input_size'][-2:] = [size - 2 * border for size in data_cfg['input_size'][-2:]]
    check_model_takes_data(args.model, model, args.dataset, data_cfg['input_size'], args.img_size)
    if border and (note := pad_value_note(args.model_kwargs.get('input_pad_value'), data_cfg, args.dataset)):
        _log(args, note)
    if args.channels_last is None:
        args.channels_last = uses_channels_last(model, args.device)
    model.to(args.device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    return model, data_cfg


def _create_optimizer(model, args):
    # timm's weight-decay groups, the positional ones with lr_scale = --pos-lr-scale (timm's schedulers apply it)
    args.opt_fused_used, args.opt_fused_reason = resolve_opt_fused(args.opt_fused, args.opt, args.device)
    _log(args, f'Optimizer: {args.opt}, {"fused" if args.opt_fused_used else "not fused"} ({args.opt_fused_reason})')
    return create_optimizer_v2(
        model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum,
        param_group_fn=partial(param_groups_pos_lr, weight_decay=args.weight_decay, pos_lr_scale=args.pos_lr_scale),
        **({'eps': args.opt_eps} if args.opt_eps is not None else {}),
        **({'fused': True} if args.opt_fused_used else {}))


def _create_loaders(args, data_cfg):
    """(train loader, eval loader) of this process's shards."""
    norm = {k: v for k, v in data_cfg.items() if k != 'input_size'}
    ds_kwargs = dict(data_dir=args.data_dir, download=args.dataset_download, img_size=data_cfg['input_size'][-1],
                     **norm)
    train_ds = create_image_dataset(args.dataset, args.train_split, is_training=True, hflip=args.hflip,
                                    crop_padding=args.train_crop_padding, **ds_kwargs)
    eval_ds = create_image_dataset(args.dataset, args.val_split, is_training=False, **ds_kwargs)
    held, args.device_data_reason = resolve_device_data(
        args.device_data, args.device, train_ds, eval_ds, data_cfg['input_size'][-1], args.train_crop_padding)
    args.device_data_used = held is not None
    _log(args, f'Data: {args.device_data_reason}')
    eval_batch_size = args.validation_batch_size or args.batch_size
    if held is not None:
        (train_images, train_targets), (eval_images, eval_targets) = held
        train_loader = DeviceTrainLoader(
            train_images, train_targets, args.batch_size, device=args.device, hflip=args.hflip,
            crop_padding=args.train_crop_padding, seed=args.seed, rank=args.rank, world_size=args.world_size, **norm)
        eval_loader = DeviceEvalLoader(eval_images, eval_targets, eval_batch_size, device=args.device,
                                       rank=args.rank, world_size=args.world_size, **norm)
    else:
        # one sampler for 1 and N processes: the shuffle order depends only on (seed, epoch)
        train_sampler = DistributedSampler(
            train_ds, num_replicas=args.world_size, rank=args.rank, shuffle=True, seed=args.seed, drop_last=True)
        train_loader = DataLoader(
            train_ds, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers,
            pin_memory=args.pin_mem, drop_last=True, persistent_workers=False)
        eval_indices = list(range(args.rank, len(eval_ds), args.world_size))  # disjoint shards, no padding
        eval_loader = DataLoader(
            torch.utils.data.Subset(eval_ds, eval_indices), batch_size=eval_batch_size, shuffle=False,
            num_workers=args.workers, pin_memory=args.pin_mem)
    if len(train_loader) == 0:
        raise UserError(f'the training split has {len(train_ds)} images, fewer than one batch of '
                        f'{args.batch_size} x {args.world_size} processes; lower --batch-size')
    return train_loader, eval_loader


def _create_scheduler(optimizer, args, updates_per_epoch: int, resume_ckpt: Optional[Checkpoint] = None):
    """(timm's scheduler, or None for --sched none, number of epochs); a UserError where the epochs end before
    those the resumed run has done: its files would say 'epoch 4 of 2', its recipe.yaml no longer repeat the run."""
    scheduler, num_epochs = create_scheduler_v2(
        optimizer, sched=args.sched, num_epochs=args.epochs, decay_epochs=args.decay_epochs,
        decay_milestones=args.decay_milestones, decay_rate=args.decay_rate, patience_epochs=args.patience_epochs,
        min_lr=args.min_lr, warmup_lr=args.warmup_lr,
        warmup_epochs=args.warmup_epochs, warmup_prefix=args.warmup_prefix, cooldown_epochs=args.cooldown_epochs,
        step_on_epochs=not args.sched_on_updates, updates_per_epoch=updates_per_epoch,
        plateau_mode='min' if args.eval_metric == 'loss' else 'max')
    done = resume_ckpt.meta['epoch'] if resume_ckpt is not None else 0
    if num_epochs < done:
        raise UserError(f'--epochs {args.epochs} ends before the run resumed from {args.resume}, which has done '
                        f'{done} epochs: pass --epochs {done} to evaluate it as it is, or more to train on')
    if scheduler is not None and args.warmup_epochs >= args.epochs:  # e.g. the paper's 15 with a short --epochs
        _log(args, f'note: --warmup-epochs {args.warmup_epochs:g} is not below --epochs {args.epochs}: every step '
                   f'warms up, so the lr only rises toward --lr {args.lr:g} and never decays; pass fewer '
                   f'--warmup-epochs')
    return scheduler, num_epochs


def _precision(model, args):
    """(autocast context factory, loss scaler or None); ``args.amp_used`` / ``amp_reason`` say what and why, while
    ``args.amp`` stays what was asked (``-c recipe.yaml`` on another machine decides again)."""
    use_amp, args.amp_reason = resolve_amp(args.amp, args.device, args.amp_dtype, probe_size(model, args.batch_size))
    args.amp_used = args.amp_dtype if use_amp else False
    _log(args, f'Precision: {"autocast " + args.amp_dtype if use_amp else "float32"} ({args.amp_reason})')
    amp_dtype, device_type = getattr(torch, args.amp_dtype), torch.device(args.device).type

    def amp_ctx():
        return torch.autocast(device_type, dtype=amp_dtype) if use_amp else nullcontext()
    # float16 needs loss scaling (its range underflows small gradients); bfloat16 has float32's range
    return amp_ctx, NativeScaler(device_type) if use_amp and amp_dtype == torch.float16 else None


def _training_model(model, args, data_cfg, loss_fn, amp_ctx, steps_left: int):
    """(what the epochs train through, what they evaluate through): torch.compile (--torchcompile, of the model
    itself, before DDP wraps it, as timm's train.py does: DDP stays out of the graph and evaluation runs the same
    compiled module without DDP, except on CUDA: :func:`evaluation_module`); checkpoints use the model itself."""
    probe = partial(probe_compile, model, args, data_cfg['input_size'], loss_fn, amp_ctx)
    compiled, args.torchcompile_used, args.torchcompile_mode_used, reason = resolve_torchcompile(
        args.torchcompile, model, probe, mode=args.torchcompile_mode, steps_left=steps_left, device=args.device)
    eval_model, eval_reason = evaluation_module(model, compiled, args.device)
    reason = [*reason, *([eval_reason] if eval_reason else [])]
    args.torchcompile_reason = '; '.join(reason)
    for line in reason:
        _log(args, f'Compilation: {line}')
    return (DistributedDataParallel(compiled) if args.distributed else compiled), eval_model


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
        if loss_scaler is not None:
            loss_scaler(loss, optimizer, clip_grad=args.clip_grad, clip_mode=args.clip_mode,
                        parameters=model.parameters())
        else:
            loss.backward()
            if args.clip_grad is not None:
                dispatch_clip_grad(model.parameters(), value=args.clip_grad, mode=args.clip_mode)
            optimizer.step()
        num_updates += 1
        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates)
        loss = loss.detach()
        loss_sum.add_(loss)  # float64, as the loss promotes
        seen += images.size(0)
        if batch_idx == num_batches - 1 or (batch_idx + 1) % args.log_interval == 0:
            with host_sync_allowed():
                loss_val, loss_avg = torch.stack([loss.double(), loss_sum / (batch_idx + 1)]).tolist()  # the one sync
            now = time.time()
            rate = seen * args.world_size / max(now - batch_start, 1e-9)
            # time left in this run at this epoch's pace so far (evaluation not counted)
            batches_left = num_batches - batch_idx - 1 + ((num_epochs or epoch + 1) - epoch - 1) * num_batches
            eta = (now - start) / (batch_idx + 1) * batches_left
            _log(args,
                 f'Train: {epoch} [{batch_idx + 1:>4d}/{num_batches} ({100. * (batch_idx + 1) / num_batches:>3.0f}%)]  '
                 f'Loss: {loss_val:#.3g} ({loss_avg:#.3g})  LR: {optimizer.param_groups[0]["lr"]:.3e}  '
                 f'{rate:>7.1f} img/s  ETA {format_duration(eta)}')
            batch_start, seen = time.time(), 0
    return {'loss': loss_avg, 'lr': optimizer.param_groups[0]['lr'], 'time': time.time() - start}, num_updates


def _report(args, metrics: dict, num_epochs: int, run_dir: Path, export) -> None:
    """The result line (and the Hub folder of --export: the best epoch's weights)."""
    checkpoint, best = run_dir / RUN_CHECKPOINT, run_dir / BEST_CHECKPOINT
    split = split_name(args.dataset, args.val_split)
    result = {'model': args.model, 'dataset': args.dataset or 'folder', 'split': split, 'epochs': num_epochs,
              **metrics, 'amp': args.amp_used, 'amp_reason': args.amp_reason, 'torchcompile': args.torchcompile_used,
              'torchcompile_mode': args.torchcompile_mode_used, 'opt_fused': args.opt_fused_used,
              'device_data': args.device_data_used, 'checkpoint': str(checkpoint),
              'best_checkpoint': str(best) if best.is_file() else None}
    if args.export:
        # the best epoch, as a timm user publishes model_best.pth.tar; a run resumed from before model_best was
        # written may lack it (its best epoch is older than the resume): then the last epoch
        exported = best if best.is_file() else checkpoint
        saved = read_checkpoint(exported).meta
        done = saved['epoch']
        recorded = (saved.get('best') or {}).get('epoch')  # counted from 0
        if exported == checkpoint and recorded is not None and recorded != done - 1:
            _log(args, f'warning: no {best.name} in {run_dir} (the run was resumed from before it was written): '
                       f'exporting the last epoch, {done}, although its record names epoch {recorded + 1} '
                       f'as the best by {args.eval_metric} ({metric_text(args.eval_metric, saved["best"]["metric"])})')
        _log(args, f'Exporting {exported.name}: the weights after epoch {done} of {num_epochs} '
                   f'({args.eval_metric} {metric_text(args.eval_metric, saved["metrics"][args.eval_metric])}'
                   f'{", the best" if exported == best else ""})')
        export_dir = run_dir / 'hub'
        with atomic_folder(export_dir) as partial:  # never half a folder, nor two exports mixed
            staged = export(exported, partial)
        result['hub_folder'], result['hub_epoch'] = str(export_dir), done
        _log(args, f'Exported Hub folder {export_dir}: {", ".join(staged)}')
    _log(args, 'Result ' + json.dumps(result))
    _log(args, f'Top-1 on the {args.dataset or "folder"} {split} split: {metrics["top1"]:.2f}%  '
               f'(checkpoint {checkpoint})')


if __name__ == '__main__':
    sys.exit(run_cli(main))
