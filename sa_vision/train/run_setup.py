""" The parts a training run is built of: the process (threads, devices, DDP), the model and its data config, the
optimizer, the loaders, the scheduler, the precision and the compiled model that the epochs of :mod:`.loop` train
"""
import logging
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Optional

import timm
import torch
import torch.distributed as dist
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import NativeScaler, is_primary
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from ..errors import UserError
from ..models import create_named_model, param_groups_pos_lr
from ..models.input_pad import model_input_padding
from .arg_values import check_compile_backend, check_schedule_values, check_scheduler, check_value_bounds
from .caller_settings import RUN_LOG
from .checkpoint import Checkpoint
from .compile_choice import probe_compile, resolve_torchcompile
from .data import check_dataset, create_image_dataset, image_folder_classes, normalization
from .data_fit import check_model_takes_data, pad_value_note
from .device_data import DeviceEvalLoader, DeviceTrainLoader, resolve_device_data
from .evaluation import evaluation_module
from .optimizer import resolve_opt_fused
from .positional_epochs import check_run_positions, positional_params
from .runtime import (
    apply_threads,
    configure_backends,
    import_device_modules,
    init_distributed,
    probe_size,
    resolve_amp,
    retain_freed_memory,
    uses_channels_last,
)
from .state import load_initial_weights

_logger = logging.getLogger(RUN_LOG)


def log_primary(args, msg: str) -> None:
    """Log ``msg`` in the primary process only (one line per run under DDP)."""
    if is_primary(args):
        _logger.info(msg)


def set_up_process(args) -> None:
    """Check what would only fail once the model and the data are built, then set up this process: threads,
    devices and DDP, the modules of --device-modules, backend switches, the allocator."""
    check_value_bounds(args)
    check_schedule_values(args)
    check_scheduler(args.sched, args.sched_on_updates, args.val_interval, args.warmup_epochs)
    check_dataset(args.dataset, data_dir=args.data_dir, download=args.dataset_download,
                  train_split=args.train_split, eval_split=args.val_split)
    threads = apply_threads(args)
    import_device_modules(args.device_modules)
    check_compile_backend(args.torchcompile)
    init_distributed(args)
    configure_backends(args)
    log_primary(args, f'Threads: {threads} (--threads {args.threads or "default"})')
    if args.retain_freed_memory and not retain_freed_memory():
        log_primary(args, '--retain-freed-memory: the C library is not glibc; freed memory is returned as usual')
        args.retain_freed_memory = False


