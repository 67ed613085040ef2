""" :class:`StagedZoo`: a zoo kept model by model, so that GPU calls of a few minutes each can share one profile

Each stage trains one model, evaluates its weights as they are kept (the profile's ``kept_dtype``), exports its Hub
folder into ``ZOO/<model>/`` and adds its row to the zoo's results table, before the next stage starts. A model
whose folder and row are both there is skipped, so the same call in a later session continues where the last
ended. The pruned model is pruned from its source as kept in the zoo (the weights its row reports), so it needs
``ZOO/sa_gen_cifar/`` only, not the source's training run. No stage starts that the time left would not fit.
"""
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ..io import atomic_folder, atomic_write
from .profiles import PRUNE_SOURCE, PRUNED_MODEL, TRAINED_MODELS
from .report import RESULT_COLUMNS, read_table, say, write_table
from .stages import Reproduction

__all__ = ['KEPT_FILES', 'STAGE_ORDER', 'StagedZoo']

KEPT_FILES = ('config.json', 'model.safetensors', 'README.md')  # the export writes README.md last
# the models in the order the stages run: the pruned model right after its source
STAGE_ORDER = tuple(m for source in TRAINED_MODELS for m in ((source, PRUNED_MODEL) if source == PRUNE_SOURCE
                                                             else (source,)))


class StagedZoo:
    """The stages of ``reproduction``'s profile kept one by one into ``zoo`` (``zoo/<model>/`` Hub folders) and
    ``table`` (a results CSV; its Markdown is ``reproduction.out / 'results.md'``)."""

    def __init__(self, reproduction: Reproduction, zoo, table):
        self.reproduction, self.zoo, self.table = reproduction, Path(zoo), Path(table)

    def rows(self) -> Dict[str, Dict[str, Any]]:
        """The rows of the zoo's table, by model."""
        if not self.table.is_file():
            return {}
        return {row['model']: row for row in read_table(self.table)}

    def is_kept(self, model: str) -> bool:
        """Whether ``model``'s stage is done: its Hub folder is complete and the table has its row."""
        return all((self.zoo / model / name).is_file() for name in KEPT_FILES) and model in self.rows()

    def missing(self) -> List[str]:
        return [m for m in STAGE_ORDER if not self.is_kept(m)]

    def stage(self, model: str) -> Dict[str, Any]:
        """Train, evaluate, export and keep ``model``; returns its row of the table."""
        r = self.reproduction
        initial = r.prune(self.zoo / PRUNE_SOURCE) if model == PRUNED_MODEL else None
        r.train(model, initial_checkpoint=initial)
        [row] = r.table([model], quiet=True)
        [folder] = r.export([model])
        with atomic_folder(self.zoo / model) as partial:
            shutil.copytree(folder, partial, dirs_exist_ok=True)
        rows = {**self.rows(), model: row}
        ordered = [rows[m] for m in STAGE_ORDER if m in rows]
        markdown = write_table(r.out, 'results', RESULT_COLUMNS, ordered, r.profile.table_note)
        self.table.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(self.table) as tmp:
            shutil.copy(r.out / 'results.csv', tmp)
        say(f'kept {model} in {self.zoo / model}, its row in {self.table}\n{markdown}')
        return row

    def run(self, budget_s: float, estimate_s: Callable[[str], float],
            on_stage: Optional[Callable[[str, float], None]] = None) -> List[str]:
        """The missing stages, in :data:`STAGE_ORDER`, while the time left fits them: a stage starts only if its
        ``estimate_s(model)`` (scaled by how the stages so far compared with theirs, 0.5x to 3x) fits the seconds
        left of ``budget_s``; one that does not is left for the next call (a later, shorter one may still start).
        The pruned model waits for its source. Returns the models kept; ``on_stage(model, seconds)`` after each."""
        self.reproduction._check_same_setup()
        start, spent, kept = time.time(), [], []
        for model in self.missing():
            if model == PRUNED_MODEL and not self.is_kept(PRUNE_SOURCE):
                say(f'{model}: waits for {PRUNE_SOURCE} to be kept (it is pruned from the kept weights)')
                continue
            scale = min(max(sum(a for _, a in spent) / sum(e for e, _ in spent), 0.5), 3.0) if spent else 1.0
            expected, left = estimate_s(model) * scale, budget_s - (time.time() - start)
            if expected > left:
                say(f'{model}: not started: it needs ~{expected:.0f} s, {left:.0f} s of the budget are left')
                continue
            say(f'{model}: starting (~{expected:.0f} s expected, {left:.0f} s left)')
            t0 = time.time()
            self.stage(model)
            spent.append((estimate_s(model), time.time() - t0))
            kept.append(model)
            if on_stage:
                on_stage(model, spent[-1][1])
        return kept
