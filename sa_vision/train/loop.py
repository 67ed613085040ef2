""" Training: a sa_vision model (or any timm model) with timm's library parts, no timm checkout needed

``sa-vision-train`` runs :func:`main` on a recipe (``-c``) in timm ``train.py``'s argument names, overridden by the
command line; it writes ``last.pth.tar`` every epoch, which ``--resume`` continues (docs/training.md).
"""
import importlib
import json
import logging
import sys
import time
from contextlib import nullcontext
from datetime import datetime
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
from timm.utils import NativeScaler, dispatch_clip_grad, is_primary, update_summary
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from .. import models  # noqa: F401  registers the models
from ..errors import UserError, run_cli
from ..models import param_groups_pos_lr
from .args import build_parser, check_scheduler
from .checkpoint import atomic_torch_save
from .data import check_dataset, create_image_dataset, image_folder_classes, normalization, split_name
from .evaluation import evaluate
from .runtime import (
    apply_threads,
    configure_backends,
    format_duration,
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
    parse_run_args,
    resolve_model_args,
    restore,
    save_epoch_weights,
    write_run_files,
)

_logger = logging.getLogger('train')

parser = build_parser()  # the arguments with their built-in defaults, for readers of the argument list


def _parse_args(argv=None):
    """(args, recipe) of a command line (:func:`sa_vision.train.state.parse_run_args` without the checkpoint)."""
    args, recipe, _ = parse_run_args(argv)
    return args, recipe


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
    args, _, resume_ckpt = parse_run_args(argv)
    if args.export and export is None:
        raise UserError('--export writes a Hub folder, which this entry point cannot: run sa-vision-train '
                        '(python -m sa_vision.cli.train) instead')
    _set_up_process(args)
    log = partial(_log, args)
    if resume_ckpt is None:
        _num_classes_of_folder(args, log)
    initial = resolve_model_args(args, resume_ckpt, log)
    seed_epoch(args.seed, 0, args.rank)
    model, data_cfg = _create_model(args, initial)
    optimizer = _create_optimizer(model, args)
    train_loader, eval_loader = _create_loaders(args, data_cfg)
    lr_scheduler, num_epochs = _create_scheduler(optimizer, args, len(train_loader))
    loss_fn = LabelSmoothingCrossEntropy(args.smoothing) if args.smoothing > 0 else nn.CrossEntropyLoss()
    amp_ctx, loss_scaler = _precision(model, args)

    start_epoch, num_updates, history, best = 0, 0, [], None
    if resume_ckpt is not None:
        start_epoch, num_updates, history, best = restore(resume_ckpt, model, optimizer, lr_scheduler, loss_scaler)
        run_dir = Path(args.resume).resolve().parent  # a resumed run continues in its own folder
        log(f'Resuming {run_dir} at epoch {start_epoch}, update {num_updates}')
    else:
        run_dir = Path(args.output) / (args.experiment or '-'.join([
            datetime.now().strftime('%Y%m%d-%H%M%S'), args.model, (args.dataset or 'folder').replace('/', '_')]))
    train_model = _training_model(model, args, data_cfg, loss_fn, amp_ctx)
    if is_primary(args):
        write_run_files(args, run_dir)
        log(f'Run folder {run_dir}; {num_epochs} epochs of {len(train_loader)} steps, '
            f'{args.world_size} process(es) on {args.device}, amp={args.amp_used}')
        if args.save_epoch_weights and start_epoch == 0:
            save_epoch_weights(model, args, run_dir, 0)

    metrics = resume_ckpt.meta.get('metrics') if resume_ckpt else None
    for epoch in range(start_epoch, num_epochs):
        seed_epoch(args.seed, epoch, args.rank)
        train_loader.sampler.set_epoch(epoch)
        train_metrics, num_updates = train_one_epoch(
            epoch, train_model, train_loader, optimizer, loss_fn, lr_scheduler, args, num_updates, amp_ctx,
            loss_scaler, num_epochs)
        metrics = evaluate(model, eval_loader, args.device, amp_ctx=amp_ctx, channels_last=args.channels_last,
                           distributed=args.distributed)
        if lr_scheduler is not None:  # plateau decides on the evaluation metric; the others ignore it
            lr_scheduler.step(epoch + 1, metrics[args.eval_metric] if args.sched == 'plateau' else None)
        log(f'Eval: {epoch}  Loss: {metrics["loss"]:.4f}  Acc@1: {metrics["top1"]:.2f}  '
            f'Acc@5: {metrics["top5"]:.2f}  ({metrics["num_images"]} images)')
        history.append({'epoch': epoch, 'train_loss': train_metrics['loss'], 'lr': train_metrics['lr'],
                        'train_time': train_metrics['time'], **{f'eval_{k}': v for k, v in metrics.items()}})
        if best is None or is_better(args.eval_metric, metrics[args.eval_metric], best['metric']):
            best = {'metric': metrics[args.eval_metric], 'epoch': epoch}
        if is_primary(args):
            ckpt = checkpoint_dict(args, model, optimizer, lr_scheduler, loss_scaler, epochs_done=epoch + 1,
                                   num_epochs=num_epochs, num_updates=num_updates, data_config=data_cfg,
                                   metrics=metrics, history=history, best=best)
            _save(ckpt, model, args, run_dir, train_metrics)
        if args.distributed:
            dist.barrier()

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
    check_scheduler(args.sched, args.sched_on_updates)
    check_dataset(args.dataset, data_dir=args.data_dir, download=args.dataset_download,
                  train_split=args.train_split, eval_split=args.val_split)
    threads = apply_threads(args)
    init_distributed(args)
    for module in args.device_modules or ():
        importlib.import_module(module)
    configure_backends(args)
    _log(args, f'Threads: {threads} (--threads {args.threads or "default"})')
    if args.retain_freed_memory and not retain_freed_memory():
        _log(args, '--retain-freed-memory: the C library is not glibc; freed memory is returned as usual')
        args.retain_freed_memory = False


