"""ONNX export, torch.export and timm's onnx_export of every registered model, against PyTorch eager.

Every graph is exported at batch 2 with a dynamic batch (and a dynamic height and width: the SA models take
any even size, the ResNet any size) and then run at other batch sizes and another image size. The
reference is the eager model (its own fast kernels, not the plain path the exporters record), compared
to 1e-5 of the largest logit in float32.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import timm
import torch
from helpers import ALL_MODELS, GAUSSIAN_MODELS, HANG_TIMEOUT_S, SA_MODELS
from torch.export import Dim

import sa_vision  # noqa: F401  (registers the models)

onnx = pytest.importorskip('onnx')
ort = pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')  # the default (dynamo) ONNX exporter needs it

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(embed_dim=16, depth=2, heads_per_layer=3, mlp_hidden_dim=24)
REL_TOL = 1e-5
EXPORT_SHAPE = (2, 3, 32, 32)
# (batch, height, width) the exported graphs run at: other batch sizes, and another (even) image size
RUN_SHAPES = ((1, 32, 32), (5, 32, 32), (3, 24, 40))


def make_model(name):
    torch.manual_seed(0)
    if name == 'resnet18_cifar':
        model = timm.create_model(name)
    elif name == 'sa_gen_pruned':
        model = timm.create_model(name, **dict(SMALL, heads_per_layer=(2, 3)))
    else:
        model = timm.create_model(name, **SMALL)
    return model.eval()


def assert_matches(out, ref, what):
    out, ref = torch.as_tensor(out), torch.as_tensor(ref)
    assert out.shape == ref.shape, f'{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}'
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    assert err <= REL_TOL, f'{what}: max difference {err:.3g} of the largest logit'


def eager(model, x):
    with torch.no_grad():
        return model(x)


def check_onnx_file(path, model, shapes=RUN_SHAPES):
    onnx.checker.check_model(str(path), full_check=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])
    input_name = session.get_inputs()[0].name
    torch.manual_seed(1)
    for b, h, w in shapes:
        x = torch.randn(b, 3, h, w)
        out = session.run(None, {input_name: x.numpy()})[0]
        assert_matches(out, eager(model, x), f'onnxruntime at input {(b, 3, h, w)}')


def test_all_registered_models_are_covered():
    assert set(timm.list_models(module=['sa_cifar', 'resnet_cifar'])) == set(ALL_MODELS)


@pytest.mark.slow
@pytest.mark.parametrize('name', ALL_MODELS)
def test_default_onnx_exporter_with_dynamic_batch_and_size(name, tmp_path):
    """torch.onnx.export's default (dynamo) exporter; the graph runs at any batch and image size."""
    model = make_model(name)
    path = tmp_path / f'{name}.onnx'
    dims = {0: Dim('batch'), 2: Dim.DYNAMIC, 3: Dim.DYNAMIC}
    torch.onnx.export(model, (torch.randn(EXPORT_SHAPE),), str(path), input_names=['x'],
                      dynamic_shapes={'x': dims})
    check_onnx_file(path, model)


@pytest.mark.parametrize('name', ALL_MODELS)
def test_torchscript_onnx_exporter_matches_eager(name, tmp_path):
    """torch.onnx.export(dynamo=False), the TorchScript-based exporter: the same outputs as eager."""
    model = make_model(name)
    path = tmp_path / f'{name}.onnx'
    torch.onnx.export(model, (torch.randn(EXPORT_SHAPE),), str(path), dynamo=False,
                      input_names=['x'], output_names=['y'],
                      dynamic_axes={'x': {0: 'batch', 2: 'height', 3: 'width'}, 'y': {0: 'batch'}})
    check_onnx_file(path, model)


@pytest.mark.parametrize('name', GAUSSIAN_MODELS)
def test_tracing_the_eager_kernels_raises_instead_of_exporting_a_wrong_graph(name, tmp_path, monkeypatch):
    """Were the plain path ever skipped, the eager-only autograd Functions refuse graph capture with a clear
    error (the TorchScript tracer records them as a constant of the example's values)."""
    import sa_vision.layers.attention_path as attention_path
    import sa_vision.layers.mlp as mlp
    # the one dispatch rule of the attention layers, and the MLP's check, both wrongly ignoring the capture
    choose_path = attention_path.choose_path
    monkeypatch.setattr(attention_path, 'choose_path',
                        lambda device_type, dtype, autocast, compiling, capturing, *rest:
                        choose_path(device_type, dtype, autocast, False, False, *rest))
    monkeypatch.setattr(mlp, 'is_capturing', lambda: False)
    model = make_model(name)
    with pytest.raises(RuntimeError, match='eager-only.*TorchScript tracer'):
        torch.onnx.export(model, (torch.randn(EXPORT_SHAPE),), str(tmp_path / 'm.onnx'), dynamo=False)
    with pytest.raises(RuntimeError, match='eager-only'):
        torch.jit.trace(model, (torch.randn(EXPORT_SHAPE),))
    with pytest.raises(RuntimeError, match='eager-only'):  # rather than a graph fixed to the batch size
        torch.export.export(model, (torch.randn(EXPORT_SHAPE),), dynamic_shapes={'x': {0: Dim('batch')}})


@pytest.mark.parametrize('name', SA_MODELS)
def test_jit_trace_matches_eager_at_other_batch_sizes(name):
    """The default trace: its check (check_trace=True) traces the model again under another grad mode and fails
    where the two graphs differ, even only in the source lines of a branch chosen by grad mode."""
    model = make_model(name)
    traced = torch.jit.trace(model, (torch.randn(EXPORT_SHAPE),))
    for b in (1, 5):
        x = torch.randn(b, 3, 32, 32)
        assert_matches(traced(x), eager(model, x), f'torch.jit.trace at batch {b}')


