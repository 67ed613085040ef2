""" The package's import graph: imports flow one way, layers -> models -> tools -> scripts (no circles)

The graph is read from the source with ``ast``, not from ``sys.modules``: an import inside a function counts as much as
one at module level (a lazy import only postpones a circle to the call that closes it). ``_import_graph`` is checked
first on a small package written here, whose edges and circle are known, then applied to ``sa_vision``.
"""
import ast
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = 'sa_vision'

# modules the models may import besides layers and models: facts only (they import no sa_vision code themselves,
# which test_models_import_only_layers_models_and_constants checks too)
MODEL_CONSTANT_MODULES = {'sa_vision.paper'}


def _module_names(package_dir: Path, package: str) -> Dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``package_dir`` (``pkg/x/__init__.py`` is ``pkg.x``)."""
    modules = {}
    for path in sorted(package_dir.rglob('*.py')):
        parts = (package,) + path.relative_to(package_dir).with_suffix('').parts
        if parts[-1] == '__init__':
            parts = parts[:-1]
        modules['.'.join(parts)] = path
    return modules


def _imported_modules(tree: ast.AST, module: str, is_package: bool, modules: Set[str]) -> Iterator[str]:
    """The modules whose contents a module's source imports, anywhere in it (module level, functions, methods).

    ``from X import y`` imports module ``X.y`` when there is one, else the name ``y`` from ``X``. A literal
    ``importlib.import_module('x')`` counts as an import too.
    """
    own_package = module if is_package else module.rpartition('.')[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_package.split('.')
                if node.level - 1 >= len(base):
                    raise ValueError(f'{module}: relative import beyond the top-level package')
                base = base[:len(base) - (node.level - 1)]
                source = '.'.join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                yield f'{source}.{alias.name}' if f'{source}.{alias.name}' in modules else source
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, 'attr', None) == 'import_module' or getattr(node.func, 'id', None) == '__import__')):
            yield node.args[0].value


def _import_graph(package_dir: Path, package: str) -> Dict[str, Set[str]]:
    """Module -> the package's modules whose code runs when it imports what it imports.

    Importing ``pkg.a.b`` runs ``pkg/a/__init__.py`` before ``pkg/a/b.py``, so both are edges, except that the
    importer's own enclosing packages are not edges for being parents (their code is already running when the
    importer's runs); they are edges when imported themselves (``import pkg``, ``from . import name_in_init``).
    """
    modules = _module_names(package_dir, package)
    graph = {}
    for module, path in modules.items():
        is_package = path.name == '__init__.py'
        enclosing = {'.'.join(module.split('.')[:i]) for i in range(1, module.count('.') + 1 + is_package)}
        targets = set()
        for name in _imported_modules(ast.parse(path.read_text(), str(path)), module, is_package, set(modules)):
            parts = name.split('.')
            for i in range(1, len(parts) + 1):
                target = '.'.join(parts[:i])
                if target in modules and target != module and (target not in enclosing or i == len(parts)):
                    targets.add(target)
        graph[module] = targets
    return graph


def _find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One cycle as ``[a, b, ..., a]``, or None (depth-first search, deterministic order)."""
    state = {}  # module -> 'open' while on the current path, 'done' after
    path = []

    def visit(module):
        state[module] = 'open'
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 'open':
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        state[module] = 'done'
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + '.')


@pytest.fixture(scope='module')
def graph():
    return _import_graph(ROOT / PACKAGE, PACKAGE)


# --- the reader, on a package whose graph is known ---

