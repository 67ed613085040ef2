""" The ablation of the positional parameters (docs/reproduction.md, "Ablation") at the gpu-long profile's length, on
a GPU: ``sa_quadratic_cifar`` trained four ways, the paper's random init or Theorem 1's kernel init, each at the base
learning rate or 30x on the positional parameters, with the gpu-long recipe otherwise (50 epochs, batch 256, bf16,
CUDA graphs, the data on the GPU), the four side by side in one call.

What it answers (issue "The paper's claims tested at length"): at ten times the cpu profile's epochs, does any
variant end with a layer whose centres lie within 0.5 grid units of a 3x3 kernel (``sa_vision.research.kernel_match``,
the mean matched distance at the best dilation), and does Theorem 1's start keep its kernel, or its accuracy lead.
The ``paper init, positional lr x30`` variant is the gpu-long zoo's own recipe, trained again beside the others so
that the four compare in one call.

Comes back (5 files): ``ablation_gpu_long.log`` (the trainings' output), ``ablation.md`` / ``ablation.csv`` (the
reproduction's table: top-1 of each run's own evaluation of its last epoch, uncompiled on CUDA, its median centre
shift; the runs evaluate every 10th epoch, :data:`EVAL_CHANGES`),
``ablation_gpu_long.json`` (the seconds, the versions, and the kernel match of each variant's every kept epoch,
per layer), ``ablation_positional.tar`` (each run's positional parameters at every epoch, a few hundred KiB, for
the trajectory figures).

A call needs about 6.7 device minutes (371 s for the four side by side at the speeds of ``zoo_gpu_long.py``, 30 s
after them); one that cannot fit them in ``--budget-s`` starts nothing and says so, as a killed one leaves nothing
to continue.

``--smoke``: the ``tiny`` profile on digits on the CPU, two variants at a time, in about a minute; its test is
tests/test_ablation_gpu_long.py.

    python3 docs/probes/gpu/ablation_gpu_long.py --out $OUT --budget-s 420
"""
import argparse
import json
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_env and zoo_gpu_long beside this file
from probe_env import fashion_mnist_dir, on_sigterm, redirect_fds, require_timm, sigterm_deferred, versions  # noqa: E402

require_timm()

import torch  # noqa: E402
from zoo_gpu_long import estimate_s, shared_slowdown  # noqa: E402

from sa_vision.errors import freeze_at_exit  # noqa: E402
from sa_vision.io import atomic_write_text  # noqa: E402
from sa_vision.models.sa_state_dict import CENTERS, block_key, layer_indices  # noqa: E402
from sa_vision.reproduce import ABLATION_MODEL, ABLATION_VARIANTS, Reproduction, StageStopped, ablation_run_name  # noqa: E402
from sa_vision.research.kernel_match import kernel_match  # noqa: E402
from sa_vision.train.positional_epochs import POSITIONAL_EPOCHS_FILE, run_epochs  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FINAL_S = 30  # the table, the kernel matches and the tar after the trainings
# every variant's recipe besides its own changes: an evaluation every 10th epoch, not 50, where the loop evaluates
# uncompiled on CUDA (about 0.67 s each, 4.45x that with four sharing the GPU: 50 would add ~150 s and the four would
# not fit a call); the table needs the last, the 10th-epoch ones show the way there. The smoke run's 2 epochs: the
# first skipped, the last evaluated
EVAL_CHANGES = {'val_interval': 10}
SMOKE_EVAL_CHANGES = {'val_interval': 2}


def eval_changes(smoke: bool) -> dict:
    """What every variant's recipe changes besides its own (:data:`EVAL_CHANGES`)."""
    return SMOKE_EVAL_CHANGES if smoke else EVAL_CHANGES


