""" The module paths of sa_vision 0.1 (flat) that moved into tier folders in 0.2: they still import, with a
DeprecationWarning, for one release (``import sa_vision.training``, ``python -m sa_vision.training``). """
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ['MOVED_MODULES', 'install']

MOVED_MODULES = {
    'sa_vision.training': 'sa_vision.train.loop',
    'sa_vision.checkpoint': 'sa_vision.train.checkpoint',
    'sa_vision.data': 'sa_vision.train.data',
    'sa_vision.evaluation': 'sa_vision.train.evaluation',
    'sa_vision.recipes': 'sa_vision.train.recipes',
    'sa_vision.run_timm': 'sa_vision.train.run_timm',
    'sa_vision.analysis': 'sa_vision.research.analysis',
    'sa_vision.pruning': 'sa_vision.research.pruning',
    'sa_vision.theory': 'sa_vision.research.theory',
    'sa_vision.plots': 'sa_vision.research.plots',
    'sa_vision.paper_reference': 'sa_vision.research.paper_reference',
    'sa_vision.benchmark': 'sa_vision.measure.benchmark',
}
# what ``python -m <old name>`` runs, where that is not the module itself (the trainer's command adds --export)
RUN_AS_MAIN = {'sa_vision.training': 'sa_vision.cli.train'}


def _warn(old: str) -> None:
    warnings.warn(f'{old} moved to {MOVED_MODULES[old]} in sa_vision 0.2; the old name goes in the next release',
                  DeprecationWarning, stacklevel=4)


class _MovedModuleLoader(importlib.abc.Loader):
    """Imports the new module under the old name (the same object: patching one patches both)."""

    def create_module(self, spec):
        _warn(spec.name)
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module) -> None:
        pass  # executed under its new name already

    def get_code(self, fullname):
        # python -m <old name>: run the new module as __main__ (runpy asks the loader for code to run)
        new = RUN_AS_MAIN.get(fullname, MOVED_MODULES[fullname])
        return compile(f'import runpy, warnings\n'
                       f'warnings.warn("{fullname} moved to {new}; run python -m {new}", DeprecationWarning)\n'
                       f'runpy.run_module("{new}", run_name="__main__", alter_sys=True)\n', f'<{fullname}>', 'exec')

    def is_package(self, fullname) -> bool:
        return False


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, _MovedModuleLoader())
        return None


def install() -> None:
    """Put the finder of the old names on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
