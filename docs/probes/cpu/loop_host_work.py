"""What sa-vision-train's loop does per training step besides the compiled model, counted in ATen operations: the
real loop (``sa_vision.train.loop.train_one_epoch``, its second epoch) against the device check's benchmark step
(``sa_vision.measure.benchmark``'s ``StepRunner.train_step``, as docs/probes/gpu/device_check.py times 'train').

Both compile the same tiny model with the ``aot_eager`` backend: the compiled forward and backward then run under
the profiler's ``CompiledFunction`` / ``CompiledFunctionBackward`` ranges, and every ATen operation outside them is
host work that inductor's CUDA graphs do not take off the host (each one a dispatch, most of them a kernel launch on
a GPU). Operations are counted per step, by where they come from (the Python frames the profiler records); the
host times are noise on a shared CPU, the counts are not.

    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/probes/cpu/loop_host_work.py   # -> loop_host_work_2026-11-26.log

The loop: ``sa-vision-train --dataset digits --device cpu --device-data on --torchcompile aot_eager --opt adamw
--sched cosine`` (per-update schedule), batch 32, crop padding 4, flips 0.5; the benchmark step: SGD with momentum,
one fixed batch, as in the device check; then AdamW's step alone on the narrow model, per implementation.

raw output, before and after the loop lost its per-step work: loop_host_work_2026-11-26.log
"""
import collections
import sys
import tempfile
from functools import partial

import timm
import timm.optim  # for create_optimizer_v2 below: `import sa_vision` leaves timm.optim unimported
import torch
from torch.profiler import ProfilerActivity, profile

import sa_vision  # noqa: F401  registers the models
from sa_vision.measure import benchmark as sab
from sa_vision.models import param_groups_pos_lr
from sa_vision.train import loop

MODEL_KWARGS = ['embed_dim=16', 'depth=2', 'heads_per_layer=4', 'mlp_hidden_dim=32']
BATCH = 32
COMPILED = ('CompiledFunction', 'Torch-Compiled Region')
# (a part of a Python frame's name, 'file(line): function', category), the first match of the innermost frame wins
ORIGINS = (('device_data.py', 'augmentation'), ('timm/scheduler', 'scheduler'), ('zero_grad', 'zero_grad'),
           ('torch/optim/', 'optimizer'), ('timm/optim/', 'optimizer'), ('nn/modules/loss.py', 'loss'),
           ('timm/loss/', 'loss'), ('functional.py', 'loss'), ('loop.py', 'loop'), ('benchmark.py', 'loop'))


def origin(event) -> str:
    """The category of a top-level operation outside the compiled model: its innermost range or Python frame
    that names one."""
    node = event
    while node is not None:
        if node.name.startswith('autograd::engine::evaluate_function'):
            return 'accumulate grad' if 'AccumulateGrad' in node.name else 'loss backward'
        if node.name.startswith('Optimizer.zero_grad'):
            return 'zero_grad'
        if node.name.startswith('Optimizer.step'):
            return 'optimizer'
        for key, category in ORIGINS:
            if key in node.name:
                return category
        node = node.cpu_parent
    return 'other'


def count(prof, steps: int):
    """({category: (top-level ops, all ATen ops, host ms)} per step, the same for the compiled model)."""
    outside = collections.defaultdict(lambda: [0, 0, 0.])
    for e in prof.profiler.function_events:
        if not e.name.startswith('aten::'):
            continue
        ancestors, node = [], e.cpu_parent
        while node is not None:
            ancestors.append(node)
            node = node.cpu_parent
        if any(any(c in a.name for c in COMPILED) for a in ancestors):
            key = 'compiled model'
        else:
            top = [e] + [a for a in ancestors if a.name.startswith('aten::')]
            key = origin(top[-1])
        row = outside[key]
        row[1] += 1
        if not any(a.name.startswith('aten::') for a in ancestors):
            row[0] += 1
            row[2] += e.cpu_time_total / 1000
    return {k: (v[0] / steps, v[1] / steps, v[2] / steps) for k, v in sorted(outside.items())}


