""" What the reproduction trains: the models of the paper's table, the profiles (recipe changes per model, as
data) and this repository's ablation of the positional parameters (the paper has none; its Sec. 4.2 states the
initialisation); :class:`StageFailed`, how a stage fails, and
the subclass :class:`StageStopped`, how it is stopped, and :class:`ReproductionError`, options or files that do not
fit """
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from ..errors import UserError
from ..models import SA_MODEL_ARGS
from ..paper import PAPER_RESULTS, PRUNED_FROM
from ..research.analysis import GAUSSIAN_KINDS
from ..research.pruning import PRUNED_ARCH
from ..train.data import dataset_info, image_folder_classes
from ..train.recipes import load_recipe

__all__ = ['TABLE_ORDER', 'PRUNE_SOURCE', 'PRUNED_MODEL', 'TRAINED_MODELS', 'Profile', 'PROFILES',
           'apply_recipe_changes', 'ABLATION_MODEL', 'ABLATION_POS_LR_SCALE', 'ABLATION_VARIANTS',
           'ablation_run_name', 'check_classes_asked', 'StageFailed', 'StageStopped', 'ReproductionError']

TABLE_ORDER = tuple(PAPER_RESULTS)  # the models of the paper's table, in its order
PRUNED_MODEL = PRUNED_ARCH  # made from PRUNE_SOURCE; every other model of the table is trained from scratch
PRUNE_SOURCE = PRUNED_FROM[PRUNED_MODEL]
TRAINED_MODELS = tuple(model for model in TABLE_ORDER if model != PRUNED_MODEL)


@dataclass(frozen=True)
class Profile:
    """How the five models are trained: recipe changes per model (``{}``: the paper's recipe unchanged)."""
    name: str
    description: str
    dataset: str  # the default dataset
    common: Dict[str, Any] = field(default_factory=dict)  # changes to every recipe
    per_model: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # and to one model's
    table_note: str = ''  # printed under the results table: how to read its numbers
    kept_dtype: str = 'float32'  # the dtype of the exported weights; the table reports the weights as kept
    needs_gpu: bool = False  # its trainings are meant for a GPU (sa-vision-reproduce refuses it without one)

    def recipe(self, model: str, dataset: str, epochs: Optional[int] = None) -> Dict[str, Any]:
        """The recipe of ``model``'s stage: the paper's recipe of the model with this profile's changes."""
        recipe = load_recipe(model)
        for changes in (self.common, self.per_model.get(model, {})):
            apply_recipe_changes(recipe, changes)
        info = dataset_info(dataset)
        recipe.update(dataset=info.name, val_split=info.eval_split)
        if info.num_classes:
            recipe['num_classes'] = info.num_classes
        elif info.is_image_folder:  # sa-vision-train counts its class folders; the recipe's 10 are CIFAR-10's
            recipe.pop('num_classes', None)
        if epochs is not None:
            recipe.update(_epochs(epochs))
        recipe.pop('initial_checkpoint', None)  # given per run
        return recipe


def check_classes_asked(dataset: str, data_dir: Optional[str], asked) -> None:
    """A :class:`ReproductionError` where the training arguments added to every stage (``asked``: --train-args as
    sa-vision-train parses them) ask for another number of classes than the image folder ``dataset`` has class
    folders: the first training would stop on it, advising an option of sa-vision-train."""
    number = asked.num_classes if asked.num_classes is not None else asked.model_kwargs.get('num_classes')
    classes = image_folder_classes(dataset, data_dir, asked.train_split) if number is not None else None
    if classes is not None and int(number) != len(classes):
        raise ReproductionError(
            f'--train-args asks every training stage for {number} classes, but the training split of the image '
            f'folder has {len(classes)} class folders ({", ".join(classes[:10])}{", ..." if len(classes) > 10 else ""}'
            f'): leave --num-classes (and num_classes of --model-kwargs) out of --train-args, and each stage takes '
            f'the folder\'s {len(classes)} classes')


def keeps_epoch_positions(model: str) -> bool:
    """Whether a reproduction keeps ``model``'s centres and precision factors after every epoch (for their
    trajectories, paper Fig. 3): only the Gaussian kinds have them."""
    return (SA_MODEL_ARGS[model].get('attn_kind', 'quadratic') if model in SA_MODEL_ARGS else None) in GAUSSIAN_KINDS


def _epochs(epochs: int) -> Dict[str, Any]:
    """``epochs`` with the warm-up over 5 % of them, as every profile warms up."""
    return {'epochs': epochs, 'warmup_epochs': round(0.05 * epochs, 3)}


# the Gaussian kinds' positional learning rate: otherwise their centres stay at their random start (paper Figs. 3-4)
_GAUSSIAN_POS_LR = {'pos_lr_scale': 30.0}
# narrower attention models with the paper's depth (6 layers) and heads (9 per layer); positional defaults written out
_NARROW_SA = {'model_kwargs': {'embed_dim': 64, 'mlp_hidden_dim': 128, 'proj_drop_rate': 0.0, 'attn_drop_rate': 0.0,
                               'pos_init': 'paper', 'pos_init_alpha': 6.0}, 'pos_lr_scale': 1.0}
