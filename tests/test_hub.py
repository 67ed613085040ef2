""" Export to a Hub folder, loading through timm (offline Hub cache, hf-hub:, local-dir:), publishing checks """
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip('sklearn')

import sa_vision  # noqa: F401
from sa_vision.hub import (
    CARD_FIGURE_FILENAME, HUB_FOLDER_FILES, CheckpointError, HubPublishError, export_hub_folder,
    load_training_checkpoint, model_from_checkpoint, publish_hub_folder)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'scripts'))
import push_to_hub  # noqa: E402

SMALL = dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32)
REPO_ID = 'sa-vision/sa_quadratic_cifar.cifar10'


def _env():
    return dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))



@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A 1-epoch digits run of a small sa_quadratic_cifar, and its export."""
    out = tmp_path_factory.mktemp('runs')
    cmd = [sys.executable, str(ROOT / 'scripts' / 'train.py'), '-c', str(ROOT / 'scripts/configs/sa_quadratic_cifar_digits.yaml'),
           '--epochs', '1', '--output', str(out), '--experiment', 'run', '--model-kwargs',
           *[f'{k}={v}' for k, v in SMALL.items()]]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ckpt_path = out / 'run' / 'last.pth.tar'
    export_dir = out / 'export'
    export_hub_folder(ckpt_path, export_dir, expected_arch='sa_quadratic_cifar')
    return ckpt_path, export_dir


def _reference_output(ckpt_path):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 32, 32)
    model = model_from_checkpoint(load_training_checkpoint(ckpt_path))
    with torch.no_grad():
        return x, model(x)


def test_export_folder_in_timm_format(trained):
    ckpt_path, export_dir = trained
    config = json.loads((export_dir / 'config.json').read_text())
    assert config['architecture'] == 'sa_quadratic_cifar'
    assert {k: config['model_args'][k] for k in SMALL} == SMALL
    assert config['pretrained_cfg']['mean'] == list(sa_vision.paper.CIFAR10_MEAN)
    readme = (export_dir / 'README.md').read_text()
    meta = yaml.safe_load(readme.split('---\n')[1])
    assert meta['library_name'] == 'timm' and 'image-classification' in meta['tags']
    top1 = load_training_checkpoint(ckpt_path)['metrics']['top1']
    metrics = meta['model-index'][0]['results'][0]['metrics']
    assert metrics[0]['value'] == round(top1, 2)
    assert meta['model-index'][0]['results'][0]['dataset']['type'] == 'digits'
    assert 'datasets' not in meta  # trained on digits: the card must not claim CIFAR-10
    assert 'Training summary' in readme and 'not CIFAR-10' in readme
    assert f'- Parameters: {sum(v.numel() for v in load_training_checkpoint(ckpt_path)["state_dict"].values()):,}' \
        in readme
    recipe = yaml.safe_load((export_dir / 'recipe.yaml').read_text())
    assert recipe['model'] == 'sa_quadratic_cifar' and recipe['dataset'] == 'digits'
    # the card's recipe section shows the arguments used, not the paper's CIFAR-10 recipe of the template
    card_recipe = readme.split('## Training recipe')[1].split('```yaml\n')[1].split('```')[0]
    assert yaml.safe_load(card_recipe) == recipe


def test_pretrained_true_from_offline_hub_cache_matches_trained_model(trained, tmp_path):
    ckpt_path, export_dir = trained
    cache = tmp_path / 'hub'
    repo_dir = cache / f'models--{REPO_ID.replace("/", "--")}'
    revision = '0123456789abcdef0123456789abcdef01234567'
    shutil.copytree(export_dir, repo_dir / 'snapshots' / revision)
    (repo_dir / 'refs').mkdir()
    (repo_dir / 'refs' / 'main').write_text(revision)
    x, expected = _reference_output(ckpt_path)
    torch.save(x, tmp_path / 'x.pt')
    script = textwrap.dedent(f"""
        import torch, timm, sa_vision
        x = torch.load({str(tmp_path / 'x.pt')!r}, weights_only=True)
        out = {{}}
        for name, kwargs in [('sa_quadratic_cifar', {SMALL!r}), ('hf-hub:{REPO_ID}', {{}}),
                             ('local-dir:{export_dir}', {{}})]:
            model = timm.create_model(name, pretrained=True, **kwargs).eval()
            with torch.no_grad():
                out[name.split(':')[0]] = model(x)
        try:
            timm.create_model('sa_gen_cifar', pretrained=True)
        except Exception as e:
            out['error'] = type(e).__name__ + ': ' + str(e)
        torch.save(out, {str(tmp_path / 'out.pt')!r})
    """)
    env = dict(_env(), HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE='1')
    proc = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(tmp_path / 'out.pt', weights_only=True)
    for source in ('sa_quadratic_cifar', 'hf-hub', 'local-dir'):
        assert torch.equal(out[source], expected), source
    # weights not in the cache: one clear message naming the repository and what to do
    assert out['error'].startswith('PretrainedWeightsUnavailable')
    assert 'sa-vision/sa_gen_cifar.cifar10' in out['error'] and 'scripts/train.py' in out['error']
    assert 'local-dir:' in out['error']


class _RecordingApi:
    """Stands in for huggingface_hub.HfApi and records every call."""
    calls = []
    role = 'write'

    def __init__(self, *args, **kwargs):
        pass

    def whoami(self):
        self.calls.append('whoami')
        return {'name': 'someone', 'orgs': [{'name': 'sa-vision'}], 'auth': {'accessToken': {'role': self.role}}}

    def create_repo(self, repo_id, **kwargs):
        self.calls.append('create_repo')
        return type('RepoUrl', (), {'repo_id': repo_id})()

    def upload_folder(self, **kwargs):
        self.calls.append(('upload_folder', sorted(os.listdir(kwargs['folder_path']))))
        return 'commit'

    def create_commit(self, *args, **kwargs):
        self.calls.append('create_commit')

    def upload_file(self, *args, **kwargs):
        self.calls.append('upload_file')


@pytest.fixture
def recording_api(monkeypatch):
    import huggingface_hub
    _RecordingApi.calls = []
    _RecordingApi.role = 'write'
    monkeypatch.setattr(huggingface_hub, 'HfApi', _RecordingApi)
    monkeypatch.setenv('HF_TOKEN', 'hf_secret_value_never_printed')
    return _RecordingApi


def test_dry_run_stages_exactly_the_expected_files(trained, tmp_path, recording_api, capsys):
    ckpt_path, _ = trained
    out = tmp_path / 'staged'
    assert push_to_hub.main([str(ckpt_path), '--dry-run', '--out-dir', str(out)]) == 0
    # config.json, model.safetensors, README.md, the recipe, and the card's attention figure
    expected = set(HUB_FOLDER_FILES) | {CARD_FIGURE_FILENAME}
    assert {p.name for p in out.iterdir()} == expected
    printed = capsys.readouterr().out
    assert all(name in printed for name in expected) and 'nothing uploaded' in printed
    assert recording_api.calls == []


def test_publish_without_token_fails_before_any_upload(trained, tmp_path, recording_api, monkeypatch, capsys):
    import huggingface_hub
    ckpt_path, export_dir = trained
    monkeypatch.delenv('HF_TOKEN')
    monkeypatch.setattr(huggingface_hub, 'get_token', lambda: None)
    assert push_to_hub.main([str(ckpt_path), '--out-dir', str(tmp_path / 'staged')]) == 2
    assert 'no Hugging Face token' in capsys.readouterr().err
    with pytest.raises(HubPublishError, match='HF_TOKEN'):
        publish_hub_folder(export_dir, REPO_ID)
    assert recording_api.calls == []


def test_publish_with_read_token_fails_before_any_upload(trained, recording_api, capsys):
    _, export_dir = trained
    recording_api.role = 'read'
    with pytest.raises(HubPublishError, match='cannot write') as e:
        publish_hub_folder(export_dir, REPO_ID)
    assert 'hf_secret_value_never_printed' not in str(e.value)
    assert recording_api.calls == ['whoami']


def test_publish_uploads_the_folder_in_one_commit(trained, tmp_path, recording_api, capsys):
    ckpt_path, _ = trained
    assert push_to_hub.main([str(ckpt_path), '--out-dir', str(tmp_path / 'staged'), '--no-figure']) == 0
    uploads = [c for c in recording_api.calls if c not in ('whoami', 'create_repo')]
    assert uploads == [('upload_folder', sorted(HUB_FOLDER_FILES))]
    assert 'hf_secret_value_never_printed' not in capsys.readouterr().out


def test_corrupted_checkpoint_gives_a_clear_error(trained, tmp_path, recording_api, capsys):
    ckpt_path, _ = trained
    truncated = tmp_path / 'truncated.pth.tar'
    truncated.write_bytes(ckpt_path.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match='corrupted'):
        load_training_checkpoint(truncated)
    assert push_to_hub.main([str(truncated), '--out-dir', str(tmp_path / 'staged')]) == 2
    assert 'corrupted' in capsys.readouterr().err

    import argparse  # any pickled class instance: weights_only refuses to unpickle it
    unsafe = tmp_path / 'unsafe.pth.tar'
    torch.save({'arch': 'sa_quadratic_cifar', 'model_args': {}, 'state_dict': argparse.Namespace()}, unsafe)
    with pytest.raises(CheckpointError, match='cannot be read'):
        load_training_checkpoint(unsafe)
    assert recording_api.calls == []


def test_wrong_architecture_gives_a_clear_error(trained, tmp_path, recording_api, capsys):
    ckpt_path, _ = trained
    assert push_to_hub.main([str(ckpt_path), '--model', 'resnet18_cifar', '--out-dir', str(tmp_path / 'a')]) == 2
    assert 'holds a sa_quadratic_cifar model, not resnet18_cifar' in capsys.readouterr().err
    assert push_to_hub.main([str(ckpt_path), '--repo-id', 'sa-vision/sa_gen_cifar.cifar10',
                             '--out-dir', str(tmp_path / 'b')]) == 2
    assert 'is for sa_gen_cifar' in capsys.readouterr().err
    # weights of one architecture labelled as another
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt['arch'] = 'resnet18_cifar'
    ckpt['model_args'] = {}
    relabelled = tmp_path / 'relabelled.pth.tar'
    torch.save(ckpt, relabelled)
    with pytest.raises(CheckpointError, match='do not fit resnet18_cifar'):
        export_hub_folder(relabelled, tmp_path / 'c')
    assert recording_api.calls == []
