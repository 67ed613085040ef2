""" The command-line scripts report a user's mistake as one ``error:`` line on stderr with status 2, no traceback

Each script runs in this process through ``sa_vision.errors.run_cli``, as its ``__main__`` block does; one of them
(sa-vision-prune) also runs as a real subprocess in tests/test_pruning.py. """
import atexit
import gc
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import timm

from sa_vision.cli import benchmark as benchmark_script
from sa_vision.cli import explore, plot_attention, prune, push_to_hub, validate
from sa_vision.cli import reproduce as reproduce_script
from sa_vision.errors import UserError, run_cli
from sa_vision.train.recipes import load_recipe
from sa_vision.train.state import load_initial_weights, parse_run_args, resolve_model_args

ROOT = Path(__file__).resolve().parent.parent
KEPT_SA = ROOT / 'zoo' / 'fashion-mnist-cpu' / 'sa_quadratic_cifar'  # a Hub folder: embed_dim 64, depth 6
KEPT_RESNET = ROOT / 'zoo' / 'fashion-mnist-cpu' / 'resnet18_cifar'


def _run(main, argv, capsys):
    status = run_cli(main, [str(a) for a in argv])
    err = capsys.readouterr().err
    return status, err


@pytest.mark.parametrize('script, argv, message', [
    (plot_attention, ['no_such_model', '--out', 'x.png'], "'no_such_model' is neither a file"),
    (plot_attention, ['resnet18_cifar', '--out', 'x.png'],
     "CifarResNet has no PositionalAttention layer; pass one of sa_vision's attention models (sa_quadratic_cifar, "),
    (plot_attention, ['sa_learned_cifar', '--kernel-match'], 'the kernel match needs Gaussian centres'),
    # the outputs are checked before the source is read (an unknown model would say so first otherwise)
    (plot_attention, ['no_such_model', '--out', '{tmp}/x.pnx'], 'names no picture format matplotlib writes'),
    (plot_attention, ['no_such_model', '--out', ROOT / 'pyproject.toml' / 'x.png'], 'pyproject.toml is a file'),
    (plot_attention, ['no_such_model', '--out', '{tmp}/x.png', '--table', '{tmp}/h.txt'], 'must end in .csv'),
    (plot_attention, ['sa_quadratic_cifar', '--figure', 'maps', '--zoom', '0', '--out', '{tmp}/x.png'],
     'zoom is 0: the window shows at least 1 grid unit'),
    (plot_attention, ['sa_quadratic_cifar', '--zoom', '3', '--out', '{tmp}/x.png'],
     'the figure drawn here is centers, which shows every position'),
    (plot_attention, ['sa_quadratic_cifar', '--out', '~/x.png'], 'a ~ is expanded by the shell only at the start'),
    (plot_attention, ['sa_quadratic_cifar', 'sa_learned_cifar', '--out', '{tmp}/x.png'],
     "one attention kind to follow the heads, got ['quadratic', 'learned']"),
    (prune, ['{tmp}/missing.pth', '--out', '{tmp}/x.pth'], 'does not exist'),
    (prune, ['sa_learned_cifar', '--out', '{tmp}/x.pth'], 'name the heads to prune with --heads'),
    # a path that is not there, without a weights suffix: timm would say it lacks a source prefix
    (prune, ['{tmp}/nope', '--out', '{tmp}/x.pth'], 'nope does not exist'),
    (prune, ['nope/', '--out', '{tmp}/x.pth'], 'nope does not exist'),
    (validate, ['--model', './nope', '--dataset', 'digits'], 'nope does not exist'),
    (prune, ['sa_gen_cifar', '--max-condition', '-5', '--out', '{tmp}/x.pth'], 'every condition number is at least 1'),
    (prune, ['sa_gen_cifar', '--heads', '1', '', '', '', '', '', '--max-condition', '10', '--out', '{tmp}/x.pth'],
     'pass either --heads or the thresholds'),
    (prune, ['sa_gen_cifar', '--out', '{tmp}'], 'is a folder: name the file to write'),
    (prune, ['sa_gen_cifar', '--out', '{tmp}/p.txt'], 'not a name of weights: name a .safetensors file, or a '
                                                     'torch file ending in .pth'),
    # the output is checked before the source is read (an unknown model would say so first otherwise)
    (prune, ['no_such_model', '--out', '/proc/sa_nope/x.safetensors'], 'nothing can be created in /proc'),
    (prune, ['no_such_model', '--out', ROOT / 'pyproject.toml' / 'x.pth'], 'pyproject.toml is a file'),
    (reproduce_script, ['--figures-from', '{tmp}/nope', '--out', '{tmp}/figs'], 'nope is not a folder'),
    (reproduce_script, ['--figures-from', '{tmp}', '--out', '{tmp}/figs'], 'holds no Hub folder'),
    (reproduce_script, ['--figures-from', ROOT / 'zoo' / 'fashion-mnist-cpu', '--out', ROOT / 'pyproject.toml'],
     'pyproject.toml is a file'),
    (push_to_hub, ['{tmp}/missing.pth', '--dry-run'], 'does not exist'),
    (benchmark_script, ['--model', 'no_such_model', '--bench', 'inference'], "unknown model 'no_such_model'"),
    (benchmark_script, ['--model', 'resnet18_cifar', '--compare', 'paper', '--bench', 'inference'],
     'no paper formulation'),
    (benchmark_script, ['--model', 'sa_quadratic_cifar', '--model-kwargs', 'embed_dim=8', 'depth=1',
                        '--img-size', '8', '--compare', 'batched', '--amp', '--runs', '1', '--quiet'],
     'sa_quadratic_cifar already runs every attention layer that way here (cpu, bfloat16 autocast)'),
    (benchmark_script, ['-m', 'sa_quadratic_cifar', '-b', '0'], '--batch-size is 0, it must be at least 1'),
    (benchmark_script, ['-m', 'sa_quadratic_cifar', '-b', '-3'], '--batch-size is -3, it must be at least 1'),
    (benchmark_script, ['-m', 'sa_quadratic_cifar', '--num-bench-iter', '0'],
     '--num-bench-iter is 0, it must be at least 1'),
    (benchmark_script, ['-m', 'sa_quadratic_cifar', '--runs', '-1'], '--runs is -1, it must be at least 0'),
    (benchmark_script, ['-m', 'sa_quadratic_cifar', '--amp', '--precision', 'float16'],
     '--amp autocasts a float32 model to --amp-dtype; --precision float16 makes the model float16 itself'),
    # checked before any model is built or timed (an unknown model would say so first otherwise)
    (benchmark_script, ['-m', 'no_such_model', '--results-file', ROOT / 'pyproject.toml' / 'x.csv'],
     'pyproject.toml is a file'),
    (benchmark_script, ['-m', 'no_such_model', '--results-file', '{tmp}'], 'is a folder: name the file to write'),
    (benchmark_script, ['-m', 'no_such_model', '--results-file', '{tmp}/new/'], 'is a folder: name the file to write'),
    (benchmark_script, ['--model-list', '{tmp}/nope.txt'], 'nope.txt cannot be read (No such file or directory)'),
    (benchmark_script, ['-m', 'no_such_model', '--reproduce-profile', 'nosuch'], "'nosuch' is not one of ['cpu'"),
    (benchmark_script, ['-m', 'sa_gen_pruned', '--reproduce-profile', 'cpu'],  # else built at its full size
     '--reproduce-profile cpu sizes sa_quadratic_cifar, sa_gen_cifar, sa_learned_cifar, resnet18_cifar, not '
     'sa_gen_pruned: give its size with --model-kwargs'),
    (benchmark_script, ['-m', 'sa_quadratic_cifar', '--reproduce-profile', 'cpu', '--compare', 'sa_content_cifar'],
     'not sa_content_cifar: time it without the profile'),
    (benchmark_script, ['-m', 'sa_quadratic_cifar', '--model-kwargs', 'embed_dim=8', 'depth=1', '--img-size', '15'],
     'sa_quadratic_cifar cannot take input size (3, 15, 15) (--img-size / --input-size): expected an even height'),
    (benchmark_script, ['-m', 'no_such_model', '--compare', 'fused', '--device', 'cpu'],
     '--compare fused: mix_and_project'),
    # checked before any model is loaded (an unknown model would say so first otherwise)
    (explore, ['no_such_model', '--out', '{tmp}/x.html', '--images', '0'], '--images is 0, it must be at least 1'),
    (explore, ['no_such_model', '--out', '{tmp}'], 'is a folder: name the file to write'),
    (explore, ['no_such_model', '--out', ROOT / 'pyproject.toml' / 'x.html'], 'pyproject.toml is a file'),
    (explore, ['no_such_model', '--out', '{tmp}/page.png'], 'the page is HTML: name a .html file'),
    # sa-vision-validate resolves --model as every command does (sa_vision.train.checkpoint.load_model)
    (validate, ['--model', 'no_such_model', '--dataset', 'digits'], "'no_such_model' is neither a file"),
    # a bare name is its trained weights, as in timm's validate.py: never a random init evaluated
    (validate, ['--model', 'sa_quadratic_cifar', '--dataset', 'digits'], 'are not published yet'),
    (validate, ['--model', 'local-dir:{tmp}/missing', '--dataset', 'digits'], 'missing is not a folder'),
    (validate, ['--checkpoint', 'sa_quadratic_cifar', '--dataset', 'digits'], 'sa_quadratic_cifar does not exist'),
    (validate, ['--checkpoint', KEPT_RESNET, '--model-kwargs', 'stem_type=deep', '--dataset', 'digits'],
     "CifarResNet has no stem_type 'deep'"),
    # checked before the evaluation, which it would otherwise follow with a traceback
    (validate, ['--checkpoint', KEPT_RESNET, '--results-file', '{tmp}'], 'is a folder: name the file to write'),
    # a model of fewer classes than the dataset's labels (torch's 'Target 71 is out of bounds'), before any data
    (validate, ['--checkpoint', KEPT_SA, '--dataset', 'torch/cifar100', '--data-dir', '{tmp}', '--dataset-download'],
     'has 10 classes, torch/cifar100 100: its labels up to 99 would be no class of the model: evaluate'),
    # a timm dataset kind whose reader's package is missing: said before a model is built (timm's traceback)
    (validate, ['--checkpoint', KEPT_SA, '--dataset', 'tfds/cifar10', '--data-dir', '{tmp}'],
     "timm reads tfds/ datasets with 'tensorflow' and 'tensorflow_datasets', not installed here (pip install "
     "tensorflow tensorflow-datasets)"),
    (validate, ['--checkpoint', KEPT_RESNET, '--results-file', ROOT / 'pyproject.toml' / 'r.csv'],
     'pyproject.toml is a file'),
], ids=['plot-unknown-model', 'plot-not-attention', 'plot-kernel-match-learned', 'plot-unknown-format',
        'plot-out-below-a-file', 'plot-table-format', 'plot-zoom-0', 'plot-zoom-of-centers', 'plot-out-tilde',
        'plot-trajectory-of-two-kinds',
        'prune-missing-file',
        'prune-learned-without-heads', 'prune-missing-path', 'prune-missing-folder', 'validate-missing-path',
        'prune-condition-below-1', 'prune-heads-and-thresholds', 'prune-out-is-a-folder', 'prune-out-not-weights',
        'prune-out-unwritable', 'prune-out-below-a-file',
        'figures-from-missing', 'figures-from-empty',
        'figures-into-a-file',
        'push-missing-file', 'benchmark-unknown-model', 'benchmark-no-paper-variant', 'benchmark-switch-without-effect',
        'benchmark-batch-size-0', 'benchmark-batch-size-negative', 'benchmark-no-bench-iter', 'benchmark-runs-negative',
        'benchmark-amp-and-half-precision',
        'benchmark-results-below-a-file', 'benchmark-results-is-a-folder', 'benchmark-results-ends-in-a-slash',
        'benchmark-missing-model-list',
        'benchmark-unknown-profile', 'benchmark-model-the-profile-does-not-size',
        'benchmark-compared-model-the-profile-does-not-size', 'benchmark-odd-img-size',
        'benchmark-fused-unavailable',
        'explore-no-images', 'explore-out-is-a-folder', 'explore-out-below-a-file', 'explore-out-not-html',
        'validate-unknown-model', 'validate-name-without-weights',
        'validate-missing-local-dir', 'validate-name-as-checkpoint', 'validate-resnet-stem-type',
        'validate-results-file-is-a-folder', 'validate-fewer-classes', 'validate-timm-reader-missing',
        'validate-results-file-below-a-file'])
