"""The ``gpu-long`` zoo trained on a lent GPU within a time budget, kept model by model, packed to come back.

How to call it, what comes back and how the next session continues: zoo_gpu_long.md beside this file. The stages
(``sa_vision.reproduce.StagedZoo``) skip every model already kept in ``zoo/fashion-mnist-gpu/`` (with its row in
``docs/reproduction_fashion_mnist_gpu.csv``), run up to ``--parallel`` at a time, and start another only while
``--budget-s`` fits it and each running stage, all slowed by sharing the GPU as measured (below);
then the guard of the whole zoo is recorded (``record_kept_models``: weights' SHA-256, 64 images' logits, the top-1 of
500) and the zoo, its table and the guard are packed into one ``zoo.tar`` (paths relative to the checkout: unpack it
at the checkout's root). At the budget's end (or on ``timeout``'s SIGTERM) the running trainings are stopped
(``StagedZoo.stop``) and the run folders of the stages not kept go into ``resume.tar``, from which the next call's
``Reproduction`` continues each at its last finished epoch (``--resume``). ``--smoke`` does the same on the CPU with
the ``tiny`` profile, one epoch, on digits, the weights kept in bf16 as on the GPU, two stages at a time
(tests/test_zoo_gpu.py), so that a slip cannot cost device time.
"""
import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Dict, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_env beside this file, also where a test loads it
from probe_env import fashion_mnist_dir, on_sigterm, redirect_fds, require_timm, sigterm_deferred, versions

require_timm()  # one line and exit 2 where timm is outside pyproject's range: sa_vision would fail inside it

import torch

from sa_vision.errors import freeze_at_exit
from sa_vision.io import atomic_write_text
from sa_vision.reproduce import PRUNED_MODEL, STAGE_ORDER, Reproduction, StagedZoo, record_kept_models
from sa_vision.reproduce.profiles import PRUNE_SOURCE
from sa_vision.reproduce.report import read_table
from sa_vision.train.checkpoint import read_checkpoint
from sa_vision.train.positional_epochs import POSITIONAL_EPOCHS_FILE
from sa_vision.train.runtime import available_cores

ROOT = Path(__file__).resolve().parents[3]
ZOO = ROOT / 'zoo' / 'fashion-mnist-gpu'
TABLE = ROOT / 'docs' / 'reproduction_fashion_mnist_gpu.csv'
RESUME = ROOT / 'data' / 'gpu-long-resume.tar'  # the last call's resume.tar, carried in the ignored data folder
MAX_FILE_BYTES = 16 * 2 ** 20  # what the device tool brings back per file
TRAIN_IMAGES = 60_000  # Fashion-MNIST's training split
# Images/s of each stage's training alone on the GPU at the profile's batch of 256, from the first gpu-long call on an
# H100 (docs/probes/gpu/h100_2026-11-26b_gpu_long.log; zoo_gpu_long.md, "The speeds"): the median of a model's epochs
# after the first while no other stage trained, 55,253 for sa_quadratic_cifar (its epochs 1-2), 57,842 for
# sa_gen_cifar (45-49), 57,946 for the pruned model, 53,745 for sa_learned_cifar; the half-width ResNet, not trained
# there, from the third call on an H200 (h200_2026-11-26_gpu_long_3.log), where it trained alone: 66,240, the median
# of its epochs after the first (its first estimate, 33,200, had come from eager rates at batch 128). Two cards: on
# that H200 sa_quadratic_cifar ran at about 63,500 alone (its epochs 44-49), so the ResNet's rate here is about 1.15x
# what an H100 would give beside the others'. The budget rescales them by how the first stages of a call compared.
IMAGES_PER_S = {'sa_quadratic_cifar': 55_000, 'sa_learned_cifar': 53_700, 'sa_gen_cifar': 57_800,
                PRUNED_MODEL: 57_900, 'resnet18_cifar': 66_200}
