""" The zoo kept in the repository (zoo/fashion-mnist-cpu/<model>/) against the table docs/reproduction.md reports

Per commit, a guard that can fail: each weights file's SHA-256 and each model's logits of the first 64 test images
against the files beside the table (``docs/reproduction_fashion_mnist_weights.sha256`` and ``..._logits.safetensors``,
recorded through the training pipeline by ``sa-vision-reproduce --check ZOO --table CSV --record``), within the
float32 rounding bound of ``sa_vision.reproduce.logits_tolerance``. timm's own preprocessing is replayed on the
first 500 test images against the top-1 the training pipeline recorded for them. The table's accuracy on the whole
test split takes minutes per model on a CPU: it runs where ``SA_VISION_ZOO_ACCURACY=1`` asks for it.
"""
import csv
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import fashion_mnist_test_images

import sa_vision  # noqa: F401
from sa_vision.reproduce import (
    GUARD_IMAGES,
    SUBSET_IMAGES,
    check_kept_models,
    kept_guard_paths,
    kept_subset_top1,
    logits_tolerance,
)

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / 'zoo' / 'fashion-mnist-cpu'
TABLE = ROOT / 'docs' / 'reproduction_fashion_mnist.csv'


def _models():
    with open(TABLE, encoding='utf-8', newline='') as f:
        return [row['model'] for row in csv.DictReader(f)]


@pytest.fixture(autouse=True)
def _zoo_is_kept():
    if not ZOO.is_dir():
        pytest.skip(f'the zoo is not kept in this checkout ({ZOO.relative_to(ROOT)} is missing): a run of '
                    f'sa-vision-reproduce --profile cpu --keep {ZOO.relative_to(ROOT)} puts it there')


