"""The size of a spread role (`SpreadRole.sizes`): accuracy with the ``k`` most important
heads of the role's entry layer ablated at the role's positions, for ``k`` from 1 to the
layer's width, searched by bisection on ``k`` (`size_curve`), in the order of `importance_order`.

The curve answers "how many heads does the role need": `SpreadRole.heads_for` (the fewest
heads that carry a fraction of the whole layer's effect) reads it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from ..core.heads import Head
from ..core.inputs import Batch
from ..core.interventions import Ablate
from . import memo

if TYPE_CHECKING:
    from ..cost import Cost
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask, Task
    from .head_scans import HeadScan

SIZE_FRACTIONS = (0.5,)
"""The shares of the whole layer's effect whose head counts the bisection pins exactly
(every other share is bracketed by the doubling grid)."""
MAX_EVALUATIONS = 32
"""At most this many evaluations per role: the doubling grid (``log2`` of the width) plus
the bisection (``log2`` of its bracket); 19 for 128 heads, 24 for 4,096."""
ATTRIBUTION_ROWS = 50
"""At most this many prompts per forward-and-backward of the ordering's attribution."""
ATTRIBUTION_ROW_HEADS = 16384
"""...and at most this many prompts x heads of the entry layer (4 prompts at 4,096 channels): a
backward keeps every later layer's activations, which grow with the width (a Mamba-1 of 32
layers x 4,096 channels took 17.7 GB at 32 prompts at once, and was stopped for memory)."""

RANKED_BY = (
    "heads costly alone (the head scan's single ablation, most harmful first), then the rest by the size of the "
    "first-order attribution of their zero ablation at the role's positions (candidate logit difference)"
)