def test_user_errors_are_one_line_with_status_2(script, argv, message, tmp_path, capsys):
    status, err = _run(script.main, [str(a).replace('{tmp}', str(tmp_path)) for a in argv], capsys)
    assert status == 2, err
    assert err.startswith('error: ') and message in err and err.count('\n') == 1, err


def test_a_pgf_figure_without_its_tex_is_refused_before_the_work(tmp_path, monkeypatch, capsys):
    """matplotlib lists .pgf but lays its text out with TeX: without one, the figure failed only once computed."""
    import shutil
    monkeypatch.setattr(shutil, 'which', lambda name: None)  # a machine without xelatex (this one, most likely)
    line = _one_error(plot_attention.main, ['no_such_model', '--out', str(tmp_path / 'x.pgf')], capsys)
    assert 'matplotlib writes .pgf with xelatex, which is not installed' in line, line


def test_reproduce_reports_user_errors_the_same_way(tmp_path, monkeypatch, capsys):
    from sa_vision.reproduce import Reproduction
    from sa_vision.train.checkpoint import CheckpointError

    def unreadable(self, publish=False):
        raise CheckpointError('runs/x/last.pth.tar cannot be read')
    monkeypatch.setattr(Reproduction, 'run', unreadable)
    status, err = _run(reproduce_script.main, ['--profile', 'tiny', '--out', tmp_path], capsys)
    assert status == 2 and err == 'error: runs/x/last.pth.tar cannot be read\n', err


def test_bugs_keep_their_traceback(monkeypatch):
    """Only user errors become one line: anything else is a bug and propagates."""
    def broken(argv):
        raise KeyError('a bug')
    with pytest.raises(KeyError):
        run_cli(broken, [])


