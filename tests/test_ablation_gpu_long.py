""" The ablation at the gpu-long length (docs/probes/gpu/ablation_gpu_long.py) in its CPU smoke mode """
import csv
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers import HANG_TIMEOUT_S, load_script

pytest.importorskip('sklearn')

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'docs' / 'probes' / 'gpu' / 'ablation_gpu_long.py'
MAX_FILES_BACK = 8  # what the device tool brings back from $OUT


def _run(out, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), '--smoke', '--out', str(out), *extra], cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S)


def _script():
    return load_script(SCRIPT)


@pytest.mark.slow
def test_smoke_trains_the_four_variants_and_brings_back_their_table_and_centres(tmp_path):
    """Four runs, one row each in the table; every kept epoch of each has a kernel match per layer, and its
    positional parameters, nothing else of its weights, in the tar; within what the device tool brings back."""
    from sa_vision.reproduce import ABLATION_VARIANTS, ablation_run_name
    from sa_vision.train.positional_epochs import POSITIONAL_EPOCHS_FILE, load_positional_trajectory, positional_params
    proc = _run(tmp_path)
    log = (tmp_path / 'ablation_gpu_long.log').read_text() if (tmp_path / 'ablation_gpu_long.log').is_file() else ''
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + log[-3000:]
    # every run evaluates its last epoch only (--val-interval 2 of 2)
    assert log.count('Eval: 0  skipped (--val-interval 2') == len(ABLATION_VARIANTS), log[-3000:]
    with open(tmp_path / 'ablation.csv', encoding='utf-8', newline='') as f:
        assert [row['variant'] for row in csv.DictReader(f)] == list(ABLATION_VARIANTS)
    result = json.loads((tmp_path / 'ablation_gpu_long.json').read_text())
    assert set(result['seconds']) == set(ABLATION_VARIANTS) == set(result['kernel_match'])
    with tarfile.open(tmp_path / 'ablation_positional.tar') as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / 'untarred', filter='data')
    for variant, match in result['kernel_match'].items():
        run = ablation_run_name(variant)
        assert list(match['epochs']) == ['epoch-000', 'epoch-001', 'epoch-002'], variant
        assert all(len(layers) == 2 for layers in match['epochs'].values())  # the tiny model's two layers
        assert match['closest']['distance'] == min(layer['distance'] for layers in match['epochs'].values()
                                                   for layer in layers)
        assert [n for n in names if n.startswith(run + '/')] == [f'{run}/{POSITIONAL_EPOCHS_FILE}']
        kept = load_positional_trajectory(tmp_path / 'untarred' / run / POSITIONAL_EPOCHS_FILE)
        assert list(kept) == list(match['epochs']) and kept['epoch-002']
        assert set(kept['epoch-002']) == set(positional_params(kept['epoch-002']))
    assert len(list(tmp_path.iterdir())) - 1 <= MAX_FILES_BACK  # less the folder untarred here


def test_a_budget_that_cannot_hold_the_four_starts_nothing(tmp_path):
    proc = _run(tmp_path, '--budget-s', '10')
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / 'ablation_gpu_long.json').read_text())
    assert result['seconds'] == {} and 'needs ~' in result['not_started']
    assert 'STOPPED: not started' in (tmp_path / 'ablation_gpu_long.log').read_text()


def test_the_gpu_call_is_expected_to_fit_its_budget(tmp_path):
    """The four variants side by side at the speeds of zoo_gpu_long.py: 371 s, within the default budget of 420
    with the time kept for the end; their evaluations (uncompiled on CUDA) counted, 5 each at every 10th epoch."""
    from sa_vision.reproduce import ABLATION_MODEL, Reproduction
    script = _script()
    gpu_long = Reproduction(tmp_path, 'gpu-long')
    need = script.expected_s(gpu_long, 4)
    assert 300 < need < 420 - script.FINAL_S
    assert script.expected_s(gpu_long, 2) > need  # two waves of two share less
    zoo = sys.modules['zoo_gpu_long']  # loaded beside the script
    every_epoch, every_10th = (zoo.estimate_s(gpu_long, ABLATION_MODEL, {'val_interval': k}) for k in (1, 10))
    assert every_epoch - every_10th == pytest.approx(45 * 10_000 / 14_968)  # 45 evaluations fewer of 10,000 images
    assert zoo.estimate_s(gpu_long, ABLATION_MODEL) == every_epoch  # the profile evaluates every epoch