def _num_classes_of_folder(args, log) -> None:
    """An image folder's classes decide ``--num-classes`` where it is not given; a different explicit number
    (``--num-classes`` or ``--model-kwargs num_classes=``) is an error naming both."""
    classes = image_folder_classes(args.dataset, args.data_dir, args.train_split)
    if classes is None:
        return
    asked = args.num_classes if args.num_classes is not None else args.model_kwargs.get('num_classes')
    if asked is None:
        args.num_classes = len(classes)
        log(f'--num-classes {len(classes)}: the class folders of the training split ({", ".join(classes[:10])}'
            f'{", ..." if len(classes) > 10 else ""})')
    elif int(asked) != len(classes):
        raise UserError(f'the model is asked for {asked} classes (--num-classes / --model-kwargs num_classes) but '
                        f'the training split of the image folder has {len(classes)} class folders '
                        f'({", ".join(classes[:10])}{", ..." if len(classes) > 10 else ""}); leave --num-classes '
                        f'out to follow the folder, or pass --num-classes {len(classes)}')


def _create_model(args, initial):
    """The model on its device, and its data config (input size, with the dataset's normalisation)."""
    model = timm.create_model(args.model, pretrained=args.pretrained, **args.model_kwargs)
    if initial is not None:
        load_initial_weights(model, initial, args, partial(_log, args))
    num_params = sum(p.numel() for p in model.parameters())
    _log(args, f'Model {args.model} {args.model_kwargs or ""} created, {num_params:,} parameters')
    data_cfg = timm.data.resolve_data_config({'img_size': args.img_size} if args.img_size else {}, model=model)
    data_cfg = {**normalization(args.dataset, data_cfg), 'input_size': list(data_cfg['input_size'])}
    if args.channels_last is None:
        args.channels_last = uses_channels_last(model, args.device)
    model.to(args.device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    return model, data_cfg


def _create_optimizer(model, args):
    # timm's weight-decay groups, the positional ones with lr_scale = --pos-lr-scale (timm's schedulers apply it)
    return create_optimizer_v2(
        model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum,
        param_group_fn=partial(param_groups_pos_lr, weight_decay=args.weight_decay, pos_lr_scale=args.pos_lr_scale),
        **({'eps': args.opt_eps} if args.opt_eps is not None else {}))


def _create_loaders(args, data_cfg):
    """(train loader, eval loader) of this process's shards."""
    norm = {k: v for k, v in data_cfg.items() if k != 'input_size'}
    ds_kwargs = dict(data_dir=args.data_dir, download=args.dataset_download, img_size=data_cfg['input_size'][-1],
                     **norm)
    train_ds = create_image_dataset(args.dataset, args.train_split, is_training=True, hflip=args.hflip,
                                    crop_padding=args.train_crop_padding, **ds_kwargs)
    eval_ds = create_image_dataset(args.dataset, args.val_split, is_training=False, **ds_kwargs)
    # one sampler for 1 and N processes: the shuffle order depends only on (seed, epoch)
    train_sampler = DistributedSampler(
        train_ds, num_replicas=args.world_size, rank=args.rank, shuffle=True, seed=args.seed, drop_last=True)
    train_loader = DataLoader(
        train_ds, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers,
        pin_memory=args.pin_mem, drop_last=True, persistent_workers=False)
    if len(train_loader) == 0:
        raise UserError(f'the training split has {len(train_ds)} images, fewer than one batch of '
                        f'{args.batch_size} x {args.world_size} processes; lower --batch-size')
    eval_indices = list(range(args.rank, len(eval_ds), args.world_size))  # disjoint shards, no padding
    eval_loader = DataLoader(
        torch.utils.data.Subset(eval_ds, eval_indices), batch_size=args.validation_batch_size or args.batch_size,
        shuffle=False, num_workers=args.workers, pin_memory=args.pin_mem)
    return train_loader, eval_loader


def _create_scheduler(optimizer, args, updates_per_epoch: int):
    """(timm's scheduler, or None for --sched none, number of epochs)."""
    return create_scheduler_v2(
        optimizer, sched=args.sched, num_epochs=args.epochs, decay_milestones=args.decay_milestones,
        decay_rate=args.decay_rate, min_lr=args.min_lr, warmup_lr=args.warmup_lr,
        warmup_epochs=args.warmup_epochs, warmup_prefix=args.warmup_prefix, cooldown_epochs=args.cooldown_epochs,
        step_on_epochs=not args.sched_on_updates, updates_per_epoch=updates_per_epoch,
        plateau_mode='min' if args.eval_metric == 'loss' else 'max')


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


def _training_model(model, args, data_cfg, loss_fn, amp_ctx):
    """What the epochs train through: DDP around the model, then torch.compile as timm's train.py does;
    evaluation and checkpoints use the model itself."""
    ddp_model = DistributedDataParallel(model) if args.distributed else model
    train_model, args.torchcompile_used, args.torchcompile_reason = resolve_torchcompile(
        args.torchcompile, ddp_model, partial(probe_compile, ddp_model, args, data_cfg['input_size'], loss_fn, amp_ctx))
    _log(args, f'Compilation: {args.torchcompile_reason}')
    return train_model


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, lr_scheduler, args, num_updates, amp_ctx,
                    loss_scaler: Optional[NativeScaler] = None, num_epochs=None):
    model.train()
    # the running loss stays on the device: reading it is a host sync, done only for the log lines
    loss_sum = torch.zeros((), dtype=torch.float64, device=args.device)
    loss_count = torch.zeros((), dtype=torch.float64, device=args.device)
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
        loss_sum += loss.double() * images.size(0)
        loss_count += images.size(0)
        seen += images.size(0)
        if batch_idx == num_batches - 1 or (batch_idx + 1) % args.log_interval == 0:
            loss_val, loss_avg = torch.stack([loss.double(), loss_sum / loss_count]).tolist()  # the one host sync
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


