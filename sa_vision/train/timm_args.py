""" timm ``train.py``'s arguments, and what sa_vision does with each: the one list of them

A recipe serves both trainers (``sa_vision/configs/*.yaml``), and a timm checkpoint holds train.py's ``args``, so
every name of train.py's parser is listed here with its use:

* ``OURS``: ``sa-vision-train`` has an argument of that name and meaning;
* ``TIMM_ONLY``: a training choice only timm's train.py reads: a recipe may hold it (ignored here with a note);
* ``LOCAL``: the run's files, logging or processes in train.py: a recipe may hold it, a published one never does.

The list follows the parser of timm's train.py (main, 1.0.29.dev0); tests/test_timm_train_args.py derives it again
from a checkout's train.py where one is at hand (``SA_VISION_TIMM_CHECKOUT``). The library reads only this module,
which also says what a timm checkpoint's ``args`` mean: the model train.py built, the epochs it trains.
"""
from typing import Any, Collection, Dict, Optional

__all__ = ['OURS', 'TIMM_ONLY', 'LOCAL', 'TIMM_TRAIN_ARGS', 'TIMM_SET_ARGS', 'TIMM_MODEL_KWARGS', 'TIMM_SCHEDULERS',
           'TIMM_ONLY_TECHNIQUES', 'TIMM_VALIDATE_ONLY', 'TIMM_PREPROCESSING', 'timm_only_techniques',
           'timm_model_args', 'timm_data_flags', 'timm_num_epochs', 'model_kwargs_as_timm_args',
           'timm_args_as_model_kwargs']

OURS, TIMM_ONLY, LOCAL = 'ours', 'timm-only', 'local'

