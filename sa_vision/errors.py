""" Errors a user can cause (:class:`UserError`, a ``ValueError``), and the one place the command-line scripts
report them: :func:`run_cli` prints ``error: <message>`` without a traceback and exits with status 2 """
import sys
from typing import Callable, Optional, Sequence

__all__ = ['UserError', 'RecipeError', 'RecipeNotFoundError', 'DatasetError', 'DatasetNotFoundError',
           'USAGE_ERROR_STATUS', 'run_cli', 'command']

USAGE_ERROR_STATUS = 2  # as argparse exits on a bad command line


class UserError(ValueError):
    """Something the user asked for cannot be done as asked: the message says what and how to fix it."""


class RecipeError(UserError):
    """A recipe (``-c``) or the arguments of a run are inconsistent or name unknown keys."""


class RecipeNotFoundError(RecipeError, FileNotFoundError):
    """A recipe name that is neither a YAML file nor a shipped recipe."""


class DatasetError(UserError):
    """A dataset name, folder or file that cannot be read as asked."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset folder or file that does not exist."""


def run_cli(main: Callable[[Optional[Sequence[str]]], Optional[int]], argv: Optional[Sequence[str]] = None) -> int:
    """Run a script's ``main(argv)``: its status (``None`` is 0), or 2 after printing a :class:`UserError`."""
    try:
        return main(argv) or 0
    except UserError as e:
        print(f'error: {e}', file=sys.stderr)
        return USAGE_ERROR_STATUS


def command(module_name: str) -> Callable[[], int]:
    """The installed command of the module ``module_name`` (``cli = command(__name__)``): its ``main`` through
    :func:`run_cli`, looked up when called, so ``python -m`` (``__main__``) and a patched ``main`` are what run."""
    def cli() -> int:
        return run_cli(sys.modules[module_name].main)
    return cli
