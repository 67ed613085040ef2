#!/usr/bin/env python3
""" Throughput / memory / MAC benchmark for the sa_vision models (in the spirit of timm's benchmark.py)

The installed command ``sa-vision-benchmark`` (:mod:`sa_vision.cli.benchmark`), kept as a script.
"""
import sys

from sa_vision.cli.benchmark import cli

if __name__ == '__main__':
    sys.exit(cli())
