"""The joint stage of discovery: per role, a small set of heads whose ablation together
takes accuracy to chance (`JointSearch`), run locally by `pipeline` and in one request by
`remote`; its searches: `ordered_set` (the default: the pool ranked by each head's own
effect at the role's positions, each head kept if it lowers the set's accuracy), `joint_set`
(greedy: re-ranked after each head, for heads that matter only together) and
`collapsing_set` (a ranking ablated cumulatively at every position)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core import search
from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import Ablate
from ..progress import progress_bar
from ..tasks.base import EncodedTask, Task
from .circuit import GnaCircuit
from .entry import segment_positions
from .evidence import HeadEvidence, RoleNeed
from .head_scans import HeadScan
from .memo import accuracy as _accuracy
from .roles import RoleScores, RoleThresholds, pattern_agrees, role_scores

if TYPE_CHECKING:
    from ..models.handle import GnaModel

JOINT_SEARCHES = search.SEARCHES
"""`discover`'s ``joint_search``: ``"ordered"`` (`ordered_set`: one forward per head tried;
where it falls short of chance, the greedy rule continues from the heads it kept:
`gna_interp.core.search.role_set`) or ``"greedy"`` (`joint_set`
alone: one forward per pool head at each step)."""

ROLE_POSITIONS = {"aggregate": "final", "gather": "segments"}
"""Where each role's joint search ablates its heads (the entry scan's position sets)."""


def check_joint_search(method: object) -> str:
    """``method`` if it names a joint search (`JOINT_SEARCHES`), else a `GnaValueError`."""
    if method not in JOINT_SEARCHES:
        raise GnaValueError(f"joint_search={method!r}: expected one of {list(JOINT_SEARCHES)}")
    return method  # type: ignore[return-value]


class JointSearch:
    """The joint stage: per role, `ordered_set`, and the greedy rule continuing from its set
    where it does not reach chance (``method="greedy"``: `joint_set` alone), over the heads of
    the role's layers (only the examined ones in layers of more than ``screen_above`` heads),
    minus heads of the other role. An Aggregate pool head must read
    the options from the final row (``aggregate_mass``) and sit after the first Gather
    head's position; a Gather pool head must sit before the last Aggregate head's position
    (positions: a bound on the pool, never on a measured label). Heads it adds get the role with ``joint=True``."""

    def __init__(
        self,
        model: GnaModel,
        task: Task,
        encoded: EncodedTask,
        evidence: dict[Head, HeadEvidence],
        scan: HeadScan,
        thresholds: RoleThresholds,
        pattern_prompts: int,
        screen_above: int,
        progress: bool,
        method: str = "ordered",
    ) -> None:
        self.model, self.task, self.encoded, self.evidence, self.scan = model, task, encoded, evidence, scan
        self.thresholds, self.pattern_prompts, self.screen_above, self.progress = thresholds, pattern_prompts, screen_above, progress
        self.method = check_joint_search(method)
        self.scored: dict[Head, RoleScores] = {}
        """Pattern scores measured ahead (a remote run measures every head it may need in one request)."""

    def pool(self, circuit: GnaCircuit, role: str, bounded: bool = True) -> list[Head]:
        """The role's pool (module docs); ``bounded=False``: a Gather pool without the bound
        of the last Aggregate position (a remote search applies it on the server)."""
        members: list[Head] = getattr(circuit, role)
        other = "gather" if role == "aggregate" else "aggregate"
        pool = []
        for layer in sorted({h.layer for h in members}):
            layer_heads = [h for h in self.model.heads if h.layer == layer]
            if len(layer_heads) > self.screen_above:
                layer_heads = [h for h in layer_heads if h in self.evidence]
            pool += [h for h in layer_heads if h not in self.evidence or self.evidence[h].role != other]
        unscored = [h for h in pool if h not in self.evidence or self.evidence[h].scores is None]
        measured = {h: self.scored[h] for h in unscored if h in self.scored}
        missing = [h for h in unscored if h not in measured]
        measured |= role_scores(self.model, self.encoded, missing, self.pattern_prompts) if missing else {}
        for head, scores in ((h, measured[h]) for h in unscored):
            if head not in self.evidence:
                layer, index = head.layer, head.head
                accuracy, verified = head_float(self.scan.accuracy[layer, index]), bool(self.scan.verified[layer, index])
                self.evidence[head] = HeadEvidence(head, None, accuracy, verified)
            self.evidence[head].scores = scores
        position = self.model.head_position
        if role == "aggregate":  # reads the options, after the first Gather head (a bound on the search pool, not on any label)
            first_gather = min((position(h) for h in circuit.gather), default=None)
            return [
                h
                for h in pool
                if h in members
                or (
                    self.evidence[h].scores.aggregate_mass >= self.thresholds.aggregate_mass  # type: ignore[union-attr]
                    and (first_gather is None or position(h) > first_gather)
                )
            ]
        last_aggregate = max((position(h) for h in circuit.aggregate), default=(self.model.n_layers, 0))
        return [h for h in pool if h in members or position(h) < last_aggregate or not bounded]

    def ranked(self, pool: Sequence[Head], role: str, clean: float) -> list[Head]:
        """What `ordered_set` tries, in its order: the heads of ``pool`` whose ablation alone
        (the head scan's, at every position) costs at least ``min_effect`` below ``clean``,
        those the entry scan measured at the role's positions by that accuracy (lowest
        first), then the others by their head-scan accuracy, ties by head. A head that costs
        nothing alone is left to the greedy rule, which continues from the heads kept where
        these fall short of chance: it is what that search is for."""
        where, floor = ROLE_POSITIONS[role], self.thresholds.min_effect

        def costly(head: Head) -> bool:
            item = self.evidence.get(head)
            return item is not None and item.ablated_accuracy is not None and clean - item.ablated_accuracy >= floor

        def key(head: Head) -> tuple:
            item = self.evidence[head]
            entry = None if item.entry is None else item.entry.get(where)
            return (0, entry, head) if entry is not None else (1, item.ablated_accuracy, head)

        return sorted((h for h in pool if costly(h)), key=key)

    def quiet(self, pool: Sequence[Head], clean: float) -> set[Head]:
        """The heads of ``pool`` whose ablation at every position (the head scan's, alone or in
        a group that holds them) costs less than ``min_effect``: ablated at the role's positions
        alone they cost no more (`search.greedy_set`'s ``quiet``: not measured at its first step
        where another head costs)."""
        alone = {h: self.evidence[h].ablated_accuracy for h in pool if h in self.evidence}
        return {h for h, value in alone.items() if value is not None and clean - value < self.thresholds.min_effect}

    def run(self, circuit: GnaCircuit, role: str, threshold: float, max_heads: int) -> RoleNeed | None:
        """The role's joint set (``None`` if no head lowers accuracy at the role's positions:
        confirmation then falls back to the most harmful heads of the role)."""
        positions = self.encoded.final if role == "aggregate" else segment_positions(self.encoded)
        pool = self.pool(circuit, role)
        clean = circuit.accuracy["clean"]
        ranked = self.ranked(pool, role, clean) if self.method == "ordered" else []
        chosen, values, _ = search.role_set(
            pool,
            ranked,
            _oracle(self.model, self.task, positions),
            clean,
            threshold,
            max_heads,
            method=self.method,
            min_drop=self.thresholds.min_effect,
            track=_bar(self.progress, f"joint {role}"),
            quiet=self.quiet(pool, clean),
        )
        curve = list(zip(chosen, values, strict=True))
        if not chosen:
            return None
        accuracy = _accuracy(self.model, self.task, [Ablate(chosen)])
        return self.accept(circuit, role, chosen, curve, accuracy, threshold)

    def accept(
        self, circuit: GnaCircuit, role: str, chosen: list[Head], curve: list[tuple[Head, float]], accuracy: float, threshold: float
    ) -> RoleNeed:
        """Give the chosen heads the role (``joint=True`` for those it adds) and return the need."""
        members: list[Head] = getattr(circuit, role)
        for head in chosen:
            item = self.evidence[head]
            if item.role != role:
                item.role, item.joint = role, True
                scores = item.scores
                item.pattern_agrees = None if scores is None else pattern_agrees(role, scores, self.thresholds, self.task.n_segments)
                members.append(head)
        return RoleNeed(chosen, accuracy, accuracy <= threshold, curve, "final" if role == "aggregate" else "segments")


def head_float(value: torch.Tensor) -> float | None:
    """A scan's entry as a float; None where it is NaN (not measured)."""
    number = float(value)
    return None if number != number else number


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
    start = _accuracy(model, task) if clean is None else clean
    oracle = _oracle(model, task, positions)
    chosen, values, accuracy = search.greedy_set(pool, oracle, start, threshold, max_heads, _bar(progress, desc))
    if curve is not None:
        curve += zip(chosen, values, strict=True)
    return chosen, accuracy, accuracy <= threshold and bool(chosen)


