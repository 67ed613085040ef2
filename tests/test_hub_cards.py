""" What an exported card says: the usage that runs, the epoch and weights it names (EMA or not, best or last,
picked by the accuracy it reports), and no claim where there is no training record """
import json
import re
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

import sa_vision  # noqa: F401  (registers the models)
from sa_vision.hub import export_hub_folder
from sa_vision.hub.card import usage_section
from sa_vision.train.data import dataset_info

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32)
# CIFAR-10's classes, label i first, as its batches.meta (and torchvision's CIFAR10.classes) list them
CIFAR10_CLASSES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck')


def _usage_code(card_text: str) -> str:
    return re.search(r'```python\n(.*?)```', card_text, re.S).group(1)


@pytest.mark.parametrize('arch', ['sa_quadratic_cifar', 'resnet18_cifar'])
def test_the_reference_cards_usage_runs_on_the_registered_model(arch, tmp_path, capsys):
    """The usage of CIFAR-10 weights published to the registered repository loads them by the registered name
    (pretrained=True; here the weights come from a file, the cfg stays the registered one) and prints the class
    name of the prediction: the registered cfg must carry CIFAR-10's label names."""
    from PIL import Image
    code = _usage_code(usage_section(arch, f'sa-vision/{arch}.cifar10', dataset_info('cifar10'), 10, 32,
                                     CIFAR10_CLASSES))
    assert f"timm.create_model('{arch}', pretrained=True)" in code and "pretrained_cfg['label_names']" in code
    torch.manual_seed(0)
    save_file(timm.create_model(arch).state_dict(), str(tmp_path / 'w.safetensors'))
    Image.new('RGB', (32, 32), (200, 30, 30)).save(tmp_path / 'image.png')
    code = code.replace('pretrained=True)', f'pretrained=True, pretrained_cfg_overlay=dict(file='
                                            f'{str(tmp_path / "w.safetensors")!r}))')
    exec(compile(code.replace("'image.png'", repr(str(tmp_path / 'image.png'))), 'usage', 'exec'), {})
    assert capsys.readouterr().out.strip() in CIFAR10_CLASSES
    assert tuple(timm.create_model(arch).pretrained_cfg['label_names']) == CIFAR10_CLASSES


def test_weights_of_no_known_dataset_claim_no_class_names(tmp_path):
    """10-class weights with no dataset named (bare safetensors): the export's config.json names no classes, not
    the registered cfg's CIFAR-10 ones, and timm's loading of the folder has none."""
    torch.manual_seed(0)
    save_file(timm.create_model('sa_quadratic_cifar', **SMALL).state_dict(), str(tmp_path / 'w.safetensors'))
    export_hub_folder(tmp_path / 'w.safetensors', tmp_path / 'hub', figure=False)
    config = json.loads((tmp_path / 'hub' / 'config.json').read_text())
    assert 'label_names' not in config and 'label_names' not in config['pretrained_cfg'], config
    loaded = timm.create_model(f'local-dir:{tmp_path / "hub"}', pretrained=True)
    assert loaded.num_classes == 10 and not loaded.pretrained_cfg.get('label_names')
    assert "label_names" not in _usage_code((tmp_path / 'hub' / 'README.md').read_text())


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    """A finished 2-epoch sa-vision-train run of a tiny model on the digits, exported with --export."""
    from sa_vision.cli import train
    out = tmp_path_factory.mktemp('runs')
    train.main([str(a) for a in ['-c', 'sa_quadratic_cifar_digits', '--epochs', 2, '-b', 64, '--log-interval', 100,
                                 '--model-kwargs', *[f'{k}={v}' for k, v in SMALL.items()], '--output', out,
                                 '--experiment', 'run', '--export']])
    return out / 'run'


def _card(folder) -> str:
    return (folder / 'README.md').read_text(encoding='utf-8')


def _section(card: str, name: str) -> str:
    return card.split(f'<!-- sa_vision:{name} -->')[1].split(f'<!-- /sa_vision:{name} -->')[0]


