""" The options of ``sa-vision-train``, in timm ``train.py``'s groups and with its names (:data:`ARGUMENT_GROUPS`,
which :func:`sa_vision.train.args.build_parser` puts together), and the values they take """
import argparse

from timm.utils import ParseKwargs

from ..models import DEFAULT_MODEL
from .compile_choice import COMPILE_MODES
from .data import TRAIN_SPLIT, datasets_held_out_as_test
from .optimizer import FUSED_OPTIMIZERS
from .runtime import available_cores, default_threads

__all__ = ['ARGUMENT_GROUPS', 'DEFAULT_OUTPUT', 'ModelKwargs', 'add_threads_argument']


class ModelKwargs(ParseKwargs):
    """timm's ``--model-kwargs`` action (``key=value`` items, values read as Python literals where they are one),
    with an item lacking its ``=`` refused as a usage error naming it (timm's raises a bare ValueError)."""

    def __call__(self, parser, namespace, values, option_string=None):
        for value in values:
            if value and '=' not in value:
                raise argparse.ArgumentError(self, f'{value!r}: key=value expected, e.g. embed_dim=64')
        super().__call__(parser, namespace, values, option_string)


def add_threads_argument(parser_or_group) -> None:
    """``--threads N``, the same in every command that computes (:func:`sa_vision.train.runtime.apply_threads`)."""
    parser_or_group.add_argument(
        '--threads', type=int, default=None, metavar='N',
        help=f"torch's compute threads (default: torch's own count, capped at the cores this process may run on: "
             f"{default_threads()} here). 1 where other work keeps a core busy: waiting threads then slow every "
             f"product down (as OMP_NUM_THREADS=1)")


def _amp_request(value):
    """``--amp`` value: True / False, or 'auto' (decided on the machine that runs, see resolve_amp)."""
    if isinstance(value, bool) or value is None:
        return value
    text = str(value).strip().lower()
    if text == 'auto':
        return 'auto'
    if text in ('1', 'true', 'on', 'yes'):
        return True
    if text in ('0', 'false', 'off', 'no'):
        return False
    raise argparse.ArgumentTypeError(f"--amp takes 'auto', 'on' or 'off', got {value!r}")


def _torchcompile_request(value):
    """``--torchcompile`` value: a backend name, 'auto', or None for eager ('off' / 'none', to override a recipe)."""
    text = '' if value is None or value is False else str(value).strip()
    if text.lower() in ('off', 'none', 'false', '0', ''):
        return None
    return 'auto' if text.lower() == 'auto' else text


def _torchcompile_mode(value):
    """``--torchcompile-mode`` value: one of torch.compile's modes, or None ('none' / 'off', to override a recipe)."""
    text = '' if value is None else str(value).strip()
    if text.lower() in ('none', 'off', ''):
        return None
    if text not in COMPILE_MODES:
        raise argparse.ArgumentTypeError(f'--torchcompile-mode takes one of torch.compile\'s modes '
                                         f'({", ".join(m for m in COMPILE_MODES if m)}) or none, got {value!r}')
    return text


DEFAULT_OUTPUT = 'output/train'


def _output_folder(value: str) -> str:
    """``--output``: an empty one is the default folder, as timm's train.py takes its own default of ''."""
    return value or DEFAULT_OUTPUT


def _dataset_arguments(group) -> None:
    group.add_argument('--data-dir', metavar='DIR', default=None,
                       help='dataset root: download target of torch/ datasets or the ImageFolder (train/, validation/)')
    group.add_argument('--dataset', metavar='NAME', default='digits',
                       help="'digits' (offline, scikit-learn), 'fashion-mnist' (offline: Debian's "
                            "dataset-fashion-mnist or the four IDX files in --data-dir), 'torch/cifar10' (or "
                            "'cifar10', its exports' tag), 'torch/cifar100', another timm <type>/<name> (tfds/, wds/, "
                            "hfds/: with timm's reader's package), or '' (or any other name, which the export's tag "
                            "carries) for an ImageFolder")
    group.add_argument('--train-split', metavar='NAME', default=TRAIN_SPLIT)
    group.add_argument('--val-split', metavar='NAME', default='validation',
                       help=f'held-out split ({datasets_held_out_as_test()} map it to their test split; an '
                            'ImageFolder needs this subfolder)')
    group.add_argument('--dataset-download', action='store_true', default=False,
                       help='download torch/ datasets that are not in --data-dir')


