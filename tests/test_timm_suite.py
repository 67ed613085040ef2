"""timm's own model tests (tests/test_models.py of timm's source distribution) run on our models.

The file is fetched once with ``pip download --no-binary :all: timm==<installed>`` and cached; set
``SA_VISION_TIMM_TESTS`` to a folder that already holds ``tests/test_models.py`` to skip the download.
The two tests that download pretrained weights need the Hub and are deselected.
"""
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import timm
from helpers import ALL_MODELS, HANG_TIMEOUT_S

OUR_MODELS = ALL_MODELS
# test_model_load_pretrained / test_model_features_pretrained fetch weights from the Hub
DESELECTED = 'pretrained'
# per model: forward, backward, default_cfgs, torchscript, features, fx forward/backward/torchscript
TESTS_PER_MODEL = 8


def timm_tests_folder() -> Path:
    configured = os.environ.get('SA_VISION_TIMM_TESTS')
    folder = Path(configured) if configured else Path.home() / '.cache' / 'sa_vision' / f'timm-{timm.__version__}'
    if (folder / 'tests' / 'test_models.py').exists():
        return folder
    with tempfile.TemporaryDirectory() as download_dir:
        subprocess.run(
            [sys.executable, '-m', 'pip', 'download', '--quiet', '--no-deps', '--no-binary', ':all:',
             f'timm=={timm.__version__}', '-d', download_dir],
            check=True, timeout=HANG_TIMEOUT_S)
        sdist = next(Path(download_dir).glob('timm-*.tar.gz'))
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if re.match(r'[^/]+/tests/[^/]+$', m.name) and m.isfile()]
            for member in members:
                member.name = 'tests/' + member.name.split('/')[-1]
            tar.extractall(folder, members=members, filter='data')
    return folder


@pytest.mark.slow
def test_timm_model_suite_passes_for_our_models():
    folder = timm_tests_folder()
    selection = f'({" or ".join(OUR_MODELS)}) and not {DESELECTED}'
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-p', 'sa_vision', 'tests/test_models.py', '-k', selection,
         '-q', '-rs', '-p', 'no:cacheprovider'],
        cwd=folder, env=dict(os.environ, HF_HUB_OFFLINE='1'), capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-2000:]
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    passed = int(re.search(r'(\d+) passed', summary).group(1))
    assert passed == TESTS_PER_MODEL * len(OUR_MODELS), summary
    assert 'skipped' not in summary, summary
