""" ``pretrained=True`` without a network: a clear error naming the repository after one request to the Hub bounded by
``HUB_PROBE_TIMEOUT`` (not huggingface_hub's minute of retries), without any request with HF_HUB_OFFLINE=1, and
weights in the local Hub cache still load, with or without HF_HUB_OFFLINE. Every case runs in a subprocess whose
HF_ENDPOINT is a local port that refuses connections or accepts them and never answers, so the tests do not depend on
this machine's route to huggingface.co.

"Fast" is asserted as work, not seconds (seconds depend on how busy the machine is): the subprocess counts every
connection attempt (socket.socket.connect) with its target and its socket's timeout, and every probe with its
timeout. huggingface_hub's own download asks with a timeout of 10 s and retries with 60 s: a connection with a
longer timeout than the probe's, or more than one per model, means a download (and its retries) was attempted. """
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT_S
from safetensors.torch import save_file

from sa_vision.models._pretrained import HUB_PROBE_TIMEOUT

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32)
REPOS = {'sa_quadratic_cifar': 'sa-vision/sa_quadratic_cifar.cifar10',
         'resnet18_cifar': 'sa-vision/resnet18_cifar.cifar10'}
# runs create_model(pretrained=True) for each name in argv and prints, per name, the error (None when it loaded), and
# for the whole run the work done on the network: every Hub probe (its url and timeout) and every connection attempt
# (its target and the timeout of its socket)
SCRIPT = textwrap.dedent("""
    import json, os, socket, sys
    import torch, timm, sa_vision
    from huggingface_hub import constants
    env_before, offline_before, etag_before = dict(os.environ), constants.HF_HUB_OFFLINE, constants.HF_HUB_ETAG_TIMEOUT
    small = json.loads(os.environ['SMALL'])
    result = {}
    # every connection any client opens goes through socket.socket.connect (socket.create_connection included)
    connections = []
    def counted(connect):
        def wrapper(self, address, *args, **kwargs):
            connections.append(dict(target=list(address) if isinstance(address, tuple) else address,
                                    timeout=self.gettimeout()))
            return connect(self, address, *args, **kwargs)
        return wrapper
    socket.socket.connect = counted(socket.socket.connect)
    socket.socket.connect_ex = counted(socket.socket.connect_ex)
    # every time the factories ask the Hub whether it answers (the probe before an uncached download)
    from sa_vision.models import _pretrained
    import inspect
    probe, probes = _pretrained._probe_hub, []
    def counted_probe(*args, **kwargs):
        probes.append(dict(inspect.signature(probe).bind(*args, **kwargs).arguments))
        return probe(*args, **kwargs)
    _pretrained._probe_hub = counted_probe
    for name in sys.argv[1:]:
        kwargs = {} if name.startswith('resnet') else dict(small)
        if os.environ.get('OVERLAY_FILE'):
            kwargs['pretrained_cfg_overlay'] = dict(file=os.environ['OVERLAY_FILE'])
        elif os.environ.get('PUBLISHED'):  # as the registered cfg will read once the weights are published
            kwargs['pretrained_cfg_overlay'] = dict(hf_hub_id=json.loads(os.environ['PUBLISHED'])[name])
        try:
            model = timm.create_model(name, pretrained=True, **kwargs)
            error = None
            torch.save(model.state_dict(), os.path.join(os.environ['OUT'], name + '.pt'))
        except Exception as e:
            error = type(e).__name__ + ': ' + str(e)
        result[name] = dict(error=error)
    # the user's other downloads keep huggingface_hub's settings
    result['global_state_kept'] = (dict(os.environ) == env_before and constants.HF_HUB_OFFLINE == offline_before
                                   and constants.HF_HUB_ETAG_TIMEOUT == etag_before)
    result['hub_probes'] = probes
    result['connections'] = list(connections)
    print('RESULT ' + json.dumps(result))
""")


@pytest.fixture
def refusing_endpoint():
    """A local port bound but not listening: connections are refused at once."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        yield f'http://127.0.0.1:{s.getsockname()[1]}'


@pytest.fixture
def silent_endpoint():
    """A local port that accepts connections (into its backlog) and never answers: requests time out."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        s.listen(16)
        yield f'http://127.0.0.1:{s.getsockname()[1]}'