def test_a_memory_request_refused_is_one_line_saying_what_needs_less(capsys):
    """A model given images too large for the machine (the generalized kind at 224 px asks 5-11 GB at once): torch's
    allocator error becomes one line with the sizes that need less, not a traceback; other RuntimeErrors stay bugs."""
    refused = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 11329339392 bytes. Error code 12 (Cannot allocate memory)")

    def too_large(argv):
        raise refused
    status, err = _run(too_large, [], capsys)
    assert status == 2 and err.count('\n') == 1, err
    assert err.startswith("error: out of memory ([enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                          "can't allocate memory: you tried to allocate 11329339392 bytes") and \
        'A smaller --batch-size or --img-size needs less' in err and 'Where each kind stops fitting' in err, err
    with pytest.raises(RuntimeError, match='shape mismatch'):
        run_cli(lambda argv: (_ for _ in ()).throw(RuntimeError('shape mismatch')), [])


def _record_atexit(monkeypatch) -> list:
    """What is registered with ``atexit`` from now on (and not unregistered), instead of registering it."""
    registered = []

    def unregister(func):
        registered[:] = [f for f in registered if f is not func]
    monkeypatch.setattr(atexit, 'register', registered.append)
    monkeypatch.setattr(atexit, 'unregister', unregister)
    return registered


@pytest.mark.parametrize('script', ['train', 'validate', 'benchmark', 'plot_attention', 'prune', 'push_to_hub',
                                    'reproduce', 'model_table', 'explore'])
def test_commands_run_main_through_run_cli(script, monkeypatch, capsys):
    """What the tests above call in-process is what the installed command and `python -m sa_vision.cli.<script>` run."""
    import importlib
    module = importlib.import_module(f'sa_vision.cli.{script}')

    def mistaken(argv=None):
        raise UserError('a mistake')
    monkeypatch.setattr(module, 'main', mistaken)
    at_exit = _record_atexit(monkeypatch)
    assert module.cli() == 2 and capsys.readouterr().err == 'error: a mistake\n'
    module.cli()
    # the process's exit leaves its objects out of its collections (freeze_at_exit), once however often cli ran
    assert at_exit == [gc.freeze]
    # pyproject.toml, not importlib.metadata: a checkout's stale sa_vision.egg-info would answer for the install
    tomllib = pytest.importorskip('tomllib')  # Python >= 3.11
    with open(ROOT / 'pyproject.toml', 'rb') as f:
        commands = tomllib.load(f)['project']['scripts']
    assert f'sa_vision.cli.{script}:cli' in commands.values(), f'no installed command runs sa_vision.cli.{script}:cli'
    assert 'sys.exit(cli())' in (ROOT / 'sa_vision' / 'cli' / f'{script}.py').read_text(), script  # python -m


def _run_with_stdout_read_by_nobody(argv, unbuffered: bool):
    """(status, stderr) of a command whose stdout is a pipe nobody reads any more (``| head`` has ended)."""
    import subprocess

    from helpers import HANG_TIMEOUT_S
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONUNBUFFERED'}
    env.update({'PYTHONUNBUFFERED': '1'} if unbuffered else {})
    try:
        done = subprocess.run([sys.executable, *argv], stdout=write, stderr=subprocess.PIPE, text=True, env=env,
                              timeout=HANG_TIMEOUT_S)
    finally:
        os.close(write)
    return done.returncode, done.stderr


@pytest.mark.slow  # four processes of the commands
@pytest.mark.skipif(not hasattr(os, 'pipe') or sys.platform == 'win32', reason='a POSIX pipe')
def test_a_reader_that_ends_early_ends_the_command_quietly_after_its_files(tmp_path):
    """``sa-vision-model-table | head -1``: status 141 (SIGPIPE's, as a shell reports it) and no traceback, with the
    output buffered or not; ``sa-vision-validate --results-file`` writes its file before printing."""
    import subprocess

    from helpers import HANG_TIMEOUT_S
    from timm.models._hub import save_for_hf
    for unbuffered in (True, False):
        status, err = _run_with_stdout_read_by_nobody(['-m', 'sa_vision.cli.model_table', '--format', 'csv'],
                                                      unbuffered)
        assert status == 141 and err == '', (unbuffered, status, err[-2000:])
    closed = subprocess.run([sys.executable, '-m', 'sa_vision.cli.model_table'], preexec_fn=lambda: os.close(1),
                            stderr=subprocess.PIPE, text=True, timeout=HANG_TIMEOUT_S)  # >&-: Python prints nothing
    assert closed.returncode == 0 and closed.stderr == '', closed.stderr[-2000:]
    folder = tmp_path / 'weights'
    save_for_hf(timm.create_model('sa_quadratic_cifar', embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32),
                folder, safe_serialization=True, model_config={'pretrained_cfg': {'tag': 'digits_custom'}})
    results = tmp_path / 'results.csv'
    status, err = _run_with_stdout_read_by_nobody(['-m', 'sa_vision.cli.validate', '--model', f'local-dir:{folder}',
                                                   '--threads', '1', '--results-file', str(results)], True)
    assert status == 141 and 'Traceback' not in err and results.read_text().startswith('model,'), err[-2000:]


@pytest.mark.skipif(not hasattr(os, 'pipe') or sys.platform == 'win32', reason='a POSIX pipe')
def test_only_a_write_to_stdout_whose_reader_is_gone_ends_quietly(monkeypatch):
    """With the output's reader gone, a broken pipe of another kind (a socket's here, a Hub upload's or a worker's
    in a run) is still the error it is; a write to stdout ends the command with 141."""
    import io
    import socket
    import types

    from sa_vision.errors import command
    read, write = os.pipe()
    os.close(read)
    module = types.ModuleType('sa_vision_test_pipes')
    monkeypatch.setitem(sys.modules, module.__name__, module)
    _record_atexit(monkeypatch)
    with open(write, 'wb', buffering=0) as widowed:
        monkeypatch.setattr(sys, 'stdout', io.TextIOWrapper(widowed, encoding='utf-8'))

        def send_to_a_closed_socket(argv=None):
            mine, theirs = socket.socketpair()
            theirs.close()
            with mine:
                mine.sendall(b'x' * 1_000_000)
        module.main = send_to_a_closed_socket
        with pytest.raises(BrokenPipeError):
            command(module.__name__)()
        module.main = lambda argv=None: print('a line nobody reads')
        assert command(module.__name__)() == 141


def test_output_no_encoding_of_stdout_holds_is_escaped_not_a_crash(monkeypatch):
    """A class name or path with an \u00e9 printed to an ASCII stdout (PYTHONIOENCODING=ascii, a C locale without
    Python's UTF-8 mode): escaped, as Python escapes stderr."""
    import io
    import types

    from sa_vision.errors import command
    module = types.ModuleType('sa_vision_test_printing')
    module.main = lambda argv=None: print('caf\u00e9')
    monkeypatch.setitem(sys.modules, module.__name__, module)
    raw = io.BytesIO()
    monkeypatch.setattr(sys, 'stdout', io.TextIOWrapper(raw, encoding='ascii'))
    _record_atexit(monkeypatch)
    assert command(module.__name__)() == 0
    sys.stdout.flush()
    assert raw.getvalue() == b'caf\\xe9\n'


def _installed_commands():
    """(module, command) of every installed command, as pyproject.toml declares them."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        return []
    with open(ROOT / 'pyproject.toml', 'rb') as f:
        return sorted((value.split(':')[0], name) for name, value in tomllib.load(f)['project']['scripts'].items())


@pytest.mark.parametrize('module, name', _installed_commands())
@pytest.mark.filterwarnings('ignore:.*found in sys.modules after import of package:RuntimeWarning')  # runpy's, as -m
def test_python_m_names_the_program_as_its_installed_command(module, name, monkeypatch, capsys):
    """``python -m sa_vision.cli.train --help`` says ``usage: sa-vision-train``, not ``usage: train.py`` (argparse
    names the program after sys.argv[0], the module's file under ``python -m``, which runpy runs as here)."""
    import runpy
    import sys
    monkeypatch.setattr(sys, 'argv', ['placeholder', '--help'])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module(module, run_name='__main__', alter_sys=True)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f'usage: {name} '), name


# --- mistakes of a first hour with the commands: each one error line, status 2, no traceback -----------------------



def _one_error(main, argv, capsys) -> str:
    """The error line of ``main(argv)`` under run_cli, which must exit 2 with exactly one ``error:`` line (log lines
    of sa-vision-train may come before it) and no traceback."""
    status, err = _run(main, argv, capsys)
    errors = [line for line in err.splitlines() if line.startswith('error: ')]
    assert status == 2 and len(errors) == 1 and 'Traceback' not in err, err
    assert err.strip().splitlines()[-1] == errors[0], err
    return errors[0]


def _train_main():
    from sa_vision.cli import train
    return train.main


def test_an_unknown_model_name_suggests_the_registered_one(tmp_path, capsys):
    from sa_vision.cli import model_table
    line = _one_error(_train_main(), ['--model', 'sa_quadratc_cifar', '--dataset', 'digits', '--output', tmp_path],
                      capsys)
    assert "unknown model 'sa_quadratc_cifar'" in line and "did you mean 'sa_quadratic_cifar'?" in line, line
    line = _one_error(model_table.main, ['--models', 'sa_quadratc_cifar'], capsys)
    assert "unknown model 'sa_quadratc_cifar'" in line and "did you mean 'sa_quadratic_cifar'?" in line, line
    # validate, prune, plot and explore say the same through load_model (they take weights too)
    line = _one_error(validate.main, ['--model', 'sa_quadratc_cifar', '--dataset', 'digits'], capsys)
    assert "is neither a file" in line and "did you mean 'sa_quadratic_cifar'?" in line, line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize('command, argv, source', [
    ('train', ['-c', 'sa_quadratic_cifar_digits', '--model-kwargs', 'embed_dim=16', 'depht=1'], '--model-kwargs'),
    ('train', ['-c', '{tmp}/typo.yaml'], 'the model_kwargs of recipe {tmp}/typo.yaml'),
    ('validate', ['--checkpoint', KEPT_SA, '--dataset', 'digits', '--model-kwargs', 'depht=1'], '--model-kwargs'),
], ids=['train-command-line', 'train-recipe', 'validate-hub-folder'])
def test_an_unknown_model_keyword_names_where_it_came_from_and_the_nearest(command, argv, source, tmp_path, capsys):
    import yaml
    (tmp_path / 'typo.yaml').write_text(yaml.safe_dump(
        {'model': 'sa_quadratic_cifar', 'model_kwargs': {'embed_dim': 16, 'depht': 1}, 'dataset': 'digits'}))
    main = _train_main() if command == 'train' else validate.main
    argv = [str(a).replace('{tmp}', str(tmp_path)) for a in argv]
    line = _one_error(main, argv + (['--output', tmp_path / 'out'] if command == 'train' else []), capsys)
    assert "sa_quadratic_cifar takes no keyword argument 'depht'" in line, line
    assert f'from {source.replace("{tmp}", str(tmp_path))})' in line and "did you mean 'depth'?" in line, line


def test_python_3_13s_own_suggestion_is_not_taken_for_the_models_reason(monkeypatch):
    """Python 3.13 ends the TypeError of an unknown keyword with ". Did you mean 'depth'?": the error is the same
    one line as on the older Pythons, not ": . Did you mean"."""
    from sa_vision.models import factory

    def builder_of_python_3_13(name, pretrained=False, **kwargs):
        raise TypeError("sa_quadratic_cifar() got an unexpected keyword argument 'depht'. Did you mean 'depth'?")
    monkeypatch.setattr(factory.timm, 'create_model', builder_of_python_3_13)
    with pytest.raises(UserError) as refused:
        factory.create_named_model('sa_quadratic_cifar', depht=1)
    assert str(refused.value).endswith("(depht=1, from --model-kwargs): did you mean 'depth'?"), refused.value


@pytest.mark.parametrize('command', ['train', 'validate', 'benchmark'])
def test_a_model_keyword_value_the_model_refuses_is_one_error_line_naming_it(command, tmp_path, capsys):
    """The models' own checks raise a ValueError (timm.create_model keeps it); a command says which keyword was
    refused, where it came from and why, without a traceback."""
    with pytest.raises(ValueError, match="global_pool must be 'avg', 'max', 'avgmax' or ''"):
        timm.create_model('sa_quadratic_cifar', global_pool='token')
    kwargs = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'global_pool=token']
    main, argv = {
        'train': (_train_main(), ['--dataset', 'digits', *kwargs, '--output', tmp_path / 'out']),
        'validate': (validate.main, ['--checkpoint', KEPT_SA, '--dataset', 'digits', '--model-kwargs',
                                     'global_pool=token']),
        'benchmark': (benchmark_script.main, ['--model', 'sa_quadratic_cifar', *kwargs]),
    }[command]
    line = _one_error(main, argv, capsys)
    assert line.startswith("error: sa_quadratic_cifar cannot be built (global_pool='token', from --model-kwargs): "
                           "global_pool must be 'avg', 'max', 'avgmax' or ''"), line
    assert line.endswith('these models have no class token'), line
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('kwargs, message', [
    (['drop_rate=2'], "sa_quadratic_cifar: drop_rate=2 (from --model-kwargs) is a probability: it must be between 0 "
                      "and 1"),
    (['proj_drop_rate=-0.1'], 'proj_drop_rate=-0.1 (from --model-kwargs) is a probability'),
    (['heads_per_layer=0'], 'heads_per_layer=0, from --model-kwargs): heads_per_layer 0: every layer needs at least '
                            'one head'),
])
def test_values_the_layers_refuse_without_naming_them_are_named(kwargs, message, capsys):
    """nn.Dropout's 'dropout probability has to be between 0 and 1' and the layer's 'num_heads must be >= 1' name
    no keyword of the user's: checked before, a command names it."""
    line = _one_error(benchmark_script.main, ['--model', 'sa_quadratic_cifar', '--model-kwargs', 'embed_dim=16',
                                              'depth=1', *kwargs], capsys)
    assert message in line, line


