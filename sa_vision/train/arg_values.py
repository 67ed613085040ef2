""" The values the training arguments may take, checked before any work (on the command line or from a recipe):
one :class:`RecipeError` naming the argument, where torch and timm would fail only deep inside, or train on
nonsense without a word """
import difflib
import math
from typing import Dict, NamedTuple, Optional

from ..errors import RecipeError
from .timm_args import TIMM_SCHEDULERS

__all__ = ['Bounds', 'VALUE_BOUNDS', 'FLAG_KWARGS', 'check_compile_backend', 'check_value_bounds',
           'check_schedule_values', 'check_scheduler', 'command_line_kwargs_over_recipe_flags']

# the keywords of create_model that arguments of their own set: (keyword, argument, flag)
FLAG_KWARGS = (('num_classes', 'num_classes', '--num-classes'), ('drop_rate', 'drop', '--drop'),
               ('drop_path_rate', 'drop_path', '--drop-path'))


class Bounds(NamedTuple):
    """The values a number may take, each bound inclusive (``least`` / ``most``) or not (``above`` / ``below``)."""
    least: Optional[float] = None
    above: Optional[float] = None
    most: Optional[float] = None
    below: Optional[float] = None

    def breach(self, value) -> Optional[str]:
        """What is wrong with ``value``, in words, or None."""
        if isinstance(value, float) and not math.isfinite(value):
            return 'it must be a finite number'
        if self.least is not None and value < self.least:
            return f'it must be at least {self.least}'
        if self.above is not None and value <= self.above:
            return f'it must be more than {self.above}'
        if self.most is not None and value > self.most:
            return f'it must be at most {self.most}'
        if self.below is not None and value >= self.below:
            return f'it must be less than {self.below}'
        return None


_PROBABILITY = Bounds(least=0., most=1.)
_RATE = Bounds(least=0., below=1.)  # a share dropped or smoothed away: all of it would leave nothing to learn
# the numbers of sa-vision-train, -validate and -benchmark (each checks those it takes) that timm and torch refuse
# only deep inside (the scheduler's bare AssertionError, the DataLoader's ValueError, a division by zero) or take
# without a word: a negative --clip-grad turns the gradients round, --num-classes 0 trains no classifier
VALUE_BOUNDS: Dict[str, Bounds] = {
    'epochs': Bounds(least=1), 'batch_size': Bounds(least=1), 'validation_batch_size': Bounds(least=1),
    'workers': Bounds(least=0), 'threads': Bounds(least=1), 'log_interval': Bounds(least=1),
    'val_interval': Bounds(least=1), 'num_classes': Bounds(least=1), 'img_size': Bounds(least=1),
    'lr': Bounds(least=0.), 'warmup_lr': Bounds(least=0.), 'min_lr': Bounds(least=0.),
    'momentum': Bounds(least=0., most=1.), 'weight_decay': Bounds(least=0.), 'clip_grad': Bounds(above=0.),
    'warmup_epochs': Bounds(least=0.), 'decay_epochs': Bounds(above=0.), 'train_crop_padding': Bounds(least=0),
    'hflip': _PROBABILITY, 'smoothing': _RATE, 'drop': _RATE, 'drop_path': _RATE,
    'num_warm_iter': Bounds(least=0), 'num_bench_iter': Bounds(least=1), 'runs': Bounds(least=0),  # 0: no timing
    'matmul_size': Bounds(least=1),
    # the schedule's and optimizer's: a negative cooldown shortens the run, a rate of nan or below 0 trains on nan
    # or climbs the loss, each without a word; a negative epsilon is torch's traceback
    'cooldown_epochs': Bounds(least=0.), 'patience_epochs': Bounds(least=0.), 'decay_rate': Bounds(above=0.),
    'decay_milestones': Bounds(above=0.), 'opt_eps': Bounds(least=0.),
}


def check_scheduler(sched: str, sched_on_updates: bool, val_interval: int = 1, warmup_epochs: float = 0.) -> None:
    """A :class:`RecipeError` for a ``--sched`` timm does not know (naming the ones it does) or a schedule it cannot
    step as asked; run before anything is built, where timm would only fail at the end of the first epoch, or
    train an epoch at the warm-up's first lr."""
    if sched not in TIMM_SCHEDULERS:
        near = difflib.get_close_matches(sched, TIMM_SCHEDULERS, n=1, cutoff=0.6)
        raise RecipeError(f'--sched {sched!r} is not a scheduler of timm' + (f' (did you mean {near[0]!r}?)' if near
                          else '') + f'; timm\'s schedulers are {", ".join(TIMM_SCHEDULERS)}')
    if sched == 'plateau' and sched_on_updates:
        raise RecipeError("--sched plateau lowers the lr when the evaluation metric stops improving, once per epoch: "
                          "add --no-sched-on-updates (the recipe's sched_on_updates: false)")
    if sched == 'plateau' and val_interval > 1:
        # its patience counts evaluations: --val-interval would change the training, which it must not
        raise RecipeError(f'--sched plateau lowers the lr when the evaluation metric stops improving, so it needs an '
                          f'evaluation every epoch; --val-interval {val_interval} would make its patience '
                          f'{val_interval}x as many epochs: leave --val-interval at 1')
    if sched != 'none' and not sched_on_updates and warmup_epochs % 1:
        # stepped per epoch, timm's warm-up gives epoch 0 its first lr (--warmup-lr, 0 in the recipes) and epoch 1
        # the full one: a fraction of a warm-up epoch becomes a whole epoch at that lr
        raise RecipeError(f'--warmup-epochs {warmup_epochs} is a fraction of an epoch, but --no-sched-on-updates steps '
                          f'the schedule once per epoch: epoch 0 would train at --warmup-lr alone. Give whole '
                          f'warm-up epochs (--warmup-epochs {int(warmup_epochs)} or {int(warmup_epochs) + 1}), or '
                          f'step per update (--sched-on-updates)')