# few epochs: AdamW converges in far fewer steps than the paper's SGD at lr 0.1 (300 epochs)
_FEW_EPOCHS = dict(opt='adamw', lr=2e-3, weight_decay=0.05, momentum=0.9, batch_size=100, validation_batch_size=500,
                   sched='cosine', sched_on_updates=True, warmup_lr=0.0, min_lr=0.0, cooldown_epochs=0, workers=0,
                   log_interval=100)
_GPU_LONG = _epochs(50)  # about 10x the cpu profile's 5-6 epochs
_HALF_WIDTH_RESNET = {'channels': (32, 64, 128, 256)}  # ResNet18's stages at half width
# the pruned model's fine-tuning: its architecture comes from the pruned weights, so only dropout and the lr are set
_PRUNED_FINE_TUNING = {'model_kwargs': {'proj_drop_rate': 0.0, 'attn_drop_rate': 0.0}, 'lr': 5e-4}
_TINY_SA = {'model_kwargs': {'embed_dim': 16, 'depth': 2, 'heads_per_layer': 3, 'mlp_hidden_dim': 32,
                             'proj_drop_rate': 0.0, 'attn_drop_rate': 0.0}}

PROFILES: Dict[str, Profile] = {
    'paper': Profile(
        'paper', "CIFAR-10 with the shipped recipes unchanged (300 epochs; a GPU and the CIFAR-10 download)",
        'torch/cifar10', needs_gpu=True),
    'cpu': Profile(
        'cpu', "narrower models (embedding 64, MLP 128; the paper's 6 layers of 9 heads; ResNet18's stages at half "
               "width, timm's 64-channel stem), AdamW, a few epochs: Fashion-MNIST (or digits) on a 2-core CPU, "
               "about 100 minutes in bf16 (AMX), 5-7 hours in float32",
# why each choice: docs/reproduction.md ("The `cpu` profile", "Choosing the profile"); torchcompile is speed only
        'fashion-mnist', common={**_FEW_EPOCHS, 'amp': 'auto', 'torchcompile': 'auto', 'batch_size': 50,
                                 'train_crop_padding': 0},
        per_model={
            'sa_quadratic_cifar': {**_NARROW_SA, **_GAUSSIAN_POS_LR, **_epochs(6)},
            'sa_gen_cifar': {**_NARROW_SA, **_GAUSSIAN_POS_LR, **_epochs(5)},
            'sa_learned_cifar': {**_NARROW_SA, **_epochs(6)},
            # as many epochs as the quadratic model: the comparison is at equal epochs
            'resnet18_cifar': {'model_kwargs': _HALF_WIDTH_RESNET, **_epochs(6)},
            'sa_gen_pruned': {**_PRUNED_FINE_TUNING, **_GAUSSIAN_POS_LR, **_epochs(1)},
        },
        table_note=('Choices of the `cpu` profile (`sa_vision.reproduce.PROFILES[\'cpu\']`): AdamW lr 2e-3, batch 50, '
                    'cosine per step, no pad-and-crop (horizontal flips only) because a few epochs underfit rather '
                    'than overfit; `pos_lr_scale` 30 for the Gaussian kinds so that their centres and precision '
                    'factors learn (one learning rate leaves them at their random start); `amp: auto` decided bf16 or '
                    'float32 by measuring the CPU (the `amp` column), and `torchcompile: auto` compiled the training '
                    'step only where a probe measured it faster (speed only). The ResNet trains as many epochs as the '
                    'quadratic model.')),
    # how each choice was made and the device-minute estimate: docs/reproduction.md ("The gpu-long profile")
    'gpu-long': Profile(
        'gpu-long', "the cpu profile's five models and widths trained about 10x longer (50 epochs each from scratch) "
                    'with batch 256 on a GPU; weights kept in bf16 (zoo/fashion-mnist-gpu, trained on an H100 and '
                    'an H200)',
        'fashion-mnist',
        # the flags that trained the cpu profile's five stages on an H100 (docs/performance.md, "On a GPU, compiled")
        common={**_FEW_EPOCHS, 'batch_size': 256, 'train_crop_padding': 0, 'amp': 'auto', 'amp_dtype': 'bfloat16',
                'torchcompile': 'inductor', 'torchcompile_mode': 'reduce-overhead', 'device_data': 'auto'},
        per_model={
            'sa_quadratic_cifar': {**_NARROW_SA, **_GAUSSIAN_POS_LR, **_GPU_LONG},
            'sa_gen_cifar': {**_NARROW_SA, **_GAUSSIAN_POS_LR, **_GPU_LONG},
            'sa_learned_cifar': {**_NARROW_SA, **_GPU_LONG},
            'resnet18_cifar': {'model_kwargs': _HALF_WIDTH_RESNET, **_GPU_LONG},
            # 10 % of the source's epochs, as in the cpu profile (1 of 5)
            'sa_gen_pruned': {**_PRUNED_FINE_TUNING, **_GAUSSIAN_POS_LR, **_epochs(5)},
        },
        table_note=('Choices of the `gpu-long` profile (`sa_vision.reproduce.PROFILES[\'gpu-long\']`): the `cpu` '
                    'profile\'s models, widths and recipe (AdamW lr 2e-3, no pad-and-crop, `pos_lr_scale` 30 for '
                    'the Gaussian kinds, warm-up over 5 % of the steps, cosine per step) with 50 epochs for every '
                    'model trained from scratch and 5 of fine-tuning for the pruned one, at batch 256 (the narrow '
                    'models are bound by kernel launches on a GPU: a larger batch costs little more per step) in '
                    'bf16 autocast, compiled with CUDA graphs (inductor, `reduce-overhead`) and the data on the '
                    'GPU. The weights are kept in bf16; top-1 / top-5 are those of the kept bf16 '
                    'weights, evaluated in float32.'),
        kept_dtype='bfloat16', needs_gpu=True),
    'tiny': Profile(
        'tiny', 'tiny models, 2 epochs each: the mechanics in about two minutes (CI)', 'digits',
        # printed under the table of any --dataset and --epochs: true of each (chance: 1 / the number of classes)
        table_note=('The `tiny` profile checks the mechanics (training, resuming, pruning, fine-tuning, export), not '
                    'the models: attention models of 2 layers of 3 heads of width 16 trained for a few epochs stay '
                    'close to chance, a top-1 of 100 % over the number of classes (10 % on digits; the small ResNet '
                    'learns faster), and their heads rarely become degenerate, so the pruned model usually keeps '
                    'every head (pruning.json). This is expected; the `cpu` and `paper` profiles train real models.'),
        common={**_FEW_EPOCHS, 'batch_size': 64, 'validation_batch_size': 360, 'log_interval': 10, 'hflip': 0.0,
                'train_crop_padding': 0},
        per_model={
            **{model: {**_TINY_SA, **_epochs(2)} for model in TRAINED_MODELS if model in SA_MODEL_ARGS},
            # 4-32 channels: at 8-64 each step took 1.8x as long on a CI core, where this profile runs often
            'resnet18_cifar': {'model_kwargs': {'channels': (4, 8, 16, 32)}, **_epochs(2)},
            'sa_gen_pruned': {**_PRUNED_FINE_TUNING, **_epochs(1)},
        }),
}


