""" sa-vision-train and sa-vision-validate as a user meets them: resume keeps the run's arguments, --amp auto,
recipe checks, fine-tune recipes, dataset errors, image folders of any size, one-line errors """
import argparse
import csv
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import time
from contextlib import nullcontext
from pathlib import Path

import pytest
import timm
import torch
import yaml
from helpers import HANG_TIMEOUT_S, command, command_here, fashion_mnist_test_images, keeping_threads, train_here

pytest.importorskip('sklearn')

from sa_vision.errors import UserError  # noqa: E402
from sa_vision.train import compile_choice, run_setup, runtime, state  # noqa: E402
from sa_vision.train import loop as training  # noqa: E402
from sa_vision.train.args import build_parser  # noqa: E402
from sa_vision.train.recipes import RECIPE_DIR  # noqa: E402
from sa_vision.train.state import parse_run_args  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DIGITS_RECIPE = RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml'
TINY = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32']


def _env():
    return dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))


def _command(name, *args, timeout=HANG_TIMEOUT_S):
    return subprocess.run([*command(name), *map(str, args)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


class _FirstTrainStep(Exception):
    pass


def _run_until_stopped(argv, register_hook):
    """Run training.main in this process until the global module hook that ``register_hook(stop)`` registers calls
    ``stop(value)`` in the first training step: everything a run decides and writes before it is done. Returns
    that value."""
    seen = []

    def stop(value):
        seen.append(value)
        raise _FirstTrainStep
    handle = register_hook(stop)
    try:
        with pytest.raises(_FirstTrainStep):
            training.main(list(map(str, argv)))
    finally:
        handle.remove()
    return seen[0]


def _run_until_first_train_step(argv):
    """Run training.main in this process until the first Linear forward in training mode; the dtype of its
    output."""
    def register_hook(stop):
        def hook(module, inputs, output):
            if isinstance(module, torch.nn.Linear) and module.training and torch.is_grad_enabled():
                stop(output.dtype)
        return torch.nn.modules.module.register_module_forward_hook(hook)
    return _run_until_stopped(argv, register_hook)


def _threads_in_training(argv):
    """Run training.main in this process until its first training step; torch's thread count then."""
    def register_hook(stop):
        def hook(module, inputs, output):
            if module.training and torch.is_grad_enabled():
                stop(torch.get_num_threads())
        return torch.nn.modules.module.register_module_forward_hook(hook)
    return _run_until_stopped(argv, register_hook)


@pytest.fixture(scope='module')
def adamw_run(tmp_path_factory):
    """A finished 2-epoch run of a tiny model with the digits recipe (AdamW, lr 0.005, weight decay 0.05)."""
    out = tmp_path_factory.mktemp('runs')
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 2, '-b', 64, '--output', out,
                                 '--experiment', 'adamw', '--log-interval', 100])))
    return out / 'adamw' / 'last.pth.tar'


def _load(path):
    return torch.load(path, map_location='cpu', weights_only=True)


def test_the_runs_recipe_and_args_build_its_model_as_timms_train_py_calls_create_model(tmp_path):
    """timm's ``train.py -c <run>/recipe.yaml`` (or ``args.yaml``) calls ``create_model(in_chans=..., num_classes=
    args.num_classes, drop_rate=args.drop, global_pool=args.gp, ..., **args.model_kwargs)``: a keyword in both
    failed with "got multiple values" (num_classes: every paper recipe; in_chans and global_pool: every fine-tune
    of a Hub folder, whose config.json names them). Each file builds the run's model that way, and
    sa-vision-train -c reads the keywords back."""
    import timm
    import yaml

    from sa_vision.train.state import parse_run_args
    from sa_vision.train.timm_args import TIMM_MODEL_KWARGS
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, 'global_pool=avg', 'in_chans=3', '--epochs', 1,
                                 '--output', tmp_path, '--experiment', 'run', '--log-interval', 100])))
    run = tmp_path / 'run'
    ckpt = _load(run / 'last.pth.tar')
    shapes = {k: v.shape for k, v in ckpt['state_dict'].items()}
    for name in ('recipe.yaml', 'args.yaml'):
        saved = yaml.safe_load((run / name).read_text())
        flags = {key: saved.get(arg) for key, arg in TIMM_MODEL_KWARGS.items()}  # None too, as train.py passes it
        flags['in_chans'] = saved.get('in_chans') or 3  # train.py: --in-chans, else --input-size's, else 3
        model = timm.create_model(saved['model'], **flags, **saved['model_kwargs'])
        assert {k: v.shape for k, v in model.state_dict().items()} == shapes, name
        assert (saved['num_classes'], saved['gp'], saved['in_chans']) == (10, 'avg', 3), name
        args = parse_run_args(['-c', str(run / name)])[0]
        assert {**args.model_kwargs, 'num_classes': args.num_classes} == ckpt['model_args'], name


def test_a_runs_args_yaml_given_as_recipe_reads_as_its_recipe_yaml(adamw_run, capsys):
    """``-c <run>/args.yaml``, timm's habit, stopped at the keys a run decided (amp_reason, world_size, ... "did
    you mean 'mean'?"). It reads as the recipe.yaml beside it, and says so."""
    from sa_vision.train.state import parse_run_args
    as_args, _, _ = parse_run_args(['-c', str(adamw_run.parent / 'args.yaml')])
    assert "args.yaml is a run's args.yaml: it is read as the recipe.yaml beside it" in capsys.readouterr().err
    as_recipe, _, _ = parse_run_args(['-c', str(adamw_run.parent / 'recipe.yaml')])
    assert {**vars(as_args), 'config': None} == {**vars(as_recipe), 'config': None}
    assert (as_args.epochs, as_args.lr, as_args.model_kwargs['embed_dim']) == (2, 0.005, 16)


# --- --resume continues the run as it was configured ---------------------------------------------------

def test_resume_without_recipe_keeps_the_runs_optimizer_and_schedule(adamw_run, tmp_path, caplog):
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(adamw_run.parent, run)
    ckpt = _load(run / 'last.pth.tar')
    ckpt['epoch'], ckpt['history'] = 0, ckpt['history'][:1]  # as if killed after its first of 2 epochs (epoch 0)
    torch.save(ckpt, run / 'last.pth.tar')
    with caplog.at_level(logging.INFO, logger='train'):
        training.main(['--resume', str(run / 'last.pth.tar'), '--log-interval', '7'])  # no -c
    resumed = _load(run / 'last.pth.tar')
    assert resumed['epoch'] == 1 and resumed['num_epochs'] == 2
    assert resumed['args']['opt'] == 'adamw' and resumed['args']['lr'] == 0.005
    assert resumed['args']['weight_decay'] == 0.05 and resumed['args']['epochs'] == 2
    saved = yaml.safe_load((run / 'args.yaml').read_text())
    assert saved['opt'] == 'adamw' and saved['lr'] == 0.005 and saved['batch_size'] == 64
    assert yaml.safe_load((run / 'recipe.yaml').read_text())['opt'] == 'adamw'
    # the one explicit option that differs from the run is reported
    assert 'resuming with changed arguments: log_interval 100 -> 7' in caplog.text


def test_options_of_timms_train_py_say_where_they_work_and_others_are_argparses_error(capsys, tmp_path):
    """A timm user's --model-ema or --mixup: one error line naming timm's script (argparse would print the whole
    usage and 'unrecognized arguments'); an option of neither stays argparse's error (status 2)."""
    with pytest.raises(UserError, match=r"^--model-ema, --mixup: options of timm's train.py that sa-vision-train does "
                                        r"not take\. .*sa_vision\.train\.run_timm path/to/timm/train\.py .*"
                                        r"pytorch-image-models checkout: pip's timm ships no train\.py"):
        parse_run_args(['--model-ema', '--mixup=0.8', '--epochs', '1'])
    with pytest.raises(SystemExit) as stopped:
        parse_run_args(['--bogus-flag', '3'])
    assert stopped.value.code == 2 and 'unrecognized arguments: --bogus-flag 3' in capsys.readouterr().err
    # timm's --input-size is --img-size here; its positional data folder, deprecated there, is --data-dir
    with pytest.raises(UserError, match=r'^--input-size: sa-vision-train takes --img-size N$'):
        parse_run_args(['--input-size', '3', '32', '32'])
    with pytest.raises(UserError, match=rf'^{re.escape(str(tmp_path))}: sa-vision-train takes the data folder as '
                                        rf'--data-dir {re.escape(str(tmp_path))} '):
        parse_run_args([str(tmp_path), '--epochs', '1'])


def test_a_run_weights_or_hub_folder_given_by_position_is_named_with_the_option_that_takes_it(tmp_path):
    """A user resuming by position (a run folder, its last.pth.tar) or starting from a Hub folder gets one line
    naming the option that takes it, not the data folder's advice nor argparse's usage."""
    run, hub = tmp_path / 'run', tmp_path / 'hub'
    run.mkdir(), hub.mkdir()
    (run / 'last.pth.tar').write_bytes(b'')
    (hub / 'config.json').write_text('{}')
    for given, option in ((f'{run}', f'--resume {run}/last.pth.tar'),
                          (f'{run}/', f'--resume {run}/last.pth.tar'),
                          (f'{run}/last.pth.tar', f'--resume {run}/last.pth.tar to continue its run, or '
                                                  f'--initial-checkpoint {run}/last.pth.tar'),
                          (f'{tmp_path}/w.safetensors', f'--initial-checkpoint {tmp_path}/w.safetensors'),
                          (f'{hub}', f'--model local-dir:{hub} --pretrained')):
        with pytest.raises(UserError, match=rf'^{re.escape(given)}: .*sa-vision-train takes it as .*'
                                            rf'{re.escape(option)}') as raised:
            parse_run_args([given, '--epochs', '1'])
        assert 'data folder' not in str(raised.value) and '\n' not in str(raised.value), raised.value


@pytest.mark.parametrize('args, message', [
    (['--num-classes', '5'], r'sa_quadratic_cifar has 5 classes, digits 10: its labels up to 9 would be no class of '
                             r'the model\. Pass --num-classes 10'),
    (['--img-size', '15'], r'cannot take 15x15 images \(--img-size 15\): expected an even height and width'),
    (['--data-dir', 'imgs'], r"--data-dir imgs: --dataset digits reads no files .* pass --dataset ''"),
    # the datasets give RGB (grey repeated, as timm reads images): not a matter of --img-size, nor of in_chans=3
    (['--model-kwargs', 'in_chans=1'], r'^sa_quadratic_cifar was built for 1-channel images \(in_chans=1, from '
                                       r'--model-kwargs\), but the datasets feed 3-channel ones .*: drop in_chans '
                                       r'from --model-kwargs'),
    (['--model', 'resnet18_cifar', '--model-kwargs', 'in_chans=1'],
     r'^resnet18_cifar was built for 1-channel images .* drop in_chans'),
])
def test_what_would_stop_the_first_batch_is_a_user_error_before_the_run_folder(tmp_path, args, message):
    """Fewer classes than the dataset's labels (torch's 'Target 6 is out of bounds' at the first batch), an odd
    image size (the embedding's ValueError there), a --data-dir that digits never read (timm's train.py would train
    on that image folder): each a one-line error, and no run folder is left to refuse the corrected command."""
    with pytest.raises(UserError, match=message):
        training.main(list(map(str, [*TINY, '--epochs', 1, '--output', tmp_path, '--experiment', 'run', *args])))
    assert not (tmp_path / 'run').exists()


