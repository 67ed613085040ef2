""" The GPU probe of the compiled evaluation's fault (docs/probes/gpu/eval_fault.py) in its CPU smoke mode """
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT_S

pytest.importorskip('sklearn')

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'docs' / 'probes' / 'gpu' / 'eval_fault.py'


@pytest.mark.slow
def test_smoke_evaluates_each_epoch_every_way_and_keeps_the_faulty_weights(tmp_path):
    """The smoke fakes the fault in the first epoch: there the compiled figure is NaN, the fresh modules (compiled
    then, on the same weights) give the eager figures, and the weights come back; the second epoch's compiled and
    eager figures agree, as both evaluate one model."""
    proc = subprocess.run([sys.executable, str(SCRIPT), '--smoke', '--epochs', '2', '--out', str(tmp_path)],
                          cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    log = (tmp_path / 'eval_fault.log').read_text() if (tmp_path / 'eval_fault.log').is_file() else ''
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + log[-3000:]
    result = json.loads((tmp_path / 'eval_fault.json').read_text())
    first, second = result['epochs']
    assert first['compiled']['loss'] != first['compiled']['loss']  # NaN
    assert second['compiled'] == pytest.approx(second['eager'])
    fresh = result['fresh']
    assert fresh['epoch'] == 0 and not fresh['compiled_finite']
    for name in ('fresh', 'fresh_default'):
        assert {k: fresh[name][k] for k in ('loss', 'top1', 'top5')} == pytest.approx(first['eager']), name
    from safetensors.torch import load_file
    weights = load_file(tmp_path / 'fault_weights.safetensors')
    assert any('position.centers' in k for k in weights) and all(torch.isfinite(v).all() for v in weights.values())
    assert 'fresh_default (default mode, compiled now)' in log
    # the faked fault: the first image of every full batch, no other
    assert fresh['nonfinite_rows_per_batch'] and set(fresh['nonfinite_rows_per_batch']) == {1}
