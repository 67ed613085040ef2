""" A model that pads its own input (``input_padding``): on the unpadded image it computes what the unpadded model
computes on the image zero-padded in pixel space (``F.pad`` with zeros, then the normalisation), so that weights
trained on Fashion-MNIST padded 28 -> 32 take timm's standard transform of the 28x28 images """
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from float32_bounds import assert_network_float32_close, sa_model_reduction_lengths
from torch import nn
from torchvision.transforms import Normalize

import sa_vision  # noqa: F401
from sa_vision.models.input_pad import black_after_normalization

MEAN, STD = (0.2860, 0.3, 0.3530), (0.3530, 0.25, 0.3)  # per-channel values, so a channel mix-up shows
SMALL = {
    'sa_quadratic_cifar': dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32),
    'sa_learned_cifar': dict(embed_dim=16, depth=1, heads_per_layer=2, mlp_hidden_dim=32),
    'resnet18_cifar': dict(channels=(8, 8, 8, 8)),
}
ZOO = Path(__file__).resolve().parent.parent / 'zoo' / 'fashion-mnist-cpu'  # padded, trained on grey images


@pytest.mark.parametrize('arch', list(SMALL))
def test_padding_inside_the_model_equals_black_padding_in_pixel_space(arch):
    torch.manual_seed(0)
    plain = timm.create_model(arch, **SMALL[arch]).eval()
    padded = timm.create_model(arch, input_padding=2, input_pad_value=black_after_normalization(MEAN, STD),
                               **SMALL[arch]).eval()
    assert padded.state_dict().keys() == plain.state_dict().keys()  # the kept weights load unchanged
    padded.load_state_dict(plain.state_dict())
    pixels = torch.rand(4, 3, 28, 28)
    normalize = Normalize(MEAN, STD)
    with torch.no_grad():
        reference = plain(normalize(F.pad(pixels, (2, 2, 2, 2), value=0.)))  # black border, then normalised
        out = padded(normalize(pixels))
        features = padded.forward_intermediates(normalize(pixels), intermediates_only=True)
    # the same input reaches the first layer bit for bit, so the same arithmetic follows
    assert torch.equal(out, reference)
    assert features[-1].shape[-1] == 32 // (2 if arch.startswith('sa_') else 8)  # the padded grid


@pytest.mark.parametrize('arch', ['sa_quadratic_cifar', 'resnet18_cifar'])
def test_a_padded_model_made_on_the_meta_device_pads_with_its_value_once_reinitialised(arch):
    """A kept (padded) model built on the meta device, moved with ``to_empty`` and loaded (a way to skip the random
    init): its border value is in no state dict, and timm's ``reinit_non_persistent_buffers`` brings it back, as
    for timm's own computed buffers. The logits then equal those of timm's local-dir: loading of the same folder."""
    import json

    from timm.models import load_checkpoint
    from timm.models._manipulate import reinit_non_persistent_buffers
    folder = ZOO / arch
    args = json.loads((folder / 'config.json').read_text())['model_args']
    model = timm.create_model(arch, device='meta', **args).to_empty(device='cpu')
    load_checkpoint(model, str(folder / 'model.safetensors'))
    reinit_non_persistent_buffers(model)
    reference = timm.create_model(f'local-dir:{folder}', pretrained=True).eval()
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), reference(x))


def test_pad_value_is_black_after_torchvisions_normalize():
    black = torch.zeros(3, 1, 1)
    expected = Normalize(MEAN, STD)(black).flatten().tolist()
    assert black_after_normalization(MEAN, STD) == expected


def test_bad_padding_arguments_are_refused():
    with pytest.raises(ValueError, match=r'input_pad_value has 2 values \[0.0, 1.0\] for 3 input channels.*'
                                         r'pass input_pad_value=<black after your normalisation>'):
        timm.create_model('sa_quadratic_cifar', input_padding=2, input_pad_value=[0., 1.], embed_dim=16, depth=1)
    with pytest.raises(ValueError, match='input_padding must be 0 or more'):
        timm.create_model('resnet18_cifar', input_padding=-1)


