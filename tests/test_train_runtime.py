""" The training loop's runtime behaviour without a GPU: host syncs, device-dependent defaults, backend switches

The host-sync counts also run on CUDA (the ``device`` fixture of conftest.py), where a host read stalls the GPU.
"""
import argparse
import copy
import logging
import re
from contextlib import nullcontext

import pytest
import torch
from float32_bounds import FLOAT32_UNIT_ROUNDOFF, SAFETY
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from sa_vision.errors import UserError
from sa_vision.train import compile_choice, run_setup, runtime
from sa_vision.train import loop as training
from sa_vision.train.optimizer import resolve_opt_fused
from sa_vision.train.state import parse_run_args


class HostReads(TorchDispatchMode):
    """Counts the reads of tensor values to the host (``item``, ``float``, ``bool``: ``_local_scalar_dense``)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def count_host_reads(monkeypatch):
    """A ``HostReads`` that also counts ``Tensor.tolist`` (it copies the values without an ATen operator)."""
    reads = HostReads()
    tolist = torch.Tensor.tolist

    def counted_tolist(self):
        reads.count += 1
        return tolist(self)
    monkeypatch.setattr(torch.Tensor, 'tolist', counted_tolist)
    return reads


def _epoch_args(log_interval, device='cpu'):
    return argparse.Namespace(device=device, channels_last=False, clip_grad=None, clip_mode='norm',
                              log_interval=log_interval, world_size=1, rank=0, distributed=False)


def _toy_problem(steps=8, batch=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 5))
    loader = [(torch.randn(batch, 3, 2, 2), torch.randint(0, 5, (batch,))) for _ in range(steps)]
    return model, loader


def test_train_epoch_reads_the_loss_only_at_log_lines(count_host_reads, caplog, device):
    steps, log_interval = 8, 3  # log lines after steps 1 (the first, as timm's), 3, 6 and 8 (the last)
    model, loader = _toy_problem(steps)
    reference_model = copy.deepcopy(model)  # trained on the CPU
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.INFO, logger='train'), count_host_reads:
        metrics, num_updates = training.train_one_epoch(
            0, model, loader, optimizer, nn.CrossEntropyLoss(), None, _epoch_args(log_interval, device), 0,
            nullcontext)
    assert num_updates == steps
    assert 1 <= count_host_reads.count <= 4, f'{count_host_reads.count} host reads in {steps} steps'

    # the same epoch as a plain loop: the logged losses and the mean are unchanged
    reference_opt = torch.optim.SGD(reference_model.parameters(), lr=0.1)
    losses = []
    for images, targets in loader:
        loss = nn.functional.cross_entropy(reference_model(images), targets)
        reference_opt.zero_grad()
        loss.backward()
        reference_opt.step()
        losses.append(loss.item())
    assert metrics['loss'] == pytest.approx(sum(losses) / steps, rel=1e-6)
    logged = [tuple(map(float, m.groups())) for m in re.finditer(r'Loss: (\S+) \((\S+)\)', caplog.text)]
    expected = [(losses[i - 1], sum(losses[:i]) / i) for i in (1, 3, 6, 8)]
    assert logged == [pytest.approx(e, abs=0.0051) for e in expected]  # the log prints 3 digits


def test_a_clock_waits_for_any_accelerator_not_cuda_alone(monkeypatch):
    """The benchmark's, the matmul probe's and --torchcompile auto's clocks wait for the device's queued work: on
    mps (Apple silicon) too, or they would time the queueing."""
    waited = []
    monkeypatch.setattr(torch.accelerator, 'synchronize', waited.append)
    for device in ('mps', 'cuda:1', 'cpu'):
        runtime.synchronize(device)
    assert waited == [torch.device('mps'), torch.device('cuda:1')]


def test_pin_memory_defaults_to_on_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: None)  # no GPU needed to resolve the defaults
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    for device, explicit, expected in (('cuda', None, True), ('cpu', None, False), ('cuda', False, False),
                                       ('cpu', True, True)):
        args = argparse.Namespace(device=device, amp=None, pin_mem=explicit)
        runtime.init_distributed(args)
        assert args.pin_mem is expected, (device, explicit)
    args, _, _ = parse_run_args([])
    assert args.pin_mem is None and parse_run_args(['--no-pin-mem'])[0].pin_mem is False


def test_retain_freed_memory_defaults_to_on_for_the_cpu(monkeypatch):
    from sa_vision.train.checkpoint import RUNTIME_ARGS
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: None)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    for device, explicit, expected in (('cpu', None, True), ('cuda', None, False), ('cpu', False, False)):
        args = argparse.Namespace(device=device, amp=None, pin_mem=None, retain_freed_memory=explicit)
        runtime.init_distributed(args)
        assert args.retain_freed_memory is expected, (device, explicit)
    assert parse_run_args(['--no-retain-freed-memory'])[0].retain_freed_memory is False
    assert 'retain_freed_memory' in RUNTIME_ARGS  # a switch of this machine's process, not of the recipe


def test_channels_last_default_follows_the_model_convolutions():
    import timm

    import sa_vision  # noqa: F401
    resnet = timm.create_model('resnet18_cifar')
    sa_model = timm.create_model('sa_quadratic_cifar', embed_dim=8, depth=1, heads_per_layer=2, mlp_hidden_dim=16)
    assert runtime.uses_channels_last(resnet, 'cuda')
    assert runtime.uses_channels_last(resnet, torch.device('cuda:1'))
    assert not runtime.uses_channels_last(resnet, 'cpu')
    # the SA models' only convolution is the 2x2 patch embedding (kernel = stride), a Linear per patch
    assert not runtime.uses_channels_last(sa_model, 'cuda')
    assert runtime.uses_channels_last(nn.Conv2d(3, 3, 1, stride=2), 'cuda')  # a strided 1x1 does subsample
    assert not runtime.uses_channels_last(nn.Linear(3, 3), 'cuda')


@pytest.fixture
def restore_backend_flags():
    flags = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def test_backends_are_exact_unless_asked(restore_backend_flags):
    torch.backends.cudnn.benchmark = torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    args, _, _ = parse_run_args(['--device', 'cuda'])
    runtime.configure_backends(args)
    assert not torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    args, _, _ = parse_run_args(['--device', 'cuda', '--cudnn-benchmark', '--tf32'])
    runtime.configure_backends(args)
    assert torch.backends.cudnn.benchmark
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    args, _, _ = parse_run_args(['--device', 'cpu'])  # a CPU run leaves a notebook's CUDA switches alone
    runtime.configure_backends(args)
    assert torch.backends.cudnn.benchmark and torch.backends.cuda.matmul.allow_tf32


@pytest.mark.filterwarnings('ignore:PlateauLRScheduler is deprecated:FutureWarning')  # timm's, on creating it
@pytest.mark.parametrize('metric, mode', [('top1', 'max'), ('top5', 'max'), ('loss', 'min')])
def test_plateau_schedule_follows_the_eval_metric_direction(metric, mode):
    """--sched plateau (timm's PlateauLRScheduler over torch's ReduceLROnPlateau): an accuracy improves upwards, a
    loss downwards. The lr stays while the metric keeps improving in its direction, and falls (by --decay-rate)
    once it has stayed the same for more than --patience-epochs."""
    args, _, _ = parse_run_args(['--sched', 'plateau', '--no-sched-on-updates', '--eval-metric', metric,
                                 '--epochs', '20', '--warmup-epochs', '0', '--patience-epochs', '1', '--lr', '0.1'])
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=args.lr)
    scheduler, _ = run_setup.create_scheduler(optimizer, args, updates_per_epoch=1)
    assert scheduler.lr_scheduler.mode == mode
    improving = [1., 2., 3., 4., 5.] if mode == 'max' else [9., 8., 7., 6., 5.]
    for epoch, value in enumerate(improving):  # better every epoch: never a plateau
        scheduler.step(epoch + 1, value)
    assert optimizer.param_groups[0]['lr'] == pytest.approx(0.1)
    for epoch in range(5, 8):  # the same value three times: a plateau longer than the patience
        scheduler.step(epoch + 1, 5.)
    assert optimizer.param_groups[0]['lr'] == pytest.approx(0.1 * args.decay_rate)


def test_evaluation_reads_its_totals_once(count_host_reads, device):
    from sa_vision.train.evaluation import evaluate
    model, loader = _toy_problem(steps=5)
    with count_host_reads:
        metrics = evaluate(model.to(device), loader, device)
    assert count_host_reads.count == 1 and metrics['num_images'] == 20


_FAULTS_PER_ALLOCATION = '''
import resource, sys, torch
from sa_vision.train.runtime import retain_freed_memory
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def median_faults():
    for _ in range(2):
        torch.ones(2 ** 24)  # 64 MiB, above glibc's largest dynamic mmap threshold (32 MiB)
    per_allocation = []
    for _ in range(7):
        before = faults()
        torch.ones(2 ** 24)
        per_allocation.append(faults() - before)
    # the median: the machine's memory manager may reclaim a retained block now and then (seen once in 7 CI runs)
    return sorted(per_allocation)[len(per_allocation) // 2]
default = median_faults()  # first: glibc's own settings, before retain_freed_memory changes the process's
print('no-glibc' if not retain_freed_memory() else f'{median_faults()} {default}')
'''


@pytest.mark.skipif(not hasattr(__import__('resource'), 'getrusage'), reason='needs resource.getrusage (Unix)')
def test_retained_memory_is_not_faulted_in_again():
    """A 64 MiB tensor allocated and freed again and again: by default glibc maps it afresh each time and every
    4 KiB page faults in (16,384 faults); with retain_freed_memory the freed block is reused (no faults; the median
    allocation is compared). Run in a subprocess, since the setting is the whole process's: the default first."""
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, '-c', _FAULTS_PER_ALLOCATION], capture_output=True, text=True, cwd=root,
                         env={**__import__('os').environ, 'PYTHONPATH': root, 'OMP_NUM_THREADS': '1'},
                         check=True).stdout.split('\n')[-2]
    if out == 'no-glibc':
        pytest.skip('retain_freed_memory needs glibc')
    retained, default = map(int, out.split())
    assert retained < 1000, (retained, default)
    assert default > 8000, (retained, default)  # the measurement sees the faults it is meant to remove


