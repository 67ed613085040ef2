""" Export to a Hub folder, loading through timm (offline Hub cache, hf-hub:, local-dir:), honest labels,
recipes that repeat the run, publishing checks, and checkpoints of timm's own train.py """
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from helpers import HANG_TIMEOUT_S, keeping_threads

pytest.importorskip('sklearn')

import sa_vision  # noqa: F401
from sa_vision.cli import push_to_hub
from sa_vision.errors import run_cli
from sa_vision.hub import (
    HubPublishError,
    card_to_upload,
    check_publish_target,
    export_hub_folder,
    publish_hub_folder,
    weights_label,
)
from sa_vision.train.checkpoint import RUNTIME_ARGS, Checkpoint, CheckpointError, read_checkpoint
from sa_vision.train.recipes import RECIPE_DIR

ROOT = Path(__file__).resolve().parent.parent

SMALL = dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32)
NUM_CLASSES = 12  # not the registered 10: the whole construction must travel with the weights
REGISTERED_REPO = 'sa-vision/sa_quadratic_cifar.cifar10'
DIGITS_REPO = 'sa-vision/sa_quadratic_cifar.digits_custom'  # digits, a custom (small) configuration


def _env():
    return dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))



def _train(out, *args):
    """sa-vision-train ``args`` into ``out`` in this process, on one thread as the tests' training processes run,
    so that its runs repeat bitwise; it must succeed."""
    from sa_vision.cli import train
    with keeping_threads():
        assert run_cli(train.main, [*map(str, args), '--output', str(out), '--threads', '1']) == 0


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A 1-epoch digits run of a small 12-class sa_quadratic_cifar exported by train.py --export."""
    out = tmp_path_factory.mktemp('runs')
    _train(out, '-c', RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml', '--epochs', 1, '--experiment', 'run',
           '--num-classes', NUM_CLASSES, '--export', '--model-kwargs', *[f'{k}={v}' for k, v in SMALL.items()])
    return out / 'run' / 'last.pth.tar', out / 'run' / 'hub'


def _reference_output(ckpt_path):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 32, 32)
    model = read_checkpoint(ckpt_path).create_model()
    with torch.no_grad():
        return x, model(x)


def test_export_folder_in_timm_format(trained):
    ckpt_path, export_dir = trained
    ckpt = torch.load(ckpt_path, weights_only=True)
    config = json.loads((export_dir / 'config.json').read_text())
    assert config['architecture'] == 'sa_quadratic_cifar'
    assert {k: config['model_args'][k] for k in SMALL} == SMALL
    assert config['num_classes'] == config['model_args']['num_classes'] == NUM_CLASSES
    assert config['pretrained_cfg']['mean'] == list(sa_vision.paper.CIFAR10_MEAN)
    readme = (export_dir / 'README.md').read_text()
    meta = yaml.safe_load(readme.split('---\n')[1])
    assert meta['library_name'] == 'timm' and 'image-classification' in meta['tags']
    metrics = meta['model-index'][0]['results'][0]['metrics']
    assert metrics[0]['value'] == round(ckpt['metrics']['top1'], 2)
    assert 'Training summary' in readme and 'not CIFAR-10' in readme
    assert f'- Parameters: {sum(v.numel() for v in ckpt["state_dict"].values()):,}' in readme
    # the card's recipe section shows the arguments used, not the paper's CIFAR-10 recipe of the template
    recipe = yaml.safe_load((export_dir / 'recipe.yaml').read_text())
    card_recipe = readme.split('## Training recipe')[1].split('```yaml\n')[1].split('```')[0]
    assert yaml.safe_load(card_recipe) == recipe


def test_digits_export_is_labelled_digits_and_custom_everywhere(trained):
    _, export_dir = trained
    config_text = (export_dir / 'config.json').read_text()
    assert json.loads(config_text)['pretrained_cfg']['tag'] == 'digits_custom' and 'cifar10' not in config_text
    readme = (export_dir / 'README.md').read_text()
    meta = yaml.safe_load(readme.split('---\n')[1])
    assert 'datasets' not in meta and 'cifar10' not in yaml.safe_dump(meta)
    result = meta['model-index'][0]
    assert result['name'] == 'sa_quadratic_cifar.digits_custom' and result['results'][0]['dataset']['type'] == 'digits'
    assert '# sa_quadratic_cifar.digits_custom\n' in readme and 'sa_quadratic_cifar.cifar10' not in readme
    # a 1-layer, 2-head model is described as what it is, not as the paper's 9 heads x 6 layers
    assert '9 heads x 6 layers' not in readme and '1 layer(s) with 2 heads' in readme
    assert f"hf-hub:{DIGITS_REPO}" in readme


def test_published_recipe_holds_training_arguments_only(trained):
    ckpt_path, export_dir = trained
    text = (export_dir / 'recipe.yaml').read_text()
    recipe = yaml.safe_load(text)
    assert not set(recipe) & RUNTIME_ARGS, set(recipe) & RUNTIME_ARGS
    # switches of this machine, named here apart from RUNTIME_ARGS so that dropping one from it is seen
    assert not {'cudnn_benchmark', 'pin_mem', 'channels_last', 'device', 'workers'} & set(recipe)
    assert str(ckpt_path.parent.parent) not in text and '/tmp' not in text and str(ROOT) not in text
    assert recipe['model'] == 'sa_quadratic_cifar' and recipe['dataset'] == 'digits'
    assert recipe['num_classes'] == NUM_CLASSES and recipe['model_kwargs']['proj_drop_rate'] == 0.0
    # the digits read no --data-dir (they refuse one): the command that repeats the run names none
    assert text.splitlines()[0].endswith(': sa-vision-train -c recipe.yaml repeats the run'), text.splitlines()[0]


@pytest.mark.slow
def test_recipe_of_an_export_repeats_the_run(trained, tmp_path):
    ckpt_path, export_dir = trained
    # --workers is this machine's choice, no part of the recipe: 0 as the run had, not timm's 4 forked from here
    _train(tmp_path, '-c', export_dir / 'recipe.yaml', '--experiment', 'again', '--workers', 0)
    original, repeated = torch.load(ckpt_path, weights_only=True), torch.load(
        tmp_path / 'again' / 'last.pth.tar', weights_only=True)
    assert repeated['model_args'] == original['model_args']
    for key, value in original['state_dict'].items():
        assert torch.equal(repeated['state_dict'][key], value), key


def test_export_reloads_with_its_classes(trained):
    import timm
    ckpt_path, export_dir = trained
    model = timm.create_model(f'local-dir:{export_dir}', pretrained=True).eval()
    assert model.num_classes == NUM_CLASSES
    x, expected = _reference_output(ckpt_path)
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def test_fashion_mnist_export_takes_timms_transform_of_the_28x28_images(trained, tmp_path):
    """Weights trained on Fashion-MNIST zero-padded 28 -> 32 are exported with the border inside the model: timm's
    resolve_data_config + create_transform on the 28x28 PIL image feed the exported model what the training
    pipeline (the padded 32x32 tensor) fed the trained one."""
    import timm
    from PIL import Image

    from sa_vision.train.data import create_cifar_transform, dataset_info
    from sa_vision.train.datasets import FashionMnistDataset
    info = dataset_info('fashion-mnist')
    ckpt = torch.load(trained[0], weights_only=True)  # the digits weights, relabelled as trained on Fashion-MNIST
    ckpt['dataset'] = ckpt['args']['dataset'] = 'fashion-mnist'
    ckpt['data_config'] = {'mean': list(info.mean), 'std': list(info.std), 'input_size': [3, 32, 32]}
    torch.save(ckpt, tmp_path / 'fmnist.pth.tar')
    export_hub_folder(tmp_path / 'fmnist.pth.tar', tmp_path / 'hub', figure=False)
    config = json.loads((tmp_path / 'hub' / 'config.json').read_text())
    assert config['model_args']['input_padding'] == 2
    assert config['pretrained_cfg']['input_size'] == [3, 28, 28] and config['pretrained_cfg']['crop_pct'] == 1.0
    assert 'label_names' not in config  # 12 classes are not Fashion-MNIST's 10: no names are claimed for them

    raw = FashionMnistDataset('test', img_size=28)  # uint8, unpadded
    pil = [Image.fromarray(raw.images[i, 0].numpy()).convert('RGB') for i in range(8)]
    exported = timm.create_model(f'local-dir:{tmp_path / "hub"}', pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=exported))
    padded = FashionMnistDataset('test', transform=create_cifar_transform(
        False, mean=info.mean, std=info.std, tensor_input=True))  # the training pipeline: black border, 32x32
    trained_model = read_checkpoint(trained[0]).create_model()
    with torch.no_grad():
        out = exported(torch.stack([transform(img) for img in pil]))
        reference = trained_model(torch.stack([padded[i][0] for i in range(8)]))
    assert torch.equal(out, reference)
    # the card's architecture arguments are all of them: the model built from them with the weights file is the
    # exported one, border included
    card = (tmp_path / 'hub' / 'README.md').read_text()
    card_args = ast.literal_eval(re.search(r'Architecture arguments of these weights: `(\{.*\})`', card).group(1))
    rebuilt = timm.create_model(ckpt['arch'], checkpoint_path=str(tmp_path / 'hub' / 'model.safetensors'),
                                **card_args).eval()
    with torch.no_grad():
        assert torch.equal(rebuilt(torch.stack([transform(img) for img in pil])), out)


def test_only_cifar10_weights_of_the_paper_architecture_may_take_the_registered_repository():
    def label(dataset, **model_args):
        return weights_label(Checkpoint('sa_quadratic_cifar', model_args, {}, 'x', 'sa_vision', {'dataset': dataset}))
    reference = label('torch/cifar10')
    assert reference.is_reference and reference.default_repo_id == REGISTERED_REPO
    check_publish_target(reference, REGISTERED_REPO)
    assert label('torch/cifar10', drop_path_rate=0.1).is_reference  # regularisation does not change the weights' shape
    for other in (label('torch/cifar10', embed_dim=16), label('torch/cifar10', num_classes=12), label('digits'),
                  label('fashion-mnist')):
        assert not other.is_reference and other.default_repo_id != REGISTERED_REPO
        with pytest.raises(HubPublishError, match='refusing'):
            check_publish_target(other, REGISTERED_REPO)
    assert label('fashion-mnist').tag == 'fashion_mnist'
    assert label('torch/cifar10', embed_dim=16).tag == 'cifar10_custom'


def test_the_docs_list_the_tag_of_every_datasets_exports():
    """docs/hub.md and docs/training.md list the tags an export is labelled with: the tag of each dataset's weights
    (a torch/cifar100 export is tagged cifar100_custom), less _custom, which they explain after the list."""
    from sa_vision.train.data import dataset_info, known_dataset_names
    tags = set()
    for name in known_dataset_names():
        info = dataset_info(name)
        ckpt = Checkpoint('sa_quadratic_cifar', {'num_classes': info.num_classes}, {}, 'x', 'sa_vision',
                          {'dataset': name})
        tags.add(weights_label(ckpt).tag.removesuffix('_custom'))
    assert 'cifar100' in tags, tags
    for page in ('hub.md', 'training.md'):
        text = ' '.join((ROOT / 'docs' / page).read_text(encoding='utf-8').split())
        listed = re.search(r'the tag is the dataset the weights were trained on \(([^)]*)\)', text).group(1)
        assert all(f'`{tag}`' in listed for tag in tags), (page, sorted(tags), listed)


def test_weights_that_name_no_dataset_are_tagged_unknown_not_an_image_folder(tmp_path):
    """A bare .safetensors file says nothing of its data: its export is '<arch>.unknown', and sa-vision-validate of
    that export names no dataset (CIFAR-10 by default), where an image folder's 'folder' tag would ask for one."""
    import timm
    from safetensors.torch import save_file

    from sa_vision.train.checkpoint import read_checkpoint
    save_file(timm.create_model('sa_quadratic_cifar', embed_dim=16, depth=1).state_dict(), tmp_path / 'w.safetensors')
    bare = read_checkpoint(tmp_path / 'w.safetensors')
    assert weights_label(bare).tag == 'unknown_custom'
    trained = Checkpoint('sa_quadratic_cifar', {}, {}, 'x', 'sa_vision', {'dataset': '', 'args': {'data_dir': 'd'}})
    assert weights_label(trained).tag == 'folder'  # a run of --dataset '' on an image folder