def test_a_value_error_naming_no_keyword_is_no_user_error(monkeypatch):
    """A ValueError whose message names none of the keywords given (a bug, a broken config file) keeps its type and
    traceback: told as the user's mistake, it would hide where it came from."""
    from sa_vision.models import create_named_model

    def broken(*args, **kwargs):
        raise ValueError('too many values to unpack (expected 2)')
    monkeypatch.setattr(timm, 'create_model', broken)
    with pytest.raises(ValueError) as raised:
        create_named_model('sa_quadratic_cifar', depth=1)
    assert not isinstance(raised.value, UserError)


def test_an_unknown_keyword_without_a_near_one_lists_the_models_keywords(capsys):
    import inspect

    from timm.models.resnet import ResNet

    from sa_vision.models import CifarResNet
    line = _one_error(validate.main, ['--checkpoint', KEPT_RESNET, '--dataset', 'digits', '--model-kwargs',
                                      'heads_per_layer=9'], capsys)
    assert "resnet18_cifar takes no keyword argument 'heads_per_layer'" in line, line
    # CifarResNet's own keywords and those its **kwargs passes on to timm's ResNet
    for cls in (CifarResNet, ResNet):
        for name in list(inspect.signature(cls.__init__).parameters)[1:]:
            if name != 'kwargs':
                assert name in line, (name, line)


