""" ``--save-epoch-positions``: the centres and precision factors of every epoch in one small file of the run, the
same as the whole weights of ``--save-epoch-weights`` hold; a resume that trains epochs again replaces them; what
reads a run's epochs (the trajectories, the export, the table's centre shift) reads either kind of file """
import json

import pytest
import timm
import torch
from helpers import command_here, train_here
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import sa_vision  # noqa: F401
from sa_vision.cli import plot_attention
from sa_vision.hub.export import export_hub_folder
from sa_vision.train.positional_epochs import (
    POSITIONAL_EPOCHS_FILE,
    initial_positions,
    record_epoch_positions,
    run_epochs,
)
from sa_vision.train.recipes import RECIPE_DIR

TINY = ['-c', RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml', '--model-kwargs', 'embed_dim=16', 'depth=2',
        'heads_per_layer=2', 'mlp_hidden_dim=32', '-b', 64, '--warmup-epochs', 0.5, '--log-interval', 50]
KWARGS = dict(embed_dim=8, depth=2, heads_per_layer=2, mlp_hidden_dim=8, num_classes=10)
POSITIONAL = ('.centers', '.precision_factors')  # the Gaussian kinds' positional parameters, by their key names


def _stored(path):
    """The file's tensors and its epoch names, read with safetensors alone."""
    with safe_open(str(path), 'pt') as f:
        return load_file(str(path)), json.loads(f.metadata()['epochs'])


@pytest.mark.slow
def test_a_run_keeps_what_its_whole_epoch_weights_hold_of_the_centres(tmp_path, caplog, capsys, monkeypatch):
    status, log = train_here(caplog, capsys, *TINY, '--epochs', 2, '--output', tmp_path, '--experiment', 'run',
                             '--save-epoch-weights', '--save-epoch-positions', '--export')
    assert status == 0, log
    run = tmp_path / 'run'
    stacked, names = _stored(run / POSITIONAL_EPOCHS_FILE)
    assert names == ['epoch-000', 'epoch-001', 'epoch-002']
    for i, name in enumerate(names):
        whole = load_file(str(run / f'{name}.safetensors'))
        positional = {k: v for k, v in whole.items() if k.endswith(POSITIONAL)}
        assert len(positional) == 4 and set(stacked) == set(positional)  # two layers' centres and factors
        for key, value in positional.items():
            assert torch.equal(stacked[key][i], value.float()), (name, key)
    assert (run / POSITIONAL_EPOCHS_FILE).stat().st_size < (run / 'epoch-002.safetensors').stat().st_size / 20
    # the trainer's last epoch is the checkpoint's weights
    final = torch.load(run / 'last.pth.tar', map_location='cpu', weights_only=True)['state_dict']
    assert all(torch.equal(stacked[key][-1], final[key]) for key in stacked)
    # its export (of the best epoch) keeps the epochs up to the best
    best_done = torch.load(run / 'model_best.pth.tar', map_location='cpu', weights_only=True)['epoch'] + 1
    exported, exported_names = _stored(run / 'hub' / POSITIONAL_EPOCHS_FILE)
    assert exported_names == names[:best_done + 1]
    assert all(torch.equal(exported[key], stacked[key][:best_done + 1]) for key in stacked)
    # an epoch kept after the checkpoint's (stopped between their writes, or running) is none of the run's yet
    (run / 'epoch-003.safetensors').write_bytes((run / 'epoch-002.safetensors').read_bytes())
    assert list(run_epochs(run)) == names
    (run / 'epoch-003.safetensors').unlink()
    # figure (c) of the run folder: the model at each kept epoch
    drawn = {}
    monkeypatch.setattr(plot_attention, 'plot_center_trajectories',
                        lambda models, out, labels: drawn.update(models=models, labels=labels))
    assert plot_attention.main([str(run), '--figure', 'trajectory', '--out', str(tmp_path / 'moved.png')]) == 0
    assert drawn['labels'] == names
    for i, model in enumerate(drawn['models']):
        assert all(torch.equal(model.state_dict()[key], stacked[key][i]) for key in stacked), names[i]


def test_a_folder_without_kept_epochs_has_no_trajectory_to_draw(tmp_path, capfd):
    weights = tmp_path / 'w.safetensors'
    model = timm.create_model('sa_quadratic_cifar', **KWARGS)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights),
              metadata={'arch': 'sa_quadratic_cifar', 'model_args': json.dumps(KWARGS)})
    status, out, err = command_here(capfd, 'plot_attention', weights, '--figure', 'trajectory', '--out',
                                    tmp_path / 't.png')
    assert status == 2 and f'{weights} has none: pass checkpoints of two epochs or more in training order' in err, err