def _model_arguments(group) -> None:
    group.add_argument('--model', default=DEFAULT_MODEL, type=str, metavar='MODEL')
    group.add_argument('--pretrained', action='store_true', default=False, help='start from the published weights')
    group.add_argument('--initial-checkpoint', default='', type=str, metavar='PATH',
                       help='start from these weights (any checkpoint, .safetensors or Hub folder of --model; '
                            'its stored architecture arguments are the defaults of --model-kwargs)')
    group.add_argument('--resume', default='', type=str, metavar='PATH',
                       help='continue the run of this checkpoint (model, optimizer, schedule, epoch; the random '
                            'numbers of each epoch come from --seed and the epoch, as in an unbroken run)')
    group.add_argument('--num-classes', type=int, default=None, metavar='N')
    group.add_argument('--img-size', type=int, default=None, metavar='N', help='image size (default: the model cfg)')
    group.add_argument('-b', '--batch-size', type=int, default=100, metavar='N', help='batch size per process')
    group.add_argument('-vb', '--validation-batch-size', type=int, default=None, metavar='N')
    group.add_argument('--model-kwargs', nargs='*', default={}, action=ModelKwargs,
                       help='architecture arguments, e.g. --model-kwargs embed_dim=64 depth=2 (update the recipe\'s)')
    group.add_argument('--device-modules', default=None, type=str, nargs='+',
                       help='python modules to import first (e.g. a package that registers models)')


def _optimizer_arguments(group) -> None:
    group.add_argument('--opt', default='momentum', type=str, metavar='OPTIMIZER',
                       help="timm's optimizer name (default: momentum, the paper's SGD with momentum, App. A.4; "
                            "timm's default sgd is Nesterov's)")
    group.add_argument('--opt-eps', default=None, type=float, metavar='EPSILON')
    group.add_argument('--opt-fused', default='auto', choices=('auto', 'on', 'off'),
                       help=f"torch's fused optimizer step (one kernel per parameter group; "
                            f"{', '.join(FUSED_OPTIMIZERS)}; adagrad with 'on' only): 'auto' (default) with CUDA "
                            f"only, 'on' also on a CPU, 'off' torch's default (foreach on CUDA, for-loop on a CPU). "
                            f"Equal up to float32 rounding, not bit for bit. args.yaml (opt_fused_used, "
                            f"opt_fused_reason) says which and why; see resolve_opt_fused")
    group.add_argument('--momentum', type=float, default=0.9, metavar='M')
    group.add_argument('--weight-decay', type=float, default=1e-4)
    group.add_argument('--pos-lr-scale', type=float, default=1.0, metavar='SCALE',
                       help='learning-rate multiplier of the positional parameters (Gaussian centres and precision '
                            'factors, the learned kind\'s tables): their own optimizer groups follow the schedule at '
                            'SCALE x lr (sa_vision.models.param_groups_pos_lr; default 1: one learning rate); a '
                            'resumed run keeps its checkpoint\'s scale. For timm\'s train.py: python -m '
                            'sa_vision.train.run_timm --pos-lr-scale SCALE train.py ...')
    group.add_argument('--clip-grad', type=float, default=None, metavar='NORM')
    group.add_argument('--clip-mode', type=str, default='norm', choices=('norm', 'value', 'agc'),
                       help="timm's gradient clipping: the global norm (default), each value, or adaptive (AGC)")


