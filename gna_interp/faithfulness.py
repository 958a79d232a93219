"""`faithfulness_curve`: how much of a task the top-n heads of a ranking carry on their own.

Keep the ``n`` highest-ranked heads, ablate every other head of the model (attention and
SSM heads alike), and evaluate the task (`gna_interp.evaluation.evaluate`). As ``n`` grows
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

Cost: one `evaluate` per size, and one forward over the reference a mean or resample
ablation reads (captured once for the whole curve: `GnaModel.source_cache`), charged to any
open `gna_interp.cost_meter` as `evaluate` charges it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .core.compile import heads_of_kind
from .core.heads import Head
from .core.interventions import ABLATION_KINDS, KeepOnly
from .evaluation import Evaluation, evaluate
from .patching.results import SweepResult
from .progress import progress_bar
from .tasks.base import Task

if TYPE_CHECKING:
    import pandas as pd

    from .models.handle import GnaModel

DENSE_UP_TO = 32
"""Default ``sizes``: every n when the model has at most this many heads, else `SPARSE_POINTS`."""
SPARSE_POINTS = 24


@dataclass
class FaithfulnessCurve:
    """Accuracy and metrics of a task with only the top-n heads of a ranking kept.

    Attributes:
        sizes: ``[n_sizes]`` long, heads kept at each point (ascending).
        accuracy, margin, logprob: ``[n_sizes]`` float64 (see the module docs).
        order: the ranking, best first: the first ``sizes[i]`` heads are kept at point ``i``.
        clean: accuracy / margin / logprob with nothing ablated.
        ablated: the same with every head of the model ablated (n = 0).
        how: ``"mean"``, ``"resample"`` or ``"zero"``.
        chance: ``1 / candidates``.
        circuit: the heads of ``circuit=`` (empty when not given) and ``circuit_point``
            their accuracy / margin / logprob kept alone.
        n_prompts: prompts of the task.
    """

    sizes: Tensor
    accuracy: Tensor
    margin: Tensor
    logprob: Tensor
    order: list[Head]
    clean: dict[str, float]
    ablated: dict[str, float]
    how: str
    chance: float
    n_prompts: int
    circuit: list[Head] = field(default_factory=list)
    circuit_point: dict[str, float] | None = None

    @property
    def n_heads(self) -> int:
        """Heads of the model (the size at which nothing is ablated)."""
        return len(self.order)

    def of_clean(self, accuracy: float | Tensor | None = None) -> Any:
        """``accuracy / clean accuracy`` (default: of every point, ``[n_sizes]``)."""
        value = self.accuracy if accuracy is None else accuracy
        return value / self.clean["accuracy"] if self.clean["accuracy"] > 0 else value * math.nan

    def recovered(self, accuracy: float | Tensor | None = None) -> Any:
        """``(accuracy - ablated) / (clean - ablated)`` (default: of every point, ``[n_sizes]``)."""
        value = self.accuracy if accuracy is None else accuracy
        span = self.clean["accuracy"] - self.ablated["accuracy"]
        return (value - self.ablated["accuracy"]) / span if span != 0 else value * math.nan

    def to_frame(self) -> pd.DataFrame:
        """One row per size: ``size``, ``accuracy``, ``margin``, ``logprob``, ``of_clean``,
        ``recovered``, and ``added``, the head that point adds to the previous one's set
        (several names when a step adds several)."""
        import pandas as pd

        sizes = self.sizes.tolist()
        added = [", ".join(str(h) for h in self.order[(sizes[i - 1] if i else 0) : n]) for i, n in enumerate(sizes)]
        return pd.DataFrame(
            {
                "size": sizes,
                "accuracy": self.accuracy.tolist(),
                "margin": self.margin.tolist(),
                "logprob": self.logprob.tolist(),
                "of_clean": self.of_clean().tolist(),
                "recovered": self.recovered().tolist(),
                "added": added,
            }
        )

    def __repr__(self) -> str:
        text = (
            f"FaithfulnessCurve({len(self.sizes)} sizes of {self.n_heads} heads, how={self.how!r}, "
            f"clean {self.clean['accuracy']:.3f}, all ablated {self.ablated['accuracy']:.3f}"
        )
        if self.circuit_point is not None:
            text += f", circuit of {len(self.circuit)} heads {self.circuit_point['accuracy']:.3f}"
        return text + ")"


def faithfulness_curve(
    model: GnaModel,
    task: Task,
    ranking: SweepResult | Sequence[Head],
    sizes: Sequence[int] | None = None,
    how: str = "mean",
    *,
    reference: Any = None,
    circuit: Sequence[Head] | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> FaithfulnessCurve:
    """Keep the top-n heads of ``ranking``, ablate every other head, and evaluate ``task``.

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
        how: ``"mean"`` (each ablated head's output averaged over every token of
            ``reference``, default the task's prompts), ``"resample"`` (its output on
            ``reference``, default ``task.corrupted()``: same length, another answer) or
            ``"zero"``.
        reference: inputs the mean / resampled activations come from (see `Ablate`).
        circuit: heads to keep alone as one more point (e.g. a discovered circuit's
            Gather and Aggregate heads); its size is marked on `faithfulness_figure`.
        batch_size: prompts per forward (`evaluate`).
        progress: a bar over the sizes.

    Returns:
        `FaithfulnessCurve`; ``.to_frame()`` for a table.

    Example::

        sweep = gna.ablation_sweep(model, task, metric, how="mean", reference=task)
        curve = gna.faithfulness_curve(model, task, sweep, how="mean")
        curve.to_frame()
    """
    if not isinstance(task, Task):
        raise TypeError(f"task={task!r}: expected a gna_interp Task")
    if how not in ABLATION_KINDS:
        raise ValueError(f"how={how!r} is not an ablation kind: expected one of {ABLATION_KINDS}")
    every = list(model.heads)
    order = rank_heads(model, ranking)
    chosen = check_sizes(sizes, len(every))
    kept_circuit = _circuit(model, circuit)
    if reference is None and how != "zero":
        reference = task if how == "mean" else task.corrupted()

    def run(kept: Sequence[Head]) -> dict[str, float]:
        return keep_only_summary(model, task, kept, "all", how, reference, batch_size)

    points: dict[int, dict[str, float]] = {}
    with model.source_cache():  # the reference's forward once, not once per size and chunk
        for n in progress_bar(chosen, show=progress, desc=f"faithfulness ({how})"):
            points[n] = run(order[:n])
        circuit_point = run(kept_circuit) if kept_circuit else None
    column = {name: torch.tensor([points[n][name] for n in chosen], dtype=torch.float64) for name in ("accuracy", "margin", "logprob")}
    return FaithfulnessCurve(
        sizes=torch.tensor(chosen, dtype=torch.long),
        order=order,
        clean=points[len(every)],
        ablated=points[0],
        how=how,
        chance=1.0 / len(task.examples[0].candidates),
        n_prompts=len(task),
        circuit=kept_circuit,
        circuit_point=circuit_point,
        **column,
    )


def keep_only_summary(
    model: GnaModel, task: Task, kept: Sequence[Head], kind: str, how: str, reference: Any, batch_size: int
) -> dict[str, float]:
    """Accuracy / margin / logprob of ``task`` with only ``kept`` of the heads of ``kind``
    left (`KeepOnly`); keeping every head of the kind runs the clean model, unedited."""
    every = heads_of_kind(model.layout, kind)
    interventions = [KeepOnly(kept, kind=kind, how=how, reference=reference)] if set(kept) != set(every) else []
    return _summary(evaluate(model, task, interventions, batch_size=batch_size, progress=False))


def _summary(evaluation: Evaluation) -> dict[str, float]:
    rows = torch.arange(evaluation.scores.shape[0])
    return {
        "accuracy": evaluation.accuracy,
        "margin": float(evaluation.margins.double().mean()),
        "logprob": float(evaluation.scores[rows, evaluation.correct].double().mean()),
    }


def rank_heads(model: GnaModel, ranking: SweepResult | Sequence[Head]) -> list[Head]:
    """Every head of ``model``, best first (see `faithfulness_curve`'s ``ranking``)."""
    every = list(model.heads)
    if isinstance(ranking, SweepResult):
        if ranking.dims != ("layer", "head"):
            raise ValueError(
                f"ranking has axes {ranking.dims}: expected a SweepResult of [layer, head] scores "
                "(an ablation_sweep or attribution_patching of heads, not by position or of the residual stream)"
            )
        expected = (model.n_layers, model.n_heads)
        if tuple(ranking.scores.shape) != expected:
            raise ValueError(
                f"ranking has scores of shape {tuple(ranking.scores.shape)}: expected {expected} ([layer, head] of {model.name})"
            )
        effect = [abs(float(ranking.scores[h.layer, h.head]) - ranking.baseline) for h in every]
        # Largest effect first; NaN (not scored) last; ties keep model.heads order.
        ranked = sorted(range(len(every)), key=lambda i: (math.isnan(effect[i]), 0.0 if math.isnan(effect[i]) else -effect[i], i))
        return [every[i] for i in ranked]
    if isinstance(ranking, (str, bytes)) or not isinstance(ranking, Sequence):
        raise TypeError(f"ranking={ranking!r}: expected a SweepResult of [layer, head] scores or a list of gna_interp.Head, best first")
    listed = _heads(model, ranking, "ranking")
    return listed + [head for head in every if head not in set(listed)]


def _heads(model: GnaModel, heads: Sequence[Head], what: str) -> list[Head]:
    """``heads`` checked: Head values of ``model``, no repeats."""
    every = set(model.heads)
    seen: set[Head] = set()
    for index, head in enumerate(heads):
        if not isinstance(head, Head):
            raise TypeError(f"{what}[{index}] is {head!r} ({type(head).__name__}): expected a gna_interp.Head")
        if head not in every:
            model.check_head(head)  # names the layer / head out of range
            raise ValueError(f"{what}[{index}] is {head}, which {model.name} does not have (a layer without heads)")
        if head in seen:
            raise ValueError(f"{what}[{index}] is {head} again: expected each head once")
        seen.add(head)
    return list(heads)


def _circuit(model: GnaModel, circuit: Sequence[Head] | None) -> list[Head]:
    if circuit is None:
        return []
    if isinstance(circuit, (str, bytes)) or not isinstance(circuit, Sequence):
        raise TypeError(f"circuit={circuit!r}: expected a list of gna_interp.Head")
    if not circuit:
        raise ValueError("circuit is empty: expected the heads to keep (or None)")
    return _heads(model, circuit, "circuit")


def check_sizes(sizes: Sequence[int] | None, n_heads: int) -> list[int]:
    """Sorted distinct sizes, with 0 and ``n_heads`` added (the two ends of the curve)."""
    if sizes is None:
        if n_heads <= DENSE_UP_TO:
            return list(range(n_heads + 1))
        return sorted({round(i * n_heads / SPARSE_POINTS) for i in range(SPARSE_POINTS + 1)})
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence | range | Tensor):
        raise TypeError(f"sizes={sizes!r}: expected a list of ints, heads kept, each in 0..{n_heads}")
    values = sizes.tolist() if isinstance(sizes, Tensor) else list(sizes)
    for index, n in enumerate(values):
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"sizes[{index}]={n!r}: expected an int, heads kept, in 0..{n_heads}")
        if not 0 <= n <= n_heads:
            raise ValueError(f"sizes[{index}]={n}: expected heads kept in 0..{n_heads} (the model's heads)")
    return sorted({0, n_heads, *values})
