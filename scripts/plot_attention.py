#!/usr/bin/env python3
""" Pictures of where the attention heads of a sa_vision model look (paper figures 2-6)

The installed command ``sa-vision-plot`` (:mod:`sa_vision.cli.plot_attention`), kept as a script.
"""
import sys

from sa_vision.cli.plot_attention import cli

if __name__ == '__main__':
    sys.exit(cli())
