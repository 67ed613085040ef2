""" The zoo kept in the repository (zoo/fashion-mnist-cpu/<model>/) against the table docs/reproduction.md reports

Every model of ``docs/reproduction_fashion_mnist.csv`` is evaluated on the Fashion-MNIST test set in the precision
the table states, and its top-1 and top-5 must be the table's (one image in 10,000 of slack).
"""
import csv
import shutil
import subprocess
from pathlib import Path

import pytest

from sa_vision.reproduce import check_kept_models

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / 'zoo' / 'fashion-mnist-cpu'
TABLE = ROOT / 'docs' / 'reproduction_fashion_mnist.csv'


def _models():
    with open(TABLE, newline='') as f:
        return [row['model'] for row in csv.DictReader(f)]


@pytest.mark.slow
@pytest.mark.parametrize('model', _models())
def test_kept_model_has_the_tables_accuracy(model, tmp_path):
    if not ZOO.is_dir():
        pytest.skip(f'the zoo is not kept in this checkout ({ZOO.relative_to(ROOT)} is missing): a run of '
                    f'sa-vision-reproduce --profile cpu --keep {ZOO.relative_to(ROOT)} puts it there')
    with open(TABLE, newline='') as f:
        rows = [row for row in csv.DictReader(f) if row['model'] == model]
    one_row = tmp_path / 'row.csv'
    with open(one_row, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    [result] = check_kept_models(ZOO, one_row)
    assert result['ok'], result


def test_git_keeps_every_file_of_the_zoo():
    # a .gitignore rule (*.safetensors) once kept the weights out of the commit: the working tree passed, clones failed
    if shutil.which('git') is None or not (ROOT / '.git').exists():
        pytest.skip('not a git checkout: nothing to ask git about')
    files = sorted(str(p.relative_to(ROOT)) for p in ZOO.rglob('*') if p.is_file())
    assert any(f.endswith('model.safetensors') for f in files), f'no weights under {ZOO.relative_to(ROOT)}'
    # without --verbose, check-ignore prints only the paths that are ignored (a '!' rule un-ignores)
    ignored = subprocess.run(['git', 'check-ignore', '--no-index', *files], cwd=ROOT,
                             capture_output=True, text=True).stdout
    assert not ignored, f'.gitignore keeps files of the kept zoo out of git, so a clone would lack them:\n{ignored}'
