"""The accuracy memo of discovery: within an `accuracy_memo` (``discover`` opens one per
call) an evaluation already made is answered from the memo (`accuracy`), not run again."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from torch import Tensor

from ..core.errors import GnaTypeError
from ..core.interventions import Ablate, Intervention, SkipLayers, Truncate
from ..scoring.evaluation import evaluate

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import Task


class AccuracyMemo:
    """Task accuracies already measured on one model (`accuracy_memo`), keyed by everything
    that changes the forward: the task (by identity: the memo holds it, so its id is not
    reused), each intervention (`memo_key`) and the model's own active interventions.

    Attributes:
        model: the model the accuracies were measured on.
        values: ``key -> accuracy``.
        hits: evaluations answered from the memo (forwards not run again).
    """

    def __init__(self, model: GnaModel) -> None:
        self.model = model
        self.values: dict[tuple, float] = {}
        self.tasks: dict[int, Task] = {}
        self.hits = 0


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

    Inside the block the model (its weights, swapped blocks) and the task's contents must not
    change: tasks are keyed by identity, and a value is reused without looking at either."""
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
    return None if ambient is None or own is None else (id(task), ambient, own)


def accuracy(model: GnaModel, task: Task, interventions: Sequence[Intervention] = (), *, progress: bool | None = False) -> float:
    """`evaluate`'s accuracy (``progress``: its per-batch bar; the scans draw their own), from
    the open `accuracy_memo` where the same evaluation was made before."""
    memo = _MEMO.get()
    key = _memo_entry(memo, model, task, interventions)
    if key is not None and key in memo.values:  # type: ignore[union-attr]
        memo.hits += 1  # type: ignore[union-attr]
        return memo.values[key]  # type: ignore[union-attr]
    value = evaluate(model, task, interventions, progress=progress).accuracy
    if key is not None:
        memo.tasks[id(task)] = task  # type: ignore[union-attr]
        memo.values[key] = value  # type: ignore[union-attr]
    return value


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
    memo.tasks[id(task)] = task  # type: ignore[union-attr]
    memo.values[key] = value  # type: ignore[union-attr]
    return True
