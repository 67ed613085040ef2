"""The registered models: exact sizes from the paper's Table 1, shapes, errors and the timm API."""
import copy
import socket

import pytest
import timm
import timm.optim
import torch
from float32_bounds import assert_network_float32_close, sa_model_reduction_lengths
from helpers import BF16_EPS, CONTENT_FREE_MODELS, SA_MODELS
from torch import nn

import sa_vision  # noqa: F401  (registers the models)
from sa_vision.layers import check_image_batch_shape
from sa_vision.models._pretrained import PUBLISHED
from sa_vision.research.paper_reference import PaperDenseSA

# the paper's Table 1 (Sec. 4.2), at 10 classes
PAPER_PARAMETERS = {
    'sa_quadratic_cifar': 12_086_844,
    'sa_gen_cifar': 12_087_006,
    'sa_gen_pruned': 9_686_916,
    'sa_learned_cifar': 12_278_682,
    'resnet18_cifar': 11_173_962,
}
SMALL = dict(embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=24)


def small_model(name, **kwargs):
    if name == 'sa_gen_pruned':
        kwargs.setdefault('heads_per_layer', (2, 3))
    return timm.create_model(name, **dict(SMALL, **kwargs))


@pytest.mark.parametrize('name', sorted(PAPER_PARAMETERS))
def test_parameter_count_matches_the_paper(name):
    model = timm.create_model(name)
    assert sum(p.numel() for p in model.parameters()) == PAPER_PARAMETERS[name]


def test_content_variant_size():
    # learned model plus Linear(400 -> 9*400) query and key maps in each of the 6 layers
    model = timm.create_model('sa_content_cifar')
    expected = PAPER_PARAMETERS['sa_learned_cifar'] + 6 * 2 * (400 * 3600 + 3600)
    assert sum(p.numel() for p in model.parameters()) == expected


def test_pruned_model_has_its_heads_per_layer():
    model = timm.create_model('sa_gen_pruned')
    assert [blk.attn.num_heads for blk in model.blocks] == [7, 5, 8, 7, 3, 9]
    assert [blk.value.in_features for blk in model.blocks] == [h * 400 for h in (7, 5, 8, 7, 3, 9)]


@pytest.mark.parametrize('name', SA_MODELS)
@pytest.mark.parametrize('size', [(32, 32), (24, 40)], ids=lambda s: f'{s[0]}x{s[1]}')
def test_forward_backward_shapes(name, size):
    model = small_model(name, num_classes=7)
    x = torch.randn(3, 3, *size, requires_grad=True)
    features = model.forward_features(x)
    assert features.shape == (3, size[0] // 2, size[1] // 2, SMALL['embed_dim'])
    logits = model.forward_head(features)
    assert logits.shape == (3, 7)
    assert model.forward_head(features, pre_logits=True).shape == (3, SMALL['embed_dim'])
    logits.sum().backward()
    assert x.grad.shape == x.shape
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize('name', SA_MODELS)
@pytest.mark.parametrize('train', [True, False], ids=('train', 'eval'))
def test_an_empty_batch_gives_empty_logits_and_gradients(name, train):
    """As every torch module: a batch of 0 images (the last shard of a split, a filter that kept nothing) gives
    0 rows of logits in training and in evaluation, with and without autograd (the per-head CPU path chunked the
    batch and indexed the first of no chunks)."""
    model = small_model(name, num_classes=7).train(train)
    x = torch.randn(0, 3, 8, 8, requires_grad=True)
    logits = model(x)
    assert logits.shape == (0, 7)
    logits.sum().backward()
    assert x.grad.shape == x.shape
    with torch.no_grad():
        assert model(x).shape == (0, 7)


def test_embedding_is_space_to_depth_then_linear():
    """The 2x2 stride-2 convolution equals the original space-to-depth + Linear(12 -> D), channel
    index 6*di + 3*dj + c."""
    model = small_model('sa_quadratic_cifar')
    embed = model.patch_embed
    x = torch.randn(2, 3, 8, 12)
    blocks = PaperDenseSA.blocks_of_pixels(x)  # the independent reference's space-to-depth
    # the original order, built element by element
    b, i, j, di, dj, c = 1, 2, 3, 1, 0, 2
    assert blocks[b, i, j, 6 * di + 3 * dj + c] == x[b, c, 2 * i + di, 2 * j + dj]
    expected = blocks @ embed.linear_weight().T + embed.proj.bias  # B, h, w, D
    torch.testing.assert_close(embed(x), expected.permute(1, 2, 0, 3))  # the embedding is grid-major
    # and the stored kernel is the equivalent 2x2 stride-2 convolution
    torch.testing.assert_close(embed.proj(x).permute(0, 2, 3, 1), expected)


@pytest.mark.parametrize('shape, message', [
    ((1, 3, 31, 32), 'even'),
    ((1, 3, 32, 33), 'even'),
    ((1, 1, 32, 32), 'expected 3 input channels'),
    ((3, 32, 32), '3-D tensor'),
])
def test_wrong_input_shape_names_the_expected_shape(shape, message):
    model = small_model('sa_quadratic_cifar')
    with pytest.raises(ValueError, match=message) as excinfo:
        model(torch.randn(shape))
    assert '(B, 3, H, W)' in str(excinfo.value)
    with pytest.raises(ValueError) as of_shape:  # asked of the shape alone, as sa-vision-benchmark does
        check_image_batch_shape(list(shape), 3)
    assert str(of_shape.value) == str(excinfo.value)
    check_image_batch_shape([1, 3, 32, 30], 3)


def test_in_chans_and_num_classes():
    model = small_model('sa_learned_cifar', in_chans=1, num_classes=4)
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 4)


