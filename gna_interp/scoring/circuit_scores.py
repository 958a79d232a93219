"""`circuit_score`: a ranking's circuits scored as the MIB benchmark scores them.

MIB (Mueller et al. 2025, "MIB: A Mechanistic Interpretability Benchmark", circuit
localisation track) scores a circuit ``C`` of a model ``N`` by its faithfulness

    f(C) = (m(C) - m(∅)) / (m(N) - m(∅))

where ``m`` is the task metric averaged over the prompts (before the ratio), ``m(N)`` the
clean model's, ``m(C)`` the model's with every unit outside ``C`` taking its corrupted
value, and ``m(∅)`` the model's with every unit corrupted. A method is scored on the
circuits of the top ``k`` units of its ranking, for ``k`` a fraction of the units
(`MIB_FRACTIONS`, 0.1% to 100%), by two areas over the fractions (trapezoid rule):

- **CPR** (higher is better): the area under ``f``;
- **CMD** (lower is better): the area under ``|1 - f|``, how far the circuits are from
  the model's behaviour, whichever side.

Here the units are the model's heads (attention and SSM alike: the out-projection input of
each), or edges ``(sender, receiver, stream)`` for an edge ranking. MLPs, norms and
embeddings are not units: they run on whatever reaches them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from ..core.compile import Sources, ablation_values, head_mask, heads_by_site
from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..core.keywords import renamed, suggest_keywords
from ..core.plan import Edit
from ..models.handle import check_model
from ..patching.edge_sets import edge_set_logits
from ..patching.metrics import Metric, check_metric, logits_read, reduce_metric
from ..patching.paths import PathKind, prepare
from ..patching.results import EdgeResult, SweepResult
from ..patching.variants import Variant, run_variants
from ..progress import progress_bar
from .edge_faithfulness import Edge, ablated_edges, edge_name, edge_senders, edge_streams, is_edge_ranking, rank_edges
from .faithfulness import rank_heads
from .mib import MibGraph
from .mib_scores import mib_edge_points

if TYPE_CHECKING:
    import pandas as pd

    from ..models.handle import GnaModel

MIB_FRACTIONS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""MIB's circuit sizes, as fractions of the units (its ``evaluate_area_under_curve``)."""

HOW = {"corrupt": "resample", "resample": "resample", "mean": "mean", "zero": "zero"}
"""``how=`` -> the ablation kind of `gna_interp.Ablate` that gives it."""


