"""The causal scans of G&A discovery, each measured as task accuracy.

1. `truncation_scan`: keep layers ``0..k-1`` (then the final norm and unembedding) for
   every ``k``; the *critical layer* is the last kept layer of the first truncation that
   recovers at least half of the clean accuracy above chance (the paper's MMLU jump).
2. `layer_scan`: leave one layer out at a time.
3. `head_scan`: zero-ablate heads one at a time (batched sweep). Layers with more heads
   than ``screen_above`` (Mamba-1: every channel is a head) are scanned by adaptive group
   testing (`group_testing`): the layer's heads are ablated together, and every group whose
   removal costs accuracy is split in halves, recursively, down to single heads
   (groups of at most 4: into single heads at once) (*verified*); the heads of a group that costs nothing keep its accuracy (*screened*).
   Finding ``k`` critical heads among ``N`` costs about ``2 k log2(N / k) + 1`` group
   forwards instead of ``N``. A group whose effect neither half explains (a role spread
   over many heads) is kept, with the heads the effect needs (`SpreadGroup`; ``discover``
   searches those only for the groups its spread report shows). A remote
   model gets the same findings in 2 or 3 requests (`StagedGroupTesting`: the tree
   measured level after level in batches, every layer together).
4. `entry_scan`: ablate a head only at the final position, then only on the segment
   tokens, then only at the segment ends; a head's output at position ``t`` enters the
   residual stream at ``t`` alone, so this says where its effect comes in.

Within an `accuracy_memo` (``discover`` opens one per call) an evaluation already made is
answered from the memo (`accuracy`), not run again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..core.heads import Head
from ..core.inputs import Batch
from ..core.interventions import Ablate, Intervention, SkipLayers, Truncate
from ..evaluation import evaluate, evaluate_many
from ..models.jobs import is_batched_remote
from ..patching.metrics import candidate_accuracy
from ..patching.sweeps import ablation_sweep
from ..progress import progress_bar

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask, Task


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
        raise TypeError(f"positions={positions!r}: not a kind the memo keys")
    if positions is None or isinstance(positions, int):
        return positions
    if isinstance(positions, Tensor):
        return (str(positions.dtype), tuple(positions.shape), positions.detach().cpu().numpy().tobytes())
    if isinstance(positions, Sequence) and all(isinstance(p, int) and not isinstance(p, bool) for p in positions):
        return ("ints", tuple(positions))
    raise TypeError(f"positions={positions!r}: not a kind the memo keys")


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
    value of a layer as its every head ablated, where the two are the same forward). Returns
    whether it was recorded (no memo open for ``model``, or interventions it cannot key: no)."""
    memo = _MEMO.get()
    key = _memo_entry(memo, model, task, interventions)
    if key is None:
        return False
    memo.tasks[id(task)] = task  # type: ignore[union-attr]
    memo.values[key] = value  # type: ignore[union-attr]
    return True


_accuracy = accuracy


def truncation_scan(model: GnaModel, task: Task, *, progress: bool = True) -> list[float]:
    """Accuracy keeping the first ``k`` layers, for ``k = 1 .. n_layers`` (index ``k - 1``)."""
    depths = progress_bar(range(1, model.n_layers + 1), show=progress, desc="truncation scan")
    return [_accuracy(model, task, [Truncate(k)]) for k in depths]


def critical_layer(truncation: Sequence[float], clean: float, chance: float) -> int | None:
    """The last kept layer of the first truncation that recovers half the clean accuracy
    above chance; ``None`` when no truncation does (or clean is at chance)."""
    if clean - chance <= 0:
        return None
    for k, accuracy in enumerate(truncation):
        if accuracy - chance >= 0.5 * (clean - chance):
            return k
    return None


def layer_scan(model: GnaModel, task: Task, *, progress: bool = True) -> list[float]:
    """Accuracy with layer ``l`` skipped (its block passes the residual through), per layer."""
    layers = progress_bar(range(model.n_layers), show=progress, desc="layer scan")
    return [_accuracy(model, task, [SkipLayers([layer])]) for layer in layers]


