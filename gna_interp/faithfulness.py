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
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from .core.compile import heads_of_kind
from .core.heads import Head
from .core.interventions import ABLATION_KINDS, KeepOnly
from .evaluation import Evaluation, check_task, evaluate
from .patching.edges import EdgeResult
from .patching.metrics import Metric, check_metric, logits_read, reads_position, reduce_metric
from .patching.path_chain import edge_set_logits
from .patching.paths import prepare
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
    unit: ClassVar[str] = "head"
    """What ``sizes`` counts (``"edge"`` in `EdgeFaithfulnessCurve`)."""

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
    ranking: SweepResult | Sequence[Head] | EdgeResult | Sequence[Edge],
    sizes: Sequence[int] | None = None,
    how: str | None = None,
    *,
    reference: Any = None,
    circuit: Sequence[Head] | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> FaithfulnessCurve:
    """Keep the top-n heads of ``ranking``, ablate every other head, and evaluate ``task``.

    Given an edge ranking (an `EdgeResult` or a list of ``(sender, receiver, stream)``)
    this is `edge_faithfulness_curve` (``reference``: its ``corrupt``; ``how`` must be
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
    if _is_edge_ranking(ranking):
        if how not in (None, "resample"):
            raise ValueError(
                f"how={how!r} with an edge ranking: an edge is ablated by patching the corrupted sender into the "
                "receiver's stream; expected how=None or 'resample' (reference= gives the corrupted inputs)"
            )
        if circuit is not None:
            raise ValueError(f"circuit={circuit!r}: circuit= is for head rankings; with an edge ranking, expected circuit=None")
        if batch_size != 64:
            raise ValueError(
                f"batch_size={batch_size!r} with an edge ranking: edge_faithfulness_curve runs every prompt in one batch; "
                "expected the default batch_size=64"
            )
        return edge_faithfulness_curve(model, task, ranking, sizes, corrupt=reference, progress=progress)  # type: ignore[arg-type]
    how = "mean" if how is None else how
    check_task(task, "faithfulness_curve")
    if how not in ABLATION_KINDS:
        raise ValueError(f"how={how!r} is not an ablation kind: expected one of {ABLATION_KINDS}")
    every = list(model.heads)
    order = rank_heads(model, ranking)  # type: ignore[arg-type]  # an edge ranking returned above
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


def check_sizes(sizes: Sequence[int] | None, n_heads: int, what: str = "heads") -> list[int]:
    """Sorted distinct sizes, with 0 and ``n_heads`` added (the two ends of the curve)."""
    if sizes is None:
        if n_heads <= DENSE_UP_TO:
            return list(range(n_heads + 1))
        return sorted({round(i * n_heads / SPARSE_POINTS) for i in range(SPARSE_POINTS + 1)})
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence | range | Tensor):
        raise TypeError(f"sizes={sizes!r}: expected a list of ints, {what} kept, each in 0..{n_heads}")
    values = sizes.tolist() if isinstance(sizes, Tensor) else list(sizes)
    for index, n in enumerate(values):
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"sizes[{index}]={n!r}: expected an int, {what} kept, in 0..{n_heads}")
        if not 0 <= n <= n_heads:
            whose = "the model's heads" if what == "heads" else f"the {what} ranked"
            raise ValueError(f"sizes[{index}]={n}: expected {what} kept in 0..{n_heads} ({whose})")
    return sorted({0, n_heads, *values})


# ----- edges ---------------------------------------------------------------------------------

Edge = tuple[Head, Head, str]
"""``(sender, receiver, stream)``; the stream ``"any"`` stands for every input stream of
the receiver's mixer."""


@dataclass
class EdgeFaithfulnessCurve(FaithfulnessCurve):
    """`FaithfulnessCurve` over edges: ``order`` holds ``(sender, receiver, stream)`` edges,
    best first, and ``sizes`` counts edges kept. ``ablated`` is every edge of ``order``
    ablated (path patching of them all); ``metric`` ``[n_sizes]`` is the ``metric=``
    argument's value at each point (None when not given); ``clean_metric`` its clean value."""

    metric: Tensor | None = None
    clean_metric: float | None = None
    unit: ClassVar[str] = "edge"

    @property
    def n_edges(self) -> int:
        """The number of ranked edges (``len(order)``): the largest size, every edge kept."""
        return len(self.order)

    def to_frame(self) -> pd.DataFrame:
        """As `FaithfulnessCurve.to_frame` (``added`` names edges ``"L0H1->L1H0.k"``), with a
        ``metric`` column when ``metric=`` was given."""
        frame = super().to_frame()
        sizes = self.sizes.tolist()
        edges: list[Edge] = self.order  # type: ignore[assignment]
        frame["added"] = [", ".join(edge_name(e) for e in edges[(sizes[i - 1] if i else 0) : n]) for i, n in enumerate(sizes)]
        if self.metric is not None:
            frame["metric"] = self.metric.tolist()
        return frame

    def __repr__(self) -> str:
        return (
            f"EdgeFaithfulnessCurve({len(self.sizes)} sizes of {self.n_edges} edges, clean {self.clean['accuracy']:.3f}, "
            f"all ablated {self.ablated['accuracy']:.3f})"
        )


