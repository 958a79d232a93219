"""The accuracy memo of discovery: within an `accuracy_memo` (``discover`` opens one per
call) an evaluation already made is answered from the memo (`accuracy`), not run again."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from torch import Tensor

from ..core.errors import GnaTypeError
from ..core.interventions import Ablate, Intervention, SkipLayers, Truncate
from ..cost import COUNTS, charge
from ..scoring.evaluation import evaluate

if TYPE_CHECKING:
    from ..cost import Cost
    from ..models.handle import GnaModel
    from ..tasks.base import Task


class AccuracyMemo:
    """Task accuracies already measured on one model (`accuracy_memo`), keyed by everything
    that changes the forward: the task (by its contents, `task_key`, computed once per task
    object: the memo holds it, so its id is not reused), each intervention (`memo_key`) and
    the model's own active interventions. The keys are plain values (strings, tuples, bytes,
    `Head`, `SkipLayers`, `Truncate`): they pickle, and mean the same in another process
    (`discovery.run_dir` keeps them across a crash).

    Attributes:
        model: the model the accuracies were measured on.
        values: ``key -> accuracy``.
        hits: evaluations answered from the memo (forwards not run again).
        measured: ``key -> (stage, counts)`` for the values recorded here: the stage running
            then (`stage`) and what the forward cost (`cost.COUNTS` of the open meter; empty
            without one, or for a value recorded by `remember`).
        pending: ``key -> counts`` of values read back from an unfinished stage of an earlier
            run: the first hit charges them to the open meters, as the forward did then.
        stage: the index of the stage running (set by `plan.run`; ``-1``: none).
        on_new: called after each new value (the run directory saves the memo).
    """

    def __init__(self, model: GnaModel) -> None:
        self.model = model
        self.values: dict[tuple, float] = {}
        self.tasks: dict[int, Task] = {}
        self.task_keys: dict[int, str] = {}
        self.hits = 0
        self.measured: dict[tuple, tuple[int, dict[str, int]]] = {}
        self.pending: dict[tuple, dict[str, int]] = {}
        self.stage = -1
        self.on_new: Callable[[], None] | None = None
        # first-order attributions already run (`sizes.importance_order`: one backward per
        # chunk serves each role's entry layer); not kept by a run directory
        self.attributions: dict[tuple, object] = {}

    def task_key(self, task: Task) -> str:
        """``task``'s content key (`task_key`), computed once per task held."""
        if id(task) not in self.task_keys:
            self.tasks[id(task)] = task
            self.task_keys[id(task)] = task_key(task)
        return self.task_keys[id(task)]


def task_key(task: Task) -> str:
    """A SHA-256 of what a task's evaluation reads: its name, each example's text, segments,
    query, candidates and correct index, and its tokenizer's class and vocabulary size (not
    its path: a toy's tokenizer is written to a new temporary folder in each process)."""
    digest = hashlib.sha256()
    tokenizer = task.tokenizer
    digest.update(repr((task.name, type(tokenizer).__name__, getattr(tokenizer, "vocab_size", None))).encode())
    for example in task.examples:
        digest.update(repr((example.text, example.segments, example.query, example.candidates, example.correct)).encode())
    return digest.hexdigest()


_MEMO: ContextVar[AccuracyMemo | None] = ContextVar("gna_accuracy_memo", default=None)


@contextmanager
def accuracy_memo(model: GnaModel) -> Iterator[AccuracyMemo]:
    """Within the block, an evaluation of ``model`` by the scans (`accuracy`) that repeats one
    already made (the same task, interventions and ambient interventions) returns the
    accuracy measured then, without a forward: the same forward would give the same number.
    ``discover`` opens one per call: a set the joint search or the confirmation measures
    again (a group of the head scan, a head the entry scan ablated at the same positions)
    is paid once. Interventions `memo_key` cannot key (a patch, a mean or resample
    ablation, an attention mask) are always run.

    Inside the block the model (its weights, swapped blocks) and a task's contents must not
    change: a task's key is computed from its contents once, and a value is reused without
    looking at either again."""
    token = _MEMO.set(AccuracyMemo(model))
    try:
        yield _MEMO.get()  # type: ignore[misc]
    finally:
        _MEMO.reset(token)


