""" A model name read from the Hugging Face Hub (``hf-hub:<repo>``, or a timm name with ``--pretrained``) whose
repository cannot be read (no network, HF_HUB_OFFLINE and not cached, no such or a gated repository): one ``error:``
line naming the repository and what to do, in every command that resolves a ``--model`` name, not the Hub client's
traceback.

In this process the Hub client's download, as timm calls it, raises each of those errors at once (without
HF_HUB_OFFLINE, huggingface_hub raises LocalEntryNotFoundError only after its retries, half a minute here); one
installed command runs for real with HF_HUB_OFFLINE=1 and an empty cache. """
import os
import subprocess
from pathlib import Path
from unittest import mock

import pytest
from helpers import HANG_TIMEOUT_S, command
from huggingface_hub import errors as hub_errors

from sa_vision.cli import explore, train, validate
from sa_vision.errors import run_cli

ROOT = Path(__file__).resolve().parent.parent
REPO = 'sa-vision/sa_quadratic_cifar.cifar10'
NAME = f'hf-hub:{REPO}'


def _hub_error(name: str) -> Exception:
    """The installed huggingface_hub's error ``name`` (its HTTP errors want a response; a bare one does)."""
    cls = getattr(hub_errors, name, None)
    if cls is None:
        pytest.skip(f'the installed huggingface_hub has no {name}')
    try:
        return cls(f'{name} for {REPO}')
    except TypeError:
        return cls(f'{name} for {REPO}', response=mock.Mock(headers={}))


@pytest.fixture
def hub_fails(monkeypatch):
    """Make timm's downloads from the Hub raise ``error``; the repositories asked for are recorded."""
    import timm.models._hub as timm_hub

    from sa_vision.models import _pretrained
    # the Hub answers its probe, then the download fails
    monkeypatch.setattr(_pretrained, '_probe_hub', lambda url, timeout: None)
    asked = []

    def fail_with(error):
        def download(*args, **kwargs):
            asked.append(args[0] if args else kwargs['repo_id'])
            raise error
        monkeypatch.setattr(timm_hub, 'hf_hub_download', download)
        return asked
    return fail_with