def test_inconsistent_heads_per_layer_is_an_error():
    with pytest.raises(ValueError, match='depth'):
        timm.create_model('sa_quadratic_cifar', depth=3, heads_per_layer=(1, 2))


def test_a_global_pool_timm_does_not_have_here_is_an_error_at_creation_and_reset():
    with pytest.raises(ValueError, match="'avg', 'max', 'avgmax' or ''.*got 'token'; these models have no class token"):
        timm.create_model('sa_quadratic_cifar', global_pool='token')
    model = small_model('sa_quadratic_cifar')
    with pytest.raises(ValueError, match="got 'map'"):
        model.reset_classifier(5, 'map')
    model.reset_classifier(5, '')
    assert model.global_pool == '' and model.forward_head(torch.zeros(2, 3, 3, model.embed_dim)).shape == (2, 3, 3, 5)


def test_max_and_avgmax_pool_the_grid_as_timms_poolings_do():
    model = small_model('sa_quadratic_cifar').eval()
    grid = torch.randn(2, 3, 4, model.embed_dim)  # B x h x w x D, as forward_features gives it
    flat = grid.flatten(1, 2)
    for pool, expected in (('avg', flat.mean(1)), ('max', flat.max(1).values),
                           ('avgmax', (flat.mean(1) + flat.max(1).values) / 2)):
        model.reset_classifier(0, pool)
        torch.testing.assert_close(model.forward_head(grid), expected)


def test_no_weight_decay_lists_gaussian_centres_and_precision_factors():
    model = small_model('sa_gen_cifar')
    expected = {f'blocks.{i}.attn.position.{p}' for i in range(2) for p in ('centers', 'precision_factors')}
    assert model.no_weight_decay() == expected
    optimizer = timm.optim.create_optimizer_v2(model, 'sgd', lr=0.1, weight_decay=1e-4)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in optimizer.param_groups if g['weight_decay'] > 0 for p in g['params']}
    assert not decayed & expected
    assert 'blocks.0.value.weight' in decayed


def test_reset_classifier_and_global_pool():
    model = small_model('sa_quadratic_cifar').eval()
    x = torch.randn(2, 3, 16, 16)
    model.reset_classifier(5)
    assert model(x).shape == (2, 5) and model.get_classifier().out_features == 5
    model.reset_classifier(0, '')
    assert model(x).shape == (2, 8, 8, SMALL['embed_dim'])
    with pytest.raises(ValueError, match='global_pool'):
        model.reset_classifier(0, 'token')


