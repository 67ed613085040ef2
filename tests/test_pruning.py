""" Pruning degenerate heads (paper App. A.1) """
import copy
import json
import os
import shutil
import stat
import subprocess

import pytest
import timm
import torch
from float32_bounds import assert_network_float32_close, sa_model_reduction_lengths
from helpers import command, command_here, usual_file_mode

import sa_vision  # noqa: F401
from sa_vision.paper import PAPER_RESULTS, PRUNED_HEADS_PER_LAYER
from sa_vision.research.pruning import find_degenerate_heads, prune_heads, prune_state_dict

ROOT = os.path.join(os.path.dirname(__file__), '..')
SMALL = dict(embed_dim=16, depth=3, heads_per_layer=(4, 5, 3), mlp_hidden_dim=24)
# (layer, head) -> S_h making M_h = S_h S_h^T degenerate: tiny (uniform attention) or near-singular (stripe)
PLANTED = {
    (0, 1): torch.eye(2) * 1e-3,  # largest eigenvalue 1e-6 < 1e-5
    (1, 0): torch.tensor([[1.0, 0.0], [0.0, 0.01]]),  # condition number 1e4 > 1000
    (1, 4): torch.tensor([[1.0, 1.0], [1.0, 1.0]]),  # singular: condition infinite
    (2, 2): torch.zeros(2, 2),  # all-zero: constant scores
}


def planted_model():
    torch.manual_seed(0)
    model = timm.create_model('sa_gen_cifar', **SMALL).eval()
    with torch.no_grad():
        for (layer, head), s in PLANTED.items():
            model.blocks[layer].attn.position.precision_factors[head] = s
        # a healthy head close to the thresholds stays: eigenvalues 1 and 2e-3 (condition 500)
        model.blocks[0].attn.position.precision_factors[3] = torch.diag(torch.tensor([1.0, 0.002 ** 0.5]))
    return model


def test_planted_degenerate_heads_are_found():
    assert find_degenerate_heads(planted_model()) == [[1], [0, 4], [2]]


def test_eigenvalues_of_a_near_singular_head_are_exact():
    # det S = 2^-12 exactly, so det M = 2^-24 and the small eigenvalue is 2^-24 / the large one (about 3e-9,
    # below float32's rounding of M's entries, about 1e-6: M must be formed in float64)
    from sa_vision.research.pruning import head_eigenvalues
    model = planted_model()
    s = torch.tensor([[1.0, 4.0], [-0.25, -1.0 + 2 ** -12]])
    with torch.no_grad():
        model.blocks[0].attn.position.precision_factors[0] = s
    smallest, largest = head_eigenvalues(model)[0][0].tolist()
    m = s.double() @ s.double().T
    trace = float(m.trace())
    assert largest == pytest.approx(trace / 2 + ((trace / 2) ** 2 - 2 ** -24) ** 0.5, rel=1e-12)
    assert smallest == pytest.approx(2 ** -24 / largest, rel=1e-6)


def test_thresholds_are_overridable():
    model = planted_model()
    assert find_degenerate_heads(model, max_condition=100.) == [[1, 3], [0, 4], [2]]
    assert find_degenerate_heads(model, max_eigenvalue_below=0., max_condition=float('inf')) == [[], [], []]


def test_pruned_output_equals_zeroed_value_columns():
    model = planted_model()
    pruned = prune_heads(model)
    assert pruned.heads_per_layer == (3, 3, 2)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for (layer, head) in PLANTED:
            reference.blocks[layer].value.weight[:, head * 16:(head + 1) * 16] = 0
    x = torch.randn(3, 3, 12, 10)
    with torch.no_grad():
        out, ref, unpruned = pruned(x), reference.double()(x.double()), model(x)
    assert_network_float32_close(out, ref, sa_model_reduction_lengths(model, 6 * 5))
    assert not torch.allclose(out, unpruned, atol=1e-3)  # the heads did contribute before


