"""The ``gpu-long`` zoo trained on a lent GPU within a time budget, kept model by model, packed to come back.

How to call it, what comes back and how the next session continues: zoo_gpu_long.md beside this file. The stages
(``sa_vision.reproduce.StagedZoo``) skip every model already kept in ``zoo/fashion-mnist-gpu/`` (with its row in
``docs/reproduction_fashion_mnist_gpu.csv``), run up to ``--parallel`` at a time, and start another only while
``--budget-s`` fits its estimate below behind what the running ones have still to do;
then the guard of the whole zoo is recorded (``record_kept_models``: weights' SHA-256, 64 images' logits, the top-1 of
500) and the zoo, its table and the guard are packed into one ``zoo.tar`` (paths relative to the checkout: unpack it
at the checkout's root). ``--smoke`` does the same on the CPU with the ``tiny`` profile, one epoch, on digits, the
weights kept in bf16 as on the GPU, two stages at a time (tests/test_zoo_gpu.py), so that a slip cannot cost device
time.
"""
import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_env beside this file, also where a test loads it
from probe_env import redirect_fds, require_timm, versions

require_timm()  # one line and exit 2 where timm is outside pyproject's range: sa_vision would fail inside it

import torch

from sa_vision.io import atomic_write_text
from sa_vision.reproduce import PRUNED_MODEL, STAGE_ORDER, Reproduction, StagedZoo, record_kept_models
from sa_vision.reproduce.report import read_table
from sa_vision.train.runtime import available_cores

ROOT = Path(__file__).resolve().parents[3]
ZOO = ROOT / 'zoo' / 'fashion-mnist-gpu'
TABLE = ROOT / 'docs' / 'reproduction_fashion_mnist_gpu.csv'
MAX_FILE_BYTES = 16 * 2 ** 20  # what the device tool brings back per file
TRAIN_IMAGES = 60_000  # Fashion-MNIST's training split
# Estimated images/s on an H100 at batch 256 (bf16, CUDA graphs, data on the device), none measured yet: the GPU
# speed goal for the narrow quadratic and learned models (25,000 img/s, against 5,714 measured eagerly at batch 128,
# docs/performance.md), the generalized model at 0.4x of it (2.7x the MACs), the half-width ResNet at 0.5x (its
# measured ratio at batch 128). The budget rescales them by how the first stages compared.
IMAGES_PER_S = {'sa_quadratic_cifar': 25_000, 'sa_learned_cifar': 25_000, 'sa_gen_cifar': 10_000,
                PRUNED_MODEL: 10_000, 'resnet18_cifar': 12_500}
STAGE_OVERHEAD_S = 90  # process start, compile probe and CUDA-graph recording, the CPU evaluation, the export
FINAL_S = 60  # the guard of the whole zoo (CPU) and the tar


def estimate_s(reproduction: Reproduction, model: str) -> float:
    """A stage's device seconds: its epochs of Fashion-MNIST at :data:`IMAGES_PER_S` plus the overhead."""
    epochs = reproduction.profile.recipe(model, reproduction.dataset)['epochs']
    return STAGE_OVERHEAD_S + epochs * TRAIN_IMAGES / IMAGES_PER_S[model]


def evaluation_threads(asked: int, cores: int, parallel: int) -> int:
    """The threads the parent evaluates with while ``parallel`` stages train: a core left to each training's host
    loop, whose launches bound the narrow models' steps, and never more than ``asked`` (torch's count: the guard
    after the trainings takes those)."""
    return max(1, min(asked, cores - parallel))


def pack(staged: StagedZoo, out: Path, with_guard: bool = False) -> Path:
    """``out/zoo.tar``: the table as it is now, the folders of the models it lists (a stage writes its folder before
    its row, so those are whole; not one still being written) and, ``with_guard``, the guard recorded for them,
    named relative to their common folder; replaced whole, so a call killed while packing still returns the last
    one. A pack between stages leaves the guard out: the one on disk is an earlier call's, for other models."""
    zoo, table = staged.zoo, staged.table
    base = Path(os.path.commonpath([zoo.resolve(), table.resolve()]))
    guard = [table.with_name(f'{table.stem}_weights.sha256'), table.with_name(f'{table.stem}_logits.safetensors')]
    path, partial, snapshot = out / 'zoo.tar', out / '.zoo.tar.partial', out / '.table.csv'
    rows = {}
    if table.is_file():  # one reading of the table: a stage ending meanwhile adds no row without its folder
        shutil.copy(table, snapshot)
        rows = {row['model']: row for row in read_table(snapshot)}
    with tarfile.open(partial, 'w') as tar:
        for model in (m for m in STAGE_ORDER if staged.is_kept(m, rows)):
            tar.add(zoo / model, arcname=str((zoo / model).resolve().relative_to(base)))
        if rows:
            tar.add(snapshot, arcname=str(table.resolve().relative_to(base)))
        for item in guard if with_guard else ():
            if item.exists():
                tar.add(item, arcname=str(item.resolve().relative_to(base)))
    os.replace(partial, path)
    snapshot.unlink(missing_ok=True)
    return path


