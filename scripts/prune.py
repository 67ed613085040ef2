#!/usr/bin/env python3
""" Prune the degenerate heads of a Gaussian sa_vision model (paper, appendix A.1; how sa_gen_pruned is made)

The installed command ``sa-vision-prune`` (:mod:`sa_vision.cli.prune`), kept as a script.
"""
import sys

from sa_vision.cli.prune import cli

if __name__ == '__main__':
    sys.exit(cli())
