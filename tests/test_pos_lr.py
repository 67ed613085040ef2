""" --pos-lr-scale: the positional parameters train at scale x the scheduled learning rate, in every step and
across --resume

The schedule is checked against the warm-up + cosine formula written out here, the groups against parameter names
matched here by pattern.
"""
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest
import timm
import torch
from helpers import HANG_TIMEOUT_S
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2

import sa_vision  # noqa: F401  registers the models
from sa_vision.models import param_groups_pos_lr

ROOT = Path(__file__).resolve().parent.parent

SMALL = dict(embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=32)
GAUSSIAN_PARAM = re.compile(r'^blocks\.\d+\.attn\.position\.(centers|precision_factors)$')
LEARNED_PARAM = re.compile(r'^blocks\.\d+\.attn\.position\.(row|col)_(shift_embed|keys)\.weight$')


def _group_names(model, optimizer):
    names = {id(p): n for n, p in model.named_parameters()}
    return [{names[id(p)] for p in group['params']} for group in optimizer.param_groups]


@pytest.mark.parametrize('arch, pattern', [('sa_quadratic_cifar', GAUSSIAN_PARAM), ('sa_gen_cifar', GAUSSIAN_PARAM),
                                           ('sa_learned_cifar', LEARNED_PARAM)])
def test_positional_parameters_get_their_own_groups(arch, pattern):
    model = timm.create_model(arch, **SMALL)
    optimizer = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05,
                                    param_group_fn=partial(param_groups_pos_lr, weight_decay=0.05, pos_lr_scale=30.))
    positional = {n for n, _ in model.named_parameters() if pattern.match(n)}
    assert positional
    scaled, plain = set(), set()
    for group, names in zip(optimizer.param_groups, _group_names(model, optimizer)):
        (scaled if group.get('lr_scale') == 30. else plain).update(names)
        if arch != 'sa_learned_cifar' and names & positional:
            assert group['weight_decay'] == 0.  # no decay on centres, precision factors (no_weight_decay())
    assert scaled == positional
    assert plain == {n for n, _ in model.named_parameters()} - positional
    # scale 1: exactly timm's groups (checkpoints of runs without the option still resume)
    same = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05,
                               param_group_fn=partial(param_groups_pos_lr, weight_decay=0.05, pos_lr_scale=1.))
    timm_groups = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05)
    assert _group_names(model, same) == _group_names(model, timm_groups)


def test_scaled_groups_follow_the_schedule_at_scale_times_the_base_lr():
    lr, scale, warmup_lr, min_lr, steps_per_epoch, epochs, warmup_epochs = 2e-3, 30., 1e-5, 1e-4, 10, 4, 1
    model = timm.create_model('sa_quadratic_cifar', **SMALL)
    optimizer = create_optimizer_v2(model, 'adamw', lr=lr, weight_decay=0.05,
                                    param_group_fn=partial(param_groups_pos_lr, weight_decay=0.05, pos_lr_scale=scale))
    scheduler, _ = create_scheduler_v2(optimizer, sched='cosine', num_epochs=epochs, warmup_epochs=warmup_epochs,
                                       warmup_lr=warmup_lr, min_lr=min_lr, step_on_epochs=False,
                                       updates_per_epoch=steps_per_epoch)
    warmup_t, total_t = warmup_epochs * steps_per_epoch, epochs * steps_per_epoch

    def expected(t):  # timm's cosine with linear warm-up (warm-up not prefixed), written out
        if t < warmup_t:
            return warmup_lr + t * (lr - warmup_lr) / warmup_t
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t / total_t))

    checked = 0
    for t in range(total_t):
        if t:
            scheduler.step_update(t)
        if t in (0, 3, warmup_t, 17, 25, total_t - 1):
            for group in optimizer.param_groups:
                want = expected(t) * (scale if group.get('lr_scale') else 1.)
                assert group['lr'] == pytest.approx(want, rel=1e-12), (t, group.get('lr_scale'))
            checked += 1
    assert checked == 6


def _pos_lrs(ckpt):
    """(base lr, positional lr, positional lr_scale) of a checkpoint's saved optimizer groups."""
    groups = ckpt['optimizer']['param_groups']
    base = {g['lr'] for g in groups if 'lr_scale' not in g}
    scaled = [(g['lr'], g['lr_scale']) for g in groups if 'lr_scale' in g]
    assert len(base) == 1 and scaled, groups
    assert len({s for s in scaled}) == 1
    return base.pop(), scaled[0][0], scaled[0][1]