def test_one_channel_weights_to_start_from_are_named_as_the_cause(tmp_path):
    """in_chans=1 stored with --initial-checkpoint weights (a timm train.py --in-chans 1 run's): the refusal names
    the weights, not a --model-kwargs that was never given."""
    model_args = {'embed_dim': 16, 'depth': 1, 'heads_per_layer': 2, 'mlp_hidden_dim': 32, 'in_chans': 1}
    grey = tmp_path / 'grey.pth'
    torch.save({'arch': 'sa_quadratic_cifar', 'model_args': model_args,
                'state_dict': timm.create_model('sa_quadratic_cifar', **model_args).state_dict()}, grey)
    with pytest.raises(UserError, match=r'^sa_quadratic_cifar was built for 1-channel images \(in_chans=1, from the '
                                        rf'arguments stored with {re.escape(str(grey))}\), .*: start from weights of '
                                        r'3 channels'):
        training.main(list(map(str, [*TINY, '--epochs', 1, '--output', tmp_path, '--experiment', 'run',
                                     '--initial-checkpoint', grey])))
    assert not (tmp_path / 'run').exists()


def test_the_log_names_the_key_of_another_trainers_ema_weights(tmp_path, caplog, capsys):
    """--initial-checkpoint of a DeiT-style dict ({'model', 'model_ema'}) starts from its EMA, as timm's
    load_checkpoint does, and the log names the key they came from, not timm's 'state_dict_ema'."""
    model_args = {'embed_dim': 16, 'depth': 1, 'heads_per_layer': 2, 'mlp_hidden_dim': 32}
    torch.manual_seed(0)
    plain, ema = (timm.create_model('sa_quadratic_cifar', **model_args).state_dict() for _ in range(2))
    torch.save({'arch': 'sa_quadratic_cifar', 'model_args': model_args, 'model': plain, 'model_ema': ema},
               tmp_path / 'deit.pth')
    status, log = train_here(caplog, capsys, *TINY, '--epochs', 1, '--output', tmp_path, '--experiment', 'run',
                             '--initial-checkpoint', tmp_path / 'deit.pth')
    assert status == 0, log
    assert f'Loaded model_ema, its EMA weights, of --initial-checkpoint {tmp_path / "deit.pth"}' in log, log


def test_a_timm_model_built_for_another_size_is_a_user_error_before_the_run_folder(tmp_path):
    """--img-size sizes the data only, as in timm's train.py: a ViT built for 224x224 asserts on the first 32x32
    batch. That is one error line, naming the model keyword that builds it for 32x32, which then trains."""
    vit = ['--model', 'vit_tiny_patch16_224', '--img-size', '32', '--epochs', '1', '--output', str(tmp_path),
           '--experiment', 'run', '--workers', '0', '--model-kwargs', 'depth=1', 'embed_dim=32', 'num_heads=2']
    with pytest.raises(UserError, match=r"^vit_tiny_patch16_224 cannot take 3x32x32 images \(--img-size 32\): .*"
                                        r"pass --model-kwargs img_size=32 as well"):
        training.main(vit)
    assert not (tmp_path / 'run').exists()
    training.main([*vit, 'img_size=32'])
    assert (tmp_path / 'run' / 'last.pth.tar').is_file()


def test_resume_refuses_another_folder_and_fewer_epochs_than_done_and_says_what_it_ignores(adamw_run, tmp_path,
                                                                                          caplog):
    """A resumed run stays in its folder: --output / --experiment elsewhere are refused (timm's train.py would
    write the rest of the run there), as is an --epochs below the epochs done (its files would say 'epoch 2 of 1'),
    before anything is written; --model-kwargs cannot change the run's model, and the log says it ignores them."""
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(adamw_run.parent, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    last = str(run / 'last.pth.tar')
    with pytest.raises(UserError, match=rf'continues the run in its own folder, {re.escape(str(run))}, not where '
                                        r'--experiment other says'):
        training.main(['--resume', last, '--experiment', 'other'])
    with pytest.raises(UserError, match=r'--output .* says\. Drop --output'):
        training.main(['--resume', last, '--output', str(tmp_path / 'elsewhere')])
    with pytest.raises(UserError, match=r'--epochs 1 ends before the run .* has done 2 epochs: pass --epochs 2'):
        training.main(['--resume', last, '--epochs', '1'])
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not (run.parent / 'other').exists() and not (tmp_path / 'elsewhere').exists()
    # a run copied elsewhere may name its new place (sa-vision-reproduce does); no epoch left: evaluated as it is
    with caplog.at_level(logging.INFO, logger='train'):
        training.main(['--resume', last, '--model-kwargs', 'embed_dim=32', 'depth=1', 'num_classes=5',
                       '--log-interval', '100', '--output', str(tmp_path), '--experiment', 'run'])
    assert '(ignoring --model-kwargs embed_dim=32' in caplog.text and 'Top-1 on the' in caplog.text
    assert 'num_classes 10 -> 5' not in caplog.text  # a change said, then ignored: the run keeps its classes


def test_an_export_without_model_best_warns_where_an_earlier_epoch_was_better(adamw_run, tmp_path, caplog):
    """A run killed before its best epoch's model_best.pth.tar was written (here: it is removed) gets it back from
    last.pth.tar when resumed, and exports it. Where an earlier epoch was the best and its model_best is gone (a
    user removed it), the last epoch is exported and the log says so."""
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(adamw_run.parent, run)
    (run / 'model_best.pth.tar').unlink()
    ckpt = _load(run / 'last.pth.tar')
    # killed after its first of 2 epochs, which scored 100 %: the second cannot beat it
    ckpt['epoch'], ckpt['history'], ckpt['best'] = 0, ckpt['history'][:1], {'metric': 100.0, 'epoch': 0}
    torch.save(ckpt, run / 'last.pth.tar')
    exported = []

    def export(source, folder):
        exported.append((source.name, _load(source)['epoch']))
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        return []
    with caplog.at_level(logging.INFO, logger='train'):
        training.main(['--resume', str(run / 'last.pth.tar'), '--export', '--log-interval', '100'], export=export)
    assert exported == [('model_best.pth.tar', 0)] and _load(run / 'last.pth.tar')['epoch'] == 1
    kept = _load(run / 'model_best.pth.tar')['state_dict']
    assert torch.equal(kept['head.weight'], ckpt['state_dict']['head.weight'])

    (run / 'model_best.pth.tar').unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger='train'):
        training.main(['--resume', str(run / 'last.pth.tar'), '--export', '--log-interval', '100'], export=export)
    assert exported[1:] == [('last.pth.tar', 1)]
    assert (f'warning: no model_best.pth.tar in {run}: exporting the last epoch, 2, although its record names '
            f'epoch 1 as the best by top1 (100.00)') in caplog.text


def test_resume_with_more_epochs_follows_the_longer_schedule(adamw_run, tmp_path):
    """A finished run resumed with a larger --epochs trains on the schedule of that many epochs, as a run asked for
    them from the start does (timm's train.py rebuilds the schedule on resume), not at the old schedule's end."""
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(adamw_run.parent, run)
    training.main(['--resume', str(run / 'last.pth.tar'), '--epochs', '4', '--log-interval', '100'])
    resumed = _load(run / 'last.pth.tar')['history']
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 4, '-b', 64, '--output', tmp_path,
                                 '--experiment', 'long', '--log-interval', 100])))
    asked = _load(tmp_path / 'long' / 'last.pth.tar')['history']
    assert [h['epoch'] for h in resumed] == [0, 1, 2, 3]
    assert resumed[2]['lr'] > 5e-4  # 3/4 through a cosine of 4 epochs (0.005 * 0.146), not at min_lr 0
    assert [h['lr'] for h in resumed[2:]] == pytest.approx([h['lr'] for h in asked[2:]], rel=1e-12)


def test_val_interval_evaluates_every_nth_and_the_last_epoch_and_trains_the_same_weights(adamw_run, tmp_path,
                                                                                          caplog):
    """--val-interval 2 over 2 epochs: the first is not evaluated, the last is. The training is the one of the
    fixture's run, evaluated every epoch (same weights, same last evaluation); the unevaluated epoch leaves no
    metrics in its checkpoint, no row in summary.csv, and a card that says so."""
    from sa_vision.hub.labels import weights_label
    from sa_vision.hub.record import training_summary
    from sa_vision.train.checkpoint import read_checkpoint
    from sa_vision.train.epoch_files import save_epoch
    with caplog.at_level(logging.INFO, logger='train'):
        training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 2, '-b', 64, '--output', tmp_path,
                                     '--experiment', 'sparse', '--log-interval', 100, '--val-interval', 2])))
    run = tmp_path / 'sparse'
    assert 'Eval: 0  skipped (--val-interval 2: the next at epoch 1)' in caplog.text
    assert re.search(r'Eval: 1  Loss: ', caplog.text)
    sparse, every = _load(run / 'last.pth.tar'), _load(adamw_run)
    for key, value in every['state_dict'].items():
        assert torch.equal(value, sparse['state_dict'][key]), key
    assert sparse['metrics'] == every['metrics']
    assert ['eval_top1' in h for h in sparse['history']] == [False, True]
    assert sparse['best'] == {'metric': every['metrics']['top1'], 'epoch': 1}
    assert torch.equal(_load(run / 'model_best.pth.tar')['state_dict']['head.weight'],
                       sparse['state_dict']['head.weight'])
    with open(run / 'summary.csv', encoding='utf-8', newline='') as f:
        rows = list(csv.DictReader(f))
    assert [(r['epoch'], r['eval_top1'] != '') for r in rows] == [('0', False), ('1', True)]
    assert sparse['args']['val_interval'] == 2  # the run's, not its recipe's: it changes no weight
    assert 'val_interval' not in yaml.safe_load((run / 'recipe.yaml').read_text())

    # the checkpoint of the unevaluated epoch, as a run killed after it leaves it
    (run / 'summary.csv').unlink()
    unevaluated = dict(sparse, epoch=0, metrics=None, best=None, history=sparse['history'][:1])  # epoch 0 done
    save_epoch(unevaluated, None, argparse.Namespace(save_epoch_weights=False, save_epoch_positions=False,
                                                     eval_metric='top1'), run, lambda msg: None)
    with open(run / 'summary.csv', encoding='utf-8', newline='') as f:
        (row,) = csv.DictReader(f)
    assert {v for k, v in row.items() if k.startswith('eval_')} == {''} and row['lr'], row  # its eval_ columns empty
    ckpt = read_checkpoint(run / 'last.pth.tar')
    card = training_summary(ckpt, weights_label(ckpt))
    assert 'These weights were not evaluated: `--val-interval 2` left their epoch out' in card
    assert re.search(r'\| 1 +\| [0-9.]+ +\| [0-9.e-]+ +\| - +\| - +\|', card), card
    # resumed with no epoch left to train, it is evaluated before the result is reported
    caplog.clear()
    with caplog.at_level(logging.INFO, logger='train'):
        training.main(['--resume', str(run / 'last.pth.tar'), '--epochs', '1', '--log-interval', '100'])
    assert re.search(r'Eval: 0  Loss: ', caplog.text) and 'Top-1 on the' in caplog.text


