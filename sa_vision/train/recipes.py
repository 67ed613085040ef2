""" Training recipes: ``sa_vision/configs/<name>.yaml`` in the argument names of timm's ``train.py``

Read by both trainers with ``parser.set_defaults`` (the command line overrides them), the one place the paper's
hyper-parameters (App. A.4) are written down. Unknown keys are errors: a misspelt ``lr_rate`` must not pass. """
import difflib
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Union

from ..errors import RecipeError, RecipeNotFoundError

__all__ = ['RECIPE_DIR', 'TIMM_ONLY_RECIPE_KEYS', 'recipe_path', 'load_recipe', 'check_recipe_keys']

# keys that only timm's train.py reads: allowed, so one recipe serves both trainers, and ignored with a note
# (tests/test_timm_train_args.py checks them against a timm checkout's train.py)
TIMM_ONLY_RECIPE_KEYS = frozenset({
    # dataset and input
    'data', 'class_map', 'train_num_samples', 'val_num_samples', 'input_img_mode', 'input_key',
    'target_key', 'dataset_trust_remote_code', 'gp', 'in_chans', 'input_size', 'crop_pct', 'mean', 'std',
    'interpolation', 'train_interpolation',
    # model and compilation
    'pretrained_path', 'no_resume_opt', 'fuser', 'grad_accum_steps', 'grad_checkpointing', 'fast_norm',
    'head_init_scale', 'head_init_bias', 'torchscript', 'model_dtype',
    # optimizer and schedule
    'opt_betas', 'layer_decay', 'layer_decay_min_scale', 'layer_decay_no_opt_scale', 'opt_kwargs', 'lr_base',
    'lr_base_size', 'lr_base_scale', 'lr_noise', 'lr_noise_pct', 'lr_noise_std', 'lr_cycle_mul', 'lr_cycle_decay',
    'lr_cycle_limit', 'lr_k_decay', 'epoch_repeats', 'start_epoch', 'decay_epochs', 'patience_epochs',
    # augmentation and regularization
    'no_aug', 'scale', 'ratio', 'vflip', 'color_jitter', 'color_jitter_prob', 'grayscale_prob', 'gaussian_blur_prob',
    'aa', 'aug_repeats', 'aug_splits', 'jsd_loss', 'bce_loss', 'bce_sum', 'bce_target_thresh', 'bce_pos_weight',
    'reprob', 'remode', 'recount', 'resplit', 'mixup', 'cutmix', 'cutmix_minmax', 'mixup_prob', 'mixup_switch_prob',
    'mixup_mode', 'mixup_off_epoch', 'drop_connect', 'drop_block',
    # batch norm, EMA
    'bn_momentum', 'bn_eps', 'sync_bn', 'dist_bn', 'split_bn', 'model_ema', 'model_ema_force_cpu', 'model_ema_decay',
    'model_ema_warmup',
    # machine, process and logging
    'no_ddp_bb', 'synchronize_step', 'no_prefetcher', 'worker_seeding', 'recovery_interval',
    'checkpoint_hist', 'save_images', 'tta', 'use_multi_epochs_loader', 'log_wandb', 'wandb_project', 'wandb_tags',
    'wandb_resume_id',
})

# shipped inside the package (package data), so an installed sa_vision finds them
RECIPE_DIR = Path(__file__).resolve().parent.parent / 'configs'


def recipe_path(name: str) -> Path:
    """Path of the recipe ``name`` (a file path, or the name of a file in ``sa_vision/configs``)."""
    path = Path(name)
    if path.suffix in ('.yaml', '.yml') and path.exists():
        return path
    candidate = RECIPE_DIR / f'{name}.yaml'
    if candidate.exists():
        return candidate
    known = sorted(p.stem for p in RECIPE_DIR.glob('*.yaml')) if RECIPE_DIR.is_dir() else []
    raise RecipeNotFoundError(f'no recipe {name!r}: not a YAML file and not one of {known} in {RECIPE_DIR}')


def load_recipe(name: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Read a recipe into a dict of argument defaults (keys with '-' are accepted as '_')."""
    import yaml
    path = recipe_path(str(name))
    with open(path) as f:
        recipe = yaml.safe_load(f) or {}
    if not isinstance(recipe, dict):
        raise RecipeError(f'recipe {path} must be a mapping of argument names to values, got {type(recipe).__name__}')
    return {k.replace('-', '_'): v for k, v in recipe.items()}


def check_recipe_keys(keys: Iterable[str], known: Iterable[str], source: str = 'the recipe') -> List[str]:
    """The keys that only timm's train.py reads (to be ignored with a note); any other unknown key raises a
    RecipeError naming the nearest known key."""
    known = set(known)
    unknown = sorted(k for k in keys if k not in known and k not in TIMM_ONLY_RECIPE_KEYS)
    if unknown:
        candidates = sorted(known | TIMM_ONLY_RECIPE_KEYS)
        parts = []
        for key in unknown:
            near = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
            parts.append(f'{key!r}' + (f' (did you mean {near[0]!r}?)' if near else ''))
        raise RecipeError(f'{source} has the unknown key(s) {", ".join(parts)}: neither sa-vision-train nor timm\'s '
                          f'train.py reads them. Fix or remove them (timm-only keys are listed in '
                          f'sa_vision.train.recipes.TIMM_ONLY_RECIPE_KEYS)')
    return sorted(k for k in keys if k not in known)