@pytest.mark.parametrize('tag', ['flowers_custom', 'folder_custom', 'unknown_custom'])
def test_an_export_and_its_pruned_weights_keep_the_image_folders_name(tmp_path, tag):
    """A run of --dataset flowers on an image folder exports '<arch>.flowers_custom': publishing that folder, or
    pruning it, keeps the name its tag holds (they read it back as '' -> 'folder', and 'unknown' once pruned)."""
    import timm
    from timm.models import save_for_hf

    from sa_vision.research.pruning import save_pruned
    folder = tmp_path / 'hub'
    model = timm.create_model('sa_quadratic_cifar', embed_dim=16, depth=2, heads_per_layer=(2, 2))
    save_for_hf(model, folder, safe_serialization=True, model_config={'pretrained_cfg': {'tag': tag}})
    exported = read_checkpoint(folder)
    assert weights_label(exported).tag == tag and weights_label(exported).default_repo_id.endswith(tag)
    save_pruned(exported.create_model(), tmp_path / 'pruned.safetensors', model_args=exported.model_args,
                pretrained_cfg=exported.meta['pretrained_cfg'])
    assert weights_label(read_checkpoint(tmp_path / 'pruned.safetensors')).tag == tag


@pytest.mark.parametrize('model_args, same_logits', [
    (dict(input_padding=2), False),
    (dict(input_padding=2, input_pad_value=[-2.43, -2.42, -2.22]), False),
    (dict(norm_eps=1e-6), False),
    (dict(drop_path_rate=0.1, proj_drop_rate=0.0, attn_drop_rate=0.0, pos_init='conv'), True),
])
def test_weights_are_the_reference_only_where_pretrained_true_gives_their_logits(model_args, same_logits, tmp_path):
    """CIFAR-10 weights of the paper's tensors take the registered name only where timm.create_model(arch,
    pretrained=True), which builds the registered configuration, computes what the trained model computes:
    a border the model adds (input_padding) changes the logits but no tensor."""
    import timm
    from safetensors.torch import save_file
    arch = 'sa_quadratic_cifar'
    torch.manual_seed(0)
    trained = timm.create_model(arch, **model_args).eval()
    with torch.no_grad():
        for param in trained.parameters():  # as training leaves them: no zero-initialised head
            param.add_(torch.randn_like(param) * 0.02)
    save_file(trained.state_dict(), str(tmp_path / 'w.safetensors'))
    downloaded = timm.create_model(arch, pretrained=True,
                                   pretrained_cfg_overlay=dict(file=str(tmp_path / 'w.safetensors'))).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(trained(x), downloaded(x)) == same_logits  # the reference itself
    label = weights_label(Checkpoint(arch, model_args, {}, 'x', 'sa_vision', {'dataset': 'torch/cifar10'}))
    assert label.is_reference == same_logits and label.registered_architecture == same_logits
    assert label.tag == ('cifar10' if same_logits else 'cifar10_custom')