def test_val_interval_below_one_or_beside_plateau_is_a_recipe_error(tmp_path):
    from sa_vision.errors import RecipeError
    with pytest.raises(RecipeError, match='--val-interval is 0, it must be at least 1'):
        training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--output', tmp_path, '--val-interval', 0])))
    # plateau's patience counts evaluations: fewer of them would change the training
    with pytest.raises(RecipeError, match='--val-interval 3 would make its patience 3x as many epochs'):
        training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--output', tmp_path, '--val-interval', 3,
                                     '--sched', 'plateau', '--no-sched-on-updates'])))
    assert not any(tmp_path.iterdir())


def test_a_fraction_of_a_warm_up_epoch_stepped_per_epoch_is_a_recipe_error(tmp_path):
    """The digits recipe warms up over half an epoch: stepped per epoch, timm's schedule would train epoch 0 at
    --warmup-lr (0) alone, as the scheduler itself says; whole epochs, or steps per update, are taken."""
    from sa_vision.errors import RecipeError
    argv = ['-c', DIGITS_RECIPE, *TINY, '--output', tmp_path, '--no-sched-on-updates']
    args = build_parser().parse_args(list(map(str, argv[2:] + ['--warmup-epochs', 0.5, '--warmup-lr', 0])))
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.005)
    scheduler, _ = run_setup.create_scheduler(optimizer, args, updates_per_epoch=3)
    assert scheduler._get_lr(0) == [0.0]  # what the error spares a user: an epoch at lr 0
    with pytest.raises(RecipeError, match=r'--warmup-epochs 0.5 is a fraction of an epoch, but --no-sched-on-updates '
                                          r'steps .* \(--warmup-epochs 0 or 1\), or step per update'):
        training.main(list(map(str, argv)))
    assert not any(tmp_path.iterdir())


def test_resuming_a_finished_run_says_that_nothing_is_left_to_train(adamw_run, tmp_path, caplog, capsys):
    import shutil
    run = tmp_path / 'adamw'
    shutil.copytree(adamw_run.parent, run)
    status, log = train_here(caplog, capsys, '--resume', run / 'last.pth.tar')
    assert status == 0 and (f'Resuming {run} at epoch 2, update 44: the run is finished (2 epochs), nothing is left to '
                            f'train (a larger --epochs goes on); its result follows') in log, log[-2000:]
    assert '\nEpoch ' not in log and 'Top-1 on the digits test split' in log


def test_resume_reports_explicit_changes_only(adamw_run):
    args, _, _ = state.parse_run_args(['--resume', str(adamw_run), '--lr', '0.001', '--epochs', '2'])
    assert args.opt == 'adamw' and args.lr == 0.001 and args.epochs == 2
    assert args.resume_changes == {'lr': (0.005, 0.001)}  # --epochs 2 is given but equals the run's
    # parsing left the module's parser as it was: a plain command line gets the plain defaults again
    assert parse_run_args([])[0].opt == 'momentum'


def test_the_defaults_without_a_recipe_train_as_the_papers_recipe():
    """--help says that without -c the defaults are the paper's CIFAR-10 training: every training argument of the
    shipped paper recipe is the default, but for its dataset and the evaluation batch."""
    from sa_vision.train.args import RUNTIME_ARGS
    recipe = yaml.safe_load((RECIPE_DIR / 'sa_quadratic_cifar.yaml').read_text())
    defaults = vars(build_parser().parse_args([]))
    differ = {k for k, v in recipe.items() if k in defaults and k not in RUNTIME_ARGS and defaults[k] != v}
    assert differ == {'dataset', 'num_classes', 'validation_batch_size'}


# --- --amp auto, decided by the measured probe; recipe.yaml keeps what was asked -------------

@pytest.mark.parametrize('speedup, expected', [(2.0, torch.bfloat16), (0.5, torch.float32), (1.2, torch.float32)])
def test_amp_auto_follows_the_probe(monkeypatch, tmp_path, speedup, expected):
    calls = []

    def probe(dtype, *size):
        calls.append((dtype, size))
        return speedup
    monkeypatch.setattr(runtime, 'cpu_autocast_speedup', probe)
    dtype = _run_until_first_train_step(['-c', DIGITS_RECIPE, *TINY, '--amp', 'auto', '--device', 'cpu',
                                         '--output', tmp_path, '--experiment', 'auto'])
    assert dtype == expected
    assert calls and calls[0][0] == torch.bfloat16
    assert yaml.safe_load((tmp_path / 'auto' / 'recipe.yaml').read_text())['amp'] == 'auto'
    used = yaml.safe_load((tmp_path / 'auto' / 'args.yaml').read_text())
    assert used['amp'] == 'auto' and used['amp_used'] == ('bfloat16' if expected == torch.bfloat16 else False)
    assert f'{speedup:.2f}x' in used['amp_reason']


def test_amp_default_stays_float32_on_cpu_and_explicit_on_is_kept(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, 'cpu_autocast_speedup', lambda *a: pytest.fail('probe run without --amp auto'))
    base = ['-c', DIGITS_RECIPE, *TINY, '--device', 'cpu', '--output', tmp_path]
    assert _run_until_first_train_step(base + ['--experiment', 'default']) == torch.float32
    assert _run_until_first_train_step(base + ['--experiment', 'on', '--amp']) == torch.bfloat16
    assert yaml.safe_load((tmp_path / 'on' / 'recipe.yaml').read_text())['amp'] is True
    assert yaml.safe_load((tmp_path / 'default' / 'recipe.yaml').read_text())['amp'] is None


@pytest.mark.parametrize('small, large, expected', [(0.02, None, False), (0.9, 2.0, True), (0.9, 1.0, False)])
def test_amp_auto_measures_the_model_size_only_where_bf16_is_not_emulated(monkeypatch, small, large, expected):
    sizes = []

    def probe(dtype, *size):
        sizes.append(size)
        if size == (256, 256, 256):
            return small
        if large is None:
            pytest.fail('a CPU without bf16 units was probed at the model size too')
        return large
    monkeypatch.setattr(runtime, 'cpu_autocast_speedup', probe)
    used, reason = runtime.resolve_amp('auto', 'cpu', 'bfloat16', (4096, 768, 768))
    assert used is expected
    if large is None:  # the reason names the probe that decided
        assert sizes == [(256, 256, 256)] and '256x256 @ 256x256' in reason and '0.02x' in reason
    else:
        assert sizes[-1] == (4096, 768, 768) and '4096x768 @ 768x768' in reason and f'{large:.2f}x' in reason


def test_cpu_autocast_probe_measures_a_ratio():
    speedup = runtime.cpu_autocast_speedup(torch.bfloat16, 256, 128, 128, 0.05)
    assert 0.01 < speedup < 100
    assert runtime.cpu_autocast_speedup(torch.bfloat16, 256, 128, 128, 0.05) == speedup  # cached per process


def test_cpu_autocast_probe_outlasts_a_burst_of_other_work(monkeypatch):
    """A product that takes 1 ms in float32 and 0.5 ms in bfloat16, on a machine where other work slows every
    product by 5 ms for 60 ms from the first bfloat16 one (as on a busy shared machine): 2x, not a ratio of the
    burst. Timing all float32 products, then all bfloat16 ones inside the burst, once read 0.2x: bf16 off."""
    real_mm, burst = torch.mm, []

    def mm(x, y):
        now = time.perf_counter()
        if x.dtype == torch.bfloat16 and not burst:
            burst.append(now + 0.06)
        time.sleep((1e-3 if x.dtype == torch.float32 else 5e-4) + (5e-3 if burst and now < burst[0] else 0.))
        return real_mm(x[:1], y)
    monkeypatch.setattr(torch, 'mm', mm)
    speedup = runtime.cpu_autocast_speedup.__wrapped__(torch.bfloat16, 8, 8, 8)
    assert 1.6 < speedup < 2.4, speedup


# --- --torchcompile: a backend, or 'auto' decided by a probe of the training step; checkpoints stay plain ------

class _CountingCompile:
    """Stands in for torch.compile: records the backend and counts the training forwards that go through it."""

    def __init__(self):
        self.backends, self.calls = [], 0

    def __call__(self, model, backend='inductor', **kwargs):
        self.backends.append(backend)
        counter = self

        class Compiled(torch.nn.Module):  # a Module, as torch.compile's OptimizedModule is
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                counter.calls += 1
                return self.model(*args)
        return Compiled()


# eager 40 ms/step; compiled 30 ms/step after a compile of 0.1 s (pays within a 1-epoch run) or of 1 hour (does not)
@pytest.mark.parametrize('compile_s', [0.1, 3600.])
def test_torchcompile_auto_weighs_compile_time_against_the_steps_left(monkeypatch, tmp_path, compile_s):
    fake = _CountingCompile()
    monkeypatch.setattr(torch, 'compile', fake)
    measured = {'eager': (0., 0.040), 'inductor': (compile_s, 0.030)}
    monkeypatch.setattr(compile_choice, 'time_training_steps', lambda *a, **k: (measured, {}))
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 1, '--torchcompile', 'auto',
                                 '--output', tmp_path, '--experiment', 'auto'])))
    steps = 1437 // 32  # digits' training split, the recipe's batch size, the short batch dropped
    compiled = compile_s + steps * 0.030 < steps * 0.040
    assert fake.backends == ['inductor']  # on the CPU: no CUDA-graph choice
    assert (fake.calls > 0) == compiled  # the epoch trained (and evaluated) through the compiled model, or not
    used = yaml.safe_load((tmp_path / 'auto' / 'args.yaml').read_text())
    assert used['torchcompile'] == 'auto' and used['torchcompile_used'] == ('inductor' if compiled else False)
    assert 'eager 40.0 ms/step; --torchcompile auto: inductor 30.0 ms/step after a' in used['torchcompile_reason']
    assert f'over {steps:,} steps' in used['torchcompile_reason']
    assert 'torchcompile_used' not in yaml.safe_load((tmp_path / 'auto' / 'recipe.yaml').read_text())


def test_choose_compile_minimises_compile_time_plus_steps_left_times_step_time():
    measured = {'eager': (0., 0.041), 'inductor': (10., 0.030), 'inductor (reduce-overhead)': (60., 0.020)}
    for steps_left in (100, 1000, 20000):
        cost = {label: c + steps_left * s for label, (c, s) in measured.items()}
        best, lines = compile_choice.choose_compile(measured, steps_left)
        assert best == min(cost, key=cost.get)
        assert len(lines) == len(measured) + 1 and lines[-1].startswith(f'-> {best}: ')
    assert compile_choice.choose_compile(measured, 100)[0] == 'eager'  # 4.1 s against 13 s and 62 s
    assert compile_choice.choose_compile(measured, 1000)[0] == 'inductor'  # 10 + 30 s against 41 s eager, 80 s graphs
    assert compile_choice.choose_compile(measured, 20000)[1] == [  # 820 s eager, 610 s, 460 s
        'eager 41.0 ms/step', 'inductor 30.0 ms/step after a 10.0 s compile',
        'inductor (reduce-overhead) 20.0 ms/step after a 0:01:00 compile',
        '-> inductor (reduce-overhead): saves ~0:06:00 over 20,000 steps against eager']
    assert compile_choice.choose_compile(measured, 100)[1][-1] == \
        '-> eager: inductor would take ~8.9 s longer over 100 steps'