def apply_recipe_changes(recipe: Dict[str, Any], changes: Dict[str, Any]) -> Dict[str, Any]:
    """``recipe`` with ``changes`` set in place; ``model_kwargs`` are updated key by key, as ``--model-kwargs`` does."""
    for key, value in changes.items():
        if key == 'model_kwargs':
            recipe['model_kwargs'] = {**(recipe.get('model_kwargs') or {}), **value}
        else:
            recipe[key] = value
    return recipe


# this repository's ablation of the positional parameters (paper Sec. 4.2 states only the initialisation):
# random or Theorem 1 init, base or 30x positional lr
ABLATION_MODEL = 'sa_quadratic_cifar'
ABLATION_POS_LR_SCALE = _GAUSSIAN_POS_LR['pos_lr_scale']
ABLATION_VARIANTS: Dict[str, Dict[str, Any]] = {
    'paper init': {'model_kwargs': {'pos_init': 'paper'}, 'pos_lr_scale': 1.0},
    f'paper init, positional lr x{ABLATION_POS_LR_SCALE:g}': {
        'model_kwargs': {'pos_init': 'paper'}, 'pos_lr_scale': ABLATION_POS_LR_SCALE},
    'conv init (Theorem 1)': {'model_kwargs': {'pos_init': 'conv'}, 'pos_lr_scale': 1.0},
    f'conv init (Theorem 1), positional lr x{ABLATION_POS_LR_SCALE:g}': {
        'model_kwargs': {'pos_init': 'conv'}, 'pos_lr_scale': ABLATION_POS_LR_SCALE},
}


def ablation_run_name(variant: str) -> str:
    """The run folder of an ablation variant: ``ablation-paper-init-positional-lr-x30``, ..."""
    slug = ''.join(c if c.isalnum() else '-' for c in variant.lower())
    return 'ablation-' + '-'.join(part for part in slug.split('-') if part)


class StageFailed(RuntimeError):
    """A stage of the reproduction failed; the finished stages are kept."""


class StageStopped(StageFailed):
    """A training stopped from outside (``Reproduction.stop``, or a SIGTERM): its run folder keeps its last finished
    epoch, which the next training of that folder continues."""


class ReproductionError(UserError):
    """Options, folders or files that do not fit what was asked (a reproduction folder of other options, a kept zoo
    or table that is not there): nothing was run; the message says what to do."""
