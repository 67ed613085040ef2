""" The kept zoo, checked: each kept model's weights (SHA-256), its logits of a fixed batch (float32 rounding
bound), the accuracy its card claims and its accuracy on the test split against the results table; and the
recording of that guard """
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..hub.card import card_accuracy
from ..io import atomic_write, atomic_write_text
from ..train.checkpoint import Checkpoint, read_checkpoint
from ..train.data import dataset_info
from .profiles import ReproductionError
from .report import EVAL_PRECISION, evaluate_on_test_split, model_input_size, read_table, say

__all__ = ['ACCURACY_TOLERANCE', 'CARD_TOLERANCE', 'CARD_TOLERANCE_IMAGES', 'GUARD_IMAGES', 'SUBSET_IMAGES',
           'kept_guard_paths', 'logits_tolerance', 'model_as_trained', 'record_kept_models', 'kept_subset_top1',
           'check_kept_models', 'check_keep_target']

# a kept model's accuracy may differ from the table by one image in 10,000 (a float32 tie broken otherwise)
ACCURACY_TOLERANCE = 0.01
# a kept card's model-index claims its training's own evaluation (bf16 autocast on the training's device, of the
# weights before the export rounds them), the table the kept weights' in float32: they may differ by this many
# points, or by CARD_TOLERANCE_IMAGES on a small split (an undertrained model's near-ties flip as weights round).
# 0.03 points apart at most in both kept zoos, where a faulty evaluation was 5.8 points off (docs/training.md,
# "Precision and compilation"); 3 digits of 360 apart in the tiny bf16 zoo of tests/test_zoo_gpu.py, whose models
# stay near chance, where near-ties abound
CARD_TOLERANCE = 0.2
CARD_TOLERANCE_IMAGES = 10
GUARD_IMAGES = 64  # the fixed batch whose logits guard a kept model
SUBSET_IMAGES = 500  # the test images whose recorded top-1 a quick check of another pipeline compares with


def kept_guard_paths(table: Path) -> Dict[str, Path]:
    """The guard of a kept zoo, beside its table: the weights' SHA-256 digests (``sha256sum -c`` reads the file
    in the table's folder) and the logits of a fixed batch of test images per model."""
    table = Path(table)
    return {'digests': table.with_name(f'{table.stem}_weights.sha256'),
            'logits': table.with_name(f'{table.stem}_logits.safetensors')}


def _sha256(path: Path) -> str:
    import hashlib
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def _read_digests(path: Path) -> Dict[str, str]:
    """``{file name as written: digest}`` of a ``sha256sum`` file."""
    digests = {}
    for line in path.read_text(encoding='utf-8').splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            digests[name.lstrip('*')] = digest
    return digests


def _kept_rows(zoo: Path, table: Path) -> List[Dict[str, Any]]:
    """The rows of ``table`` whose models are kept in ``zoo/<model>/``; a :class:`ReproductionError` for a table or
    a model folder that is not there (what --check and --record both read)."""
    table = Path(table)
    if not table.is_file():
        raise ReproductionError(f'--table {table} does not exist: give the results CSV of the kept zoo (a '
                                f"reproduction's results.csv, e.g. docs/reproduction_fashion_mnist.csv)")
    rows = read_table(table)
    if not rows:
        raise ReproductionError(f'{table} holds no results: give the results CSV of the kept zoo')
    for row in rows:
        folder = Path(zoo) / row['model']
        if not (folder / 'model.safetensors').is_file():
            raise ReproductionError(f'{table} lists {row["model"]} but {folder} holds no kept model '
                                    f'(model.safetensors): check the zoo folder ({zoo}), or keep the zoo with '
                                    f'sa-vision-reproduce --out <reproduction> --keep {zoo}')
    return rows