def _run(tmp_path, names, endpoint, cache, published=True, **env):
    """Run SCRIPT; ``published``: the names' weights are on the Hub (their cfg names REPOS), as once uploaded."""
    out = tmp_path / 'out'
    out.mkdir(exist_ok=True)
    full_env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT), HF_ENDPOINT=endpoint,
                    HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / 'hf_home'), SMALL=json.dumps(SMALL),
                    OUT=str(out), **({'PUBLISHED': json.dumps(REPOS)} if published else {}), **env)
    for var in ('HF_HUB_OFFLINE', 'HF_HUB_ETAG_TIMEOUT', 'HF_HUB_DOWNLOAD_TIMEOUT', 'TRANSFORMERS_OFFLINE'):
        if var not in env:
            full_env.pop(var, None)
    proc = subprocess.run([sys.executable, '-c', SCRIPT, *names], cwd=tmp_path, env=full_env, capture_output=True,
                          text=True, timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith('RESULT ')][-1]
    return json.loads(line[len('RESULT '):]), proc.stderr


def _assert_only_bounded_probes(result, endpoint, names):
    """One probe per model, each given HUB_PROBE_TIMEOUT, and every connection attempt made by the probes: none with a
    longer (or no) timeout, as a download and its retries would make, none elsewhere than the endpoint."""
    assert [p['timeout'] for p in result['hub_probes']] == [HUB_PROBE_TIMEOUT] * len(names), result['hub_probes']
    for probe, name in zip(result['hub_probes'], names):
        assert probe['url'].startswith(f'{endpoint}/{REPOS[name]}/'), probe
    connections = result['connections']
    assert connections, 'the probe made no connection attempt'
    port = int(endpoint.rsplit(':', 1)[1])
    for connection in connections:
        assert connection['target'] == ['127.0.0.1', port], connections
        assert connection['timeout'] is not None and connection['timeout'] <= HUB_PROBE_TIMEOUT, connections
    # each probe asks once (plus huggingface_hub's one-time fetch of its agent registry): no retries
    assert len(connections) <= 2 * len(names), connections


def _assert_clear_error(result, name):
    error = result[name]['error']
    assert error is not None and error.startswith('PretrainedWeightsUnavailable'), error
    assert REPOS[name] in error  # names the repository it could not reach
    assert 'local-dir:' in error  # and says what to do instead


def _populate_cache(cache, name, seed=0):
    """The Hub cache layout huggingface_hub writes: refs/main naming a snapshot holding model.safetensors."""
    import timm

    import sa_vision  # noqa: F401
    torch.manual_seed(seed)
    state = timm.create_model(name, **({} if name.startswith('resnet') else SMALL)).state_dict()
    revision = '0123456789abcdef0123456789abcdef01234567'
    repo_dir = cache / f'models--{REPOS[name].replace("/", "--")}'
    (repo_dir / 'snapshots' / revision).mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, repo_dir / 'snapshots' / revision / 'model.safetensors')
    (repo_dir / 'refs').mkdir()
    (repo_dir / 'refs' / 'main').write_text(revision)
    return state


def _assert_loaded(tmp_path, name, state):
    loaded = torch.load(tmp_path / 'out' / f'{name}.pt', weights_only=True)
    assert loaded.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(loaded[key], value), key


def test_unreachable_hub_fails_fast_with_the_repository_named(tmp_path, refusing_endpoint):
    result, stderr = _run(tmp_path, list(REPOS), refusing_endpoint, tmp_path / 'empty_cache')
    _assert_only_bounded_probes(result, refusing_endpoint, list(REPOS))
    for name in REPOS:
        _assert_clear_error(result, name)
        assert 'could not be reached' in result[name]['error']
    assert 'Retrying' not in stderr and 'Retry ' not in stderr, stderr[-2000:]
    assert result['global_state_kept']


def test_unpublished_weights_say_so_and_where_kept_ones_are(tmp_path, silent_endpoint):
    """Registered names whose weights are not on the Hub: not listed by timm, and pretrained=True names the kept zoo
    (which must exist) instead of asking the Hub or loading random weights."""
    import timm
    assert timm.list_pretrained('sa_*') == [] and timm.list_pretrained('resnet18_cifar*') == []
    result, _ = _run(tmp_path, list(REPOS), silent_endpoint, tmp_path / 'empty_cache', published=False)
    assert result['hub_probes'] == [] and result['connections'] == [], result
    for name, repo in REPOS.items():
        error = result[name]['error']
        assert error and error.startswith('PretrainedWeightsUnavailable') and 'not published' in error, error
        assert repo in error and 'network' not in error, error
        kept = f'local-dir:zoo/fashion-mnist-cpu/{name}'
        assert kept in error and (ROOT / kept[len('local-dir:'):] / 'model.safetensors').is_file(), error


def test_silent_hub_fails_within_the_bound(tmp_path, silent_endpoint):
    result, stderr = _run(tmp_path, ['sa_quadratic_cifar'], silent_endpoint, tmp_path / 'empty_cache')
    # the wait is bounded by the probe's timeout: the probe got HUB_PROBE_TIMEOUT, its connections' sockets time
    # out after at most that, and no download waited on the silent Hub after it
    _assert_only_bounded_probes(result, silent_endpoint, ['sa_quadratic_cifar'])
    _assert_clear_error(result, 'sa_quadratic_cifar')
    assert 'Retrying' not in stderr, stderr[-2000:]