def create_model(args, initial, kwargs_sources=None, resumed=None):
    """The model on its device, and its data config (input size, with the dataset's normalisation, an image
    folder's that of the weights trained on: ``initial`` or the ``resumed`` run's); ``kwargs_sources`` says where
    each of ``args.model_kwargs`` came from (:func:`resolve_model_args`)."""
    model = create_named_model(args.model, pretrained=args.pretrained, kwargs_sources=kwargs_sources,
                               **args.model_kwargs)
    if initial is not None:
        load_initial_weights(model, initial, args, partial(log_primary, args), kwargs_sources)
    num_params = sum(p.numel() for p in model.parameters())
    log_primary(args, f'Model {args.model} {args.model_kwargs or ""} created, {num_params:,} parameters')
    if args.save_epoch_positions and not positional_params(model.state_dict()):
        raise UserError(f'--save-epoch-positions: {args.model} has no Gaussian centres to keep (only the quadratic '
                        f'and generalized kinds have them); drop it, or keep whole weights with --save-epoch-weights')
    if args.save_epoch_positions and resumed is not None:
        check_run_positions(Path(resumed.source).parent, model)
    data_cfg = timm.data.resolve_data_config({'img_size': args.img_size} if args.img_size else {}, model=model)
    weights = resumed or initial
    stated = weights.preprocessing if weights else {}
    data_cfg.update({key: stated[key] for key in ('mean', 'std') if key in stated})  # e.g. Fashion-MNIST's
    data_cfg = {**normalization(args.dataset, data_cfg), 'input_size': list(data_cfg['input_size'])}
    border = model_input_padding(model)
    if border and not args.img_size:  # e.g. a kept Fashion-MNIST model: it pads the unpadded images itself
        data_cfg['input_size'][-2:] = [size - 2 * border for size in data_cfg['input_size'][-2:]]
    check_model_takes_data(args.model, model, args.dataset, data_cfg['input_size'], args.img_size,
                           resumed_from=args.resume if resumed else None,
                           in_chans_from=(kwargs_sources or {}).get('in_chans', '--model-kwargs'))
    if border and (note := pad_value_note(args.model_kwargs.get('input_pad_value'), data_cfg, args.dataset)):
        log_primary(args, note)
    if args.channels_last is None:
        args.channels_last = uses_channels_last(model, args.device)
    model.to(args.device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    return model, data_cfg


def create_optimizer(model, args):
    # timm's weight-decay groups, the positional ones with lr_scale = --pos-lr-scale (timm's schedulers apply it)
    args.opt_fused_used, args.opt_fused_reason = resolve_opt_fused(args.opt_fused, args.opt, args.device)
    fused = 'fused' if args.opt_fused_used else 'not fused'
    log_primary(args, f'Optimizer: {args.opt}, {fused} ({args.opt_fused_reason})')
    return create_optimizer_v2(
        model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum,
        param_group_fn=partial(param_groups_pos_lr, weight_decay=args.weight_decay, pos_lr_scale=args.pos_lr_scale),
        **({'eps': args.opt_eps} if args.opt_eps is not None else {}),
        **({'fused': True} if args.opt_fused_used else {}))


def create_loaders(args, data_cfg):
    """(train loader, eval loader) of this process's shards."""
    norm = {k: v for k, v in data_cfg.items() if k != 'input_size'}
    # an image folder's splits labelled as the training split's classes (a validation split may lack one)
    ds_kwargs = dict(data_dir=args.data_dir, download=args.dataset_download, img_size=data_cfg['input_size'][-1],
                     classes=getattr(args, 'label_names', None), **norm)
    train_ds = create_image_dataset(args.dataset, args.train_split, is_training=True, hflip=args.hflip,
                                    crop_padding=args.train_crop_padding, **ds_kwargs)
    eval_ds = create_image_dataset(args.dataset, args.val_split, is_training=False, **ds_kwargs)
    held, args.device_data_reason = resolve_device_data(
        args.device_data, args.device, train_ds, eval_ds, data_cfg['input_size'][-1], args.train_crop_padding)
    args.device_data_used = held is not None
    log_primary(args, f'Data: {args.device_data_reason}')
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


def create_scheduler(optimizer, args, updates_per_epoch: int, resume_ckpt: Optional[Checkpoint] = None):
    """(timm's scheduler, or None for --sched none, number of epochs); a UserError where the epochs end before
    those the resumed run has done: its files would say 'epoch 4 of 2', its recipe.yaml no longer repeat the run."""
    try:
        scheduler, num_epochs = create_scheduler_v2(
            optimizer, sched=args.sched, num_epochs=args.epochs, decay_epochs=args.decay_epochs,
            decay_milestones=args.decay_milestones, decay_rate=args.decay_rate, patience_epochs=args.patience_epochs,
            min_lr=args.min_lr, warmup_lr=args.warmup_lr,
            warmup_epochs=args.warmup_epochs, warmup_prefix=args.warmup_prefix, cooldown_epochs=args.cooldown_epochs,
            step_on_epochs=not args.sched_on_updates, updates_per_epoch=updates_per_epoch,
            plateau_mode='min' if args.eval_metric == 'loss' else 'max')
    except ValueError as e:  # e.g. wsd's decay longer than the schedule
        units = ' (counted in updates: --sched-on-updates)' if args.sched_on_updates else ''
        warmup = (f'; --warmup-epochs {args.warmup_epochs:g} is not below --epochs {args.epochs}, and {args.sched} '
                  f'fits its warm-up within them: pass fewer, or --warmup-prefix'
                  if args.warmup_epochs >= args.epochs and not args.warmup_prefix else '')
        raise UserError(f'--sched {args.sched}: {e}{units}{warmup}') from None
    # timm counts the epochs down to whole ones (an int --warmup-epochs in its train.py, a float here): a fraction
    # added to them would end the run before its schedule (cosine stopped above its min_lr)
    if args.warmup_prefix and args.warmup_epochs % 1 and scheduler is not None:
        raise UserError(f'--warmup-prefix adds --warmup-epochs {args.warmup_epochs:g} to the epochs, and a run trains '
                        f'whole epochs: its schedule would not end. Give whole warm-up epochs (--warmup-epochs '
                        f'{int(args.warmup_epochs)} or {int(args.warmup_epochs) + 1})')
    num_epochs = int(num_epochs)
    if scheduler is None:  # timm's schedulers apply a group's lr_scale (--pos-lr-scale) at each step; none: once
        for group in optimizer.param_groups:
            group['lr'] *= group.get('lr_scale', 1.0)
    done = resume_ckpt.meta['epoch'] if resume_ckpt is not None else 0
    if num_epochs < done:
        raise UserError(f'--epochs {args.epochs} ends before the run resumed from {args.resume}, which has done '
                        f'{done} epochs: pass --epochs {done} to evaluate it as it is, or more to train on')
    # e.g. the paper's 15 with a short --epochs; --warmup-prefix adds them to the epochs
    if scheduler is not None and args.warmup_epochs >= args.epochs and not args.warmup_prefix:
        log_primary(args, f'note: --warmup-epochs {args.warmup_epochs:g} is not below --epochs {args.epochs}: '
                          f'every step warms up, so the lr only rises toward --lr {args.lr:g} and never decays; '
                          f'pass fewer --warmup-epochs')
    return scheduler, num_epochs


def precision(model, args):
    """(autocast context factory, loss scaler or None); ``args.amp_used`` / ``amp_reason`` say what and why, while
    ``args.amp`` stays what was asked (``-c recipe.yaml`` on another machine decides again)."""
    use_amp, args.amp_reason = resolve_amp(args.amp, args.device, args.amp_dtype, probe_size(model, args.batch_size))
    if args.distributed:  # 'auto' measures on each process: all train in the precision the first one chose
        shared = [use_amp, args.amp_reason]
        dist.broadcast_object_list(shared, src=0)
        use_amp, args.amp_reason = shared
    args.amp_used = args.amp_dtype if use_amp else False
    log_primary(args, f'Precision: {"autocast " + args.amp_dtype if use_amp else "float32"} ({args.amp_reason})')
    amp_dtype, device_type = getattr(torch, args.amp_dtype), torch.device(args.device).type

    def amp_ctx():
        return torch.autocast(device_type, dtype=amp_dtype) if use_amp else nullcontext()
    # float16 needs loss scaling (its range underflows small gradients); bfloat16 has float32's range
    return amp_ctx, NativeScaler(device_type) if use_amp and amp_dtype == torch.float16 else None


def training_model(model, args, data_cfg, loss_fn, amp_ctx, steps_left: int):
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
        log_primary(args, f'Compilation: {line}')
    return (DistributedDataParallel(compiled) if args.distributed else compiled), eval_model


def num_classes_of_folder(args, recipe: dict, log) -> None:
    """An image folder's classes decide ``--num-classes`` where it is not given; a different number (``--num-classes``,
    ``--model-kwargs num_classes=`` or the recipe's) is an error naming both."""
    classes = image_folder_classes(args.dataset, args.data_dir, args.train_split)
    if classes is None:
        return
    if len(classes) == 1:  # the loss is 0 from the start: nothing trains, and 100 % top-1 means nothing
        raise UserError(f'the training split of the image folder {args.data_dir} has one class folder '
                        f'({classes[0]!r}): a classifier needs two or more, each class\'s images in a folder of its '
                        f'own (<split>/<class>/<image>)')
    args.label_names = classes  # the export's label_names: timm's inference.py names its top-k classes by them
    asked = args.num_classes if args.num_classes is not None else args.model_kwargs.get('num_classes')
    if asked is None:
        args.num_classes = len(classes)
        log(f'--num-classes {len(classes)}: the class folders of the training split ({", ".join(classes[:10])}'
            f'{", ..." if len(classes) > 10 else ""})')
    elif int(asked) != len(classes):
        # a paper recipe's num_classes is its dataset's (CIFAR-10): say where the number came from
        source = (f'recipe {args.config} sets num_classes: {asked} for its dataset {recipe.get("dataset")!r}'
                  if recipe.get('num_classes') == asked else '--num-classes / --model-kwargs num_classes')
        raise UserError(f'the model is asked for {asked} classes (the {source}) but the training split of the image '
                        f'folder has {len(classes)} class folders ({", ".join(classes[:10])}'
                        f'{", ..." if len(classes) > 10 else ""}); pass --num-classes {len(classes)} to follow the '
                        f'folder')
