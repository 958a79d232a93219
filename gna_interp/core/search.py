"""The joint search of discovery, written once: a set of heads whose ablation together takes
accuracy down to a threshold, over an accuracy oracle.

``accuracy(heads)`` is the task's accuracy with ``heads`` ablated together (at the role's
positions): `gna_interp.discovery.joint` answers it locally with `evaluate` behind the accuracy
memo; `gna_interp.backends.nnsight_program.greedy_joint` answers it on an NDIF server with its
own traces. Heads are any ordered, hashable values (`Head` locally, integer ids on the server,
numbered in `Head` order, so ties break the same way on both).

This module uses builtins alone: it is shipped by value with the server program
(``nnsight.register``), so an NDIF server needs no gna_interp.

- `greedy_set`: at each step the head whose ablation with those chosen lowers accuracy most
  (one oracle call per remaining head per step): finds backup heads, which cost nothing alone.
- `ordered_set`: each head of a ranking tried once, kept if it lowers the set's accuracy by at
  least ``min_drop`` (one oracle call per head tried).
- `role_set`: ``"ordered"``, and where it falls short of the threshold `greedy_set` continuing
  from the heads it kept; or ``"greedy"`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, TypeVar

H = TypeVar("H")
T = TypeVar("T")

SEARCHES = ("ordered", "greedy")
"""`role_set`'s methods (`discover`'s ``joint_search``)."""


def _plain(items: Iterable[T]) -> Iterable[T]:
    return items


def greedy_set(
    pool: Sequence[H],
    accuracy: Callable[[list[H]], float],
    start: float,
    threshold: float,
    max_heads: int,
    track: Callable[[Iterable[Any]], Iterable[Any]] = _plain,
    quiet: Collection[H] = (),
    min_drop: float = 0.0,
    given: Sequence[H] = (),
) -> tuple[list[H], list[float], float]:
    """Add, at each step, the head of ``pool`` whose ablation together with those chosen
    gives the lowest accuracy (ties: the smallest head); stop at ``threshold``, at
    ``max_heads``, or when no head lowers accuracy below the current value.

    Args:
        pool: the heads to choose from.
        accuracy: the oracle, ``heads -> accuracy`` with them ablated together.
        start: the accuracy with ``given`` ablated (nothing, by default).
        threshold: stop once accuracy is at most this.
        max_heads: the most heads chosen.
        track: wraps the loop over steps (a progress bar); identity by default.
        quiet: heads known to lower accuracy by less than ``min_drop`` alone (measured
            ablated more widely: the oracle's ablation of one, a part of that, costs no more,
            as group testing assumes). At the first step they are measured only where no
            other head lowers accuracy by ``min_drop`` (then none of them can be the lowest),
            and only where nothing is ``given`` (beside other heads a quiet head may cost).
        given: heads chosen already (`role_set`: those the ordered search kept), ablated in
            every measurement and counted in ``max_heads``; ``start`` is the accuracy with
            them ablated.

    Returns:
        ``(chosen, curve, accuracy)``: the heads in the order chosen (``given`` first), the
        accuracy after each head added here, and the last accuracy (``start`` if none was added).
    """
    chosen: list[H] = list(given)
    curve: list[float] = []
    current = start
    remaining = [h for h in pool if h not in chosen]
    for step in track(range(max(0, min(max_heads - len(chosen), len(remaining))))):
        tried = [h for h in remaining if h not in quiet] if step == 0 and not given else remaining
        measured = [(accuracy([*chosen, h]), h) for h in tried]
        if len(tried) < len(remaining) and (not measured or start - min(measured)[0] < min_drop):  # type: ignore[type-var]
            measured += [(accuracy([h]), h) for h in remaining if h in quiet]
        best_accuracy, best = min(measured)  # type: ignore[type-var]
        if best_accuracy >= current:
            break
        chosen.append(best)
        remaining.remove(best)
        current = best_accuracy
        curve.append(current)
        if current <= threshold:
            break
    return chosen, curve, current


def ordered_set(
    ranked: Sequence[H],
    accuracy: Callable[[list[H]], float],
    start: float,
    threshold: float,
    max_heads: int,
    min_drop: float,
    track: Callable[[Iterable[Any]], Iterable[Any]] = _plain,
) -> tuple[list[H], list[float], float]:
    """Try ``ranked``'s heads in order, each ablated together with those kept: keep it if
    accuracy falls by at least ``min_drop``; stop at ``threshold``, at ``max_heads`` kept,
    or at the end of ``ranked``. Arguments and returns as `greedy_set`'s (the curve holds
    the accuracy after each head kept)."""
    chosen: list[H] = []
    curve: list[float] = []
    current = start
    for head in track(list(ranked)):
        if len(chosen) >= max_heads or current <= threshold:
            break
        value = accuracy([*chosen, head])
        if current - value < min_drop:
            continue
        chosen.append(head)
        current = value
        curve.append(value)
    return chosen, curve, current


def role_set(
    pool: Sequence[H],
    ranked: Sequence[H],
    accuracy: Callable[[list[H]], float],
    start: float,
    threshold: float,
    max_heads: int,
    *,
    method: str,
    min_drop: float,
    track: Callable[[Iterable[Any]], Iterable[Any]] = _plain,
    quiet: Collection[H] = (),
) -> tuple[list[H], list[float], float]:
    """One role's set: ``method="ordered"`` runs `ordered_set` over ``ranked``; where that
    falls short of ``threshold``, `greedy_set` over ``pool`` continues from the heads it kept
    (from scratch where it kept none). ``"greedy"`` runs `greedy_set` alone (``quiet``: its
    heads known to cost less than ``min_drop`` alone, `greedy_set`). Returns as `greedy_set`.

    Continuing, not restarting, measures about half the sets on the bundled toys (a restart's
    first steps re-add the ordered search's heads one pool-wide step at a time). It keeps every
    head the ordered search kept, so it can end short where a restart would not: a kept head
    that cancels another's effect stays, and where the ordered search fills ``max_heads`` no
    greedy step runs. On the bundled toys it reaches chance wherever a restart did, and on one
    where a restart did not (`llama_4x8`'s Gather); its set may be larger (`mamba2_8heads`'
    Gather: 4 heads, 2 restarting, both 0.325 on the segments). No bound of the whole pool cuts
    it short: ablation effects are not monotone here (`mamba2_8heads`, on the segments: L0H0
    and L0H5 give 0.325, with L0H1 too 0.38; its whole Gather pool 0.375)."""
    if method not in SEARCHES:
        raise ValueError(f"method={method!r}: expected one of {list(SEARCHES)}")
    if method == "greedy":
        return greedy_set(pool, accuracy, start, threshold, max_heads, track, quiet, min_drop)
    chosen, curve, value = ordered_set(ranked, accuracy, start, threshold, max_heads, min_drop, track)
    if value <= threshold:
        return chosen, curve, value
    if not chosen:
        return greedy_set(pool, accuracy, start, threshold, max_heads, track, quiet, min_drop)
    more, steps, value = greedy_set(pool, accuracy, value, threshold, max_heads, track, quiet, min_drop, given=chosen)
    return more, curve + steps, value