def test_auto_weighs_cuda_graphs_on_cuda_only():
    assert list(compile_choice.compile_choices('cpu')) == ['eager', 'inductor']
    assert compile_choice.compile_choices('cuda') == {'eager': (None, None), 'inductor': ('inductor', None),
                                               'inductor (reduce-overhead)': ('inductor', 'reduce-overhead')}
    assert compile_choice.compile_choices('cuda', 'max-autotune') == {'eager': (None, None),
                                                               'inductor (max-autotune)': ('inductor', 'max-autotune')}


def test_torchcompile_mode_reaches_torch_compile_and_is_a_recipe_key(monkeypatch, tmp_path):
    recipe = tmp_path / 'graphs.yaml'
    recipe.write_text('model: sa_quadratic_cifar\ntorchcompile: inductor\ntorchcompile_mode: reduce-overhead\n')
    args = parse_run_args(['-c', str(recipe)])[0]
    assert (args.torchcompile, args.torchcompile_mode) == ('inductor', 'reduce-overhead')
    assert parse_run_args(['-c', str(recipe), '--torchcompile-mode', 'none'])[0].torchcompile_mode is None
    with pytest.raises(SystemExit):
        parse_run_args(['--torchcompile-mode', 'reduce_overhead'])

    modes = []

    def compile_(model, backend='inductor', mode=None, **kwargs):
        modes.append((backend, mode))
        return model
    monkeypatch.setattr(torch, 'compile', compile_)
    _, used, used_mode, _ = compile_choice.resolve_torchcompile('inductor', torch.nn.Linear(2, 2), None,
                                                        mode='reduce-overhead')
    assert modes == [('inductor', 'reduce-overhead')] and (used, used_mode) == ('inductor', 'reduce-overhead')


def test_torchcompile_auto_trains_eagerly_when_compiling_fails():
    def probe(callables):
        raise RuntimeError('no C++ compiler found\nmore')
    model = torch.nn.Linear(2, 2)
    trains, used, mode, why = compile_choice.resolve_torchcompile('auto', model, probe)
    assert trains is model and used is False and mode is None
    assert why == ['--torchcompile auto: eager, compiling failed (RuntimeError: no C++ compiler found)']


def test_a_choice_that_fails_to_compile_is_left_out_and_the_others_still_weigh():
    """One compiled choice raising in its warm-up (as CUDA graphs can where plain inductor works) leaves the
    others in the race, and the log names it; with every compiled choice failing, eager is what is left."""
    model = torch.nn.Linear(4, 3)
    images, targets = torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    calls = []

    def works(x):
        calls.append(x.shape)
        return model(x)

    def fails(x):
        raise RuntimeError('CUDA graph capture failed\ntraceback')
    measured, failures = compile_choice.time_training_steps(
        model, {'eager': model, 'inductor': works, 'inductor (reduce-overhead)': fails}, images, targets,
        torch.nn.functional.cross_entropy, nullcontext, rounds=2, steps=1, warmup=1)
    assert set(measured) == {'eager', 'inductor'} and len(calls) == 1 + 2  # warm-up, then one step per round
    assert failures == {'inductor (reduce-overhead)': 'RuntimeError: CUDA graph capture failed'}
    wrong_width = torch.nn.Linear(5, 3)  # the model itself failing is no compile failure: it is raised
    with pytest.raises(RuntimeError, match='shapes cannot be multiplied'):
        compile_choice.time_training_steps(wrong_width, {'eager': wrong_width}, images, targets, None, nullcontext)

    def probe(callables):
        assert set(callables) == {'eager', 'inductor'}
        return {'eager': (0., 0.040)}, {'inductor': 'BackendCompilerFailed: no C++ compiler'}
    trains, used, mode, why = compile_choice.resolve_torchcompile('auto', model, probe, steps_left=10)
    assert trains is model and used is False
    assert why == ['--torchcompile auto: inductor failed to compile (BackendCompilerFailed: no C++ compiler), '
                   'left out', '--torchcompile auto: eager 40.0 ms/step', '--torchcompile auto: -> eager: the only '
                   'choice left']


@pytest.mark.parametrize('kept, released', [('eager', True), ('inductor', True),
                                             ('inductor (reduce-overhead)', False)])
def test_auto_releases_the_cuda_graphs_of_a_choice_it_does_not_keep(monkeypatch, kept, released):
    """On CUDA the probe records CUDA graphs for the reduce-overhead choice; kept or not, their private memory pool
    stays allocated until the trees are reset: released unless that choice trains."""
    from torch._inductor import cudagraph_trees
    resets = []
    monkeypatch.setattr(cudagraph_trees, 'reset_cudagraph_trees', lambda: resets.append('reset'))
    monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: True)
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: resets.append('emptied'))
    monkeypatch.setattr(torch, 'compile', lambda model, **kwargs: model)
    step_s = {'eager': 0.05, 'inductor': 0.05, 'inductor (reduce-overhead)': 0.05, kept: 0.01}

    def probe(callables):
        assert set(callables) == set(step_s)  # the CUDA choices
        return {label: (0., s) for label, s in step_s.items()}, {}
    _, used, mode, why = compile_choice.resolve_torchcompile('auto', torch.nn.Linear(2, 2), probe, steps_left=10,
                                                      device='cuda')
    assert why[-1].startswith(f'--torchcompile auto: -> {kept}:')
    assert resets == (['reset', 'emptied'] if released else [])


def test_time_training_steps_leaves_weights_statistics_and_rng_as_they_were():
    import timm
    model = timm.create_model('resnet18_cifar', channels=(4, 8, 8, 8), drop_rate=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    images, targets = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    rng = torch.get_rng_state()
    measured, failures = compile_choice.time_training_steps(
        model, {'eager': model, 'compiled': torch.compile(model, backend='eager')}, images, targets,
        torch.nn.functional.cross_entropy, nullcontext, rounds=1, steps=1, warmup=1)
    assert set(measured) == {'eager', 'compiled'} and measured['eager'][0] == 0. and failures == {}
    assert all(compile_s >= 0 and step_s > 0 for compile_s, step_s in measured.values())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running statistics included
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)  # the dropout draws of the probe are undone


@pytest.mark.slow
def test_compiled_training_writes_plain_checkpoints(tmp_path):
    import timm
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 1, '--torchcompile', 'eager',
                                 '--output', tmp_path, '--experiment', 'compiled'])))
    ckpt = _load(tmp_path / 'compiled' / 'last.pth.tar')
    assert not [k for k in ckpt['state_dict'] if '_orig_mod' in k]
    timm.create_model(ckpt['arch'], **ckpt['model_args']).load_state_dict(ckpt['state_dict'])
    assert ckpt['args']['torchcompile_used'] == 'eager'


# --- a fine-tune's recipe.yaml names its starting weights ------------------------------------------------

def test_fine_tune_recipe_keeps_initial_checkpoint(adamw_run, tmp_path):
    _run_until_first_train_step(['-c', DIGITS_RECIPE, *TINY, '--initial-checkpoint', adamw_run,
                                 '--output', tmp_path, '--experiment', 'ft'])
    recipe = yaml.safe_load((tmp_path / 'ft' / 'recipe.yaml').read_text())
    assert recipe['initial_checkpoint'] == str(adamw_run)
    assert 'output' not in recipe and 'experiment' not in recipe  # still no other machine fields


# --- --num-classes with --initial-checkpoint: all but the classifier -------------------------------------

def test_other_num_classes_loads_all_but_the_classifier(adamw_run, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger='train'):
        training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--initial-checkpoint', adamw_run, '--num-classes',
                                     12, '--epochs', 1, '--lr', 0, '--weight-decay', 0, '-b', 64, '--output',
                                     tmp_path, '--experiment', 'twelve', '--log-interval', 100])))
    start, tuned = _load(adamw_run)['state_dict'], _load(tmp_path / 'twelve' / 'last.pth.tar')['state_dict']
    assert tuned['head.weight'].shape == (12, 16) and start['head.weight'].shape == (10, 16)
    for key, value in start.items():
        if not key.startswith('head.'):
            assert torch.equal(tuned[key], value), key
    assert 'classifier (head.weight, head.bias) is left out' in caplog.text


# --- --model local-dir:<folder>, as timm's train.py takes it: the folder's architecture ------------------------

KEPT_MODEL = ROOT / 'zoo' / 'fashion-mnist-cpu' / 'sa_quadratic_cifar'  # pads its 28x28 input itself (2 pixels)


def _first_training_images(argv):
    """Run training.main in this process until its model's first forward in training mode; the shape of the
    images it was given."""
    def register_hook(stop):
        def pre_hook(module, inputs):
            # a batch (not a transform's one image) in training: the model's own forward comes before its layers'
            if module.training and torch.is_grad_enabled() and inputs and getattr(inputs[0], 'ndim', 0) == 4:
                stop(tuple(inputs[0].shape))
        return torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    return _run_until_stopped(argv, register_hook)


@pytest.mark.parametrize('pretrained', [True, False])
def test_a_local_dir_model_trains_as_its_architecture_at_its_input_size(tmp_path, caplog, pretrained):
    """The kept model on digits: it gets the 28x28 images that its config.json gives (not 28 less its border
    again), and the run names the architecture and the arguments that rebuild it, so that sa-vision-validate and
    --export read its checkpoints (not the name of a folder); --pretrained starts from the folder's weights as
    --initial-checkpoint loads them, without it the weights are new."""
    from sa_vision.train.checkpoint import read_checkpoint
    with caplog.at_level(logging.INFO, logger='train'):
        shape = _first_training_images(['--model', f'local-dir:{KEPT_MODEL}', *['--pretrained'] * pretrained,
                                        '--dataset', 'digits', '-b', 8, '--workers', 0, '--output', tmp_path,
                                        '--experiment', 'run'])
    kept = read_checkpoint(KEPT_MODEL)
    assert shape == (8, *kept.meta['pretrained_cfg']['input_size']) == (8, 3, 28, 28)
    run_args = yaml.safe_load((tmp_path / 'run' / 'args.yaml').read_text())
    assert run_args['model'] == 'sa_quadratic_cifar' and run_args['model_given'] == f'local-dir:{KEPT_MODEL}'
    from sa_vision.train.timm_args import TIMM_MODEL_KWARGS  # written as timm's train.py arguments (num_classes)
    assert {**run_args['model_kwargs'], **{key: run_args[arg] for key, arg in TIMM_MODEL_KWARGS.items()
                                           if run_args.get(arg) is not None}} == kept.model_args
    assert run_args['initial_checkpoint'] == (str(KEPT_MODEL) if pretrained else '')
    assert not run_args['pretrained']  # the weights come from the folder, not from the registered name's
    said = ('from its weights, as --initial-checkpoint' if pretrained else
            'with the arguments of its config.json, weights initialised anew')
    assert f'--model local-dir:{KEPT_MODEL}: sa_quadratic_cifar {said}' in caplog.text
    # its border is Fashion-MNIST's black, not the digits' (normalised as CIFAR-10: black at -0.4914 / 0.2023)
    assert 'which is not black in the normalisation of digits ([-2.4291, ' in caplog.text, caplog.text
    assert 'pass --model-kwargs "input_pad_value=[-2.4291, -2.4183, -2.2214]"' in caplog.text


