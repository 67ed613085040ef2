""" ``sa-vision-model-table`` is the one source of docs/models.md's table of sizes and MACs """
from pathlib import Path

import pytest

from sa_vision.cli import model_table

DOCS = Path(__file__).resolve().parent.parent / 'docs' / 'models.md'


@pytest.mark.slow
def test_docs_table_is_the_commands_output(capsys):
    assert model_table.main([]) == 0
    printed = capsys.readouterr().out
    assert printed.count('\n') == 8  # header, rule, the paper's five models and the content kind
    assert printed in DOCS.read_text(encoding='utf-8'), (
        'docs/models.md\'s table differs from sa-vision-model-table; paste its output:\n' + printed)


def test_model_names_are_every_model_the_package_registers():
    """MODEL_NAMES, which the model table, the benchmark's and the weights readers' errors and the tests' model
    lists read, against timm's registry of every module of sa_vision/models: a model registered there is in it,
    also one of a new module."""
    import pkgutil

    import timm

    import sa_vision.models
    from sa_vision.models import DEFAULT_MODEL, MODEL_NAMES
    modules = [m.name for m in pkgutil.iter_modules(sa_vision.models.__path__)]
    registered = timm.list_models(module=modules)
    assert sorted(MODEL_NAMES) == registered, (
        f'{sorted(set(registered) - set(MODEL_NAMES))} registered and not in MODEL_NAMES, '
        f'{sorted(set(MODEL_NAMES) - set(registered))} in it and not registered: MODEL_NAMES is in '
        f'sa_vision/models/__init__.py (a new model module is imported there too)')
    assert DEFAULT_MODEL in MODEL_NAMES


def test_models_are_chosen_with_m_as_in_the_other_commands(capsys):
    import csv
    import io
    assert model_table.main(['-m', 'resnet18_cifar', '--format', 'csv']) == 0
    (row,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert row['model'] == 'resnet18_cifar' and int(row['params']) == 11_173_962  # timm's resnet18, CIFAR stem


def test_weights_are_counted_as_built_by_their_files(capsys):
    """-m takes weights as the other commands do: a kept export's folder and its local-dir: name (it was a traceback:
    timm's "no source prefix")."""
    import csv
    import io

    import timm
    kept = Path(__file__).resolve().parent.parent / 'zoo' / 'fashion-mnist-cpu' / 'sa_quadratic_cifar'
    params = sum(p.numel() for p in timm.create_model(f'local-dir:{kept}', pretrained=True).parameters())
    assert model_table.main(['-m', str(kept), f'local-dir:{kept}', '--format', 'csv']) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [int(row['params']) for row in rows] == [params, params] and params != 12_086_844  # the narrow model


def test_an_hf_hub_name_is_counted_from_its_config_alone(tmp_path):
    """hf-hub:<repo> is built as timm builds the name, from its config.json: the table needs no weights (a cache
    holding the config alone, offline, counts it)."""
    import csv
    import io
    import os
    import subprocess
    import sys
    root = Path(__file__).resolve().parent.parent
    revision = '0123456789abcdef0123456789abcdef01234567'
    repo = tmp_path / 'cache' / 'models--audit--gen'
    (repo / 'snapshots' / revision).mkdir(parents=True)
    (repo / 'snapshots' / revision / 'config.json').write_text(
        (root / 'zoo' / 'fashion-mnist-cpu' / 'sa_gen_cifar' / 'config.json').read_text())
    (repo / 'refs').mkdir()
    (repo / 'refs' / 'main').write_text(revision)
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS='1', HF_HUB_OFFLINE='1',
               HF_HUB_CACHE=str(tmp_path / 'cache'), HF_HOME=str(tmp_path / 'hf_home'))
    proc = subprocess.run([sys.executable, '-m', 'sa_vision.cli.model_table', '-m', 'hf-hub:audit/gen', '--format',
                           'csv'], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    (row,) = csv.DictReader(io.StringIO(proc.stdout))
    import timm
    kept = timm.create_model(f'local-dir:{root / "zoo" / "fashion-mnist-cpu" / "sa_gen_cifar"}')
    assert int(row['params']) == sum(p.numel() for p in kept.parameters())


def _hand_counted_macs(heads_per_layer, attention: str) -> int:
    """MACs of a full-size attention model on a 32x32 image, counted by hand from the paper's architecture (Sec. 4,
    App. A.4): a 2x2 patch embedding to D=400 on a 16x16 grid (N=256 tokens), per layer the Value of its heads
    (heads x D -> D), the output projection, the MLP (400 -> 512 -> 400) and the attention's sums, then the
    classifier. The separable sums mix a row and a column (16 + 16 keys a query), the dense ones all 256 keys;
    the learned kind maps its row and column shift tables to scores (16 x 16 pairs each), the generalized one forms
    each head's 2x2 matrix S S^T (8 MACs)."""
    n, d, mlp, grid = 256, 400, 512, 16
    total = n * (2 * 2 * 3) * d + d * 10
    for heads in heads_per_layer:
        total += n * (heads * d * d + d * d + 2 * d * mlp)
        if attention == 'dense':
            total += heads * n * n * d + heads * 8
        else:
            total += heads * n * 2 * grid * d
        if attention == 'learned':
            total += 2 * grid * grid * d * heads
    return total


@pytest.mark.parametrize('name, heads_per_layer, attention', [
    ('sa_quadratic_cifar', [9] * 6, 'separable'),
    ('sa_gen_cifar', [9] * 6, 'dense'),
    ('sa_gen_pruned', [7, 5, 8, 7, 3, 9], 'dense'),  # the heads kept of 9 (App. A.1: [2,4,1,2,6,0] pruned)
    ('sa_learned_cifar', [9] * 6, 'learned'),
])
def test_the_tables_macs_are_the_hand_counted_ones(name, heads_per_layer, attention, capsys):
    import csv
    import io
    assert model_table.main(['-m', name, '--format', 'csv']) == 0
    (row,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert round(float(row['gmacs']) * 1e9) == _hand_counted_macs(heads_per_layer, attention)
