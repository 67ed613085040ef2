#!/usr/bin/env python3
""" Top-1 / top-5 accuracy and loss of a model on a dataset (CIFAR-10 test split by default)

The installed command ``sa-vision-validate`` (:mod:`sa_vision.cli.validate`), kept as a script.
"""
import sys

from sa_vision.cli.validate import cli

if __name__ == '__main__':
    sys.exit(cli())