def _write_package(root: Path, files: Dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / 'pkg' / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root / 'pkg'


def test_reader_finds_every_import_form(tmp_path):
    package_dir = _write_package(tmp_path, {
        '__init__.py': 'from . import low\nfrom .mid import thing\n',
        'low/__init__.py': 'from .leaf import x\n',
        'low/leaf.py': 'import os\nx = 1\n',
        'low/other.py': 'from . import leaf\nfrom .. import constants\n',
        'constants.py': 'C = 1\n',
        'low/plugin.py': 'def register():\n    import pkg\n',
        'mid.py': 'import pkg.low.leaf\nfrom pkg.constants import C\nthing = 1\n',
        'tool.py': '''
            import importlib
            class Tool:
                def run(self):
                    from .mid import thing
                    from . import constants
            def lazy():
                importlib.import_module('pkg.low.other')
            ''',
    })
    assert _import_graph(package_dir, 'pkg') == {
        'pkg': {'pkg.low', 'pkg.mid'},
        'pkg.low': {'pkg.low.leaf'},
        'pkg.low.leaf': set(),
        'pkg.low.other': {'pkg.low.leaf', 'pkg.constants'},
        'pkg.constants': set(),
        'pkg.low.plugin': {'pkg'},  # the top-level package's own code, not merely a parent
        'pkg.mid': {'pkg.low', 'pkg.low.leaf', 'pkg.constants'},  # pkg/low/__init__.py runs before leaf
        'pkg.tool': {'pkg.mid', 'pkg.constants', 'pkg.low', 'pkg.low.other'},
    }


def test_reader_refuses_imports_above_the_package(tmp_path):
    package_dir = _write_package(tmp_path, {'__init__.py': '', 'a.py': 'from ..elsewhere import x\n'})
    with pytest.raises(ValueError, match='beyond the top-level package'):
        _import_graph(package_dir, 'pkg')


def test_cycle_search_reports_a_lazy_circle(tmp_path):
    package_dir = _write_package(tmp_path, {
        '__init__.py': '',
        'a.py': 'from .b import f\n',
        'b.py': 'def f():\n    from .c import g\n    return g\n',
        'c.py': 'def g():\n    import pkg.a\n',
        'd.py': 'from . import a\n',
    })
    graph = _import_graph(package_dir, 'pkg')
    assert _find_cycle(graph) == ['pkg.a', 'pkg.b', 'pkg.c', 'pkg.a']
    graph['pkg.c'].clear()
    assert _find_cycle(graph) is None


# --- sa_vision ---

def test_reader_sees_the_package(graph):
    """Guards the reader against reading nothing: known edges, one of them inside a function."""
    assert {'sa_vision.layers', 'sa_vision.models', 'sa_vision.layers.attention', 'sa_vision.hub'} <= set(graph)
    assert 'sa_vision.layers' in graph['sa_vision.models.sa_cifar']
    assert 'sa_vision.plots' in graph['sa_vision.hub']  # imported only when a model card figure is drawn


def test_no_import_circle(graph):
    cycle = _find_cycle(graph)
    assert cycle is None, 'import circle: ' + ' -> '.join(cycle)


def test_layers_import_only_layers(graph):
    wrong = {f'{m} -> {t}' for m, targets in graph.items() if _in(m, 'sa_vision.layers')
             for t in targets if not _in(t, 'sa_vision.layers')}
    assert not wrong, f'layers import code above them: {sorted(wrong)}'


def test_models_import_only_layers_models_and_constants(graph):
    allowed = lambda t: _in(t, 'sa_vision.layers') or _in(t, 'sa_vision.models') or t in MODEL_CONSTANT_MODULES
    wrong = {f'{m} -> {t}' for m, targets in graph.items() if _in(m, 'sa_vision.models')
             for t in targets if not allowed(t)}
    assert not wrong, f'models import tools (Hub, checkpoints, training, ...): {sorted(wrong)}'
    constants_importing = {m: graph[m] for m in MODEL_CONSTANT_MODULES if graph[m]}
    assert not constants_importing, f'constant modules must import no sa_vision code: {constants_importing}'


def test_scripts_import_no_other_script():
    """Scripts are the top: each is a thin command line over sa_vision, none loads another (by sys.path or otherwise)."""
    scripts = {path.stem: path for path in (ROOT / 'scripts').glob('*.py')}
    wrong = set()
    for name, path in scripts.items():
        for imported in _imported_modules(ast.parse(path.read_text(), str(path)), name, False, set()):
            if imported.split('.')[0] in scripts and imported.split('.')[0] != name:
                wrong.add(f'scripts/{name}.py -> scripts/{imported.split(".")[0]}.py')
    assert not wrong, f'scripts import scripts: {sorted(wrong)}'


def test_every_module_says_what_it_is_for():
    """Every module outside layers (whose docstrings are their own matter) and every script opens with a docstring,
    and every sa_vision module among them names its place in the layering."""
    undocumented, unplaced = [], []
    for module, path in _module_names(ROOT / PACKAGE, PACKAGE).items():
        if not _in(module, 'sa_vision.layers'):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ''
            (undocumented if not doc else unplaced if 'Layering' not in doc else []).append(module)
    undocumented += [f'scripts/{path.name}' for path in (ROOT / 'scripts').glob('*.py')
                     if not ast.get_docstring(ast.parse(path.read_text()))]
    assert not undocumented, f'no module docstring: {sorted(undocumented)}'
    assert not unplaced, f'docstring without its place in the layering ("Layering: ..."): {sorted(unplaced)}'