@pytest.mark.parametrize('in_chans', [1, 3, 4])
def test_equal_pad_values_fit_any_number_of_channels(in_chans):
    """A grey dataset's border (equal mean and std per channel, so equal values) is one value for any in_chans."""
    model = timm.create_model('resnet18_cifar', in_chans=in_chans, input_padding=1, input_pad_value=[-0.5] * 3,
                              **SMALL['resnet18_cifar'])
    x = torch.randn(2, in_chans, 4, 4)
    expected = F.pad(x, (1, 1, 1, 1), value=-0.5)
    assert torch.equal(model.conv1.input_pad(x), expected)


@pytest.mark.parametrize('arch', ['sa_quadratic_cifar', 'resnet18_cifar'])
def test_a_kept_grey_model_loads_with_one_input_channel(arch):
    """Like timm's own models (``adapt_input_conv`` sums the stem's RGB weights), a kept Fashion-MNIST model loads
    with ``in_chans=1`` and computes on a grey image what the 3-channel model computes on it repeated 3 times: the
    reference is the kept model in float64, the bound float32 rounding along the network."""
    if not (ZOO / arch).is_dir():
        pytest.skip(f'the zoo is not kept in this checkout ({ZOO / arch} is missing)')
    grey = timm.create_model(f'local-dir:{ZOO / arch}', pretrained=True, in_chans=1).eval()
    rgb = timm.create_model(f'local-dir:{ZOO / arch}', pretrained=True).eval().double()
    torch.manual_seed(0)
    x = Normalize([0.286], [0.353])(torch.rand(4, 1, 28, 28))
    with torch.no_grad():
        out, reference = grey(x), rgb(x.double().expand(-1, 3, -1, -1))
    if arch == 'resnet18_cifar':  # every convolution (an upper bound of one path), then the pooled classifier
        lengths = [m.weight[0].numel() for m in grey.modules() if isinstance(m, nn.Conv2d)] + [16 + grey.num_features]
    else:
        lengths = sa_model_reduction_lengths(grey, (32 // 2) ** 2)
    assert_network_float32_close(out, reference, lengths, f'{arch} with in_chans=1')


def _error(fn, x):
    try:
        fn(x)
    except (ValueError, RuntimeError) as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize('arch', list(SMALL))
@pytest.mark.parametrize('shape', [(2, 1, 28, 28), (3, 28, 28), (2, 3, 27, 27)])
def test_a_padded_model_checks_the_input_as_passed(arch, shape):
    """A model that pads its input raises where the same model without the border does, about the shape passed
    (not broadcasting one channel to three through the border, nor naming the padded size)."""
    plain = timm.create_model(arch, **SMALL[arch]).eval()
    padded = timm.create_model(arch, input_padding=2, input_pad_value=black_after_normalization(MEAN, STD),
                               **SMALL[arch]).eval()
    x = torch.randn(shape)
    for call in ('__call__', 'forward_intermediates'):
        expected, got = _error(getattr(plain, call), x), _error(getattr(padded, call), x)
        assert (got is None) == (expected is None), (call, expected, got)
        if got is None:  # timm's ResNet takes any size
            continue
        assert issubclass(got[0], ValueError) and str(list(shape)) in got[1], (call, got)
        if arch.startswith('sa_'):
            assert got == expected, call
        else:  # torch's own errors in the plain ResNet: its convolution's channel check, or its BatchNorm's
            assert ('channels' in got[1]) == ('channels' in expected[1]), (expected, got)
def test_registered_models_do_not_pad():
    for arch in ('sa_quadratic_cifar', 'resnet18_cifar'):
        with torch.device('meta'):
            model = timm.create_model(arch)
        assert not any(type(m).__name__ in ('InputPad', 'InputPadConv2d') for m in model.modules())


@pytest.mark.parametrize('arch', ['sa_quadratic_cifar', 'sa_learned_cifar'])
def test_tools_that_feed_padded_images_see_the_model_as_trained(arch):
    """The attention explorer shows the dataset's 32x32 images (black border included) and feeds a model that pads
    itself the images without the border; analysis counts the padded model's token grid."""
    from sa_vision.research.analysis import default_grid_size
    from sa_vision.research.explorer import ExplorerModel, _model_record
    torch.manual_seed(0)
    plain = timm.create_model(arch, **SMALL[arch]).eval()
    padded = timm.create_model(arch, input_padding=2, input_pad_value=black_after_normalization(MEAN, STD),
                               pretrained_cfg_overlay={'input_size': (3, 28, 28)}, **SMALL[arch]).eval()
    padded.load_state_dict(plain.state_dict())
    images = F.pad(torch.rand(3, 3, 28, 28), (2, 2, 2, 2), value=0.)
    normalized = Normalize(MEAN, STD)(images)
    records = [_model_record(ExplorerModel(arch, m), images, normalized, []) for m in (plain, padded)]
    assert records[0]['predictions'] == records[1]['predictions'] and records[1]['grid'] == [16, 16]
    assert default_grid_size(padded) == default_grid_size(plain) == (16, 16)


def test_training_feeds_a_padding_model_the_unpadded_images():
    """Fine-tuning a kept Fashion-MNIST model: the data comes 28x28 (not padded again to 36 by the model)."""
    from sa_vision.train.run_setup import create_model
    from sa_vision.train.state import parse_run_args
    args = parse_run_args(['--model', 'sa_quadratic_cifar', '--dataset', 'fashion-mnist', '--device', 'cpu',
                           '--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32',
                           'input_padding=2'])[0]
    args.channels_last, args.rank = False, 0
    _, data_cfg = create_model(args, None)
    assert data_cfg['input_size'] == [3, 28, 28]


@pytest.mark.parametrize('arch', list(SMALL))
def test_the_border_refuses_a_wrong_channel_count_in_a_graph(arch):
    """A graph keeps no input check (timm's FX feature extraction drops the check, whose result is unused): the
    border itself then refuses a channel count other than its own, where the unpadded model's first layer does,
    rather than broadcasting one channel to the border's three."""
    from timm.models import create_feature_extractor
    node = 'blocks.0' if arch.startswith('sa_') else 'layer1'
    plain = create_feature_extractor(timm.create_model(arch, **SMALL[arch]).eval(), [node])
    padded = create_feature_extractor(timm.create_model(arch, input_padding=2, input_pad_value=-0.5,
                                                        **SMALL[arch]).eval(), [node])
    x = torch.randn(2, 1, 28, 28)
    with pytest.raises(RuntimeError):
        plain(x)
    with pytest.raises(RuntimeError, match=r'shape \[2, 1, 32, 32\]'):
        padded(x)


def test_plain_fx_traces_a_padded_resnet_with_its_input_check():
    """torch.fx.symbolic_trace of a padded ResNet (the kept zoo's, torchvision's feature extraction): the input
    check stays one call in the graph, which computes what the model computes and still refuses a wrong channel
    count."""
    from torchvision.models.feature_extraction import create_feature_extractor
    model = timm.create_model('local-dir:' + str(ZOO / 'resnet18_cifar'), pretrained=True).eval()
    graph = torch.fx.symbolic_trace(model)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        assert torch.equal(graph(x), model(x))
        assert torch.equal(create_feature_extractor(model, ['layer1'])(x)['layer1'], model.layer1(model.act1(
            model.bn1(model.conv1(x)))))
    with pytest.raises(ValueError, match=r'expected 3 input channels.*got shape \[2, 1, 28, 28\]'):
        graph(torch.randn(2, 1, 28, 28))
