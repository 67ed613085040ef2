""" The zoo, reproduced: one resumable command from a dataset to the five trained, evaluated, exported models

Stages (``sa-vision-reproduce``): train four models from scratch; prune the trained ``sa_gen_cifar`` (paper App. A.1)
and fine-tune ``sa_gen_pruned`` from it; the results table (test split, float32); the Hub folders, figures and
attention explorer; publish (``publish=True``, a dry run otherwise). Each stage writes its result atomically and is
skipped when it exists and was made as asked; a killed training continues from its last epoch (docs/reproduction.md).

Modules: ``profiles`` (what is trained), ``stages`` (:class:`Reproduction`, the pipeline), ``provenance`` (what a
folder records of how its results were made), ``processes`` (its trainings, which die with it and which it can
stop), ``staged`` (:class:`StagedZoo`, the zoo kept model by model within a time budget), ``report`` (evaluation,
tables, figures, explorer), ``kept`` (the check of a kept zoo).
"""
from .kept import (
    ACCURACY_TOLERANCE,
    GUARD_IMAGES,
    SUBSET_IMAGES,
    check_keep_target,
    check_kept_models,
    kept_guard_paths,
    kept_subset_top1,
    logits_tolerance,
    record_kept_models,
)
from .profiles import (
    ABLATION_MODEL,
    ABLATION_VARIANTS,
    PROFILES,
    PRUNED_MODEL,
    TABLE_ORDER,
    TRAINED_MODELS,
    Profile,
    ReproductionError,
    StageFailed,
    StageStopped,
    ablation_run_name,
    check_classes_asked,
)
from .report import EVAL_PRECISION, draw_figures, evaluate_on_test_split
from .staged import STAGE_ORDER, StagedZoo
from .stages import Reproduction

__all__ = ['STAGE_ORDER', 'StagedZoo',
           'TRAINED_MODELS', 'PRUNED_MODEL', 'TABLE_ORDER', 'Profile', 'PROFILES', 'StageFailed', 'StageStopped',
           'ReproductionError', 'Reproduction',
           'ABLATION_MODEL', 'ABLATION_VARIANTS', 'ablation_run_name', 'check_classes_asked', 'evaluate_on_test_split',
           'draw_figures', 'check_keep_target', 'check_kept_models', 'record_kept_models', 'kept_guard_paths',
           'kept_subset_top1', 'logits_tolerance', 'EVAL_PRECISION', 'ACCURACY_TOLERANCE', 'GUARD_IMAGES',
           'SUBSET_IMAGES']
