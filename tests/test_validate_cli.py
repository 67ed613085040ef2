""" sa-vision-validate as a new user meets it: the dataset the weights were trained on by default, an error that
names the flag which fixes it, and a progress bar on a terminal only """
import io
import json

import pytest
import timm
import torch
from timm.models._hub import save_for_hf

import sa_vision  # noqa: F401  (registers the models)
from sa_vision.cli import validate
from sa_vision.errors import DatasetError, UserError

pytest.importorskip('sklearn')

SMALL = dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32)


def _folder(tmp_path, tag):
    """A Hub folder of a small model whose pretrained tag is ``tag`` (as an export labels its dataset)."""
    folder = tmp_path / tag
    save_for_hf(timm.create_model('sa_quadratic_cifar', **SMALL), folder, safe_serialization=True,
                model_config={'pretrained_cfg': {'tag': tag}})
    return folder


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_weights_own_dataset_is_evaluated_without_dataset(tmp_path, capsys):
    folder = _folder(tmp_path, 'digits_custom')
    assert validate.main(['--model', f'local-dir:{folder}', '--threads', '1', '-b', '360']) == 0
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert result['dataset'] == 'digits' and result['num_images'] == 360  # the digits test split
    assert 'dataset: digits (the weights were trained on it; --dataset chooses another)' in err


def test_weights_of_no_known_dataset_default_to_cifar10_and_the_error_names_the_flags(tmp_path):
    """Weights tagged ``unknown`` (an export of a bare state dict) name no dataset: the paper's CIFAR-10."""
    folder = _folder(tmp_path, 'unknown_custom')
    with pytest.raises(DatasetError, match=r"'torch/cifar10' needs --data-dir .*--dataset fashion-mnist and "
                                           r"--dataset digits are read without one"):
        validate.main(['--model', f'local-dir:{folder}', '--threads', '1'])


def test_no_pretrained_evaluates_the_weights_architecture_at_random_and_checkpoint_always_loads(tmp_path):
    """As timm's create_model('local-dir:...', pretrained=False): the folder's architecture, not its weights; and as
    timm's validate.py, --checkpoint loads its weights whatever --pretrained says."""
    from safetensors.torch import load_file
    folder = _folder(tmp_path, 'digits_custom')
    saved = load_file(folder / 'model.safetensors')

    def evaluated(*argv):
        args = validate._parser().parse_args(argv)
        args.model_given = args.model is not None
        model, dataset = validate.model_to_evaluate(args)
        weights = model.state_dict()
        assert {k: v.shape for k, v in weights.items()} == {k: v.shape for k, v in saved.items()}
        return all(torch.equal(weights[k], v) for k, v in saved.items()), dataset

    assert evaluated('-m', f'local-dir:{folder}') == (True, 'digits')
    assert evaluated('-m', f'local-dir:{folder}', '--no-pretrained') == (False, 'digits')
    assert evaluated('--model', str(folder / 'model.safetensors'), '--no-pretrained') == (False, None)  # bare
    assert evaluated('--checkpoint', str(folder), '--no-pretrained') == (True, 'digits')


def test_progress_shows_images_per_second_and_time_left_on_a_terminal_only():
    batches = [(torch.zeros(5, 3, 2, 2), torch.zeros(5, dtype=torch.long))] * 4
    terminal = _Terminal()
    assert len(list(validate.with_progress(batches, 20, terminal))) == 4
    shown = terminal.getvalue()
    assert '20/20' in shown and 'img/s' in shown and '<' in shown  # tqdm's "elapsed<left, rate"
    log = io.StringIO()  # CI logs: not a terminal, the loader itself
    assert validate.with_progress(batches, 20, log) is batches and log.getvalue() == ''


def test_no_progress_bar_in_a_log(tmp_path, capsys):
    folder = _folder(tmp_path, 'digits_custom')
    assert validate.main(['--model', f'local-dir:{folder}', '--threads', '1', '-b', '100']) == 0
    assert 'img/s' not in capsys.readouterr().err