@dataclass
class SpreadGroup:
    """A group of heads whose joint ablation costs accuracy that its parts (halves, or
    single heads for a group of at most `SINGLES_AT`) do not explain: none costs
    ``min_effect`` alone, or their effects add up to less than half the group's
    (`group_testing`): an effect spread over many heads, which single-head ablation
    cannot see.

    Attributes:
        heads: the group, ablated together.
        accuracy: task accuracy with it ablated.
        parts: accuracy with each part ablated alone.
        needed: heads the group's effect needs: with the rest of the group kept ablated,
            un-ablating any one of them brings accuracy back within ``min_effect`` of clean
            (empty: the effect is redundant, no head or quarter of the group is needed).
        searched: whether ``needed`` was searched: not for a group whose effect is below
            twice ``min_effect`` (`group_testing`).
    """

    heads: list[Head]
    accuracy: float
    parts: tuple[float, ...]
    needed: list[Head] = field(default_factory=list)
    searched: bool = True

    def to_dict(self) -> dict[str, object]:
        return {
            "heads": [str(h) for h in self.heads],
            "accuracy": self.accuracy,
            "parts": list(self.parts),
            "needed": [str(h) for h in self.needed],
            "searched": self.searched,
        }

    @classmethod
    def from_dict(cls, data: dict) -> SpreadGroup:
        parts = tuple(float(v) for v in data["parts"])
        needed = [Head.parse(h) for h in data.get("needed", [])]
        return cls([Head.parse(h) for h in data["heads"]], data["accuracy"], parts, needed, bool(data.get("searched", True)))

    def describe(self) -> str:
        """``"L1H0-L1H127 (128 heads) 0.310 together, parts 0.950 / 0.930; needs L1H3, L1H9"``."""
        ends = f"{self.heads[0]}-{self.heads[-1]}" if len(self.heads) > 1 else str(self.heads[0])
        text = f"{ends} ({len(self.heads)} heads) {self.accuracy:.3f} together, parts {' / '.join(f'{v:.3f}' for v in self.parts)}"
        if not self.searched:
            return text + "; needs not searched (its effect is below twice min_effect)"
        needed = ", ".join(map(str, self.needed)) if self.needed else "no head alone (redundant)"
        return text + f"; needs {needed}"


@dataclass
class GroupTesting:
    """What `group_testing` found in one set of heads.

    Attributes:
        singles: accuracy of each head measured alone (every head whose groups all cost
            at least ``min_effect`` down to itself).
        screened: for every other head, the accuracy of the smallest group it was measured
            in that cost less than ``min_effect`` (or a spread group's half).
        spread: groups whose effect no half explains (`SpreadGroup`).
        tests: group forwards run (each an evaluation of the task).
        rounds: rounds of tests (each round's groups are independent: one request remotely,
            where `StagedGroupTesting` batches the rounds further).
    """

    singles: dict[Head, float]
    screened: dict[Head, float]
    spread: list[SpreadGroup]
    tests: int
    rounds: int


SINGLES_AT = 4
"""`group_testing` ablates the heads of a costly group of at most this many one by one."""

Measure = Callable[[list[list[Head]]], list[float]]
"""Task accuracy with each group of heads ablated (all of a group's heads together)."""


def group_testing(measure: Measure, heads: Sequence[Head], clean: float, min_effect: float, search: bool = True) -> GroupTesting:
    """Adaptive group testing for the heads whose single ablation costs at least
    ``min_effect`` accuracy below ``clean``.

    Rounds: ablate every group of the round together (``measure``); a group that costs
    less than ``min_effect`` is cleared (its heads are *screened* with its accuracy); one
    that costs more is split in halves for the next round, down to single heads (measured
    alone); a costly group of at most `SINGLES_AT` heads goes to single heads at once
    (as cheap as bisecting it, and cheaper where most of its heads cost accuracy).
    Ablating more heads is assumed to cost at least as much as ablating fewer
    (monotone effects): then every head that costs ``min_effect`` alone lies in costly
    groups all the way down, and is found. ``k`` such heads among ``N`` cost at most ``1 +
    2 k ceil(log2 N)`` tests, in at most ``ceil(log2 N) + 1`` rounds.

    **Interactions.** A costly group whose parts all cost less than ``min_effect`` holds
    an effect spread over many heads: single-head ablation would miss it, and so would
    bisection; so does, in part, one whose parts' effects add up to less than half its
    own (the union costs more than its parts explain). Such a group is kept as a
    `SpreadGroup` (its costly parts are still split), and searched for the heads its
    effect needs with the rest of the group kept ablated: each half's halves (quarters) are
    un-ablated in turn (the group minus that quarter is ablated); a quarter without which
    the effect falls below ``min_effect`` is needed, and is split the same way, the rest
    of the group still ablated, down to single heads. A redundant effect (every quarter
    can be spared) ends there, with no head named. A group whose effect is below twice
    ``min_effect`` is kept but not searched (``searched=False``): there a part would be
    "needed" for recovering less than ``min_effect``, an amount the scan counts as no
    effect anywhere else (every part qualifies, and the search splits the whole group).

    Args:
        measure: accuracy with each group ablated (one call per round).
        heads: the heads to search (usually one layer's).
        clean: accuracy with nothing ablated.
        min_effect: the smallest drop in accuracy that counts.
        search: search the spread groups' needed heads here; ``False``: leave it to the
            caller (`search_needed`, e.g. only for the groups a report shows), ``needed``
            empty until then.

    Returns:
        `GroupTesting`.
    """
    singles: dict[Head, float] = {}
    screened: dict[Head, float] = {}
    spread: list[SpreadGroup] = []
    tests = rounds = 0
    pending: list[tuple[list[Head], tuple[int, int] | None]] = [(list(heads), None)] if heads else []
    parents: list[tuple[list[Head], float]] = []  # costly groups split this round: (heads, accuracy)
    while pending:
        values = measure([group for group, _ in pending])
        tests, rounds = tests + len(pending), rounds + 1
        children: dict[int, list[tuple[list[Head], float]]] = {}
        split: list[tuple[list[Head], tuple[int, int] | None]] = []
        next_parents: list[tuple[list[Head], float]] = []
        for (group, parent), value in zip(pending, values, strict=True):
            if parent is not None:
                children.setdefault(parent[0], []).append((group, value))
            costly = clean - value >= min_effect
            if len(group) == 1 and costly:
                singles[group[0]] = value
            elif not costly:
                for head in group:
                    screened[head] = value
            if costly and len(group) > 1:
                next_parents.append((group, value))
                parts = [[h] for h in group] if len(group) <= SINGLES_AT else _halves(group)
                split += [(part, (len(next_parents) - 1, i)) for i, part in enumerate(parts)]
        for index, measured in children.items():  # a costly parent its parts do not explain
            effects = [clean - value for _, value in measured]
            if max(effects) < min_effect or sum(max(e, 0.0) for e in effects) < 0.5 * (clean - parents[index][1]):
                group, value = parents[index]
                spread.append(SpreadGroup(group, value, tuple(v for _, v in measured)))
        pending, parents = split, next_parents
    for item in spread:
        item.searched = clean - item.accuracy >= 2 * min_effect
        if item.searched and search:
            item.needed, extra = _needed_heads(measure, item.heads, clean, min_effect)
            tests, rounds = tests + extra[0], rounds + extra[1]
    return GroupTesting(singles, screened, spread, tests, rounds)