def _read_guard(zoo: Path, table: Path, rows: List[Dict[str, Any]]):
    """(digests, logits) of the guard beside ``table``; a :class:`ReproductionError` where it or a model of the
    table is missing from it: a check without the guard would check neither weights nor logits."""
    from safetensors.torch import load_file
    guard = kept_guard_paths(table)
    record = f'record it with sa-vision-reproduce --check {zoo} --table {table} --record'
    missing = [p.name for p in guard.values() if not p.is_file()]
    if missing:
        raise ReproductionError(f'{table} has no guard beside it ({", ".join(missing)} missing), so the weights '
                                f'(SHA-256) and logits cannot be checked: {record}')
    digests, logits = _read_digests(guard['digests']), load_file(str(guard['logits']))
    named = {Path(name).parts[-2] for name in digests if len(Path(name).parts) >= 2}
    unguarded = [row['model'] for row in rows if row['model'] not in logits or row['model'] not in named]
    if unguarded:
        raise ReproductionError(f'no guard for {", ".join(unguarded)} in {guard["digests"].name} / '
                                f'{guard["logits"].name} (kept after the guard was recorded?): {record}')
    return digests, logits


def _test_split(dataset: str, data_dir: Optional[str], img_size: int):
    """The test split in the training pipeline's preprocessing at ``img_size``."""
    from ..train.data import create_image_dataset
    info = dataset_info(dataset)
    return create_image_dataset(info.name, info.eval_split, is_training=False, data_dir=data_dir, img_size=img_size)


def _first_images(ds):
    """The first :data:`GUARD_IMAGES` images of ``ds`` and their labels."""
    import torch
    items = [ds[i] for i in range(GUARD_IMAGES)]
    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def _guard_batch(dataset: str, data_dir: Optional[str], img_size: int):
    """The first :data:`GUARD_IMAGES` images of the test split and their labels, in the training pipeline's
    preprocessing at ``img_size``, and the split's size."""
    ds = _test_split(dataset, data_dir, img_size)
    return (*_first_images(ds), len(ds))


def logits_tolerance(model, scale: float) -> float:
    """How far two float32 runs of ``model`` may differ, from float32 rounding alone: each reduction of ``n`` terms
    of size ``scale`` is within ``4 sqrt(n) u scale`` (u = 2**-24) of the exact sum, the errors of the reductions
    along the network add up, and two runs (the recorded one and this one) double it (tests/float32_bounds.py
    explains the bound; it holds whatever order a CPU sums in)."""
    import math

    from torch import nn

    from ..layers import PositionalAttention
    lengths = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            lengths.append(module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1])
        elif isinstance(module, nn.Linear):
            lengths.append(module.in_features)
        elif isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
            lengths.append(module.normalized_shape[0] if isinstance(module, nn.LayerNorm) else 1)
        elif isinstance(module, PositionalAttention):  # a weighted sum over every key of the 16x16 grid
            lengths.append(16 * 16)
    lengths.append(32 * 32)  # the global average pool (at most 32x32 positions)
    return 2 * sum(4. * math.sqrt(n) * 2. ** -24 * scale for n in lengths)


def model_as_trained(folder: Path):
    """A kept Hub folder's model as it trained, on the training pipeline's 32x32 images: without the border that the
    export moved into the model (``input_padding``)."""
    ckpt = read_checkpoint(folder)
    trained_args = {k: v for k, v in ckpt.model_args.items() if k not in ('input_padding', 'input_pad_value')}
    return Checkpoint(ckpt.arch, trained_args, ckpt.state_dict, ckpt.source, 'state_dict').create_model()