def test_forward_intermediates_and_features_only():
    model = small_model('sa_quadratic_cifar', depth=3, heads_per_layer=2).eval()
    x = torch.randn(2, 3, 16, 24)
    final, intermediates = model.forward_intermediates(x)
    assert len(intermediates) == 3
    assert all(t.shape == (2, SMALL['embed_dim'], 8, 12) for t in intermediates)
    torch.testing.assert_close(final, model.forward_features(x))
    torch.testing.assert_close(intermediates[-1], final.permute(0, 3, 1, 2))
    # as the ViT family's tokens (B x N x D): the last layer's grid, row by row
    tokens = model.forward_intermediates(x, indices=[2], output_fmt='NLC', intermediates_only=True)[0]
    assert tokens.shape == (2, 8 * 12, SMALL['embed_dim'])
    torch.testing.assert_close(tokens[:, 12 * 3 + 5], final[:, 3, 5])
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW', 'NHWC' or 'NLC', got 'NCL'"):
        model.forward_intermediates(x, output_fmt='NCL')
    features = timm.create_model('sa_quadratic_cifar', features_only=True, **dict(SMALL, depth=3, heads_per_layer=2))
    assert features.feature_info.reduction() == [2, 2, 2]
    assert len(features(x)) == 3


@pytest.mark.parametrize('feature_cls', ['hook', 'fx', 'list'])
def test_features_only_through_hooks_or_fx_is_refused_naming_the_getter(feature_cls):
    """timm's hook / FX / list wrappers would return the blocks' grid-major H/2 x W/2 x B x D tensors as if they
    were feature maps; the getter (forward_intermediates) gives B x D x H/2 x W/2."""
    with pytest.raises(ValueError, match=rf"feature_cls='getter', the default\), not feature_cls='{feature_cls}'"):
        small_model('sa_quadratic_cifar', features_only=True, feature_cls=feature_cls)
    from timm.models._features import FeatureGetterNet
    for getter in ('getter', 'GETTER', FeatureGetterNet, type('MyGetter', (FeatureGetterNet,), {})):  # as timm takes
        features = small_model('sa_quadratic_cifar', features_only=True, feature_cls=getter, out_indices=(0, 1))
        assert isinstance(features, FeatureGetterNet), getter
        assert [f.shape for f in features(torch.zeros(2, 3, 8, 8))] == [(2, 16, 4, 4)] * 2


def test_torchscript_of_features_only_matches_eager():
    """timm's TorchScript check covers the classifier; a backbone (features_only) scripts too (an f-string's !r
    conversion in forward_intermediates did not)."""
    features = small_model('sa_quadratic_cifar', features_only=True, out_indices=(0, 1)).eval()
    x = torch.randn(2, 3, 8, 8)
    for scripted, eager in zip(torch.jit.script(features)(x), features(x)):
        torch.testing.assert_close(scripted, eager)