def search_needed(measure: Measure, group: SpreadGroup, clean: float, min_effect: float) -> int:
    """Fill ``group.needed`` by `group_testing`'s search (for a group found with
    ``search=False``; nothing for one whose effect is below twice ``min_effect``, which
    `group_testing` does not search either). Returns the tests it ran."""
    if not group.searched:
        return 0
    group.needed, (tests, _) = _needed_heads(measure, group.heads, clean, min_effect)
    return tests


def block_size(n_heads: int) -> int:
    """`staged_group_testing`'s first stage stops halving at groups of this many heads, for
    a layer of ``n_heads``: the power of two nearest ``sqrt(n_heads / 2)``, at least
    `SINGLES_AT` (8 for 128, 16 for 512, 64 for 8,192)."""
    return max(SINGLES_AT, 2 ** round(math.log2(max(1.0, math.sqrt(n_heads / 2)))))


def _parts(group: list[Head]) -> list[list[Head]]:
    """A costly group's parts in `group_testing`: single heads (at most `SINGLES_AT`), else halves."""
    return [[h] for h in group] if len(group) <= SINGLES_AT else _halves(group)


def _tree(group: list[Head], stop: int = 1) -> list[list[Head]]:
    """``group`` and its parts, recursively, splitting the groups larger than ``stop``."""
    out = [group]
    if len(group) > max(stop, 1):
        for part in _parts(group):
            out += _tree(part, stop)
    return out


def _halving(group: list[Head]) -> list[list[Head]]:
    """``group`` and its halves, recursively, down to single heads (a spread group's search)."""
    return [group, *(sub for half in _halves(group) for sub in _halving(half))] if len(group) > 1 else [group]


def stage_one(heads: Sequence[Head]) -> list[list[Head]]:
    """`staged_group_testing`'s first stage for one layer's ``heads``: the layer and its
    halves, recursively, down to groups of at most `block_size` heads."""
    heads = list(heads)
    return _tree(heads, block_size(len(heads))) if heads else []


SEARCH_AT_ONCE = 16
"""`staged_group_testing` measures the whole search of a spread group of at most this many
heads in one round (every part's complement, down to single heads)."""


