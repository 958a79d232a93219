"""Adaptive group testing: which heads of a set cost accuracy, scored by a callable.

Pure: nothing here runs a model. A `Measure` (task accuracy with each group of heads ablated together) is the
only contact with one; ``head_scans.head_scan`` builds it.

`group_testing`: the heads are ablated together, and every group whose removal costs accuracy is split in
halves (in the order the heads are given: `head_scans` gives them largest write first, `head_order`, so the few
costly heads share few groups), recursively, down to single heads (groups of at most `SINGLES_AT`: into single heads at once)
(*verified*); the heads of a group that costs nothing keep its accuracy (*screened*). Finding ``k`` critical
heads among ``N`` costs about ``2 k log2(N / k) + 1`` group forwards instead of ``N``. A group whose effect
neither half explains (a role spread over many heads) is kept, with the heads the effect needs
(`SpreadGroup`). A half that costs nothing is searched anyway where the halves do not add up to their group
(`masked_parts`: its heads interact, and may cancel a costly head's cost). `StagedGroupTesting` gets the same
findings in 2 or 3 rounds (the tree measured level after level in batches, every layer together), for a
remote model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..core.heads import Head
from .spread_group import SpreadGroup

Member = TypeVar("Member")


@dataclass
class GroupTesting:
    """What `group_testing` found in one set of heads.

    Attributes:
        singles: accuracy of each head measured alone (every head whose groups all cost at least ``min_effect`` down
            to itself).
        screened: for every other head, the accuracy of the smallest group it was measured in that cost less than
            ``min_effect`` (or a spread group's half).
        spread: groups whose effect no half explains (`SpreadGroup`).
        tests: group forwards run (each an evaluation of the task).
        rounds: rounds of tests (each round's groups are independent: one request remotely, where
            `StagedGroupTesting` batches the rounds further).
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

Known = dict[tuple[Head, ...], float]
"""Group accuracies measured already (`StagedGroupTesting`'s ``known``)."""


def group_testing(
    measure: Measure, heads: Sequence[Head], clean: float, min_effect: float, search: bool = True, masked: bool = True
) -> GroupTesting:
    """Adaptive group testing for the heads whose single ablation costs at least ``min_effect`` accuracy below
    ``clean``.

    Rounds: ablate every group of the round together (``measure``); a group that costs less than ``min_effect``
    is cleared (its heads are *screened* with its accuracy); one that costs more is split in halves for the
    next round, down to single heads (measured alone); a costly group of at most `SINGLES_AT` heads goes to
    single heads at once (as cheap as bisecting it, and cheaper where most of its heads cost accuracy).
    Ablating more heads is assumed to cost at least as much as ablating fewer (monotone effects): then every
    head that costs ``min_effect`` alone lies in costly groups all the way down, and is found. ``k`` such heads
    among ``N`` cost at most ``1 + 2 k ceil(log2 N)`` tests, in at most ``ceil(log2 N) + 1`` rounds.

    **Interactions.** A costly group whose parts all cost less than ``min_effect``, or whose parts' effects add
    up to less than half its own, holds an effect spread over many heads, which single-head ablation and
    bisection miss: it is kept as a `SpreadGroup` (its costly parts still split) and searched for the heads its
    effect needs (`_needed_heads`); not one whose effect is below twice ``min_effect`` (``searched=False``:
    there a part would be "needed" for recovering less than ``min_effect``, no effect anywhere else here).

    **Masked heads** (``masked``). Monotone effects fail where heads cancel (the trained Mamba-1 toy's L1H92,
    0.035 alone, in a half that costs nothing): where a split's halves do not add up to the group
    (`masked_parts`), the half that costs nothing is split as if costly, no test spent to decide it. Additive
    effects never trigger it; heads that cancel where no measured split shows it are still missed.

    Args:
        measure: accuracy with each group ablated (one call per round).
        heads: the heads to search (usually one layer's).
        clean: accuracy with nothing ablated.
        min_effect: the smallest drop in accuracy that counts.
        search: search the spread groups' needed heads here; ``False``: leave it to the caller (`search_needed`,
            e.g. only for the groups a report shows), ``needed`` empty until then.
        masked: search a half that costs nothing where the split does not add up (`masked_parts`); ``False``: clear
            it, as before issue 42.

    Returns `GroupTesting`.
    """
    singles: dict[Head, float] = {}
    screened: dict[Head, float] = {}
    spread: list[SpreadGroup] = []
    tests = rounds = 0
    pending: list[tuple[list[Head], tuple[int, int] | None]] = [(list(heads), None)] if heads else []
    parents: list[tuple[list[Head], float]] = []  # groups split this round: (heads, accuracy)
    suspects: set[tuple[Head, ...]] = set()  # cleared groups searched anyway (`masked_parts`)
    seen: list[frozenset[Head]] = []  # the costly groups measured (`SpreadGroup.inside`)
    while pending:
        values = measure([group for group, _ in pending])
        tests, rounds = tests + len(pending), rounds + 1
        seen += [frozenset(group) for (group, _), value in zip(pending, values, strict=True) if clean - value >= min_effect]
        children: dict[int, list[tuple[list[Head], float]]] = {}
        split: list[tuple[list[Head], tuple[int, int] | None]] = []
        next_parents: list[tuple[list[Head], float]] = []
        for (group, parent), value in zip(pending, values, strict=True):
            if parent is not None:
                children.setdefault(parent[0], []).append((group, value))
            costly = clean - value >= min_effect
            _settle(group, value, costly, singles, screened)
            if (costly or tuple(group) in suspects) and len(group) > 1:
                next_parents.append((group, value))
                split += [(part, (len(next_parents) - 1, i)) for i, part in enumerate(_parts(group))]
        for index, measured in children.items():
            spread += _judge_split(parents[index], measured, clean, min_effect, masked, suspects, next_parents, split)
        pending, parents = split, next_parents
    extra = _search_spread(measure, spread, clean, min_effect, search, seen)
    return GroupTesting(singles, screened, spread, tests + extra[0], rounds + extra[1])


def _settle(group: list[Head], value: float, costly: bool, singles: dict[Head, float], screened: dict[Head, float]) -> None:
    """`group_testing`: a costly single head into ``singles`` (out of ``screened``, where a cleared group searched
    anyway put it: `masked_parts`); each head of a group that costs nothing into ``screened``, with its accuracy."""
    if len(group) == 1 and costly:
        singles[group[0]] = value
        screened.pop(group[0], None)
    elif not costly:
        for head in group:
            screened[head] = value


def _search_spread(
    measure: Measure, spread: list[SpreadGroup], clean: float, min_effect: float, search: bool, seen: list[frozenset[Head]]
) -> tuple[int, int]:
    """`group_testing`'s spread groups marked ``searched`` (an effect of at least twice ``min_effect``), given the
    costly groups ``seen`` inside them, and searched with ``search`` (`_needed_heads`): the tests and rounds it ran."""
    tests = rounds = 0
    for item in spread:
        item.searched = clean - item.accuracy >= 2 * min_effect
        item.inside = [group for group in seen if group < frozenset(item.heads)]
        if item.searched and search:
            item.needed, extra = _needed_heads(measure, item, clean, min_effect)
            tests, rounds = tests + extra[0], rounds + extra[1]
    return tests, rounds


def _judge_split(
    parent: tuple[list[Head], float],
    measured: list[tuple[list[Head], float]],
    clean: float,
    min_effect: float,
    masked: bool,
    suspects: set[tuple[Head, ...]],
    next_parents: list[tuple[list[Head], float]],
    split: list[tuple[list[Head], tuple[int, int] | None]],
) -> list[SpreadGroup]:
    """`group_testing`'s reading of a ``parent`` group (heads, accuracy) from its parts' accuracies (``measured``):
    ``[SpreadGroup]`` when its parts do not explain its cost; the parts that cost nothing but may hide a costly head
    (`masked_parts`) added to ``suspects`` and split for the next round (``next_parents``, ``split``)."""
    group, value = parent
    parts = [part for part, _ in measured]
    effects = [clean - v for _, v in measured]
    found = []
    if clean - value >= min_effect and (max(effects) < min_effect or sum(max(e, 0.0) for e in effects) < 0.5 * (clean - value)):
        found.append(SpreadGroup(group, value, tuple(v for _, v in measured)))  # a costly parent its parts do not explain
    for part in masked_parts(parts, effects, clean - value, min_effect) if masked else []:  # cleared, but may hide a costly head
        suspects.add(tuple(part))
        next_parents.append((part, clean - effects[parts.index(part)]))
        split += [(sub, (len(next_parents) - 1, i)) for i, sub in enumerate(_parts(part))]
    return found


def search_needed(measure: Measure, group: SpreadGroup, clean: float, min_effect: float) -> int:
    """Fill ``group.needed`` by `group_testing`'s search (for a group found with ``search=False``; nothing for one
    whose effect is below twice ``min_effect``, which `group_testing` does not search either). Returns the tests it
    ran."""
    if not group.searched:
        return 0
    group.needed, (tests, _) = _needed_heads(measure, group, clean, min_effect)
    return tests


def block_size(n_heads: int) -> int:
    """`staged_group_testing`'s first stage stops halving at groups of this many heads, for a layer of ``n_heads``:
    the power of two nearest ``sqrt(n_heads / 2)``, at least `SINGLES_AT` (8 for 128, 16 for 512, 64 for 8,192)."""
    return max(SINGLES_AT, 2 ** round(math.log2(max(1.0, math.sqrt(n_heads / 2)))))


def masked_parts(parts: list[list[Member]], effects: Sequence[float], effect: float, min_effect: float) -> list[list[Member]]:
    """The parts of a measured split that `group_testing` searches though they cost nothing: where the split's halves
    (``parts``, ``effects`` below clean) do not add up to the group's own ``effect`` (by ``min_effect`` or more,
    either way) and one half costs ``min_effect``, the other half's heads interact, so its cost of nothing may hide a
    head that costs ``min_effect`` alone (heads whose effects cancel: the trained Mamba-1 toy's L1H92, 0.035 alone, in
    a half that costs nothing). Decided from values already measured; not for single heads (``parts`` of one head
    each: measured alone already). The members may be heads or layers (`layer_scans.screen_layers` splits groups of
    layers)."""
    if len(parts) < 2 or all(len(part) == 1 for part in parts) or max(effects) < min_effect:
        return []
    if abs(effect - sum(effects)) < min_effect:
        return []
    return [part for part, e in zip(parts, effects, strict=True) if e < min_effect and len(part) > 1]


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
    """`staged_group_testing`'s first stage for one layer's ``heads``: the layer and its halves, recursively, down to
    groups of at most `block_size` heads."""
    heads = list(heads)
    return _tree(heads, block_size(len(heads))) if heads else []


SPECULATE_BLOCKS = 4
"""`speculated` measures the whole tree below this many blocks of a layer ahead."""


def speculated(heads: Sequence[Head], blocks: int = SPECULATE_BLOCKS) -> list[list[Head]]:
    """`stage_one`'s groups for one layer's ``heads`` and every group below its first ``blocks`` blocks (in
    the heads' order: `head_order` puts the largest writes first, where the costly heads gather), down to
    single heads: what `StagedGroupTesting`'s second stage measures there when those blocks cost accuracy,
    measured ahead (a remote `discover`: with the first scans, so that no request of its own is left where the
    costly groups lie inside them)."""
    first = stage_one(heads)
    stop = block_size(len(heads))
    leaves = [group for group in first if len(group) <= stop][:blocks]  # `_tree` is depth first: the blocks in order
    return first + [sub for leaf in leaves for sub in _tree(leaf)[1:]]


SEARCH_AT_ONCE = 16
"""`staged_group_testing` measures the whole search of a spread group of at most this many
heads in one round (every part's complement, down to single heads)."""


class StagedGroupTesting:
    """`group_testing`'s findings in few rounds, for a remote model, where a round (one request) costs far
    more than a forward: each layer's bisection tree is measured level after level in batches, and
    `group_testing`'s rules are applied to the values, so the findings are exactly `group_testing`'s (the same
    tree, the same decisions), at more forwards (the levels below a group that costs nothing are measured too).

    Rounds, every layer's groups together:

    1. every layer's `stage_one` groups (the layer, halved down to `block_size`; ``known`` values are not
       measured again, and count as this round's tests: a remote `discover` sends this stage with its first
       scans, with the tree below the first blocks, `speculated`);
    2. every group of the tree below each costly block reached by costly groups (halves, then single heads at
       `SINGLES_AT`): the bisection is then complete;
    3. the search of the spread groups' needed heads (`group_testing`): the complement of `first_parts` and of
       every part below them (but those `spared`), down to single heads, for a group of at most
       `SEARCH_AT_ONCE` heads, of `first_parts` for a larger one, more rounds only where a larger group needs
       a part. `pending` and `finish` let a caller send this round with other work (a remote `discover`: with
       the entry scan).

    Attributes:
        results: one `GroupTesting` per layer (``rounds``: the rounds that measured any of its groups); its
            spread groups' ``needed`` are filled by `finish`.
    """

    def __init__(
        self,
        measure: Measure,
        layers: Sequence[Sequence[Head]],
        clean: float,
        min_effect: float,
        known: Known | None = None,
        masked: bool = True,
    ) -> None:
        self.measure, self.clean, self.min_effect, self.masked = measure, clean, min_effect, masked
        self.memo = dict(known or {})
        self.layers = [list(heads) for heads in layers]
        self.counts = [[0, 0] for _ in self.layers]  # per layer: tests, rounds
        where = {head: i for i, heads in enumerate(self.layers) for head in heads}
        ahead = [(where[g[0]], list(g)) for g in self.memo if g and all(where.get(h, -1) == where.get(g[0]) for h in g) and g[0] in where]
        self._run([(i, g) for i, heads in enumerate(self.layers) for g in stage_one(heads)] + ahead)
        self.results, frontier = self._walk()
        self._searches = self._start()  # spread groups found in the first stage: their search's first round with the second stage
        if frontier:
            self._run([(i, g) for i, group in frontier for g in _tree(group)[1:]] + self._pending())
        self.results, frontier = self._walk()
        while frontier:  # a cleared group searched for a masked head (`masked_parts`) outside the trees measured
            self._run([(i, g) for i, group in frontier for g in _tree(group)[1:]])
            self.results, frontier = self._walk()
        self._searches = self._start()

    def _start(self) -> list[tuple[int, SpreadGroup, list[list[Head]], bool]]:
        """Each searched spread group's search from its start: `first_parts` (every part below them as well, ``deep``,
        for a group of at most `SEARCH_AT_ONCE` heads)."""
        return [
            (i, group, first_parts(group, self.clean, self.min_effect), len(group.heads) <= SEARCH_AT_ONCE)
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
        """`group_testing`'s rounds on the measured values: the findings, and the costly groups whose parts are not
        measured yet."""
        out, frontier = [], []
        for i, heads in enumerate(self.layers):
            found = GroupTesting({}, {}, [], *self.counts[i])
            level = [(heads, False)] if heads else []  # (group, searched though it costs nothing)
            seen: list[frozenset[Head]] = []  # the costly groups walked (`SpreadGroup.inside`)
            while level:
                below = []
                for group, suspect in level:
                    value = self.memo[tuple(group)]
                    costly = self._costly(value)
                    seen += [frozenset(group)] if costly else []
                    if not costly:
                        found.screened.update((h, value) for h in group)
                    elif len(group) == 1:
                        found.singles[group[0]] = value
                        found.screened.pop(group[0], None)
                    if (not costly and not suspect) or len(group) == 1:
                        continue
                    parts = _parts(group)
                    if any(tuple(p) not in self.memo for p in parts):
                        frontier.append((i, group))
                        continue
                    effects = [self.clean - self.memo[tuple(p)] for p in parts]
                    if costly and (max(effects) < self.min_effect or sum(max(e, 0.0) for e in effects) < 0.5 * (self.clean - value)):
                        found.spread.append(SpreadGroup(group, value, tuple(self.memo[tuple(p)] for p in parts)))
                    masked = masked_parts(parts, effects, self.clean - value, self.min_effect) if self.masked else []
                    below += [(part, any(part == m for m in masked)) for part in parts]
                level = below
            for item in found.spread:
                item.searched = self.clean - item.accuracy >= 2 * self.min_effect
                item.inside = [group for group in seen if group < frozenset(item.heads)]
            out.append(found)
        return out, frontier

    def _pending(self) -> list[tuple[int, list[Head]]]:
        """``(layer index, group)`` of the searches' next round: each part's complement in its spread group (and every
        part below it, for a ``deep`` search)."""
        out = []
        for i, group, parts, deep in self._searches:
            for part in parts:
                for sub in _halving(part) if deep else [part]:
                    if not spared(group, sub, self.clean, self.min_effect):
                        out.append((i, [h for h in group.heads if h not in set(sub)]))
        return out

    def _advance(self) -> None:
        """Take the searches as far as the measured values go (`group_testing`'s search: a part whose complement costs
        less than ``min_effect`` is needed, and halved down to single heads); what is left waits for a round, every
        part below it then measured."""
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
                        queue += [half for half in _halves(current) if not spared(group, half, self.clean, self.min_effect)]
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
        """Run the search to its end and return `results`; ``values``: the accuracies of `pending`'s groups, measured
        by the caller."""
        self._advance()
        while self._searches:
            self._run(self._pending(), values)
            values = None
            self._advance()
        for found, (tests, rounds) in zip(self.results, self.counts, strict=True):
            found.tests, found.rounds = tests, rounds
        return self.results


def staged_group_testing(
    measure: Measure, layers: Sequence[Sequence[Head]], clean: float, min_effect: float, known: Known | None = None, masked: bool = True
) -> list[GroupTesting]:
    """`StagedGroupTesting`'s findings (`group_testing`'s, for every layer of ``layers`` at once), its search
    included: one `GroupTesting` per layer."""
    return StagedGroupTesting(measure, layers, clean, min_effect, known, masked).finish()


def spared(group: SpreadGroup, part: Sequence[Head], clean: float, min_effect: float) -> bool:
    """Whether ``part`` of a spread group is not needed, known without a test: un-ablating it leaves ablated a group
    measured to cost at least ``min_effect`` (a costly part of the split, ``group.parts``, or one of
    `SpreadGroup.inside`), so under monotone effects the rest of the group costs at least as much (the premise by
    which the search splits only the parts it finds needed)."""
    costly = [frozenset(p) for p, value in zip(_parts(group.heads), group.parts, strict=False) if clean - value >= min_effect]
    return any(known.isdisjoint(part) for known in [*costly, *group.inside])


def first_parts(group: SpreadGroup, clean: float, min_effect: float) -> list[list[Head]]:
    """A spread group's search's first parts (`group_testing`): its halves' halves, but those `spared` (the halves are
    measured alone in the split: a quarter of a half whose other half costs ``min_effect`` is spared)."""
    return [part for half in _halves(group.heads) for part in _halves(half) if not spared(group, part, clean, min_effect)]


def _needed_heads(measure: Measure, group: SpreadGroup, clean: float, min_effect: float) -> tuple[list[Head], tuple[int, int]]:
    """The heads a spread group's effect needs (`group_testing`), and ``(tests, rounds)``: its quarters
    (`first_parts`) are un-ablated in turn, the rest of the group kept ablated; a part without which the effect falls
    below ``min_effect`` is needed, and its halves (but those `spared`) are searched the same way, down to single
    heads. A redundant effect (no quarter needed) names no head."""
    needed: list[Head] = []
    tests = rounds = 0
    pending = first_parts(group, clean, min_effect)
    while pending:
        values = measure([[h for h in group.heads if h not in set(part)] for part in pending])
        tests, rounds = tests + len(pending), rounds + 1
        split = []
        for part, value in zip(pending, values, strict=True):
            if clean - value < min_effect:  # without this part ablated, the effect is gone: needed
                if len(part) == 1:
                    needed.append(part[0])
                else:
                    split += [half for half in _halves(part) if not spared(group, half, clean, min_effect)]
        pending = split
    return sorted(needed), (tests, rounds)


def _halves(group: list[Head]) -> list[list[Head]]:
    half = (len(group) + 1) // 2
    return [part for part in (group[:half], group[half:]) if part]