def test_prune_state_dict_keeps_the_right_heads():
    model = planted_model()
    sd, kept = prune_state_dict(model.state_dict(), [[1], [0, 4], [2]], model.heads_per_layer, 16)
    assert kept == (3, 3, 2)
    assert torch.equal(sd['blocks.1.attn.position.centers'], model.blocks[1].attn.position.centers[[1, 2, 3]])
    factors = model.blocks[0].attn.position.precision_factors
    assert torch.equal(sd['blocks.0.attn.position.precision_factors'], factors[[0, 2, 3]])
    value = model.blocks[1].value.weight
    assert torch.equal(sd['blocks.1.value.weight'], torch.cat([value[:, 16:32], value[:, 32:48], value[:, 48:64]], 1))


def test_prune_errors():
    """The layers are counted from 1 in the messages, as sa-vision-prune lists them ('layer 1: eigenvalues ...')."""
    model = planted_model()
    with pytest.raises(ValueError, match='layers'):
        prune_state_dict(model.state_dict(), [[0]], model.heads_per_layer, 16)
    with pytest.raises(ValueError, match='would leave layer 1 without any head'):
        prune_state_dict(model.state_dict(), [[0, 1, 2, 3], [], []], model.heads_per_layer, 16)
    with pytest.raises(ValueError, match=r'layer 3 has head indices 0-2 \(heads 1-3\), cannot prune indices \[7\]'):
        prune_state_dict(model.state_dict(), [[], [], [7]], model.heads_per_layer, 16)


@pytest.mark.parametrize('thresholds, message', [
    (dict(max_condition=-5.), 'every condition number is at least 1'),
    (dict(max_condition=0.5), 'every condition number is at least 1'),
    (dict(max_eigenvalue_below=-1e-5), 'negative bound'),
])
def test_thresholds_that_mark_every_head_or_none_are_refused(thresholds, message):
    """A condition number is at least 1, so a bound below it marks every head: refused, not pruned to one head
    per layer."""
    from sa_vision.research.pruning import PruningError, select_heads_to_prune
    with pytest.raises(PruningError, match=message):
        select_heads_to_prune(planted_model(), **thresholds)


@pytest.mark.parametrize('kind', ['quadratic', 'learned', 'content'])
def test_prune_other_kinds(kind):
    torch.manual_seed(0)
    model = timm.create_model(f'sa_{dict(quadratic="quadratic", learned="learned", content="content")[kind]}_cifar',
                              **SMALL).eval()
    pruned = prune_heads(model, [[0], [], [1, 2]])
    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference.blocks[0].value.weight[:, 0:16] = 0
        reference.blocks[2].value.weight[:, 16:48] = 0
        x = torch.randn(2, 3, 8, 8)
        assert_network_float32_close(pruned(x), reference.double()(x.double()), sa_model_reduction_lengths(model, 16))


def test_pruned_cifar10_weights_are_labelled_as_the_heads_they_keep(tmp_path, capsys):
    """sa-vision-prune labels its output by the pruned model, not its source: CIFAR-10 weights pruned to the paper's
    layout are sa_gen_pruned's registered weights (tag cifar10: timm.create_model('sa_gen_pruned') loads them
    strictly), pruned otherwise they are custom; the printed create_model line says the same."""
    from sa_vision.cli import prune as prune_script
    from sa_vision.train.checkpoint import read_checkpoint
    torch.manual_seed(0)
    source = tmp_path / 'full.pth'
    torch.save({'version': 2, 'arch': 'sa_gen_cifar', 'model_args': {}, 'dataset': 'torch/cifar10',
                'state_dict': timm.create_model('sa_gen_cifar').state_dict()}, source)
    paper_layout = [','.join(map(str, range(1, 10 - k))) for k in PRUNED_HEADS_PER_LAYER]  # heads from 1
    for heads, tag in ((paper_layout, 'cifar10'), (['1', '', '', '', '', ''], 'cifar10_custom')):
        out = tmp_path / f'{len(heads[0])}.safetensors'
        assert prune_script.main([str(source), '--heads', *heads, '--out', str(out)]) == 0
        printed = capsys.readouterr().out
        assert read_checkpoint(out).meta['pretrained_cfg']['tag'] == tag and f"tag='{tag}'" in printed, printed
        if tag == 'cifar10':  # the registered model's weights indeed
            timm.create_model('sa_gen_pruned').load_state_dict(read_checkpoint(out).state_dict, strict=True)


