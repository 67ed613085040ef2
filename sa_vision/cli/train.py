""" Train a sa_vision model (or any timm model) with timm's library parts (``sa-vision-train``)

    sa-vision-train -c sa_quadratic_cifar_digits --export          # offline, ~2 min on 2 CPUs
    sa-vision-train -c sa_quadratic_cifar --data-dir data --dataset-download   # the paper's recipe
    torchrun --nproc_per_node 2 -m sa_vision.cli.train -c sa_quadratic_cifar -b 50 --data-dir data

``-c`` takes a recipe name (``sa_vision/configs/<name>.yaml``) or a YAML file (e.g. an export's recipe.yaml). The
loop is :mod:`sa_vision.train.loop`; this command adds the Hub folder of ``--export``.
"""
import sys
from functools import partial

from sa_vision.errors import command
from sa_vision.hub import export_hub_folder
from sa_vision.hub.export import check_export_folder
from sa_vision.train import loop


def main(argv=None):
    # --export replaces the run's earlier export (of an earlier best epoch), never a folder of other files: a
    # resumed run is told so before its epochs (export.check)
    export = partial(export_hub_folder, replace=True)
    export.check = check_export_folder
    return loop.main(argv, export=export)


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
