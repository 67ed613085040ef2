""" attention_from_conv against nn.Conv2d (Theorem 1 of Cordonnier et al.) """
import math

import pytest
import torch
from helpers import exact_float32
from torch import nn

from sa_vision.research.theory import attention_from_conv, min_hard_attention_alpha, off_center_mass

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def relative_error(out, ref):
    return float((out - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('in_chans,out_chans,kernel,dilation', [
    (16, 32, 3, 1), (3, 8, 3, 1), (5, 7, 5, 1), (8, 4, 3, 2), (1, 1, 3, 1)])
def test_padded_matches_conv_everywhere(dtype, in_chans, out_chans, kernel, dilation, device):
    torch.manual_seed(0)
    conv = nn.Conv2d(in_chans, out_chans, kernel, padding=kernel // 2 * dilation, dilation=dilation).to(device, dtype)
    x = torch.randn(2, in_chans, 13, 10, dtype=dtype).to(device)
    layer = attention_from_conv(conv)
    with torch.no_grad(), exact_float32():  # TF32 convolutions on a GPU would differ by ~1e-3
        ref, out = conv(x), layer(x)
    assert out.shape == ref.shape and out.dtype == dtype
    assert relative_error(out, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('kernel,dilation', [(3, 1), (5, 1), (3, 2)])
def test_unpadded_is_the_unpadded_conv_with_its_shape(dtype, kernel, dilation, device):
    torch.manual_seed(1)
    conv = nn.Conv2d(6, 5, kernel, padding=0, dilation=dilation, bias=False).to(device, dtype)
    x = torch.randn(3, 6, 14, 12, dtype=dtype).to(device)
    layer = attention_from_conv(conv)
    assert not layer.pad
    r = kernel // 2 * dilation
    with torch.no_grad(), exact_float32():
        ref, out = conv(x), layer(x)
    # the convolution's own smaller output: attn(x) - conv(x) as for a padded one
    assert out.shape == ref.shape == (3, 5, 14 - 2 * r, 12 - 2 * r)
    assert relative_error(out, ref) <= TOLERANCE[dtype]


def test_unpadded_on_an_input_with_no_output_says_so():
    layer = attention_from_conv(nn.Conv2d(2, 3, 5, padding=0))
    with pytest.raises(ValueError, match='leaves no output of the unpadded'):
        layer(torch.randn(1, 2, 4, 9))


def test_same_padding_string_and_pad_false_on_padded_conv():
    conv = nn.Conv2d(4, 4, 3, padding='same').double()
    x = torch.randn(1, 4, 9, 9, dtype=torch.float64)
    with torch.no_grad(), exact_float32():
        assert relative_error(attention_from_conv(conv)(x), conv(x)) <= 1e-10
        unpadded = attention_from_conv(conv, pad=False)(x)
        assert relative_error(unpadded, conv(x)[..., 1:-1, 1:-1]) <= 1e-10


def test_heads_sit_on_kernel_shifts_with_alpha():
    conv = nn.Conv2d(2, 3, 3, padding=2, dilation=2)
    layer = attention_from_conv(conv, alpha=60.)
    assert layer.attn.kind == 'quadratic' and layer.attn.num_heads == 9 and layer.attn.dim == 2
    expected = torch.tensor([[r, c] for r in (-2, 0, 2) for c in (-2, 0, 2)], dtype=torch.float32)
    assert torch.equal(layer.attn.position.centers.detach(), expected)
    assert torch.allclose(0.5 * layer.attn.position.precision_factors.detach() ** 2, torch.full((9,), 60.))


@pytest.mark.parametrize('kwargs,message', [
    (dict(stride=2, padding=1), 'stride'),
    (dict(groups=2, padding=1), 'groups'),
    (dict(padding=2), 'padding'),
    (dict(padding=1, padding_mode='reflect'), 'padding_mode'),
])
def test_uncovered_convolutions_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        attention_from_conv(nn.Conv2d(4, 4, 3, **kwargs))


def test_even_kernel_and_pad_mismatch_raise():
    with pytest.raises(ValueError, match='even kernel'):
        attention_from_conv(nn.Conv2d(4, 4, 2))
    with pytest.raises(ValueError, match='pad=True'):
        attention_from_conv(nn.Conv2d(4, 4, 3, padding=0), pad=True)
    with pytest.raises(ValueError, match='alpha'):
        attention_from_conv(nn.Conv2d(4, 4, 3, padding=1), alpha=float('inf'))


def test_off_center_mass_hand_formula():
    # four nearest neighbours at distance 1, four diagonal at 2, four at 4, ...
    alpha = 3.0
    by_hand = sum(math.exp(-alpha * (i * i + j * j)) for i in range(-20, 21) for j in range(-20, 21)) - 1
    assert off_center_mass(alpha) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_min_alpha_reaches_dtype_resolution(dtype):
    alpha = min_hard_attention_alpha(dtype, 3)
    u = torch.finfo(dtype).eps / 2
    assert 9 * off_center_mass(alpha) <= u * (1 + 1e-9)
    assert 9 * off_center_mass(alpha * 0.99) > u
    assert alpha == pytest.approx(math.log(4 * 9 / u), abs=0.1)  # eps ~ 4 exp(-alpha)
    assert min_hard_attention_alpha(dtype, 5) > alpha


def test_min_alpha_is_enough_in_float64():
    torch.manual_seed(2)
    conv = nn.Conv2d(8, 8, 3, padding=1).double()
    x = torch.rand(2, 8, 10, 10, dtype=torch.float64) + 1  # positive, no cancellation in the error bound
    alpha = min_hard_attention_alpha(torch.float64, 3)
    # rounding alone: 72 products per output (8 channels x 9 taps), each sum off by at most 72 eps of its terms
    resolution = 72 * torch.finfo(torch.float64).eps
    with torch.no_grad(), exact_float32():
        assert relative_error(attention_from_conv(conv, alpha=alpha)(x), conv(x)) <= resolution
        # two thirds of it leaves the off-centre mass well above that resolution
        assert relative_error(attention_from_conv(conv, alpha=2 / 3 * alpha)(x), conv(x)) > 10 * resolution
        # a soft alpha is visibly wrong: the theorem needs hard attention
        assert relative_error(attention_from_conv(conv, alpha=2.)(x), conv(x)) > 1e-3


def test_large_alpha_float32_stays_finite():
    conv = nn.Conv2d(3, 3, 3, padding=1)
    x = torch.randn(1, 3, 40, 40)
    with torch.no_grad(), exact_float32():
        out = attention_from_conv(conv, alpha=1e4)(x)
        assert torch.isfinite(out).all()
        assert relative_error(out, conv(x)) <= 1e-5


def test_exact_float32_switches_tf32_off_and_restores():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for before in ((True, True), (False, True), (True, False)):
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
            with exact_float32():
                assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
        with pytest.raises(KeyError):
            with exact_float32():
                raise KeyError('inside')
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.cuda  # TF32 exists on CUDA GPUs only
def test_float32_equality_on_cuda_under_exact_float32():
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 32, 3, padding=1).cuda()
    x = torch.randn(2, 16, 32, 32, device='cuda')
    layer = attention_from_conv(conv)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default
    try:
        with torch.no_grad(), exact_float32():
            assert relative_error(layer(x), conv(x)) <= TOLERANCE[torch.float32]
    finally:
        torch.backends.cudnn.allow_tf32 = saved


def test_min_alpha_says_what_it_takes():
    """A dtype's name or a kernel of no pixels: said in words, not an AttributeError or a division by zero."""
    with pytest.raises(ValueError, match="floating point torch.dtype such as torch.float32, got 'float32'"):
        min_hard_attention_alpha('float32')
    with pytest.raises(ValueError, match='kernel_size must be at least 1, got 0'):
        min_hard_attention_alpha(torch.float32, 0)