class StagedGroupTesting:
    """`group_testing`'s findings in few rounds, for a remote model, where a round (one
    request) costs far more than a forward: each layer's bisection tree is measured level
    after level in batches, and `group_testing`'s rules are applied to the values, so the
    findings are exactly `group_testing`'s (the same tree, the same decisions), at more
    forwards (the levels below a group that costs nothing are measured too).

    Rounds, every layer's groups together:

    1. every layer's `stage_one` groups (the layer, halved down to `block_size`; ``known``
       values are not measured again: a remote `discover` sends this stage with its first
       scans);
    2. every group of the tree below each costly block reached by costly groups (halves,
       then single heads at `SINGLES_AT`): the bisection is then complete;
    3. the search of the spread groups' needed heads (`group_testing`): every part's
       complement, down to single heads, for a group of at most `SEARCH_AT_ONCE` heads, the
       quarters for a larger one, more rounds only where a larger group needs a part.
       `pending` and `finish` let a caller send this round with other work (a remote
       `discover`: with the entry scan).

    Attributes:
        results: one `GroupTesting` per layer (``rounds``: the rounds that measured any of its
            groups); its spread groups' ``needed`` are filled by `finish`.
    """

    def __init__(
        self,
        measure: Measure,
        layers: Sequence[Sequence[Head]],
        clean: float,
        min_effect: float,
        known: dict[tuple[Head, ...], float] | None = None,
    ) -> None:
        self.measure, self.clean, self.min_effect = measure, clean, min_effect
        self.memo = dict(known or {})
        self.layers = [list(heads) for heads in layers]
        self.counts = [[0, 0] for _ in self.layers]  # per layer: tests, rounds
        self._run([(i, g) for i, heads in enumerate(self.layers) for g in stage_one(heads)])
        self.results, frontier = self._walk()
        self._searches = self._start()  # spread groups found in the first stage: their search's first round with the second stage
        if frontier:
            self._run([(i, g) for i, group in frontier for g in _tree(group)[1:]] + self._pending())
        self.results, _ = self._walk()
        self._searches = self._start()

    def _start(self) -> list[tuple[int, SpreadGroup, list[list[Head]], bool]]:
        """Each searched spread group's search from its start: its quarters (every part
        below them as well, ``deep``, for a group of at most `SEARCH_AT_ONCE` heads)."""
        return [
            (i, group, [p for half in _halves(group.heads) for p in _halves(half)], len(group.heads) <= SEARCH_AT_ONCE)
            for i, found in enumerate(self.results)
            for group in found.spread
            if group.searched
        ]

    def _run(self, groups: list[tuple[int, list[Head]]], values: Sequence[float] | None = None) -> None:
        """Measure ``groups`` (one round; ``values``: measured by the caller)."""
        missing = list({tuple(g): None for _, g in groups if tuple(g) not in self.memo})
        if values is None:
            values = self.measure([list(g) for g in missing]) if missing else []
        self.memo.update(zip(missing, values, strict=True))
        for layer in {i for i, _ in groups}:
            self.counts[layer][0] += len({tuple(g) for i, g in groups if i == layer})
            self.counts[layer][1] += 1

    def _costly(self, value: float) -> bool:
        return self.clean - value >= self.min_effect

    def _walk(self) -> tuple[list[GroupTesting], list[tuple[int, list[Head]]]]:
        """`group_testing`'s rounds on the measured values: the findings, and the costly
        groups whose parts are not measured yet."""
        out, frontier = [], []
        for i, heads in enumerate(self.layers):
            found = GroupTesting({}, {}, [], *self.counts[i])
            level = [heads] if heads else []
            while level:
                below = []
                for group in level:
                    value = self.memo[tuple(group)]
                    if not self._costly(value):
                        found.screened.update((h, value) for h in group)
                        continue
                    if len(group) == 1:
                        found.singles[group[0]] = value
                        continue
                    parts = _parts(group)
                    if any(tuple(p) not in self.memo for p in parts):
                        frontier.append((i, group))
                        continue
                    effects = [self.clean - self.memo[tuple(p)] for p in parts]
                    if max(effects) < self.min_effect or sum(max(e, 0.0) for e in effects) < 0.5 * (self.clean - value):
                        found.spread.append(SpreadGroup(group, value, tuple(self.memo[tuple(p)] for p in parts)))
                    below += parts
                level = below
            for item in found.spread:
                item.searched = self.clean - item.accuracy >= 2 * self.min_effect
            out.append(found)
        return out, frontier

    def _pending(self) -> list[tuple[int, list[Head]]]:
        """``(layer index, group)`` of the searches' next round: each part's complement in its
        spread group (and every part below it, for a ``deep`` search)."""
        out = []
        for i, group, parts, deep in self._searches:
            for part in parts:
                for sub in _halving(part) if deep else [part]:
                    out.append((i, [h for h in group.heads if h not in set(sub)]))
        return out

    def _advance(self) -> None:
        """Take the searches as far as the measured values go (`group_testing`'s search:
        a part whose complement costs less than ``min_effect`` is needed, and halved down to
        single heads); what is left waits for a round, every part below it then measured."""
        searches, self._searches = self._searches, []
        for i, group, parts, _ in searches:
            split: list[list[Head]] = []
            queue, at = list(parts), 0
            while at < len(queue):  # in order: `pending` and the round after it list the same groups
                current, at = queue[at], at + 1
                complement = tuple(h for h in group.heads if h not in set(current))
                if complement not in self.memo:
                    split.append(current)
                elif not self._costly(self.memo[complement]):
                    if len(current) == 1:
                        group.needed.append(current[0])
                    else:
                        queue += _halves(current)
            if split:
                self._searches.append((i, group, split, True))
            else:
                group.needed.sort()

    @property
    def pending(self) -> list[list[Head]]:
        """The groups the search's next round measures (empty: the search is done)."""
        self._advance()
        return [list(g) for g in {tuple(g): None for _, g in self._pending() if tuple(g) not in self.memo}]

    def finish(self, values: Sequence[float] | None = None) -> list[GroupTesting]:
        """Run the search to its end and return `results`; ``values``: the accuracies of
        `pending`'s groups, measured by the caller."""
        self._advance()
        while self._searches:
            self._run(self._pending(), values)
            values = None
            self._advance()
        for found, (tests, rounds) in zip(self.results, self.counts, strict=True):
            found.tests, found.rounds = tests, rounds
        return self.results