def ordered_set(
    model: GnaModel,
    task: Task,
    ranked: Sequence[Head],
    positions: Tensor,
    threshold: float,
    max_heads: int,
    *,
    min_drop: float = 0.02,
    progress: bool = True,
    desc: str = "joint search",
    clean: float | None = None,
    curve: list[tuple[Head, float]] | None = None,
) -> tuple[list[Head], float, bool]:
    """Try ``ranked``'s heads in order, each ablated at ``positions`` together with those
    kept: keep it if that lowers accuracy by at least ``min_drop``; stop at ``threshold``,
    at ``max_heads`` kept, or at the end of ``ranked``. One forward per head tried (against
    `joint_set`'s one per pool head at each step). A head that matters only once another is
    ablated (a backup) is kept if it comes after that one (it costs little alone, so ranks
    low); one ranked before it is passed over, where `joint_set` would come back to it.

    Args:
        ranked: the pool, most harmful first (`JointSearch.ranked`).
        min_drop: the least fall in accuracy for which a head is kept (`discover`: the
            thresholds' ``min_effect``).
        clean: the accuracy with nothing ablated, if already known (else measured).
        curve: if given, ``(head, accuracy)`` of each head kept is appended to it.

    Returns:
        the heads kept (in ``ranked``'s order), the accuracy with them ablated at
        ``positions``, and whether it reached ``threshold``.
    """
    start = _accuracy(model, task) if clean is None else clean
    oracle = _oracle(model, task, positions)
    chosen, values, accuracy = search.ordered_set(ranked, oracle, start, threshold, max_heads, min_drop, _bar(progress, desc))
    if curve is not None:
        curve += zip(chosen, values, strict=True)
    return chosen, accuracy, accuracy <= threshold


def _oracle(model: GnaModel, task: Task, positions: Tensor) -> Callable[[list[Head]], float]:
    """``heads -> accuracy`` with them ablated together at ``positions`` (behind the memo)."""
    return lambda heads: _accuracy(model, task, [Ablate(heads, positions=positions)])


def _bar(progress: bool, desc: str) -> Callable[[Iterable[Any]], Iterable[Any]]:
    return lambda steps: progress_bar(steps, show=progress, desc=desc)


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