def size_curve(
    measure: Callable[[int], float],
    width: int,
    clean: float,
    whole: float,
    *,
    fractions: Sequence[float] = SIZE_FRACTIONS,
    max_evaluations: int = MAX_EVALUATIONS,
    known: dict[int, float] | None = None,
) -> list[tuple[int, float]]:
    """``[(k, accuracy)]`` for ``k`` increasing from 0 (``clean``) to ``width`` (``whole``):
    ``measure(k)`` is the accuracy with the first ``k`` heads of the ordering ablated.

    First the doubling grid ``k = 1, 2, 4, ... < width``; then, per fraction ``f``, bisection
    on ``k`` between the largest measured ``k`` whose effect (``clean - accuracy``) is below
    ``f`` of the whole layer's (``clean - whole``) and the smallest that reaches it, until the
    two are adjacent or ``max_evaluations`` are spent. ``known``: points already measured
    (not measured again). Exact for a curve that falls monotonically in ``k``: then
    `heads_needed` on the result equals it on every ``k`` measured (the brute force)."""
    points = {0: clean, width: whole, **(known or {})}
    spent = 0

    def at(k: int) -> None:
        nonlocal spent
        if k not in points and spent < max_evaluations:
            points[k] = measure(k)
            spent += 1

    k = 1
    while k < width:
        at(k)
        k *= 2
    for fraction in fractions:
        while spent < max_evaluations:
            lo, hi = bracket(points, clean, whole, fraction)
            if hi - lo <= 1:
                break
            at((lo + hi) // 2)
    return sorted(points.items())


def bracket(points: dict[int, float], clean: float, whole: float, fraction: float) -> tuple[int, int]:
    """``(lo, hi)``: ``hi`` the fewest measured heads whose effect reaches ``fraction`` of the
    whole layer's, ``lo`` the most measured heads below ``hi`` (whose effect does not)."""
    target = fraction * (clean - whole) - 1e-9
    hi = min(k for k, value in points.items() if clean - value >= target)
    lo = max(k for k in points if k < hi) if hi > 0 else 0
    return lo, hi


def importance_order(
    model: GnaModel,
    task: Task,
    encoded: EncodedTask,
    layer: int,
    positions: torch.Tensor,
    scan: HeadScan,
    clean: float,
    min_effect: float,
    start: int | None = None,
) -> list[int]:
    """The heads of ``layer`` by importance (`RANKED_BY`): those the head scan measured alone
    at a cost of at least ``min_effect``, most harmful first; then the rest by first-order
    attribution of zero-ablating each at ``positions`` (the union of the rows' positions;
    one forward and one backward per `ATTRIBUTION_ROWS` prompts, fewer in a wide layer), largest estimated change
    of the candidate logit difference first, whatever its sign; ties (heads that reach
    nothing) by index, last. The size, not the sign: on the Mamba-1 toy (final
    position) the estimate's sign is wrong for L1H22 (+0.08 estimated, -0.49 measured, 32 prompts), and
    by size its top 10 hold 8 of the brute-force single-ablation top 10 (6 by signed value).
    ``start``: the earliest layer a later ordering of this discovery may rank (`_attribution`)."""
    width = model.heads_per_layer[layer]
    accuracy, verified = scan.accuracy, scan.verified
    costly = [h for h in range(width) if bool(verified[layer, h]) and clean - float(accuracy[layer, h]) >= min_effect]
    heads = [Head(layer, h) for h in range(width)]
    if positions.dtype == torch.bool:  # a [batch, pos] mask: the columns any row holds
        at = positions.any(0).nonzero().flatten().tolist()
    else:
        at = sorted({int(p) for p in positions.flatten().tolist()})
    estimate = torch.zeros(width)
    for effects, weight in _attribution(model, task, encoded, layer, start):
        for head in heads:
            site, index = model.head_site(head)
            estimate[head.head] += float(effects[site][at, index].sum()) * weight
    rest = sorted((h for h in range(width) if h not in costly), key=lambda h: (-abs(float(estimate[h])), h))
    return sorted(costly, key=lambda h: (float(accuracy[layer, h]), h)) + rest


def _attribution(model: GnaModel, task: Task, encoded: EncodedTask, layer: int, start: int | None = None) -> list[tuple[dict, float]]:
    """Per chunk of prompts, the first-order effect of zero-ablating every head of ``layer``
    and of each later layer as wide or narrower (site -> ``[pos, head]``), and the chunk's
    share of the task: one forward (from the cached prefix before ``layer``) and one
    backward per chunk, as for ``layer`` alone (a forward from ``layer`` runs the later layers
    anyway, and a gate at 0 changes no other gate's gradient). Kept in the open accuracy memo,
    so a later role's entry layer reads them (the Mamba-1 toy's Aggregate layer after its Gather
    layer: 4 backwards, not 8). ``start``: an earlier layer a later call may ask for (the costly
    layers' first): where it is as wide as ``layer``, the gates start there, so that call reads
    these too (a gate at 0 changes no later gate's gradient: the same effects for ``layer``)."""
    from ..core.compile import heads_by_site
    from ..patching.attribution import integrated_effects
    from ..patching.metrics import candidate_logit_diff

    width = model.heads_per_layer[layer]
    rows = max(1, min(ATTRIBUTION_ROWS, ATTRIBUTION_ROW_HEADS // width))
    widths = model.heads_per_layer
    kept, ambient = memo.open_memo(model), memo.memo_key(model.active_interventions)
    cache: dict = {} if kept is None or ambient is None else kept.attributions  # unkeyable ambient: not kept
    key = (kept.task_key(task) if kept is not None else "", rows, ambient)
    for (task_of, rows_of, ambient_of, first), value in cache.items():
        if (task_of, rows_of, ambient_of) == key and first <= layer and width <= widths[first]:  # ``layer``'s gates are there
            return value  # type: ignore[no-any-return]
    begin = start if start is not None and start < layer and widths[start] == width else layer
    later = [q for q in range(begin, model.n_layers) if widths[q] <= width]
    sites = sorted(heads_by_site(model.layout, [Head(q, h) for q in later for h in range(model.heads_per_layer[q])]))
    n, out = encoded.batch.n_rows, []
    for row in range(0, n, rows):
        stop = min(row + rows, n)
        chunk = Batch(encoded.batch.input_ids[row:stop], encoded.batch.attention_mask[row:stop])
        metric = candidate_logit_diff(encoded.candidate_ids[row:stop], encoded.correct[row:stop])
        targets = {site: torch.zeros(()) for site in sites}
        effects, _ = integrated_effects(model, chunk, list(model.active_interventions), targets, metric, 1, "left")
        out.append((effects, (stop - row) / n))
    cache[(*key, begin)] = out
    return out


def measure(model: GnaModel, task: Task, layer: int, order: Sequence[int], positions: torch.Tensor) -> Callable[[int], float]:
    """``k -> accuracy`` with the first ``k`` heads of ``order`` in ``layer`` ablated at
    ``positions`` (through the accuracy memo: a set measured before is not run again)."""

    def accuracy(k: int) -> float:
        return memo.accuracy(model, task, [Ablate([Head(layer, h) for h in order[:k]], positions=positions)])

    return accuracy


def measure_with(
    model: GnaModel, task: Task, layer: int, kept: Sequence[Head], order: Sequence[int], positions: torch.Tensor
) -> Callable[[int], float]:
    """``k -> accuracy`` with ``kept`` and the first ``k`` heads of ``order`` in ``layer``
    ablated together at ``positions`` (through the accuracy memo)."""

    def accuracy(k: int) -> float:
        return memo.accuracy(model, task, [Ablate([*kept, *(Head(layer, h) for h in order[:k])], positions=positions)])

    return accuracy


def fewest_reaching(measure: Callable[[int], float], width: int, line: float, known: dict[int, float] | None = None) -> int:
    """The fewest ``k`` in ``0..width`` whose ``measure(k)`` is at most ``line``, by bisection
    (exact on a curve that falls monotonically in ``k``; ``width`` where none does).
    ``known``: ``k -> measure(k)`` already measured (a size curve's points): the bisection
    starts from the tightest bracket they give, and none of them is measured again."""
    points = dict(known or {})

    def at(k: int) -> float:
        if k not in points:
            points[k] = measure(k)
        return points[k]

    if width == 0 or at(width) > line:
        return width
    # measure(lo) above the line (k = 0: the caller's own set), measure(hi) at most
    lo = max((k for k, value in points.items() if 0 <= k < width and value > line), default=0)
    hi = min(k for k, value in points.items() if lo < k <= width and value <= line)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if at(mid) <= line else (mid, hi)
    return hi


def points_after(
    curve: Sequence[tuple[int, float]], curve_order: Sequence[int], members: Sequence[Head], order: Sequence[int]
) -> dict[int, float]:
    """A size curve's points past ``members``, as ``k`` heads of ``order`` added to them (the
    cover step's bisection starts from them, `fewest_reaching`): where the curve was measured
    in the same ``order`` (``curve_order``, of the members' layer, at the same positions: the
    caller checks) and ``members`` are its first heads. Empty otherwise."""
    m = len(members)
    if list(curve_order) != list(order) or {h.head for h in members} != set(order[:m]) or len({h.layer for h in members}) > 1:
        return {}
    return {k - m: accuracy for k, accuracy in curve if k >= m}


def spent(cost: Cost, n_prompts: int, evaluations: int) -> dict[str, float]:
    """``size_cost``: ``evaluations`` (curve points measured), ``forwards``, ``backwards``,
    ``passes`` over the task."""
    return {
        "evaluations": float(evaluations),
        "forwards": float(cost.forwards),
        "backwards": float(cost.backwards),
        "passes": round(cost.passes(n_prompts), 3),
    }