def test_grad_checkpointing_keeps_outputs_and_gradients():
    model = small_model('sa_quadratic_cifar')
    x = torch.randn(2, 3, 16, 16)
    torch.manual_seed(0)
    out = model(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing()
    torch.manual_seed(0)
    out2 = model(x)
    out2.sum().backward()
    torch.testing.assert_close(out2, out)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


def test_group_matcher_separates_stem_and_layers():
    from timm.models._manipulate import group_parameters
    model = small_model('sa_quadratic_cifar')
    groups = group_parameters(model, model.group_matcher(), reverse=True)
    assert groups['patch_embed.proj.weight'] != groups['blocks.1.value.weight']


@pytest.mark.parametrize('name', SA_MODELS)
def test_torchscript_matches_eager(name):
    model = small_model(name).eval()
    scripted = torch.jit.script(model)
    x = torch.randn(2, 3, 16, 20)
    torch.testing.assert_close(scripted(x), model(x))


@pytest.mark.parametrize('name', SA_MODELS)
def test_dynamic_int8_quantization_of_the_linears_runs_near_float32(name):
    """torch's dynamic quantization swaps each nn.Linear (the learned tables' keys too) for an int8 one: the model
    still runs, within int8's rounding of the float32 logits: 10 % of the largest (2.5 % at most over three
    seeds)."""
    torch.manual_seed(0)
    model = small_model(name).eval()
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(2, 3, 16, 20)
    with torch.no_grad():
        reference, out = model(x), quantized(x)
    assert (out - reference).abs().max() <= 0.1 * reference.abs().max()


def test_default_cfg_follows_timm_conventions():
    for name in SA_MODELS + ('resnet18_cifar',):
        cfg = timm.models.get_pretrained_cfg(name).to_dict()
        assert cfg['tag'] == 'cifar10'
        # a Hub repository only once the weights are there: timm lists, and pretrained=True downloads, only real ones
        assert cfg.get('hf_hub_id') == (f'sa-vision/{name}.cifar10' if name in PUBLISHED else None)
        assert cfg['input_size'] == (3, 32, 32) and cfg['num_classes'] == 10 and cfg['crop_pct'] == 1.0
        assert cfg['mean'] == (0.4914, 0.4822, 0.4465) and cfg['std'] == (0.2023, 0.1994, 0.2010)
        assert cfg['license'] and cfg['paper_ids'] and cfg['first_conv'] and cfg['classifier']
        # the project resizes bilinearly (the digits' resize in sa_vision/train/datasets.py, the published runs'
        # config.json under docs/probes): timm's eval transform must resize the same way, not timm's bicubic default
        assert cfg['interpolation'] == 'bilinear'


def test_create_without_pretrained_never_touches_the_network(monkeypatch):
    attempts = []  # recorded, not raised: a caller's except (a Hub probe's) would swallow an error

    def no_network(*args, **kwargs):
        attempts.append(args)
        raise OSError('no network in this test')
    monkeypatch.setattr(socket.socket, 'connect', no_network)
    monkeypatch.setattr(socket, 'getaddrinfo', no_network)
    for name in SA_MODELS + ('resnet18_cifar',):
        kwargs = ({} if name == 'resnet18_cifar' else SMALL if name != 'sa_gen_pruned'
                  else dict(SMALL, heads_per_layer=(1, 2)))
        timm.create_model(name, pretrained=False, **kwargs)
    assert not attempts, f'create_model(pretrained=False) opened connections: {attempts}'


def test_resnet18_cifar_keeps_the_resolution_in_its_stem():
    model = timm.create_model('resnet18_cifar')
    assert isinstance(model.maxpool, nn.Identity)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1) and model.conv1.bias is None
    features = timm.create_model('resnet18_cifar', features_only=True)
    shapes = [f.shape[-1] for f in features(torch.randn(1, 3, 32, 32))]
    assert shapes == [32, 32, 16, 8, 4]
    assert features.feature_info.reduction() == [1, 1, 2, 4, 8]


@pytest.mark.parametrize('stem_width', [8, 32, 64])
def test_resnet18_cifar_stem_has_timms_plain_stem_width(stem_width):
    """timm's plain stem has 64 channels whatever stem_width says (stem_width sizes only its deep stems): the CIFAR
    stem keeps that width, so weights exported with a stem_width still load; timm's deep stems are refused."""
    with torch.device('meta'):
        ours = timm.create_model('resnet18_cifar', channels=(8, 16, 32, 64), stem_width=stem_width)
        timms = timm.create_model('resnet18', channels=(8, 16, 32, 64), stem_width=stem_width)
    assert ours.conv1.out_channels == ours.bn1.num_features == timms.conv1.out_channels == 64
    with pytest.raises(ValueError, match="no stem_type 'deep'.*leave stem_type at ''"):
        timm.create_model('resnet18_cifar', stem_type='deep', stem_width=stem_width)
    # timm's replace_stem_pool swaps the ImageNet stem's max-pool for a strided conv: the CIFAR stem has neither
    with pytest.raises(ValueError, match='no stem pool to replace'):
        timm.create_model('resnet18_cifar', replace_stem_pool=True)


@pytest.mark.parametrize('name', SA_MODELS)
def test_fuse_folds_value_and_proj_exactly(name):
    model = small_model(name).eval()
    x = torch.randn(2, 3, 16, 16)
    expected = copy.deepcopy(model).double()(x.double())  # the unfused model, in float64
    model.fuse()
    assert all(isinstance(blk.proj, nn.Identity) for blk in model.blocks)
    assert_network_float32_close(model(x), expected, sa_model_reduction_lengths(model, 64))


@pytest.mark.parametrize('name', CONTENT_FREE_MODELS)
def test_cached_probabilities_follow_parameter_changes(name):
    from sa_vision.layers import dense_attention
    model = small_model(name).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        first = model(x)
        torch.testing.assert_close(model(x), first, rtol=0, atol=0)  # served from the cache
        for blk in model.blocks:  # an optimizer-like in-place update of the positional parameters
            for p in blk.attn.position.parameters():
                p.add_(0.3)
        updated = model(x)
        reference = copy.deepcopy(model).double()
        with dense_attention(reference):
            reference = reference(x.double())
    assert not torch.allclose(updated, first)
    assert_network_float32_close(updated, reference, sa_model_reduction_lengths(model, 64))
    # load_state_dict copies in place too
    other = small_model(name).eval()
    with torch.no_grad():
        other(x)
        other.load_state_dict(model.state_dict())
        assert_network_float32_close(other(x), reference, sa_model_reduction_lengths(model, 64))


