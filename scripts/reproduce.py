#!/usr/bin/env python3
""" The zoo, reproduced: train the four models, prune and fine-tune the fifth, evaluate, export (and publish)

The installed command ``sa-vision-reproduce`` (:mod:`sa_vision.cli.reproduce`), kept as a script.
"""
import sys

from sa_vision.cli.reproduce import cli

if __name__ == '__main__':
    sys.exit(cli())