@pytest.mark.slow
@pytest.mark.parametrize('name', ALL_MODELS)
def test_torch_export_with_dynamic_batch_matches_eager(name):
    model = make_model(name)
    # Dim.DYNAMIC, as docs/export.md exports: torch 2.11 cannot prove a guard of three models under Dim('batch')
    program = torch.export.export(model, (torch.randn(EXPORT_SHAPE),), dynamic_shapes={'x': {0: Dim.DYNAMIC}})
    exported = program.module()
    for b in (1, 5):
        x = torch.randn(b, 3, 32, 32)
        assert_matches(eager(exported, x), eager(model, x), f'torch.export program at batch {b}')


@pytest.mark.slow
@pytest.mark.parametrize('name', GAUSSIAN_MODELS)
def test_torch_export_with_dynamic_image_size_matches_eager(name):
    model = make_model(name)
    dims = {0: Dim('batch'), 2: 2 * Dim('half_height'), 3: 2 * Dim('half_width')}
    program = torch.export.export(model, (torch.randn(EXPORT_SHAPE),), dynamic_shapes={'x': dims})
    exported = program.module()
    for b, h, w in ((5, 32, 32), (3, 24, 40)):
        x = torch.randn(b, 3, h, w)
        assert_matches(eager(exported, x), eager(model, x), f'torch.export program at input {(b, 3, h, w)}')


@pytest.mark.parametrize('name', ALL_MODELS)
def test_timm_onnx_export(name, tmp_path):
    """timm.utils.onnx_export.onnx_export, as timm's onnx_export.py calls it (TorchScript exporter, dynamic
    batch and size), including its own onnxruntime check."""
    from timm.utils.onnx import onnx_export
    model = make_model(name)
    path = tmp_path / f'{name}.onnx'
    onnx_export(model, str(path), batch_size=2, input_size=(3, 32, 32), dynamic_size=True,
                check=True, check_forward=True)
    check_onnx_file(path, model)


@pytest.mark.parametrize('name', ['sa_quadratic_cifar', 'sa_gen_pruned'])
def test_timm_reparameterize_then_onnx_export(name, tmp_path):
    """--reparam of timm's scripts: reparameterize_model replaces every child with its fuse(); the fused
    model exports and still computes the unfused model's function."""
    from timm.utils import reparameterize_model
    from timm.utils.onnx import onnx_export
    model = make_model(name)
    fused = reparameterize_model(model)
    assert all(isinstance(blk.proj, torch.nn.Identity) for blk in fused.blocks)
    path = tmp_path / f'{name}.onnx'
    onnx_export(fused, str(path), batch_size=2, input_size=(3, 32, 32), dynamic_size=True, check=True)
    check_onnx_file(path, model)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['sa_quadratic_cifar', 'sa_learned_cifar'])
def test_timm_onnx_export_with_dynamo(name, tmp_path):
    """timm's onnx_export with use_dynamo=True (onnx_export.py --dynamo)."""
    from timm.utils.onnx import onnx_export
    model = make_model(name)
    path = tmp_path / f'{name}.onnx'
    onnx_export(model, str(path), batch_size=2, input_size=(3, 32, 32), dynamic_size=True, use_dynamo=True,
                check=True, check_forward=True)
    check_onnx_file(path, model)


@pytest.mark.slow
@pytest.mark.parametrize('dynamo', [True, False], ids=['default-exporter', 'torchscript-exporter'])
def test_full_size_model_exports_exactly(dynamo, tmp_path):
    """The paper-size sa_quadratic_cifar (12 M parameters, 9 heads x 6 layers) with a dynamic batch and size."""
    torch.manual_seed(0)
    model = timm.create_model('sa_quadratic_cifar').eval()
    path = tmp_path / 'sa_quadratic_cifar.onnx'
    x = torch.randn(EXPORT_SHAPE)
    if dynamo:
        torch.onnx.export(model, (x,), str(path), input_names=['x'],
                          dynamic_shapes={'x': {0: Dim('batch'), 2: Dim.DYNAMIC, 3: Dim.DYNAMIC}})
    else:
        torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=['x'], output_names=['y'],
                          dynamic_axes={'x': {0: 'batch', 2: 'height', 3: 'width'}, 'y': {0: 'batch'}})
    check_onnx_file(path, model)


def test_run_timm_runs_a_script_with_the_models_registered(tmp_path):
    script = tmp_path / 'timm_script.py'
    script.write_text(textwrap.dedent("""
        import sys
        import timm
        assert __name__ == '__main__'
        print('registered', timm.is_model('sa_quadratic_cifar'))
        print('argv', sys.argv)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run(
        [sys.executable, '-m', 'sa_vision.train.run_timm', str(script), '--model', 'sa_quadratic_cifar', '-b', '4'],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert 'registered True' in lines
    assert f"argv {[str(script), '--model', 'sa_quadratic_cifar', '-b', '4']}" in lines


def test_run_timm_names_a_missing_script(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
    missing = tmp_path / 'nowhere' / 'validate.py'
    proc = subprocess.run([sys.executable, '-m', 'sa_vision.train.run_timm', str(missing), '--model', 'x'],
                          capture_output=True, text=True, env=env, timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 2
    assert str(missing) in proc.stderr and 'does not exist' in proc.stderr
    assert 'Traceback' not in proc.stderr
