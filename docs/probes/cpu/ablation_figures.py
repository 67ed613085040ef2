"""The ablation's centre trajectories at the gpu-long length (docs/reproduction.md, "Ablation"; the paper's Fig. 3):
each variant's centres over its 51 kept epochs (epoch-000 is its start), from the positional parameters an H200
brought back (docs/probes/gpu/h200_2026-11-27_ablation_positional.tar.xz), drawn on the kept gpu-long quadratic
model's architecture (the ablation trains that profile's sa_quadratic_cifar).

    python docs/probes/cpu/ablation_figures.py docs/img/reproduction-gpu
"""
import sys
import tarfile
import tempfile
from pathlib import Path

import sa_vision  # noqa: F401
from sa_vision.research.analysis import load_model
from sa_vision.research.plots import plot_center_trajectories
from sa_vision.train.positional_epochs import models_at_epochs, run_epochs

ROOT = Path(__file__).resolve().parents[3]
POSITIONAL = ROOT / 'docs' / 'probes' / 'gpu' / 'h200_2026-11-27_ablation_positional.tar.xz'
ARCHITECTURE = ROOT / 'zoo' / 'fashion-mnist-gpu' / 'sa_quadratic_cifar'


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(str(ARCHITECTURE))
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(POSITIONAL, 'r:xz') as tar:
            tar.extractall(tmp, filter='data')
        for run in sorted(Path(tmp).iterdir()):
            epochs = run_epochs(run)
            path = out / f'{run.name.replace("-", "_")}_trajectories.png'
            plot_center_trajectories(models_at_epochs(model, epochs), str(path))
            print(f'{run.name}: {len(epochs)} epochs -> {path}')


if __name__ == '__main__':
    main(Path(sys.argv[1]))