def test_the_card_numbers_epochs_from_1_and_says_when_the_accuracy_picked_them(run, tmp_path):
    """--export publishes model_best.pth.tar, picked by its test-split top-1, which the card reports: where that is
    an epoch before the run's last, the card says that this makes the number optimistic. The last epoch was picked by
    nothing, exported as it is or as the best. The epochs of the training table count from 1, as 'after epoch N of
    M' does."""
    ckpt = torch.load(run / 'last.pth.tar', weights_only=True)
    best_epoch = ckpt['best']['epoch'] + 1  # the record counts from 0
    picked = _card(run / 'hub')
    assert f'after epoch {best_epoch} of 2, the best by `--eval-metric top1`' in picked
    optimistic = 'picked as the best by `--eval-metric top1` on this same split, so the accuracy is optimistic'
    assert (optimistic in _section(picked, 'results')) == (best_epoch < 2)
    for epoch, picked_by_score in ((1, True), (2, False)):  # model_best of either epoch
        folder = tmp_path / f'best{epoch}'
        folder.mkdir()
        torch.save({**ckpt, 'epoch': epoch - 1, 'history': ckpt['history'][:epoch],
                    'best': {**ckpt['best'], 'epoch': epoch - 1}}, folder / 'model_best.pth.tar')
        export_hub_folder(folder / 'model_best.pth.tar', folder / 'hub', figure=False)
        assert (optimistic in _section(_card(folder / 'hub'), 'results')) == picked_by_score, epoch
    rows = re.findall(r'^\| (\d+) \|', _section(picked, 'training'), re.M)
    assert rows == [str(epoch) for epoch in range(1, best_epoch + 1)] and '2 epochs of' in picked
    export_hub_folder(run / 'last.pth.tar', tmp_path / 'last', figure=False)
    last = _card(tmp_path / 'last')
    assert 'after epoch 2 of 2' in last and 'optimistic' not in last
    assert re.findall(r'^\| (\d+) \|', _section(last, 'training'), re.M) == ['1', '2']
    # a killed run's last.pth.tar (epoch 1 of 2, the best so far) is its latest epoch, picked by nothing
    (tmp_path / 'killed').mkdir()
    killed = {**ckpt, 'epoch': 0, 'history': ckpt['history'][:1], 'best': {**ckpt['best'], 'epoch': 0}}
    torch.save(killed, tmp_path / 'killed' / 'last.pth.tar')
    export_hub_folder(tmp_path / 'killed' / 'last.pth.tar', tmp_path / 'killed' / 'hub', figure=False)
    card = _card(tmp_path / 'killed' / 'hub')
    assert 'after epoch 1 of 2, the best by' in card and 'optimistic' not in card
    # one epoch is 'epoch', not 'epochs'
    ckpt.update(epoch=0, num_epochs=1, history=ckpt['history'][:1], best={**ckpt['best'], 'epoch': 0})
    torch.save(ckpt, tmp_path / 'one.pth.tar')
    export_hub_folder(tmp_path / 'one.pth.tar', tmp_path / 'one', figure=False)
    one = _card(tmp_path / 'one')
    assert '; 1 epoch of' in one and '1 epochs' not in one and 'after epoch 1 of 1' in one


@pytest.mark.parametrize('source', ['safetensors', 'state_dict'])
def test_weights_without_a_training_record_make_no_recipe_claim(source, run, tmp_path):
    """Bare tensors say nothing of their training: no recipe.yaml (an empty one would start the 300-epoch default
    run), and the card says there is no record instead of '-c recipe.yaml repeats the run'."""
    from sa_vision.cli import push_to_hub
    state = torch.load(run / 'last.pth.tar', weights_only=True)['state_dict']
    path = tmp_path / ('w.safetensors' if source == 'safetensors' else 'w.pth')
    save_file(state, str(path)) if source == 'safetensors' else torch.save(state, path)
    files = export_hub_folder(path, tmp_path / 'hub', figure=False)
    assert 'recipe.yaml' not in files
    card = _card(tmp_path / 'hub')
    assert 'repeats the run' not in card and 'recipe.yaml' not in card.replace('no `recipe.yaml`', '')
    assert 'no training record' in _section(card, 'training') and 'no run to repeat' in _section(card, 'recipe')
    assert push_to_hub.main([str(tmp_path / 'hub'), '--dry-run']) == 0  # a complete export as it is