def record_kept_models(zoo: Path, table: Path, data_dir: Optional[str] = None) -> Dict[str, Path]:
    """Write the guard of the models of ``table`` kept in ``zoo``: each weights file's SHA-256, and each model's
    float32 logits of the first :data:`GUARD_IMAGES` test images plus its top-1 on the first
    :data:`SUBSET_IMAGES`, both through the training pipeline (the dataset's own zero padding, the model as it was
    trained, without ``input_padding``)."""
    import torch
    from safetensors.torch import save_file

    from ..train.evaluation import evaluate
    paths = kept_guard_paths(table)
    rows = _kept_rows(zoo, table)
    digests, logits, subset_top1 = [], {}, {}
    for row in rows:
        folder = Path(zoo) / row['model']
        weights = folder / 'model.safetensors'
        digests.append(f'{_sha256(weights)}  {os.path.relpath(weights, paths["digests"].parent)}')
        model = model_as_trained(folder)
        ds = _test_split(row['dataset'], data_dir, 32)
        images, _ = _first_images(ds)
        with torch.no_grad():
            logits[row['model']] = model(images).float().contiguous()
        card = _card_top1(folder, row, len(ds))
        if card is not None and not card[1]:  # a guard of other weights than the table's would pass them
            raise ReproductionError(f'{folder}: its card claims top-1 {card[0]:.2f}, {table} {float(row["top1"]):.2f}: '
                                    f'the table is not of these weights, so no guard is written. Record a zoo with '
                                    f'its own table (the results.csv of the reproduction that kept it)')
        subset = torch.utils.data.Subset(ds, range(min(SUBSET_IMAGES, len(ds))))
        loader = torch.utils.data.DataLoader(subset, batch_size=500)
        subset_top1[row['model']] = round(evaluate(model, loader, 'cpu')['top1'], 2)
        images = 'all' if len(subset) == len(ds) else 'the first'
        say(f'{row["model"]}: recorded; top-1 {subset_top1[row["model"]]:.2f} on {images} {len(subset)} test images')
    atomic_write_text(paths['digests'], '\n'.join(digests) + '\n')
    with atomic_write(paths['logits']) as tmp:
        save_file(logits, str(tmp), metadata={'images': f'the first {GUARD_IMAGES} of the test split',
                                              'subset_images': str(SUBSET_IMAGES),
                                              'subset_top1': json.dumps(subset_top1)})
    return paths


def _card_top1(folder: Path, row: Dict[str, Any], split_size: int) -> Optional[Tuple[float, bool]]:
    """(the top-1 the card of the model kept in ``folder`` claims, whether the table's ``row`` says the same within
    :data:`CARD_TOLERANCE` points or :data:`CARD_TOLERANCE_IMAGES` images of a split of ``split_size``), or None
    where the card claims none."""
    card = folder / 'README.md'
    claimed = card_accuracy(card.read_text(encoding='utf-8')).get('top1') if card.is_file() else None
    if claimed is None:
        return None
    tolerance = max(CARD_TOLERANCE, 100. * CARD_TOLERANCE_IMAGES / split_size)
    return claimed, abs(claimed - float(row['top1'])) <= tolerance + 1e-9


def kept_subset_top1(table: Path) -> Dict[str, float]:
    """The recorded top-1 of each kept model on the first :data:`SUBSET_IMAGES` test images (training pipeline)."""
    from safetensors import safe_open
    with safe_open(str(kept_guard_paths(table)['logits']), 'pt') as f:
        return json.loads(f.metadata()['subset_top1'])