def test_a_model_without_centres_is_refused_before_the_run_folder(tmp_path, capfd):
    status, out, err = command_here(capfd, 'train', '--model', 'sa_learned_cifar', '--model-kwargs', 'embed_dim=8',
                                    'depth=1', 'heads_per_layer=2', '--epochs', 1, '--output', tmp_path,
                                    '--experiment', 'learned', '--save-epoch-positions')
    assert status == 2 and 'error: --save-epoch-positions: sa_learned_cifar has no Gaussian centres' in err, err
    assert not (tmp_path / 'learned').exists()


def _moved(model, by: float):
    """``model`` with every centre moved by ``by`` grid units."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith('.centers'):
                param.add_(by)
    return model


def test_epochs_trained_again_replace_those_kept_and_drop_the_later_ones(tmp_path):
    """A resume from an earlier checkpoint (epoch 1 of a run that kept 3) trains epoch 2 again."""
    model = timm.create_model('sa_quadratic_cifar', **KWARGS)
    start = model.blocks[0].attn.position.centers.detach().clone()
    for done in range(4):
        record_epoch_positions(_moved(model, 1.), tmp_path, done)  # epoch N: moved N + 1
    record_epoch_positions(_moved(model, 10.), tmp_path, 2)  # moved 14: the resumed run's epoch 2
    stacked, names = _stored(tmp_path / POSITIONAL_EPOCHS_FILE)
    assert names == ['epoch-000', 'epoch-001', 'epoch-002']
    moved = stacked['blocks.0.attn.position.centers'] - start
    assert moved[:, 0, 0].tolist() == pytest.approx([1., 2., 14.], abs=1e-5)  # float32: (x + 1) - x need not be 1


def test_a_runs_epochs_come_from_either_file_in_the_epochs_order(tmp_path):
    """Whole weights of the first epochs (an older run, or --save-epoch-weights) and the small file of the rest;
    epoch 1000 after epoch 999, as the run numbers them."""
    model = timm.create_model('sa_quadratic_cifar', **KWARGS)
    centres = 'blocks.1.attn.position.centers'
    for done in (0, 1):
        weights = {k: v.contiguous() for k, v in _moved(model, 1.).state_dict().items()}
        save_file(weights, str(tmp_path / f'epoch-{done:03d}.safetensors'),
                  metadata={'arch': 'sa_quadratic_cifar', 'model_args': json.dumps(KWARGS)})
    initial = load_file(str(tmp_path / 'epoch-000.safetensors'))[centres]
    for done in (999, 1000):
        record_epoch_positions(_moved(model, 1.), tmp_path, done)
    epochs = run_epochs(tmp_path)
    assert list(epochs) == ['epoch-000', 'epoch-001', 'epoch-999', 'epoch-1000']  # by name, 1000 before 999
    assert [round(float(e[centres][0, 0] - initial[0, 0])) for e in epochs.values()] == [0, 1, 2, 3]
    assert all(set(e) == {k for k in model.state_dict() if k.endswith(POSITIONAL)} for e in epochs.values())
    assert torch.equal(initial_positions(tmp_path)[centres], initial)
    # the small file's epoch-000 first, as a run with --save-epoch-positions alone keeps it
    (tmp_path / 'epoch-000.safetensors').unlink()
    (tmp_path / 'epoch-001.safetensors').unlink()
    assert initial_positions(tmp_path) is None
    record_epoch_positions(_moved(model, 5.), tmp_path, 0)
    assert list(run_epochs(tmp_path)) == ['epoch-000']
    assert torch.equal(initial_positions(tmp_path)[centres], model.state_dict()[centres])


def test_an_export_of_an_export_keeps_its_epochs(tmp_path):
    """A Hub folder exported from a Hub folder (a copy staged elsewhere) keeps the epochs the first export kept:
    those of the run up to its weights' epoch, not the later ones."""
    run = tmp_path / 'run'
    run.mkdir()
    model = timm.create_model('sa_quadratic_cifar', **KWARGS)
    start = model.blocks[0].attn.position.centers.detach().clone()
    for done in range(4):
        record_epoch_positions(_moved(model, 1.), run, done)  # epoch N: moved N + 1
        # the best weights are those after 2 of the run's 3 epochs ('epoch' from 0, as the trainer saves it)
        saved = {'version': 3, 'arch': 'sa_quadratic_cifar', 'model_args': KWARGS, 'state_dict': model.state_dict(),
                 'epoch': done - 1, 'dataset': 'digits'}
        for name in ('last.pth.tar', 'model_best.pth.tar') if done == 2 else ('last.pth.tar',) if done else ():
            torch.save(saved, run / name)
    export_hub_folder(run / 'model_best.pth.tar', tmp_path / 'hub', figure=False)
    for folder in ('hub', 'again'):
        if folder == 'again':
            assert POSITIONAL_EPOCHS_FILE in export_hub_folder(tmp_path / 'hub', tmp_path / 'again', figure=False)
        stacked, names = _stored(tmp_path / folder / POSITIONAL_EPOCHS_FILE)
        assert names == ['epoch-000', 'epoch-001', 'epoch-002'], folder
        moved = stacked['blocks.0.attn.position.centers'] - start
        assert moved[:, 0, 0].tolist() == pytest.approx([1., 2., 3.]), folder