def test_an_export_exported_again_keeps_its_recipe(run, tmp_path):
    export_hub_folder(run / 'hub', tmp_path / 'again', figure=False)
    assert (tmp_path / 'again' / 'recipe.yaml').read_text() == (run / 'hub' / 'recipe.yaml').read_text()
    assert 'no record of the epochs' in _section(_card(tmp_path / 'again'), 'training')


def test_an_export_of_a_two_process_run_exported_again_repeats_it_under_torchrun(run, tmp_path):
    """The recipe's batch size is each process's: the export of a 2-process run, and the export of that export
    (a Hub folder keeps no training arguments but the recipe), say torchrun with 2 processes repeats the run."""
    ckpt = torch.load(run / 'last.pth.tar', weights_only=True)
    ckpt['args']['world_size'] = 2
    torch.save(ckpt, tmp_path / 'ddp.pth.tar')
    repeat = 'torchrun --nproc_per_node 2 -m sa_vision.cli.train -c recipe.yaml'
    source = tmp_path / 'ddp.pth.tar'
    for out in ('hub', 'again', 'third'):
        export_hub_folder(source, tmp_path / out, figure=False)
        source = tmp_path / out
        assert repeat in (source / 'recipe.yaml').read_text().splitlines()[0], out
        assert f'`{repeat}` repeats the run' in _card(source), out


def test_a_hub_folder_without_a_card_is_not_staged_inside_itself(tmp_path, capsys):
    """A plain save_for_hf folder has no card: its export goes to the --out-dir asked for, not to <folder>/hub. The
    error names the files the folder lacks (a card, or safetensors weights beside pytorch_model.bin)."""
    from timm.models import save_for_hf

    from sa_vision.cli import push_to_hub
    from sa_vision.errors import run_cli
    save_for_hf(timm.create_model('sa_quadratic_cifar', **SMALL), str(tmp_path / 'plain'), safe_serialization=True)
    save_for_hf(timm.create_model('sa_quadratic_cifar', **SMALL), str(tmp_path / 'bin'), safe_serialization=False)
    (tmp_path / 'bin' / 'README.md').write_text('# a card\n')
    for folder, lacks in (('plain', 'without README.md,'), ('bin', 'without model.safetensors,')):
        assert run_cli(push_to_hub.main, [str(tmp_path / folder), '--dry-run']) == 2
        err = capsys.readouterr().err
        assert err.count('error:') == 1 and lacks in err and '--out-dir DIR' in err, err
    assert sorted(p.name for p in (tmp_path / 'plain').iterdir()) == ['config.json', 'model.safetensors']
    assert push_to_hub.main([str(tmp_path / 'plain'), '--dry-run', '--out-dir', str(tmp_path / 'hub')]) == 0
    assert (tmp_path / 'hub' / 'README.md').is_file()


def test_the_card_names_the_split_the_run_evaluated(run, tmp_path):
    """A run evaluated on --val-split train publishes its training-split accuracy: the card says so, in its text
    and model-index, rather than calling it the test split's."""
    from huggingface_hub import ModelCard

    from sa_vision.cli import train
    assert ModelCard(_card(run / 'hub')).data.eval_results[0].dataset_split == 'test'  # validation reads test
    train.main([str(a) for a in ['-c', 'sa_quadratic_cifar_digits', '--epochs', 1, '-b', 64, '--log-interval', 100,
                                 '--model-kwargs', *[f'{k}={v}' for k, v in SMALL.items()], '--output', tmp_path,
                                 '--experiment', 'on_train', '--val-split', 'train', '--export']])
    card = _card(tmp_path / 'on_train' / 'hub')
    assert {r.dataset_split for r in ModelCard(card).data.eval_results} == {'train'}
    assert 'on its train split' in card and 'on its test split' not in card