@pytest.mark.parametrize('name', CONTENT_FREE_MODELS)
def test_cached_probabilities_follow_edits_through_data(name):
    """``p.data.add_()`` changes neither the storage nor the ``_version`` of ``p``: the eval cache must still see
    it. The reference is a fresh model that never ran, holding the edited weights."""
    model = small_model(name).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        first = model(x)
    for blk in model.blocks:  # e.g. moving the attention centres by hand, as in an analysis notebook
        for p in blk.attn.position.parameters():
            p.data.add_(0.3)
    with torch.no_grad():
        edited = model(x)
        fresh = small_model(name).eval()
        fresh.load_state_dict(model.state_dict())
        expected = fresh(x)
    assert not torch.allclose(expected, first), 'the edit must change the output'
    torch.testing.assert_close(edited, expected, rtol=0, atol=0)


def test_eval_probabilities_are_computed_once_while_the_parameters_stay(monkeypatch):
    from sa_vision.layers import PositionalAttention
    computed = []
    compute = PositionalAttention._probs
    monkeypatch.setattr(PositionalAttention, '_probs',
                        lambda self, *args: (computed.append(self), compute(self, *args))[1])
    model = small_model('sa_gen_cifar').eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        for _ in range(3):
            model(x)
    assert len(computed) == len(model.blocks), 'the probabilities of unchanged parameters must be reused'


def test_tracing_records_no_input_check_and_warns_nothing():
    """The input checks are Python branches on the shape: skipped while tracing (no TracerWarning on every trace
    or ONNX export), still raised in eager."""
    import warnings
    model = small_model('sa_quadratic_cifar').eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        traced = torch.jit.trace(model, torch.randn(2, 3, 16, 16))
    assert not [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)], \
        [f'{w.filename}:{w.lineno}: {w.message}' for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    x = torch.randn(3, 3, 12, 20)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match='expected 3 input channels'):
        model(torch.randn(1, 1, 16, 16))


def test_drop_path_drops_whole_samples():
    model = small_model('sa_quadratic_cifar', drop_path_rate=0.9, proj_drop_rate=0., attn_drop_rate=0.).train()
    x = torch.randn(1, 3, 8, 8).expand(6, -1, -1, -1)
    torch.manual_seed(3)
    features = model.forward_features(x)
    # each sample keeps or drops a branch as a whole: samples are either identical or differ everywhere
    for b in range(1, 6):
        same = torch.isclose(features[b], features[0])
        assert same.all() or not same.any()
    assert any(not torch.allclose(features[b], features[0]) for b in range(1, 6))


def test_sample_drop_path_zeroes_or_rescales_whole_samples():
    """timm's stochastic-depth convention on the grid-major ``h x w x B x D`` (batch in dim 2): in training each
    sample's branch is either all zero or exactly ``x / (1 - p)`` (the expectation is kept), about a fraction p of
    the samples dropped; in eval the module is the identity."""
    from sa_vision.layers import SampleDropPath
    p, batch = 0.3, 400
    drop = SampleDropPath(p).train()
    torch.manual_seed(0)
    x = torch.randn(3, 4, batch, 5)
    out = drop(x)
    dropped = 0
    for b in range(batch):
        if (out[:, :, b] == 0).all():
            dropped += 1
        else:
            torch.testing.assert_close(out[:, :, b], x[:, :, b] / (1 - p))
    # a binomial count of dropped samples: within 6 standard errors of p
    assert abs(dropped / batch - p) <= 6 * (p * (1 - p) / batch) ** 0.5, dropped
    assert drop.eval()(x) is x