# the dest of every argument of train.py's parser, in its order and groups
TIMM_TRAIN_ARGS: Dict[str, str] = {
    'config': OURS,
    # dataset
    'data': LOCAL, 'data_dir': OURS, 'dataset': OURS, 'train_split': OURS, 'val_split': OURS,
    'train_num_samples': TIMM_ONLY, 'val_num_samples': TIMM_ONLY, 'dataset_download': OURS, 'class_map': TIMM_ONLY,
    'input_img_mode': TIMM_ONLY, 'input_key': TIMM_ONLY, 'target_key': TIMM_ONLY,
    'dataset_trust_remote_code': TIMM_ONLY,
    # model
    'model': OURS, 'pretrained': OURS, 'pretrained_path': TIMM_ONLY, 'initial_checkpoint': OURS, 'resume': OURS,
    'no_resume_opt': LOCAL, 'num_classes': OURS, 'gp': TIMM_ONLY, 'img_size': OURS, 'in_chans': TIMM_ONLY,
    'input_size': TIMM_ONLY, 'crop_pct': TIMM_ONLY, 'mean': TIMM_ONLY, 'std': TIMM_ONLY, 'interpolation': TIMM_ONLY,
    'batch_size': OURS, 'validation_batch_size': OURS, 'channels_last': OURS, 'fuser': TIMM_ONLY,
    'grad_accum_steps': TIMM_ONLY, 'grad_checkpointing': TIMM_ONLY, 'fast_norm': TIMM_ONLY, 'model_kwargs': OURS,
    'head_init_scale': TIMM_ONLY, 'head_init_bias': TIMM_ONLY, 'torchcompile_mode': OURS, 'torchscript': TIMM_ONLY,
    'torchcompile': OURS,
    # device
    'device': OURS, 'amp': OURS, 'amp_dtype': OURS, 'model_dtype': TIMM_ONLY, 'no_ddp_bb': LOCAL,
    'synchronize_step': LOCAL, 'local_rank': LOCAL, 'device_modules': OURS,
    # optimizer
    'opt': OURS, 'opt_eps': OURS, 'opt_betas': TIMM_ONLY, 'momentum': OURS, 'weight_decay': OURS, 'clip_grad': OURS,
    'clip_mode': OURS, 'layer_decay': TIMM_ONLY, 'layer_decay_min_scale': TIMM_ONLY,
    'layer_decay_no_opt_scale': TIMM_ONLY, 'opt_kwargs': TIMM_ONLY,
    # learning-rate schedule
    'sched': OURS, 'sched_on_updates': OURS, 'lr': OURS, 'lr_base': TIMM_ONLY, 'lr_base_size': TIMM_ONLY,
    'lr_base_scale': TIMM_ONLY, 'lr_noise': TIMM_ONLY, 'lr_noise_pct': TIMM_ONLY, 'lr_noise_std': TIMM_ONLY,
    'lr_cycle_mul': TIMM_ONLY, 'lr_cycle_decay': TIMM_ONLY, 'lr_cycle_limit': TIMM_ONLY, 'lr_k_decay': TIMM_ONLY,
    'warmup_lr': OURS, 'min_lr': OURS, 'epochs': OURS, 'epoch_repeats': TIMM_ONLY, 'start_epoch': TIMM_ONLY,
    'decay_milestones': OURS, 'decay_epochs': OURS, 'warmup_epochs': OURS, 'warmup_prefix': OURS,
    'cooldown_epochs': OURS, 'patience_epochs': OURS, 'decay_rate': OURS,
    # augmentation and regularization
    'no_aug': TIMM_ONLY, 'train_crop_mode': TIMM_ONLY, 'scale': TIMM_ONLY, 'ratio': TIMM_ONLY, 'hflip': OURS,
    'vflip': TIMM_ONLY, 'color_jitter': TIMM_ONLY, 'color_jitter_prob': TIMM_ONLY, 'grayscale_prob': TIMM_ONLY,
    'gaussian_blur_prob': TIMM_ONLY, 'aa': TIMM_ONLY, 'aug_repeats': TIMM_ONLY, 'aug_splits': TIMM_ONLY,
    'jsd_loss': TIMM_ONLY, 'bce_loss': TIMM_ONLY, 'bce_sum': TIMM_ONLY, 'bce_target_thresh': TIMM_ONLY,
    'bce_pos_weight': TIMM_ONLY, 'reprob': TIMM_ONLY, 'remode': TIMM_ONLY, 'recount': TIMM_ONLY,
    'resplit': TIMM_ONLY, 'mixup': TIMM_ONLY, 'cutmix': TIMM_ONLY, 'cutmix_minmax': TIMM_ONLY,
    'mixup_prob': TIMM_ONLY, 'mixup_switch_prob': TIMM_ONLY, 'mixup_mode': TIMM_ONLY, 'mixup_off_epoch': TIMM_ONLY,
    'smoothing': OURS, 'train_interpolation': TIMM_ONLY, 'drop': OURS, 'drop_connect': TIMM_ONLY, 'drop_path': OURS,
    'drop_block': TIMM_ONLY,
    # batch norm, EMA
    'bn_momentum': TIMM_ONLY, 'bn_eps': TIMM_ONLY, 'sync_bn': TIMM_ONLY, 'dist_bn': TIMM_ONLY, 'split_bn': TIMM_ONLY,
    'model_ema': TIMM_ONLY, 'model_ema_force_cpu': TIMM_ONLY, 'model_ema_decay': TIMM_ONLY,
    'model_ema_warmup': TIMM_ONLY,
    # miscellaneous
    'seed': OURS, 'worker_seeding': TIMM_ONLY, 'log_interval': OURS, 'val_interval': OURS,
    'recovery_interval': LOCAL, 'checkpoint_hist': LOCAL, 'workers': OURS, 'save_images': LOCAL, 'pin_mem': OURS,
    'no_prefetcher': LOCAL, 'output': OURS, 'experiment': OURS, 'eval_metric': OURS, 'tta': TIMM_ONLY,
    'use_multi_epochs_loader': LOCAL, 'log_wandb': LOCAL, 'wandb_project': LOCAL, 'wandb_tags': LOCAL,
    'wandb_resume_id': LOCAL,
    # variable input sizes and sequence lengths (NaFlex)
    'train_img_sizes': TIMM_ONLY, 'train_batch_sizes': TIMM_ONLY, 'train_size_probs': TIMM_ONLY,
    'train_size_schedule': TIMM_ONLY, 'train_size_schedule_spread': TIMM_ONLY, 'train_size_random_mix': TIMM_ONLY,
    'train_batches_per_epoch': TIMM_ONLY, 'variable_batch_loss_scale': TIMM_ONLY, 'naflex_loader': TIMM_ONLY,
    'naflex_train_seq_lens': TIMM_ONLY, 'naflex_max_seq_len': TIMM_ONLY, 'naflex_patch_sizes': TIMM_ONLY,
    'naflex_patch_size_probs': TIMM_ONLY, 'naflex_loss_scale': TIMM_ONLY, 'naflex_patchify_channels_first': TIMM_ONLY,
    # knowledge distillation
    'kd_model_name': TIMM_ONLY, 'kd_distill_type': TIMM_ONLY, 'kd_loss_type': TIMM_ONLY,
    'distill_loss_weight': TIMM_ONLY, 'task_loss_weight': TIMM_ONLY, 'kd_temperature': TIMM_ONLY,
    'kd_student_feature_dim': TIMM_ONLY, 'kd_teacher_feature_dim': TIMM_ONLY, 'kd_token_distill_type': TIMM_ONLY,
}