def expected_s(reproduction: Reproduction, parallel: int, smoke: bool = False) -> float:
    """The four trainings' seconds with ``parallel`` side by side (zoo_gpu_long.py's estimate of the stage, with
    :data:`EVAL_CHANGES`; the smoke run's, 1 s a wave, as the zoo's smoke counts its stages)."""
    waves = -(-len(ABLATION_VARIANTS) // parallel)
    if smoke:
        return float(waves)
    return waves * estimate_s(reproduction, ABLATION_MODEL, EVAL_CHANGES) * shared_slowdown(
        reproduction, ABLATION_MODEL, min(parallel, len(ABLATION_VARIANTS)), EVAL_CHANGES)


def kernel_matches(run_dir: Path) -> dict:
    """Per kept epoch (``epoch-NNN``), each layer's mean matched distance to a 3x3 kernel and its best dilation;
    with the epoch and layer that came closest."""
    epochs = {}
    for label, state in run_epochs(run_dir).items():  # in the epochs' order
        matches = [kernel_match(state[block_key(i, CENTERS)]) for i in layer_indices(state)]
        epochs[label] = [{'distance': round(m.mean_distance, 3), 'dilation': m.dilation} for m in matches]
    closest = min(((e, i, layer['distance']) for e, layers in epochs.items() for i, layer in enumerate(layers)),
                  key=lambda item: item[2], default=None)
    last = next(reversed(epochs), None)
    return {'epochs': epochs, 'closest': closest and {'epoch': closest[0], 'layer': closest[1] + 1,
                                                       'distance': closest[2]},
            'final_best': last and min(layer['distance'] for layer in epochs[last])}


def train_variants(reproduction: Reproduction, parallel: int, seconds: dict, changes: dict) -> None:
    """The four variants' trainings, ``parallel`` at a time, each recipe with ``changes`` too; each one's wall
    seconds into ``seconds``."""
    def train(variant: str) -> None:
        start = time.time()
        reproduction.train(ABLATION_MODEL, run=ablation_run_name(variant),
                           changes={**ABLATION_VARIANTS[variant], **changes})
        seconds[variant] = round(time.time() - start, 1)
    reproduction.tag_output = parallel > 1  # their lines interleave
    with ThreadPoolExecutor(parallel) as pool:
        for future in [pool.submit(train, v) for v in ABLATION_VARIANTS]:
            future.result()
    reproduction.tag_output = False


@sigterm_deferred()
def write_back(reproduction: Reproduction, out: Path, result: dict) -> None:
    """The JSON, the tables and the positional parameters of every finished run."""
    for name in ('ablation.md', 'ablation.csv'):
        if (reproduction.out / name).is_file():
            (out / name).write_bytes((reproduction.out / name).read_bytes())
    with tarfile.open(out / 'ablation_positional.tar.partial', 'w') as tar:
        for variant in ABLATION_VARIANTS:
            kept = reproduction.run_dir(ablation_run_name(variant)) / POSITIONAL_EPOCHS_FILE
            if kept.is_file():
                tar.add(kept, arcname=f'{kept.parent.name}/{kept.name}')
    (out / 'ablation_positional.tar.partial').replace(out / 'ablation_positional.tar')
    atomic_write_text(out / 'ablation_gpu_long.json', json.dumps(result, indent=1, default=str))


def run(args, reproduction: Reproduction, result: dict, trained: Callable[[], None]) -> None:
    """The four trainings, then (``trained()`` called: the deadline is no longer theirs) the table and the kernel
    matches, into ``result``."""
    need = expected_s(reproduction, args.parallel, args.smoke)
    result['expected_s'] = round(need, 1)
    print(f'== ablation at gpu-long length{" (smoke)" if args.smoke else ""}: {ABLATION_MODEL}, '
          f'{len(ABLATION_VARIANTS)} variants, {args.parallel} at a time, ~{need:.0f} s expected of a budget of '
          f'{args.budget_s:.0f}; {torch.cuda.get_device_name(0) if not args.smoke else "CPU"}; '
          f'{", ".join(f"{k} {v}" for k, v in result["versions"].items())}', flush=True)
    if need + FINAL_S > args.budget_s:
        result['not_started'] = f'it needs ~{need + FINAL_S:.0f} s, the budget is {args.budget_s:.0f} s'
        print(f'STOPPED: not started: {result["not_started"]}', flush=True)
        return
    train_variants(reproduction, args.parallel, result['seconds'], eval_changes(args.smoke))
    trained()  # a stop now would refuse the table's own look at the finished runs
    # every run finished: the table only (val_interval is no training argument of the runs' to check against)
    reproduction.ablation()
    for variant in ABLATION_VARIANTS:
        matches = kernel_matches(reproduction.run_dir(ablation_run_name(variant)))
        result['kernel_match'][variant] = matches
        closest = matches['closest']
        if closest is None:
            print(f'{variant}: no epoch weights kept, no kernel match', flush=True)
            continue
        print(f'{variant}: best layer {matches["final_best"]:.2f} grid units from a 3x3 kernel after the last '
              f'epoch; closest over its epochs {closest["distance"]:.2f} (layer {closest["layer"]}, '
              f'{closest["epoch"]})', flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', required=True, type=Path, help='what comes back (the module\'s docstring)')
    p.add_argument('--smoke', action='store_true', help='the CPU, the tiny profile, digits: about a minute')
    p.add_argument('--budget-s', type=float, default=420, help='start nothing that would end later (default 420)')
    p.add_argument('--parallel', type=int, default=None, help='variants side by side (default 4; smoke 2)')
    p.add_argument('--data-dir', default=None, help='Fashion-MNIST\'s folder (default data/fashion-mnist, '
                                                    'unpacked from data/fashion-mnist-xz where only that travelled)')
    args = p.parse_args(argv)
    args.parallel = args.parallel or (2 if args.smoke else 4)
    if args.parallel < 1:
        p.error(f'--parallel {args.parallel}: at least 1 variant at a time')
    if not args.smoke and not torch.cuda.is_available():
        p.error('no CUDA device: run with --smoke on the CPU')
    if args.data_dir is None and not args.smoke:
        args.data_dir = fashion_mnist_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    result = {'budget_s': args.budget_s, 'parallel': args.parallel, 'smoke': args.smoke, 'versions': versions(),
              'seconds': {}, 'kernel_match': {}}
    with tempfile.TemporaryDirectory(prefix='ablation-') as work, redirect_fds(args.out / 'ablation_gpu_long.log'):
        reproduction = (Reproduction(work, 'tiny', train_args=['--device', 'cpu']) if args.smoke
                        else Reproduction(work, 'gpu-long', data_dir=args.data_dir))

        def stopped() -> None:  # timeout's SIGTERM: the finished runs come back, the others are lost
            print(f'== stopped by SIGTERM after {time.time() - start:.0f} s', flush=True)
            reproduction.stop()
            result['stopped'] = True
            write_back(reproduction, args.out, result)

        deadline = threading.Timer(max(args.budget_s - FINAL_S, 0), reproduction.stop)
        with on_sigterm(stopped):
            deadline.start()
            try:
                run(args, reproduction, result, trained=deadline.cancel)
            except StageStopped as stop:  # the budget's end: the finished runs come back
                result['stopped'] = str(stop)
                print(f'== stopped at the budget\'s end: {stop}', flush=True)
            except Exception:  # noqa: BLE001  what finished still comes back
                result['failed'] = traceback.format_exc(limit=-8)
                print(f'FAILED: {result["failed"]}', flush=True)
            finally:
                deadline.cancel()
            result['total_s'] = round(time.time() - start, 1)
            write_back(reproduction, args.out, result)
            print(f'== done in {result["total_s"]:.0f} s: trained {list(result["seconds"]) or "none"}', flush=True)
    return 1 if 'failed' in result else 0


if __name__ == '__main__':
    freeze_at_exit()
    sys.exit(main())