def check_kept_models(zoo: Path, table: Path, data_dir: Optional[str] = None,
                      accuracy: bool = True) -> List[Dict[str, Any]]:
    """Check the models of ``table`` (a results CSV) kept in ``zoo/<model>/``: their weights' SHA-256 and their
    logits of a fixed batch against the guard beside the table (:func:`record_kept_models`; a
    :class:`ReproductionError` without it), the top-1 its card claims against the table's (within
    :data:`CARD_TOLERANCE` points or :data:`CARD_TOLERANCE_IMAGES` images), and, with ``accuracy``, top-1 / top-5
    on the whole test split against the table (minutes per model on a CPU)."""
    import torch
    rows = _kept_rows(zoo, table)
    digests, recorded = _read_guard(zoo, table, rows)
    checked = []
    for row in rows:
        folder = Path(zoo) / row['model']
        ckpt = read_checkpoint(folder)
        model = ckpt.create_model()
        result, notes = {'model': row['model']}, []
        weights = folder / 'model.safetensors'
        expected = [d for name, d in digests.items() if Path(name).parts[-2:] == weights.parts[-2:]]
        result['digest_ok'] = expected == [_sha256(weights)]
        images, _, split_size = _guard_batch(row['dataset'], data_dir, model_input_size(model))
        with torch.no_grad():
            logits = model.float()(images).float()
        reference = recorded[row['model']]
        result['logits_max_diff'] = (logits - reference).abs().max().item()
        result['logits_tolerance'] = logits_tolerance(model, reference.abs().max().item())
        result['logits_ok'] = result['logits_max_diff'] <= result['logits_tolerance']
        notes.append(f'weights {"ok" if result["digest_ok"] else "CHANGED (SHA-256)"}, logits of '
                     f'{GUARD_IMAGES} images within {result["logits_max_diff"]:.1e} '
                     f'(tolerance {result["logits_tolerance"]:.1e})')
        card = _card_top1(folder, row, split_size)
        if card is not None:
            result['card_top1'], result['card_ok'] = card
            why = ('these weights are not the ones the table reports (their SHA-256 differs too): check a zoo '
                   'against its own table' if not result['digest_ok'] else
                   'the card reports its training\'s own evaluation, which was wrong; measure the weights '
                   '(sa-vision-validate) and correct the card\'s model-index, or train again (docs/training.md, '
                   '"Precision and compilation")')
            notes.append(f'card top-1 {card[0]:.2f}' + (
                '' if card[1] else f' is not the table\'s {float(row["top1"]):.2f}: {why}'))
        if accuracy:
            precision = row.get('eval_precision') or EVAL_PRECISION
            say(f'{row["model"]}: evaluating its {split_size:,} test images in {precision} ...')  # minutes on a CPU
            start = time.monotonic()
            measured = evaluate_on_test_split(model, row['dataset'], data_dir, precision=precision)
            result['accuracy_seconds'] = round(time.monotonic() - start, 1)
            result.update(precision=precision, num_images=measured.get('num_images'))
            for key in ('top1', 'top5'):
                result[key], result[f'{key}_table'] = round(measured[key], 2), float(row[key])
            result['accuracy_ok'] = all(abs(result[k] - result[f'{k}_table']) <= ACCURACY_TOLERANCE + 1e-9
                                        for k in ('top1', 'top5'))
            notes.append(f'top-1 {result["top1"]:.2f} (table {result["top1_table"]:.2f}), top-5 '
                         f'{result["top5"]:.2f} (table {result["top5_table"]:.2f}) in {precision} on '
                         f'{result["num_images"]} images ({result["accuracy_seconds"]:.0f} s)')
        result['ok'] = all(result[k] for k in ('digest_ok', 'logits_ok', 'card_ok', 'accuracy_ok') if k in result)
        say(f'{row["model"]}: {"; ".join(notes)}: {"ok" if result["ok"] else "DIFFERS"}')
        checked.append(result)
    return checked


def check_keep_target(dest: Path, dataset: str) -> None:
    """A :class:`ReproductionError` where copying a reproduction's Hub folders to ``dest/<model>/`` (``--keep``)
    would replace models trained on another dataset, or remove files an export does not write; checked before any
    training, nothing is changed."""
    from ..hub.labels import EXPORT_FILES
    from ..io import folder_problem
    from ..train.data import dataset_for_tag
    from .profiles import TABLE_ORDER
    problem = folder_problem(dest)
    if problem:
        raise ReproductionError(f'--keep {dest}: {problem}')
    for target in (Path(dest) / model for model in TABLE_ORDER):
        if not target.exists():
            continue
        config = target / 'config.json'
        tag = ((json.loads(config.read_text(encoding='utf-8')).get('pretrained_cfg') or {}).get('tag', '')
               if config.is_file() else '')
        if dataset_for_tag(tag) != dataset_info(dataset).name:
            raise ReproductionError(
                f'--keep {dest}: {target} holds weights of another dataset (tag {tag or "none"}), and this '
                f'reproduction trains on {dataset}: keeping would replace them. Keep it in a folder of its own, or '
                f'remove {target} first')
        others = sorted(f.name for f in target.iterdir() if f.name not in EXPORT_FILES)
        if others:
            raise ReproductionError(f'--keep {dest}: keeping would remove {", ".join(others)} from {target}, which '
                                    f'no export writes: move them elsewhere first')