@dataclass
class CircuitScore:
    """Faithfulness of the top-k units of a ranking at each circuit size, with MIB's areas.

    Attributes:
        sizes: ``[n_points]`` long, units kept (ascending, distinct): heads, or edges.
        fractions: ``[n_points]`` float64, ``sizes / n_units``: the x axis of the areas.
        faithfulness: ``[n_points]`` float64, ``f = (m(C) - m(∅)) / (m(N) - m(∅))``.
        metric: ``[n_points]`` float64, ``m(C)``, the metric averaged over the prompts.
        cpr: trapezoid area of ``faithfulness`` over ``fractions`` (higher is better).
        cmd: trapezoid area of ``|1 - faithfulness|`` over ``fractions`` (lower is better).
        ranking: every unit, best first (`Head` values, or ``(sender, receiver, stream)`` edges).
        metric_full: ``m(N)``, the clean model.
        metric_empty: ``m(∅)``, every unit corrupted.
        how: ``"corrupt"``, ``"mean"`` or ``"zero"``.
        unit: ``"head"`` or ``"edge"``.
        requested: the fractions asked for (each became ``sizes`` by floor, see `circuit_score`).
        n_prompts: prompts the metric was averaged over.
        kept: ``[n_points]`` long, with ``unit="edge"`` (MIB's budgets): the edges left in
            each circuit by MIB's prune (MIB's ``weighted_edge_count``); else None.
    """

    sizes: Tensor
    fractions: Tensor
    faithfulness: Tensor
    metric: Tensor
    cpr: float
    cmd: float
    ranking: list[Any]
    metric_full: float
    metric_empty: float
    how: str
    unit: str
    requested: tuple[float, ...]
    n_prompts: int
    kept: Tensor | None = None

    @property
    def n_units(self) -> int:
        """Units ranked: the model's heads, or the ranked edges."""
        return len(self.ranking)

    def to_frame(self) -> pd.DataFrame:
        """One row per size: ``size``, ``fraction``, ``metric`` (m(C)), ``faithfulness``."""
        import pandas as pd

        return pd.DataFrame(
            {
                "size": self.sizes.tolist(),
                "fraction": self.fractions.tolist(),
                "metric": self.metric.tolist(),
                "faithfulness": self.faithfulness.tolist(),
            }
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers, lists and strings (JSON as is); units by name (``"L0H1"``, ``"L0H1->L1H0.k"``)."""
        return {
            "cpr": self.cpr,
            "cmd": self.cmd,
            "how": self.how,
            "unit": self.unit,
            "n_units": self.n_units,
            "n_prompts": self.n_prompts,
            "metric_full": self.metric_full,
            "metric_empty": self.metric_empty,
            "requested": list(self.requested),
            "sizes": self.sizes.tolist(),
            "fractions": self.fractions.tolist(),
            "metric": self.metric.tolist(),
            "faithfulness": self.faithfulness.tolist(),
            "ranking": [str(u) if isinstance(u, Head) else edge_name(u) for u in self.ranking],
        }

    def __repr__(self) -> str:
        return (
            f"CircuitScore(CPR {self.cpr:.3f}, CMD {self.cmd:.3f}; {len(self.sizes)} sizes of {self.n_units} {self.unit}s, "
            f"how={self.how!r}, m(N) {self.metric_full:.4g}, m(∅) {self.metric_empty:.4g})"
        )


@renamed(max_rows="batch_size")
@suggest_keywords
def circuit_score(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    ranking: SweepResult | Sequence[Head] | EdgeResult | Sequence[Edge] | MibGraph,
    *,
    how: str = "corrupt",
    fractions: Sequence[float] | None = None,
    batch_size: int | None = None,
    memory_budget_mb: float | None = None,
    path: PathKind | Literal["mib"] = "all",
    unit: str | None = None,
    absolute: bool = True,
    progress: bool = True,
) -> CircuitScore:
    """MIB's faithfulness of the top-k units of ``ranking`` at each size, with CPR and CMD.

    For each fraction ``p``, the circuit ``C`` is the top ``k = floor(p * n_units)`` units
    (MIB's ``int(p * n)``; 0 units: the empty circuit, ``f = 0``). ``m(C)``: the metric of
    ``clean`` with every head outside ``C`` ablated ``how`` (or every ranked edge outside
    ``C`` patched from ``corrupt``); ``m(∅)``: every head (ranked edge) so; ``m(N)``: the
    clean model; each averaged over the prompts, then ``f = (m(C) - m(∅)) / (m(N) - m(∅))``.
    Sizes that coincide are scored once; the areas (CPR: ``f``, CMD: ``|1 - f|``) run over
    the realised fractions ``k / n_units`` (on 8 heads MIB's 0.1% to 10% are one point at 0).

    Args:
        model: any `GnaModel`.
        clean: the inputs measured (prompts, token ids or a task).
        corrupt: the corrupted inputs (the same token length as ``clean``; with ``"mean"``
            the inputs of the mean; unread with ``"zero"``).
        metric: logits ``[batch, pos, vocab]`` -> scalar or ``[batch]`` (averaged over rows).
        ranking: best first: a `SweepResult` (heads by ``|score - baseline|``, NaN last, as
            `faithfulness_curve`; MIB's CPR table ranks by signed score: pass a list for
            another order), a list of `Head` (the rest follow in ``model.heads`` order), an
            `EdgeResult` or a list of ``(sender, receiver, stream)`` (ordered and completed as
            in `edge_faithfulness_curve`; ``how="corrupt"`` only), or with ``unit="edge"`` a
            `MibGraph` (`mib_attribution`, `from_mib`).
        how: ``"corrupt"`` (each head's output on ``corrupt``; also ``"resample"``),
            ``"mean"`` (averaged over every token of ``corrupt``) or ``"zero"``.
        fractions: sizes as fractions of the units, each in (0, 1] (default `MIB_FRACTIONS`).
        batch_size: rows per stacked forward (heads; default: from ``memory_budget_mb``).
        memory_budget_mb: the memory a stacked forward may use, to estimate ``batch_size``.
        path: which edge is ablated (`edge_faithfulness_curve`): ``"all"`` (`path_patching`'s)
            or ``"direct"`` (EAP's: the sender's own write; also ``"embed"``, ``"L0MLP"``,
            ``"logits"`` ends); with ``unit="edge"`` also ``"mib"`` (MIB's own evaluation:
            the circuit chained, `gna_interp.scoring.mib_eval`). Unused for heads.
        unit: ``None`` (heads or edges, by the ranking, as above) or ``"edge"``: MIB's edge
            budgets over MIB's graph (`gna_interp.scoring.mib_scores`): the circuit at each
            budget is MIB's top ``int(p * n_edges)`` edges then its prune, the areas over the
            nominal fractions; ``kept`` holds the pruned circuits' sizes.
        absolute: with ``unit="edge"``, rank by ``|score|`` (MIB's CMD) or signed (its CPR).
        progress: a bar over the sizes.

    Returns:
        `CircuitScore`: ``cpr``, ``cmd``, ``faithfulness`` per size, ``.to_frame()``, ``.to_dict()``.

    Raises:
        GnaValueError: an unknown head or edge, an empty ranking, a fraction outside (0, 1],
            fewer than two distinct sizes, or ``m(N) == m(∅)`` (the score is undefined).

    Cost (heads): a clean forward, the ``corrupt`` forward the ablation reads (none for
    ``"zero"``), one copy of the batch per size below every head, stacked (`run_variants`:
    ``batch_size``, prefix reuse). Edges: `edge_faithfulness_curve`'s per size.

    Example::

        score = gna.circuit_score(model, clean, corrupt, metric, gna.attribution_patching(model, clean, corrupt, metric))
        score.cpr, score.cmd, score.to_frame()
    """
    if unit is not None:
        return _edge_budgets(model, clean, corrupt, metric, ranking, how, fractions, path, unit, absolute, progress)
    if path == "mib" or isinstance(ranking, MibGraph):
        raise GnaValueError("path='mib' and a MibGraph ranking take unit='edge' (MIB's edge budgets over its graph)")
    return _circuit_score(model, clean, corrupt, metric, ranking, how, fractions, batch_size, memory_budget_mb, path, progress)


def _edge_budgets(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    ranking: Any,
    how: str,
    fractions: Any,
    path: Any,
    unit: str,
    absolute: bool,
    progress: bool,
) -> CircuitScore:
    """`circuit_score(..., unit="edge")`: MIB's edge budgets (`mib_scores.mib_edge_points`)."""
    check_model(model, "circuit_score")
    check_metric(metric, "circuit_score", clean=clean, corrupt=corrupt)
    if unit != "edge":
        raise GnaValueError(f"unit={unit!r}: expected None (heads or edges, by the ranking) or 'edge' (MIB's edge budgets)")
    if how not in ("corrupt", "resample") or corrupt is None:
        raise GnaValueError(
            f"unit='edge' ablates an edge by patching its corrupt sender: expected how='corrupt' and corrupt= inputs, got how={how!r}"
        )
    requested = check_fractions(fractions)
    order, values, full, empty, kept, n_rows = mib_edge_points(model, clean, corrupt, metric, ranking, path, absolute, requested, progress)
    span = full - empty
    if not math.isfinite(span) or abs(span) <= 1e-9 * max(1.0, abs(full)):
        raise GnaValueError(
            f"the score is undefined: m(N) = {full:.6g} (clean) and m(∅) = {empty:.6g} (no edge kept) are equal, so "
            "f = (m(C) - m(∅)) / (m(N) - m(∅)) divides by zero: check that corrupt differs from clean where the metric reads"
        )
    metric_c = torch.tensor(values, dtype=torch.float64)
    faith = (metric_c - empty) / span + 0.0
    x = torch.tensor(requested, dtype=torch.float64)
    sizes = torch.tensor([int(p * len(order)) for p in requested], dtype=torch.long)
    return CircuitScore(
        sizes,
        x,
        faith,
        metric_c,
        trapezoid(x, faith),
        trapezoid(x, (1 - faith).abs()),
        order,
        full,
        empty,
        "corrupt",
        "edge",
        requested,
        n_rows,
        torch.tensor(kept, dtype=torch.long),
    )


def circuit_score_from(
    model: GnaModel, clean: Any, corrupt: Any, metric: Metric, ranking: Sequence[Head], sources: Sources, *, progress: bool = False
) -> CircuitScore:
    """`circuit_score` of a head ranking (``how="corrupt"``, MIB's fractions) whose corrupt
    head outputs come from ``sources(corrupt, sites) -> (batch, {site: [batch, pos, head,
    d_head]})`` (e.g. a capture over ``corrupt`` already made, with no interventions) instead
    of a forward over ``corrupt``: the same numbers, one corrupt forward fewer."""
    return _circuit_score(model, clean, corrupt, metric, ranking, "corrupt", None, None, None, "all", progress, sources)


def _circuit_score(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    ranking: SweepResult | Sequence[Head] | EdgeResult | Sequence[Edge],
    how: str,
    fractions: Sequence[float] | None,
    batch_size: int | None,
    memory_budget_mb: float | None,
    path: PathKind,
    progress: bool,
    sources: Sources | None = None,
) -> CircuitScore:
    """`circuit_score`; ``sources``: where a head ranking's ablation reads ``corrupt``'s head
    outputs (default `GnaModel.capture_sites`, one forward)."""
    check_model(model, "circuit_score")
    check_metric(metric, "circuit_score", clean=clean, corrupt=corrupt)
    if how not in HOW:
        raise GnaValueError(f"how={how!r}: expected one of {sorted(set(HOW) - {'resample'})} (MIB's corrupt, mean or zero ablation)")
    how = "corrupt" if how == "resample" else how
    if how != "zero" and corrupt is None:
        raise GnaValueError(f"how={how!r} needs corrupt= inputs to take activations from (or how='zero')")
    requested = check_fractions(fractions)
    _refuse_empty(ranking)
    desc = f"circuit score ({how})"
    if is_edge_ranking(ranking):
        if how != "corrupt":
            raise GnaValueError(
                f"how={how!r} with an edge ranking: an edge is ablated by patching its corrupted sender into the "
                "receiver's stream; expected how='corrupt'"
            )
        edges, universe = rank_edges(model, ranking)  # type: ignore[arg-type]
        sizes = realised_sizes(requested, len(edges))
        values, n_rows = _edge_points(model, clean, corrupt, metric, edges, universe, sizes, progress, desc, path)
        return scored(values, sizes, edges, how, "edge", requested, n_rows)
    heads = rank_heads(model, ranking)  # type: ignore[arg-type]
    sizes = realised_sizes(requested, len(heads))
    chunking = (batch_size, memory_budget_mb, progress, desc)
    values, n_rows = _head_points(model, clean, corrupt, metric, heads, sizes, how, *chunking, sources=sources or model.capture_sites)
    return scored(values, sizes, heads, how, "head", requested, n_rows)


def scored(
    values: dict[int, float], sizes: list[int], order: Sequence[Any], how: str, unit: str, requested: tuple[float, ...], n_rows: int
) -> CircuitScore:
    """The `CircuitScore` of ``values`` (``{size: m(C)}``, with 0 and every unit among them)."""
    full, empty = values[len(order)], values[0]
    span = full - empty
    if not math.isfinite(span) or abs(span) <= 1e-9 * max(1.0, abs(full)):
        raise GnaValueError(
            f"the score is undefined: m(N) = {full:.6g} (clean) and m(∅) = {empty:.6g} (every {unit} ablated {how}) are equal, "
            "so f = (m(C) - m(∅)) / (m(N) - m(∅)) divides by zero: the metric does not see the ablation "
            "(check that corrupt differs from clean where the metric reads, and that the metric reads the logits)"
        )
    metric = torch.tensor([values[k] for k in sizes], dtype=torch.float64)
    faith = (metric - empty) / span + 0.0  # + 0.0: no -0.0 at the empty circuit
    x = torch.tensor(sizes, dtype=torch.float64) / len(order)
    return CircuitScore(
        sizes=torch.tensor(sizes, dtype=torch.long),
        fractions=x,
        faithfulness=faith,
        metric=metric,
        cpr=trapezoid(x, faith),
        cmd=trapezoid(x, (1 - faith).abs()),
        ranking=list(order),
        metric_full=full,
        metric_empty=empty,
        how=how,
        unit=unit,
        requested=requested,
        n_prompts=n_rows,
    )


def trapezoid(x: Tensor, y: Tensor) -> float:
    """``sum_i (x[i+1] - x[i]) (y[i] + y[i+1]) / 2`` (0 for a single point)."""
    return float(((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2).sum())


def check_fractions(fractions: Sequence[float] | None) -> tuple[float, ...]:
    """The fractions, sorted and distinct; each a number in (0, 1]."""
    if fractions is None:
        return MIB_FRACTIONS
    if isinstance(fractions, (str, bytes)) or not isinstance(fractions, Sequence | Tensor):
        raise GnaTypeError(f"fractions={fractions!r}: expected a list of numbers in (0, 1], e.g. {list(MIB_FRACTIONS)}")
    values = fractions.tolist() if isinstance(fractions, Tensor) else list(fractions)
    if not values:
        raise GnaValueError("fractions is empty: expected circuit sizes as fractions of the units, each in (0, 1]")
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GnaTypeError(f"fractions[{index}]={value!r}: expected a number in (0, 1]")
        if not 0 < value <= 1:
            raise GnaValueError(f"fractions[{index}]={value!r}: expected a fraction of the units in (0, 1] (1: every unit)")
    return tuple(sorted({float(v) for v in values}))


def realised_sizes(fractions: Sequence[float], n_units: int) -> list[int]:
    """``floor(p * n_units)`` for each fraction (MIB's ``int(p * n)``; a hair of tolerance,
    so that ``k / n`` gives ``k``), distinct, with 0 and ``n_units`` (the two ends ``m(∅)``
    and ``m(N)`` the ratio needs), ascending. Fewer than two sizes from the fractions: an error."""
    chosen = sorted({math.floor(p * n_units + 1e-9) for p in fractions})
    if len(chosen) < 2:
        raise GnaValueError(
            f"fractions {list(fractions)} give one circuit size ({chosen[0]} of {n_units} units): an area needs at least two"
        )
    return sorted({0, n_units, *chosen})


def _refuse_empty(ranking: Any) -> None:
    if isinstance(ranking, Sequence) and not isinstance(ranking, (str, bytes)) and len(ranking) == 0:
        raise GnaValueError("ranking is empty: expected heads (a SweepResult or a list of Head) or edges, best first")


def _head_points(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    order: list[Head],
    sizes: list[int],
    how: str,
    batch_size: int | None,
    memory_budget_mb: float | None,
    progress: bool,
    desc: str,
    *,
    sources: Sources,
) -> tuple[dict[int, float], int]:
    """``{size: m(C)}``: the clean run is m(N); each smaller size is one copy of the batch
    whose heads outside the top ``size`` take their ablation values (`run_variants`), read
    from ``corrupt`` through ``sources``."""
    batch = model.to_batch(clean)
    base = model.compile_plan(batch, list(model.active_interventions))
    values = ablation_values(batch, sorted(heads_by_site(model.layout, order)), HOW[how], corrupt, sources)
    below = [k for k in sizes if k < len(order)]
    variants = [
        Variant(
            [
                (site, Edit(head_mask(model.layout, site, idx), values[site]))
                for site, idx in sorted(heads_by_site(model.layout, order[k:]).items())
            ]
        )
        for k in below
    ]
    chunking = dict(batch_size=batch_size, memory_budget_mb=memory_budget_mb, progress=progress, desc=desc)
    full, scores = run_variants(model, batch, base, variants, metric, **chunking)  # type: ignore[arg-type]
    return {len(order): full, **{k: float(s) for k, s in zip(below, scores, strict=True)}}, batch.n_rows


def _edge_points(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    order: list[Edge],
    universe: list[Edge],
    sizes: list[int],
    progress: bool,
    desc: str,
    path: PathKind = "all",
) -> tuple[dict[int, float], int]:
    """``{size: m(C)}`` over edges: path patching's clean run is m(N); each smaller size is
    `edge_set_logits` with every ranked edge outside the top ``size`` ablated."""
    receivers = list(dict.fromkeys(receiver for _, receiver, _ in universe))
    setup, full, _ = prepare(model, clean, corrupt, edge_senders(universe), receivers, metric, edge_streams(universe), (), path)
    keep = logits_read(metric)
    values = {len(order): full}
    for k in progress_bar([k for k in sizes if k < len(order)], show=progress, desc=desc):
        logits = edge_set_logits(setup, ablated_edges(model, order, universe, k), keep)
        values[k] = reduce_metric(metric(logits), metric, setup.batch.n_rows)
    return values, setup.batch.n_rows
