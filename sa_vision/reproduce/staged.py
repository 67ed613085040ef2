""" :class:`StagedZoo`: a zoo kept model by model, so that GPU calls of a few minutes each can share one profile

Each stage trains one model, evaluates its weights as they are kept (the profile's ``kept_dtype``), exports its Hub
folder into ``ZOO/<model>/`` and adds its row to the zoo's results table. A model whose folder and row are both there
is skipped, so the same call in a later session continues where the last ended. The pruned model is pruned from its
source as kept in the zoo (the weights its row reports), so it needs ``ZOO/sa_gen_cifar/`` only, not the source's
training run. Several stages may run at a time (their trainings share the device); no stage starts that the time
left would not fit, but one that only a later call can finish where the caller keeps its run folder for that call
(:meth:`StagedZoo.stop` ends the trainings at the deadline; the next call's ``Reproduction`` continues each from its
last epoch).
"""
import contextlib
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import write_failure
from ..hub.export import check_export_folder
from ..hub.labels import HUB_FOLDER_FILES
from ..io import atomic_folder, atomic_write
from .profiles import PRUNE_SOURCE, PRUNED_MODEL, TRAINED_MODELS, StageFailed, StageStopped
from .report import RESULT_COLUMNS, read_table, say, write_table
from .stages import Reproduction

__all__ = ['STAGE_ORDER', 'StagedZoo']

# the models in the order the stages run: the pruned model right after its source
STAGE_ORDER = tuple(m for source in TRAINED_MODELS for m in ((source, PRUNED_MODEL) if source == PRUNE_SOURCE
                                                             else (source,)))