@pytest.mark.parametrize('tag', ['folder_custom', 'flowers_custom'], ids=['unnamed', 'named'])
def test_weights_of_an_image_folder_evaluate_an_image_folder(tmp_path, capsys, tag):
    """Weights trained on an image folder (--dataset '' exports them as '<arch>.folder_custom', --dataset flowers
    as '<arch>.flowers_custom') are evaluated on the image folder of --data-dir, and without one the error asks for
    it: not CIFAR-10, which they never saw."""
    from PIL import Image
    folder = _folder(tmp_path, tag)
    trained_on = '' if tag == 'folder_custom' else 'flowers'  # as --dataset named it
    named = " named 'flowers'" if trained_on else ''
    with pytest.raises(UserError, match=rf'^the weights were trained on an image folder{named}, which they do not '
                                        r'locate: pass --data-dir with the folder to evaluate \(<folder>/validation/'
                                        r'<class>/<image>\), or --dataset for another dataset$'):
        validate.main(['--model', f'local-dir:{folder}', '--threads', '1'])
    assert f'dataset: {trained_on or "an image folder in --data-dir"} (the weights were trained on it' in \
        capsys.readouterr().err
    images = tmp_path / 'images'
    for i, name in enumerate(('a', 'b')):
        (images / 'validation' / name).mkdir(parents=True)
        Image.new('RGB', (32, 32), (200 * i,) * 3).save(images / 'validation' / name / 'x.png')
    assert validate.main(['--model', f'local-dir:{folder}', '--data-dir', str(images), '--threads', '1']) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result['dataset'] == trained_on and result['num_images'] == 2


def test_a_folder_of_class_folders_alone_is_read_with_val_split_dot_which_its_error_names(tmp_path, capsys):
    """timm's validate.py reads such a folder itself (split ''); here the error names the flag that does."""
    from PIL import Image

    from sa_vision.errors import run_cli
    folder = _folder(tmp_path, 'folder_custom')
    images = tmp_path / 'images'
    for i, name in enumerate(('a', 'b', 'c')):
        (images / name).mkdir(parents=True)
        Image.new('RGB', (32, 32), (100 * i,) * 3).save(images / name / 'x.png')
    argv = ['--model', f'local-dir:{folder}', '--data-dir', str(images), '--threads', '1']
    assert run_cli(validate.main, argv) == 2
    assert f'--val-split . reads {images} itself, its subfolders as the classes' in capsys.readouterr().err
    assert validate.main([*argv, '--val-split', '.']) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])['num_images'] == 3


def test_a_data_dir_the_weights_dataset_never_reads_is_refused(tmp_path):
    """Digits weights with --data-dir: timm's validate.py would evaluate that image folder; this command would read
    the digits and ignore it, so it says so instead."""
    folder = _folder(tmp_path, 'digits_custom')
    with pytest.raises(DatasetError, match=r"--data-dir .*: --dataset digits reads no files .* pass --dataset ''"):
        validate.main(['--model', f'local-dir:{folder}', '--data-dir', str(tmp_path), '--threads', '1'])


