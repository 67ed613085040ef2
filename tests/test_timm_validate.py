""" timm's own validate.py on an image folder of Fashion-MNIST's test set, with a kept model (local-dir:), reproduces
the table's top-1 (docs/reproduction_fashion_mnist.csv) within 0.2 points

The images are written as PNG files into ``<tmp>/validation/<label>/``; validate.py reads them with timm's
ImageDataset (PIL, RGB) and preprocesses them with ``resolve_data_config`` + ``create_transform`` of the kept
folder's config.json. It runs through ``python -m sa_vision.train.run_timm`` (which imports sa_vision, registering
the models). Skipped without ``SA_VISION_TIMM_CHECKOUT`` (a pytorch-image-models checkout holding validate.py). The
whole test split takes minutes per model on a CPU: the first model runs, the others where
``SA_VISION_ZOO_ACCURACY=1``.
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG_TIMEOUT_S, fashion_mnist_test_images

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / 'zoo' / 'fashion-mnist-cpu'
TABLE = ROOT / 'docs' / 'reproduction_fashion_mnist.csv'

with open(TABLE, encoding='utf-8', newline='') as f:
    ROWS = list(csv.DictReader(f))


@pytest.fixture(scope='module')
def validate_script():
    checkout = os.environ.get('SA_VISION_TIMM_CHECKOUT')
    script = Path(checkout) / 'validate.py' if checkout else None
    if script is None or not script.is_file():
        pytest.skip('set SA_VISION_TIMM_CHECKOUT to a pytorch-image-models checkout (with validate.py) to run '
                    'timm\'s own validate.py on the kept zoo')
    return script


@pytest.fixture(scope='module')
def test_split_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp('fashion-mnist-png')
    images, labels = fashion_mnist_test_images(10_000)
    for i, (image, label) in enumerate(zip(images, labels.tolist())):
        folder = root / 'validation' / str(label)  # timm sorts the class folders: '0' ... '9' are labels 0 ... 9
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f'{i:05d}.png')
    return root


@pytest.mark.slow
@pytest.mark.parametrize('row', ROWS, ids=[row['model'] for row in ROWS])
def test_timms_validate_reproduces_the_table(row, validate_script, test_split_folder, tmp_path):
    if row is not ROWS[0] and os.environ.get('SA_VISION_ZOO_ACCURACY') != '1':
        pytest.skip('minutes per model on a CPU: SA_VISION_ZOO_ACCURACY=1 runs every kept model')
    results = tmp_path / 'results.json'
    proc = subprocess.run(
        [sys.executable, '-m', 'sa_vision.train.run_timm', str(validate_script), str(test_split_folder),
         '--split', 'validation', '--model', f'local-dir:{ZOO / row["model"]}', '--pretrained', '--device', 'cpu',
         '--workers', '0', '-b', '500', '--results-file', str(results), '--results-format', 'json'],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(results.read_text())
    result = result[0] if isinstance(result, list) else result
    assert result['img_size'] == 28  # the kept config's input size: the model adds the border itself
    assert abs(float(result['top1']) - float(row['top1'])) <= 0.2, (result, row['top1'])
