""" Device-check section 12 (docs/probes/gpu/timm_train_check.py): timm's own train.py trains our model compiled,
and its compiled evaluation is checked against the same checkpoint evaluated uncompiled. The parts that need no
train.py run everywhere; the section's smoke run needs a timm checkout (``SA_VISION_TIMM_CHECKOUT``: pip's timm ships
no train.py) and is skipped without one, saying so.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT_S, load_script

from sa_vision.train.run_timm import _parser as run_timm_parser
from sa_vision.train.timm_args import TIMM_TRAIN_ARGS

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / 'docs' / 'probes' / 'gpu'

tc = load_script(PROBES / 'timm_train_check.py')

# train.py's own lines (timm main, 1.0.29.dev0, on a CPU; the Train lines cut after the learning rate): each epoch's
# last Train line says the epoch's average rate; a Test line says its batch's own loss and top-1, then the averages
TRAIN_PY_LINES = """\
Train: 0 [   0/8 ( 12%)]  Loss: 2.27 (2.27)  Time: 9.685s,    3.30/s  (9.685s,    3.30/s)  LR: 2.000e-03
Train: 0 [   7/8 (100%)]  Loss: 2.27 (2.35)  Time: 0.005s, 6133.42/s  (1.218s,   26.28/s)  LR: 2.000e-03
Test: [   0/7]  Time: 2.711 (2.711)  Loss:   2.233 ( 2.233)  Acc@1:   6.250 (  6.250)  Acc@5:  62.500 ( 62.500)
Test: [   7/7]  Time: 0.001 (0.341)  Loss:   2.299 ( 2.282)  Acc@1:  15.625 (  8.984)  Acc@5:  46.875 ( 53.516)
Train: 1 [   0/8 ( 12%)]  Loss: 2.23 (2.23)  Time: 0.033s,  966.51/s  (0.033s,  966.51/s)  LR: 1.000e-03
Train: 1 [   7/8 (100%)]  Loss: 2.31 (2.28)  Time: 0.005s, 6490.85/s  (0.010s, 3051.83/s)  LR: 1.000e-03
"""


def test_fashion_mnist_is_laid_out_where_torchvision_reads_it_without_a_download(tmp_path):
    """timm's torch/fashion_mnist is torchvision's FashionMNIST: it reads the layout written from Debian's files, the
    same first images and labels as sa_vision's own reader, and only as many as asked."""
    from torchvision.datasets import FashionMNIST

    from sa_vision.train.datasets import FashionMnistDataset
    root = tc.torchvision_fashion_mnist(None, tmp_path, limit=50)
    for split, train in (('train', True), ('test', False)):
        theirs = FashionMNIST(str(root), train=train, download=False)
        ours = FashionMnistDataset(split, img_size=28)
        assert len(theirs) == 50
        assert torch.equal(theirs.data, ours.images[:50, 0]) and torch.equal(theirs.targets, ours.targets[:50])
    with pytest.raises(ValueError, match='not an IDX file'):
        tc.truncated_idx(b'PK\x03\x04' + bytes(12), 1)


def test_the_command_names_only_arguments_that_train_py_and_run_timm_take(tmp_path):
    """Every option after the script is one of train.py's (the packaged list, itself checked against a checkout's
    parser in test_timm_train_args.py), and what comes before it run_timm's own parser takes."""
    cmd = tc.train_argv(Path('train.py'), tmp_path, tmp_path / 'out', {'embed_dim': 64}, ('--opt', 'adamw'),
                        device='cuda', backend='inductor', batch_size=128, workers=8)
    assert cmd[1:3] == ['-m', 'sa_vision.train.run_timm']
    script_at = cmd.index('train.py')
    ours = run_timm_parser().parse_args(cmd[3:script_at + 1])
    assert (ours.pos_lr_scale, ours.script) == (tc.POS_LR_SCALE, 'train.py')
    options = [a for a in cmd[script_at + 1:] if a.startswith('-') and not a.lstrip('-').replace('.', '').isdigit()]
    unknown = [o for o in options if o.lstrip('-').replace('-', '_') not in TIMM_TRAIN_ARGS and o != '-b']
    assert not unknown, unknown
    at = cmd.index('--model-kwargs')
    assert 'input_padding=2' in cmd[at:] and f'input_pad_value={tc.normalization()["black"]}' in cmd[at:]


def test_epoch_rates_are_each_epochs_last_average_of_train_py():
    assert tc.epoch_rates(TRAIN_PY_LINES) == {0: 26.28, 1: 3051.83}


def test_logged_batches_are_each_test_lines_own_values_by_epoch():
    assert tc.logged_batches(TRAIN_PY_LINES) == {0: {0: {'loss': 2.233, 'top1': 6.25},
                                                     7: {'loss': 2.299, 'top1': 15.625}}}