def _save(ckpt: dict, model, args, run_dir: Path, train_metrics: dict) -> None:
    """An epoch's files: its weights with --save-epoch-weights, ``last.pth.tar``, a row of ``summary.csv``."""
    epoch, num_epochs = ckpt['epoch'] - 1, ckpt['num_epochs']
    if args.save_epoch_weights:
        save_epoch_weights(model, args, run_dir, epoch + 1)
    atomic_torch_save(ckpt, run_dir / 'last.pth.tar')
    update_summary(epoch, train_metrics, ckpt['metrics'], run_dir / 'summary.csv', write_header=epoch == 0)
    _log(args, f'Saved checkpoint epoch {epoch + 1}/{num_epochs} to {run_dir / "last.pth.tar"}')


def _report(args, metrics: dict, num_epochs: int, run_dir: Path, export) -> None:
    """The result line (and the Hub folder of --export)."""
    checkpoint = run_dir / 'last.pth.tar'
    split = split_name(args.dataset, args.val_split)
    result = {'model': args.model, 'dataset': args.dataset or 'folder', 'split': split, 'epochs': num_epochs,
              **metrics, 'amp': args.amp_used, 'amp_reason': args.amp_reason, 'torchcompile': args.torchcompile_used,
              'checkpoint': str(checkpoint)}
    if args.export:
        export_dir = run_dir / 'hub'
        staged = export(checkpoint, export_dir)
        result['hub_folder'] = str(export_dir)
        _log(args, f'Exported Hub folder {export_dir}: {", ".join(staged)}')
    _log(args, 'Result ' + json.dumps(result))
    _log(args, f'Top-1 on the {args.dataset or "folder"} {split} split: {metrics["top1"]:.2f}%  '
               f'(checkpoint {checkpoint})')


if __name__ == '__main__':
    sys.exit(run_cli(main))