def test_timms_validate_options_say_where_they_work_and_the_result_goes_to_its_results_file(tmp_path, capsys):
    """timm validate.py's preprocessing flags (the weights' own is used here), its other options and its positional
    data folder are one error line each, naming where they work; its --results-file is taken, as CSV or JSON."""
    import csv

    from sa_vision.errors import run_cli
    folder = _folder(tmp_path, 'digits_custom')
    weights = ['--model', f'local-dir:{folder}', '--threads', '1', '-b', '360']
    for extra, expected in (
            (['--img-size', '32', '--crop-pct', '1.0'], "error: --img-size, --crop-pct: options of timm's validate.py "
                                                        "that sa-vision-validate does not take (it feeds the weights "
                                                        "what their training fed them). Run timm's own script"),
            (['--log-freq', '5'], "error: --log-freq: an option of timm's validate.py that sa-vision-validate does "
                                  "not take. Run timm's own script for it: python -m sa_vision.train.run_timm "
                                  "path/to/timm/validate.py"),
            ([str(tmp_path)], f'error: {tmp_path}: sa-vision-validate takes the data folder as --data-dir {tmp_path}'),
    ):
        assert run_cli(validate.main, [*weights, *extra]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(expected)
    for results_format in ('csv', 'json'):
        path = tmp_path / 'results' / f'results.{results_format}'  # its folder is made, as sa-vision-benchmark's
        assert validate.main([*weights, '--results-file', str(path), '--results-format', results_format]) == 0
        printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        written = (json.loads(path.read_text()) if results_format == 'json'
                   else next(csv.DictReader(path.open(newline=''))))
        assert written['top1'] in (printed['top1'], str(printed['top1'])) and written['model'] == printed['model']


def test_the_figures_are_printed_where_the_results_file_cannot_be_written(tmp_path, capsys, monkeypatch):
    """The file comes before the output (whose reader may be gone), but a full disk loses no evaluation: the
    figures are printed, then the refusal is the one error line."""
    import errno

    from sa_vision.errors import run_cli
    folder = _folder(tmp_path, 'digits_custom')

    def full_disk(path, results_format, result):
        raise OSError(errno.ENOSPC, 'No space left on device', path)
    monkeypatch.setattr(validate, '_write_results', full_disk)
    status = run_cli(validate.main, ['--model', f'local-dir:{folder}', '--threads', '1', '-b', '360',
                                     '--results-file', str(tmp_path / 'r.csv')])
    out, err = capsys.readouterr()
    assert status == 2 and json.loads(out.strip().splitlines()[-1])['num_images'] == 360, out
    assert err.strip().splitlines()[-1].startswith('error: No space left on device'), err


def test_weights_that_are_not_numbers_give_json_nulls_and_are_never_exported(tmp_path, capsys):
    """Weights of a run that diverged (NaN): validate's JSON line says null for the loss (JSON has no NaN: jq and
    JavaScript refuse Python's), and an export, which would publish them with a card, is refused naming them."""
    from sa_vision.hub import export_hub_folder
    from sa_vision.train.checkpoint import CheckpointError
    model = timm.create_model('sa_quadratic_cifar', **SMALL)
    with torch.no_grad():
        model.head.weight.fill_(float('nan'))
    folder = tmp_path / 'diverged'
    save_for_hf(model, folder, safe_serialization=True, model_config={'pretrained_cfg': {'tag': 'digits_custom'}})
    assert validate.main(['--model', f'local-dir:{folder}', '--threads', '1', '-b', '360']) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]

    def refuse(constant):
        raise ValueError(f'{constant} is not JSON')
    assert json.loads(line, parse_constant=refuse)['loss'] is None, line
    with pytest.raises(CheckpointError, match=r'not numbers \(NaN or inf in 1 tensor: head.weight\)'):
        export_hub_folder(folder, tmp_path / 'export')
    assert not (tmp_path / 'export').exists()


def test_weights_given_by_position_are_named_with_the_option_that_takes_them(tmp_path, capsys):
    """A run folder, a checkpoint file or a Hub folder given by position (as timm's validate.py takes its data):
    one line naming --checkpoint or --model local-dir:, not the data folder's advice nor argparse's usage."""
    from sa_vision.errors import run_cli
    run, hub = tmp_path / 'run', _folder(tmp_path, 'digits_custom')
    run.mkdir()
    (run / 'last.pth.tar').write_bytes(b'')
    for extra, option in (([f'{run}'], f'--checkpoint {run}/last.pth.tar'),
                          ([f'{run}/last.pth.tar'], f'--checkpoint {run}/last.pth.tar'),
                          ([f'{tmp_path}/w.bin'], f'--checkpoint {tmp_path}/w.bin'),
                          ([f'{hub}'], f'--model local-dir:{hub}'),
                          (['--model', f'local-dir:{hub}', f'{hub}'], f'--model local-dir:{hub}')):
        assert run_cli(validate.main, [*extra, '--threads', '1']) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f'error: {extra[-1]}: '), err
        assert f'sa-vision-validate takes it as {option}' in err and 'data folder' not in err, err