def test_the_compiled_evaluation_is_right_only_where_totals_and_each_logged_batch_agree():
    batch = {'loss': 0.25, 'top1': 92.1875, 'images': 128}
    eager = {'top1': 92.10, 'loss': 0.25, 'batches': {0: batch, 78: dict(batch, images=16, top1=93.75)}}
    right = {0: {'loss': 0.2504, 'top1': 92.969}, 78: {'loss': 0.25, 'top1': 93.75}}  # one image flipped in batch 0
    assert tc.verdict({'top1': 92.01, 'loss': 0.252}, eager, right)['right']
    assert not tc.verdict({'top1': 86.31, 'loss': 0.25}, eager)['right']  # the H200's fault of 2026-11-26
    assert not tc.verdict({'top1': 91.57, 'loss': 0.25}, eager)['right']  # its mildest, 0.53 points
    assert not tc.verdict({'top1': 92.10, 'loss': float('nan')}, eager)['right']
    assert not tc.verdict({'top1': 92.10, 'loss': 0.26}, eager)['right']
    # a first batch wrong alone moves the totals by less than their bounds: the batch says it
    first_wrong = {**right, 0: {'loss': 0.9, 'top1': 70.3}}
    found = tc.verdict({'top1': 92.0, 'loss': 0.252}, eager, first_wrong)
    assert not found['right'] and found['wrong_batches'] == [0]
    assert tc.verdict({'top1': 92.1, 'loss': 0.25}, dict(eager, loss=float('nan')), right)['right'] is None


def test_evaluations_are_train_pys_summary_rows(tmp_path):
    summary = tmp_path / 'summary.csv'
    assert tc.evaluations(summary) == {}
    summary.write_text('epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n0,2.3,2.28,8.98,53.5,0.002\n'
                       '1,2.28,2.25,11.33,58.2,0.001\n')
    assert tc.evaluations(summary) == {0: {'top1': 8.98, 'loss': 2.28}, 1: {'top1': 11.33, 'loss': 2.25}}


def _section_12(out: Path, *args: str) -> dict:
    # two threads: with one, this CPU's bf16 products tied no logits, and a re-evaluation counting top-1 by argmax
    # (not timm's topk) went unseen
    env = dict(os.environ, OMP_NUM_THREADS='2', PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1')
    proc = subprocess.run([sys.executable, str(PROBES / 'device_check.py'), '--smoke', '--section', '12', '--out',
                           str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads((out / 'device_check.json').read_text())


def test_without_train_py_the_section_is_skipped_saying_why(tmp_path):
    missing = tmp_path / 'missing' / 'train.py'
    results = _section_12(tmp_path / 'out', '--timm-train', str(missing))
    assert results['skipped']['timm train.py'] == f'no timm train.py at {missing}'
    assert [i['status'] for i in results['items']] == ['done']


@pytest.mark.slow
def test_smoke_trains_with_timms_train_py_and_evaluates_the_checkpoint_as_it_did(tmp_path):
    """With dynamo's eager backend the compiled evaluation is eager's own operations: train.py's logged top-1 and
    loss and the re-evaluation of its checkpoint must agree exactly, or the re-evaluation differs from train.py's
    (its loader, its batches, inference mode, timm's top-1 count)."""
    script = tc.train_script()
    if script is None:
        pytest.skip('no timm train.py: set SA_VISION_TIMM_CHECKOUT to a pytorch-image-models checkout (pip ships no '
                    'train.py), or put one at .whl/train.py')
    results = _section_12(tmp_path)
    run = results['timm_train']
    assert run['status'] == 0, (tmp_path / 'timm_train.log').read_text()[-3000:]
    assert run['script'] == str(script) and set(run['epoch_img_s']) == {'0', '1'}
    # each epoch: the first run of the compiled evaluation, then one after more compiled training
    assert set(run['epochs']) == {'0', '1'}
    for epoch in run['epochs'].values():
        assert epoch['eager']['images'] == 254  # the last batch short, compiled anew, as on the GPU
        assert epoch['verdict']['batches_compared'] == [0, 63]  # the first and the last, logged alone
        assert epoch['eager']['model_args']['in_chans'] == 1 and epoch['eager']['model_args']['input_padding'] == 2
        verdict = epoch['verdict']
        assert verdict['right'] and verdict['top1_diff_points'] == 0, run
        assert math.isclose(epoch['compiled']['loss'], epoch['eager']['loss'], rel_tol=1e-5), run
    # the two checkpoints differ: each epoch's own was evaluated, not the last one twice
    assert run['epochs']['0']['eager']['loss'] != run['epochs']['1']['eager']['loss']