def _probe_on_rank(rank: int, world_size: int, port: int, results) -> None:
    """One DDP rank of the test below: rank 1's 'inductor' fails to compile, rank 0's does not."""
    import torch.distributed as dist
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)

        def fails_on_rank_1(x):
            if rank == 1:
                raise RuntimeError('inductor: no C++ compiler on this node')
            return model(x)
        args = argparse.Namespace(batch_size=8, device='cpu', channels_last=False, distributed=True)
        results.put((rank, compile_choice.probe_compile(model, args, (4,), nn.functional.cross_entropy, nullcontext,
                                                 {'eager': model, 'inductor': fails_on_rank_1})))
    finally:
        dist.destroy_process_group()


def test_ddp_ranks_choose_among_the_choices_that_compiled_on_every_rank():
    """A choice that fails on one rank only is left out on all of them (before, that rank skipped the broadcast
    and rank 0 waited in it for ever), and every rank gets rank 0's figures for the rest."""
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    ctx = mp.get_context('spawn')
    results = ctx.Queue()
    procs = [ctx.Process(target=_probe_on_rank, args=(rank, 2, port, results)) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=300) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    (measured_0, failures_0), (measured_1, failures_1) = got[0], got[1]
    assert set(measured_0) == set(measured_1) == {'eager'} and measured_0 == measured_1
    assert failures_0 == failures_1 == {'inductor': 'RuntimeError: inductor: no C++ compiler on this node'}


