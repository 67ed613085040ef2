""" The package's import graph: imports flow down the tiers, layers -> models -> train -> research -> measure ->
hub -> reproduce -> cli (no circles)

The graph is read from the source with ``ast``, not from ``sys.modules``: an import inside a function counts as much as
one at module level (a lazy import only postpones a circle to the call that closes it). ``_import_graph`` is checked
first on a small package written here, whose edges and circle are known, then applied to ``sa_vision``.
"""
import ast
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = 'sa_vision'

# The tiers, bottom to top: a module may import its own tier and those below it. Each is a folder of sa_vision
# (reproduce orchestrates train, research and hub; cli holds the installed commands).
TIERS = ('layers', 'models', 'train', 'research', 'measure', 'hub', 'reproduce', 'cli')
# modules below every tier: facts, exception types, tables and atomic file writing, importing no sa_vision code
BASE_MODULES = {'paper', 'errors', 'tables', 'io'}


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
              and (getattr(node.func, 'attr', None) == 'import_module'
                   or getattr(node.func, 'id', None) == '__import__')):
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
    assert 'sa_vision.research.plots' in graph['sa_vision.hub.export']  # imported only when a card figure is drawn


def test_no_import_circle(graph):
    cycle = _find_cycle(graph)
    assert cycle is None, 'import circle: ' + ' -> '.join(cycle)


def _tier(module: str) -> int:
    """The tier of a module: its folder's place in :data:`TIERS` (the package root registers the models)."""
    parts = module.split('.')
    if len(parts) == 1:
        return TIERS.index('models')
    name = parts[1]
    if name in BASE_MODULES:
        return -1
    assert name in TIERS, (f'{module} is in no tier: a module of the package root belongs in BASE_MODULES (it imports '
                           f'no sa_vision code), a new folder in TIERS (and the package layout in CONTRIBUTING.md)')
    return TIERS.index(name)


def test_imports_go_down_the_tiers(graph):
    """A module imports its own tier and those below it, never one above (layers -> models -> train -> ...)."""
    wrong = {f'{m} -> {t}' for m, targets in graph.items() for t in targets
             if m != PACKAGE and t != PACKAGE and _tier(t) > _tier(m)}
    assert not wrong, f'imports of a higher tier: {sorted(wrong)}'


def test_every_module_is_in_a_tier(graph):
    for module in graph:
        _tier(module)  # asserts


def test_base_modules_import_no_sa_vision_code(graph):
    importing = {m: graph[m] for m in graph if m.split('.')[-1] in BASE_MODULES and graph[m]}
    assert not importing, f'the base modules (facts, errors) must import no sa_vision code: {importing}'


def test_importing_the_package_leaves_torch_and_timm_options_as_they_were():
    """``import sa_vision`` (and its documented packages: ``sa_vision.hub``, ...) registers models and nothing else:
    importing ``timm.optim`` (timm's kron.py) raised dynamo's recompile limit to 1,000,000 process-wide, over a
    limit the user had set, and timm alone imports no timm.optim. Checked in a new process, where nothing imported
    them before."""
    import os
    import subprocess
    import sys
    code = ('import sys, torch._dynamo, timm; c = torch._dynamo.config; c.recompile_limit = 4; '
            'before = (c.recompile_limit, c.cache_size_limit); import sa_vision; '
            'import sa_vision.hub, sa_vision.research, sa_vision.measure, sa_vision.reproduce; '
            'print(before == (c.recompile_limit, c.cache_size_limit), before, '
            '[m for m in ("timm.optim", "timm.scheduler", "matplotlib", "sklearn") if m in sys.modules])')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith('True (4, ') and out.stdout.endswith(' []\n'), out.stdout


def test_every_module_has_a_docstring():
    """Every module opens with a docstring (one line plus the paper reference or the math)."""
    undocumented = [module for module, path in _module_names(ROOT / PACKAGE, PACKAGE).items()
                    if not ast.get_docstring(ast.parse(path.read_text()))]
    assert not undocumented, f'no module docstring: {sorted(undocumented)}'


def _tests_table(text: str) -> Dict[str, List[str]]:
    """The module -> tests table of CONTRIBUTING.md's section 'Which tests cover a module': each module path (as
    written, relative to sa_vision/) -> the test names of its row."""
    section = text.split('## Which tests cover a module', 1)[1].split('\n## ', 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) == 2 and cells[0].startswith('`'):
            for module in cells[0].split(','):
                table[module.strip().strip('`')] = [t.strip() for t in cells[1].split(',')]
    return table


def test_tests_table_reader_reads_rows_of_several_modules():
    text = '# x\n## Which tests cover a module\n\n| module | tests |\n|---|---|\n| `a.py`, `b/c.py` | one, two |\n' \
           '| `d.py` | three |\n\n## Next\n| `e.py` | four |\n'
    assert _tests_table(text) == {'a.py': ['one', 'two'], 'b/c.py': ['one', 'two'], 'd.py': ['three']}