def test_drop_path_rates_rise_linearly_from_zero_as_in_timm():
    """timm's convention (``calculate_drop_path_rates``, its ViTs' ``torch.linspace``): layer i of ``depth`` drops
    with ``drop_path_rate * i / (depth - 1)``, so the first layer never (no module at all) and the last at the rate."""
    rate, depth = 0.3, 4
    model = small_model('sa_quadratic_cifar', depth=depth, drop_path_rate=rate)
    expected = torch.linspace(0, rate, depth).tolist()
    for i, blk in enumerate(model.blocks):
        for drop in (blk.drop_path1, blk.drop_path2):
            if i == 0:
                assert isinstance(drop, nn.Identity)
            else:
                assert drop.drop_prob == pytest.approx(expected[i]), (i, drop.drop_prob)


def test_drop_rate_drops_the_pooled_features_before_the_classifier():
    """timm's ``drop_rate`` is the dropout before the classifier: in training, with the other dropouts off, the
    pooled features (``pre_logits``) are zero in about half the entries at 0.5 and twice the mean over the grid in
    the others; in eval they are the mean itself."""
    model = small_model('sa_quadratic_cifar', drop_rate=0.5, proj_drop_rate=0., attn_drop_rate=0.)
    torch.manual_seed(0)
    grid = torch.randn(64, 2, 2, SMALL['embed_dim'])  # B x h x w x D, as forward_features gives it
    pooled = grid.mean(dim=(1, 2))
    torch.testing.assert_close(model.eval().forward_head(grid, pre_logits=True), pooled)
    dropped = model.train().forward_head(grid, pre_logits=True)
    zeros = dropped == 0
    torch.testing.assert_close(dropped[~zeros], 2 * pooled[~zeros])
    # a binomial count over B x D entries: within 6 standard errors of one half
    assert abs(zeros.float().mean().item() - 0.5) <= 6 * (0.25 / zeros.numel()) ** 0.5
    # and the classifier reads the dropped features
    torch.manual_seed(1)
    logits = model.forward_head(grid)
    torch.manual_seed(1)
    torch.testing.assert_close(logits, model.head(torch.nn.functional.dropout(pooled, 0.5, True)))


def test_forward_intermediates_stopping_early_still_runs_the_last_requested_layer():
    """``stop_early`` skips only the layers after the last requested one: its intermediates equal those of the
    full forward and the requested layer's output computed by hand (embedding, then the blocks in order)."""
    model = small_model('sa_quadratic_cifar', depth=3, heads_per_layer=2).eval()
    x = torch.randn(2, 3, 8, 12)
    early = model.forward_intermediates(x, indices=[1], stop_early=True, intermediates_only=True)
    full = model.forward_intermediates(x, indices=[1], stop_early=False, intermediates_only=True)
    assert len(early) == len(full) == 1
    torch.testing.assert_close(early[0], full[0])
    with torch.no_grad():
        by_hand = model.blocks[1](model.blocks[0](model.patch_embed(x)))  # h x w x B x D
    torch.testing.assert_close(early[0], by_hand.permute(2, 3, 0, 1))  # NCHW


def test_prune_intermediate_layers_removes_the_head_as_timms_models_do():
    """timm's convention (its ViTs'): ``prune_intermediate_layers(indices)`` keeps the layers up to the last index
    and, with ``prune_head`` (the default), removes the classifier and the pooling (``reset_classifier(0, '')``):
    no classes, no classifier weights, the forward returns the kept layers' token grid."""
    vit = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=16, depth=2, embed_dim=16, num_heads=2,
                            num_classes=10)
    vit.prune_intermediate_layers([0])
    assert vit.num_classes == 0 and isinstance(vit.head, nn.Identity)  # what timm does

    model = small_model('sa_quadratic_cifar', depth=3, heads_per_layer=2).eval()
    assert model.prune_intermediate_layers([0]) == [0]
    assert len(model.blocks) == 1
    assert model.num_classes == 0 and isinstance(model.get_classifier(), nn.Identity)
    assert not [k for k in model.state_dict() if k.startswith('head.')]
    x = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        by_hand = model.blocks[0](model.patch_embed(x)).permute(2, 0, 1, 3)  # B x h x w x D
        torch.testing.assert_close(model(x), by_hand)