@pytest.mark.slow
def test_pos_lr_scale_reaches_the_optimizer_and_survives_resume(tmp_path, caplog, capsys):
    pytest.importorskip('sklearn')  # the digits data
    from test_train import DIGITS_RECIPE, TINY_ARGS, load_ckpt, run_train, train_killed_after_first_epoch
    epochs, scale = 3, 10.
    args = ['-c', DIGITS_RECIPE, *TINY_ARGS, '--epochs', epochs, '--warmup-epochs', 0.5, '-b', 64, '--min-lr', 1e-4,
            '--output', tmp_path, '--log-interval', 5]
    run_train(caplog, capsys, args + ['--experiment', 'straight', '--pos-lr-scale', scale])
    straight = load_ckpt(tmp_path / 'straight' / 'last.pth.tar')
    base, pos, got_scale = _pos_lrs(straight)
    assert got_scale == scale and base > 0 and pos == pytest.approx(scale * base, rel=1e-12)

    # the same run killed after its first epoch, resumed without repeating --pos-lr-scale: it keeps the run's
    train_killed_after_first_epoch(args + ['--experiment', 'killed', '--pos-lr-scale', scale])
    last = tmp_path / 'killed' / 'last.pth.tar'
    saved = load_ckpt(last)
    assert saved['epoch'] < epochs - 1  # counted from 0
    base1, pos1, _ = _pos_lrs(saved)
    assert pos1 == pytest.approx(scale * base1, rel=1e-12) and base1 > base  # mid-schedule, still scaled

    # the scale comes from the run, not repeated
    run_train(caplog, capsys, args + ['--experiment', 'killed', '--resume', last])
    resumed = load_ckpt(last)
    assert resumed['epoch'] == epochs - 1
    assert _pos_lrs(resumed) == (base, pos, scale)  # the same lr at the same step as the uninterrupted run
    for key, value in straight['state_dict'].items():
        assert torch.equal(value, resumed['state_dict'][key]), key


def test_pos_lr_scale_without_a_scheduler_scales_the_positional_lr(tmp_path, caplog, capsys):
    """timm's schedulers apply a group's lr_scale at each step; with --sched none there is none to, and the
    positional parameters trained at the base lr, silently."""
    pytest.importorskip('sklearn')  # the digits data
    from test_train import DIGITS_RECIPE, TINY_ARGS, load_ckpt, run_train
    run_train(caplog, capsys, ['-c', DIGITS_RECIPE, *TINY_ARGS, '--epochs', 1, '-b', 64, '--sched', 'none',
                               '--pos-lr-scale', 30, '--lr', 0.004, '--output', tmp_path, '--experiment', 'none'])
    base, pos, scale = _pos_lrs(load_ckpt(tmp_path / 'none' / 'last.pth.tar'))
    assert (base, scale) == (0.004, 30) and pos == pytest.approx(0.12, rel=1e-12)


# builds its optimizer as timm's train.py does (create_optimizer_v2(model, **optimizer_kwargs(cfg=args)), names
# imported from timm.optim at the top) and prints each group's parameter names, lr_scale and weight decay
TIMM_TRAIN_LIKE = textwrap.dedent("""
    import argparse, json
    import timm
    from timm.optim import create_optimizer_v2, optimizer_kwargs
    parser = argparse.ArgumentParser()
    parser.add_argument('--model')
    parser.add_argument('--opt', default='adamw')
    parser.add_argument('--lr', type=float, default=1e-3)
    parser.add_argument('--weight-decay', type=float, default=0.05)
    parser.add_argument('--momentum', type=float, default=0.9)
    parser.add_argument('--layer-decay', type=float, default=None)
    args = parser.parse_args()
    model = timm.create_model(args.model, embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=32)
    optimizer = create_optimizer_v2(model, **optimizer_kwargs(cfg=args))
    names = {id(p): n for n, p in model.named_parameters()}
    print('GROUPS ' + json.dumps([dict(names=sorted(names[id(p)] for p in g['params']), lr_scale=g.get('lr_scale'),
                                       weight_decay=g['weight_decay']) for g in optimizer.param_groups]))
""")


def _run_timm_train_like(tmp_path, run_timm_args, script_args):
    script = tmp_path / 'train.py'
    script.write_text(TIMM_TRAIN_LIKE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    return subprocess.run([sys.executable, '-m', 'sa_vision.train.run_timm', *run_timm_args, str(script),
                           *script_args], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=HANG_TIMEOUT_S)


@pytest.mark.parametrize('arch', ['sa_quadratic_cifar', 'sa_learned_cifar'])
def test_run_timm_pos_lr_scale_reaches_a_train_py_optimizer(tmp_path, arch):
    """timm train.py's route: ``run_timm --pos-lr-scale S train.py ...`` gives the positional parameters (matched
    here by name) lr_scale S and leaves every other group and the weight decay as timm builds them."""
    pattern = GAUSSIAN_PARAM if arch == 'sa_quadratic_cifar' else LEARNED_PARAM
    proc = _run_timm_train_like(tmp_path, ['--pos-lr-scale', '30'], ['--model', arch])
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = json.loads(proc.stdout.split('GROUPS ', 1)[1])
    model = timm.create_model(arch, **SMALL)
    positional = {n for n, _ in model.named_parameters() if pattern.match(n)}
    scaled = {n for g in groups if g['lr_scale'] == 30. for n in g['names']}
    assert scaled == positional
    assert all(g['lr_scale'] in (None, 30.) for g in groups)
    # said, since timm's log names only the optimizer
    assert (f'sa_vision: --pos-lr-scale 30: {len(positional)} positional parameters of SelfAttentionNet ('
            in proc.stderr), proc.stderr[-2000:]
    plain = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05)  # timm's own groups, unscaled
    decay = {n: g['weight_decay'] for g, names in zip(plain.param_groups, _group_names(model, plain)) for n in names}
    assert {n: g['weight_decay'] for g in groups for n in g['names']} == decay


def test_run_timm_pos_lr_scale_refuses_layer_decay(tmp_path):
    proc = _run_timm_train_like(tmp_path, ['--pos-lr-scale', '30'], ['--model', 'sa_quadratic_cifar',
                                                                      '--layer-decay', '0.7'])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert 'error: --pos-lr-scale and --layer-decay' in proc.stderr and 'Traceback' not in proc.stderr