def _schedule_arguments(group) -> None:
    group.add_argument('--sched', type=str, default='cosine', metavar='SCHEDULER')
    group.add_argument('--sched-on-updates', action=argparse.BooleanOptionalAction, default=True,
                       help='step the schedule per iteration (default) rather than per epoch')
    group.add_argument('--lr', type=float, default=0.1, metavar='LR')
    group.add_argument('--warmup-lr', type=float, default=0., metavar='LR')
    group.add_argument('--min-lr', type=float, default=0., metavar='LR')
    group.add_argument('--epochs', type=int, default=300, metavar='N')
    group.add_argument('--warmup-epochs', type=float, default=15, metavar='N',
                       help='linear warm-up length in epochs (may be fractional: 5%% of all steps = 0.05 * epochs)')
    group.add_argument('--warmup-prefix', action='store_true', default=False)
    group.add_argument('--cooldown-epochs', type=int, default=0, metavar='N')
    group.add_argument('--decay-milestones', default=[90, 180, 270], type=int, nargs='+', metavar='MILESTONES')
    group.add_argument('--decay-epochs', type=float, default=None, metavar='N',
                       help="--sched step: epochs between decays; wsd / rsqrt: the decay's length, a fraction of the "
                            "schedule below 1 (default: timm's, 90 epochs for step and 0.2 of the length for wsd)")
    group.add_argument('--decay-rate', '--dr', type=float, default=0.1, metavar='RATE')
    group.add_argument('--patience-epochs', type=int, default=10, metavar='N',
                       help='--sched plateau: epochs without improvement before the lr is lowered')


def _augmentation_arguments(group) -> None:
    group.add_argument('--hflip', type=float, default=0.5, help='horizontal flip probability')
    group.add_argument('--train-crop-padding', type=int, default=4,
                       help='zero padding before the random crop (paper App. A.4); not an argument of timm train.py')
    group.add_argument('--smoothing', type=float, default=0., help='label smoothing')
    group.add_argument('--drop', type=float, default=None, metavar='PCT', help='dropout before the classifier')
    group.add_argument('--drop-path', type=float, default=None, metavar='PCT', help='stochastic depth rate')


def _device_arguments(group) -> None:
    group.add_argument('--device', default=None, type=str, help="'cuda', 'cpu', ... (default: cuda when present)")
    group.add_argument('--amp', nargs='?', const=True, default=None, type=_amp_request, metavar='auto|on|off',
                       help="autocast mixed precision: --amp (on), --no-amp (float32) or --amp auto (on with CUDA; "
                            "on a CPU only where a short matmul probe measures --amp-dtype faster than float32, see "
                            "cpu_autocast_speedup). Default: on with CUDA, off on a CPU. recipe.yaml keeps what was "
                            "asked, args.yaml and the log what was used and why")
    group.add_argument('--no-amp', dest='amp', action='store_const', const=False, help='float32 (as --amp off)')
    group.add_argument('--torchcompile', nargs='?', const='inductor', default=None, type=_torchcompile_request,
                       metavar='BACKEND|auto|off',
                       help="torch.compile the model (timm train.py's option; default backend inductor; 'off' trains "
                            "eagerly whatever the recipe says); training and evaluation run the compiled model, "
                            "except on CUDA, where evaluation runs uncompiled (docs/training.md, \"Precision and "
                            "compilation\"). "
                            "'auto': time the training step eager, compiled with inductor and, on CUDA, compiled "
                            "with CUDA graphs (mode reduce-overhead), each after its compilation, and keep the "
                            "choice of least compile time + remaining steps x step time (see choose_compile); a "
                            "choice that fails to compile is left out. args.yaml and the log say what was used "
                            "and why")
    group.add_argument('--torchcompile-mode', default=None, type=_torchcompile_mode, metavar='MODE',
                       help="torch.compile's mode (timm train.py's option): default, reduce-overhead (CUDA graphs on "
                            "CUDA), max-autotune, max-autotune-no-cudagraphs (default: torch's default). With "
                            "--torchcompile auto: weigh eager against this mode only")
    group.add_argument('--amp-dtype', default='bfloat16', type=str, choices=('bfloat16', 'float16'),
                       help="'bfloat16' (default) or 'float16' (with a gradient scaler, whose every step waits for "
                            "the GPU to say whether the gradients overflowed; bfloat16 steps never wait)")
    group.add_argument('--channels-last', action=argparse.BooleanOptionalAction, default=None,
                       help='channels-last memory layout (default: on with CUDA for models with real convolutions, '
                            'such as resnet18_cifar; see uses_channels_last)')
    group.add_argument('--pin-mem', action=argparse.BooleanOptionalAction, default=None,
                       help='page-locked loader memory for faster host-to-device copies (default: on with CUDA)')
    group.add_argument('--cudnn-benchmark', action='store_true', default=False,
                       help='let cuDNN time its convolution algorithms and keep the fastest: faster on CUDA, but the '
                            'choice may differ between processes, so a resumed run is no longer bit-exact')
    group.add_argument('--tf32', action='store_true', default=False,
                       help='TensorFloat-32 float32 matrix products and convolutions on CUDA (Ampere and later): '
                            'faster, with a 10-bit mantissa in the products (default: off, full float32)')
    group.add_argument('--retain-freed-memory', action=argparse.BooleanOptionalAction, default=None,
                       help='keep the memory a step frees in the process for the next step instead of returning it to '
                            'the kernel (glibc malloc; see retain_freed_memory). Default: on when training on the CPU')
    group.add_argument('--device-data', default='auto', choices=('auto', 'on', 'off'),
                       help="hold the dataset on the training device and shuffle, crop, flip and normalise it there in "
                            "whole batches (sa_vision.train.device_data) instead of a DataLoader: 'on' (an error "
                            "where it cannot: an image folder, too little free memory), 'off', or 'auto' (default: on "
                            "with CUDA for digits, fashion-mnist and torch/cifar10/100 within a safe share of the free "
                            "memory, off on a CPU). The log and args.yaml (device_data_used, device_data_reason) say "
                            "which and why")
    group.add_argument('-j', '--workers', type=int, default=min(4, available_cores()), metavar='N',
                       help="data loading processes (timm's 4, capped at the cores this process may run on)")
    add_threads_argument(group)