def test_pretrained_true_from_offline_hub_cache_matches_trained_model(trained, tmp_path):
    ckpt_path, export_dir = trained
    cache = tmp_path / 'hub'
    repo_dir = cache / f'models--{DIGITS_REPO.replace("/", "--")}'
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
        for name, kwargs in [('hf-hub:{DIGITS_REPO}', {{}}), ('local-dir:{export_dir}', {{}})]:
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
                          timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(tmp_path / 'out.pt', weights_only=True)
    for source in ('hf-hub', 'local-dir'):
        assert torch.equal(out[source], expected), source
    # weights not in the cache: one clear message naming the repository and what to do
    assert out['error'].startswith('PretrainedWeightsUnavailable')
    assert 'sa-vision/sa_gen_cifar.cifar10' in out['error'] and 'sa-vision-train' in out['error']
    assert 'local-dir:' in out['error']


class _RecordingApi:
    """Stands in for huggingface_hub.HfApi and records every call with the repository it targets."""
    calls = []
    role = 'write'

    def __init__(self, *args, **kwargs):
        pass

    def whoami(self):
        self.calls.append('whoami')
        return {'name': 'someone', 'orgs': [{'name': 'sa-vision'}], 'auth': {'accessToken': {'role': self.role}}}

    def create_repo(self, repo_id, private=None, **kwargs):
        self.calls.append(('create_repo', repo_id))
        # as the Hub does: a name without a namespace goes to the token's user; an existing repository keeps its
        # visibility whatever is asked
        repo_id = repo_id if '/' in repo_id else f'someone/{repo_id}'
        self.private_repos.setdefault(repo_id, private)
        return type('RepoUrl', (), {'repo_id': repo_id})()

    def repo_info(self, repo_id):
        self.calls.append(('repo_info', repo_id))
        return type('RepoInfo', (), {'private': bool(self.private_repos[repo_id])})()

    def upload_folder(self, **kwargs):
        self.calls.append(('upload_folder', kwargs['repo_id'], _files_uploaded(**kwargs)))
        type(self).delete_patterns = kwargs.get('delete_patterns')
        type(self).uploaded_card = (Path(kwargs['folder_path']) / 'README.md').read_text(encoding='utf-8')
        return 'commit'

    def create_commit(self, *args, **kwargs):
        self.calls.append('create_commit')

    def upload_file(self, *args, **kwargs):
        self.calls.append('upload_file')


def _files_uploaded(folder_path, allow_patterns=None, ignore_patterns=None, **kwargs):
    """The files huggingface_hub's ``upload_folder`` sends, picked as it picks them: every file below the folder,
    links followed, filtered by its own pattern matching."""
    from huggingface_hub.utils import filter_repo_objects
    names = [p.relative_to(folder_path).as_posix() for p in Path(folder_path).glob('**/*') if p.is_file()]
    return sorted(filter_repo_objects(names, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns))


@pytest.fixture
def recording_api(monkeypatch):
    import huggingface_hub
    _RecordingApi.calls = []
    _RecordingApi.role = 'write'
    _RecordingApi.private_repos = {}  # repository -> what create_repo's private was when it was made
    monkeypatch.setattr(huggingface_hub, 'HfApi', _RecordingApi)
    monkeypatch.setenv('HF_TOKEN', 'hf_secret_value_never_printed')
    return _RecordingApi


def test_dry_run_stages_exactly_the_expected_files(trained, tmp_path, recording_api, capsys):
    ckpt_path, _ = trained
    out = tmp_path / 'staged'
    assert push_to_hub.main([str(ckpt_path), '--dry-run', '--out-dir', str(out)]) == 0
    # the timm Hub folder, the recipe, and the card's attention figure: written out, not the code's own constants
    expected = {'config.json', 'model.safetensors', 'README.md', 'recipe.yaml', 'attention.png'}
    assert {p.name for p in out.iterdir()} == expected
    printed = capsys.readouterr().out
    assert all(name in printed for name in expected) and 'nothing uploaded' in printed
    assert f'for {DIGITS_REPO}' in printed
    # the exported folder itself, staged again, keeps its label
    assert push_to_hub.main([str(trained[1]), '--dry-run', '--out-dir', str(tmp_path / 'again'), '--no-figure']) == 0
    assert f'for {DIGITS_REPO}' in capsys.readouterr().out
    assert recording_api.calls == []