def test_every_module_has_a_row_in_the_tests_table():
    """CONTRIBUTING.md names the tests of every module (the packages' __init__.py re-export): a new module needs a
    row, and a row names modules and test files that exist."""
    table = _tests_table((ROOT / 'CONTRIBUTING.md').read_text(encoding='utf-8'))
    modules = {path.relative_to(ROOT / PACKAGE).as_posix() for path in (ROOT / PACKAGE).rglob('*.py')
               if path.name != '__init__.py'}
    assert not modules - set(table), f'modules without a row in the tests table: {sorted(modules - set(table))}'
    assert not set(table) - modules, f'rows of the tests table naming no module: {sorted(set(table) - modules)}'
    missing = {f'test_{name}.py' for names in table.values() for name in names} - {
        path.name for path in (ROOT / 'tests').glob('test_*.py')}
    assert not missing, f'CONTRIBUTING.md\'s tests table names test files that do not exist: {sorted(missing)}'


# --- the public classes of layers/ and models/ document their arguments ---

def _args_section(doc: str) -> List[str]:
    """The argument names of a Google-style ``Args:`` block (as timm writes it), in order; ``*args`` is ``args``."""
    lines = inspect.cleandoc(doc or '').splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == 'Args:'), None)
    if start is None:
        return []
    names, indent = [], None
    for line in lines[start + 1:]:
        if not line.strip():
            break
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:  # the next section
            break
        if depth == indent:
            names.append(line.strip().split(':', 1)[0].split(' (', 1)[0].lstrip('*'))
    return names


def test_args_section_reader():
    doc = '''Summary.

        Args:
            dim: Width.
            num_heads: Heads, with a
                continuation: not a name.
            *args: Positional.
            **kwargs: Keyword.

        Returns:
            nothing: not an argument.
        '''
    assert _args_section(doc) == ['dim', 'num_heads', 'args', 'kwargs']
    assert _args_section('No block.') == []


def _public_classes(package: str) -> Dict[str, type]:
    """``module.Class`` -> class, for every class in the ``__all__`` of a module of ``package``."""
    found = {}
    for module_name in _module_names(ROOT / PACKAGE / package.split('.')[-1], package):
        module = importlib.import_module(module_name)
        for name in getattr(module, '__all__', ()):
            obj = getattr(module, name)
            if inspect.isclass(obj) and obj.__module__ == module_name:
                found[f'{module_name}.{name}'] = obj
    return found


def test_public_layers_and_models_document_their_arguments():
    """Every public class of layers/ and models/ whose own ``__init__`` takes arguments (besides ``device`` and
    ``dtype``) names each of them, and nothing else, in the ``Args:`` block of its ``__init__`` docstring, or of
    the class docstring where the ``__init__`` would otherwise be over 60 lines (Google style allows either)."""
    classes = {**_public_classes(f'{PACKAGE}.layers'), **_public_classes(f'{PACKAGE}.models')}
    assert f'{PACKAGE}.layers.attention.PositionalAttention' in classes  # guards the walk against finding nothing
    wrong = {}
    for name, cls in classes.items():
        if '__init__' not in vars(cls):  # inherited (a NamedTuple, an exception): documented where it is defined
            continue
        params = [p for p in inspect.signature(cls.__init__).parameters if p not in ('self', 'device', 'dtype')]
        documented = _args_section(cls.__init__.__doc__) or _args_section(cls.__doc__)
        if params and sorted(documented) != sorted(params):
            wrong[name] = {'undocumented': [p for p in params if p not in documented],
                           'not an argument': [d for d in documented if d not in params]}
    assert not wrong, f'Args: blocks that do not match the __init__ signature: {wrong}'


# what one reader takes in at a time: a module, a function; a command's main that reads top to bottom may be longer
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_COMMAND_MAIN_LINES = 80
COMMAND_MAINS = {'sa_vision.train.loop'} | {f'sa_vision.cli.{p.stem}' for p in (ROOT / PACKAGE / 'cli').glob('*.py')}


def _long_code(package_dir: Path, package: str) -> List[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines and functions over their limit, as 'module: what (lines)'."""
    found = []
    for module, path in _module_names(package_dir, package).items():
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            found.append(f'{module}: the module ({len(source.splitlines())} lines)')
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                command_main = node.name == 'main' and module in COMMAND_MAINS
                if lines > (MAX_COMMAND_MAIN_LINES if command_main else MAX_FUNCTION_LINES):
                    found.append(f'{module}: {node.name} ({lines} lines)')
    return found


def test_long_code_reader_counts_modules_and_functions(tmp_path):
    body = '\n'.join(f'    x{i} = {i}' for i in range(MAX_FUNCTION_LINES))  # with its def: one line too many
    pkg = _write_package(tmp_path, {'__init__.py': '', 'a.py': f'def long():\n{body}\n',
                                    'b.py': 'x = 1\n' * (MAX_MODULE_LINES + 1), 'c.py': 'def short():\n    pass\n'})
    assert _long_code(pkg, 'pkg') == [f'pkg.a: long ({MAX_FUNCTION_LINES + 1} lines)',
                                      f'pkg.b: the module ({MAX_MODULE_LINES + 1} lines)']


def test_modules_and_functions_stay_short():
    """No module over 400 lines, no function over 60 except a command's ``main`` (at most 80), which reads top to
    bottom (CONTRIBUTING.md)."""
    assert not _long_code(ROOT / PACKAGE, PACKAGE), 'split these where a reader would look for the parts'
