""" Run one of timm's top-level scripts with the sa_vision models registered

timm's ``validate.py``, ``benchmark.py``, ``inference.py`` and ``onnx_export.py`` (in a timm checkout) create
models by name but have no option to import a plugin. This imports ``sa_vision`` (registering its models)
and then runs the given script as ``__main__`` with the remaining arguments::

    python -m sa_vision.train.run_timm path/to/timm/validate.py --model sa_quadratic_cifar --pretrained ...
    python -m sa_vision.train.run_timm path/to/timm/onnx_export.py sa_quadratic_cifar.onnx --model sa_quadratic_cifar

The script sees ``sys.argv == [script, *arguments]`` and its own folder first on ``sys.path``, as when run
with ``python script ...``.
"""
import os
import runpy
import sys
from typing import List, Optional

import sa_vision  # noqa: F401  (registers the models with timm)

__all__ = ['main']

USAGE = 'usage: python -m sa_vision.train.run_timm SCRIPT [ARGS...]   (SCRIPT: e.g. validate.py of a timm checkout)'


def main(argv: Optional[List[str]] = None) -> None:
    """Run ``argv[0]`` (a script path) as ``__main__`` with ``argv[1:]`` as its arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ('-h', '--help'):
        print(f'{USAGE}\n\n{__doc__.strip()}', file=sys.stderr if not argv else sys.stdout)
        raise SystemExit(2 if not argv else 0)
    script = argv[0]
    if not os.path.isfile(script):
        what = 'is a directory, not a script' if os.path.isdir(script) else 'does not exist'
        print(f'sa_vision.train.run_timm: {script} {what}; pass the path of a script such as validate.py, '
              f'benchmark.py, inference.py or onnx_export.py of a timm checkout\n{USAGE}', file=sys.stderr)
        raise SystemExit(2)
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name='__main__')


if __name__ == '__main__':
    main()