def test_staging_never_replaces_an_export_of_other_weights(trained, tmp_path, recording_api, capsys):
    """--export wrote the best epoch into <run>/hub, push-to-hub's default staging folder: staging the run's later
    last.pth.tar (other weights) there is refused, says what the folder holds and leaves it byte for byte; the same
    weights are staged again; the folder itself is published as it is."""
    run = tmp_path / 'run'
    shutil.copytree(trained[0].parent, run)  # model_best.pth.tar (a hard link in the run) becomes its own file
    best = torch.load(run / 'model_best.pth.tar', weights_only=True)
    later = dict(best, epoch=1, state_dict={k: v + 1 if v.is_floating_point() else v
                                            for k, v in best['state_dict'].items()})
    torch.save(later, run / 'last.pth.tar')
    export = run / 'hub'
    before = {p.name: p.read_bytes() for p in export.iterdir()}

    assert push_to_hub.main([str(run / 'last.pth.tar'), '--dry-run']) == 2
    err = capsys.readouterr().err
    assert err.count('error:') == 1 and 'other weights' in err
    # what the folder holds, in the card's words: the epoch, and the top-1 recorded in the best checkpoint
    assert 'after epoch 1 of 1, the best' in err and f'top-1 {best["metrics"]["top1"]:.2f} %' in err
    assert f'sa-vision-push-to-hub {export}' in err and '--out-dir' in err
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before
    # the library's error names no flag of one command (sa-vision-reproduce exports too, and has no --out-dir)
    from sa_vision.hub import ExportExistsError, export_hub_folder
    with pytest.raises(ExportExistsError, match='other weights') as refused:
        export_hub_folder(str(run / 'last.pth.tar'), export, figure=False)
    assert '--out-dir' not in str(refused.value)

    assert push_to_hub.main([str(run / 'model_best.pth.tar'), '--dry-run', '--no-figure']) == 0
    assert (export / 'model.safetensors').read_bytes() == before['model.safetensors']
    assert push_to_hub.main([str(run / 'last.pth.tar'), '--dry-run', '--no-figure',
                             '--out-dir', str(tmp_path / 'later')]) == 0
    capsys.readouterr()
    # refused in the --out-dir given: no advice to pass the flag just passed
    assert push_to_hub.main([str(run / 'model_best.pth.tar'), '--dry-run', '--no-figure',
                             '--out-dir', str(tmp_path / 'later')]) == 2
    err = capsys.readouterr().err
    assert 'other weights' in err and '--out-dir' not in err, err
    assert push_to_hub.main([str(export), '--dry-run']) == 0
    assert recording_api.calls == []


def test_weights_without_their_record_never_replace_the_runs_export_of_them(trained, tmp_path, recording_api,
                                                                            capsys):
    """A run's kept epoch of the epoch --export took (--save-epoch-weights: its tensors, arch and model_args only)
    is the same weights as <run>/hub's: staged there, it would replace the card, recipe, label names and accuracy
    with an export of bare weights. Refused, the folder left byte for byte; staged elsewhere, it is exported."""
    from safetensors.torch import save_file
    run = tmp_path / 'run'
    shutil.copytree(trained[0].parent, run)
    best = torch.load(run / 'model_best.pth.tar', weights_only=True)
    epoch_file = run / 'epoch-001.safetensors'  # what save_epoch_records writes
    save_file({k: v.contiguous() for k, v in best['state_dict'].items()}, str(epoch_file),
              metadata={'arch': best['arch'], 'model_args': json.dumps(best['model_args'])})
    export = run / 'hub'
    before = {p.name: p.read_bytes() for p in export.iterdir()}
    assert {'recipe.yaml', 'README.md'} <= set(before)

    assert push_to_hub.main([str(epoch_file), '--dry-run', '--no-figure']) == 2
    err = capsys.readouterr().err
    assert err.count('error:') == 1 and 'same weights' in err and 'recipe.yaml' in err, err
    assert 'model_best.pth.tar' in err and '--out-dir' in err
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before
    # the run's checkpoint of the same weights, which carries the record, is staged there again
    assert push_to_hub.main([str(run / 'model_best.pth.tar'), '--dry-run', '--no-figure']) == 0
    assert (export / 'recipe.yaml').read_bytes() == before['recipe.yaml']
    assert push_to_hub.main([str(epoch_file), '--dry-run', '--no-figure', '--out-dir', str(tmp_path / 'bare')]) == 0
    assert not (tmp_path / 'bare' / 'recipe.yaml').exists()
    assert recording_api.calls == []


def test_publish_without_token_fails_before_any_upload(trained, tmp_path, recording_api, monkeypatch, capsys):
    import huggingface_hub
    ckpt_path, export_dir = trained
    monkeypatch.delenv('HF_TOKEN')
    monkeypatch.setattr(huggingface_hub, 'get_token', lambda: None)
    assert push_to_hub.main([str(ckpt_path), '--out-dir', str(tmp_path / 'staged')]) == 2
    assert 'no Hugging Face token' in capsys.readouterr().err
    with pytest.raises(HubPublishError, match='HF_TOKEN'):
        publish_hub_folder(export_dir, DIGITS_REPO)
    assert recording_api.calls == []


def test_publish_with_read_token_fails_before_any_upload(trained, recording_api, capsys):
    _, export_dir = trained
    recording_api.role = 'read'
    with pytest.raises(HubPublishError, match='cannot write') as e:
        publish_hub_folder(export_dir, DIGITS_REPO)
    assert 'hf_secret_value_never_printed' not in str(e.value)
    assert recording_api.calls == ['whoami']


def test_publish_to_a_foreign_namespace_is_refused(trained, recording_api):
    _, export_dir = trained
    with pytest.raises(HubPublishError, match="cannot write to someone-else/x.*'someone-else'"):
        publish_hub_folder(export_dir, 'someone-else/x')
    assert recording_api.calls == ['whoami']


def test_publish_uploads_the_folder_to_its_repository_in_one_commit(trained, tmp_path, recording_api, capsys):
    ckpt_path, _ = trained
    assert push_to_hub.main([str(ckpt_path), '--out-dir', str(tmp_path / 'staged'), '--no-figure']) == 0
    assert recording_api.calls == ['whoami', ('create_repo', DIGITS_REPO),
                                   ('upload_folder', DIGITS_REPO,
                                    ['README.md', 'config.json', 'model.safetensors', 'recipe.yaml'])]
    assert 'hf_secret_value_never_printed' not in capsys.readouterr().out