def test_a_border_that_is_black_in_the_datas_normalisation_is_not_noted():
    from sa_vision.train.data import FASHION_MNIST, dataset_info
    from sa_vision.train.data_fit import pad_value_note
    info = dataset_info(FASHION_MNIST)
    black = -info.mean[0] / info.std[0]  # the kept models' input_pad_value
    assert pad_value_note([black] * 3, {'mean': info.mean, 'std': info.std}, FASHION_MNIST) is None
    assert pad_value_note(None, {'mean': info.mean, 'std': info.std}, 'digits') is None


def test_fine_tuning_kept_weights_on_an_image_folder_normalises_as_the_weights_were_trained(tmp_path, capsys):
    """An image folder states no normalisation: it takes the model's, which for the kept Fashion-MNIST weights is
    Fashion-MNIST's (their config.json), not the registered name's CIFAR-10. With lr 0 the run evaluates them as
    sa-vision-validate does, and a resumed run and the export keep it."""
    from sa_vision.cli import train as train_command
    from sa_vision.cli import validate
    from sa_vision.train.checkpoint import read_checkpoint
    images, labels = fashion_mnist_test_images(40)
    folder = tmp_path / 'fm'
    for i, (image, label) in enumerate(zip(images, labels.tolist())):
        for split in ('train', 'validation'):
            (folder / split / f'c{label}').mkdir(parents=True, exist_ok=True)
            image.save(folder / split / f'c{label}' / f'{i}.png')
    run = tmp_path / 'run'
    argv = ['--model', f'local-dir:{KEPT_MODEL}', '--pretrained', '--dataset', '', '--data-dir', str(folder),
            '--val-split', 'validation', '--num-classes', '10', '--lr', '0', '--warmup-epochs', '0', '--sched',
            'none', '--workers', '0', '-b', '10', '--output', str(tmp_path), '--experiment', 'run']
    with keeping_threads():
        training.main([*argv, '--epochs', '1', '--threads', '1'])
        train_command.main(['--resume', str(run / 'last.pth.tar'), '--epochs', '2', '--export', '--threads', '1'])
    kept_mean = read_checkpoint(KEPT_MODEL).meta['pretrained_cfg']['mean']
    for ckpt in (read_checkpoint(run / 'last.pth.tar'), read_checkpoint(run / 'hub')):
        assert list(ckpt.preprocessing['mean']) == list(kept_mean) != [0.4914, 0.4822, 0.4465]
    capsys.readouterr()
    assert validate.main(['--model', f'local-dir:{KEPT_MODEL}', '--dataset', '', '--data-dir', str(folder),
                          '--threads', '1']) == 0
    validated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # the same weights and images in other batches: a near tie may flip, so within one image of 40 (76 % vs 88 %
    # with CIFAR-10's normalisation)
    assert abs(_load(run / 'last.pth.tar')['metrics']['top1'] - validated['top1']) <= 100 / 40


def test_hub_weights_and_a_second_start_are_refused_before_anything_is_built(monkeypatch, tmp_path):
    _fail_when_anything_is_built(monkeypatch)
    line = _cli_error(['--model', 'hf-hub:someone/weights', '--pretrained', '--output', str(tmp_path)])
    assert 'hf download someone/weights --local-dir DIR' in line and 'local-dir:DIR' in line, line
    line = _cli_error(['--model', f'local-dir:{KEPT_MODEL}', '--pretrained', '--initial-checkpoint',
                       str(KEPT_MODEL), '--output', str(tmp_path)])
    assert 'pass one' in line, line
    assert not list(tmp_path.iterdir())


def test_a_warm_up_as_long_as_the_run_is_noted(tmp_path, caplog):
    """The defaults warm up for the paper's 15 epochs: a shorter run would only ever warm up, silently."""
    with caplog.at_level(logging.INFO, logger='train'):
        _run_until_first_train_step(['-c', DIGITS_RECIPE, *TINY, '--epochs', 2, '--output', tmp_path,
                                     '--experiment', 'half'])  # the recipe's warm-up: half an epoch
        assert '--warmup-epochs' not in caplog.text
        _run_until_first_train_step(['-c', DIGITS_RECIPE, *TINY, '--epochs', 2, '--warmup-epochs', 2,
                                     '--output', tmp_path, '--experiment', 'whole'])
    assert ('note: --warmup-epochs 2 is not below --epochs 2: every step warms up, so the lr only rises toward '
            '--lr 0.005 and never decays') in caplog.text


# --- unknown recipe keys ------------------------------------------------------------------------------------

def _cli_error(argv):
    """The one stderr line of train.py's main under run_cli (in this process), which must exit with status 2."""
    import contextlib
    import io

    from sa_vision.errors import run_cli
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = run_cli(training.main, argv)
    assert status == 2
    lines = err.getvalue().strip().splitlines()
    assert lines[-1].startswith('error: ') and 'Traceback' not in err.getvalue()
    return lines[-1]


def test_unknown_recipe_keys_are_an_error_naming_the_nearest_key(tmp_path):
    from sa_vision.errors import RecipeError
    recipe = tmp_path / 'typo.yaml'
    recipe.write_text('model: sa_quadratic_cifar\nepoch: 1\nlr_rate: 0.01\ncolor_jitter: 0.4\n')
    with pytest.raises(RecipeError) as e:
        parse_run_args(['-c', str(recipe)])
    msg = str(e.value)
    assert "'epoch' (did you mean 'epochs'?)" in msg and "'lr_rate'" in msg and 'color_jitter' not in msg
    assert _cli_error(['-c', str(recipe)]).startswith('error: recipe')


def test_timm_only_keys_are_allowed_and_listed(tmp_path, capsys):
    from sa_vision.train.recipes import RECIPE_DIR, TIMM_ONLY_RECIPE_KEYS, check_recipe_keys, load_recipe
    ours = {a.dest for a in build_parser()._actions}
    assert not TIMM_ONLY_RECIPE_KEYS & ours  # listed as timm-only, so not read here
    recipe = tmp_path / 'timm.yaml'
    recipe.write_text('model: sa_quadratic_cifar\nmixup: 0.8\nmodel_ema: true\nscale: [1.0, 1.0]\ncutmix: 0.0\n'
                      'crop_pct: 0.9\n')
    args, _, _ = parse_run_args(['-c', str(recipe)])
    assert args.model == 'sa_quadratic_cifar'
    warning, note = capsys.readouterr().err.strip().splitlines()
    # mixup and EMA are switched on: named; the paper's whole-image crop and no cutmix leave nothing out
    assert warning.startswith(f'warning: recipe {recipe} turns on') and 'model_ema=True, mixup=0.8.' in warning
    assert note.endswith('3 other key(s) of recipe ' + str(recipe) + " that only timm's train.py reads are "
                         'ignored here: crop_pct, cutmix, scale'), note
    for path in RECIPE_DIR.glob('*.yaml'):  # the shipped recipes hold no unknown key, and turn nothing timm's on
        check_recipe_keys(load_recipe(path), ours, str(path))
        parse_run_args(['-c', str(path), '--initial-checkpoint', 'any'])
        assert 'warning' not in capsys.readouterr().err, path


def test_a_timm_args_yaml_names_what_it_turns_on_and_counts_the_rest(tmp_path, capsys):
    """timm's train.py writes every argument to its args.yaml, at timm's defaults where not given: its ImageNet
    augmentation (random-resized crop, colour jitter) is on, and EMA and mixup are where they were asked for."""
    from sa_vision.train.timm_args import TIMM_ONLY, TIMM_TRAIN_ARGS
    timm_only = {key: None for key, use in TIMM_TRAIN_ARGS.items() if use == TIMM_ONLY}
    saved = {**timm_only, 'model': 'sa_quadratic_cifar', 'lr': 0.05, 'model_ema': True, 'model_ema_decay': 0.9998,
             'scale': [0.08, 1.0], 'ratio': [0.75, 1.3333333333333333], 'color_jitter': 0.4, 'mixup': 0.0}
    recipe = tmp_path / 'args.yaml'
    recipe.write_text(yaml.safe_dump(saved))
    parse_run_args(['-c', str(recipe)])
    warning, note = capsys.readouterr().err.strip().splitlines()
    assert ": model_ema=True, scale=[0.08, 1.0], ratio=[0.75, 1.3333333333333333], color_jitter=0.4. " in warning
    assert note.startswith(f'note: {len(timm_only) - 4} other key(s) of recipe') and 'mixup' not in note


@pytest.mark.parametrize('extra, lr', [
    ('batch_size: 128\n', 0.1 * 128 / 256),  # timm's train.py: lr_base x global batch / lr_base_size, linear for SGD
    ('batch_size: 64\nopt: adamw\nlr_base: 0.002\n', 0.002 * (64 / 256) ** 0.5),  # sqrt for the Adam family
    ('batch_size: 64\nlr_base_size: 512\nlr_base_scale: sqrt\n', 0.1 * (64 / 512) ** 0.5),
    ('batch_size: 32\nopt: sgd\ngrad_accum_steps: 4\n', 0.1 * 32 * 4 / 256),  # the global batch accumulates
])
def test_a_null_lr_is_refused_with_the_lr_timm_would_have_used(extra, lr, tmp_path):
    from sa_vision.errors import RecipeError
    recipe = tmp_path / 'args.yaml'
    recipe.write_text('model: sa_quadratic_cifar\nlr: null\n' + extra)
    with pytest.raises(RecipeError, match=rf'--lr is null in recipe .*: --lr {lr:.4g} is what train.py used'):
        parse_run_args(['-c', str(recipe)])
    assert parse_run_args(['-c', str(recipe), '--lr', '0.01'])[0].lr == 0.01  # the command line's lr is taken


def _help_of(argv, capsys) -> dict:
    """``--help``'s text after each option string of its first line (wrapped lines joined)."""
    with pytest.raises(SystemExit):
        training.main([*argv, '--help'])
    text, entries, option = capsys.readouterr().out.split('\noptions:', 1)[1], {}, None
    for line in text.splitlines():
        if line.startswith('  -'):
            option = line.split()[0].rstrip(',')
            entries[option] = line
        elif option and line.startswith('    '):
            entries[option] += ' ' + line.strip()
    return entries


def test_help_shows_the_defaults_in_force_the_papers_or_the_recipes(capsys):
    """A timm user's flags take the paper's defaults here (batch 100, lr 0.1, 15 warm-up epochs), not timm's:
    --help says so, and with -c the recipe's, which replace them."""
    plain = _help_of([], capsys)
    for option, default in (('-b', 100), ('--lr', 0.1), ('--warmup-epochs', 15), ('--weight-decay', 0.0001),
                            ('--epochs', 300), ('--model', 'sa_quadratic_cifar'), ('--dataset', 'digits')):
        assert f'default: {default}' in plain[option], plain[option]
    recipe = yaml.safe_load(DIGITS_RECIPE.read_text())
    with_recipe = _help_of(['-c', str(DIGITS_RECIPE)], capsys)
    for option, key in (('-b', 'batch_size'), ('--lr', 'lr'), ('--warmup-epochs', 'warmup_epochs'),
                        ('--epochs', 'epochs')):
        assert f'default: {recipe[key]})' in with_recipe[option] + ')', with_recipe[option]
    # an option that is off or unset until given says nothing of a default
    assert not [line for line in plain.values() if 'default: None' in line or 'default: False' in line]
    assert 'default' not in plain['--pretrained'] + plain['--num-classes']