def test_a_vit_img_size_says_that_any_even_size_is_taken(capsys):
    """img_size, which a ViT takes: timm.create_model and the commands both say why these models have none."""
    import timm
    with pytest.raises(TypeError, match=r"sa_quadratic_cifar\(\) got an unexpected keyword argument 'img_size': it "
                                        r"takes images of any even size"):
        timm.create_model('sa_quadratic_cifar', img_size=64)
    line = _one_error(validate.main, ['--checkpoint', KEPT_SA, '--dataset', 'digits', '--model-kwargs',
                                      'img_size=64'], capsys)
    assert line.endswith("takes no keyword argument 'img_size' (img_size=64, from --model-kwargs): it takes images "
                         "of any even size, so it has none; size the data instead (timm's --img-size / "
                         "--input-size)"), line


@pytest.mark.parametrize('argv, message', [
    (['--epochs', '-1'], '--epochs is -1, it must be at least 1'),
    (['--epochs', '0'], '--epochs is 0, it must be at least 1'),
    (['-b', '0'], '--batch-size is 0, it must be at least 1'),
    (['-vb', '0'], '--validation-batch-size is 0, it must be at least 1'),
    (['--workers', '-1'], '--workers is -1, it must be at least 0'),
    (['--lr', '-0.1'], '--lr is -0.1, it must be at least 0'),
    (['--log-interval', '0'], '--log-interval is 0, it must be at least 1'),
    (['--threads', '-2'], '--threads is -2, it must be at least 1'),
    # what torch and timm refuse deep inside, or train on without a word
    (['--lr', 'nan'], '--lr is nan, it must be a finite number'),
    (['--lr', 'inf'], '--lr is inf, it must be a finite number'),
    (['--momentum', '-1'], '--momentum is -1.0, it must be at least 0.0'),
    (['--weight-decay', '-1'], '--weight-decay is -1.0, it must be at least 0.0'),
    (['--smoothing', '1.5'], '--smoothing is 1.5, it must be less than 1.0'),
    (['--drop', '1'], '--drop is 1.0, it must be less than 1.0'),
    (['--drop-path', '1.5'], '--drop-path is 1.5, it must be less than 1.0'),
    (['--hflip', '3'], '--hflip is 3.0, it must be at most 1.0'),
    (['--clip-grad', '-1'], '--clip-grad is -1.0, it must be more than 0.0'),
    (['--num-classes', '0'], '--num-classes is 0, it must be at least 1'),
    (['--img-size', '0'], '--img-size is 0, it must be at least 1'),
    (['--warmup-epochs', '-1'], '--warmup-epochs is -1.0, it must be at least 0.0'),
    (['--sched', 'step', '--decay-epochs', '0'], '--decay-epochs is 0.0, it must be more than 0.0'),
    (['--train-crop-padding', '-3'], '--train-crop-padding is -3, it must be at least 0'),
    (['--sched', 'step', '--decay-rate', 'nan'], '--decay-rate is nan, it must be a finite number'),
    (['--sched', 'step', '--decay-rate', '-1'], '--decay-rate is -1.0, it must be more than 0.0'),
    (['--cooldown-epochs', '-1'], '--cooldown-epochs is -1, it must be at least 0.0'),
    (['--sched', 'multistep', '--decay-milestones', '2', '-3'], '--decay-milestones is -3, it must be more than 0.0'),
    (['--opt-eps', '-1'], '--opt-eps is -1.0, it must be at least 0.0'),
    (['--patience-epochs', '-1'], '--patience-epochs is -1, it must be at least 0.0'),
])
def test_train_numbers_out_of_their_range_are_one_error_line(argv, message, tmp_path, capsys):
    line = _one_error(_train_main(), ['-c', 'sa_quadratic_cifar_digits', '--output', tmp_path, *argv], capsys)
    assert line.startswith(f'error: {message}') and 'recipe sa_quadratic_cifar_digits' in line, line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize('argv, message', [
    # timm bisects the milestones (sorted): 2 1 decayed twice at the first
    (['--sched', 'multistep', '--decay-milestones', '2', '1'], '--decay-milestones 2 1: give them increasing'),
    (['--min-lr', '0.5'], '--min-lr 0.5 is above --lr 0.005: the schedule would climb to it'),
    (['--warmup-lr', '0.5'], '--warmup-lr 0.5 is above --lr 0.005'),
    (['--opt', 'sgd', '--momentum', '0'], "--opt sgd is Nesterov's momentum, which needs --momentum above 0; plain "
                                          "SGD is --opt momentum --momentum 0"),
    (['--sched', 'rsqrt', '--warmup-epochs', '0'], '--sched rsqrt takes its time scale from the warm-up here'),
    (['--opt', 'adahessian', '--torchcompile', 'aot_eager'], '--opt adahessian takes the gradient of the gradient'),
])
def test_train_values_that_together_train_other_than_they_say_are_one_error_line(argv, message, tmp_path, capsys):
    """Each value in bounds, together what timm would train on without a word (a schedule climbing to --min-lr,
    milestones that decay twice at once) or fail on inside torch (Nesterov without momentum)."""
    line = _one_error(_train_main(), ['-c', 'sa_quadratic_cifar_digits', '--output', tmp_path, *argv], capsys)
    assert line.startswith(f'error: {message}'), line
    assert not any(tmp_path.iterdir())


def test_least_values_are_allowed():
    import argparse

    from sa_vision.train.arg_values import check_value_bounds
    check_value_bounds(argparse.Namespace(epochs=1, batch_size=1, validation_batch_size=None, workers=0, threads=None,
                                          log_interval=1, lr=0., hflip=1., momentum=0., smoothing=0.99,
                                          train_crop_padding=0, clip_grad=1e-9))