def test_only_the_exports_files_are_listed_and_uploaded(trained, tmp_path, recording_api, capsys):
    """A kept folder holding more than an export wrote (notes, a subfolder): the dry run names what stays behind,
    and the upload (as huggingface_hub picks files) sends the export's files alone, from the folder and from a
    copy staged elsewhere."""
    secret = tmp_path / 'secret'
    (secret / '.ssh').mkdir(parents=True)
    (secret / '.ssh' / 'id_rsa').write_text('private key')
    folder = tmp_path / 'kept'
    shutil.copytree(trained[1], folder)
    # its card already names the repository, so the folder itself is uploaded, not a copy with a rebuilt card
    (folder / 'README.md').write_text(card_to_upload(folder, DIGITS_REPO), encoding='utf-8')
    exported = sorted(p.name for p in folder.iterdir())
    (folder / 'notes.txt').write_text('mine')
    (folder / 'extra').symlink_to(secret)
    for target in ([], ['--out-dir', str(tmp_path / 'staged')]):
        assert push_to_hub.main([str(folder), '--dry-run', *target]) == 0
        printed = capsys.readouterr().out
        assert 'not uploaded (not written by an export): extra, notes.txt' in printed
        assert 'id_rsa' not in printed
        assert push_to_hub.main([str(folder), *target]) == 0
        assert recording_api.calls[-1] == ('upload_folder', DIGITS_REPO, exported)
    assert sorted(p.name for p in (tmp_path / 'staged').iterdir()) == exported
    # a link in an export file's place (a Hub cache's snapshot holds links to its blobs): its file is listed with
    # the link, and sent
    (folder / 'model.safetensors').rename(tmp_path / 'blob')
    (folder / 'model.safetensors').symlink_to(tmp_path / 'blob')
    assert push_to_hub.main([str(folder)]) == 0
    printed = capsys.readouterr().out
    assert f'the file of the link model.safetensors -> {tmp_path / "blob"}' in printed, printed
    assert recording_api.calls[-1] == ('upload_folder', DIGITS_REPO, exported)
    assert push_to_hub.main([str(folder), '--out-dir', str(tmp_path / 'other'), '--dry-run']) == 0
    staged = tmp_path / 'other' / 'model.safetensors'
    assert not staged.is_symlink() and staged.read_bytes() == (tmp_path / 'blob').read_bytes()
    # a link to nothing: the upload would delete that file on the Hub (its delete patterns)
    (folder / 'recipe.yaml').unlink()
    (folder / 'recipe.yaml').symlink_to(tmp_path / 'gone')
    calls = len(recording_api.calls)
    assert push_to_hub.main([str(folder)]) == 2
    assert 'links to nothing in place of recipe.yaml' in capsys.readouterr().err
    assert len(recording_api.calls) == calls


def test_an_export_into_the_working_folder_leaves_it_in_place(trained, tmp_path, recording_api, capsys,
                                                               monkeypatch):
    """--out-dir . (an empty folder the shell is in): the export is written there, and the folder stays the one
    the shell is in (it is not swapped for a new one, which would leave the shell in a deleted folder)."""
    here = tmp_path / 'here'
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    assert push_to_hub.main([str(trained[0]), '--out-dir', '.', '--dry-run', '--no-figure']) == 0
    assert here.stat().st_ino == inode and (here / 'model.safetensors').is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['here']


def test_digits_weights_never_reach_the_registered_repository(trained, tmp_path, recording_api, capsys):
    ckpt_path, export_dir = trained
    assert push_to_hub.main([str(ckpt_path), '--repo-id', REGISTERED_REPO, '--out-dir', str(tmp_path / 's')]) == 2
    assert 'refusing sa-vision/sa_quadratic_cifar.cifar10' in capsys.readouterr().err
    with pytest.raises(HubPublishError, match='refusing'):  # an exported folder, published directly
        publish_hub_folder(export_dir, REGISTERED_REPO)
    assert recording_api.calls == []


def test_corrupted_checkpoint_gives_a_clear_error(trained, tmp_path, recording_api, capsys):
    ckpt_path, _ = trained
    truncated = tmp_path / 'truncated.pth.tar'
    truncated.write_bytes(ckpt_path.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match='corrupted'):
        read_checkpoint(truncated)
    assert push_to_hub.main([str(truncated), '--out-dir', str(tmp_path / 'staged')]) == 2
    assert 'corrupted' in capsys.readouterr().err

    unsafe = tmp_path / 'unsafe.pth.tar'  # a pickled class instance other than timm's argparse.Namespace
    torch.save({'arch': 'sa_quadratic_cifar', 'model_args': {}, 'state_dict': _Unsafe()}, unsafe)
    with pytest.raises(CheckpointError, match='refuses to load'):
        read_checkpoint(unsafe)
    assert recording_api.calls == []


class _Unsafe:
    pass


def test_wrong_architecture_gives_a_clear_error(trained, tmp_path, recording_api, capsys):
    ckpt_path, _ = trained
    assert push_to_hub.main([str(ckpt_path), '--model', 'resnet18_cifar', '--out-dir', str(tmp_path / 'a')]) == 2
    assert 'holds a sa_quadratic_cifar model, not resnet18_cifar' in capsys.readouterr().err
    assert push_to_hub.main([str(ckpt_path), '--repo-id', 'sa-vision/sa_gen_cifar.digits',
                             '--out-dir', str(tmp_path / 'b')]) == 2
    assert 'is named for sa_gen_cifar' in capsys.readouterr().err
    # weights of one architecture labelled as another
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt['arch'] = 'resnet18_cifar'
    ckpt['model_args'] = {}
    relabelled = tmp_path / 'relabelled.pth.tar'
    torch.save(ckpt, relabelled)
    with pytest.raises(CheckpointError, match='do not fit resnet18_cifar'):
        export_hub_folder(relabelled, tmp_path / 'c')
    assert recording_api.calls == []


def test_exported_files_have_the_mode_a_new_file_gets(trained):
    """safetensors writes model.safetensors through a 0600 temporary file; the export gives it (and every file)
    the mode open() gives under this process's umask, as its neighbours have."""
    import stat
    _, export_dir = trained
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in export_dir.iterdir()}
    assert 'model.safetensors' in modes and set(modes.values()) == {oct(0o666 & ~umask)}, modes


def test_bf16_kept_weights_load_into_float32_models_as_rounded(trained, tmp_path):
    """``dtype='bfloat16'``: the file holds bf16 tensors (its safetensors header says so), and both
    timm's ``local-dir:`` loading and sa_vision's checkpoint reader give a float32 model whose weights are the
    trained ones rounded to bf16 (``Tensor.to(bfloat16)``, the reference)."""
    import json
    import struct

    import timm
    ckpt_path, _ = trained
    trained_sd = read_checkpoint(ckpt_path).create_model().state_dict()
    export_hub_folder(ckpt_path, tmp_path / 'f32', figure=False)
    export_hub_folder(ckpt_path, tmp_path / 'bf16', figure=False, dtype=torch.bfloat16)  # a name or a torch.dtype
    with pytest.raises(ValueError, match=r"dtype='bf16': the weights are stored as float32, float16, bfloat16"):
        export_hub_folder(ckpt_path, tmp_path / 'bf16', figure=False, dtype='bf16')
    with open(tmp_path / 'bf16' / 'model.safetensors', 'rb') as f:  # the format: a u64 length, then a JSON header
        header = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
    assert {entry['dtype'] for name, entry in header.items() if name != '__metadata__'} == {'BF16'}
    for model in (timm.create_model(f'local-dir:{tmp_path / "bf16"}', pretrained=True),
                  read_checkpoint(tmp_path / 'bf16').create_model()):
        loaded = model.state_dict()
        assert set(loaded) == set(trained_sd)
        for name, value in trained_sd.items():
            assert loaded[name].dtype == value.dtype
            assert torch.equal(loaded[name], value.to(torch.bfloat16).to(value.dtype)), name