# The same call: a stage's wall time less its epochs' train time, median 90 s over the three kept (process start, 50
# GPU evaluations and checkpoints, CPU evaluation, export), plus the compile in its first epoch, median 23 s (that
# epoch's time less a later one's). Its evaluations were compiled, with CUDA graphs; since then the loop evaluates
# uncompiled on CUDA (sa_vision.train.evaluation.evaluation_module), which EVAL_IMAGES_PER_S counts on top
STAGE_OVERHEAD_S = 113
TEST_IMAGES = 10_000  # Fashion-MNIST's test split, evaluated after each evaluated epoch (--val-interval)
# The narrow sa_quadratic_cifar's eager inference on the H200, bf16, batch 128 (h200_2026-11-26_speed.log, section 1:
# 14,968; 15,842 in section 8): about 0.67 s an evaluation, 33 s over 50 epochs, as much as a third of what the
# stage's epochs train in; taken for every model (no other narrow model's eager rate was measured there)
EVAL_IMAGES_PER_S = 14_968
# The same call, two trainings side by side (sa_quadratic_cifar and sa_gen_cifar): their epochs took 2.02x and 2.15x
# their time alone on average (the sum of their epochs' times, which is what a stage's time holds), the GPU shared
# about evenly; 2.15 at two is 4.45 at four on epoch_slowdown's line. The device check's section 7 had measured up to
# 3.23 with four at batch 50 (h100_2026-11-26_zoo.log), where each training left the GPU idle between launches
EPOCH_SLOWDOWN_4_SHARED = 4.45
FINAL_S = 60  # the guard of the whole zoo (CPU) and the tars
# what a continued stage needs of its run folder (Reproduction.train resumes last.pth.tar), its kept centres last
RESUME_FILES = ('last.pth.tar', 'summary.csv', 'args.yaml', 'recipe.yaml', POSITIONAL_EPOCHS_FILE)