@pytest.mark.parametrize('text, message', [
    ('model: [unclosed\nepochs: 2\n', "is not valid YAML (expected ',' or ']', but got ':' at line 2 column 7)"),
    ('model_kwargs: [embed_dim, 32]\n', "model_kwargs in recipe {recipe} is ['embed_dim', 32], it must be a mapping"),
    ('epochs: ten\n', "--epochs is 'ten' in recipe {recipe}, it must be a whole number"),
    ('lr: fast\n', "--lr is 'fast' in recipe {recipe}, it must be a number"),
    ('sched: multistep\ndecay_milestones: [30, "60"]\n', "--decay-milestones is '60', it must be a number"),
    ('device_modules: [sa_vision, this]\n', "recipe {recipe} names device_modules ['this'], which sa-vision-train "
                                            "imports only from the command line"),
], ids=['yaml', 'model-kwargs-list', 'epochs-text', 'lr-text', 'milestone-text', 'device-modules'])
def test_a_recipe_of_broken_yaml_or_wrong_kinds_is_one_error_line_naming_it(text, message, tmp_path, capsys):
    recipe = tmp_path / 'recipe.yaml'
    recipe.write_text(text)
    line = _one_error(_train_main(), ['-c', recipe, '--output', tmp_path / 'out'], capsys)
    assert message.format(recipe=recipe) in line and str(recipe) in line, line
    assert not (tmp_path / 'out').exists()


def test_initial_checkpoint_takes_timms_local_dir_name_and_says_how_to_get_hub_weights(tmp_path, capsys):
    """--initial-checkpoint local-dir:<folder> is that folder (said not to exist before); hf-hub:<repo> is refused
    with how to download it, as --model hf-hub: is."""
    args = parse_run_args(['-c', 'sa_quadratic_cifar_digits', '--initial-checkpoint', f'local-dir:{KEPT_SA}'])[0]
    assert args.initial_checkpoint == str(KEPT_SA)
    line = _one_error(_train_main(), ['-c', 'sa_quadratic_cifar_digits', '--output', tmp_path, '--initial-checkpoint',
                                      'hf-hub:sa-vision/sa_quadratic_cifar.cifar10'], capsys)
    assert line == ('error: --initial-checkpoint hf-hub:sa-vision/sa_quadratic_cifar.cifar10: sa-vision-train starts '
                    'from downloaded weights: download the repository (hf download '
                    'sa-vision/sa_quadratic_cifar.cifar10 --local-dir DIR) and pass --initial-checkpoint DIR'), line


@pytest.mark.parametrize('main', ['train', 'benchmark'])
def test_a_compile_backend_torch_does_not_know_is_one_error_line(main, tmp_path, capsys):
    main, argv = ((_train_main(), ['-c', 'sa_quadratic_cifar_digits', '--output', tmp_path]) if main == 'train' else
                  (benchmark_script.main, ['-m', 'resnet18_cifar', '--bench', 'inference']))
    line = _one_error(main, [*argv, '--torchcompile', 'inductr'], capsys)
    assert line.startswith("error: --torchcompile 'inductr' is not a backend of torch.compile (did you mean "
                           "'inductor'?)"), line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize('main', ['train', 'validate'])
def test_a_device_module_python_cannot_find_is_one_error_line(main, tmp_path, capsys):
    main, argv = ((_train_main(), ['-c', 'sa_quadratic_cifar_digits', '--output', tmp_path]) if main == 'train' else
                  (validate.main, ['--checkpoint', KEPT_SA]))
    line = _one_error(main, [*argv, '--device-modules', 'no_such_backend'], capsys)
    assert line.startswith("error: --device-modules no_such_backend: no module 'no_such_backend' in this Python"), line


@pytest.mark.parametrize('argv, message', [
    (['-b', '0'], '--batch-size is 0, it must be at least 1'),
    (['-j', '-1'], '--workers is -1, it must be at least 0'),
])
def test_validate_numbers_below_their_least_value_are_one_error_line(argv, message, capsys):
    line = _one_error(validate.main, ['--checkpoint', KEPT_SA, *argv], capsys)
    assert line == f'error: {message}', line


