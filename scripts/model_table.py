#!/usr/bin/env python3
""" Print the table of models: parameters and MACs counted with a FLOP counter (attention included)

The installed command ``sa-vision-model-table`` (:mod:`sa_vision.cli.model_table`), kept as a script.
"""
import sys

from sa_vision.cli.model_table import cli

if __name__ == '__main__':
    sys.exit(cli())