def test_a_bf16_export_says_its_recorded_accuracy_is_of_the_float32_weights(trained, tmp_path):
    """The accuracy a checkpoint records is of its float32 weights; an export that rounds them to bfloat16 says so
    wherever it reports it (the Hub's model-index, the results, the training summary) and that it is stored so."""
    from huggingface_hub import ModelCard

    from sa_vision.hub.card import card_accuracy
    ckpt_path, _ = trained
    recorded = torch.load(ckpt_path, weights_only=True)['metrics']
    for dtype, rounded in (('float32', False), ('bfloat16', True)):
        export_hub_folder(ckpt_path, tmp_path / dtype, figure=False, dtype=dtype)
        text = (tmp_path / dtype / 'README.md').read_text(encoding='utf-8')
        results = ModelCard(text).data.eval_results
        assert {r.metric_name.split(' ')[0]: r.metric_value for r in results} == {
            'Top-1': round(recorded['top1'], 2), 'Top-5': round(recorded['top5'], 2)}
        assert all(('float32 weights, before rounding to bfloat16' in r.metric_name) == rounded for r in results)
        assert ('Stored in bfloat16' in text) == rounded
        evaluation = [line for line in text.splitlines() if line.startswith('- Evaluation of')]
        assert len(evaluation) == 1 and ('in float32, before they were rounded to bfloat16' in evaluation[0]) == rounded
        assert card_accuracy(text) == {'top1': round(recorded['top1'], 2), 'top5': round(recorded['top5'], 2)}


@pytest.mark.parametrize('repo_id, created', [('someone/x', 'someone/x'), ('mymodel', 'someone/mymodel')])
def test_the_published_card_and_output_name_the_repository_created(trained, tmp_path, recording_api, capsys,
                                                                   repo_id, created):
    """An export staged for its default repository and published to another (``--repo-id``; a bare name is put in
    the token's user namespace by the Hub): the uploaded card's usage loads the repository created, the output
    names it, and the local folder is left as it was."""
    export = tmp_path / 'hub'
    shutil.copytree(trained[1], export)
    before = {p.name: p.read_bytes() for p in export.iterdir()}
    assert push_to_hub.main([str(export), '--repo-id', repo_id]) == 0
    assert f'Published {created} in one commit' in capsys.readouterr().out
    assert recording_api.calls[1:] == [('create_repo', repo_id), ('upload_folder', created, sorted(before))]
    usage = recording_api.uploaded_card.split('<!-- sa_vision:usage -->')[1]
    assert f"timm.create_model('hf-hub:{created}', pretrained=True)" in usage
    # the export's own card says that its Hub name loads only once published; the uploaded one is published
    own_card = (export / 'README.md').read_text()
    assert 'This folder is an export' in own_card and 'This folder is an export' not in usage
    # the folder is named once, in the note; the published card tells how to load an export of it
    assert own_card.count('local-dir:') == 1 and "`timm.create_model('local-dir:<folder>', pretrained=True)`" in usage
    assert DIGITS_REPO not in recording_api.uploaded_card and f"'hf-hub:{repo_id}'" not in usage.replace(created, '')
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before


def test_the_dry_run_lists_the_card_as_it_is_uploaded(recording_api, capsys):
    """A kept zoo folder's card is published with its usage rebuilt for the target repository (a copy; the folder is
    left as it is): the dry run lists that card's size, the one the upload carries, and shows its usage, which names
    the repository."""
    import re
    kept = ROOT / 'zoo' / 'fashion-mnist-cpu' / 'sa_quadratic_cifar'
    before = (kept / 'README.md').read_bytes()
    assert push_to_hub.main([str(kept), '--dry-run']) == 0
    shown = capsys.readouterr().out
    listed = int(re.search(r'README\.md  \(([\d,]+) bytes', shown).group(1).replace(',', ''))
    repo_id = re.search(r'^Staged .* for (\S+):$', shown, re.M).group(1)
    loading = f"model = timm.create_model('hf-hub:{repo_id}', pretrained=True)"
    assert f'\n    {loading}' in shown, shown
    assert push_to_hub.main([str(kept)]) == 0
    assert loading in recording_api.uploaded_card
    assert listed == len(recording_api.uploaded_card.encode('utf-8')) != len(before)
    assert (kept / 'README.md').read_bytes() == before


def test_local_dir_names_a_folder_as_the_other_commands_do(recording_api, capsys):
    kept = ROOT / 'zoo' / 'fashion-mnist-cpu' / 'sa_quadratic_cifar'
    assert push_to_hub.main([str(kept), '--dry-run']) == 0
    as_path = capsys.readouterr().out
    assert push_to_hub.main([f'local-dir:{kept}', '--dry-run']) == 0
    assert capsys.readouterr().out == as_path and 'Staged' in as_path
    assert push_to_hub.main([f'local-dir:{kept / "missing"}', '--dry-run']) == 2
    assert 'is not a folder' in capsys.readouterr().err
    assert recording_api.calls == []


def test_a_folder_exported_under_a_tag_now_read_otherwise_is_not_published_as_it_is(tmp_path, recording_api,
                                                                                        capsys):
    """An image folder named 'cifar100', exported before CIFAR-100 was a known dataset, is tagged cifar100_custom:
    its card and config.json, published as they are, would show the folder's model as a CIFAR-100 result under
    the repository of its new name (cifar100_folder_custom). It is refused, with how to export it again."""
    folder = tmp_path / 'hub'
    shutil.copytree(ROOT / 'zoo' / 'fashion-mnist-cpu' / 'sa_quadratic_cifar', folder)
    config = json.loads((folder / 'config.json').read_text())
    config['pretrained_cfg']['tag'] = 'cifar100_custom'  # 10 classes: not CIFAR-100's 100
    (folder / 'config.json').write_text(json.dumps(config))
    assert push_to_hub.main([str(folder), '--dry-run']) == 2
    err = capsys.readouterr().err
    assert 'exported as sa_quadratic_cifar.cifar100_custom, which this sa_vision reads as ' \
           'sa_quadratic_cifar.cifar100_folder_custom' in err and 'export it again' in err, err
    assert recording_api.calls == []