def test_the_card_says_how_to_install_sa_vision_as_the_readme_does(run):
    """The package is installed from its source (README.md's own command); no package index is claimed."""
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    usage = _section(_card(run / 'hub'), 'usage')
    assert 'pip install -e .' in readme and '`pip install -e .` in a clone' in usage
    assert 'pip install sa' not in usage


def test_a_padded_export_exported_again_says_the_input_size_of_its_config(tmp_path):
    """A kept Fashion-MNIST folder (the border inside the model) and its pruning, exported again: the card's usage
    names the input size timm resolves from the new folder's config.json, as the kept card does."""
    from sa_vision.cli import prune
    kept = ROOT / 'zoo' / 'fashion-mnist-cpu' / 'sa_gen_cifar'
    assert prune.main([str(kept), '--out', str(tmp_path / 'pruned.safetensors')]) == 0
    for source, out in ((kept, tmp_path / 'again'), (tmp_path / 'pruned.safetensors', tmp_path / 'pruned')):
        export_hub_folder(source, out, figure=False)
        size = timm.data.resolve_data_config({}, model=timm.create_model(f'local-dir:{out}'))['input_size']
        usage = _section(_card(out), 'usage')
        assert size == (3, 28, 28) and '# 28x28 input: the model adds the 2-pixel black border' in usage, usage
    assert '# 28x28 input: the model adds the 2-pixel black border' in _card(kept)


def test_an_image_folders_card_claims_no_public_dataset_and_no_top5_of_three_classes(tmp_path):
    """Weights trained on a local 3-class folder named 'beans' (a public Hub dataset's id too): the model-index
    names the type of the Hub's own image-folder loader, not that dataset; top-5 of 3 classes (always 100 %) is
    left out; the card is in the Hub's image-classification task, as timm's cards are."""
    from huggingface_hub import ModelCard

    from sa_vision.train.checkpoint import Checkpoint
    args = dict(SMALL, num_classes=3)
    weights = timm.create_model('sa_quadratic_cifar', **args).state_dict()
    metrics = {'top1': 66.67, 'top5': 100.0, 'loss': 1.0, 'num_images': 3}
    meta = {'dataset': 'beans', 'args': {'data_dir': str(tmp_path), 'val_split': 'validation'}, 'metrics': metrics,
            'epoch': 1, 'num_epochs': 1}  # a training record: the card's summary says the evaluation too
    export_hub_folder(Checkpoint('sa_quadratic_cifar', args, weights, str(tmp_path / 'last.pth.tar'), 'sa_vision',
                                 meta), tmp_path / 'hub', figure=False)
    card = ModelCard.load(tmp_path / 'hub' / 'README.md')
    assert card.data.pipeline_tag == 'image-classification' and card.data.library_name == 'timm'
    assert [(r.dataset_type, r.dataset_name, r.metric_name, r.metric_value) for r in card.data.eval_results] == [
        ('imagefolder', 'beans', 'Top-1 accuracy', 66.67)]
    assert '(3 images): top-1 66.67 %, loss 1.0000' in card.text and 'top-5' not in card.text.lower()


def test_a_card_says_its_evaluation_ran_under_the_trainings_autocast(tmp_path):
    """The kept zoo's training evaluated under bfloat16 autocast: 94.00 % on a card whose weights score 93.99 % in
    float32 (docs/reproduction_fashion_mnist.csv). The card says which precision its number is of."""
    from sa_vision.train.checkpoint import Checkpoint
    weights = timm.create_model('sa_quadratic_cifar', **SMALL).state_dict()
    metrics = {'top1': 94.0, 'top5': 99.96, 'loss': 0.18, 'num_images': 10000}
    for amp_used, expected in (('bfloat16', '(10000 images, under bfloat16 autocast as in training): top-1 94.00 %'),
                               (False, '(10000 images): top-1 94.00 %')):
        meta = {'dataset': 'fashion-mnist', 'args': {'amp': 'auto', 'amp_used': amp_used}, 'metrics': metrics,
                'epoch': 1, 'num_epochs': 1}
        out = tmp_path / str(amp_used)
        export_hub_folder(Checkpoint('sa_quadratic_cifar', SMALL, weights, str(tmp_path / 'last.pth.tar'),
                                     'sa_vision', meta), out, figure=False)
        assert expected in _card(out)