@pytest.mark.parametrize('command', ['train', 'validate', 'benchmark'])
def test_a_cuda_device_without_cuda_says_so(command, monkeypatch, tmp_path, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    main, argv = {
        'train': (_train_main(), ['-c', 'sa_quadratic_cifar_digits', '--output', tmp_path]),
        'validate': (validate.main, ['--checkpoint', KEPT_SA]),
        'benchmark': (benchmark_script.main, ['--model', 'resnet18_cifar', '--bench', 'inference']),
    }[command]
    line = _one_error(main, [*argv, '--device', 'cuda'], capsys)
    assert 'CUDA is not available here' in line and 'drop --device or pass --device cpu' in line, line


def test_a_device_torch_does_not_know_or_this_machine_lacks_is_one_error_line(monkeypatch, capsys):
    import torch
    line = _one_error(validate.main, ['--checkpoint', KEPT_SA, '--device', 'gpu'], capsys)
    assert "--device 'gpu' is not a device torch knows" in line, line
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    line = _one_error(validate.main, ['--checkpoint', KEPT_SA, '--device', 'cuda:1'], capsys)
    assert 'this machine has 1 CUDA device(s), cuda:0 to cuda:0' in line, line
    # torch knows them, this machine lacks them (it was torch's traceback, from the model's .to()); meta holds no
    # values (the run failed in its first batch, its folder written)
    for device in [d for d in ('mps', 'xpu:0') if not getattr(torch, d[:3]).is_available()]:  # none here
        line = _one_error(validate.main, ['--checkpoint', KEPT_SA, '--device', device], capsys)
        assert f'--device {device}: torch cannot place a tensor there' in line and 'pass --device cpu' in line, line
    line = _one_error(validate.main, ['--checkpoint', KEPT_SA, '--device', 'meta'], capsys)
    assert '--device meta holds shapes, not values' in line, line
    # a type whose package (--device-modules) is not imported: torch.hpu does not exist without Habana's
    line = _one_error(validate.main, ['--checkpoint', KEPT_SA, '--device', 'hpu'], capsys)
    assert "--device hpu: torch cannot place a tensor there (No module named 'torch.hpu')" in line, line
    assert '--device-modules of sa-vision-train and -validate' in line, line


@pytest.mark.parametrize('argv, source, advice', [
    (['-c', 'sa_quadratic_cifar_digits'], 'The model_kwargs of recipe sa_quadratic_cifar_digits (embed_dim=32',
     # the kept model's config.json (embed_dim, mlp_hidden_dim) and its shapes (6 layers of 9 heads)
     "pass the weights' own, --model-kwargs embed_dim=64 mlp_hidden_dim=128 depth=6 "
     "'heads_per_layer=(9, 9, 9, 9, 9, 9)', which update the recipe's, or train without that recipe"),
    (['--model', 'sa_quadratic_cifar', '--dataset', 'digits', '--model-kwargs', 'embed_dim=32'],
     '--model-kwargs (embed_dim=32)', 'drop them'),
    # another class count: the classifier is left out, the rest must fit as well (it was torch's traceback)
    (['-c', 'sa_quadratic_cifar_digits', '--num-classes', '5'],
     'The model_kwargs of recipe sa_quadratic_cifar_digits (embed_dim=32',
     "pass the weights' own, --model-kwargs embed_dim=64 mlp_hidden_dim=128 depth=6 "
     "'heads_per_layer=(9, 9, 9, 9, 9, 9)', which update the recipe's, or train without that recipe"),
], ids=['recipe', 'command-line', 'recipe-new-classifier'])
def test_initial_weights_of_another_architecture_name_where_the_arguments_came_from(argv, source, advice, tmp_path,
                                                                                     capsys):
    line = _one_error(_train_main(), [*argv, '--initial-checkpoint', KEPT_SA, '--output', tmp_path], capsys)
    assert f'the weights of {KEPT_SA} do not fit sa_quadratic_cifar' in line, line
    assert source in line and advice in line, line
    # the first key that differs (embed_dim 64 against 32, 2x2 patches of 3 channels) and how many keys do
    assert 'size mismatch for patch_embed.proj.weight: [64, 3, 2, 2] in the weights, [32, 3, 2, 2] in the model' \
        in line, line
    assert re.search(r'\(\d+ keys of another shape, 0 missing, \d+ unexpected\)', line), line
    if argv[0] == '-c':  # the advice fits: the weights load, and nothing else is refused before training
        fixed = shlex.split(line.split('--model-kwargs ', 1)[1].split(', which', 1)[0])
        args = parse_run_args([*argv, '--initial-checkpoint', str(KEPT_SA), '--model-kwargs', *fixed])[0]
        initial, sources = resolve_model_args(args, load_recipe(argv[1]), None, lambda _: None)
        load_initial_weights(timm.create_model(args.model, **args.model_kwargs), initial, args, lambda _: None,
                             sources)


@pytest.mark.parametrize('given, num_classes', [
    ([], 10),
    (['--model-kwargs', 'num_classes=5'], 5),
    (['--num-classes', '7', '--model-kwargs', 'num_classes=5'], 7),
    (['--num-classes', '10', '--model-kwargs', 'num_classes=5'], 10),
    (['--model-kw', 'num_classes=5'], 5),  # argparse takes a prefix of an option
])
def test_a_class_count_on_the_command_line_wins_over_the_recipes(given, num_classes, tmp_path):
    """A recipe's num_classes (a flag, as timm's recipes write it) is a default: '-c RECIPE --model-kwargs
    num_classes=5' built a 10-class model. The --num-classes flag on the command line wins over both, as
    create_model gets it last; the flag and the model agree (an image folder's class count reads the flag)."""
    from PIL import Image

    from sa_vision.train.run_setup import num_classes_of_folder
    argv = ['-c', 'sa_quadratic_cifar_digits', *given]
    args = parse_run_args(argv)[0]
    resolve_model_args(args, load_recipe(argv[1]), None, lambda _: None)
    assert args.model_kwargs['num_classes'] == args.num_classes == num_classes
    for name in map(str, range(num_classes)):  # a folder of as many classes: the count agrees
        (tmp_path / 'train' / name).mkdir(parents=True)
        Image.new('RGB', (4, 4)).save(tmp_path / 'train' / name / '0.png')
    args.dataset, args.data_dir = '', str(tmp_path)
    num_classes_of_folder(args, load_recipe(argv[1]), lambda _: None)


@pytest.mark.parametrize('given, drop_path_rate', [
    (['--model-kwargs', 'drop_path_rate=0.3'], 0.3),
    (['--model-kwargs', 'drop_path_rate=0.3', '--drop', '0.0'], 0.3),  # --drop is no prefix of --drop-path
    (['--model-kwargs', 'drop_path_rate=0.3', '--drop-p', '0.2'], 0.2),  # a prefix of it alone is
    (['--model', 'sa_quadratic_cifar'], 0.1),  # --model is no prefix of --model-kwargs
])
def test_only_the_options_argparse_takes_count_as_given(given, drop_path_rate, tmp_path):
    recipe = tmp_path / 'recipe.yaml'
    recipe.write_text('model: sa_quadratic_cifar\ndataset: digits\ndrop_path: 0.1\n'
                      'model_kwargs: {drop_path_rate: 0.2}\n', encoding='utf-8')
    argv = ['-c', str(recipe), *given]
    args = parse_run_args(argv)[0]
    resolve_model_args(args, load_recipe(str(recipe)), None, lambda _: None)
    assert args.model_kwargs['drop_path_rate'] == args.drop_path == drop_path_rate


def test_sa_safetensors_named_as_another_model_say_which_model_they_hold(capsys):
    message = 'holds a sa_quadratic_cifar model, not resnet18_cifar; pass weights of resnet18_cifar or use --model'
    for weights in (KEPT_SA / 'model.safetensors', KEPT_SA):
        line = _one_error(validate.main, ['--model', 'resnet18_cifar', '--checkpoint', weights], capsys)
        assert line == f'error: {weights} {message} sa_quadratic_cifar', line


def test_validate_help_shows_what_its_options_refer_to(capsys):
    with pytest.raises(SystemExit):
        validate.main(['--help'])
    text = capsys.readouterr().out
    assert 'weights of any kind (see above)' in text
    # "above": the kinds of weights, listed before the options
    assert text.index('What to evaluate') < text.index('.safetensors') < text.index('options:')


def _option_help(main, option, capsys) -> str:
    """The --help text of ``option`` (up to the next option), its lines joined as the terminal breaks them."""
    with pytest.raises(SystemExit):
        main(['--help'])
    text = re.sub(r'(?<=\w-)\s+', '', capsys.readouterr().out.split('options:')[1])  # 'fashion-\n mnist'
    return ' '.join(re.split(rf'\n  {re.escape(option)}\b', text)[1].split('\n  -')[0].split())


@pytest.mark.parametrize('main, option', [(validate.main, '--dataset'), (validate.main, '--split'),
                                          (explore.main, '--val-split')])
def test_the_dataset_helps_name_every_dataset_the_commands_read(main, option, capsys):
    """docs/training.md's datasets, CIFAR-100 among them (each evaluated on its test split by default)."""
    text = _option_help(main, option, capsys)
    for name in ('digits', 'fashion-mnist', 'torch/cifar10', 'torch/cifar100'):
        assert name in text, (name, text)


def test_the_explorers_download_is_of_any_torchvision_dataset(capsys):
    text = _option_help(explore.main, '--dataset-download', capsys)
    assert 'torch/cifar10' in text and 'torch/cifar100' in text and 'torch/<name>' in text, text
    assert 'CIFAR-10' not in text, text


@pytest.mark.parametrize('command', ['train', 'validate'])
def test_device_modules_are_imported_before_the_device_is_resolved(command, monkeypatch, tmp_path, capsys):
    """A --device-modules package may add the device type that --device names (a torch backend such as torch_npu),
    so it is imported first, as timm's train.py does; here one that records its import, then an unknown device."""
    import sys
    (tmp_path / 'records_its_import.py').write_text('import os\nos.environ["SA_VISION_TEST_IMPORTED"] = "1"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'records_its_import', raising=False)
    monkeypatch.delenv('SA_VISION_TEST_IMPORTED', raising=False)
    main, argv = {
        'train': (_train_main(), ['-c', 'sa_quadratic_cifar_digits', '--output', tmp_path / 'out']),
        'validate': (validate.main, ['--checkpoint', KEPT_SA]),
    }[command]
    line = _one_error(main, [*argv, '--device-modules', 'records_its_import', '--device', 'not_a_device'], capsys)
    assert "--device 'not_a_device' is not a device torch knows" in line, line
    import os
    assert os.environ.get('SA_VISION_TEST_IMPORTED') == '1'
    monkeypatch.delitem(sys.modules, 'records_its_import', raising=False)


def test_benchmark_model_kwargs_typo_is_one_error_line(capsys):
    line = _one_error(benchmark_script.main, ['--model', 'sa_quadratic_cifar', '--model-kwargs', 'embed_dimm=16',
                                              '--bench', 'inference', '--device', 'cpu'], capsys)
    assert "sa_quadratic_cifar takes no keyword argument 'embed_dimm'" in line and "did you mean 'embed_dim'" in line


def test_weights_of_an_unregistered_architecture_name_it(tmp_path):
    """A local-dir: folder whose config.json names an architecture nothing imported registers: the error names that
    architecture (timm's own message does), not the folder as if it were a mistyped model name."""
    import json

    from sa_vision.models.factory import UnknownModelError, create_named_model
    (tmp_path / 'config.json').write_text(json.dumps({'architecture': 'foo_net', 'num_classes': 10}))
    with pytest.raises(UnknownModelError, match="holds a 'foo_net' model, which no imported package registers"):
        create_named_model(f'local-dir:{tmp_path}', pretrained=True)
    with pytest.raises(UnknownModelError, match="unknown model 'sa_quadratc_cifar': did you mean 'sa_quadratic_cifar'"):
        create_named_model('sa_quadratc_cifar')


@pytest.mark.parametrize('kwargs, message', [
    (['embed_dim=abc'], "embed_dim='abc' (from --model-kwargs) is text, but embed_dim takes a whole number (default "),
    (['proj_drop_rate=high'], "proj_drop_rate='high' (from --model-kwargs) is text, but proj_drop_rate takes a number"),
])
def test_a_model_keyword_given_text_where_it_takes_a_number_is_one_error_line(kwargs, message, capsys):
    """timm's --model-kwargs parsing keeps what is no Python literal as text; the model would fail deep inside."""
    line = _one_error(validate.main, ['--model', 'sa_quadratic_cifar', '--dataset', 'digits', '--model-kwargs',
                                      *kwargs], capsys)
    assert message in line, line


@pytest.mark.parametrize('where', ['file', 'under-file', 'proc'])
@pytest.mark.parametrize('command', ['push_to_hub', 'train'])
def test_an_output_folder_that_cannot_be_written_is_one_error_line(command, where, tmp_path, capsys):
    """--out-dir of sa-vision-push-to-hub and --output of sa-vision-train: an existing file, a folder under one,
    or a folder the file system refuses (/proc takes no new entries); where os.mkdir fails, one error line names
    the path, and nothing is written."""
    import os

    import timm
    import torch
    blocker = tmp_path / 'afile'
    blocker.write_text('not a folder')
    folder = {'file': blocker, 'under-file': blocker / 'sub', 'proc': Path('/proc/sa_vision_nope')}[where]
    try:  # the reference: the operating system refuses the folder
        os.mkdir(folder)
    except OSError:
        pass
    else:
        os.rmdir(folder)
        pytest.skip(f'{folder} can be created on this machine')
    if command == 'push_to_hub':
        torch.save(timm.create_model('sa_quadratic_cifar', embed_dim=16, depth=1, heads_per_layer=2,
                                     mlp_hidden_dim=32).state_dict(), tmp_path / 'w.pth')
        line = _one_error(push_to_hub.main, [tmp_path / 'w.pth', '--dry-run', '--out-dir', folder], capsys)
        assert line.startswith(f'error: --out-dir {folder}: '), line
    else:
        line = _one_error(_train_main(), ['-c', 'sa_quadratic_cifar_digits', '--output', folder], capsys)
        assert line.startswith(f'error: --output {folder}: '), line
    assert ('afile is a file, not a folder' if where != 'proc' else 'nothing can be created in /proc') in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(['afile'] + (['w.pth'] if command != 'train' else []))


@pytest.mark.parametrize('command', ['benchmark', 'validate', 'train'])
def test_a_model_keyword_without_its_value_is_a_usage_error_naming_it(command, capsys):
    """timm's --model-kwargs parsing splits each item at '=' and raises a bare ValueError on one without it."""
    from sa_vision.train.args import build_parser
    parse = {'benchmark': benchmark_script.build_parser().parse_args,
             'validate': lambda argv: validate.main(argv), 'train': build_parser().parse_args}[command]
    with pytest.raises(SystemExit) as exit_:
        parse(['--model-kwargs', 'depth=1', 'embed_dim'])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith("error: argument --model-kwargs: 'embed_dim': key=value expected, e.g. embed_dim=64"), last


def test_benchmark_compare_fused_runs_in_the_triton_interpreter(monkeypatch, capsys):
    """Under TRITON_INTERPRET=1 the kernel runs on the CPU: the up-front refusal of --compare fused lets it through
    (the next check, the unknown model, is what stops this run)."""
    from sa_vision.layers import triton_mixing
    if triton_mixing.triton is None:
        pytest.skip('triton is not installed')
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    line = _one_error(benchmark_script.main, ['-m', 'no_such_model', '--compare', 'fused', '--device', 'cpu'], capsys)
    assert "unknown model 'no_such_model'" in line, line


def test_a_write_the_system_refuses_is_one_error_line(tmp_path, capsys):
    """A full disk, as each writer reports it under a file size limit (safetensors' error, torch.save's, an OSError,
    none of them naming a full disk alike): one line saying what was refused. A missing file or another fault of
    torch's is no refused write, and stays a traceback."""
    import errno
    import os

    import torch
    from helpers import file_size_limit
    from safetensors.torch import save_file

    from sa_vision.errors import write_failure
    big = {'weights': torch.zeros(100_000)}
    writers = {'safetensors': lambda: save_file(big, str(tmp_path / 'w.safetensors')),
               'torch.save': lambda: torch.save(big, tmp_path / 'w.pth'),
               'open': lambda: (tmp_path / 'w.txt').write_bytes(bytes(100_000))}
    for name, write in writers.items():
        with file_size_limit(8192):
            status, err = _run(lambda argv, write=write: write(), [], capsys)
        assert status == 2 and err.startswith('error: ') and len(err.strip().splitlines()) == 1, (name, err)
        assert ('File too large' in err or 'unexpected pos' in err) and 'make room' in err, (name, err)
    assert write_failure(FileNotFoundError(errno.ENOENT, 'No such file or directory', 'x')) is None
    # a read-only place or a permission: no room to make, whichever writer says so (safetensors' words as it says
    # them, its error built here: no read-only file system is at hand)
    from safetensors import SafetensorError
    for refused in (OSError(errno.EROFS, os.strerror(errno.EROFS), 'w.pth'), SafetensorError(
            f'Error while serializing: I/O error: {os.strerror(errno.EROFS)} (os error {errno.EROFS}) at path "w"')):
        assert write_failure(refused).endswith('(write elsewhere)'), refused
    refused = SafetensorError(f'Error while serializing: I/O error: Permission denied (os error {errno.EACCES})')
    assert write_failure(refused).endswith('(mend its permissions, or use another place)')
    assert write_failure(RuntimeError('shape mismatch')) is None
    with pytest.raises(RuntimeError, match='inconsistent tensor size'):
        run_cli(lambda argv: torch.zeros(2) @ torch.zeros(3))