def test_repository_ids_the_hub_refuses_are_refused_before_any_export(trained, tmp_path, recording_api, capsys):
    from huggingface_hub.utils import validate_repo_id
    for repo_id in ('bad repo id', 'a/b/c', 'me/-x'):
        with pytest.raises(ValueError):  # the Hub client's own verdict
            validate_repo_id(repo_id)
        argv = [str(trained[0]), '--repo-id', repo_id, '--out-dir', str(tmp_path / 'staged')]
        for dry_run in ([], ['--dry-run']):
            assert push_to_hub.main(argv + dry_run) == 2
            err = capsys.readouterr().err
            assert err.count('error:') == 1 and f"'{repo_id}' is not a Hub repository id" in err, err
            assert 'member of' not in err and 'repo_type' not in err, err
        with pytest.raises(HubPublishError, match='not a Hub repository id'):
            publish_hub_folder(trained[1], repo_id)
    assert not (tmp_path / 'staged').exists() and recording_api.calls == []


def test_private_never_publishes_to_an_existing_public_repository(trained, recording_api):
    """The Hub ignores create_repo's ``private`` for a repository that exists: --private then refuses before any
    upload; a new one is made private; without --private the namespace's default decides (None, not False)."""
    _, export_dir = trained
    recording_api.private_repos[DIGITS_REPO] = False  # made public earlier
    with pytest.raises(HubPublishError, match='exists and is public'):
        publish_hub_folder(export_dir, DIGITS_REPO, private=True)
    assert not any(call[0] == 'upload_folder' for call in recording_api.calls if isinstance(call, tuple))
    publish_hub_folder(export_dir, 'sa-vision/new-private', private=True)
    assert recording_api.private_repos['sa-vision/new-private'] is True
    publish_hub_folder(export_dir, 'sa-vision/new-default')
    assert recording_api.private_repos['sa-vision/new-default'] is None


def test_an_upload_replaces_what_an_earlier_export_published(trained, recording_api):
    """Files of an earlier export that this one lacks (its recipe, figure, epochs, pickled weights) are deleted
    in the upload's commit; files the user added on the Hub are not."""
    import fnmatch
    _, export_dir = trained
    publish_hub_folder(export_dir, DIGITS_REPO)
    earlier = ['recipe.yaml', 'attention.png', 'positional_epochs.safetensors', 'pytorch_model.bin', 'README.md']
    deleted = [name for name in earlier + ['.gitattributes', 'notes/extra.md', 'LICENSE']
               if any(fnmatch.fnmatch(name, pattern) for pattern in recording_api.delete_patterns)]
    assert deleted == earlier


def test_a_hub_folder_is_never_exported_into_itself(trained, tmp_path, recording_api, capsys):
    """Re-exporting a Hub folder into itself would rebuild its card from the weights alone (no training
    record): refused, the folder left byte for byte."""
    folder = tmp_path / 'kept'
    shutil.copytree(trained[1], folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for out_dir in (folder, tmp_path / '.' / 'kept'):
        assert push_to_hub.main([str(folder), '--out-dir', str(out_dir), '--dry-run']) == 2
        err = capsys.readouterr().err
        assert err.count('error:') == 1 and 'holds the weights to export' in err, err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_an_export_of_old_key_names_is_the_same_weights(trained, tmp_path):
    """A folder exported before a parameter was renamed (the kept zoo's ``spreads``) holds the same weights as a
    new export of them: it is re-staged, not refused as other weights."""
    from safetensors.torch import load_file, save_file

    from sa_vision.models.sa_state_dict import RENAMED_KEYS
    folder = tmp_path / 'hub'
    shutil.copytree(trained[1], folder)
    tensors = load_file(str(folder / 'model.safetensors'))
    old_names = {new: old for old, new in RENAMED_KEYS.items()}
    renamed = {next((key[:-len(new)] + old for new, old in old_names.items() if key.endswith(new)), key): value
               for key, value in tensors.items()}
    assert renamed.keys() != tensors.keys()  # the small model has a renamed parameter
    save_file(renamed, str(folder / 'model.safetensors'))
    export_hub_folder(trained[0].parent / 'model_best.pth.tar', folder, figure=False)
    assert load_file(str(folder / 'model.safetensors')).keys() == tensors.keys()


def test_reexports_keep_the_preprocessing_their_source_states(trained, tmp_path):
    """What timm's loaders feed the weights travels with them: a Hub folder's pretrained_cfg (mean, std, crop,
    label names), sa-vision-train's trained input size, timm train.py's --img-size / --mean / --std."""
    import dataclasses

    from timm.models import save_for_hf

    from sa_vision.hub.export import exported_config
    ckpt = read_checkpoint(trained[0])
    model = ckpt.create_model()
    folder, names = tmp_path / 'foreign', [f'class {i}' for i in range(NUM_CLASSES)]
    given = {'mean': (0.5, 0.5, 0.5), 'std': (0.25, 0.25, 0.25), 'crop_pct': 0.9, 'input_size': (3, 32, 32)}
    save_for_hf(model, folder, model_config={'label_names': names}, model_args=ckpt.model_args, data_config=given)
    export_hub_folder(folder, tmp_path / 'again', figure=False)
    config = json.loads((tmp_path / 'again' / 'config.json').read_text())
    assert {k: config['pretrained_cfg'][k] for k in given} == {k: list(v) if isinstance(v, tuple) else v
                                                                 for k, v in given.items()}
    assert config['label_names'] == names

    trained_at_16 = dataclasses.replace(ckpt, meta={**ckpt.meta, 'data_config': {
        **ckpt.meta['data_config'], 'input_size': (3, 16, 16)}})
    assert exported_config(trained_at_16, model)[2]['input_size'] == (3, 16, 16)
    timm_args = {'img_size': 24, 'mean': [0.1, 0.2, 0.3], 'std': [0.4, 0.5, 0.6]}
    timm_run = dataclasses.replace(ckpt, format='timm', meta={'args': timm_args, 'dataset': ''})
    data = exported_config(timm_run, model)[2]
    assert (data['input_size'], list(data['mean']), list(data['std'])) == ((3, 24, 24), timm_args['mean'],
                                                                           timm_args['std'])


@pytest.mark.parametrize('names, read, ours', [
    ([f'kind {i}' for i in range(NUM_CLASSES - 1, -1, -1)], None, True),  # its own order: label i, its i-th name
    (sorted(f'c{i}' for i in range(NUM_CLASSES)), [f'c{i}' for i in range(NUM_CLASSES)], True),  # an earlier export's
    (sorted(f'c{i}' for i in range(NUM_CLASSES)), None, False),  # another tool's (torchvision's ImageFolder order)
])
def test_a_hub_folder_of_an_image_folder_names_its_labels_as_it_states(trained, tmp_path, names, read, ours):
    """Weights of an image folder ('clothes') whose config.json states its label names: label i is the i-th, as
    timm reads the folder, unless the names are sorted plainly (c1, c10, c2) in an export of sa_vision (its
    recipe.yaml and training record), as earlier versions wrote the names of labels numbered in timm's order
    (c1, c2, c10)."""
    import timm
    folder = tmp_path / 'clothes'
    shutil.copytree(trained[1], folder)
    if not ours:  # a folder of timm's save_for_hf, say
        (folder / 'recipe.yaml').unlink()
    config = json.loads((folder / 'config.json').read_text())
    config['pretrained_cfg']['tag'], config['label_names'] = 'clothes', names
    if not ours:
        config.pop('training_processes', None)
    (folder / 'config.json').write_text(json.dumps(config))
    as_timm_reads = timm.create_model(f'local-dir:{folder}', pretrained=True).pretrained_cfg['label_names']
    assert list(as_timm_reads) == names
    assert list(read_checkpoint(folder).create_model().pretrained_cfg['label_names']) == (read or names)


@pytest.mark.parametrize('hub', ['offline', 'unreachable'])
def test_publishing_without_the_hub_is_one_error_line(trained, monkeypatch, capsys, hub):
    """The real Hub client: HF_HUB_OFFLINE set, or an endpoint where nothing answers (a closed local port)."""
    from huggingface_hub import constants
    monkeypatch.setenv('HF_TOKEN', 'hf_secret_value_never_printed')
    if hub == 'offline':
        monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)
    else:
        monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', False)
        monkeypatch.setattr(constants, 'ENDPOINT', 'http://127.0.0.1:9')
    assert run_cli(push_to_hub.main, [str(trained[1])]) == 2
    err = capsys.readouterr().err
    assert err.count('error:') == 1 and 'Traceback' not in err, err
    assert f'cannot publish to {DIGITS_REPO}: the Hugging Face Hub could not be reached' in err, err
    assert ('HF_HUB_OFFLINE is set' if hub == 'offline' else 'no answer from the Hub') in err, err
    assert ('unset HF_HUB_OFFLINE' in err) == (hub == 'offline'), err  # advice only where it is set