def estimate_s(reproduction: Reproduction, model: str, changes: Optional[Dict] = None) -> float:
    """A stage's device seconds (its recipe with ``changes``): its epochs of Fashion-MNIST at :data:`IMAGES_PER_S`,
    its evaluations (every ``val_interval``-th epoch and the last) at :data:`EVAL_IMAGES_PER_S`, plus the overhead."""
    recipe = {**reproduction.profile.recipe(model, reproduction.dataset), **(changes or {})}
    epochs = recipe['epochs']
    evaluations = -(-epochs // recipe.get('val_interval', 1))
    return (STAGE_OVERHEAD_S + epochs * TRAIN_IMAGES / IMAGES_PER_S[model]
            + evaluations * TEST_IMAGES / EVAL_IMAGES_PER_S)


def epoch_slowdown(k: int) -> float:
    """How many times slower an epoch trains while ``k`` stages share the GPU: 1 alone, and
    :data:`EPOCH_SLOWDOWN_4_SHARED` with four, in a line between (and beyond four, not measured): the line through
    the slowdown measured with two. Where processes take turns on the GPU, an epoch beside others takes
    ``max(1, k * busy)`` times its time alone (``busy``: the share of it the GPU works; about 1 at batch 256)."""
    return 1 + (k - 1) * (EPOCH_SLOWDOWN_4_SHARED - 1) / 3


def shared_slowdown(reproduction: Reproduction, model: str, k: int, changes: Optional[Dict] = None) -> float:
    """How many times its estimate alone (:func:`estimate_s`) a stage takes while ``k`` stages share the GPU
    (``StagedZoo.run``'s ``slowdown``): its epochs and evaluations :func:`epoch_slowdown` times slower, its
    :data:`STAGE_OVERHEAD_S` not (mostly the CPU's and the host's work, which the stages overlap)."""
    alone = estimate_s(reproduction, model, changes)
    return (STAGE_OVERHEAD_S + (alone - STAGE_OVERHEAD_S) * epoch_slowdown(k)) / alone


def checkpoint_bytes(reproduction: Reproduction, model: str) -> int:
    """A stage's ``last.pth.tar``, estimated before it trains: float32 weights and AdamW's two moments, 12 bytes a
    parameter, and 64 KiB of the rest (the pruned model: its source's count, an upper bound). Measured: 4.1 MiB for
    the narrow sa_quadratic_cifar, 32.3 MiB for the half-width ResNet18."""
    import timm
    name = PRUNE_SOURCE if model == PRUNED_MODEL else model
    kwargs = reproduction.profile.recipe(name, reproduction.dataset)['model_kwargs']
    return 12 * sum(p.numel() for p in timm.create_model(name, num_classes=10, **kwargs).parameters()) + 2 ** 16


def evaluation_threads(asked: int, cores: int, parallel: int) -> int:
    """The threads the parent evaluates with while ``parallel`` stages train: a core left to each training's host
    loop, whose launches bound the narrow models' steps, and never more than ``asked`` (torch's count: the guard
    after the trainings takes those)."""
    return max(1, min(asked, cores - parallel))


@sigterm_deferred()  # the SIGTERM handler packs too: not inside this pack
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


@sigterm_deferred()  # the SIGTERM handler packs too: not inside this pack
def pack_resume(staged: StagedZoo, out: Path, room: int) -> Dict[str, str]:
    """``out/resume.tar``: the run folder of each stage not kept that has a finished epoch, as the next call's
    ``Reproduction.train`` continues it (:data:`RESUME_FILES`: the Gaussian kinds' kept centres too), the pruned
    weights for the pruned model, and ``reproduction.json`` (the next call's folder must hold the same reproduction).
    Stages in :data:`STAGE_ORDER` while they fit ``room`` bytes; one that does not trains from the start next call.
    Returns what became of each such stage; no tar where none is kept."""
    r, said, path = staged.reproduction, {}, out / 'resume.tar'
    members = [(r.out / 'reproduction.json', 'reproduction.json')]
    used = members[0][0].stat().st_size
    for model in staged.missing():
        run = r.run_dir(model)
        if not (run / 'last.pth.tar').is_file():
            continue
        files = [(run / name, f'runs/{model}/{name}') for name in RESUME_FILES if (run / name).is_file()]
        if model == PRUNED_MODEL:
            files += [(r.out / name, name) for name in ('pruned.pth', 'pruning.json') if (r.out / name).is_file()]
        size, meta = sum(f.stat().st_size for f, _ in files), read_checkpoint(run / 'last.pth.tar').meta
        if used + size > room:
            said[model] = (f'not kept: {size / 2 ** 20:.1f} MiB after {meta["epoch"]} epochs, over the '
                           f'{(room - used) / 2 ** 20:.1f} MiB left to resume.tar; it trains from the start')
            continue
        members, used = members + files, used + size
        said[model] = f'kept after {meta["epoch"]} of {meta["num_epochs"]} epochs ({size / 2 ** 20:.1f} MiB)'
    if len(members) == 1:
        path.unlink(missing_ok=True)
        return said
    with tarfile.open(out / '.resume.tar.partial', 'w') as tar:
        for file, name in members:
            tar.add(file, arcname=name)
    os.replace(out / '.resume.tar.partial', path)
    return said


def kept_bytes(staged: StagedZoo, models) -> int:
    """The bytes of the zoo folders of ``models``: what the next call's checkout carries more once they are
    committed."""
    return sum(f.stat().st_size for m in models for f in (staged.zoo / m).rglob('*') if f.is_file())


@sigterm_deferred()
def write_back(staged: StagedZoo, out: Path, result: dict, start: float, with_guard: bool = False) -> Path:
    """What comes back, as it stands: ``zoo.tar`` and ``zoo_gpu_long.json``. Written after each kept stage too, so
    that a call killed at its time limit still returns every model kept before."""
    tar = pack(staged, out, with_guard)
    result.update(missing=staged.missing(), seconds=round(time.time() - start, 1), tar_bytes=tar.stat().st_size)
    atomic_write_text(out / 'zoo_gpu_long.json', json.dumps(result, indent=1))
    return tar


def resume_tar(requested: Optional[Path], smoke: bool) -> Optional[Path]:
    """The resume.tar a call continues: ``--resume``, else :data:`RESUME` on the GPU; none by default in the smoke
    run, whose tiny profile cannot continue the gpu-long run a GPU call left there."""
    return requested if requested is not None or smoke else RESUME


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', required=True, type=Path,
                   help='what comes back: zoo.tar, resume.tar, the log, results.md, JSON')
    p.add_argument('--smoke', action='store_true', help='the CPU, the tiny profile, one epoch, digits: a minute')
    p.add_argument('--budget-s', type=float, default=480,
                   help='start no stage that would end later, stop the trainings then (default 480)')
    p.add_argument('--zoo', type=Path, default=ZOO, help=f'the kept zoo (default {ZOO.relative_to(ROOT)})')
    p.add_argument('--table', type=Path, default=TABLE, help=f'its table (default {TABLE.relative_to(ROOT)})')
    p.add_argument('--parallel', type=int, default=None,
                   help='stages at a time, their trainings sharing the GPU (default 4; 2 in the smoke run)')
    p.add_argument('--data-dir', default=None, help='Fashion-MNIST\'s folder (default data/fashion-mnist, '
                                                    'unpacked from data/fashion-mnist-xz where only that travelled)')
    p.add_argument('--resume', type=Path, default=None,
                   help=f'the last call\'s resume.tar, whose stages this call continues (default '
                        f'{RESUME.relative_to(ROOT)}, where it exists; none in the smoke run, whose tiny profile '
                        f'cannot continue a gpu-long run)')
    p.add_argument('--carry-room-mib', type=float, default=MAX_FILE_BYTES / 2 ** 20,
                   help='MiB of the next call\'s 64 that the tracked files, data/fashion-mnist-xz and .whl leave, as '
                        'measured before this call (zoo_gpu_long.md): resume.tar takes that less the models kept '
                        'now, at most 16 (default 16, unchecked)')
    args = p.parse_args(argv)
    if args.parallel is None:
        args.parallel = 2 if args.smoke else 4
    if args.parallel < 1:
        p.error(f'--parallel {args.parallel}: at least 1 stage at a time')
    if not args.smoke and not torch.cuda.is_available():
        p.error('no CUDA device: run with --smoke on the CPU')
    if args.resume is not None and not args.resume.is_file():
        p.error(f'--resume {args.resume}: no such file (the last call\'s resume.tar)')
    args.resume = resume_tar(args.resume, args.smoke)
    if args.data_dir is None and not args.smoke:
        args.data_dir = fashion_mnist_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    start, log_path = time.time(), args.out / 'zoo_gpu_long.log'
    result = {'budget_s': args.budget_s, 'parallel': args.parallel, 'smoke': args.smoke, 'stages': {}}
    with tempfile.TemporaryDirectory(prefix='gpu-long-') as work, redirect_fds(log_path):
        if args.resume is not None and args.resume.is_file():
            with tarfile.open(args.resume) as tar:
                tar.extractall(work, filter='data')
            result['continued'] = sorted(p.name for p in (Path(work) / 'runs').iterdir())
        reproduction = (Reproduction(work, 'tiny', epochs=1, kept_dtype='bfloat16', train_args=['--device', 'cpu'])
                        if args.smoke else Reproduction(work, 'gpu-long', data_dir=args.data_dir))
        staged = StagedZoo(reproduction, args.zoo, args.table)
        guarded = run_stages(staged, args, result, start)
        if (reproduction.out / 'results.md').is_file():
            shutil.copy(reproduction.out / 'results.md', args.out / 'results.md')
    tar = write_back(staged, args.out, result, start, with_guard=guarded)
    line = (f'== done in {result["seconds"]:.0f} s: kept this call {list(result["stages"])}, missing '
            f'{result["missing"] or "none"}; zoo.tar {tar.stat().st_size / 2 ** 20:.1f} MiB; resume.tar: '
            f'{result["resume"] or "none"}')
    if tar.stat().st_size > MAX_FILE_BYTES:
        line += f' OVER THE {MAX_FILE_BYTES // 2 ** 20} MiB A FILE MAY HAVE TO COME BACK'
    print(line)
    with open(log_path, 'a', encoding='utf-8') as f:
        f.write(line + '\n')
    return 0