def test_opt_fused_auto_fuses_torchs_own_optimizers_with_cuda_only():
    for opt in ('sgd', 'nesterov', 'momentum', 'adam', 'adamw', 'lookahead_adamw', 'AdamW'):
        assert resolve_opt_fused('auto', opt, 'cuda:0')[0], opt
        assert not resolve_opt_fused('auto', opt, 'cpu')[0], opt  # a CPU run keeps its exact numbers
        assert resolve_opt_fused('on', opt, 'cpu')[0], opt
        assert not resolve_opt_fused('off', opt, 'cuda')[0], opt
    # Adagrad's fused step was CPU-only in some torch versions: asked for only
    assert not resolve_opt_fused('auto', 'adagrad', 'cuda:0')[0] and resolve_opt_fused('on', 'adagrad', 'cpu')[0]
    assert not resolve_opt_fused('auto', 'nadamw', 'cuda')[0]  # timm's own class: no fused step
    with pytest.raises(UserError, match='--opt lamb'):
        resolve_opt_fused('on', 'lamb', 'cpu')
    for requested in ('auto', 'on', 'off'):  # a misspelt name is the user's error, not a traceback
        with pytest.raises(UserError, match="--opt adamww: timm has no such optimizer; did you mean adamw"):
            resolve_opt_fused(requested, 'adamww', 'cpu')
    if not torch.cuda.is_available():  # timm asserts CUDA for APEX's optimizers: one error line, not a traceback
        with pytest.raises(UserError, match='--opt fusedadam: timm cannot build it here: CUDA required'):
            resolve_opt_fused('auto', 'fusedadam', 'cpu')