def _one_error_line(script, argv, capsys) -> str:
    assert run_cli(script.main, [str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith('error: ')]
    assert len(errors) == 1 and 'Traceback' not in err, err
    return errors[0]


@pytest.mark.parametrize('error, meaning', [
    ('LocalEntryNotFoundError', 'the Hub could not be reached, or HF_HUB_OFFLINE is set'),
    ('OfflineModeIsEnabled', 'HF_HUB_OFFLINE is set'),
    ('RepositoryNotFoundError', 'no such repository, or a private one'),
    ('GatedRepoError', 'a gated repository'),
    ('RevisionNotFoundError', 'no such revision'),
    ('EntryNotFoundError', 'the repository lacks a file'),
    ('HfHubHTTPError', 'the Hub answered with an error'),
    ('HTTPError', 'no answer from the Hub'),  # the HTTP client's: a refused connection, a timeout
])
def test_each_hub_error_is_one_line_naming_the_repository(error, meaning, hub_fails, capsys):
    asked = hub_fails(_hub_error(error))
    line = _one_error_line(validate, ['--model', NAME, '--dataset', 'digits'], capsys)
    assert asked == [REPO]
    assert line.startswith(f"error: {NAME}: the Hugging Face Hub repository '{REPO}' could not be read "
                           f'({error}: {meaning}'), line
    assert 'HF_HUB_OFFLINE' in line and 'HF_HUB_CACHE' in line and 'local-dir:<folder>' in line, line


@pytest.mark.parametrize('script, argv', [
    # timm's weights of a timm name (an hf-hub: name is refused by sa-vision-train before: it trains from a folder)
    (train, ['--model', 'resnet18', '--pretrained', '--dataset', 'digits', '--output', '{tmp}/out']),
    (explore, [NAME, '--out', '{tmp}/page.html']),
    (validate, ['--model', 'resnet18', '--pretrained', '--dataset', 'digits']),  # timm's weights of a timm name
], ids=['train', 'explore', 'validate-pretrained-timm-name'])
def test_every_command_resolving_a_model_name_says_so(script, argv, hub_fails, tmp_path, capsys):
    asked = hub_fails(_hub_error('LocalEntryNotFoundError'))
    line = _one_error_line(script, [a.replace('{tmp}', str(tmp_path)) for a in argv], capsys)
    assert asked and f"repository '{asked[0]}' could not be read (LocalEntryNotFoundError" in line, line
    assert not (tmp_path / 'out').exists()


def test_an_unreachable_hub_fails_at_once_without_waiting_for_retries(hub_fails, monkeypatch, capsys):
    """Without HF_HUB_OFFLINE and with nothing cached, huggingface_hub retries for about a minute before its
    LocalEntryNotFoundError: one bounded request that gets no answer ends it first, and nothing is downloaded."""
    from huggingface_hub import constants

    from sa_vision.models import _pretrained
    asked = hub_fails(_hub_error('LocalEntryNotFoundError'))
    probed = []
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', False)
    monkeypatch.setattr(_pretrained, '_probe_hub', lambda url, timeout: probed.append(url) or 'ConnectError: no route')
    line = _one_error_line(validate, ['--model', NAME, '--dataset', 'digits'], capsys)
    assert asked == [] and len(probed) == 1 and probed[0].endswith(f'{REPO}/resolve/main/config.json'), probed
    assert line.startswith(f"error: {NAME}: the Hugging Face Hub repository '{REPO}' could not be read (the Hub at "
                           f'{constants.ENDPOINT} could not be reached (ConnectError: no route) and its config.json '
                           f'is not in the local Hub cache'), line


def test_other_errors_of_the_hub_client_keep_their_traceback(hub_fails):
    hub_fails(KeyError('a bug, not an unreadable repository'))
    with pytest.raises(KeyError, match='a bug'):
        run_cli(validate.main, ['--model', NAME, '--dataset', 'digits'])


@pytest.mark.slow
def test_validate_offline_with_an_empty_cache(tmp_path):
    """The command as a user runs it: HF_HUB_OFFLINE=1, nothing cached; no network is asked."""
    env = dict(os.environ, HF_HUB_OFFLINE='1', HF_HOME=str(tmp_path / 'hf'), HF_HUB_CACHE=str(tmp_path / 'hub'),
               OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))
    proc = subprocess.run([*command('validate'), '--model', NAME, '--dataset', 'digits'], env=env,
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 2, proc.stderr
    assert 'Traceback' not in proc.stderr and proc.stderr.count('error: ') == 1, proc.stderr
    assert f"error: {NAME}: the Hugging Face Hub repository '{REPO}' could not be read" in proc.stderr


@pytest.mark.parametrize('raised, reported', [(OSError('no route to host'), 'OSError: no route to host'),
                                              (TypeError("unexpected keyword argument 'timeout'"), None)])
def test_the_hub_probe_reports_no_answer_and_passes_on_a_changed_api(monkeypatch, raised, reported):
    """No answer from the Hub is a reason to tell the user; a TypeError (a huggingface_hub whose API changed) is a
    bug, passed on as it is rather than told as an unreachable Hub."""
    import huggingface_hub

    from sa_vision.models import _pretrained

    def metadata(url, timeout):
        raise raised
    monkeypatch.setattr(huggingface_hub, 'get_hf_file_metadata', metadata)
    if reported:
        assert _pretrained._probe_hub('https://huggingface.co/x/resolve/main/config.json', 1.) == reported
    else:
        with pytest.raises(TypeError):
            _pretrained._probe_hub('https://huggingface.co/x/resolve/main/config.json', 1.)