def staged_group_testing(
    measure: Measure, layers: Sequence[Sequence[Head]], clean: float, min_effect: float, known: dict[tuple[Head, ...], float] | None = None
) -> list[GroupTesting]:
    """`StagedGroupTesting`'s findings (`group_testing`'s, for every layer of ``layers`` at
    once), its search included: one `GroupTesting` per layer."""
    return StagedGroupTesting(measure, layers, clean, min_effect, known).finish()


def _needed_heads(measure: Measure, group: list[Head], clean: float, min_effect: float) -> tuple[list[Head], tuple[int, int]]:
    """Heads of a spread group its effect needs (`group_testing`), and ``(tests, rounds)``."""
    needed: list[Head] = []
    tests = rounds = 0
    pending = [part for half in _halves(group) for part in _halves(half)]
    while pending:
        values = measure([[h for h in group if h not in set(part)] for part in pending])
        tests, rounds = tests + len(pending), rounds + 1
        split = []
        for part, value in zip(pending, values, strict=True):
            if clean - value < min_effect:  # without this part ablated, the effect is gone: needed
                if len(part) == 1:
                    needed.append(part[0])
                else:
                    split += _halves(part)
        pending = split
    return sorted(needed), (tests, rounds)


def _halves(group: list[Head]) -> list[list[Head]]:
    half = (len(group) + 1) // 2
    return [part for part in (group[:half], group[half:]) if part]


@dataclass
class HeadScan:
    accuracy: Tensor
    """``[layer, head]`` accuracy with that head zero-ablated; NaN where not scanned."""
    verified: Tensor
    """``[layer, head]`` bool: measured alone (not only through its group)."""
    spread: list[SpreadGroup] = field(default_factory=list)
    """Groups of the adaptively scanned layers whose effect no half explains (`group_testing`)."""
    tests: dict[int, int] = field(default_factory=dict)
    """Per adaptively scanned layer, its group forwards."""
    search: StagedGroupTesting | None = None
    """A remote scan's spread-group search still to finish (``head_scan(defer_search=True)``):
    `StagedGroupTesting.finish`, then `record_search`."""
    unsearched: list[SpreadGroup] = field(default_factory=list)
    """A local scan's spread groups whose needed heads are not searched yet
    (``head_scan(search_spread=False)``): `search_spread`."""
    measure: Measure | None = None
    """What measured the groups (for `search_spread`)."""
    clean: float | None = None
    min_effect: float = 0.02

    def search_spread(self, groups: Sequence[SpreadGroup]) -> None:
        """Search the needed heads of those of ``groups`` left unsearched (`search_needed`),
        adding their tests to `tests`; the others are left as they are."""
        for group in groups:
            if not any(group is item for item in self.unsearched) or self.measure is None or self.clean is None:
                continue
            layer = group.heads[0].layer
            self.tests[layer] = self.tests.get(layer, 0) + search_needed(self.measure, group, self.clean, self.min_effect)
            self.unsearched = [item for item in self.unsearched if item is not group]

    def record_search(self) -> None:
        """Finish `search` (measuring what is left) and count its tests."""
        if self.search is not None:
            results = self.search.finish()
            self.tests = {heads[0].layer: found.tests for heads, found in zip(self.search.layers, results, strict=True) if heads}
            self.search = None


PRESCREEN_STEPS = 4
"""Integration points of the prescreen's integrated-gradients ranking (`prescreen`)."""


def prescreen_method(model: GnaModel, steps: int = PRESCREEN_STEPS) -> str:
    """How `prescreen` ranks heads on ``model``, in words (recorded in the circuit's settings
    when `prescreen` does not say more: it returns what it ran)."""
    if getattr(model.backend, "remote", False):
        return "forward-only: the layer scan's costly layers (remote model: no local backward for attribution)"
    if steps == 1:
        return "first-order attribution of zero ablation on the candidate logit difference"
    return f"integrated gradients, {steps} steps, of zero ablation on the candidate logit difference"