# the TIMM_ONLY arguments that switch on a training technique sa-vision-train lacks, each with the value that leaves
# it out: timm's default, but for its ImageNet augmentation (random-resized crop, colour jitter), which is on by
# default and which the released code's pad-and-crop replaces. A recipe (a timm args.yaml) holding another value trains
# otherwise under timm's train.py than here.
TIMM_ONLY_TECHNIQUES: Dict[str, Any] = {
    'model_ema': False, 'mixup': 0., 'cutmix': 0., 'cutmix_minmax': None, 'aa': None, 'reprob': 0.,
    'scale': [1., 1.], 'ratio': [1., 1.], 'color_jitter': 0., 'vflip': 0., 'grayscale_prob': None,
    'gaussian_blur_prob': None, 'aug_repeats': 0, 'aug_splits': 0, 'jsd_loss': False, 'bce_loss': False,
    'drop_block': None, 'drop_connect': None, 'bn_momentum': None, 'bn_eps': None, 'layer_decay': None,
    'grad_accum_steps': 1, 'opt_betas': None, 'opt_kwargs': {}, 'lr_noise': None, 'lr_k_decay': 1.,
    'lr_cycle_limit': 1, 'epoch_repeats': 0., 'head_init_scale': None, 'head_init_bias': None,
    'train_num_samples': None, 'kd_model_name': None,
}


def timm_only_techniques(recipe: Dict[str, Any]) -> Dict[str, Any]:
    """The keys of :data:`TIMM_ONLY_TECHNIQUES` that ``recipe`` sets to switch their technique on, with their
    values (None, as train.py's parser leaves an unset option, is off)."""
    return {key: recipe[key] for key, off in TIMM_ONLY_TECHNIQUES.items()
            if recipe.get(key) is not None and recipe[key] != off}


# the dests of timm validate.py's parser (main, 1.0.29.dev0) that sa-vision-validate does not take: refused with a
# pointer to timm's own script (its positional ``data`` folder with one to --data-dir)
TIMM_VALIDATE_ONLY = frozenset({
    'data', 'num_samples', 'class_map', 'input_key', 'input_img_mode', 'target_key', 'dataset_trust_remote_code',
    'img_size', 'in_chans', 'input_size', 'use_train_size', 'crop_pct', 'crop_mode', 'crop_border_pixels', 'mean',
    'std', 'interpolation', 'num_classes', 'gp', 'log_freq', 'num_gpu', 'test_pool', 'no_prefetcher', 'pin_mem',
    'channels_last', 'amp_dtype', 'model_dtype', 'tf_preprocessing', 'fuser', 'fast_norm', 'reparam',
    'torchcompile_mode', 'torchscript', 'torchcompile', 'aot_autograd', 'real_labels', 'valid_labels', 'retry',
    'seed', 'metrics_avg', 'naflex_loader', 'naflex_max_seq_len',
})
# timm's preprocessing options: sa-vision-validate feeds weights what their training fed them
TIMM_PREPROCESSING = frozenset({'img_size', 'input_size', 'crop_pct', 'crop_mode', 'crop_border_pixels', 'mean',
                                'std', 'interpolation', 'use_train_size', 'tf_preprocessing'})

# put on train.py's args after parsing (by train.py, or read there by timm.utils.init_distributed_device), so its
# checkpoints hold them too: all local to a run
TIMM_SET_ARGS = frozenset({'prefetcher', 'distributed', 'world_size', 'rank', 'dist_backend', 'dist_url'})

# the architecture keywords train.py passes to timm.create_model, and the argument each comes from (in_chans: from
# --in-chans, else the first of --input-size)
TIMM_MODEL_KWARGS: Dict[str, str] = {
    'num_classes': 'num_classes', 'in_chans': 'in_chans', 'drop_rate': 'drop', 'drop_path_rate': 'drop_path',
    'drop_block_rate': 'drop_block', 'global_pool': 'gp', 'bn_momentum': 'bn_momentum', 'bn_eps': 'bn_eps',
}