def _misc_arguments(group) -> None:
    group.add_argument('--seed', type=int, default=42, metavar='S')
    group.add_argument('--log-interval', type=int, default=50, metavar='N', help='batches between log lines')
    group.add_argument('--val-interval', type=int, default=1, metavar='N',
                       help='epochs between evaluations, as in timm\'s train.py: every N-th epoch and the last '
                            '(default 1: every epoch; --sched plateau needs 1). Unlike train.py every epoch still '
                            'writes last.pth.tar, which --resume continues, and its row of summary.csv; '
                            'model_best.pth.tar is the best of the evaluated epochs')
    group.add_argument('--output', default=DEFAULT_OUTPUT, type=_output_folder, metavar='PATH',
                       help='runs are written here')
    group.add_argument('--experiment', default='', type=str, metavar='NAME',
                       help='run folder name, a folder below --output (default: the time, the model and the dataset)')
    group.add_argument('--eval-metric', default='top1', type=str, choices=('top1', 'top5', 'loss'),
                       help="'top1', 'top5' (higher is better) or 'loss' (lower is better): which epoch is best")
    # --no-...: a resumed run keeps its own value, which only the command line changes
    group.add_argument('--save-epoch-weights', action=argparse.BooleanOptionalAction, default=False,
                       help='also keep the whole weights of every epoch (<run>/epoch-NNN.safetensors, NNN = epochs '
                            'done; 000 = the initialisation); --save-epoch-positions keeps what the centre '
                            'trajectories read of them')
    group.add_argument('--save-epoch-positions', action=argparse.BooleanOptionalAction, default=False,
                       help='keep the centres and precision factors of every epoch, all that the centre trajectories '
                            '(paper Fig. 3), the explorer and an export read of the epochs: a few KiB each, in '
                            '<run>/positional_epochs.safetensors (quadratic and generalized kinds)')
    group.add_argument('--export', action='store_true', default=False,
                       help='after training, write a Hub folder (timm format + model card) to <run>/hub')
    group.add_argument('--target-top1', type=float, default=None,
                       help='exit with status 1 if the final top-1 is below this (for smoke runs)')


ARGUMENT_GROUPS = (('Dataset parameters', _dataset_arguments), ('Model parameters', _model_arguments),
                   ('Optimizer parameters', _optimizer_arguments),
                   ('Learning rate schedule parameters', _schedule_arguments),
                   ('Augmentation and regularization parameters', _augmentation_arguments),
                   ('Device parameters', _device_arguments), ('Miscellaneous parameters', _misc_arguments))
