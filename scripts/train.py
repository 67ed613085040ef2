#!/usr/bin/env python3
""" Train a sa_vision model (or any timm model) with timm's library parts

The installed command ``sa-vision-train`` (:mod:`sa_vision.cli.train`), kept as a script.
"""
import sys

from sa_vision.cli.train import cli

if __name__ == '__main__':
    sys.exit(cli())