def _positions_key(positions: object) -> object:
    if isinstance(positions, bool):  # True == 1: never key it as a position
        raise GnaTypeError(f"positions={positions!r}: not a kind the memo keys")
    if positions is None or isinstance(positions, int):
        return positions
    if isinstance(positions, Tensor):
        return (str(positions.dtype), tuple(positions.shape), positions.detach().cpu().numpy().tobytes())
    if isinstance(positions, Sequence) and all(isinstance(p, int) and not isinstance(p, bool) for p in positions):
        return ("ints", tuple(positions))
    raise GnaTypeError(f"positions={positions!r}: not a kind the memo keys")


def memo_key(interventions: Sequence[Intervention]) -> tuple | None:
    """A hashable key for ``interventions``, equal exactly when they run the same forward:
    a zero `Ablate` by its set of heads (the order does not change a zero ablation) and its
    positions (a tensor by dtype, shape and bytes), `SkipLayers` and `Truncate` as they are.
    ``None`` for anything else (not memoised)."""
    parts: list[object] = []
    for item in interventions:
        if isinstance(item, Ablate) and item.how == "zero" and item.corrupt is None:
            try:
                where = _positions_key(item.positions)
            except TypeError:
                return None
            parts.append(("ablate", tuple(sorted(set(item.heads))), where))
        elif isinstance(item, (SkipLayers, Truncate)):
            parts.append(item)
        else:
            return None
    return tuple(parts)


def _memo_entry(memo: AccuracyMemo | None, model: GnaModel, task: Task, interventions: Sequence[Intervention]) -> tuple | None:
    """The open memo's key for evaluating ``interventions`` on ``task`` (the task's identity, the
    ambient and the given interventions' `memo_key`); ``None`` where no memo of ``model`` is open
    or either cannot be keyed."""
    if memo is None or memo.model is not model:
        return None
    ambient, own = memo_key(model.active_interventions), memo_key(interventions)
    return None if ambient is None or own is None else (memo.task_key(task), ambient, own)


def accuracy(model: GnaModel, task: Task, interventions: Sequence[Intervention] = (), *, progress: bool | None = False) -> float:
    """`evaluate`'s accuracy (``progress``: its per-batch bar; the scans draw their own), from
    the open `accuracy_memo` where the same evaluation was made before."""
    memo = _MEMO.get()
    key = _memo_entry(memo, model, task, interventions)
    if key is not None and key in memo.values:  # type: ignore[union-attr]
        memo.hits += 1  # type: ignore[union-attr]
        counts = memo.pending.pop(key, None)  # type: ignore[union-attr]
        if counts:  # measured by an unfinished stage of an earlier run: its cost, as then
            charge(model.backend, **counts)
        return memo.values[key]  # type: ignore[union-attr]
    meters = getattr(model.backend, "_cost_meters", None) or [None]
    before = _counts(meters[0])
    value = evaluate(model, task, interventions, progress=progress).accuracy
    if key is not None:
        after = _counts(meters[0])
        memo.values[key] = value  # type: ignore[union-attr]
        memo.measured[key] = (memo.stage, {k: after[k] - before[k] for k in after if after[k] != before[k]})  # type: ignore[union-attr]
        if memo.on_new is not None:  # type: ignore[union-attr]
            memo.on_new()  # type: ignore[union-attr]
    return value


def _counts(meter: Cost | None) -> dict[str, int]:
    return {} if meter is None else {name: getattr(meter, name) for name in COUNTS}


def remember(model: GnaModel, task: Task, interventions: Sequence[Intervention], value: float) -> bool:
    """Record ``value`` as the accuracy of ``interventions`` in the open `accuracy_memo` (a
    measurement known to give exactly what they would: ``discover`` records the layer scan's
    value of a layer as its every head ablated, where the two are the same forward, and the
    head scan's sweep of single ablations, the same prompts right in stacked copies). Returns
    whether it was recorded (no memo open for ``model``, or interventions it cannot key: no)."""
    memo = _MEMO.get()
    key = _memo_entry(memo, model, task, interventions)
    if key is None:
        return False
    memo.values[key] = value  # type: ignore[union-attr]
    memo.measured.setdefault(key, (memo.stage, {}))  # type: ignore[union-attr]  # no forward of its own
    if memo.on_new is not None:  # type: ignore[union-attr]
        memo.on_new()  # type: ignore[union-attr]
    return True


def open_memo(model: GnaModel) -> AccuracyMemo | None:
    """The `accuracy_memo` open for ``model`` (``None``: none)."""
    memo = _MEMO.get()
    return memo if memo is not None and memo.model is model else None