def test_hf_hub_offline_fails_at_once(tmp_path, silent_endpoint):
    result, _ = _run(tmp_path, list(REPOS), silent_endpoint, tmp_path / 'empty_cache', HF_HUB_OFFLINE='1')
    for name in REPOS:
        _assert_clear_error(result, name)
    # no request at all: neither a probe nor any other connection attempt
    assert result['hub_probes'] == [] and result['connections'] == [], result


@pytest.mark.parametrize('offline', [False, True], ids=['network-down', 'HF_HUB_OFFLINE'])
def test_cached_weights_load_without_network(tmp_path, refusing_endpoint, offline):
    cache = tmp_path / 'hub'
    states = {name: _populate_cache(cache, name, seed) for seed, name in enumerate(REPOS)}
    offline_env = {'HF_HUB_OFFLINE': '1'} if offline else {}
    result, stderr = _run(tmp_path, list(REPOS), refusing_endpoint, cache, **offline_env)
    for name in REPOS:
        assert result[name]['error'] is None, result[name]['error']
        _assert_loaded(tmp_path, name, states[name])
    assert 'Retrying' not in stderr, stderr[-2000:]
    # cached weights need no answer from the Hub: it is not even asked (a refused probe costs nothing, but a
    # silent Hub would cost the probe's timeout before every cached load)
    assert result['hub_probes'] == [], result
    if offline:
        assert result['connections'] == [], result  # and with HF_HUB_OFFLINE no request at all


def test_local_weights_file_never_asks_the_hub(tmp_path, silent_endpoint):
    """pretrained_cfg_overlay=dict(file=...) loads from disk: no check of the (silent) Hub delays it."""
    state = _populate_cache(tmp_path / 'hub', 'sa_quadratic_cifar')
    weights = next((tmp_path / 'hub').rglob('model.safetensors'))
    result, _ = _run(tmp_path, ['sa_quadratic_cifar'], silent_endpoint, tmp_path / 'empty_cache',
                     OVERLAY_FILE=str(weights))
    assert result['sa_quadratic_cifar']['error'] is None, result
    assert result['hub_probes'] == [] and result['connections'] == [], result  # not a single request
    _assert_loaded(tmp_path, 'sa_quadratic_cifar', state)


class _Reached(Exception):
    pass


@pytest.mark.parametrize('arch', ['sa_gen_pruned', 'sa_quadratic_cifar'])
def test_unpublished_weights_advice_is_commands_that_fit_together(arch, monkeypatch):
    """pretrained=True's advice for weights not yet published: commands each accepted by its command, whose outputs
    are the next one's inputs, ending in the Hub folder it names. The pruned model is a trained sa_gen_cifar,
    pruned, then fine-tuned from the pruned weights (paper App. A.1), never its recipe from a random start."""
    import shlex

    import timm

    from sa_vision.cli import prune
    from sa_vision.models._pretrained import PretrainedWeightsUnavailable
    from sa_vision.train.state import parse_run_args
    with pytest.raises(PretrainedWeightsUnavailable) as raised:
        timm.create_model(arch, pretrained=True)
    error = str(raised.value)
    commands = [shlex.split(c) for c in error.split('`')[1::2]]
    *steps, final = commands
    expected = [['sa-vision-train', 'sa-vision-prune', 'sa-vision-train'], ['sa-vision-train']][arch != 'sa_gen_pruned']
    assert [c[0] for c in commands] == expected, error
    if steps:  # the source model of the paper's Table 1 row, trained from scratch, then pruned
        source, _, _ = parse_run_args(steps[0][1:])
        assert source.model == 'sa_gen_cifar' and not source.initial_checkpoint
        pruned_from = steps[1][1]
        assert Path(pruned_from) == Path(source.output) / source.experiment / 'last.pth.tar'
        monkeypatch.setattr(prune, 'read_checkpoint', lambda path, **kwargs: (_ for _ in ()).throw(_Reached(path)))
        with pytest.raises(_Reached, match=pruned_from):  # its parser accepts the command line
            prune.main(steps[1][1:])
    args, _, _ = parse_run_args(final[1:])
    assert args.model == arch and args.export and args.dataset == 'torch/cifar10'
    if steps:
        assert args.initial_checkpoint == steps[1][steps[1].index('--out') + 1]
    else:
        assert not args.initial_checkpoint
    assert f"local-dir:{Path(args.output) / args.experiment / 'hub'}'" in error