@pytest.mark.slow
def test_torch_compile_for_inference_and_training():
    model = small_model('sa_quadratic_cifar')
    compiled = torch.compile(model)
    x = torch.randn(4, 3, 16, 16)
    model.eval()
    with torch.no_grad():
        reference = copy.deepcopy(model).double()(x.double())
        lengths = sa_model_reduction_lengths(model, 64)
        assert_network_float32_close(model(x), reference, lengths, 'eager')
        assert_network_float32_close(compiled(x), reference, lengths, 'compiled')
    model.train()
    compiled(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize('tokens_per_chunk', (1024, 144), ids=('one_chunk', 'chunks_3_3_2'))
@pytest.mark.parametrize('name', CONTENT_FREE_MODELS)
def test_memory_saving_attention_matches_the_plain_composition(name, tokens_per_chunk, monkeypatch):
    """The block's attention + Value (one head at a time, recomputing the heads in backward where that is
    cheap, the batch in chunks of samples) equals value(attn(x)) with the same dropout masks, in outputs and
    gradients, and without autograd; on the separable path it holds nothing heads-sized."""
    import sa_vision.layers.attention as attention
    import sa_vision.layers.attention_autograd as attention_autograd
    from sa_vision.layers import attend_then_project
    # a 6 x 8 grid: 144 tokens per chunk is 3 samples, so the batch of 8 runs as chunks of 3, 3 and 2
    monkeypatch.setattr(attention_autograd, 'CPU_TOKENS_PER_CHUNK', tokens_per_chunk)
    model = small_model(name).double().train()
    blk = model.blocks[0]
    x = torch.randn(6, 8, 8, SMALL["embed_dim"], dtype=torch.float64, requires_grad=True)  # h, w, B, D
    params = [x] + list(blk.attn.parameters()) + list(blk.value.parameters())
    torch.manual_seed(1)
    out = attend_then_project(blk.attn, blk.value, x)
    torch.manual_seed(1)
    ref = blk.value(blk.attn(x))
    torch.testing.assert_close(out, ref)
    weights = torch.randn_like(ref)
    for g, rg in zip(torch.autograd.grad((out * weights).sum(), params),
                     torch.autograd.grad((ref * weights).sum(), params)):
        torch.testing.assert_close(g, rg)
    with torch.no_grad():
        torch.manual_seed(2)
        out = attend_then_project(blk.attn, blk.value, x)
        torch.manual_seed(2)
        torch.testing.assert_close(out, blk.value(blk.attn(x)))

    # the autograd Function itself on given probabilities, in both forms (the model sends the dense form
    # through it only without autograd): separable [row, col] and dense [grid] (their Kronecker product)
    forms = [[blk.attn.position_probs(6, 8).detach().requires_grad_()]]
    if blk.attn.separable:
        forms.append([p.detach().requires_grad_() for p in blk.attn.mixing_probs(6, 8)])
    for probs in forms:
        inputs = [x, blk.value.weight, blk.value.bias, *probs]
        out = attention_autograd._AttendThenProject.apply(x, blk.value.weight, blk.value.bias, *probs)
        ref = blk.value(attention.apply_mixing(x, probs))
        torch.testing.assert_close(out, ref)
        for g, rg in zip(torch.autograd.grad((out * weights).sum(), inputs),
                         torch.autograd.grad((ref * weights).sum(), inputs)):
            torch.testing.assert_close(g, rg)

    if blk.attn.separable:
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t.numel()), t)[1], lambda t: t):
            attend_then_project(blk.attn, blk.value, x)
        heads_sized = blk.attn.num_heads * x.numel()
        assert max(saved) < heads_sized


@pytest.mark.parametrize('name', CONTENT_FREE_MODELS + ('sa_content_cifar',))
def test_bfloat16_autocast_trains_and_matches_float32(name):
    """Mixed precision as sa-vision-train uses it on a GPU (bf16 autocast), here on the CPU: forward and
    backward run, gradients arrive in the parameters' float32, and the logits stay within bf16 accuracy
    of the float32 model."""
    model = small_model(name, proj_drop_rate=0., attn_drop_rate=0.).train()
    x = torch.randn(4, 3, 16, 16)
    expected = model(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        logits = model(x)
    assert logits.dtype == torch.bfloat16
    logits.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.isfinite().all()
               for p in model.parameters())
    # 3 bf16 epsilons (2.3 %) in norm: measured within 0.73 % over 15 seeds of each model (AMD, avx512_bf16)
    assert (logits.float() - expected).norm() <= 3 * BF16_EPS * expected.norm()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        assert (model.eval()(x).float() - expected).norm() <= 3 * BF16_EPS * expected.norm()