@dataclass
class Prescreen:
    """What `prescreen` chose.

    Attributes:
        heads: the heads to ablate one by one, layer-major.
        estimates: ``[layer, head]`` estimates of the ranked heads' zero-ablation effect
            (0 elsewhere), or ``None`` where nothing was estimated.
        method: how the heads were chosen, in words (`prescreen_method`'s, or why the
            ranking stopped at first order or did not run).
    """

    heads: list[Head]
    estimates: Tensor | None
    method: str


def prescreen(
    model: GnaModel,
    task: Task,
    layers: Sequence[int],
    harmful_layers: Sequence[int],
    keep: int,
    rows: int = 64,
    steps: int = PRESCREEN_STEPS,
    grouped: Sequence[int] = (),
) -> Prescreen:
    """Which heads of ``layers`` to ablate one by one when there are too many: every head of
    ``harmful_layers`` (from the layer scan: removing the layer costs accuracy), and the
    ``keep`` heads with the largest estimate of their zero-ablation effect on the candidate
    logit difference: integrated gradients over ``steps`` points (`ablation_attribution`'s,
    ``rule="left"``; ``steps`` forwards and backwards per ``rows`` prompts; first-order attribution misranks the hybrid toy's heads,
    docs/patching.md). A head whose estimate is exactly 0 (its output reaches nothing the
    metric depends on, e.g. its out-projection columns are zero) is kept only through its
    layer. The heads of ``grouped`` layers (scanned by group testing) are neither gated
    nor ranked. Remote models get no attribution (no local backward): the layers alone,
    the forward-only screen.

    **Only where the ranking decides.** The first point (``alpha = 0``) is first-order
    attribution. When at most ``keep`` heads have a non-zero first-order estimate, every
    one of them is kept whatever their order, so the other ``steps - 1`` points are not
    run (the estimates stay first order; a gradient exactly 0 at ``alpha = 0`` is taken to
    be structural, 0 along the whole path, as for zeroed out-projection columns). With
    nothing to rank (no gated head outside ``harmful_layers``), no attribution runs.
    Otherwise the remaining points complete the integral: the same estimates as
    `ablation_attribution` with ``steps`` points.

    Returns:
        `Prescreen`.
    """
    from ..core.compile import heads_by_site
    from ..patching.attribution import integrated_effects
    from ..patching.metrics import candidate_logit_diff

    harmful, skipped = set(harmful_layers), set(grouped)
    scanned = [Head(layer, h) for layer in layers if layer not in skipped for h in range(model.heads_per_layer[layer])]
    chosen = {head for head in scanned if head.layer in harmful}
    if getattr(model.backend, "remote", False):
        return Prescreen(sorted(chosen), None, prescreen_method(model, steps))
    if all(head.layer in harmful for head in scanned):
        return Prescreen(sorted(chosen), None, "every head of the costly layers (nothing else to rank: no attribution)")
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    sites = sorted(heads_by_site(model.layout, scanned))
    ambient = list(model.active_interventions)
    chunks = []
    for start in range(0, encoded.batch.n_rows, rows):  # gradients of `rows` prompts at a time
        stop = min(start + rows, encoded.batch.n_rows)
        chunk = Batch(encoded.batch.input_ids[start:stop], encoded.batch.attention_mask[start:stop])
        metric = candidate_logit_diff(encoded.candidate_ids[start:stop], encoded.correct[start:stop])
        chunks.append((chunk, metric, (stop - start) / encoded.batch.n_rows))

    def integrate(points: Sequence[int], baselines: list[float | None]) -> tuple[Tensor, list[float | None]]:
        estimates = torch.zeros(model.n_layers, model.n_heads)
        measured: list[float | None] = []
        for (chunk, metric, weight), baseline in zip(chunks, baselines, strict=True):
            targets = {site: torch.zeros(()) for site in sites}
            effects, value = integrated_effects(model, chunk, ambient, targets, metric, steps, "left", points=points, baseline=baseline)
            measured.append(value)
            for head in scanned:
                site, index = model.head_site(head)
                estimates[head.layer, head.head] += float(effects[site][:, index].sum()) * weight
        return estimates, measured

    estimates, baselines = integrate([0], [None] * len(chunks))  # alpha = 0: first order, divided by `steps`
    live = [head for head in scanned if float(estimates[head.layer, head.head]) != 0.0]
    if len(live) <= keep or steps == 1:
        method = prescreen_method(model, 1)
        if steps > 1:
            method += f": {len(live)} heads reach the metric, at most the {keep} kept, so integrated gradients would decide nothing"
        return Prescreen(sorted(chosen | set(live)), estimates * steps, method)
    rest, _ = integrate(range(1, steps), baselines)
    estimates += rest
    order = sorted(scanned, key=lambda h: (-abs(float(estimates[h.layer, h.head])), h))
    chosen |= {h for h in order[:keep] if float(estimates[h.layer, h.head]) != 0.0}
    return Prescreen(sorted(chosen), estimates, prescreen_method(model, steps))