def check_schedule_values(args) -> None:
    """A :class:`RecipeError` for values each in bounds that together train other than they say, where timm
    would go on without a word or fail inside torch."""
    milestones = list(getattr(args, 'decay_milestones', None) or [])
    if args.sched == 'multistep' and milestones != sorted(set(milestones)):  # timm bisects them, sorted
        raise RecipeError(f'--decay-milestones {" ".join(map(str, milestones))}: give them increasing, each once')
    for name in ('min_lr', 'warmup_lr'):
        if (getattr(args, name, None) or 0) > args.lr:
            raise RecipeError(f'--{name.replace("_", "-")} {getattr(args, name)} is above --lr {args.lr}: the '
                              f'schedule would climb to it; give it below --lr')
    optimizer = args.opt.lower().split('_')[-1]  # timm's name without its lookahead_ prefix
    if optimizer in ('sgd', 'nesterov') and not args.momentum:
        raise RecipeError(f'--opt {args.opt} is Nesterov\'s momentum, which needs --momentum above 0; plain SGD is '
                          f'--opt momentum --momentum 0')
    if optimizer == 'adahessian' and getattr(args, 'torchcompile', None):
        raise RecipeError(f'--opt {args.opt} takes the gradient of the gradient, which torch.compile cannot give '
                          f'(double backward): leave out --torchcompile')
    if args.sched == 'rsqrt' and not args.warmup_epochs:
        raise RecipeError('--sched rsqrt takes its time scale from the warm-up here: give --warmup-epochs above 0')


def check_value_bounds(args) -> None:
    """A :class:`RecipeError` for a number of ``args`` outside its :data:`VALUE_BOUNDS` (given on the command line
    or by a recipe); arguments that ``args`` lacks or leaves at None are not checked."""
    for name, bounds in VALUE_BOUNDS.items():
        given = getattr(args, name, None)
        values = given if isinstance(given, (list, tuple)) else [given]  # e.g. each of --decay-milestones
        value, problem = next(((v, 'it must be a number' if not isinstance(v, (int, float)) else bounds.breach(v))
                               for v in values if v is not None and not isinstance(v, bool)
                               and (not isinstance(v, (int, float)) or bounds.breach(v))), (None, None))
        if problem:
            recipe = getattr(args, 'config', '')
            shown = repr(value) if isinstance(value, str) else value
            raise RecipeError(f'--{name.replace("_", "-")} is {shown}, {problem}'
                              + (f' (from the command line or recipe {recipe})' if recipe else ''))


def check_compile_backend(backend: Optional[str]) -> None:
    """A :class:`RecipeError` for a ``--torchcompile`` backend torch.compile does not know, asked once
    ``--device-modules`` (which may register one) are imported; torch's own InvalidBackend ends in a traceback."""
    if backend is None or backend == 'auto':
        return
    import torch._dynamo
    if backend in torch._dynamo.list_backends(exclude_tags=()):
        return
    usual = torch._dynamo.list_backends()
    near = difflib.get_close_matches(backend, usual, n=1, cutoff=0.6)
    raise RecipeError(f'--torchcompile {backend!r} is not a backend of torch.compile'
                      + (f' (did you mean {near[0]!r}?)' if near else '') + f'; its backends are {", ".join(usual)}, '
                      f'or auto (a package that registers one goes in --device-modules)')


def command_line_kwargs_over_recipe_flags(args, argv, options) -> None:
    """A keyword that the command line's ``--model-kwargs`` gives and a flag also sets (``num_classes=5``) wins over
    that flag's value from a recipe (``num_classes: 10``): the flag takes it, so that whatever reads the flag (an
    image folder's class count, args.yaml) agrees with the model. The flag given on the command line as well wins
    over both, as create_model gets it last. Before a recipe's ``model_kwargs`` are merged into ``args``';
    ``options``: the parser's option strings."""
    if not _given('--model-kwargs', argv, options):
        return
    for key, name, flag in FLAG_KWARGS:
        if key in args.model_kwargs and not _given(flag, argv, options):
            setattr(args, name, args.model_kwargs[key])


def _given(option: str, argv, options) -> bool:
    """Whether ``argv`` gives ``option`` as argparse reads it: by its name, or by a prefix of no other option's
    (``--drop`` is an option of its own, no prefix of ``--drop-path``)."""
    names = [arg.split('=')[0] for arg in argv if arg.startswith('--')]
    return any(name == option or (name not in options and option.startswith(name)
                                  and sum(o.startswith(name) for o in options) == 1) for name in names)