def write_back(staged: StagedZoo, out: Path, result: dict, start: float, with_guard: bool = False) -> Path:
    """What comes back, as it stands: ``zoo.tar`` and ``zoo_gpu_long.json``. Written after each kept stage too, so
    that a call killed at its time limit still returns every model kept before."""
    tar = pack(staged, out, with_guard)
    result.update(missing=staged.missing(), seconds=round(time.time() - start, 1), tar_bytes=tar.stat().st_size)
    atomic_write_text(out / 'zoo_gpu_long.json', json.dumps(result, indent=1))
    return tar


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', required=True, type=Path, help='what comes back: zoo.tar, the log, results.md, JSON')
    p.add_argument('--smoke', action='store_true', help='the CPU, the tiny profile, one epoch, digits: a minute')
    p.add_argument('--budget-s', type=float, default=480, help='start no stage that would end later (default 480)')
    p.add_argument('--zoo', type=Path, default=ZOO, help=f'the kept zoo (default {ZOO.relative_to(ROOT)})')
    p.add_argument('--table', type=Path, default=TABLE, help=f'its table (default {TABLE.relative_to(ROOT)})')
    p.add_argument('--parallel', type=int, default=None,
                   help='stages at a time, their trainings sharing the GPU (default 4; 2 in the smoke run)')
    p.add_argument('--data-dir', default=None, help='Fashion-MNIST\'s folder (default data/fashion-mnist)')
    args = p.parse_args(argv)
    if args.parallel is None:
        args.parallel = 2 if args.smoke else 4
    if args.parallel < 1:
        p.error(f'--parallel {args.parallel}: at least 1 stage at a time')
    if not args.smoke and not torch.cuda.is_available():
        p.error('no CUDA device: run with --smoke on the CPU')
    if args.data_dir is None and not args.smoke and (ROOT / 'data' / 'fashion-mnist').is_dir():
        args.data_dir = str(ROOT / 'data' / 'fashion-mnist')
    args.out.mkdir(parents=True, exist_ok=True)
    start, log_path = time.time(), args.out / 'zoo_gpu_long.log'
    result = {'budget_s': args.budget_s, 'parallel': args.parallel, 'smoke': args.smoke, 'stages': {}}
    with tempfile.TemporaryDirectory(prefix='gpu-long-') as work, redirect_fds(log_path):
        reproduction = (Reproduction(work, 'tiny', epochs=1, kept_dtype='bfloat16', train_args=['--device', 'cpu'])
                        if args.smoke else Reproduction(work, 'gpu-long', data_dir=args.data_dir))
        staged = StagedZoo(reproduction, args.zoo, args.table)
        all_threads = torch.get_num_threads()
        eval_threads = evaluation_threads(all_threads, available_cores(), args.parallel)
        result['versions'] = versions()
        print(f'== gpu-long zoo{" (smoke)" if args.smoke else ""}: budget {args.budget_s:.0f} s, {args.parallel} '
              f'stages at a time, evaluated beside them on {eval_threads} CPU threads, kept already '
              f'{[m for m in reproduction.profile.per_model if staged.is_kept(m)]}, missing {staged.missing()}; '
              f'{torch.cuda.get_device_name(0) if not args.smoke else "CPU"}; '
              f'{", ".join(f"{k} {v}" for k, v in result["versions"].items())}', flush=True)

        def kept(model: str, seconds: float) -> None:
            result['stages'][model] = round(seconds, 1)
            write_back(staged, args.out, result, start)

        guarded = False
        torch.set_num_threads(eval_threads)
        try:
            staged.run(args.budget_s - FINAL_S, lambda m: 1.0 if args.smoke else estimate_s(reproduction, m),
                       on_stage=kept, parallel=args.parallel)
        except Exception:  # noqa: BLE001  the stages kept before the failing one still come back, guarded
            result['failed'] = traceback.format_exc(limit=-8)
            print(f'FAILED: {result["failed"]}', flush=True)
        torch.set_num_threads(all_threads)
        if staged.rows():
            try:
                record_kept_models(args.zoo, args.table, data_dir=args.data_dir)
                guarded = True
            except Exception:  # noqa: BLE001  the kept models still come back; the guard is recorded on the CPU
                result['guard_failed'] = traceback.format_exc(limit=-8)
                print(f'FAILED recording the guard: {result["guard_failed"]}', flush=True)
        if (reproduction.out / 'results.md').is_file():
            shutil.copy(reproduction.out / 'results.md', args.out / 'results.md')
    tar = write_back(staged, args.out, result, start, with_guard=guarded)
    line = (f'== done in {result["seconds"]:.0f} s: kept this call {list(result["stages"])}, missing '
            f'{result["missing"] or "none"}; zoo.tar {tar.stat().st_size / 2 ** 20:.1f} MiB')
    if tar.stat().st_size > MAX_FILE_BYTES:
        line += f' OVER THE {MAX_FILE_BYTES // 2 ** 20} MiB A FILE MAY HAVE TO COME BACK'
    print(line)
    with open(log_path, 'a') as f:
        f.write(line + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
