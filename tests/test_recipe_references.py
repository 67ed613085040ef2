""" Help, recipes and model cards point an installed user to the recipes the package ships (``-c NAME``), not to the
repository's ``scripts/configs/``, which ``pip install sa_vision`` does not give them """
from pathlib import Path

import pytest

from sa_vision.hub.card import generate_model_card
from sa_vision.hub.labels import MODEL_CARD_DIR
from sa_vision.hub.record import recipe_section
from sa_vision.train.args import build_parser
from sa_vision.train.checkpoint import Checkpoint
from sa_vision.train.recipes import RECIPE_DIR, load_recipe, recipe_path, repeat_run_args

ROOT = Path(__file__).resolve().parent.parent

SHIPPED = sorted(p.stem for p in RECIPE_DIR.glob('*.yaml'))
CARDS = sorted(p.stem for p in MODEL_CARD_DIR.glob('*.md'))


def test_config_help_names_the_shipped_recipes():
    help_text = ' '.join(build_parser().format_help().split())  # sa-vision-train --help
    assert '-c NAME|FILE, --config NAME|FILE' in help_text
    assert 'scripts/' not in help_text
    assert 'sa_vision/configs/NAME.yaml' in help_text and 'recipe.yaml' in help_text
    for name in SHIPPED:
        assert name in help_text, name
        recipe_path(name)  # what the help names, -c finds


def test_a_shipped_recipe_is_found_by_its_file_name_too_and_a_missing_one_is_named(tmp_path, monkeypatch):
    """-c sa_quadratic_cifar_digits.yaml (the file's name, as a user copies it from the folder) finds the shipped
    recipe unless such a file is where the user is; a name that is neither says so and lists the shipped ones."""
    from sa_vision.errors import RecipeNotFoundError
    monkeypatch.chdir(tmp_path)
    assert recipe_path('sa_quadratic_cifar_digits.yaml') == RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml'
    (tmp_path / 'sa_quadratic_cifar_digits.yaml').write_text('epochs: 1\n')
    assert recipe_path('sa_quadratic_cifar_digits.yaml') == Path('sa_quadratic_cifar_digits.yaml')
    with pytest.raises(RecipeNotFoundError, match=r"no recipe 'mine.yaml': no such file, nor one of \[.*'sa_gen"):
        recipe_path('mine.yaml')


@pytest.mark.parametrize('name', SHIPPED)
def test_recipe_headers_give_commands_an_installed_user_can_run(name):
    text = (RECIPE_DIR / f'{name}.yaml').read_text()
    assert 'scripts/' not in text
    assert f'sa-vision-train -c {name} ' in text
    if 'torch/cifar10' in text:  # the CIFAR-10 recipes also say how timm's train.py reads the installed file
        assert f"recipe_path('{name}')" in text and 'python train.py -c' in text


@pytest.mark.parametrize('arch', CARDS)
def test_card_templates_point_to_the_shipped_recipe(arch):
    text = (MODEL_CARD_DIR / f'{arch}.md').read_text(encoding='utf-8')
    assert 'scripts/' not in text
    assert f'`sa-vision-train {repeat_run_args(arch, arch)}`' in text and f'sa_vision/configs/{arch}.yaml' in text


def test_exported_card_names_the_shipped_recipe():
    ckpt = Checkpoint('sa_quadratic_cifar', {}, {}, 'run/last.pth.tar', 'sa_vision', {'recipe': {'lr': 0.1}})
    text = recipe_section(ckpt)
    assert 'scripts/' not in text and '`sa-vision-train -c sa_quadratic_cifar`' in text


@pytest.mark.slow
@pytest.mark.parametrize('arch', CARDS)
def test_card_templates_are_what_write_model_cards_writes(arch):
    """The templates are generated (``write_model_cards``): edited by hand they would drift from the generator."""
    assert (MODEL_CARD_DIR / f'{arch}.md').read_text(encoding='utf-8') == generate_model_card(arch)


def test_pruned_recipe_without_the_weights_it_fine_tunes_is_refused():
    """sa_gen_pruned is a trained sa_gen_cifar with its degenerate heads pruned, then fine-tuned (paper App. A.1):
    its recipe alone would start from a random initialisation, so it is refused with the commands that make the
    pruned weights; with them, resumed, or with a from-scratch recipe it parses."""
    from sa_vision.errors import RecipeError
    from sa_vision.models._pretrained import training_commands
    from sa_vision.train.state import parse_run_args
    with pytest.raises(RecipeError, match='random initialisation') as raised:
        parse_run_args(['-c', 'sa_gen_pruned', '--data-dir', 'data', '--dataset-download'])
    assert training_commands('sa_gen_pruned') in str(raised.value)
    assert '-c sa_gen_cifar --model sa_gen_pruned' in str(raised.value)
    started = parse_run_args(['-c', 'sa_gen_pruned', '--initial-checkpoint', 'pruned.pth'])[0]
    # the fine-tune recipe: the learning rate divided by 10 (paper App. A.1)
    assert started.model == 'sa_gen_pruned' and started.lr == pytest.approx(load_recipe('sa_gen_cifar')['lr'] / 10)
    scratch = parse_run_args(['-c', 'sa_gen_cifar', '--model', 'sa_gen_pruned'])[0]
    assert scratch.model == 'sa_gen_pruned' and not scratch.initial_checkpoint


