""" The device check's batch-major experiment (docs/probes/gpu/batch_major.py): the same model as the dense path,
values and gradients, with no copy of the heads-sized tensor in its compiled forward and backward """
import copy
from pathlib import Path

import pytest
import timm
import torch
from helpers import load_script
from torch._dynamo.backends.common import aot_autograd

import sa_vision  # noqa: F401  (registers the models)
from sa_vision.layers import dense_attention

bm = load_script(Path(__file__).resolve().parent.parent / 'docs' / 'probes' / 'gpu' / 'batch_major.py')

TINY = dict(embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=32, proj_drop_rate=0., num_classes=10)
BATCH, SIDE = 4, 32  # a 16 x 16 grid


def _model(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model('sa_quadratic_cifar', **{**TINY, **kwargs})


@pytest.mark.parametrize('attn_drop', (0., 0.1), ids=('no-dropout', 'dropout'))
def test_batch_major_is_the_dense_path_in_values_and_gradients(attn_drop):
    """float64, training: logits and every parameter's gradient against the model on the dense path (the dropout
    mask drawn in the same order from the same seed)."""
    model = _model(attn_drop_rate=attn_drop).double()
    patched = bm.batch_major(copy.deepcopy(model))
    x = torch.randn(BATCH, 3, SIDE, SIDE, dtype=torch.float64)
    results = []
    for m in (model, patched):
        torch.manual_seed(1)
        with dense_attention(m):
            out = m(x)
        results.append((out, torch.autograd.grad(out.square().sum(), list(m.parameters()))))
    (ref, ref_grads), (got, got_grads) = results
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(got_grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def _copies_of_size(model: torch.nn.Module, numel: int) -> int:
    """How many clone / copy operations of ``numel`` elements the compiled forward and backward of a training step
    hold (AOTAutograd's graphs, before any backend fuses them)."""
    found = []

    def capture(gm, inputs):
        found.extend(n for n in gm.graph.nodes if n.op == 'call_function'
                     and any(k in str(n.target) for k in ('clone', 'copy'))
                     and getattr(n.meta.get('val'), 'numel', lambda: -1)() == numel)
        return gm
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=capture, bw_compiler=capture))
    with dense_attention(model):
        compiled(torch.randn(BATCH, 3, SIDE, SIDE)).sum().backward()
    return len(found)


def test_no_copy_of_the_heads_sized_tensor_where_the_dense_path_makes_two_a_layer():
    heads_sized = TINY['heads_per_layer'] * (SIDE // 2) ** 2 * BATCH * TINY['embed_dim']
    assert _copies_of_size(_model(attn_drop_rate=0.), heads_sized) == 2 * TINY['depth']  # into Value's layout, back
    assert _copies_of_size(bm.batch_major(_model(attn_drop_rate=0.)), heads_sized) == 0
