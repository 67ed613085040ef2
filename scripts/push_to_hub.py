#!/usr/bin/env python3
""" Export trained weights as a Hub folder (timm format + model card) and publish it in one commit

The installed command ``sa-vision-push-to-hub`` (:mod:`sa_vision.cli.push_to_hub`), kept as a script.
"""
import sys

from sa_vision.cli.push_to_hub import cli

if __name__ == '__main__':
    sys.exit(cli())
