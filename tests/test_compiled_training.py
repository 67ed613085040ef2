""" Compiled training: sa-vision-train compiles once and evaluates through the same compiled module, and timm's own
train.py trains our models compiled (through sa_vision.train.run_timm) """
import pytest
import torch

pytest.importorskip('sklearn')

from sa_vision.train import evaluation  # noqa: E402
from sa_vision.train import loop as training  # noqa: E402
from sa_vision.train.recipes import RECIPE_DIR  # noqa: E402

DIGITS_RECIPE = RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml'
TINY = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=16']


@pytest.mark.slow
def test_compiled_run_compiles_in_the_first_epoch_only(monkeypatch, tmp_path):
    """Two epochs, each with an evaluation whose last batch is short (360 test digits in batches of 64, as training's
    1,437 with the short batch dropped): every graph is compiled in the first epoch, one for training and one for
    evaluation (its short batch padded: else a second, dynamic-shape one), none in the second, and evaluation runs
    through the compiled module."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    graphs_after_epoch, evaluated = [], []

    def counting_evaluate(model, *args, **kwargs):
        evaluated.append(model)
        metrics = evaluation.evaluate(model, *args, **kwargs)
        graphs_after_epoch.append(counters['stats']['unique_graphs'])
        return metrics
    monkeypatch.setattr(training, 'evaluate', counting_evaluate)
    training.main(list(map(str, ['-c', DIGITS_RECIPE, *TINY, '--epochs', 2, '-b', 64, '-vb', 64,
                                 '--torchcompile', 'inductor', '--output', tmp_path, '--experiment', 'compiled'])))
    assert all(isinstance(m, torch._dynamo.eval_frame.OptimizedModule) for m in evaluated)
    # the model traces whole: one graph per mode (training with autograd, evaluation without)
    assert graphs_after_epoch[0] == 2, f'graphs compiled in the first epoch: {graphs_after_epoch[0]} (expected 2)'
    assert graphs_after_epoch[1] == graphs_after_epoch[0], (
        f'the second epoch compiled {graphs_after_epoch[1] - graphs_after_epoch[0]} new graph(s)')