# the --sched names timm.scheduler.create_scheduler_v2 takes
TIMM_SCHEDULERS = ('constant', 'cosine', 'multistep', 'none', 'plateau', 'poly', 'rsqrt', 'step', 'tanh', 'wsd')


def model_kwargs_as_timm_args(saved: Dict[str, Any]) -> Dict[str, Any]:
    """A run's saved arguments with each ``model_kwargs`` keyword that timm's train.py passes to create_model from
    an argument of its own (:data:`TIMM_MODEL_KWARGS`: ``num_classes``, ``global_pool`` from ``--gp``, ...) given
    as that argument: train.py passes ``**args.model_kwargs`` too, and a keyword in both fails its ``-c`` with
    "got multiple values". :func:`timm_args_as_model_kwargs` reads them back."""
    if 'model_kwargs' not in saved:
        return saved
    kwargs = dict(saved['model_kwargs'] or {})
    return {**saved, **{arg: kwargs.pop(key) for key, arg in TIMM_MODEL_KWARGS.items() if key in kwargs},
            'model_kwargs': kwargs}


def timm_args_as_model_kwargs(recipe: Dict[str, Any], ours: Collection[str]) -> Dict[str, Any]:
    """A recipe with timm train.py's create_model arguments that are not ``ours`` (``gp``, ``in_chans``, ...;
    :func:`model_kwargs_as_timm_args` writes them) given as the ``model_kwargs`` keywords they are; None is
    timm's "not given"."""
    moved = {key: recipe[arg] for key, arg in TIMM_MODEL_KWARGS.items()
             if arg not in ours and recipe.get(arg) is not None}
    if not moved:
        return recipe
    rest = {k: v for k, v in recipe.items() if k not in {TIMM_MODEL_KWARGS[key] for key in moved}}
    return {**rest, 'model_kwargs': {**moved, **(recipe.get('model_kwargs') or {})}}


def timm_model_args(args: Dict[str, Any]) -> Dict[str, Any]:
    """The create_model keywords of timm train.py, from its args (None values are dropped, as timm does)."""
    model_args = {key: args.get(name) for key, name in TIMM_MODEL_KWARGS.items()}
    if model_args['in_chans'] is None and args.get('input_size'):
        model_args['in_chans'] = args['input_size'][0]
    model_args.update(args.get('model_kwargs') or {})
    return {k: v for k, v in model_args.items() if v is not None}


def timm_data_flags(args: Dict[str, Any], model_args: Dict[str, Any]) -> Dict[str, Any]:
    """What timm train.py's --input-size / --img-size, --mean and --std fed the weights, where given (else its data
    config was the model's own, which the model keeps)."""
    flags = {k: tuple(args[k]) for k in ('input_size', 'mean', 'std') if args.get(k)}
    if 'input_size' not in flags and args.get('img_size'):
        size = args['img_size']
        chans = args.get('in_chans') or model_args.get('in_chans', 3)
        flags['input_size'] = (chans, *(size if isinstance(size, (list, tuple)) else (size, size)))
    return flags


def timm_num_epochs(args: Dict[str, Any]) -> Optional[int]:
    """The epochs a timm train.py run trains, which its checkpoint does not keep: as train.py counts them, from
    timm's ``create_scheduler_v2`` of its arguments (cooldown for cycle schedules, warmup with --warmup-prefix);
    None where the arguments name no schedule and epochs (a checkpoint of another script) or this timm cannot
    build that schedule."""
    import argparse
    import warnings

    import torch
    from timm.scheduler import create_scheduler_v2, scheduler_kwargs
    if not {'sched', 'epochs'} <= set(args):  # timm's defaults (100 epochs) would be a guess, not the run's
        return None
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.)  # the count needs no real lr
    try:
        with warnings.catch_warnings():  # only counted: timm's advice on the schedule was the run's to read
            warnings.simplefilter('ignore')
            return int(create_scheduler_v2(optimizer, **scheduler_kwargs(argparse.Namespace(**args)),
                                           updates_per_epoch=1)[1])
    except (AssertionError, AttributeError, TypeError, ValueError):  # arguments of another timm version
        return None