@pytest.mark.slow
def test_paper_pruning_loads_strictly_into_sa_gen_pruned():
    model = timm.create_model('sa_gen_cifar')
    counts = [9 - k for k in PRUNED_HEADS_PER_LAYER]
    assert counts == [2, 4, 1, 2, 6, 0]
    sd, kept = prune_state_dict(model.state_dict(), [list(range(9 - c, 9)) for c in counts],
                                model.heads_per_layer, model.embed_dim)
    assert kept == PRUNED_HEADS_PER_LAYER
    target = timm.create_model('sa_gen_pruned')
    target.load_state_dict(sd, strict=True)
    assert sum(p.numel() for p in target.parameters()) == 9_686_916 == PAPER_RESULTS['sa_gen_pruned'].params


@pytest.mark.slow
def test_prune_script_writes_loadable_checkpoint(tmp_path):
    from sa_vision.research.analysis import load_model
    source = tmp_path / 'planted.pth'
    torch.save({'state_dict': planted_model().state_dict()}, source)
    out = tmp_path / 'pruned.safetensors'
    subprocess.run([*command('prune'), str(source), '--out', str(out)],
                   check=True, capture_output=True)
    model = load_model(str(out))
    assert model.heads_per_layer == (3, 3, 2)
    assert find_degenerate_heads(model) == [[], [], []]


@pytest.mark.parametrize('suffix', ['.safetensors', '.pth'])
@pytest.mark.parametrize('name', ['sa_quadratic_cifar', 'sa_learned_cifar', 'sa_gen_cifar'])
def test_pruned_file_of_any_kind_loads_with_its_kind(tmp_path, name, suffix):
    """save_pruned keeps the attention kind: the file loads (strictly) as the kind's model with the kept heads."""
    from sa_vision.research.analysis import attention_layers, load_model
    from sa_vision.research.pruning import save_pruned
    torch.manual_seed(0)
    model = timm.create_model(name, **SMALL).eval()
    pruned = prune_heads(model, [[0], [], [1, 2]])
    path = tmp_path / 'not' / 'there' / f'pruned{suffix}'  # its folder is created, as torch.save's users expect
    save_pruned(pruned, path, [[0], [], [1, 2]])
    loaded = load_model(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == usual_file_mode()
    assert loaded.heads_per_layer == (3, 5, 1)
    assert attention_layers(loaded)[0].kind == attention_layers(model)[0].kind
    for key, value in pruned.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def planted_model_with_a_dead_layer():
    """planted_model() whose last layer has only degenerate heads; head 1 is the least degenerate (largest
    eigenvalue 1e-8, against 1e-12 and 0)."""
    model = planted_model()
    with torch.no_grad():
        model.blocks[2].attn.position.precision_factors.copy_(torch.zeros(3, 2, 2))
        model.blocks[2].attn.position.precision_factors[0] = torch.eye(2) * 1e-6
        model.blocks[2].attn.position.precision_factors[1] = torch.eye(2) * 1e-4
    return model


def test_a_layer_of_degenerate_heads_keeps_its_least_degenerate_head():
    from sa_vision.research.pruning import select_heads_to_prune
    model = planted_model_with_a_dead_layer()
    assert find_degenerate_heads(model) == [[1], [0, 4], [0, 1, 2]]
    assert select_heads_to_prune(model) == [[1], [0, 4], [0, 2]]


def _run_prune_script(*args):
    return subprocess.run([*command('prune'), *map(str, args)],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS='1'))