def test_weights_of_a_timm_model_of_its_own_export_and_load_as_they_trained(tmp_path):
    """sa-vision-train trains any timm model; --export of one without a 'cifar10' pretrained tag (timm's
    get_pretrained_cfg raises 'Invalid pretrained tag' for resnet10t.cifar10) writes its Hub folder too."""
    import timm

    from sa_vision.train.checkpoint import CHECKPOINT_VERSION
    model = timm.create_model('resnet10t', num_classes=10, stem_width=8).eval()
    torch.save({'version': CHECKPOINT_VERSION, 'arch': 'resnet10t', 'model_args': {'num_classes': 10, 'stem_width': 8},
                'state_dict': model.state_dict(), 'epoch': 0, 'num_epochs': 1, 'dataset': 'digits',
                'metrics': {'top1': 50.0, 'top5': 90.0, 'loss': 1.0}, 'args': {'dataset': 'digits', 'epochs': 1},
                'data_config': {'input_size': [3, 32, 32], 'mean': [0.5] * 3, 'std': [0.5] * 3}},
               tmp_path / 'last.pth.tar')
    export_hub_folder(tmp_path / 'last.pth.tar', tmp_path / 'hub', figure=False)
    loaded = timm.create_model(f'local-dir:{tmp_path / "hub"}', pretrained=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    card = (tmp_path / 'hub' / 'README.md').read_text()
    assert "timm.create_model('hf-hub:sa-vision/resnet10t.digits_custom'" in card


def test_a_kept_folder_staged_in_another_folder_is_copied_as_it_is(recording_api, tmp_path, capsys):
    """--out-dir with a complete Hub folder stages a copy of it: its card keeps the run's results and record (an
    export of the weights alone would rebuild a card without them), its files all come along, and the dry run's
    copy is what the upload then sends; a folder holding other files is refused."""
    kept = ROOT / 'zoo' / 'fashion-mnist-cpu' / 'sa_quadratic_cifar'
    staged = tmp_path / 'stage'
    assert push_to_hub.main([str(kept), '--dry-run', '--out-dir', str(staged)]) == 0
    assert {p.name: p.read_bytes() for p in staged.iterdir()} == {p.name: p.read_bytes() for p in kept.iterdir()}
    assert 'model-index' in (staged / 'README.md').read_text()
    shown = capsys.readouterr().out
    assert all(f'  {p.name}  (' in shown for p in kept.iterdir())
    assert recording_api.calls == []
    assert push_to_hub.main([str(kept), '--out-dir', str(staged)]) == 0  # the dry run's copy, published
    assert 'model-index' in recording_api.uploaded_card
    (staged / 'notes.txt').write_text('mine')
    status = run_cli(push_to_hub.main, [str(kept), '--dry-run', '--out-dir', str(staged)])
    assert status == 2 and 'it holds other files; a copy of' in capsys.readouterr().err


def test_an_exported_folder_of_weights_that_are_not_numbers_is_not_pushed(trained, tmp_path, recording_api, capsys):
    """A Hub folder exported before exports checked their weights, holding NaN (a run that diverged): published as it
    is, it would go up with a card stating its accuracy; it is refused in one line, nothing uploaded."""
    from safetensors.torch import load_file, save_file
    folder = tmp_path / 'diverged'
    shutil.copytree(trained[1], folder)
    weights = load_file(str(folder / 'model.safetensors'))
    save_file({k: torch.full_like(v, float('nan')) if v.is_floating_point() else v for k, v in weights.items()},
              str(folder / 'model.safetensors'))
    assert run_cli(push_to_hub.main, [str(folder)]) == 2
    assert 'holds weights that are not numbers (NaN or inf in' in capsys.readouterr().err
    assert recording_api.calls == []


def test_a_registered_model_outside_the_papers_table_is_described_by_its_factory():
    """sa_content_cifar (and a model a contributor registers) has no row of the paper's table: its card says what
    its factory's docstring says, not its name capitalised."""
    from sa_vision.hub.card import _describe
    assert _describe('sa_content_cifar') == ('Learned relative position encoding with content (query/key) attention, '
                                             '9 heads x 6 layers (~29.6 M)')
    assert _describe('sa_quadratic_cifar') == 'Isotropic Gaussian (quadratic encoding), 9 heads x 6 layers'