@pytest.mark.parametrize('dataset', [None, 'fashion-mnist'])
def test_a_recipe_names_no_run_folder(dataset, tmp_path):
    """A recipe holds training arguments: the run folder is named as a run without --experiment is,
    ``<date>-<time>-<model>-<dataset>`` (docs/training.md), so the digits recipe run on Fashion-MNIST is not
    written into a folder named for the digits."""
    from sa_vision.train.run_folder import run_folder
    from sa_vision.train.state import parse_run_args
    for name in SHIPPED:
        assert not {'experiment', 'output'} & set(load_recipe(name)), name
    args = parse_run_args(['-c', 'sa_quadratic_cifar_digits', '--output', str(tmp_path),
                           *(['--dataset', dataset] if dataset else [])])[0]
    folder = run_folder(args, None)
    assert folder.parent == tmp_path and folder.name.endswith(f'-sa_quadratic_cifar-{dataset or "digits"}'), folder


@pytest.mark.parametrize('arch', ['sa_gen_pruned', 'sa_quadratic_cifar'])
def test_an_exported_recipe_says_how_to_repeat_its_run_in_arguments_that_parse(arch, tmp_path):
    """An export's recipe.yaml header gives the command that repeats the run; a recipe keeps no local paths, so for
    a pruned model it names the pruned weights too, else the command would be refused. The kept zoo's header,
    filled in, parses to its model; a new export's header gives the same arguments."""
    import re
    import shlex

    from sa_vision.hub import export_hub_folder
    from sa_vision.train.state import parse_run_args
    kept = ROOT / 'zoo' / 'fashion-mnist-cpu' / arch
    export_hub_folder(str(kept), tmp_path / 'hub', figure=False)
    headers = [(folder / 'recipe.yaml').read_text().splitlines()[0] for folder in (kept, tmp_path / 'hub')]
    commands = [re.search(r': sa-vision-train (.*) repeats the run', header).group(1) for header in headers]
    assert commands[0] == commands[1], headers
    assert ('--initial-checkpoint PRUNED' in commands[0]) == (arch == 'sa_gen_pruned'), headers
    filled = commands[0].replace('recipe.yaml', str(kept / 'recipe.yaml')).replace(
        'PRUNED', str(tmp_path / 'pruned.pth')).replace('DIR', str(tmp_path))
    assert parse_run_args(shlex.split(filled))[0].model == arch


def test_write_model_cards_regenerates_every_template_there(tmp_path):
    """write_model_cards() (docs/hub.md's regeneration) rewrites a contributor's card template too, not only the
    paper's five: one left out would go stale and fail the test above."""
    from sa_vision.hub.card import write_model_cards
    (tmp_path / 'sa_content_cifar.md').write_text('stale <!-- sa_vision:usage -->', encoding='utf-8')
    (tmp_path / 'README.md').write_text('# the folder itself', encoding='utf-8')  # no model's: left alone
    (tmp_path / 'resnet18.md').write_text("timm's own card", encoding='utf-8')  # a model's, not of this generator
    written = write_model_cards(out_dir=tmp_path)
    assert sorted(p.stem for p in written) == sorted([*CARDS, 'sa_content_cifar'])
    assert (tmp_path / 'sa_content_cifar.md').read_text(encoding='utf-8') == generate_model_card('sa_content_cifar')
    assert (tmp_path / 'resnet18.md').read_text(encoding='utf-8') == "timm's own card"


def test_help_over_a_recipe_shows_the_recipes_values_where_the_help_names_the_built_in_one():
    """-c FILE --help shows the defaults in force, the recipe's (its description says so): an option whose help
    names its built-in default ('--tf32 ... (default: off, full float32)') gets the recipe's value beside it."""
    def help_of(parser):
        return ' '.join(parser.format_help().split())
    built_in = help_of(build_parser())
    assert '(in force' not in built_in and 'default: 0.1' in built_in  # --lr
    over = help_of(build_parser({'tf32': True, 'pos_lr_scale': 30.0, 'clip_mode': 'agc', 'lr': 0.5}))
    assert '(default: off, full float32) (in force: True)' in over
    assert 'default 1: one learning rate); ' in over and '(in force: 30.0)' in over
    assert 'adaptive (AGC) (in force: agc)' in over and 'default: 0.5' in over and 'default: 0.5 (' not in over