# --- argument checks come before anything is built ---------------------------------------------------------

def _fail_when_anything_is_built(monkeypatch):
    """Building a model or a dataset fails the test: the run's arguments must have been checked before."""
    import timm

    def built(*args, **kwargs):
        pytest.fail(f'built {args[:1]} before the arguments were checked')
    monkeypatch.setattr(timm, 'create_model', built)
    monkeypatch.setattr(run_setup, 'create_image_dataset', built)


def test_unknown_scheduler_is_one_error_line_before_anything_is_built(monkeypatch, tmp_path):
    _fail_when_anything_is_built(monkeypatch)
    out = tmp_path / 'out'
    line = _cli_error(['--sched', 'cosin', *TINY, '--output', str(out)])
    assert "'cosin'" in line and "did you mean 'cosine'" in line
    for name in ('cosine', 'multistep', 'plateau', 'none'):  # timm's own names, as create_scheduler_v2 takes them
        assert f'{name},' in line or f'{name} ' in line or line.endswith(name), line
    assert not out.exists()
    # timm's plateau scheduler steps once per epoch on the evaluation metric
    assert '--no-sched-on-updates' in _cli_error(['--sched', 'plateau', *TINY, '--output', str(out)])
    assert not out.exists()


@pytest.mark.parametrize('name, value', [('eval_metric', 'acc1'), ('amp_dtype', 'fp16'), ('clip_mode', 'nrom')])
def test_a_value_outside_its_choices_is_one_error_line_before_anything_is_written(name, value, tmp_path):
    """argparse checks a flag's choices on the command line only; a recipe's value (a default there) is checked
    as well, before the run folder is made, where it would fail after an epoch (--eval-metric) or a step."""
    flag, out = '--' + name.replace('_', '-'), tmp_path / 'out'
    with pytest.raises(SystemExit) as refused:
        training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--output', out, flag, value])))
    assert refused.value.code == 2
    recipe = tmp_path / 'recipe.yaml'
    recipe.write_text(yaml.safe_dump({**yaml.safe_load(DIGITS_RECIPE.read_text()), name: value}))
    line = _cli_error(list(map(str, ['-c', recipe, *TINY, '--output', out])))
    assert f"{flag} is '{value}' in recipe {recipe}, it must be one of" in line, line
    assert not out.exists()


@pytest.mark.parametrize('argv, expected', [
    ([], {'decay_t': 90 * 3}),  # timm's default: every 90 epochs (per update here: 3 updates an epoch)
    (['--decay-epochs', '2', '--decay-rate', '0.5'], {'decay_t': 2 * 3, 'decay_rate': 0.5}),
])
def test_the_step_schedule_takes_its_decay_epochs(argv, expected, monkeypatch):
    """--decay-epochs reaches timm's StepLRScheduler (and --patience-epochs its plateau scheduler)."""
    from timm.scheduler import PlateauLRScheduler, StepLRScheduler
    args = build_parser().parse_args(['--sched', 'step', *argv])
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler, _ = run_setup.create_scheduler(optimizer, args, updates_per_epoch=3)
    assert isinstance(scheduler, StepLRScheduler)
    assert {k: getattr(scheduler, k) for k in expected} == expected
    args = build_parser().parse_args(['--sched', 'plateau', '--no-sched-on-updates', '--patience-epochs', '4'])
    scheduler, _ = run_setup.create_scheduler(optimizer, args, updates_per_epoch=3)
    assert isinstance(scheduler, PlateauLRScheduler) and scheduler.lr_scheduler.patience == 4


@pytest.mark.slow
def test_schedulers_without_a_per_step_schedule_train(tmp_path):
    """'none' (timm: no scheduler, the optimizer's lr throughout) runs to the end and resumes; 'plateau' is
    stepped with the evaluation metric (the best value torch's ReduceLROnPlateau has seen)."""
    base = ['-c', DIGITS_RECIPE, *TINY, '-b', 64, '--output', tmp_path, '--log-interval', 100]
    training.main(list(map(str, base + ['--sched', 'none', '--epochs', 1, '--experiment', 'none'])))
    training.main(['--resume', str(tmp_path / 'none' / 'last.pth.tar'), '--epochs', '2'])
    ckpt = _load(tmp_path / 'none' / 'last.pth.tar')
    assert ckpt['epoch'] == 1 and [h['lr'] for h in ckpt['history']] == [0.005, 0.005]  # the recipe's lr, no warm-up
    training.main(list(map(str, base + ['--sched', 'plateau', '--no-sched-on-updates', '--warmup-epochs', 0,
                                        '--epochs', 1, '--experiment', 'plateau'])))
    ckpt = _load(tmp_path / 'plateau' / 'last.pth.tar')
    assert ckpt['scheduler']['best'] == ckpt['metrics']['top1']


# --- dataset names and folders -----------------------------------------------------------------------------

def test_unknown_dataset_name_lists_the_known_ones():
    from sa_vision.errors import DatasetError
    from sa_vision.train.data import create_image_dataset
    with pytest.raises(DatasetError, match=r"unknown dataset 'cifar-10'.*digits.*fashion-mnist.*torch/cifar10"):
        create_image_dataset('cifar-10', 'train', is_training=True)
    assert _cli_error(['--dataset', 'cifar-10', *TINY, '--output', '/nonexistent/never-written']).startswith(
        "error: unknown dataset 'cifar-10'")


@pytest.mark.parametrize('argv, message', [
    (['--dataset', 'cifar-10'], "unknown dataset 'cifar-10'"),
    (['--dataset', 'torch/cifar10'], "dataset 'torch/cifar10' needs --data-dir"),
    (['--dataset', '', '--data-dir', '{tmp}/nope'], '--data-dir {tmp}/nope does not exist'),
    (['--dataset', 'fashion-mnist', '--data-dir', '{tmp}/nope'], '--data-dir {tmp}/nope does not exist'),
    (['--dataset', '', '--data-dir', '{tmp}/folder'], "the image folder {tmp}/folder has no 'validation' subfolder"),
    (['--dataset', '', '--data-dir', '{tmp}/folder', '--train-split', 'fit', '--val-split', 'train'],
     "the image folder {tmp}/folder has no 'fit' subfolder"),
    (['--dataset', 'fashion-mnist', '--data-dir', '{tmp}/folder'], 'train-images-idx3-ubyte.gz (or'),
    (['--dataset', 'digits', '--val-split', 'holdout'], "digits has the splits 'train' and 'test', got 'holdout'"),
    (['--dataset', '', '--data-dir', '{tmp}/folder/train/cat/x.png'], 'cat/x.png is a file, not a folder'),
    (['--dataset', '', '--data-dir=~/data'], '--data-dir ~/data does not exist (a ~ is not expanded after "="'),
    (['--dataset', 'digits', '--output=~/runs'], '--output ~/runs: a ~ is expanded by the shell only at the start'),
], ids=['unknown-name', 'no-data-dir', 'missing-data-dir', 'missing-fashion-dir', 'no-held-out-folder',
        'no-train-folder', 'no-fashion-files', 'unknown-digits-split', 'data-dir-a-file', 'data-dir-tilde',
        'output-tilde'])
def test_dataset_errors_come_before_anything_is_built(argv, message, monkeypatch, tmp_path):
    from PIL import Image
    _fail_when_anything_is_built(monkeypatch)
    (tmp_path / 'folder' / 'train' / 'cat').mkdir(parents=True)  # an image folder without a held-out split
    Image.new('RGB', (4, 4)).save(tmp_path / 'folder' / 'train' / 'cat' / 'x.png')
    out = tmp_path / 'out'
    line = _cli_error([*TINY, '--output', str(out)] + [a.replace('{tmp}', str(tmp_path)) for a in argv])
    assert message.replace('{tmp}', str(tmp_path)) in line, line
    assert not out.exists()


def test_missing_data_dir_says_so(tmp_path):
    from sa_vision.train.data import create_image_dataset
    for dataset in ('', 'fashion-mnist', 'torch/cifar10'):
        with pytest.raises(FileNotFoundError, match=f'--data-dir {tmp_path / "nope"} does not exist'):
            create_image_dataset(dataset, 'train', is_training=True, data_dir=str(tmp_path / 'nope'))


def test_train_split_message_does_not_advise_val_split(tmp_path):
    from sa_vision.train.data import create_image_dataset
    (tmp_path / 'validation' / 'cat').mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as e:
        create_image_dataset('', 'train', is_training=True, data_dir=str(tmp_path))
    assert '--val-split' not in str(e.value) and '--train-split' in str(e.value)


def _synonyms_named(line: str):
    """The subfolder names the error line gives in its parentheses, as the names timm takes for the split."""
    taken = line.split(' subfolder (', 1)[1].split(')', 1)[0]
    return set(re.findall(r'(\w+)/', taken))


def test_a_missing_held_out_split_names_only_timms_synonyms_and_the_flag_that_reads_a_present_one(tmp_path):
    """The digits recipe asks for val_split 'test' (timm takes it by no other name) of a folder with train/ and
    validation/: the error names no synonym and the --val-split that reads validation/, and that one passes."""
    from PIL import Image
    from timm.data.dataset_factory import _EVAL_SYNONYM, _TRAIN_SYNONYM

    from sa_vision.train.data import check_dataset
    imgs = tmp_path / 'imgs'
    for split in ('train', 'validation'):
        (imgs / split / 'cat').mkdir(parents=True)
        Image.new('RGB', (4, 4)).save(imgs / split / 'cat' / '0.png')
    line = _cli_error(['-c', 'sa_quadratic_cifar_digits', '--dataset', '', '--data-dir', str(imgs), *TINY,
                       '--output', str(tmp_path / 'out')])
    assert f"the image folder {imgs} has no 'test' subfolder" in line, line
    assert 'test' not in _EVAL_SYNONYM and 'test' not in _TRAIN_SYNONYM and _synonyms_named(line) == set(), line
    assert 'pass --val-split validation ' in line, line
    check_dataset('', str(imgs), train_split='train', eval_split='validation')  # the advice works
    # a folder without any held-out one: timm's other names for the split asked, no flag to pass
    shutil.rmtree(imgs / 'validation')
    line = _cli_error(['--dataset', '', '--data-dir', str(imgs), *TINY, '--output', str(tmp_path / 'out')])
    assert _synonyms_named(line) == set(_EVAL_SYNONYM) - {'validation'}, line
    assert 'pass --val-split' not in line and 'the training images are never evaluated' in line, line
    # a training split: timm's training synonyms, and the --train-split that reads train/
    line = _cli_error(['--dataset', '', '--data-dir', str(imgs), '--train-split', 'fit', *TINY, '--output',
                       str(tmp_path / 'out')])
    assert _synonyms_named(line) == set() and 'pass --train-split train ' in line, line


