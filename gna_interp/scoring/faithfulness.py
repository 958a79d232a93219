"""`faithfulness_curve`: how much of a task the top-n heads of a ranking carry on their own.

Keep the ``n`` highest-ranked heads, ablate every other head of the model (attention and
SSM heads alike), and evaluate the task (`gna_interp.scoring.evaluation.evaluate`). As ``n`` grows
from 0 (every head ablated) to every head (nothing ablated: the clean model, exactly), the
accuracy climbs from the ablated floor to the clean accuracy; a faithful ranking climbs
early. With ``circuit=`` the curve also has the point of exactly those heads kept: "how
much of the task does the circuit alone carry?"

Definitions (per kept set):

- ``accuracy``: `Evaluation.accuracy` (a tie is wrong);
- ``margin``: mean over prompts of the correct candidate's log-prob minus the best other
  candidate's (`Evaluation.margins`);
- ``logprob``: mean log-prob of the correct candidate;
- ``of_clean``: ``accuracy / clean accuracy``, the share of clean accuracy kept (the
  issue's "recovers >= 90% of clean accuracy");
- ``recovered``: ``(accuracy - ablated) / (clean - ablated)``, where ``ablated`` is the
  accuracy with every head ablated: 0 at the floor, 1 at clean (NaN where the two are equal).

Cost: one `evaluate` per size, and one forward over the ``corrupt`` inputs a mean or resample
ablation reads (captured once for the whole curve: `GnaModel.source_cache`), charged to any
open `gna_interp.cost_meter` as `evaluate` charges it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..core.compile import heads_of_kind
from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..core.interventions import ABLATION_KINDS, KeepOnly
from ..core.keywords import suggest_keywords
from ..models.handle import check_model
from ..patching.results import EdgeResult, SweepResult
from ..progress import progress_bar
from ..tasks.base import Task
from .curve import FaithfulnessCurve, check_sizes, summary
from .edge_faithfulness import Edge, edge_faithfulness_curve, is_edge_ranking
from .evaluation import check_task, evaluate

if TYPE_CHECKING:
    from ..models.handle import GnaModel


@suggest_keywords
def faithfulness_curve(
    model: GnaModel,
    task: Task,
    ranking: SweepResult | Sequence[Head] | EdgeResult | Sequence[Edge],
    *,
    sizes: Sequence[int] | None = None,
    how: str | None = None,
    corrupt: Any = None,
    circuit: Sequence[Head] | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> FaithfulnessCurve:
    """Keep the top-n heads of ``ranking``, ablate every other head, and evaluate ``task``.

    Given an edge ranking (an `EdgeResult` or a list of ``(sender, receiver, stream)``)
    this is `edge_faithfulness_curve` (``corrupt``: its ``corrupt``; ``how`` must be
    left out or ``"resample"``: an edge is ablated by patching the corrupted sender into
    the receiver's stream; ``circuit`` must be left out, and ``batch_size`` left at its
    default: every prompt runs in one batch).

    Args:
        model: any `GnaModel`; every head of ``model.heads`` (attention and SSM) takes part.
        task: a `Task` (`evaluate` scores it).
        ranking: a `SweepResult` with ``[layer, head]`` scores (`gna.ablation_sweep`,
            `gna.attribution_patching`, ...): heads ordered by ``|score - baseline|``,
            largest first (ties and unscored NaN heads last, in ``model.heads`` order); or
            an ordered list of `Head` values, best first. A list may leave heads out: they
            follow, in ``model.heads`` order.
        sizes: numbers of heads kept, each in ``0..len(model.heads)`` (sorted, duplicates
            dropped). Default: every n when the model has at most 32 heads, else 24
            evenly spaced sizes; 0 and every head are always included.
        how: ``"mean"`` (the default; each ablated head's output averaged over every token of
            ``corrupt``, default the task's prompts), ``"resample"`` (its output on
            ``corrupt``, default ``task.corrupted()``: same length, another answer) or
            ``"zero"``.
        corrupt: inputs the mean / resampled activations come from (see `Ablate`).
        circuit: heads to keep alone as one more point (e.g. a discovered circuit's
            Gather and Aggregate heads); its size is marked on `faithfulness_figure`.
        batch_size: prompts per forward (`evaluate`).
        progress: a bar over the sizes.

    Returns:
        `FaithfulnessCurve`; ``.to_frame()`` for a table.

    Example::

        sweep = gna.ablation_sweep(model, task, task, metric, how="mean")
        curve = gna.faithfulness_curve(model, task, sweep, how="mean")
        curve.to_frame()
    """
    check_model(model, "faithfulness_curve")
    if is_edge_ranking(ranking):
        return _edge_ranking_curve(model, task, ranking, sizes, how, corrupt, circuit, batch_size, progress)  # type: ignore[arg-type]
    how = "mean" if how is None else how
    check_task(task, "faithfulness_curve")
    if how not in ABLATION_KINDS:
        raise GnaValueError(f"how={how!r} is not an ablation kind: expected one of {ABLATION_KINDS}")
    order = rank_heads(model, ranking)  # type: ignore[arg-type]  # an edge ranking returned above
    chosen = check_sizes(sizes, len(model.heads))
    kept_circuit = _circuit(model, circuit)
    if corrupt is None and how != "zero":
        corrupt = task if how == "mean" else task.corrupted()
    return _keep_only_curve(model, task, order, chosen, kept_circuit, how, corrupt, batch_size, progress)


def _edge_ranking_curve(
    model: GnaModel,
    task: Task,
    ranking: EdgeResult | Sequence[Edge],
    sizes: Sequence[int] | None,
    how: str | None,
    corrupt: Any,
    circuit: Sequence[Head] | None,
    batch_size: int,
    progress: bool,
) -> FaithfulnessCurve:
    """`edge_faithfulness_curve`, the head-only options refused."""
    if how not in (None, "resample"):
        raise GnaValueError(
            f"how={how!r} with an edge ranking: an edge is ablated by patching the corrupted sender into the "
            "receiver's stream; expected how=None or 'resample' (corrupt= gives the corrupted inputs)"
        )
    if circuit is not None:
        raise GnaValueError(f"circuit={circuit!r}: circuit= is for head rankings; with an edge ranking, expected circuit=None")
    if batch_size != 64:
        raise GnaValueError(
            f"batch_size={batch_size!r} with an edge ranking: edge_faithfulness_curve runs every prompt in one batch; "
            "expected the default batch_size=64"
        )
    return edge_faithfulness_curve(model, task, ranking, sizes=sizes, corrupt=corrupt, progress=progress)


def _keep_only_curve(
    model: GnaModel,
    task: Task,
    order: list[Head],
    chosen: list[int],
    kept_circuit: list[Head],
    how: str,
    corrupt: Any,
    batch_size: int,
    progress: bool,
) -> FaithfulnessCurve:
    """The curve of the top ``n`` heads of ``order`` kept, for each ``n`` of ``chosen`` (and
    ``kept_circuit`` kept alone when given)."""

    def run(kept: Sequence[Head]) -> dict[str, float]:
        return keep_only_summary(model, task, kept, "all", how, corrupt, batch_size)

    points: dict[int, dict[str, float]] = {}
    with model.source_cache():  # the corrupt inputs' forward once, not once per size and chunk
        for n in progress_bar(chosen, show=progress, desc=f"faithfulness ({how})"):
            points[n] = run(order[:n])
        circuit_point = run(kept_circuit) if kept_circuit else None
    column = {name: torch.tensor([points[n][name] for n in chosen], dtype=torch.float64) for name in ("accuracy", "margin", "logprob")}
    return FaithfulnessCurve(
        sizes=torch.tensor(chosen, dtype=torch.long),
        order=order,
        clean=points[len(model.heads)],
        ablated=points[0],
        how=how,
        chance=1.0 / len(task.examples[0].candidates),
        n_prompts=len(task),
        circuit=kept_circuit,
        circuit_point=circuit_point,
        **column,
    )


def keep_only_summary(
    model: GnaModel, task: Task, kept: Sequence[Head], kind: str, how: str, corrupt: Any, batch_size: int
) -> dict[str, float]:
    """Accuracy / margin / logprob of ``task`` with only ``kept`` of the heads of ``kind``
    left (`KeepOnly`); keeping every head of the kind runs the clean model, unedited."""
    every = heads_of_kind(model.layout, kind)
    interventions = [KeepOnly(kept, kind=kind, how=how, corrupt=corrupt)] if set(kept) != set(every) else []
    return summary(evaluate(model, task, interventions, batch_size=batch_size, progress=False))


def rank_heads(model: GnaModel, ranking: SweepResult | Sequence[Head]) -> list[Head]:
    """Every head of ``model``, best first (see `faithfulness_curve`'s ``ranking``)."""
    every = list(model.heads)
    if isinstance(ranking, SweepResult):
        if ranking.dims != ("layer", "head"):
            raise GnaValueError(
                f"ranking has axes {ranking.dims}: expected a SweepResult of [layer, head] scores "
                "(an ablation_sweep or attribution_patching of heads, not by position or of the residual stream)"
            )
        expected = (model.n_layers, model.n_heads)
        if tuple(ranking.scores.shape) != expected:
            raise GnaValueError(
                f"ranking has scores of shape {tuple(ranking.scores.shape)}: expected {expected} ([layer, head] of {model.name})"
            )
        effect = [abs(float(ranking.scores[h.layer, h.head]) - ranking.baseline) for h in every]
        # Largest effect first; NaN (not scored) last; ties keep model.heads order.
        ranked = sorted(range(len(every)), key=lambda i: (math.isnan(effect[i]), 0.0 if math.isnan(effect[i]) else -effect[i], i))
        return [every[i] for i in ranked]
    if isinstance(ranking, (str, bytes)) or not isinstance(ranking, Sequence):
        raise GnaTypeError(f"ranking={ranking!r}: expected a SweepResult of [layer, head] scores or a list of gna_interp.Head, best first")
    listed = _heads(model, ranking, "ranking")
    seen = set(listed)  # once: rebuilt per head, it took minutes at 64 x 8,192 heads (quadratic)
    return listed + [head for head in every if head not in seen]


def _heads(model: GnaModel, heads: Sequence[Head], what: str) -> list[Head]:
    """``heads`` checked: Head values of ``model``, no repeats."""
    every = set(model.heads)
    seen: set[Head] = set()
    for index, head in enumerate(heads):
        if not isinstance(head, Head):
            raise GnaTypeError(f"{what}[{index}] is {head!r} ({type(head).__name__}): expected a gna_interp.Head")
        if head not in every:
            model.check_head(head)  # names the layer / head out of range
            raise GnaValueError(f"{what}[{index}] is {head}, which {model.name} does not have (a layer without heads)")
        if head in seen:
            raise GnaValueError(f"{what}[{index}] is {head} again: expected each head once")
        seen.add(head)
    return list(heads)


def _circuit(model: GnaModel, circuit: Sequence[Head] | None) -> list[Head]:
    if circuit is None:
        return []
    if isinstance(circuit, (str, bytes)) or not isinstance(circuit, Sequence):
        raise GnaTypeError(f"circuit={circuit!r}: expected a list of gna_interp.Head")
    if not circuit:
        raise GnaValueError("circuit is empty: expected the heads to keep (or None)")
    return _heads(model, circuit, "circuit")
