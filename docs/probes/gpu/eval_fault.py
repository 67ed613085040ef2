""" Why the gpu-long sa_quadratic_cifar evaluated to loss nan in its training on an H100 (docs/training.md, "Precision
and compilation"; h100_2026-11-26b_gpu_long.log): the first epochs of that stage's own recipe, each evaluated four
ways on the same weights.

The stage's recipe (``PROFILES['gpu-long']``: batch 256, bf16 autocast, inductor with CUDA graphs, the data on the
GPU, ``pos_lr_scale`` 30) trains in this process through ``sa_vision.train.loop.main``, whose evaluation is replaced
by one that after every epoch evaluates

* ``compiled``: through the training's compiled module, as the loop does (its evaluation graph recorded in the
  first epoch, beside the training's);
* ``eager``: the model itself, uncompiled;

and at the first epoch where ``compiled`` is not finite (or after the last epoch, if it never is):

* ``fresh``: a new compiled module of a copy of the model in the training's mode, its graph recorded now;
* ``fresh_default``: the same in torch.compile's default mode (inductor, no CUDA graphs);

and, through the training's module again, how many images of each batch get a logit that is not finite.

Reading it: ``fresh`` right and ``compiled`` wrong puts the fault in the graph recorded before (the CUDA graph tree
shared with the training's graphs); ``fresh`` wrong and ``fresh_default`` right in CUDA graphs; both wrong in
inductor's code for these weights; ``eager`` wrong in the weights (a diverged training). The weights of the first
faulty epoch are saved (``fault_weights.safetensors``) for a CPU to look into.

``--smoke``: the ``tiny`` profile on digits, on the CPU, dynamo's ``eager`` backend, ``compiled`` made to fail in
the first epoch (NaN logits), so that every branch runs in tests/test_eval_fault.py without a GPU.

    python3 docs/probes/gpu/eval_fault.py --out $OUT --epochs 4     # on the GPU: about 90 s
"""
import argparse
import contextlib
import copy
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_env beside this file, also where a test loads it
from probe_env import redirect_fds, require_timm, versions  # noqa: E402

require_timm()

import torch  # noqa: E402
import yaml  # noqa: E402

from sa_vision.io import atomic_write_text  # noqa: E402
from sa_vision.reproduce import Reproduction  # noqa: E402
from sa_vision.reproduce.stages import _training_script_keys  # noqa: E402
from sa_vision.train import evaluation  # noqa: E402
from sa_vision.train import loop as training  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
MODEL = 'sa_quadratic_cifar'
SCHEDULE_EPOCHS = 50  # the gpu-long recipe's (the smoke's tiny recipe is given as many), of which --epochs train


class _Enough(Exception):
    """Raised from the evaluation once the epochs asked for are evaluated: it ends the training."""


class _NaNLogits(torch.nn.Module):
    """The smoke run's stand-in for a faulty compiled module: the module's logits, the first one NaN."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        logits = self.module(x).clone()
        logits[0, 0] = float('nan')
        return logits


def _recipe_file(work: Path, smoke: bool, data_dir) -> Path:
    """The stage's recipe as Reproduction.train writes it (only the keys sa-vision-train reads)."""
    reproduction = (Reproduction(work, 'tiny', epochs=SCHEDULE_EPOCHS) if smoke
                    else Reproduction(work, 'gpu-long', data_dir=data_dir))
    recipe = reproduction._recipe(MODEL)
    if smoke:
        recipe.update(torchcompile='eager', device_data='auto')
    read = _training_script_keys()
    path = work / 'recipe.yaml'
    path.write_text(yaml.safe_dump({k: v for k, v in recipe.items() if k in read}, sort_keys=False))
    return path


def _summary(metrics: dict) -> dict:
    return {k: metrics[k] for k in ('loss', 'top1', 'top5')}


@torch.no_grad()
def _nonfinite_rows(module, loader, device, amp_ctx=contextlib.nullcontext, **_) -> list:
    """Per batch of the loader, how many images ``module`` gives a logit that is not finite (full batches only: a
    short one would compile anew): all of every batch points at the module's state, some of some at the images."""
    counts, size = [], getattr(loader, 'batch_size', None)
    for images, _ in loader:
        if size is not None and images.size(0) != size:
            continue
        with amp_ctx():
            logits = module(images.to(device))
        counts.append(int((~torch.isfinite(logits.float()).all(dim=1)).sum()))
    return counts


def _fresh_modules(model, loader, device, mode, smoke: bool, **kwargs) -> dict:
    """The same weights through a copy of ``model`` compiled now, in the training's ``mode`` and in the default one."""
    found = {}
    for name, kw in (('fresh', {'mode': mode}), ('fresh_default', {})):
        t0 = time.time()
        fresh = torch.compile(copy.deepcopy(model), backend='eager' if smoke else 'inductor', **kw)
        metrics = evaluation.evaluate(fresh, loader, device, pad_last_batch=True, **kwargs)
        found[name] = {**_summary(metrics), 'mode': kw.get('mode'), 's': round(time.time() - t0, 1)}
        print(f'  {name} ({kw.get("mode") or "default"} mode, compiled now): loss {metrics["loss"]:.4f} '
              f'top-1 {metrics["top1"]:.2f} ({time.time() - t0:.0f} s)', flush=True)
    return found