def test_validate_takes_the_val_split_the_image_folder_error_names(tmp_path, capsys):
    from sa_vision.cli import validate
    from sa_vision.errors import run_cli
    (tmp_path / 'test' / 'cat').mkdir(parents=True)
    assert run_cli(validate.main, ['--dataset', '', '--data-dir', str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: the image folder {tmp_path} has no 'validation' subfolder"), line
    assert 'pass --val-split test ' in line, line
    assert validate._parser().parse_args(['--val-split', 'test']).split == 'test'


def test_a_torchvision_name_given_as_an_image_folder_is_named_and_long_folders_are_cut(monkeypatch, tmp_path):
    """timm reads CIFAR-100 only as torch/cifar100: 'cifar100' is an image folder's name, whose missing split says
    which name was meant; and a folder of hundreds of subfolders is not listed whole."""
    _fail_when_anything_is_built(monkeypatch)
    for i in range(30):
        (tmp_path / 'data' / f'sub{i:02d}').mkdir(parents=True)
    line = _cli_error(['--dataset', 'cifar100', '--data-dir', str(tmp_path / 'data'), '--output', str(tmp_path)])
    assert "torchvision's is --dataset torch/cifar100" in line, line
    assert "'sub11', '... 18 more']" in line and 'sub12' not in line, line
    line = _cli_error(['--dataset', 'flowers', '--data-dir', str(tmp_path / 'data'), '--output', str(tmp_path)])
    assert 'torch/' not in line, line  # a name of no torchvision dataset is an image folder's, as ever


# --- image folders of any size -----------------------------------------------------------------------------

def test_image_folder_of_mixed_sizes_is_resized_to_the_input_size(tmp_path):
    from PIL import Image

    from sa_vision.train.data import create_image_dataset
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    colours = {'a': (200, 40, 120), 'b': (10, 250, 90)}
    sizes = [(32, 32), (48, 40), (20, 64), (7, 9)]  # (width, height)
    for cls, colour in colours.items():
        for split in ('train', 'validation'):
            (tmp_path / split / cls).mkdir(parents=True)
            for i, size in enumerate(sizes):
                Image.new('RGB', size, colour).save(tmp_path / split / cls / f'{i}.png')
    gen = torch.Generator().manual_seed(0)
    pattern = (torch.rand(3, 32, 32, generator=gen) * 255).round().to(torch.uint8)
    Image.fromarray(pattern.permute(1, 2, 0).numpy()).save(tmp_path / 'validation' / 'a' / 'pattern.png')
    for split, is_training in (('train', True), ('validation', False)):
        ds = create_image_dataset('', split, is_training=is_training, data_dir=str(tmp_path), crop_padding=0,
                                  hflip=0., mean=mean, std=std)
        images, targets = next(iter(torch.utils.data.DataLoader(ds, batch_size=len(ds))))  # collate: one size
        assert images.shape == (len(ds), 3, 32, 32)
        for image, target in zip(images, targets):
            colour = colours['ab'[int(target)]]
            if image.std() == 0 or len(set(image[0].flatten().tolist())) == 1:  # a plain-colour file
                expected = torch.tensor([(c / 255 - m) / s for c, m, s in zip(colour, mean, std)])
                torch.testing.assert_close(image[:, 0, 0], expected, rtol=0, atol=1e-5)
    # a 32x32 image is not resampled: exactly its pixels, normalised
    ds = create_image_dataset('', 'validation', is_training=False, data_dir=str(tmp_path), mean=mean, std=std)
    index = next(i for i, (path, _) in enumerate(ds.reader.samples) if path.endswith('pattern.png'))
    expected = (pattern.float() / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    torch.testing.assert_close(ds[index][0], expected, rtol=0, atol=1e-5)


def _three_class_folder(root):
    """An image folder of 3 classes (train/ and validation/, 2 tiny PNGs per class), as a user's own data."""
    from PIL import Image
    for split in ('train', 'validation'):
        for k, cls in enumerate(('boot', 'coat', 'shirt')):
            (root / split / cls).mkdir(parents=True)
            for i in range(2):
                Image.new('RGB', (8, 8), (80 * k, 40 * i, 200)).save(root / split / cls / f'{i}.png')
    return root


def test_num_classes_and_label_names_follow_the_image_folder(tmp_path, capsys):
    """The class folders decide the classes, and name them where timm looks for names (the export's config.json
    label_names, which timm's inference.py prints with its top-k), also after --resume. sa-vision-validate of the
    run's checkpoint reads the folder it trained on, as --resume does."""
    from sa_vision.cli import train as train_command
    from sa_vision.cli import validate
    from sa_vision.train.checkpoint import read_checkpoint
    folder = _three_class_folder(tmp_path / 'mine')
    run = tmp_path / 'out' / 'run'
    training.main(['--dataset', '', '--data-dir', str(folder), *TINY, '--epochs', '1', '-b', '3', '--threads', '1',
                   '--sched', 'none', '--workers', '0', '--output', str(tmp_path / 'out'), '--experiment', 'run'])
    ckpt = _load(run / 'last.pth.tar')
    assert ckpt['model_args']['num_classes'] == 3 and ckpt['state_dict']['head.weight'].shape[0] == 3
    classes = ['boot', 'coat', 'shirt']
    assert read_checkpoint(run).create_model().pretrained_cfg['label_names'] == classes
    with keeping_threads():
        train_command.main(['--resume', str(run / 'last.pth.tar'), '--epochs', '2', '--export'])
    assert json.loads((run / 'hub' / 'config.json').read_text())['label_names'] == classes
    # a recipe keeps no local path: the run repeats with the image folder named again
    assert '`sa-vision-train -c recipe.yaml --data-dir DIR` repeats the run' in (run / 'hub' / 'README.md').read_text()
    capsys.readouterr()
    assert validate.main(['--checkpoint', str(run / 'last.pth.tar'), '--threads', '1']) == 0
    assert f'dataset: an image folder in {folder} (the weights were trained on it' in capsys.readouterr().err


@pytest.mark.parametrize('argv', [['--num-classes', '5'], ['num_classes=5']], ids=['flag', 'model-kwargs'])
def test_a_num_classes_other_than_the_folders_is_an_error_naming_both(argv, tmp_path, monkeypatch):
    _fail_when_anything_is_built(monkeypatch)
    folder = _three_class_folder(tmp_path / 'mine')
    line = _cli_error(['--dataset', '', '--data-dir', str(folder), *TINY, *argv, '--output', str(tmp_path / 'out')])
    assert 'asked for 5 classes' in line and '3 class folders (boot, coat, shirt)' in line, line


def test_a_paper_recipe_on_an_image_folder_names_the_recipe_as_the_source_of_its_classes(tmp_path, monkeypatch):
    """The paper's recipes set num_classes 10 (CIFAR-10); on a 3-class folder the error says the number came from
    the recipe and what to pass, before anything is built."""
    _fail_when_anything_is_built(monkeypatch)
    folder = _three_class_folder(tmp_path / 'mine')
    line = _cli_error(['-c', 'sa_quadratic_cifar', '--dataset', '', '--data-dir', str(folder), *TINY,
                       '--output', str(tmp_path / 'out')])
    assert "recipe sa_quadratic_cifar sets num_classes: 10 for its dataset 'torch/cifar10'" in line, line
    assert 'pass --num-classes 3' in line, line


def test_a_paper_recipe_on_cifar100_says_to_pass_its_class_count_before_reading_it(tmp_path, monkeypatch):
    """CIFAR-100 under a paper recipe (num_classes: 10, CIFAR-10's) stopped the first batch with torch's "Target 15
    is out of bounds". It is one error line naming the count to pass, before any data is read or downloaded."""
    import timm.data
    monkeypatch.setattr(timm.data, 'create_dataset', lambda *a, **k: pytest.fail('the dataset was read'))
    line = _cli_error(['-c', 'sa_quadratic_cifar', '--dataset', 'torch/cifar100', '--data-dir', str(tmp_path),
                       '--dataset-download', *TINY, '--threads', '1', '--output', str(tmp_path / 'out')])
    assert 'has 10 classes, torch/cifar100 100' in line and 'Pass --num-classes 100' in line, line


def test_warmup_prefix_and_the_wsd_schedules_train_or_say_why_not(tmp_path, capsys, caplog):
    """timm counts a schedule's epochs from --warmup-epochs, a float here (an int in its train.py): --warmup-prefix
    and --sched wsd / rsqrt stopped every run at range(2.0) with a traceback, after its folder was written. They
    train; a fractional prefix, which would end the run before its schedule, and a wsd decay longer than the
    schedule are one error line, before any folder."""
    base = ['-c', DIGITS_RECIPE, *TINY, '--epochs', 1, '--threads', 1, '--log-interval', 100, '--output', tmp_path]
    for name, argv, epochs in (('prefix', ['--warmup-prefix', '--warmup-epochs', 1], 2),
                               ('wsd', ['--sched', 'wsd', '--warmup-epochs', 0.5], 1),
                               ('rsqrt', ['--sched', 'rsqrt', '--warmup-epochs', 1, '--epochs', 2], 2)):
        with caplog.at_level(logging.INFO, logger='train'):
            training.main(list(map(str, [*base, *argv, '--experiment', name])))
        assert _load(tmp_path / name / 'last.pth.tar')['num_epochs'] == epochs, name
        assert 'every step warms up' not in caplog.text, name  # a prefix's warm-up is added to the epochs
    line = _cli_error([*map(str, base), '--warmup-prefix', '--experiment', 'half'])
    assert 'adds --warmup-epochs 0.5 to the epochs' in line and '(--warmup-epochs 0 or 1)' in line, line
    line = _cli_error([*map(str, base), '--sched', 'wsd', '--decay-epochs', '5', '--experiment', 'long'])
    assert line.startswith('error: --sched wsd: wsd schedule requires 0 < decay_epochs'), line
    assert line.endswith('(counted in updates: --sched-on-updates)'), line
    line = _cli_error([*map(str, base), '--sched', 'wsd', '--warmup-epochs', '2', '--experiment', 'long'])
    assert '--warmup-epochs 2 is not below --epochs 1, and wsd fits its warm-up within them' in line, line
    assert not (tmp_path / 'half').exists() and not (tmp_path / 'long').exists()


def test_a_resumed_run_of_fewer_classes_than_the_dataset_says_to_start_a_new_one(adamw_run, tmp_path, monkeypatch):
    """Resumed on CIFAR-100, a 10-class run was told to pass --num-classes 100, which a resumed run ignores (it
    keeps its model): the advice is a new run from its weights."""
    import shutil

    import timm.data
    shutil.copytree(adamw_run.parent, tmp_path / 'run')
    monkeypatch.setattr(timm.data, 'create_dataset', lambda *a, **k: pytest.fail('the dataset was read'))
    line = _cli_error(['--resume', str(tmp_path / 'run'), '--dataset', 'torch/cifar100', '--data-dir', str(tmp_path),
                       '--dataset-download', '--num-classes', '100', '--epochs', '3'])
    assert 'has 10 classes, torch/cifar100 100' in line and 'A resumed run keeps its model: start a new run from ' \
        f'its weights, --initial-checkpoint {tmp_path / "run"} --num-classes 100' in line, line


def test_cifar10_missing_from_the_data_dir_is_one_error_line_saying_what_to_do(tmp_path, monkeypatch):
    """Instead of torchvision's own RuntimeError (a traceback) in the first epoch, one line before anything is built,
    naming --dataset-download and --dataset ''."""
    _fail_when_anything_is_built(monkeypatch)
    (tmp_path / 'empty').mkdir()  # a folder that exists but holds no CIFAR-10 (a missing one is refused earlier)
    line = _cli_error(['--dataset', 'torch/cifar10', '--data-dir', str(tmp_path / 'empty'), *TINY, '--threads', '1',
                       '--output', str(tmp_path / 'out')])
    assert line.startswith(f'error: torch/cifar10 is not in {tmp_path / "empty"}'), line
    assert '--dataset-download' in line and "--dataset ''" in line, line
    assert not (tmp_path / 'out').exists()  # no run folder is left behind


# --- one place for user errors; validate.py's split names ----------------------------------------------------------

@pytest.mark.slow
def test_scripts_exit_2_with_one_error_line(tmp_path):
    proc = _command('train', '--dataset', 'cifar-10', *TINY)
    # the log lines before it go to stderr too; the error is the last line, without a traceback
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: unknown dataset 'cifar-10'"), proc.stderr


@pytest.mark.slow
def test_validate_errors_are_one_line_and_split_names_agree(adamw_run, tmp_path, capsys):
    # in this process (the test above checks a script's process); run_cli is what the installed command runs
    status, _, err = command_here(capsys, 'validate', '--checkpoint', tmp_path / 'missing.pth')
    assert status == 2 and 'Traceback' not in err and err.startswith('error: ') and err.count('\n') == 1, err
    status, out, err = command_here(capsys, 'validate', '--checkpoint', adamw_run, '--dataset', 'digits',
                                    '--threads', 1)
    assert status == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    # train.py: "Top-1 on the digits test split"; the same images are the 'test' split here
    assert result['split'] == 'test' and result['num_images'] == 360
    assert result['top1'] == pytest.approx(_load(adamw_run)['metrics']['top1'])


def test_user_errors_are_value_errors_and_checkpoint_errors_are_user_errors():
    from sa_vision.train.checkpoint import CheckpointError
    assert issubclass(CheckpointError, UserError) and issubclass(UserError, ValueError)


# --- --threads: one option of sa-vision-train and sa-vision-validate ------------------------------------------------

def test_train_and_validate_have_the_same_threads_option(capsys):
    import re

    from sa_vision.cli import validate
    helps = []
    for main in (training.main, validate.main):
        with pytest.raises(SystemExit):
            main(['--help'])
        text = capsys.readouterr().out
        assert '\n  --threads N' in text
        # the paragraph of --threads: up to the next option or group, whitespace (argparse's line breaks) removed
        paragraph = re.split(r'\n  -|\n\n', text.split('\n  --threads N', 1)[1])[0]
        helps.append(re.sub(r'\s+', '', paragraph))
    assert helps[0] == helps[1] and 'default' in helps[0]


def test_threads_default_is_torchs_capped_at_the_cores_of_this_process(monkeypatch, tmp_path):
    from sa_vision.cli import validate
    before = torch.get_num_threads()
    monkeypatch.setattr(runtime, 'TORCH_DEFAULT_THREADS', 8, raising=False)  # torch's count on a bigger machine
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1}, raising=False)  # this process may use 2 cores
    try:
        torch.set_num_threads(1)
        assert _threads_in_training(['-c', DIGITS_RECIPE, *TINY, '--device', 'cpu', '--output', tmp_path,
                                     '--experiment', 'default']) == 2
        assert torch.get_num_threads() == 1  # the caller's again (sa_vision.train.caller_settings)
        assert 'threads' not in yaml.safe_load((tmp_path / 'default' / 'recipe.yaml').read_text())  # machine's
        assert _threads_in_training(['-c', DIGITS_RECIPE, *TINY, '--device', 'cpu', '--output', tmp_path,
                                     '--experiment', 'one', '--threads', 1]) == 1
        monkeypatch.setattr(runtime, 'TORCH_DEFAULT_THREADS', 1)  # torch's own count when it is the smaller
        assert validate.main(['--model', 'sa_quadratic_cifar', '--no-pretrained', *TINY, '--dataset', 'digits',
                              '-b', '360']) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_image_folder_error_names_the_commands_that_take_its_flag(tmp_path, capsys):
    """The advice names the commands that take the flag (sa-vision-explore too, whose --val-split reads a split
    the weights record none of), and renaming the folder, which every command reads."""
    from sa_vision.cli import explore
    from sa_vision.errors import run_cli
    (tmp_path / 'imgs' / 'test' / 'cat').mkdir(parents=True)
    argv = ['sa_quadratic_cifar', '--no-pretrained', '--dataset', '', '--data-dir', str(tmp_path / 'imgs'),
            '--out', str(tmp_path / 'page.html')]
    assert run_cli(explore.main, argv) == 2
    line = capsys.readouterr().err.strip()
    assert ('pass --val-split test to read ' in line and '(sa-vision-train, sa-vision-validate, sa-vision-explore), '
            'or rename that folder validation/' in line), line


def test_resume_steps_with_this_machines_optimizer_implementation(adamw_run, tmp_path):
    """A checkpoint of a fused AdamW (a GPU run's, --opt-fused auto) resumed on a CPU steps with the CPU's choice,
    and the other way round: torch's load_state_dict alone would bring back the saved groups' implementation."""
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(adamw_run.parent, run)
    fused = []
    for opt_fused in ('on', 'auto'):
        ckpt = _load(run / 'last.pth.tar')
        ckpt['epoch'], ckpt['history'] = 0, ckpt['history'][:1]  # as if killed after its first of 2 epochs (epoch 0)
        torch.save(ckpt, run / 'last.pth.tar')
        training.main(['--resume', str(run / 'last.pth.tar'), '--opt-fused', opt_fused, '--log-interval', '100'])
        resumed = _load(run / 'last.pth.tar')
        assert resumed['epoch'] == 1
        fused.append([bool(g['fused']) for g in resumed['optimizer']['param_groups']])
    assert fused == [[True] * len(fused[0]), [False] * len(fused[0])]


@pytest.mark.parametrize('cores, default', [(2, 2), (1, 1), (16, 4)])
def test_the_default_workers_are_timms_4_capped_at_this_processs_cores(monkeypatch, cores, default):
    """torch warns of more loader processes than the cores a process may run on (its affinity mask): the default
    -j takes no more, a given -j and a recipe's workers stay as given, and the shipped paper recipes leave the
    number to the machine (a runtime choice, no part of a recipe)."""
    from sa_vision.train import arg_groups
    monkeypatch.setattr(arg_groups, 'available_cores', lambda: cores)
    assert build_parser().parse_args([]).workers == default
    assert build_parser().parse_args(['-j', '8']).workers == 8
    assert parse_run_args(['-c', 'sa_quadratic_cifar'])[0].workers == default
    assert parse_run_args(['-c', 'sa_quadratic_cifar_digits'])[0].workers == 0  # its recipe: in-process, tiny data


@pytest.mark.parametrize('interrupted_epoch', [0, 1])
def test_ctrl_c_ends_with_how_to_resume_and_the_printed_resume_finishes_the_run(
        tmp_path, capsys, monkeypatch, interrupted_epoch):
    """Ctrl-C inside an epoch: status 130 and one line, not a traceback; after a finished epoch it names the
    --resume that continues the run (and it does), before one it says that nothing was kept."""
    real_epoch = training.train_one_epoch

    def interrupted(epoch, *args, **kwargs):
        if epoch == interrupted_epoch:
            raise KeyboardInterrupt
        return real_epoch(epoch, *args, **kwargs)
    monkeypatch.setattr(training, 'train_one_epoch', interrupted)
    status, _, err = command_here(capsys, 'train', '-c', DIGITS_RECIPE, *TINY, '--epochs', 2, '-b', 64,
                                  '--output', tmp_path, '--experiment', 'run')
    run = tmp_path / 'run'
    assert status == 130 and err.count('\n') == 1 and 'Traceback' not in err, err
    if interrupted_epoch == 0:
        assert err == f'interrupted: no epoch had finished: delete {run} and start again\n'
        return
    assert err == f'interrupted: continue from its last finished epoch with --resume {run / "last.pth.tar"}\n'
    monkeypatch.setattr(training, 'train_one_epoch', real_epoch)
    status, _, err = command_here(capsys, 'train', *shlex.split(err.split(' with ')[1]))
    assert status == 0, err
    assert len((run / 'summary.csv').read_text().splitlines()) == 1 + 2  # its header, both epochs


def test_ctrl_c_in_any_command_is_one_line_and_status_130(capsys):
    from sa_vision.errors import run_cli

    def main(argv):
        raise KeyboardInterrupt
    assert run_cli(main, []) == 130 and capsys.readouterr().err == 'interrupted\n'


@pytest.mark.parametrize('caller_logging', [False, True])
def test_a_run_in_the_callers_process_gives_back_its_settings(tmp_path, capsys, monkeypatch, request,
                                                             caller_logging):
    """sa-vision-train's main run in a notebook leaves the process as it found it: its thread count, its CUDA
    switches (a CPU run does not touch them), and its logging. The run's lines still show: through
    logging.basicConfig where the caller set up none (taken away afterwards), else through the caller's handlers,
    also when those are at WARNING."""
    import io
    root = logging.getLogger()
    callers = logging.StreamHandler(io.StringIO())
    monkeypatch.setattr(root, 'handlers', [callers] if caller_logging else [])
    level = root.level
    root.setLevel(logging.WARNING)  # setLevel, not the attribute: it also clears the loggers' caches
    request.addfinalizer(lambda: root.setLevel(level))
    monkeypatch.setattr(torch.backends.cudnn, 'benchmark', True)
    from sa_vision.cli import train
    from sa_vision.errors import run_cli
    threads = torch.get_num_threads()
    with keeping_threads():  # the settings given back are checked inside, this only spares the later tests
        torch.set_num_threads(2)
        status = run_cli(train.main, ['-c', str(DIGITS_RECIPE), '--model-kwargs', 'embed_dim=8', 'depth=1',
                                      'heads_per_layer=2', 'mlp_hidden_dim=16', '--epochs', '1', '--threads', '1',
                                      '--output', str(tmp_path), '--experiment', 'run'])
        threads = torch.get_num_threads()
    out, err = capsys.readouterr()
    shown = callers.stream.getvalue() if caller_logging else err
    assert status == 0 and 'Run folder' in shown and 'Top-1' in shown, err[-2000:]
    assert root.handlers == ([callers] if caller_logging else []) and root.level == logging.WARNING
    assert logging.getLogger('train').level == logging.NOTSET
    assert threads == 2 and torch.backends.cudnn.benchmark


def test_a_second_order_optimizer_trains(tmp_path, caplog, capsys):
    """timm's adahessian takes the gradient's graph (create_graph, as timm's train.py passes it): without it the
    first step ended in 'element 0 of tensors does not require grad' after the run folder was written."""
    status, log = train_here(caplog, capsys, '-c', DIGITS_RECIPE, '--model-kwargs', 'embed_dim=8', 'depth=1',
                             'heads_per_layer=2', 'mlp_hidden_dim=16', '--epochs', 1, '-b', 64, '--opt', 'adahessian',
                             '--output', tmp_path, '--experiment', 'second_order')
    assert status == 0 and 'Top-1 on the digits test split' in log, log[-2000:]
