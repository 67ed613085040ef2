""" timm's own helpers where their semantics match ours, without changing a state dict: weights exported by
sa_vision 0.1 load and give the same logits, and each helper's use is checked against a plain reference """
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from timm.layers import Mlp

import sa_vision  # noqa: F401  registers the models
from sa_vision.layers import GeluMlp

WEIGHTS_V0_1 = Path(__file__).resolve().parent / 'data' / 'weights_v0_1'
EXPECTED = load_file(str(WEIGHTS_V0_1 / 'expected_logits.safetensors'))


@pytest.mark.parametrize('name', sorted(k for k in EXPECTED if k != 'input'))
def test_weights_exported_by_0_1_load_with_the_same_logits(name):
    """Hub folders written by 0.1's code (config.json + model.safetensors, timm's save_for_hf) load strictly and
    give the logits 0.1 computed from them: no parameter changed, and keys renamed since (``spreads``) load under
    their old names. Both in float64, so the tolerance is rounding of float64 (1e-10), whatever CPU runs it."""
    model = timm.create_model(f'local-dir:{WEIGHTS_V0_1 / name}', pretrained=True).eval().double()
    with torch.no_grad():
        logits = model(EXPECTED['input'])
    torch.testing.assert_close(logits, EXPECTED[name], rtol=1e-10, atol=1e-10)


def test_mlp_is_timms_mlp_with_the_original_dropout_and_the_plain_gradient():
    torch.manual_seed(0)
    mlp = GeluMlp(6, 10, drop=0.3)
    assert isinstance(mlp, Mlp) and sorted(mlp.state_dict()) == ['fc1.bias', 'fc1.weight', 'fc2.bias', 'fc2.weight']
    assert mlp.drop1.p == 0. and mlp.drop2.p == 0.3  # the original drops out only after the second Linear
    mlp.eval()
    x = torch.randn(4, 5, 6, dtype=torch.float64, requires_grad=True)
    mlp.double()
    with torch.enable_grad():
        mlp.train()
        mlp.drop2.p = 0.  # compare the memory-saving training forward with the plain composition
        out = mlp(x)
        reference = F.linear(F.gelu(F.linear(x, mlp.fc1.weight, mlp.fc1.bias)), mlp.fc2.weight, mlp.fc2.bias)
    torch.testing.assert_close(out, reference)
    grads = torch.autograd.grad(out.square().sum(), [x, *mlp.parameters()])
    expected = torch.autograd.grad(reference.square().sum(), [x, *mlp.parameters()])
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)


def test_content_attention_without_fused_sdpa_is_the_same(monkeypatch):
    """With timm's fused-attention switch off the content kind runs the explicit formula: same output."""
    torch.manual_seed(0)
    model = timm.create_model('sa_content_cifar', embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=24).eval()
    model.double()
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    with torch.no_grad():
        fused = model(x)
        for block in model.blocks:
            block.attn.fused_attn = False
        explicit = model(x)
    torch.testing.assert_close(explicit, fused)


def test_drop_path_rate_one_drops_every_sample_without_dividing_by_zero():
    torch.manual_seed(0)
    model = timm.create_model('sa_quadratic_cifar', embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=24,
                              drop_path_rate=1.0).train()
    out = model(torch.randn(2, 3, 8, 8))
    assert torch.isfinite(out).all()
    block = model.blocks[-1]  # linear rates: the last block drops with probability 1
    x = torch.randn(4, 4, 2, 16)
    assert torch.equal(block.drop_path1(x), torch.zeros_like(x))


def test_the_private_timm_helpers_of_the_pinned_range_exist():
    """pyproject pins timm below 1.1 for these two; a timm that moves them fails here, not in a user's run."""
    from timm.data.dataset_factory import _search_split
    from timm.models._features import feature_take_indices
    assert feature_take_indices(6, 3) == ([3, 4, 5], 5)
    assert callable(_search_split)


def test_weights_in_the_released_codes_embedding_layout_load_through_timm(tmp_path):
    """A Hub folder whose embedding is the original Linear (paper_reference's layout) loads with
    pretrained=True through checkpoint_filter_fn and gives the logits of the model it was converted from."""
    import json

    from safetensors.torch import save_file

    from sa_vision.research.paper_reference import paper_state_dict
    source = WEIGHTS_V0_1 / 'sa_quadratic_cifar'
    model = timm.create_model(f'local-dir:{source}', pretrained=True).eval()
    original = paper_state_dict(model.state_dict())
    assert 'patch_embed.weight' in original and 'patch_embed.proj.weight' not in original
    folder = tmp_path / 'original_layout'
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in original.items()}, str(folder / 'model.safetensors'))
    (folder / 'config.json').write_text(json.dumps(json.loads((source / 'config.json').read_text())))
    converted = timm.create_model(f'local-dir:{folder}', pretrained=True).eval().double()
    with torch.no_grad():  # float64 both sides: the conversion is a permutation, exact
        torch.testing.assert_close(converted(EXPECTED['input']), EXPECTED['sa_quadratic_cifar'], rtol=1e-10, atol=1e-10)