def test_heads_given_to_the_prune_command_are_numbered_from_1_as_the_figures_number_them(tmp_path, capsys):
    """--heads 2 removes the head the figures label "head 2": the second one (index 1); the printout of the
    automatic choice numbers them the same way (pruning.json: tests/test_reproduce.py)."""
    from sa_vision.research.analysis import load_model
    from sa_vision.research.pruning import numbered_heads
    model = planted_model()
    source = tmp_path / 'planted.pth'
    torch.save({'state_dict': model.state_dict()}, source)
    status, _, err = command_here(capsys, 'prune', source, '--heads', '2', '1,5', '', '--out', tmp_path / 'p.pth')
    assert status == 0, err
    pruned = load_model(str(tmp_path / 'p.pth'))
    for layer, kept in enumerate(([0, 2, 3], [1, 2, 3], [0, 1, 2])):
        source_centers = model.blocks[layer].attn.position.centers
        assert torch.equal(pruned.blocks[layer].attn.position.centers, source_centers[kept]), layer
    assert numbered_heads([[1], [0, 4], []]) == [[2], [1, 5], []]
    # the file records the heads removed as they were given: numbered from 1, and says so
    saved = torch.load(tmp_path / 'p.pth', weights_only=True)
    assert (saved['pruned_heads'], saved['heads_numbered_from']) == ([[2], [1, 5], []], 1)
    status, _, err = command_here(capsys, 'prune', source, '--heads', '2', '1,5', '', '--out',
                                  tmp_path / 'p.safetensors')
    from safetensors import safe_open
    with safe_open(str(tmp_path / 'p.safetensors'), 'pt') as f:
        assert json.loads(f.metadata()['pruned_heads']) == [[2], [1, 5], []], err
    # the automatic choice prints the planted heads by number: layer 1's index 1, layer 2's indices 0 and 4
    status, out, err = command_here(capsys, 'prune', source, '--out', tmp_path / 'auto.pth')
    assert status == 0 and '-> prune [2]' in out and '-> prune [1, 5]' in out, out + err


def test_pruning_keeps_the_arguments_the_weights_do_not_show(tmp_path, capsys):
    """A model built with another pooling and LayerNorm eps than the defaults (arguments no weight shows) pruned of
    nothing is the same model: the same logits, where the defaults (avg, 1e-12) gave others. Its training's drop
    path and initialisation are not kept: the fine-tuning recipe sets them."""
    from safetensors.torch import save_file

    from sa_vision.train.checkpoint import read_checkpoint
    args = dict(SMALL, global_pool='max', norm_eps=1e-5, drop_path_rate=0.1, pos_init='paper')
    torch.manual_seed(0)
    model = timm.create_model('sa_gen_cifar', **args).eval()
    source = tmp_path / 'source.safetensors'
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(source),
              metadata={'arch': 'sa_gen_cifar', 'model_args': json.dumps(args)})
    status, _, err = command_here(capsys, 'prune', source, '--heads', '', '', '', '--out', tmp_path / 'p.pth')
    assert status == 0, err
    pruned = read_checkpoint(tmp_path / 'p.pth')
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(pruned.create_model()(x), model(x))
    # what shapes no output (the drop rates, the initialisation) is left to the recipe that fine-tunes it
    assert not {'drop_path_rate', 'pos_init'} & set(pruned.model_args), pruned.model_args


def test_pruning_an_hf_hub_name_keeps_its_preprocessing_as_its_local_folder_does(tmp_path):
    """hf-hub:<repo> of a kept Fashion-MNIST model (from the Hub cache, offline) is pruned as its local-dir: folder:
    the same file, its border, input size, mean / std and label names (they were CIFAR-10's defaults, unpadded)."""
    from sa_vision.train.checkpoint import read_checkpoint
    kept = os.path.join(ROOT, 'zoo', 'fashion-mnist-cpu', 'sa_gen_cifar')
    revision = '0123456789abcdef0123456789abcdef01234567'
    snapshot = tmp_path / 'cache' / 'models--audit--gen' / 'snapshots' / revision
    snapshot.mkdir(parents=True)
    for name in ('config.json', 'model.safetensors'):
        shutil.copy(os.path.join(kept, name), snapshot / name)
    (snapshot.parent.parent / 'refs').mkdir()
    (snapshot.parent.parent / 'refs' / 'main').write_text(revision)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS='1', HF_HUB_OFFLINE='1',
               HF_HUB_CACHE=str(tmp_path / 'cache'), HF_HOME=str(tmp_path / 'hf_home'))
    for source, out in (('hf-hub:audit/gen', 'hub.pth'), (f'local-dir:{kept}', 'local.pth')):
        proc = subprocess.run([*command('prune'), source, '--out', str(tmp_path / out)], capture_output=True,
                              text=True, env=env)
        assert proc.returncode == 0, proc.stderr
    hub, local = (read_checkpoint(tmp_path / out) for out in ('hub.pth', 'local.pth'))
    assert hub.model_args == local.model_args and hub.model_args['input_padding'] == 2
    assert hub.preprocessing == local.preprocessing and hub.dataset == local.dataset == 'fashion-mnist'
    assert hub.create_model().pretrained_cfg['label_names'][0] == 'T-shirt/top'


