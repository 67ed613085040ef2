#!/usr/bin/env python3
""" Train a sa_vision model (or any timm model) with timm's library parts: see :mod:`sa_vision.training`

    python scripts/train.py -c sa_quadratic_cifar_digits --export          # offline, ~2 min on 2 CPUs
    python scripts/train.py -c sa_quadratic_cifar --data-dir data --dataset-download   # the paper's recipe
    torchrun --nproc_per_node 2 scripts/train.py -c sa_quadratic_cifar -b 50 --data-dir data

``-c`` takes a recipe name (``sa_vision/configs/<name>.yaml``) or a YAML file (e.g. an export's recipe.yaml).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone without installing
from sa_vision.errors import run_cli  # noqa: E402
from sa_vision.training import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(run_cli(main))