def head_scan(
    model: GnaModel,
    task: Task,
    layers: Sequence[int],
    *,
    screen_above: int = 64,
    only: Collection[Head] | None = None,
    adaptive: Sequence[int] = (),
    clean: float | None = None,
    min_effect: float = 0.02,
    progress: bool = True,
    known: dict[tuple[Head, ...], float] | None = None,
    defer_search: bool = False,
    search_spread: bool = True,
) -> HeadScan:
    """Single-head zero-ablation accuracy for every head of ``layers`` (see module docs):
    layers of more than ``screen_above`` heads by adaptive group testing (`group_testing`,
    heads whose single ablation costs at least ``min_effect`` below ``clean``). With
    ``only``, for those heads alone (a `prescreen`), and the layers ``adaptive`` by group
    testing whatever their width. On a remote model (one request per round) every such
    layer together by `staged_group_testing` (2 or 3 rounds, not one per bisection step).

    Args:
        clean: accuracy with nothing ablated (measured if needed and not given).
        known: group accuracies already measured (`staged_group_testing`'s ``known``).
        defer_search: on a remote model, leave the spread groups' search to the caller
            (`HeadScan.search`: its first round can travel with other work).
        search_spread: locally, search the spread groups' needed heads in the scan;
            ``False``: only when asked (`HeadScan.search_spread`: ``discover`` searches
            those of the groups its spread report shows). A remote scan searches them all.
    """
    accuracy = torch.full((model.n_layers, model.n_heads), float("nan"))
    verified = torch.zeros(model.n_layers, model.n_heads, dtype=torch.bool)
    direct: list[Head] = []
    wide = list(adaptive)
    if only is not None:
        direct = sorted(h for h in only if h.layer not in set(wide))
    else:
        for layer in layers:
            heads = [Head(layer, h) for h in range(model.heads_per_layer[layer])]
            if len(heads) > screen_above:
                wide.append(layer)
            else:
                direct += heads
    spread: list[SpreadGroup] = []
    tests: dict[int, int] = {}
    if wide and clean is None:
        clean = _accuracy(model, task)
    heads_of = {layer: [Head(layer, h) for h in range(model.heads_per_layer[layer])] for layer in wide}
    search = None
    if wide and is_batched_remote(model) and not model.active_interventions:  # few rounds: each is a request
        search = StagedGroupTesting(_group_measure(model, task), list(heads_of.values()), float(clean), min_effect, known)  # type: ignore[arg-type]
        results = search.results if defer_search else search.finish()
    else:
        layers_shown = progress_bar(wide, show=progress, desc="group testing")
        measure = _group_measure(model, task)
        results = [group_testing(measure, heads_of[layer], float(clean), min_effect, search_spread) for layer in layers_shown]  # type: ignore[arg-type]
    for layer, found in zip(wide, results, strict=True):
        for values, measured in ((found.screened, False), (found.singles, True)):
            for head, value in values.items():
                accuracy[head.layer, head.head] = value
                verified[head.layer, head.head] = measured
        spread += found.spread
        tests[layer] = found.tests
    for head, value in _single_ablations(model, task, direct, progress).items():
        accuracy[head.layer, head.head] = value
        verified[head.layer, head.head] = True
    scan = HeadScan(accuracy, verified, spread, tests, search if defer_search else None)
    if search is None and not search_spread:
        scan.unsearched = [group for group in spread if group.searched]
        scan.measure, scan.clean, scan.min_effect = measure, float(clean) if clean is not None else None, min_effect
    return scan


def _group_measure(model: GnaModel, task: Task) -> Measure:
    """`Measure` on ``model``: a remote model's round in one request (`evaluate_many`)."""

    def measure(groups: list[list[Head]]) -> list[float]:
        if is_batched_remote(model):
            return [result.accuracy for result in evaluate_many(model, [(task, [Ablate(g)]) for g in groups])]
        return [_accuracy(model, task, [Ablate(g)]) for g in groups]

    return measure


def _single_ablations(model: GnaModel, task: Task, heads: list[Head], progress: bool) -> dict[Head, float]:
    if not heads:
        return {}
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    if encoded.single_token:  # one batched sweep, scored by candidate accuracy
        metric = candidate_accuracy(encoded.candidate_ids, encoded.correct)
        sweep = ablation_sweep(model, task, metric, heads=heads, progress=progress)
        return {h: float(sweep.scores[h.layer, h.head]) for h in heads}
    return {h: _accuracy(model, task, [Ablate([h])]) for h in progress_bar(heads, show=progress, desc="head scan")}


def segment_positions(encoded: EncodedTask) -> Tensor:
    """``[batch, pos]`` bool: every token of every segment (first token to segment end, inclusive)."""
    cols = torch.arange(encoded.batch.n_pos)
    inside = (cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2])  # [batch, segment, pos]
    return inside.any(1)