def _optimizer_steps(model, opt, opt_fused, dtype=torch.float32, steps=10):
    """The weights after ``steps`` steps of sa-vision-train's optimizer (its groups, positional lr x 3) on the same
    gradients, and the optimizer."""
    model = copy.deepcopy(model).to(dtype)
    args = argparse.Namespace(opt=opt, opt_fused=opt_fused, device='cpu', lr=0.01, weight_decay=0.05, momentum=0.9,
                              opt_eps=None, pos_lr_scale=3.0, rank=0)
    optimizer = run_setup.create_optimizer(model, args)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), optimizer


@pytest.mark.parametrize('opt', ['adamw', 'momentum'])
def test_fused_optimizer_steps_equal_the_for_loops_within_float32_rounding(opt):
    import timm
    model = timm.create_model('sa_quadratic_cifar', embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32,
                              num_classes=10)
    steps = 10
    reference, _ = _optimizer_steps(model, opt, 'off', torch.float64, steps)
    fused, fused_opt = _optimizer_steps(model, opt, 'on', steps=steps)
    loop, loop_opt = _optimizer_steps(model, opt, 'auto', steps=steps)
    assert fused_opt.defaults['fused'] and not loop_opt.defaults['fused']
    assert torch.equal(loop, _optimizer_steps(model, opt, 'off', steps=steps)[0])  # auto on a CPU: torch's default
    # a few float32 roundings of each weight per step, accumulated over the steps
    atol = SAFETY * steps * FLOAT32_UNIT_ROUNDOFF * reference.abs().max().item()
    for actual in (fused, loop):
        torch.testing.assert_close(actual.double(), reference, rtol=0, atol=atol)
    if opt == 'adamw':  # not bit for bit (SGD's few operations may round alike on some CPUs): why auto fuses only
        assert not torch.equal(fused, loop)  # with CUDA


_CALLER_CUDA_SETTINGS = {  # how a notebook sets torch's CUDA precision: not at all, the legacy API, the new one, both
    'untouched': 'pass',
    'legacy-high': "torch.set_float32_matmul_precision('high')",
    'legacy-medium': "torch.set_float32_matmul_precision('medium')",
    'new-per-operator': "b.cudnn.benchmark = True; b.cudnn.conv.fp32_precision = 'tf32'; "
                        "b.cudnn.rnn.fp32_precision = 'ieee'; b.cuda.matmul.fp32_precision = 'tf32'",
    'mixed': "b.cuda.matmul.fp32_precision = 'tf32'",
}


@pytest.mark.slow  # a process each: torch remembers which API set its switches last
@pytest.mark.parametrize('settings', list(_CALLER_CUDA_SETTINGS), ids=list(_CALLER_CUDA_SETTINGS))
def test_a_cuda_run_gives_back_the_callers_cuda_switches_as_they_read(settings):
    """A CUDA run sets cudnn.benchmark and TF32 (configure_backends, legacy flags: off, then --tf32 on); once it
    returns, the caller's switches hold their values again, and each getter that read them reads the same (a
    setting written back through the other API makes torch's getters raise; one that raised before, the caller's
    own mix of the APIs, may read now). No GPU needed: the switches are flags."""
    import subprocess
    import sys
    script = f'''
import torch
from types import SimpleNamespace
from sa_vision.train.caller_settings import caller_settings_kept
from sa_vision.train.runtime import configure_backends
b = torch.backends
{_CALLER_CUDA_SETTINGS[settings]}
def state():
    reads = []
    for read in (torch.get_float32_matmul_precision, lambda: b.cuda.matmul.allow_tf32, lambda: b.cudnn.allow_tf32):
        try:
            reads.append(read())
        except RuntimeError:
            reads.append('refused')
    return (b.cudnn.benchmark, b.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision,
            b.cudnn.rnn.fp32_precision), reads
before, reads_before = state()
for tf32 in (False, True):
    with caller_settings_kept(run_log=False):
        configure_backends(SimpleNamespace(device='cuda', cudnn_benchmark=False, tf32=tf32))
        assert state()[0][0] is False and state()[1][-2:] == [tf32, tf32], state()
    after, reads_after = state()
    assert after == before and all(r in (a, 'refused') for r, a in zip(reads_before, reads_after)), (
        tf32, before, reads_before, after, reads_after)
'''
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
