""" The flat module paths of sa_vision 0.1 still import (the same module objects), with a DeprecationWarning """
import importlib
import os
import subprocess
import sys

import pytest

import sa_vision  # noqa: F401  installs the finder of the old paths
from sa_vision._moved import MOVED_MODULES


@pytest.mark.parametrize('old, new', sorted(MOVED_MODULES.items()))
def test_old_path_is_the_new_module_with_a_warning(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f'{old} moved to {new}'):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_from_import_of_an_old_path():
    with pytest.warns(DeprecationWarning):
        sys.modules.pop('sa_vision.checkpoint', None)
        from sa_vision.checkpoint import read_checkpoint
    from sa_vision.train.checkpoint import read_checkpoint as new
    assert read_checkpoint is new


def test_python_m_old_trainer_runs_the_train_command(tmp_path):
    """``python -m sa_vision.training`` (0.1's way to train) runs sa-vision-train: a run with --export writes
    its Hub folder (the bare loop refuses --export)."""
    proc = subprocess.run(
        [sys.executable, '-m', 'sa_vision.training', '-c', 'sa_quadratic_cifar_digits', '--epochs', '1',
         '--model-kwargs', 'embed_dim=8', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=8',
         '--output', str(tmp_path), '--experiment', 'run', '--export'],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / 'run' / 'hub' / 'config.json').is_file()