def show(title: str, table) -> None:
    print(f'== {title}: per step, ATen operations outside the compiled model (top-level calls / all dispatcher '
          f'calls incl. nested / host ms of the top-level calls, noise)')
    total = [0., 0., 0.]
    for key, (top, every, ms) in table.items():
        print(f'  {key:16s} {top:7.1f} {every:7.1f} {ms:8.3f}')
        if key != 'compiled model':
            total = [t + v for t, v in zip(total, (top, every, ms))]
    print(f'  {"outside, total":16s} {total[0]:7.1f} {total[1]:7.1f} {total[2]:8.3f}')


def loop_counts():
    """The real loop's second epoch under the profiler (the first compiles)."""
    real, recorded = loop.train_one_epoch, {}

    def profiled(epoch, model, train_loader, *args, **kwargs):
        if epoch == 0:
            return real(epoch, model, train_loader, *args, **kwargs)
        with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
            out = real(epoch, model, train_loader, *args, **kwargs)
        recorded['table'] = count(prof, len(train_loader))
        recorded['steps'] = len(train_loader)
        return out

    loop.train_one_epoch = profiled
    try:
        with tempfile.TemporaryDirectory() as out:
            loop.main(['--dataset', 'digits', '--model', 'sa_quadratic_cifar', '--model-kwargs', *MODEL_KWARGS,
                       '--device', 'cpu', '--device-data', 'on', '--torchcompile', 'aot_eager', '--no-amp',
                       '--opt', 'adamw', '--lr', '1e-3', '--weight-decay', '0.05', '--sched', 'cosine',
                       '--warmup-epochs', '0', '--epochs', '2', '-b', str(BATCH), '--train-crop-padding', '4',
                       '--log-interval', '1000', '--workers', '0', '--output', out])
    finally:
        loop.train_one_epoch = real
    return recorded


def benchmark_counts(steps: int = 20):
    kwargs = {k: int(v) for k, v in (kv.split('=') for kv in MODEL_KWARGS)}
    variant = sab.build_variants('sa_quadratic_cifar', [], **kwargs)[0]
    runner = sab.StepRunner(variant, BATCH, (3, 32, 32), torch.device('cpu'), torchcompile='aot_eager')
    for _ in range(3):
        runner.train_step()
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(steps):
            runner.train_step()
    return count(prof, steps)


def optimizer_counts(steps: int = 5):
    """AdamW alone (timm's create_optimizer_v2 with the loop's parameter groups) on the cpu profile's narrow model:
    ATen operations per step, and how many of them read a value to the host, per implementation."""
    model = timm.create_model('sa_quadratic_cifar', embed_dim=64, mlp_hidden_dim=128, num_classes=10)
    params = [p for p in model.parameters() if p.requires_grad]
    print(f'== AdamW alone, the narrow model ({len(params)} parameters): per step, top-level ATen calls / all '
          f'dispatcher calls / reads to the host (aten::item); on CUDA torch defaults to foreach')
    for name, kwargs in (('for-loop', {'foreach': False}), ('foreach', {'foreach': True}), ('fused', {'fused': True})):
        optimizer = timm.optim.create_optimizer_v2(
            model, opt='adamw', lr=1e-3, weight_decay=0.05, **kwargs,
            param_group_fn=partial(param_groups_pos_lr, weight_decay=0.05, pos_lr_scale=1.0))
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                optimizer.step()
        top = every = items = 0
        for e in prof.profiler.function_events:
            if not e.name.startswith('aten::'):
                continue
            every += 1
            items += e.name == 'aten::item'
            node = e.cpu_parent
            while node is not None and not node.name.startswith('aten::'):
                node = node.cpu_parent
            top += node is None
        print(f'  {name:10s} {top / steps:7.1f} {every / steps:7.1f} {items / steps:7.1f}   '
              f'({len(optimizer.param_groups)} parameter groups)')


if __name__ == '__main__':
    torch.set_num_threads(1)
    print(f'torch {torch.__version__}; sa_quadratic_cifar {" ".join(MODEL_KWARGS)}, batch {BATCH}, CPU, float32')
    show('the device check\'s benchmark step (SGD, one fixed batch)', benchmark_counts())
    recorded = loop_counts()
    show(f'sa-vision-train\'s loop, epoch 1 ({recorded["steps"]} steps; per-epoch work spread over them)',
         recorded['table'])
    optimizer_counts()
    sys.stdout.flush()