@pytest.mark.slow
def test_prune_script_keeps_a_head_in_every_layer_and_reports_user_errors(tmp_path, capsys):
    from sa_vision.research.analysis import load_model
    source = tmp_path / 'dead_layer.pth'
    torch.save({'state_dict': planted_model_with_a_dead_layer().state_dict()}, source)
    proc = _run_prune_script(source, '--out', tmp_path / 'pruned.safetensors')
    assert proc.returncode == 0, proc.stderr
    assert 'keeps its least degenerate head 2' in proc.stdout  # index 1: heads are numbered from 1
    assert load_model(str(tmp_path / 'pruned.safetensors')).heads_per_layer == (3, 3, 1)
    # a user's mistake: one line on stderr, status 2, no traceback
    for args, message in (((source, '--heads', '1', '', '1,2,3'), 'without any head'),
                          ((source, '--heads', 'a'), 'one comma list of heads per layer'),
                          ((source, '--heads', '1', '2'), '--heads: 2 list(s) of heads but the model has 3 layers'),
                          ((source, '--heads', '', '0', ''), '--heads: layer 2 has heads 1-5 (numbered from 1'),
                          ((source, '--heads', '', '', '4'), '--heads: layer 3 has heads 1-3'),
                          ((source, '--heads', '2,2', '', ''), '--heads: layer 1: head(s) [2] named more than once'),
                          (('resnet18_cifar',), 'no PositionalAttention layer'),
                          ((tmp_path / 'missing.pth',), 'does not exist')):
        status, _, err = command_here(capsys, 'prune', *args, '--out', tmp_path / 'x.pth')
        assert status == 2 and err.startswith('error: ') and message in err and err.count('\n') == 1, err
    status, _, err = command_here(capsys, 'prune', 'sa_learned_cifar', '--out', tmp_path / 'x.pth')
    assert status == 2 and 'name the heads to prune with --heads' in err, err


