""" The command-line scripts report a user's mistake as one ``error:`` line on stderr with status 2, no traceback

Each script runs in this process through ``sa_vision.errors.run_cli``, as its ``__main__`` block does; one of them
(sa-vision-prune) also runs as a real subprocess in tests/test_pruning.py. """
from pathlib import Path

import pytest

from sa_vision.cli import benchmark as benchmark_script
from sa_vision.cli import plot_attention, prune, push_to_hub, validate
from sa_vision.cli import reproduce as reproduce_script
from sa_vision.errors import UserError, run_cli

ROOT = Path(__file__).resolve().parent.parent


def _run(main, argv, capsys):
    status = run_cli(main, [str(a) for a in argv])
    err = capsys.readouterr().err
    return status, err


@pytest.mark.parametrize('script, argv, message', [
    (plot_attention, ['no_such_model', '--out', 'x.png'], "'no_such_model' is neither a file"),
    (plot_attention, ['resnet18_cifar', '--out', 'x.png'], 'no PositionalAttention layer'),
    (plot_attention, ['sa_learned_cifar', '--kernel-match'], 'the kernel match needs Gaussian centres'),
    (prune, ['{tmp}/missing.pth', '--out', '{tmp}/x.pth'], 'does not exist'),
    (prune, ['sa_learned_cifar', '--out', '{tmp}/x.pth'], 'name the heads to prune with --heads'),
    (push_to_hub, ['{tmp}/missing.pth', '--dry-run'], 'does not exist'),
    (benchmark_script, ['--model', 'no_such_model', '--bench', 'inference'], "unknown model 'no_such_model'"),
    (benchmark_script, ['--model', 'resnet18_cifar', '--compare', 'paper', '--bench', 'inference'],
     'no paper formulation'),
    # sa-vision-validate resolves --model as every command does (sa_vision.train.checkpoint.load_model)
    (validate, ['--model', 'no_such_model', '--dataset', 'digits'], "'no_such_model' is neither a file"),
    (validate, ['--model', 'local-dir:{tmp}/missing', '--dataset', 'digits'], 'missing is not a folder'),
    (validate, ['--checkpoint', 'sa_quadratic_cifar', '--dataset', 'digits'], 'sa_quadratic_cifar does not exist'),
], ids=['plot-unknown-model', 'plot-not-attention', 'plot-kernel-match-learned', 'prune-missing-file',
        'prune-learned-without-heads',
        'push-missing-file', 'benchmark-unknown-model', 'benchmark-no-paper-variant', 'validate-unknown-model',
        'validate-missing-local-dir', 'validate-name-as-checkpoint'])
def test_user_errors_are_one_line_with_status_2(script, argv, message, tmp_path, capsys):
    status, err = _run(script.main, [a.replace('{tmp}', str(tmp_path)) for a in argv], capsys)
    assert status == 2, err
    assert err.startswith('error: ') and message in err and err.count('\n') == 1, err


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


@pytest.mark.parametrize('script', ['train', 'validate', 'benchmark', 'plot_attention', 'prune', 'push_to_hub',
                                    'reproduce'])
def test_commands_run_main_through_run_cli(script, monkeypatch, capsys):
    """What the tests above call in-process is what the installed command and `python -m sa_vision.cli.<script>` run."""
    import importlib
    module = importlib.import_module(f'sa_vision.cli.{script}')

    def mistaken(argv=None):
        raise UserError('a mistake')
    monkeypatch.setattr(module, 'main', mistaken)
    assert module.cli() == 2 and capsys.readouterr().err == 'error: a mistake\n'
    # pyproject.toml, not importlib.metadata: a checkout's stale sa_vision.egg-info would answer for the install
    tomllib = pytest.importorskip('tomllib')  # Python >= 3.11
    with open(ROOT / 'pyproject.toml', 'rb') as f:
        commands = tomllib.load(f)['project']['scripts']
    assert f'sa_vision.cli.{script}:cli' in commands.values(), f'no installed command runs sa_vision.cli.{script}:cli'
    assert 'sys.exit(cli())' in (ROOT / 'sa_vision' / 'cli' / f'{script}.py').read_text(), script  # python -m