class StagedZoo:
    """The stages of ``reproduction``'s profile kept one by one into ``zoo`` (``zoo/<model>/`` Hub folders) and
    ``table`` (a results CSV; its Markdown is ``reproduction.out / 'results.md'``)."""

    def __init__(self, reproduction: Reproduction, zoo, table):
        self.reproduction, self.zoo, self.table = reproduction, Path(zoo), Path(table)
        self._table_lock = threading.Lock()  # stages running side by side each add their row
        self.stopped: List[str] = []  # the stages that :meth:`stop` ended, left to the next call
        self.running: Dict[str, Future] = {}  # the stages running now (:meth:`run`)

    def stop(self) -> None:
        """End the running trainings and start no other stage (:meth:`Reproduction.stop`): each stopped stage's run
        folder keeps its last finished epoch, from which a later call with that folder continues it."""
        self.reproduction.stop()

    def rows(self) -> Dict[str, Dict[str, Any]]:
        """The rows of the zoo's table, by model."""
        if not self.table.is_file():
            return {}
        return {row['model']: row for row in read_table(self.table)}

    def is_kept(self, model: str, rows: Optional[Dict[str, Any]] = None) -> bool:
        """Whether ``model``'s stage is done: its Hub folder is complete and the table (or ``rows`` read from it)
        has its row."""
        # a complete export (the export writes README.md last)
        return (all((self.zoo / model / name).is_file() for name in HUB_FOLDER_FILES)
                and model in (self.rows() if rows is None else rows))

    def missing(self) -> List[str]:
        return [m for m in STAGE_ORDER if not self.is_kept(m)]

    def stage(self, model: str) -> Dict[str, Any]:
        """Train, evaluate, export and keep ``model``; returns its row of the table."""
        r = self.reproduction
        initial = (r.prune(self.zoo / PRUNE_SOURCE, before=self.rows().get(PRUNE_SOURCE)) if model == PRUNED_MODEL
                   else None)
        r.train(model, initial_checkpoint=initial)
        [row] = r.table([model], quiet=True, write=False)
        [folder] = r.export([model])
        check_export_folder(self.zoo / model)  # put there while it trained
        with atomic_folder(self.zoo / model) as partial:
            shutil.copytree(folder, partial, dirs_exist_ok=True)
        with self._table_lock:
            rows = {**self.rows(), model: row}
            ordered = [rows[m] for m in STAGE_ORDER if m in rows]
            markdown = write_table(r.out, 'results', RESULT_COLUMNS, ordered, r.profile.table_note)
            self.table.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.table) as tmp:
                shutil.copy(r.out / 'results.csv', tmp)
        say(f'kept {model} in {self.zoo / model}, its row in {self.table}\n{markdown}')
        return row

    def run(self, budget_s: float, estimate_s: Callable[[str], float],
            on_stage: Optional[Callable[[str, float], None]] = None, parallel: int = 1,
            resumable: Callable[[str], bool] = lambda model: False,
            slowdown: Optional[Callable[[str, int], float]] = None) -> List[str]:
        """The missing stages, in :data:`STAGE_ORDER`, up to ``parallel`` at a time, while the time left fits them.

        ``estimate_s(model)`` is a stage's seconds when it runs alone. What the running stages have still to do is
        their share of epochs not yet done (at least a fifth: evaluation and export follow the last epoch), scaled
        by how the kept stages' own wall times compared with what was expected of them (:class:`_Budget`).
        Without ``slowdown``, a stage starts only if the seconds left of ``budget_s`` fit it together with what the
        running stages have still to do, all as if run one after another: sharing the device should be no worse.
        ``slowdown(model, k)``, the caller's measure of its device, is how many times its alone seconds a stage
        takes while ``k`` stages run side by side (1 for ``k`` = 1, not decreasing in ``k``): then a stage starts
        only if, with it, each running stage and the new one, at that many times what it has still to do, ends
        within the seconds left; a stage ending lets the others speed up. Either way a stage started ends in time
        if the estimates hold. One that does not fit is left for the
        next call (a later, shorter one may still start), except where ``resumable(model)`` says that the caller
        keeps its run folder for the next call: then, with no stage running, the first that does not fit starts
        anyway, to be stopped (:meth:`stop`) and continued. A stage whose run folder holds finished epochs (a
        stage continued) is expected to take only the share of its estimate left. The pruned model waits for its
        source. A failing stage lets the running ones end, starts no other and is raised as :class:`StageFailed`
        naming it; stopped stages are listed in :attr:`stopped`. A zoo folder holding files of no export is refused
        before any stage starts (:func:`~sa_vision.hub.export.check_export_folder`). Returns the models kept;
        ``on_stage(model, seconds)`` after each.
        """
        if parallel < 1:
            raise ValueError(f'parallel must be at least 1, got {parallel}')
        self.reproduction._check_same_setup()
        for model in self.missing():  # a zoo folder holding files of no export (a link's folder) is never replaced
            check_export_folder(self.zoo / model)
        tagged, self.reproduction.tag_output = self.reproduction.tag_output, parallel > 1  # lines interleave
        try:
            kept, failures = self._run_stages(_Budget(self, budget_s, estimate_s, resumable, slowdown), on_stage,
                                              parallel)
        finally:
            self.reproduction.tag_output = tagged
        if failures:
            model, error = failures[0]
            what = write_failure(error) or f'{type(error).__name__}: {error}'  # a full disk: why, in words
            raise StageFailed(f'stage {model} failed: {what}') from error
        return kept

    def _run_stages(self, budget: '_Budget', on_stage: Optional[Callable[[str, float], None]],
                    parallel: int) -> Tuple[List[str], List[Tuple[str, BaseException]]]:
        """:meth:`run`'s loop: the models kept, and the failed ones with their errors."""
        kept: List[str] = []
        failures: List[Tuple[str, BaseException]] = []
        running = self.running = {}
        self.stopped = []
        with ThreadPoolExecutor(parallel) as pool, self._stopped_on_interrupt():
            while True:
                for model in [m for m, future in running.items() if future.done()]:
                    error = running.pop(model).exception()
                    if isinstance(error, StageStopped):
                        say(str(error))
                        self.stopped.append(model)
                        continue
                    if error is not None:
                        say(f'{model}: failed: {type(error).__name__}: {error}')
                        failures.append((model, error))
                        continue
                    seconds = budget.finished(model)
                    kept.append(model)
                    if on_stage:
                        on_stage(model, seconds)
                while not failures and not self.reproduction.stopped and len(running) < parallel:
                    model = budget.next_to_start(running)
                    if model is None:
                        break
                    running[model] = pool.submit(self.stage, model)
                if not running:
                    break
                wait(running.values(), timeout=_POLL_S, return_when=FIRST_COMPLETED)
        if not failures and not self.reproduction.stopped:
            budget.say_left_out()
        return kept, failures

    @contextlib.contextmanager
    def _stopped_on_interrupt(self):
        """Ctrl-C (in this thread only) stops the trainings, whose threads then end: the pool waits for them."""
        try:
            yield
        except KeyboardInterrupt:
            self.stop()
            raise


_POLL_S = 5.0  # how often the running stages' progress is read while none ends
_MOST_PROGRESS = 0.8  # a running stage's share of its estimate counted as done at most (the rest: after training)