@pytest.mark.slow
def test_a_resumed_run_turns_whole_epoch_weights_off_and_keeps_the_centres_instead(tmp_path, caplog, capsys):
    """A run keeps its own --save-epoch-weights on --resume (a reproduction's run begun before 2026-11-29 kept them,
    48 MB an epoch at the paper's size): --no-save-epoch-weights stops them, and its centres go on in the small file
    from the epoch it trains next, read after the whole weights of the epochs before."""
    status, log = train_here(caplog, capsys, *TINY, '--epochs', 1, '--output', tmp_path, '--experiment', 'run',
                             '--save-epoch-weights', '--no-save-epoch-positions')
    assert status == 0, log
    run = tmp_path / 'run'
    whole = ['epoch-000.safetensors', 'epoch-001.safetensors']
    assert sorted(p.name for p in run.glob('epoch-*')) == whole and not (run / POSITIONAL_EPOCHS_FILE).exists()
    status, log = train_here(caplog, capsys, '--resume', run / 'last.pth.tar', '--epochs', 2,
                             '--no-save-epoch-weights', '--save-epoch-positions')
    assert status == 0, log
    assert sorted(p.name for p in run.glob('epoch-*')) == whole
    final = torch.load(run / 'last.pth.tar', map_location='cpu', weights_only=True)
    stacked, names = _stored(run / POSITIONAL_EPOCHS_FILE)
    # the epoch it resumed from first (equal to its whole weights), then the one it trained
    assert final['epoch'] == 1 and names == ['epoch-001', 'epoch-002'] and len(stacked) == 4  # 2 centres, 2 factors
    assert all(torch.equal(stacked[key][1], final['state_dict'][key]) for key in stacked)
    resumed_from = load_file(str(run / 'epoch-001.safetensors'))
    assert all(torch.equal(stacked[key][0], resumed_from[key]) for key in stacked)
    assert list(run_epochs(run)) == ['epoch-000', 'epoch-001', 'epoch-002']


@pytest.mark.slow
def test_a_resume_refuses_a_damaged_centres_file_before_an_epoch_trains(tmp_path, caplog, capsys, monkeypatch):
    """Each epoch's end adds to positional_epochs.safetensors before writing last.pth.tar: a file it cannot add to
    (cut short, or of another model) found only there would lose the epoch. The resume refuses it before, with what
    a run folder needs; moved away, the run keeps the centres from its next epoch on."""
    from sa_vision.train import loop
    status, log = train_here(caplog, capsys, *TINY, '--epochs', 1, '--output', tmp_path, '--experiment', 'run',
                             '--save-epoch-positions')
    assert status == 0, log
    run, trained = tmp_path / 'run', []
    kept, last = (run / POSITIONAL_EPOCHS_FILE).read_bytes(), (run / 'last.pth.tar').read_bytes()
    train_one_epoch = loop.train_one_epoch
    monkeypatch.setattr(loop, 'train_one_epoch', lambda epoch, *rest, **kw: trained.append(epoch) or train_one_epoch(
        epoch, *rest, **kw))
    other = timm.create_model('sa_quadratic_cifar', **{**KWARGS, 'heads_per_layer': 3})  # another run's model
    other_file = tmp_path / 'other.safetensors'
    record_epoch_positions(other, tmp_path, 0)
    (tmp_path / POSITIONAL_EPOCHS_FILE).rename(other_file)
    advice = (f"The run's checkpoints do not need it: move it out of {run} (or delete it); resumed with "
              f'--save-epoch-positions, the run then keeps the centres and precision factors from the epoch it '
              f'resumes from on, without those of the epochs before')
    for damaged, problem in ((kept[:len(kept) // 2], 'is not a file of epochs as sa-vision-train '
                                                     '--save-epoch-positions writes it: it cannot be read'),
                             (other_file.read_bytes(), 'does not fit the model of its run: '
                                                       'blocks.0.attn.position.centers is of shape (3, 2) in its '
                                                       'epoch-000, of shape (2, 2) in the model.')):
        (run / POSITIONAL_EPOCHS_FILE).write_bytes(damaged)
        status, log = train_here(caplog, capsys, '--resume', run / 'last.pth.tar', '--epochs', 2)
        error = log.strip().splitlines()[-1]
        assert status == 2 and error.startswith(f'error: {run / POSITIONAL_EPOCHS_FILE} {problem}'), error
        assert error.endswith(advice) and not trained, error
        assert (run / 'last.pth.tar').read_bytes() == last
    (run / POSITIONAL_EPOCHS_FILE).rename(tmp_path / 'moved.safetensors')
    status, log = train_here(caplog, capsys, '--resume', run / 'last.pth.tar', '--epochs', 2)
    assert status == 0 and trained == [1], log
    assert _stored(run / POSITIONAL_EPOCHS_FILE)[1] == ['epoch-001', 'epoch-002']