def _one_row_table(model, folder: Path) -> Path:
    """The table's row of ``model`` in ``folder``, with the guard beside it (as beside the table)."""
    with open(TABLE, encoding='utf-8', newline='') as f:
        rows = [row for row in csv.DictReader(f) if row['model'] == model]
    table = folder / TABLE.name
    with open(table, 'w', encoding='utf-8', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for path in kept_guard_paths(TABLE).values():
        shutil.copy(path, folder / path.name)
    return table


def test_kept_weights_and_logits_are_the_recorded_ones():
    results = check_kept_models(ZOO, TABLE, accuracy=False)
    assert [r['model'] for r in results] == _models()
    assert all(r['digest_ok'] and r['logits_ok'] for r in results), results


def test_every_kept_card_claims_the_tables_top1():
    results = check_kept_models(ZOO, TABLE, accuracy=False)
    assert all(r['card_ok'] for r in results), results


def test_a_card_claiming_another_top1_fails_the_check(tmp_path):
    """A card whose model-index claims its training's faulty evaluation (the gpu-long quadratic model's 86.31 %
    against its weights' 92.10 %, docs/training.md) fails the check, weights and logits being right; without a
    card nothing is claimed and nothing checked."""
    model = 'sa_quadratic_cifar'
    shutil.copytree(ZOO / model, tmp_path / 'zoo' / model)
    table = _one_row_table(model, tmp_path)
    card = tmp_path / 'zoo' / model / 'README.md'
    text = card.read_text()
    claimed = re.search(r'value: ([0-9.]+)\n\s+name: Top-1 accuracy', text)
    card.write_text(text.replace(claimed.group(0), claimed.group(0).replace(claimed.group(1), '86.31')))
    [result] = check_kept_models(tmp_path / 'zoo', table, accuracy=False)
    assert result['digest_ok'] and result['logits_ok'], result
    assert result['card_top1'] == 86.31 and not result['card_ok'] and not result['ok'], result
    # a guard recorded for those weights against that table would pass them: none is written
    from sa_vision.reproduce import ReproductionError, record_kept_models
    with pytest.raises(ReproductionError, match='the table is not of these weights'):
        record_kept_models(tmp_path / 'zoo', table)
    card.unlink()
    [result] = check_kept_models(tmp_path / 'zoo', table, accuracy=False)
    assert 'card_ok' not in result and result['ok'], result


def test_the_guard_fails_on_a_changed_weight(tmp_path, capsys):
    """A bias moved by 0.01 (an accuracy change too small for 10,000 images to show) fails both checks; weights
    and card both not the table's are said to be other weights, not a faulty card."""
    from safetensors.torch import load_file, save_file
    model = 'sa_quadratic_cifar'
    shutil.copytree(ZOO / model, tmp_path / 'zoo' / model)
    table = _one_row_table(model, tmp_path)
    [result] = check_kept_models(tmp_path / 'zoo', table, accuracy=False)
    assert result['ok'], result
    weights_path = tmp_path / 'zoo' / model / 'model.safetensors'
    weights = load_file(str(weights_path))
    weights['head.bias'][3] += 1e-2
    save_file(weights, str(weights_path))
    [result] = check_kept_models(tmp_path / 'zoo', table, accuracy=False)
    assert not result['digest_ok'] and not result['logits_ok'] and not result['ok'], result
    card = tmp_path / 'zoo' / model / 'README.md'
    card.write_text(re.sub(r'value: [0-9.]+(\n\s+name: Top-1 accuracy)', r'value: 50.0\1', card.read_text()))
    capsys.readouterr()
    check_kept_models(tmp_path / 'zoo', table, accuracy=False)
    out = capsys.readouterr().out
    assert 'these weights are not the ones the table reports' in out and 'which was wrong' not in out, out


@pytest.mark.slow
@pytest.mark.parametrize('model', _models())
def test_logits_tolerance_covers_float32_rounding_on_this_cpu(model):
    """The tolerance is a float32 bound: a float64 run of the same model and images is within half of it (the
    recorded run and a later one may each be that far from the exact logits) on whatever CPU runs this."""
    from sa_vision.reproduce.kept import _guard_batch
    from sa_vision.reproduce.report import model_input_size
    from sa_vision.train.checkpoint import read_checkpoint
    kept = read_checkpoint(ZOO / model).create_model()
    images, _, _ = _guard_batch('fashion-mnist', None, model_input_size(kept))
    with torch.no_grad():
        float32 = kept(images)
        float64 = kept.double()(images.double())
    assert (float32.double() - float64).abs().max().item() <= logits_tolerance(kept, float64.abs().max().item()) / 2


@pytest.mark.slow
@pytest.mark.parametrize('model', _models())
def test_timms_own_preprocessing_gives_the_kept_accuracy(model):
    """``resolve_data_config`` + ``create_transform`` of the kept folder on PIL RGB images: the recorded logits of
    the first 64 images (training pipeline) and its top-1 on the first 500 within 0.2 points (one image)."""
    import timm
    from safetensors.torch import load_file
    kept = timm.create_model(f'local-dir:{ZOO / model}', pretrained=True).eval()
    cfg = timm.data.resolve_data_config({}, model=kept)
    assert cfg['input_size'] == (3, 28, 28) and cfg['crop_pct'] == 1.0
    assert kept.pretrained_cfg['label_names'][9] == 'Ankle boot'
    transform = timm.data.create_transform(**cfg)
    images, labels = fashion_mnist_test_images(SUBSET_IMAGES)
    batch = torch.stack([transform(img) for img in images])
    with torch.no_grad():
        logits = torch.cat([kept(chunk) for chunk in batch.split(250)])
    recorded = load_file(str(kept_guard_paths(TABLE)['logits']))[model]
    assert (logits[:GUARD_IMAGES] - recorded).abs().max().item() <= logits_tolerance(kept, recorded.abs().max().item())
    top1 = 100. * (logits.argmax(-1) == labels).float().mean().item()
    assert abs(top1 - kept_subset_top1(TABLE)[model]) <= 0.2 + 1e-9, (top1, kept_subset_top1(TABLE)[model])


@pytest.mark.slow
@pytest.mark.parametrize('model', _models())
def test_kept_model_has_the_tables_accuracy(model, tmp_path):
    if os.environ.get('SA_VISION_ZOO_ACCURACY') != '1':
        pytest.skip('the whole test split takes minutes per model on a CPU: SA_VISION_ZOO_ACCURACY=1 runs it '
                    '(the weights\' digests and logits are checked on every run)')
    [result] = check_kept_models(ZOO, _one_row_table(model, tmp_path))
    assert result['ok'], result


def test_the_accuracy_check_says_what_it_evaluates_before_its_minutes(tmp_path, monkeypatch, capsys):
    """The whole test split takes minutes per model on a CPU: a line says so before, not only the result after."""
    from sa_vision.reproduce import kept
    model = _models()[0]

    def evaluate(*args, **kwargs):
        assert 'evaluating its 10,000 test images in float32' in capsys.readouterr().out  # said before
        return {'top1': 0., 'top5': 0., 'num_images': 10000}
    monkeypatch.setattr(kept, 'evaluate_on_test_split', evaluate)
    [result] = check_kept_models(ZOO, _one_row_table(model, tmp_path))
    assert result['num_images'] == 10000 and not result['accuracy_ok']


def test_git_keeps_every_file_of_the_zoo():
    # a .gitignore rule (*.safetensors) once kept the weights out of the commit: the working tree passed, clones failed
    if shutil.which('git') is None or not (ROOT / '.git').exists():
        pytest.skip('not a git checkout: nothing to ask git about')
    files = sorted(str(p.relative_to(ROOT)) for p in ZOO.rglob('*') if p.is_file())
    files += [str(p.relative_to(ROOT)) for p in kept_guard_paths(TABLE).values()]
    assert any(f.endswith('model.safetensors') for f in files), f'no weights under {ZOO.relative_to(ROOT)}'
    # without --verbose, check-ignore prints only the paths that are ignored (a '!' rule un-ignores)
    ignored = subprocess.run(['git', 'check-ignore', '--no-index', *files], cwd=ROOT,
                             capture_output=True, text=True).stdout
    assert not ignored, f'.gitignore keeps files of the kept zoo out of git, so a clone would lack them:\n{ignored}'


def test_the_kept_cards_usage_runs_on_a_grey_png(tmp_path, capsys):
    """The usage block of a kept model card, loading the folder (local-dir:) instead of the Hub, on a grey PNG of
    the first test image (an ankle boot)."""
    import re
    model = 'sa_quadratic_cifar'
    card = (ZOO / model / 'README.md').read_text(encoding='utf-8')
    note, usage = re.search(r'<!-- sa_vision:usage -->\n(.*?)```python\n(.*?)```', card, re.S).groups()
    # the card names the Hub repository it will be published to, and says that until then the folder loads
    assert "the folder itself with `timm.create_model('local-dir:<this folder>'" in note, note
    images, labels = fashion_mnist_test_images(1)
    images[0].convert('L').save(tmp_path / 'image.png')
    code = re.sub(r"'hf-hub:[^']+'", repr(f'local-dir:{ZOO / model}'), usage).replace(
        "'image.png'", repr(str(tmp_path / 'image.png')))
    assert code != usage
    exec(compile(code, 'usage', 'exec'), {})
    assert capsys.readouterr().out.strip() == 'Ankle boot' and labels[0] == 9


def _reproduce_cli(argv, capsys):
    from sa_vision.cli import reproduce as reproduce_script
    from sa_vision.errors import run_cli
    status = run_cli(reproduce_script.main, [str(a) for a in argv])
    return status, capsys.readouterr()


def test_a_check_without_its_table_zoo_or_guard_is_one_error_line(tmp_path, capsys):
    """--check and --record name what is missing (the table, a kept model's folder, the guard or a model's entry in
    it) in one error line with status 2, before any model is evaluated; a check never passes unguarded."""
    model = 'sa_quadratic_cifar'
    shutil.copytree(ZOO / model, tmp_path / 'zoo' / model)
    guarded = _one_row_table(model, tmp_path)
    unguarded = tmp_path / 'bare' / 'results.csv'
    unguarded.parent.mkdir()
    shutil.copy(guarded, unguarded)
    # a model kept after the guard was recorded: its row and folder, no entry in the guard
    shutil.copytree(ZOO / model, tmp_path / 'zoo' / 'sa_new_model')
    extended = tmp_path / TABLE.name
    extended.write_text(guarded.read_text() + guarded.read_text().splitlines()[1].replace(model, 'sa_new_model') + '\n')
    cases = [
        (['--check', tmp_path / 'zoo', '--table', tmp_path / 'nope.csv', '--no-accuracy'], 'nope.csv does not exist'),
        (['--check', tmp_path / 'nope', '--table', guarded, '--record'], 'holds no kept model'),
        (['--check', tmp_path / 'nope', '--table', guarded], 'holds no kept model'),
        (['--check', tmp_path / 'zoo', '--table', unguarded], 'has no guard beside it'),
        (['--check', tmp_path / 'zoo', '--table', extended, '--no-accuracy'], 'no guard for sa_new_model'),
    ]
    for argv, message in cases:
        status, captured = _reproduce_cli(argv, capsys)
        assert status == 2 and captured.err.startswith('error: ') and message in captured.err, (argv, captured)
        assert captured.err.count('\n') == 1 and ': ok' not in captured.out, (argv, captured)
    assert '--record' in _reproduce_cli(cases[3][0], capsys)[1].err  # how to make the guard
    assert not kept_guard_paths(guarded)['digests'].with_name('nope').exists()


def test_recording_says_how_many_test_images_its_top1_counts(tmp_path, capsys):
    """digits has 360 test images: the record says so, not 'the first 500'."""
    import timm

    from sa_vision.hub import export_hub_folder
    from sa_vision.reproduce import record_kept_models
    from sa_vision.train.checkpoint import Checkpoint
    model = timm.create_model('sa_quadratic_cifar', embed_dim=8, depth=1, heads_per_layer=2, mlp_hidden_dim=8)
    export_hub_folder(Checkpoint('sa_quadratic_cifar', dict(embed_dim=8, depth=1, heads_per_layer=2,
                                                            mlp_hidden_dim=8), model.state_dict(), 'test',
                                 'state_dict', {'dataset': 'digits'}),
                      tmp_path / 'zoo' / 'sa_quadratic_cifar', figure=False)
    table = tmp_path / 'results.csv'
    table.write_text('model,dataset,top1,top5\nsa_quadratic_cifar,digits,10.0,50.0\n')
    record_kept_models(tmp_path / 'zoo', table)
    assert 'on all 360 test images' in capsys.readouterr().out