def run_stages(staged: StagedZoo, args, result: dict, start: float) -> bool:
    """The stages within the budget, stopped at its end (or on SIGTERM), then the guard of the zoo and resume.tar;
    whether the guard was recorded."""
    reproduction = staged.reproduction
    room = int(args.carry_room_mib * 2 ** 20)
    fits = {m: checkpoint_bytes(reproduction, m) <= min(room, MAX_FILE_BYTES) for m in staged.missing()}
    all_threads = torch.get_num_threads()
    eval_threads = evaluation_threads(all_threads, available_cores(), args.parallel)
    result['versions'] = versions()
    print(f'== gpu-long zoo{" (smoke)" if args.smoke else ""}: budget {args.budget_s:.0f} s, {args.parallel} '
          f'stages at a time, evaluated beside them on {eval_threads} CPU threads, kept already '
          f'{[m for m in reproduction.profile.per_model if staged.is_kept(m)]}, missing {staged.missing()}, '
          f'continued from {args.resume.name + ": " if args.resume else ""}{result.get("continued", "none")}, '
          f'whose checkpoints can come back '
          f'for the next call: {[m for m, ok in fits.items() if ok]}; '
          f'{torch.cuda.get_device_name(0) if not args.smoke else "CPU"}; '
          f'{", ".join(f"{k} {v}" for k, v in result["versions"].items())}', flush=True)

    def keep_for_next_call() -> None:
        room_left = min(room - kept_bytes(staged, result['stages']), MAX_FILE_BYTES)
        # on SIGTERM the stages stopped are still running: their threads end after this
        result['stopped'] = [m for m in STAGE_ORDER if m in staged.stopped or m in staged.running]
        result['resume'] = pack_resume(staged, args.out, room_left)

    def stopped() -> None:  # timeout's SIGTERM: the trainings end at their last epoch; both tars and the JSON
        print(f'== stopped by SIGTERM after {time.time() - start:.0f} s', flush=True)
        staged.stop()
        keep_for_next_call()
        write_back(staged, args.out, result, start, with_guard=guarded)  # after the guard's recording: with it

    def kept(model: str, seconds: float) -> None:
        result['stages'][model] = round(seconds, 1)
        write_back(staged, args.out, result, start)

    deadline = threading.Timer(max(args.budget_s - FINAL_S - (time.time() - start), 0), staged.stop)
    guarded = False
    torch.set_num_threads(eval_threads)
    with on_sigterm(stopped):
        deadline.start()
        try:
            # the smoke's stages of 1 s each, as if all epochs: the GPU's stages are slowed less
            staged.run(args.budget_s - FINAL_S - (time.time() - start),
                       lambda m: 1.0 if args.smoke else estimate_s(reproduction, m), on_stage=kept,
                       parallel=args.parallel, resumable=fits.get,
                       slowdown=lambda m, k: epoch_slowdown(k) if args.smoke else shared_slowdown(reproduction, m, k))
        except Exception:  # noqa: BLE001  the stages kept before the failing one still come back, guarded
            result['failed'] = traceback.format_exc(limit=-8)
            print(f'FAILED: {result["failed"]}', flush=True)
        finally:
            deadline.cancel()
        torch.set_num_threads(all_threads)
        if staged.rows():
            try:
                record_kept_models(args.zoo, args.table, data_dir=args.data_dir)
                guarded = True
            except Exception:  # noqa: BLE001  the kept models still come back; the guard is recorded on the CPU
                result['guard_failed'] = traceback.format_exc(limit=-8)
                print(f'FAILED recording the guard: {result["guard_failed"]}', flush=True)
        keep_for_next_call()
    return guarded

if __name__ == '__main__':
    freeze_at_exit()
    sys.exit(main())