def edge_name(edge: Edge) -> str:
    """``(sender, receiver, stream)`` -> ``"L0H1->L1H0.k"`` (``stream`` may be ``"any"``)."""
    sender, receiver, stream = edge
    return f"{sender}->{receiver}.{stream}"


def edge_faithfulness_curve(
    model: GnaModel,
    task: Task,
    ranking: EdgeResult | Sequence[Edge],
    sizes: Sequence[int] | None = None,
    *,
    corrupt: Any = None,
    metric: Metric | None = None,
    progress: bool = True,
) -> EdgeFaithfulnessCurve:
    """Keep the top-n edges of ``ranking``; every other edge into the receivers is ablated by
    patching its corrupted sender into the receiver's stream; evaluate ``task``.

    At each size, for every receiver ``r`` and stream ``st``, ``S(r, st)`` is the set of
    ablated edges' senders; the run scored is `path_patching`'s, with ``r``'s ``st`` taken
    from the D run of the senders ``S(r, st)`` (every other head frozen, MLPs and norms
    recomputed) and only the receivers' outputs changed (details:
    `gna_interp.patching.path_chain.edge_set_logits`). Keeping every edge is the clean run;
    keeping none is `path_patching` of every sender into every receiver stream at once;
    keeping all but one edge ``s -> (r, st)`` is `path_patching(s, [r], st)`.

    The edges that can be ablated are the ranked ones: an `EdgeResult` ranks only its own
    edges (its senders into its receivers' streams; a head it did not score as a sender is
    never ablated), while a list adds, into each ``(receiver, stream)`` it names, every
    edge from a head before the receiver (after the listed ones).

    Args:
        model: any `GnaModel` (forwards only).
        task: a `Task` with single-token candidates; every prompt in one batch.
        ranking: an `EdgeResult` (`gna.edge_attribution`): its edges (NaN entries are not
            edges) ordered by ``|effect|``, largest first, ties in table order; or a list
            of ``(sender, receiver, stream)``, best first (``stream`` a name from
            ``model.receiver_inputs(receiver)`` or ``"any"``: every stream of it). A list
            may leave edges out: every edge from a head before the receiver into a
            ``(receiver, stream)`` the list names follows, in ``model.heads`` order.
        sizes: edges kept, each in ``0..len(order)``; default as in `faithfulness_curve`.
        corrupt: the inputs the ablated senders' values come from: the same token length
            as the task's prompts (default ``task.corrupted()``).
        metric: optional logits ``[batch, pos, vocab]`` -> scalar or ``[batch]``, reported
            at each point (e.g. the metric the ranking was computed with).
        progress: a bar over the sizes.

    Returns:
        `EdgeFaithfulnessCurve`; ``.to_frame()`` for a table.

    Cost per size: a forward of the clean batch stacked once per distinct sender set
    (D), one stacked once per receiver (its recomputed output), and the scored forward,
    per receiver position (more than one position adds one forward each); plus one clean
    and one corrupt forward for the whole curve. Forwards only, charged to any open
    `gna_interp.cost_meter`.
    """
    check_task(task, "edge_faithfulness_curve")
    if metric is not None:
        check_metric(metric)
    order, universe = rank_edges(model, ranking)
    chosen = check_sizes(sizes, len(order), "edges")
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    if not encoded.single_token:
        raise ValueError("task has candidates of several tokens: edge_faithfulness_curve scores single-token candidates only")
    corrupt = task.corrupted() if corrupt is None else corrupt
    receivers = list(dict.fromkeys(receiver for _, receiver, _ in universe))
    streams = list(dict.fromkeys(stream for _, _, stream in universe))
    senders = sorted({sender for sender, _, _ in universe})

    def final_logit(logits: Tensor) -> Tensor:  # prepare's clean and corrupt runs need a metric; unread
        return logits[:, -1, 0]

    probe = metric if metric is not None else reads_position(final_logit)
    setup, _, _ = prepare(model, task, corrupt, senders, receivers, probe, streams, ())
    keep = 1 if metric is None else logits_read(metric)  # 0: every position (an undeclared metric)

    points: dict[int, dict[str, float]] = {}
    for n in progress_bar(chosen, show=progress, desc="edge faithfulness"):
        kept = {edge for item in order[:n] for edge in _atoms(model, item)}
        ablated: dict[tuple[Head, str], list[Head]] = {}
        for sender, receiver, stream in universe:
            if (sender, receiver, stream) not in kept:
                ablated.setdefault((receiver, stream), []).append(sender)
        logits = edge_set_logits(setup, ablated, keep)
        scores = logits[:, -1].float().log_softmax(-1).cpu().gather(1, encoded.candidate_ids)
        evaluation = Evaluation(scores=scores, correct=encoded.correct.clone())
        point = _summary(evaluation)
        if metric is not None:
            point["metric"] = reduce_metric(metric(logits), metric, encoded.batch.n_rows)
        points[n] = point

    def column(name: str) -> Tensor:
        return torch.tensor([points[n][name] for n in chosen], dtype=torch.float64)

    return EdgeFaithfulnessCurve(
        sizes=torch.tensor(chosen, dtype=torch.long),
        accuracy=column("accuracy"),
        margin=column("margin"),
        logprob=column("logprob"),
        order=order,  # type: ignore[arg-type]
        clean=points[len(order)],
        ablated=points[0],
        how="resample",
        chance=1.0 / len(task.examples[0].candidates),
        n_prompts=len(task),
        metric=column("metric") if metric is not None else None,
        clean_metric=points[len(order)]["metric"] if metric is not None else None,
    )