def test_the_cards_folder_order_is_timms(tmp_path):
    """The card tells a validate.py user how timm numbers class folders: natural order, as timm's reader does
    (an earlier card said `10` sorts before `2`, and had users rename folders for nothing)."""
    from PIL import Image
    from timm.data.readers.reader_image_folder import find_images_and_targets

    from sa_vision.hub.card import MODEL_CARD_DIR
    for name in ('10', '2', 'b', 'A'):
        (tmp_path / name).mkdir()
        Image.new('RGB', (4, 4)).save(tmp_path / name / 'x.png')
    _, class_to_idx = find_images_and_targets(str(tmp_path))
    assert list(class_to_idx) == ['2', '10', 'A', 'b']
    template = ' '.join((Path(MODEL_CARD_DIR) / 'sa_quadratic_cifar.md').read_text(encoding='utf-8').split())
    assert 'natural order (numbers by value, `2` before `10`; letters in either case alike)' in template


def test_folders_named_as_the_card_says_are_numbered_as_the_weights_classes(tmp_path):
    """The card of weights of an image folder lists their labels in the order of the logits, and folders named by
    them are numbered so by timm's reader (validate.py's); an earlier card pointed at a 'label order above' that no
    card had, and a user who renamed the folders `0` to `9` by meaning lost the accuracy."""
    from PIL import Image
    from timm.data.readers.reader_image_folder import find_images_and_targets

    from sa_vision.train.checkpoint import Checkpoint
    names = ['eight', 'five', 'four', 'nine', 'one', 'seven', 'six', 'three', 'two', 'zero']  # the training's folders
    weights = timm.create_model('sa_quadratic_cifar', **SMALL).state_dict()
    meta = {'dataset': 'mydigits', 'args': {'data_dir': str(tmp_path), 'label_names': names},
            'metrics': {'top1': 22.22, 'top5': 70.0, 'loss': 2.0, 'num_images': 90}, 'epoch': 1, 'num_epochs': 1}
    export_hub_folder(Checkpoint('sa_quadratic_cifar', SMALL, weights, str(tmp_path / 'last.pth.tar'), 'sa_vision',
                                 meta), tmp_path / 'hub', figure=False)
    assert json.loads((tmp_path / 'hub' / 'config.json').read_text())['label_names'] == names
    usage = ' '.join(_section(_card(tmp_path / 'hub'), 'usage').split())
    listed = re.search(r'sort in the order of their labels, (.*?) \(', usage).group(1)
    folders = tmp_path / 'val'
    for name in reversed(re.findall(r'`([^`]+)`', listed)):
        (folders / name).mkdir(parents=True)
        Image.new('RGB', (4, 4)).save(folders / name / 'x.png')
    _, class_to_idx = find_images_and_targets(str(folders))
    assert class_to_idx == {name: i for i, name in enumerate(names)}


def test_the_usage_of_a_config_that_states_no_class_count_is_rebuilt(tmp_path):
    """A Hub folder's config.json of another tool may state no num_classes: publishing it rebuilds the usage
    without the count (an earlier version raised a TypeError on it)."""
    from sa_vision.hub.card import card_for_repository, generate_model_card
    config = {'architecture': 'sa_quadratic_cifar', 'pretrained_cfg': {'tag': 'folder'}}
    usage = ' '.join(_section(card_for_repository(generate_model_card('sa_quadratic_cifar'), config, 'me/w'),
                              'usage').split())
    assert usage.endswith('name the folders so that they sort in the order of the classes these weights were '
                          'trained on.'), usage
    config['label_names'] = ['b', 'a']
    usage = ' '.join(_section(card_for_repository(generate_model_card('sa_quadratic_cifar'), config, 'me/w'),
                              'usage').split())
    assert usage.endswith('sort in the order of their labels, `b`, `a` (`0` to `1` sort so).'), usage
