""" The pruning stage of :class:`~sa_vision.reproduce.stages.Reproduction`: degenerate heads of the trained
generalized model pruned, the pruned model evaluated, ``pruned.pth`` and ``pruning.json`` written """
import json
import shutil
import time
from pathlib import Path
from typing import Any, Dict, Optional

from ..io import atomic_write_text
from ..train.checkpoint import RUN_CHECKPOINT, Checkpoint, read_checkpoint
from ..train.data import dataset_info
from .profiles import PRUNE_SOURCE, PRUNED_MODEL
from .provenance import weights_sha256
from .report import say

__all__ = ['prune_stage']


def prune_stage(reproduction, source_path: Optional[Path] = None, before: Optional[Dict[str, Any]] = None) -> Path:
    """:meth:`Reproduction.prune <sa_vision.reproduce.stages.Reproduction.prune>` of ``reproduction``: its
    ``source_path`` and ``before`` as there; skipped when ``pruning.json`` holds the source's weights digest."""
    out, report_path = reproduction.out / 'pruned.pth', reproduction.out / 'pruning.json'
    source_path = Path(source_path or reproduction.run_dir(PRUNE_SOURCE) / RUN_CHECKPOINT)
    source = read_checkpoint(source_path)
    digest = weights_sha256(source.state_dict)
    done = json.loads(report_path.read_text(encoding='utf-8')) if out.is_file() and report_path.is_file() else {}
    if done.get('source_weights_sha256') == digest:
        say(f'pruning: done ({done["kept_heads_per_layer"]} heads kept), skipped')
        return out
    finetuned = reproduction.run_dir(PRUNED_MODEL)
    if done or finetuned.exists():  # of other weights, or of a pruning that kept no digest: made anew
        say(f'pruning: {out.name} and {finetuned} are not of the weights now in {source_path} (pruning.json '
            f'holds another digest, or none): pruning and fine-tuning anew')
        shutil.rmtree(finetuned, ignore_errors=True)
    from ..research import pruning
    say(f'pruning: reading {source_path}')
    # a Hub folder's model pads the dataset's images itself; fine-tuning trains on the padded ones, as its source
    model = Checkpoint(source.arch, {k: v for k, v in source.model_args.items() if not k.startswith('input_pad')},
                       source.state_dict, source.source, source.format).create_model()
    before = before or source.meta.get('metrics') or {}  # a Hub folder keeps no metrics
    degenerate = pruning.find_degenerate_heads(model)
    heads = pruning.select_heads_to_prune(model)  # a layer keeps at least its least degenerate head
    # numbered from 1 in the log and pruning.json (which says so: older ones counted from 0), as sa-vision-prune
    numbered = {'heads_numbered_from': 1, 'degenerate_heads': pruning.numbered_heads(degenerate),
                'pruned_heads': pruning.numbered_heads(heads)}
    say(f'pruning: degenerate heads per layer {numbered["degenerate_heads"]}, pruning {numbered["pruned_heads"]} '
        f'(sa-vision-prune\'s default thresholds; a layer keeps at least one head)')
    pruned = pruning.prune_heads(model, heads)
    info = dataset_info(reproduction.dataset)
    say(f'pruning: evaluating the pruned model ({list(pruned.heads_per_layer)} heads) on the {info.title} '
         f'{info.eval_split} split ...')
    started = time.time()
    after = reproduction._evaluate(pruned)
    say(f'pruning: evaluated {after.get("num_images", "")} images in {time.time() - started:.0f} s; writing {out}')
    pruning.save_pruned(pruned, out, heads)
    report = {
        'source': str(source_path), 'source_weights_sha256': digest, **numbered,
        'heads_removed_per_layer': [len(h) for h in heads],
        'kept_heads_per_layer': list(pruned.heads_per_layer),
        'top1_before_pruning': before.get('top1'), 'top1_after_pruning': after['top1'],
        'top5_before_pruning': before.get('top5'), 'top5_after_pruning': after['top5'],
    }
    atomic_write_text(report_path, json.dumps(report, indent=1))
    say(f'pruning: removed {report["heads_removed_per_layer"]} heads per layer, kept '
         f'{report["kept_heads_per_layer"]}; top-1 {before.get("top1", float("nan")):.2f} % before, '
         f'{after["top1"]:.2f} % after pruning (before fine-tuning)')
    return out