def _is_edge_ranking(ranking: Any) -> bool:
    """An `EdgeResult`, or a list whose first item looks like ``(sender, receiver, stream)``."""
    if isinstance(ranking, EdgeResult):
        return True
    if isinstance(ranking, (str, bytes)) or not isinstance(ranking, Sequence) or not ranking:
        return False
    first = ranking[0]
    return isinstance(first, tuple) and len(first) == 3 and isinstance(first[0], Head)


def _atoms(model: GnaModel, edge: Edge) -> list[Edge]:
    """``edge`` with ``"any"`` spelled out as every stream of the receiver's mixer."""
    sender, receiver, stream = edge
    if stream == "any":
        return [(sender, receiver, name) for name in model.receiver_inputs(receiver)]
    return [edge]


def rank_edges(model: GnaModel, ranking: EdgeResult | Sequence[Edge]) -> tuple[list[Edge], list[Edge]]:
    """The ranked edges (best first; each counts as one at every size) and every atomic
    edge ``(sender, receiver, stream)`` they and the unlisted ones stand for."""
    if isinstance(ranking, EdgeResult):
        table = ranking.scores if ranking.scores.dim() == 3 else ranking.scores[..., None]
        listed: list[tuple[float, int, Edge]] = []
        for i, sender in enumerate(ranking.senders):
            for j, receiver in enumerate(ranking.receivers):
                for k, stream in enumerate(ranking.streams):
                    value = float(table[i, j, k])
                    if value == value:
                        listed.append((-abs(value), len(listed), (sender, receiver, stream)))
        order = [edge for _, _, edge in sorted(listed)]
    else:
        if isinstance(ranking, (str, bytes)) or not isinstance(ranking, Sequence):
            raise TypeError(f"ranking={ranking!r}: expected an EdgeResult or a list of (sender, receiver, stream), best first")
        order = [_check_edge(model, index, item) for index, item in enumerate(ranking)]
        pairs = list(dict.fromkeys((receiver, stream) for _, receiver, stream in order))
        seen = set(order)
        for receiver, stream in pairs:
            for sender in model.heads:
                edge = (sender, receiver, stream)
                if model.head_position(sender) < model.head_position(receiver) and edge not in seen:
                    order.append(edge)
                    seen.add(edge)
    if not order:
        raise ValueError("ranking has no edges: expected at least one (sender, receiver, stream)")
    universe = list(dict.fromkeys(atom for edge in order for atom in _atoms(model, edge)))
    if len(universe) != sum(len(_atoms(model, edge)) for edge in order):
        raise ValueError("ranking names an edge twice (an 'any' edge overlaps one of its streams): expected each edge once")
    return order, universe


def _check_edge(model: GnaModel, index: int, item: Any) -> Edge:
    shape_ok = isinstance(item, tuple) and len(item) == 3
    if not (shape_ok and isinstance(item[0], Head) and isinstance(item[1], Head) and isinstance(item[2], str)):
        raise TypeError(f"ranking[{index}] is {item!r}: expected (sender Head, receiver Head, stream name)")
    sender, receiver, stream = item
    model.check_head(sender)
    model.check_head(receiver)
    if stream != "any" and stream not in model.receiver_inputs(receiver):
        raise ValueError(
            f"ranking[{index}] has stream {stream!r}: receiver {receiver} has the input streams "
            f"{list(model.receiver_inputs(receiver))} (or 'any')"
        )
    if model.head_position(sender) >= model.head_position(receiver):
        raise ValueError(
            f"ranking[{index}] is {edge_name(item)}: sender {sender} does not precede receiver {receiver}, so there is no such edge"
        )
    return (sender, receiver, stream)