def test_a_pruned_kept_model_keeps_its_preprocessing_and_timm_builds_it_from_the_printed_lines(tmp_path, capsys):
    """A kept zoo model (Fashion-MNIST, 28x28 with the border inside the model) pruned to a .safetensors file: its
    data config and dataset are the source's as timm reads them from the Hub folder (so sa-vision-validate picks
    Fashion-MNIST and timm's transform feeds it 28x28 images with their mean / std), and the create_model call and
    train.py arguments printed build it in timm, as timm's train.py passes them (ParseKwargs, its create_model)."""
    import shlex
    from argparse import ArgumentParser

    from PIL import Image
    from timm.utils import ParseKwargs

    from sa_vision.cli import prune as prune_script
    from sa_vision.train.checkpoint import read_checkpoint
    source = os.path.join(ROOT, 'zoo', 'fashion-mnist-cpu', 'sa_gen_cifar')
    kept = timm.create_model(f'local-dir:{source}', pretrained=True).eval()
    out = tmp_path / 'pr' / 'pruned.safetensors'
    assert prune_script.main([source, '--out', str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    def data_config(model):  # JSON gives lists where timm's defaults are tuples
        return {k: tuple(v) if isinstance(v, list) else v for k, v in
                timm.data.resolve_data_config({}, model=model).items()}
    kept_cfg = data_config(kept)
    ckpt = read_checkpoint(out)
    assert ckpt.dataset == 'fashion-mnist' and ckpt.model_args['input_padding'] == 2
    pruned = ckpt.create_model()
    assert data_config(pruned) == kept_cfg
    assert pruned.pretrained_cfg['label_names'] == kept.pretrained_cfg['label_names']

    call = next(line for line in lines if line.startswith('timm: ')).split(':', 1)[1].strip()
    from_call = eval(call, {'timm': timm}).eval()  # noqa: S307  the line the command printed
    assert data_config(from_call) == kept_cfg
    # what timm says the weights are: Fashion-MNIST's names and tag, not the registered cfg's CIFAR-10 ones
    for model in (from_call, pruned):
        assert list(model.pretrained_cfg['label_names']) == list(kept.pretrained_cfg['label_names'])
        assert model.pretrained_cfg['tag'] == kept.pretrained_cfg['tag'] == 'fashion_mnist_custom'
    args = shlex.split(next(line for line in lines if line.startswith('timm train.py: ')).split(':', 1)[1])
    parser = ArgumentParser()  # the arguments of timm's train.py that the line gives, as train.py parses them
    parser.add_argument('--model')
    parser.add_argument('--initial-checkpoint')
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs)
    parser.add_argument('--in-chans', type=int)
    parser.add_argument('--num-classes', type=int)
    parser.add_argument('--gp')
    parser.add_argument('--input-size', type=int, nargs=3)
    parser.add_argument('--mean', type=float, nargs='+')
    parser.add_argument('--std', type=float, nargs='+')
    parser.add_argument('--crop-pct', type=float)
    train = parser.parse_args(args)
    from_train = timm.create_model(train.model, in_chans=train.in_chans, num_classes=train.num_classes,
                                   global_pool=train.gp, checkpoint_path=train.initial_checkpoint,
                                   **train.model_kwargs).eval()
    assert (train.input_size, train.mean, train.std) == (
        list(kept_cfg['input_size']), list(kept_cfg['mean']), list(kept_cfg['std']))

    # the same logits as the kept model with the pruned heads' Value columns zeroed, on 28x28 images fed by timm's
    # transform of the kept folder's config (the border inside both models)
    reference = copy.deepcopy(kept).double()
    with torch.no_grad():
        for block, kept_block in zip(reference.blocks, pruned.blocks):
            centers, left = block.attn.position.centers, kept_block.attn.position.centers.double()
            for head in range(len(centers)):
                if not any(torch.equal(centers[head], c) for c in left):
                    width = kept.embed_dim
                    block.value.weight[:, head * width:(head + 1) * width] = 0
    assert sum(pruned.heads_per_layer) < sum(kept.heads_per_layer)  # the kept sa_gen_cifar has a degenerate head
    torch.manual_seed(0)
    images = [Image.fromarray(a) for a in torch.randint(0, 256, (4, 28, 28), dtype=torch.uint8).numpy()]
    x = torch.stack([timm.data.create_transform(**kept_cfg)(im.convert('RGB')) for im in images])
    with torch.no_grad():
        expected = reference(x.double())
        for model in (pruned, from_call, from_train):
            assert_network_float32_close(model(x), expected, sa_model_reduction_lengths(kept, 16 * 16))


def test_pruning_a_bare_weights_file_records_no_preprocessing_and_names_its_folder(tmp_path, capsys):
    """A Hub folder's model.safetensors alone says nothing of how it was fed: the pruned file states no CIFAR-10
    preprocessing it never had (its loaders use the architecture's defaults, as for its source), and the warning
    names the folder whose config.json does."""
    from sa_vision.cli import prune as prune_script
    from sa_vision.train.checkpoint import read_checkpoint
    folder = os.path.join(ROOT, 'zoo', 'fashion-mnist-cpu', 'sa_gen_cifar')
    out = tmp_path / 'pruned.safetensors'
    assert prune_script.main([os.path.join(folder, 'model.safetensors'), '--out', str(out)]) == 0
    captured = capsys.readouterr()
    assert 'states no preprocessing' in captured.err and f'local-dir:{folder}' in captured.err, captured.err
    assert next(line for line in captured.out.splitlines() if line.startswith('wrote')).endswith('(sa_gen_pruned)')
    ckpt = read_checkpoint(out)
    assert ckpt.preprocessing == {} and ckpt.dataset == ''


def test_out_never_writes_into_the_weights_it_prunes(tmp_path, capsys):
    """--out naming the file pruned, or a file in the Hub folder pruned, would replace the source's weights (a run's
    last.pth.tar then no longer resumes), and a run's other checkpoint its best: refused before anything is
    written, the source left as it was."""
    import shutil

    from sa_vision.cli import prune as prune_script
    from sa_vision.errors import run_cli
    source = tmp_path / 'full.pth'
    torch.save(timm.create_model('sa_gen_cifar', embed_dim=16, depth=1, mlp_hidden_dim=32).state_dict(), source)
    folder = tmp_path / 'hub'
    shutil.copytree(os.path.join(ROOT, 'zoo', 'fashion-mnist-cpu', 'sa_gen_cifar'), folder)
    run = tmp_path / 'run'  # a run's two checkpoints: pruning one into the other replaced the run's best
    run.mkdir()
    for name in ('last.pth.tar', 'model_best.pth.tar'):
        shutil.copy(source, run / name)
    kept = {path: path.read_bytes() for path in (source, folder / 'model.safetensors', *run.iterdir())}
    for given, out in ((str(source), source), (f'local-dir:{folder}', folder / 'model.safetensors'),
                       (str(folder), folder / 'pruned.safetensors'), (str(run / 'last.pth.tar'),
                                                                       run / 'model_best.pth.tar')):
        assert run_cli(prune_script.main, [given, '--heads', '1', '--out', str(out)]) == 2  # refused before --heads
        assert 'would write into the weights it prunes' in capsys.readouterr().err
    # other weights pruned into a run's checkpoint name replaced that run's best as well
    assert run_cli(prune_script.main, [str(source), '--heads', '1', '--out', str(run / 'model_best.pth.tar')]) == 2
    assert 'would replace a checkpoint of the training run in' in capsys.readouterr().err
    assert all(path.read_bytes() == data for path, data in kept.items())
    assert not (folder / 'pruned.safetensors').exists()


@pytest.mark.slow
def test_pruning_a_run_on_an_unnamed_image_folder_keeps_its_label_names_and_folder(tmp_path, caplog, capsys):
    """A run of --dataset '' on an image folder of five classes is pruned into weights of that folder: tagged as an
    image folder's ('folder', '_custom' as pruned), with its classes' names, so that sa-vision-validate asks for the
    folder rather than reading CIFAR-10, as it does for the run itself."""
    from helpers import train_here
    from PIL import Image

    from sa_vision.hub.labels import weights_label
    from sa_vision.train.checkpoint import read_checkpoint
    from sa_vision.train.data import trained_dataset
    names = ['ant', 'bee', 'cat', 'dog', 'eel']
    for split in ('train', 'validation'):
        for k, name in enumerate(names):
            (tmp_path / 'data' / split / name).mkdir(parents=True)
            Image.new('RGB', (8, 8), (50 * k, 30, 60)).save(tmp_path / 'data' / split / name / '0.png')
    status, log = train_here(caplog, capsys, '--dataset', '', '--data-dir', tmp_path / 'data',
                             '--model-kwargs', 'embed_dim=16', 'depth=2', 'heads_per_layer=2', 'mlp_hidden_dim=32',
                             '--epochs', 1, '-b', 5, '--workers', 0, '--output', tmp_path, '--experiment', 'run')
    assert status == 0, log[-2000:]
    for suffix in ('.safetensors', '.pth'):
        out = tmp_path / f'pruned{suffix}'
        status, printed, err = command_here(capsys, 'prune', tmp_path / 'run' / 'last.pth.tar', '--out', out,
                                            '--heads', '1', '1')
        assert status == 0 and 'for folder_custom)' in printed, printed + err
        pruned = read_checkpoint(out)
        assert trained_dataset(pruned.meta) == '' and weights_label(pruned).tag == 'folder_custom', pruned.meta
        assert list(pruned.create_model().pretrained_cfg['label_names']) == names, pruned.meta
        status, printed, err = command_here(capsys, 'validate', '--checkpoint', out)
        assert status != 0 and 'trained on an image folder' in printed + err and 'cifar10' not in printed + err, \
            printed + err