def entry_scan(
    model: GnaModel,
    task: Task,
    encoded: EncodedTask,
    heads: Sequence[Head],
    *,
    progress: bool = True,
    extra: Sequence[list[Head]] = (),
    extra_values: list[float] | None = None,
) -> dict[Head, dict[str, float]]:
    """Per head: task accuracy with it ablated only at each prompt's ``final`` position,
    only on its ``segments`` (`segment_positions`), and only at the segment ``ends`` (the
    paper's Gather writes its summary there; a head writing elsewhere in the segments,
    e.g. tagging each word with its label, shows a small ``ends`` effect). Empty when
    candidates span several tokens: their continuation batches are re-padded, so
    positions move. ``extra``: groups ablated at every position, measured in the same
    request on a remote model (a remote head scan's search), their accuracies appended to
    ``extra_values`` (nothing measured when the scan measures nothing)."""
    if not encoded.single_token or not heads:
        return {}
    where = {"final": encoded.final, "segments": segment_positions(encoded), "ends": encoded.segment_ends}
    if is_batched_remote(model):  # every evaluation in one request
        runs = [(task, [Ablate([head], positions=positions)]) for head in heads for positions in where.values()]
        results = [result.accuracy for result in evaluate_many(model, [*runs, *((task, [Ablate(g)]) for g in extra)])]
        if extra_values is not None:
            extra_values += results[len(runs) :]
        values = iter(results)
        return {head: {name: next(values) for name in where} for head in heads}
    if extra_values is not None:
        extra_values += [_accuracy(model, task, [Ablate(g)]) for g in extra]
    out: dict[Head, dict[str, float]] = {}
    for head in progress_bar(list(heads), show=progress, desc="entry scan"):
        out[head] = {name: _accuracy(model, task, [Ablate([head], positions=positions)]) for name, positions in where.items()}
    return out


def joint_set(
    model: GnaModel,
    task: Task,
    pool: Sequence[Head],
    positions: Tensor,
    threshold: float,
    max_heads: int,
    *,
    progress: bool = True,
    desc: str = "joint search",
    clean: float | None = None,
    curve: list[tuple[Head, float]] | None = None,
) -> tuple[list[Head], float, bool]:
    """Greedy search for heads that matter together: at each step, add the head of
    ``pool`` whose ablation at ``positions``, jointly with the heads already chosen,
    lowers accuracy most; stop at ``threshold``, at ``max_heads``, or when no head lowers
    it further. Finds backup heads, which cost nothing alone because others compensate.

    Args:
        clean: the accuracy with nothing ablated, if already known (else measured).
        curve: if given, ``(head, accuracy)`` of each step is appended to it.

    Returns:
        the heads chosen (in order), the accuracy with them ablated at ``positions``, and
        whether it reached ``threshold``.
    """
    chosen: list[Head] = []
    accuracy = _accuracy(model, task) if clean is None else clean
    remaining = list(pool)
    bar = progress_bar(range(min(max_heads, len(remaining))), show=progress, desc=desc)
    for _ in bar:
        trials = {h: _accuracy(model, task, [Ablate([*chosen, h], positions=positions)]) for h in remaining}
        best = min(remaining, key=lambda h: (trials[h], h))
        if trials[best] >= accuracy:
            break
        chosen.append(best)
        remaining.remove(best)
        accuracy = trials[best]
        if curve is not None:
            curve.append((best, accuracy))
        if accuracy <= threshold:
            return chosen, accuracy, True
    return chosen, accuracy, False


def collapsing_set(
    model: GnaModel,
    task: Task,
    ordered: Sequence[Head],
    threshold: float,
    max_heads: int,
    clean: float,
    *,
    evaluate_progress: bool | None = None,
    curve: list[tuple[Head, float]] | None = None,
) -> tuple[list[Head], float, bool]:
    """Ablate ``ordered`` heads cumulatively until accuracy is at most ``threshold``.

    Args:
        clean: the accuracy with nothing ablated (returned when ``ordered`` is empty).
        evaluate_progress: `evaluate`'s per-batch bars (``None``: its default; ``False``:
            none). This search draws no bar of its own.
        curve: if given, ``(head, accuracy)`` of each cumulative ablation is appended to it.

    Returns:
        the heads used, the accuracy with all of them ablated, and whether the
        threshold was reached within ``max_heads``.
    """
    chosen: list[Head] = []
    accuracy = clean
    for head in list(ordered)[:max_heads]:
        chosen.append(head)
        accuracy = _accuracy(model, task, [Ablate(chosen)], progress=evaluate_progress)
        if curve is not None:
            curve.append((head, accuracy))
        if accuracy <= threshold:
            return chosen, accuracy, True
    return chosen, accuracy, False