def run(out: Path, epochs: int, smoke: bool, data_dir=None) -> dict:
    """Train and evaluate as the module says; the JSON written to ``out`` (also returned)."""
    result = {'versions': versions(), 'model': MODEL, 'smoke': smoke, 'epochs': [], 'fresh': None}
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        atomic_write_text(out / 'eval_fault.json', json.dumps(result, indent=1, default=str))

    def evaluate_four_ways(eval_model, model, loader, device, log, **kwargs):
        epoch = len(result['epochs'])
        through = _NaNLogits(eval_model) if smoke and epoch == 0 else eval_model
        compiled = evaluation.evaluate(through, loader, device, pad_last_batch=eval_model is not model, **kwargs)
        eager = evaluation.evaluate(model, loader, device, **kwargs)
        row = {'epoch': epoch, 'compiled': _summary(compiled), 'eager': _summary(eager)}
        result['epochs'].append(row)
        print(f'epoch {epoch}: compiled loss {compiled["loss"]:.4f} top-1 {compiled["top1"]:.2f}; eager loss '
              f'{eager["loss"]:.4f} top-1 {eager["top1"]:.2f}', flush=True)
        last = epoch + 1 == epochs
        if result['fresh'] is None and (not math.isfinite(compiled['loss']) or last):
            result['fresh'] = {'epoch': epoch, 'compiled_finite': math.isfinite(compiled['loss'])}
            if not math.isfinite(compiled['loss']):
                result['fresh']['nonfinite_rows_per_batch'] = _nonfinite_rows(through, loader, device, **kwargs)
                print(f'  images with a logit not finite, per batch: {result["fresh"]["nonfinite_rows_per_batch"]}',
                      flush=True)
                from safetensors.torch import save_file
                save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
                          str(out / 'fault_weights.safetensors'))
            result['fresh'].update(_fresh_modules(model, loader, device, training_mode[0], smoke, **kwargs))
        save()
        if last:
            raise _Enough
        return eager, eval_model

    training_mode = [None]
    resolve = training.resolve_torchcompile

    def resolve_and_note(*args, **kwargs):  # the mode the training compiled with, for the fresh module
        resolved = resolve(*args, **kwargs)
        training_mode[0] = resolved[2]
        return resolved

    with tempfile.TemporaryDirectory(prefix='eval-fault-') as work:
        recipe = _recipe_file(Path(work), smoke, data_dir)
        argv = ['-c', str(recipe), '--output', str(Path(work) / 'runs'), '--experiment', MODEL]
        if data_dir:
            argv += ['--data-dir', str(data_dir)]
        if smoke:
            argv += ['--device', 'cpu']
        saved = training.evaluate_compiled, training.resolve_torchcompile
        training.evaluate_compiled, training.resolve_torchcompile = evaluate_four_ways, resolve_and_note
        try:
            training.main(argv)
        except _Enough:
            pass
        finally:
            training.evaluate_compiled, training.resolve_torchcompile = saved
    save()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', required=True, type=Path, help='folder of eval_fault.log, .json and the faulty weights')
    p.add_argument('--epochs', type=int, default=4, help='epochs of the 50-epoch schedule to train (default 4)')
    p.add_argument('--smoke', action='store_true', help='the CPU, the tiny profile on digits, a faked fault')
    p.add_argument('--data-dir', default=None, help='Fashion-MNIST\'s folder (default data/fashion-mnist)')
    args = p.parse_args(argv)
    if not 1 <= args.epochs <= SCHEDULE_EPOCHS:
        p.error(f'--epochs {args.epochs}: from 1 to the schedule\'s {SCHEDULE_EPOCHS}')
    if not args.smoke and not torch.cuda.is_available():
        p.error('no CUDA device: run with --smoke on the CPU')
    if args.data_dir is None and not args.smoke and (ROOT / 'data' / 'fashion-mnist').is_dir():
        args.data_dir = str(ROOT / 'data' / 'fashion-mnist')
    args.out.mkdir(parents=True, exist_ok=True)
    with redirect_fds(args.out / 'eval_fault.log'):
        smoke = ' (smoke)' if args.smoke else ''
        print(f'== eval fault probe: {MODEL}, {args.epochs} epochs of its gpu-long recipe{smoke}; '
              f'{", ".join(f"{k} {v}" for k, v in versions().items())}', flush=True)
        result = run(args.out, args.epochs, args.smoke, args.data_dir)
        print(f'== done: {json.dumps(result["fresh"])}', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