class _Budget:
    """When a stage of a :class:`StagedZoo` may start: the work of the running stages and of the new one, at the
    rate measured so far, must fit the seconds left (see :meth:`StagedZoo.run`)."""

    def __init__(self, staged: StagedZoo, budget_s: float, estimate_s: Callable[[str], float],
                 resumable: Callable[[str], bool] = lambda model: False,
                 slowdown: Optional[Callable[[str, int], float]] = None):
        self.staged, self.budget_s, self.estimate_s, self.resumable = staged, budget_s, estimate_s, resumable
        self.slowdown = slowdown
        self.start = time.time()
        self.started: Dict[str, float] = {}
        self.estimated: Dict[str, float] = {}  # each started stage's estimate of what it had left to do
        self.seconds: Dict[str, float] = {}  # of the stages kept
        self.alone_s: Dict[str, float] = {}  # each started stage's wall seconds so far, counted at its alone speed
        self._sharing: Tuple[str, ...] = ()  # the stages running since ``_since``
        self._since = self.start

    def progress(self, model: str) -> float:
        """The fraction of a running stage's epochs done (the rows of its run's ``summary.csv``), at most
        :data:`_MOST_PROGRESS` until the stage ends: its evaluation and export come after its last epoch."""
        r = self.staged.reproduction
        summary = r.run_dir(model) / 'summary.csv'
        if not summary.is_file():
            return 0.0
        epochs = r.profile.recipe(model, r.dataset, None if model == PRUNED_MODEL else r.epochs)['epochs']
        return min(max(len(summary.read_text(encoding='utf-8').splitlines()) - 1, 0) / epochs, _MOST_PROGRESS)

    def shared(self, model: str, k: int) -> float:
        """How many times its alone seconds ``model`` takes while ``k`` stages run side by side (1 without
        ``slowdown``)."""
        return 1.0 if self.slowdown is None else self.slowdown(model, k)

    def _advance(self, running=None) -> None:
        """Count the seconds since the last look into :attr:`alone_s` of each stage that ran in them, a second
        beside ``k - 1`` others as ``1 / shared(model, k)`` of a second alone; then ``running`` runs from now."""
        now = time.time()
        for model in self._sharing:
            self.alone_s[model] = (self.alone_s.get(model, 0.0)
                                   + (now - self._since) / self.shared(model, len(self._sharing)))
        self._since = now
        if running is not None:
            self._sharing = tuple(running)

    def scale(self) -> float:
        """The kept stages' own wall seconds per second of their estimates (1 until a stage has ended; 0.25x to 3x),
        each second a stage ran beside others counted as ``1 / shared`` of a second (:attr:`alone_s`): a stage
        that ran side by side as ``slowdown`` expects counts 1, and so it is not slowed twice. Each stage's own: a
        rate over the whole call would count what running side by side gained, and a stage admitted on it that
        then runs alone would overrun."""
        if not self.seconds:
            return 1.0
        return min(max(sum(self.alone_s[m] for m in self.seconds) / sum(self.estimated[m] for m in self.seconds),
                       0.25), 3.0)

    def left_to_do(self, model: str) -> float:
        """``model``'s estimate less the share of its epochs done (a running stage, or one continued)."""
        return (1 - self.progress(model)) * self.estimate_s(model)

    def finished(self, model: str) -> float:
        self._advance(m for m in self._sharing if m != model)
        self.seconds[model] = self._since - self.started[model]
        return self.seconds[model]

    def waiting(self) -> List[str]:
        return [m for m in self.staged.missing() if m not in self.started]

    def next_to_start(self, running) -> Optional[str]:
        """The first waiting stage that fits the time left beside the running ones, marked started; else None."""
        self._advance(running)
        scale, left = self.scale(), self.budget_s - (time.time() - self.start)
        waiting = [m for m in self.waiting() if m != PRUNED_MODEL or self.staged.is_kept(PRUNE_SOURCE)]
        for model in waiting:
            fits, why = self._fits(model, running, scale, left)
            if fits:
                return self._start(model, why)
        resumable = [m for m in waiting if self.resumable(m)]
        # with less left than a stage's part outside its epochs (process start, compile; evaluation, export) it
        # would train no epoch
        if not running and resumable and left > (1 - _MOST_PROGRESS) * scale * self.left_to_do(resumable[0]):
            model = resumable[0]
            return self._start(model, f'~{scale * self.left_to_do(model):.0f} s expected, {left:.0f} s left: stopped '
                                      f'at the end, its run kept for the next call')
        return None

    def _fits(self, model: str, running, scale: float, left: float) -> Tuple[bool, str]:
        """Whether ``model``, started now beside ``running``, is expected to end within ``left`` seconds, and each
        running one too; and the numbers, to say why."""
        expected = scale * self.left_to_do(model)
        if self.slowdown is None:  # as if one after another: the new stage ends behind all the running ones
            queued = scale * sum(self.left_to_do(m) for m in running)
            behind = f', behind ~{queued:.0f} s of the {len(running)} running' if running else ''
            return queued + expected <= left, f'~{expected:.0f} s expected{behind}, {left:.0f} s left'
        together = len(running) + 1
        ends = [scale * self.left_to_do(m) * self.shared(m, together) for m in running]
        expected *= self.shared(model, together)
        beside = (f' beside the {len(running)} running, the last of them ending in ~{max(ends):.0f} s' if running
                  else '')
        return max([expected, *ends]) <= left, f'~{expected:.0f} s expected{beside}, {left:.0f} s left'

    def _start(self, model: str, why: str) -> str:
        say(f'{model}: starting ({why})')
        self._advance((*self._sharing, model))
        self.started[model], self.estimated[model], self.alone_s[model] = self._since, self.left_to_do(model), 0.0
        return model

    def say_left_out(self) -> None:
        left = self.budget_s - (time.time() - self.start)
        for model in self.waiting():
            if model == PRUNED_MODEL and not self.staged.is_kept(PRUNE_SOURCE):
                say(f'{model}: waits for {PRUNE_SOURCE} to be kept (it is pruned from the kept weights)')
            else:
                say(f'{model}: not started: it needs ~{self.scale() * self.left_to_do(model):.0f} s, {left:.0f} s '
                    f'of the budget are left')
