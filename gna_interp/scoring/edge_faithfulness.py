"""`edge_faithfulness_curve`: `faithfulness_curve` over edges (sender -> receiver stream):
keep the top-n edges of a ranking, ablate every other edge into the receivers by patching
its corrupted sender into the receiver's stream, and evaluate the task."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..core.keywords import suggest_keywords
from ..models.handle import check_model
from ..patching.direct import check_mlp, mlp_layer, mlp_name, node_position
from ..patching.edge_sets import edge_set_logits
from ..patching.metrics import Metric, check_metric, logits_read, reads_position, reduce_metric
from ..patching.paths import PathKind, prepare
from ..patching.results import EdgeResult
from ..progress import progress_bar
from ..tasks.base import EncodedTask, Task
from .curve import FaithfulnessCurve, check_sizes, summary
from .evaluation import Evaluation, check_task

if TYPE_CHECKING:
    import pandas as pd

    from ..models.handle import GnaModel

Edge = tuple[Head | str, Head | str, str]
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


@suggest_keywords
def edge_faithfulness_curve(
    model: GnaModel,
    task: Task,
    ranking: EdgeResult | Sequence[Edge],
    *,
    sizes: Sequence[int] | None = None,
    corrupt: Any = None,
    metric: Metric | None = None,
    path: PathKind = "all",
    progress: bool = True,
) -> EdgeFaithfulnessCurve:
    """Keep the top-n edges of ``ranking``; every other edge into the receivers is ablated by
    patching its corrupted sender into the receiver's stream; evaluate ``task``.

    At each size, for every receiver ``r`` and stream ``st``, ``S(r, st)`` is the set of
    ablated edges' senders; the run scored is `path_patching`'s, with ``r``'s ``st`` taken
    from the D run of the senders ``S(r, st)`` (every other head frozen, MLPs and norms
    recomputed) and only the receivers' outputs changed (details:
    `gna_interp.patching.edge_sets.edge_set_logits`). Keeping every edge is the clean run;
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
        path: ``"all"`` (default: the D runs above) or ``"direct"`` (each receiver's stream
            reads the clean residual stream plus the ablated senders' own writes, as
            ``path_patching(..., path="direct")``; the definition of an
            ``edge_attribution(..., path="direct")`` ranking). ``"direct"`` also takes the
            direct graph's other ends (``"embed"`` and MLPs ``"L0MLP"`` as senders, MLPs and
            ``"logits"`` as receivers, with the stream ``"any"``); a list ranking that has
            one is completed with those writers too.
        progress: a bar over the sizes.

    Returns:
        `EdgeFaithfulnessCurve`; ``.to_frame()`` for a table.

    Cost per size: a forward of the clean batch stacked once per distinct sender set
    (D), one stacked once per receiver (its recomputed output), and the scored forward,
    per receiver position (more than one position adds one forward each); plus one clean
    and one corrupt forward for the whole curve. Forwards only, charged to any open
    `gna_interp.cost_meter`.
    """
    check_model(model, "edge_faithfulness_curve")
    check_task(task, "edge_faithfulness_curve")
    if metric is not None:
        check_metric(metric)
    order, universe = rank_edges(model, ranking)
    chosen = check_sizes(sizes, len(order), "edges")
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    if not encoded.single_token:
        raise GnaValueError("task has candidates of several tokens: edge_faithfulness_curve scores single-token candidates only")
    corrupt = task.corrupted() if corrupt is None else corrupt
    points = _edge_points(model, task, encoded, order, universe, chosen, corrupt, metric, path, progress)
    return _edge_curve(task, order, chosen, points, metric is not None)


def _edge_points(
    model: GnaModel,
    task: Task,
    encoded: EncodedTask,
    order: list[Edge],
    universe: list[Edge],
    chosen: list[int],
    corrupt: Any,
    metric: Metric | None,
    path: PathKind,
    progress: bool,
) -> dict[int, dict[str, float]]:
    """Size -> the task's summary (with ``"metric"`` when ``metric`` is given) with the top
    ``n`` edges of ``order`` kept and every other edge of ``universe`` ablated."""
    receivers = list(dict.fromkeys(receiver for _, receiver, _ in universe))
    streams = edge_streams(universe)
    senders = edge_senders(universe)

    def final_logit(logits: Tensor) -> Tensor:  # prepare's clean and corrupt runs need a metric; unread
        return logits[:, -1, 0]

    probe = metric if metric is not None else reads_position(final_logit)
    setup, _, _ = prepare(model, task, corrupt, senders, receivers, probe, streams, (), path)
    keep = 1 if metric is None else logits_read(metric)  # 0: every position (an undeclared metric)

    points: dict[int, dict[str, float]] = {}
    for n in progress_bar(chosen, show=progress, desc="edge faithfulness"):
        logits = edge_set_logits(setup, ablated_edges(model, order, universe, n), keep)
        scores = logits[:, -1].float().log_softmax(-1).cpu().gather(1, encoded.candidate_ids)
        evaluation = Evaluation(scores=scores, correct=encoded.correct.clone())
        point = summary(evaluation)
        if metric is not None:
            point["metric"] = reduce_metric(metric(logits), metric, encoded.batch.n_rows)
        points[n] = point
    return points


def _edge_curve(
    task: Task, order: list[Edge], chosen: list[int], points: dict[int, dict[str, float]], with_metric: bool
) -> EdgeFaithfulnessCurve:
    """The curve from its points (`_edge_points`)."""

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
        metric=column("metric") if with_metric else None,
        clean_metric=points[len(order)]["metric"] if with_metric else None,
    )


def ablated_edges(
    model: GnaModel, order: Sequence[Edge], universe: Sequence[Edge], n: int
) -> dict[tuple[Head | str, str], list[Head | str]]:
    """``{(receiver, stream): senders}`` of every edge of ``universe`` outside the top ``n`` of
    ``order`` (`rank_edges`): the edges ablated with ``n`` kept (`edge_set_logits`'s ``edges``)."""
    kept = {edge for item in order[:n] for edge in _atoms(model, item)}
    ablated: dict[tuple[Head | str, str], list[Head | str]] = {}
    for sender, receiver, stream in universe:
        if (sender, receiver, stream) not in kept:
            ablated.setdefault((receiver, stream), []).append(sender)
    return ablated


def edge_senders(universe: Sequence[Edge]) -> list[Head | str]:
    """The senders of ``universe``: heads in order, then the direct graph's other writers."""
    ends = {sender for sender, _, _ in universe}
    return [*sorted(e for e in ends if isinstance(e, Head)), *sorted(e for e in ends if isinstance(e, str))]


def edge_streams(universe: Sequence[Edge]) -> list[str] | str:
    """The receiver streams of ``universe`` (``"any"`` alone: MLP and logits receivers only)."""
    return [name for name in dict.fromkeys(stream for _, _, stream in universe) if name != "any"] or "any"


def is_edge_ranking(ranking: Any) -> bool:
    """An `EdgeResult`, or a list whose first item looks like ``(sender, receiver, stream)``."""
    if isinstance(ranking, EdgeResult):
        return True
    if isinstance(ranking, (str, bytes)) or not isinstance(ranking, Sequence) or not ranking:
        return False
    first = ranking[0]
    return isinstance(first, tuple) and len(first) == 3 and isinstance(first[0], (Head, str))


def _atoms(model: GnaModel, edge: Edge) -> list[Edge]:
    """``edge`` with ``"any"`` spelled out as every stream of the receiver's mixer."""
    sender, receiver, stream = edge
    if stream == "any" and isinstance(receiver, Head):  # an MLP or the logits read the residual stream whole
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
            raise GnaTypeError(f"ranking={ranking!r}: expected an EdgeResult or a list of (sender, receiver, stream), best first")
        order = [_check_edge(model, index, item) for index, item in enumerate(ranking)]
        pairs = list(dict.fromkeys((receiver, stream) for _, receiver, stream in order))
        seen = set(order)
        nodes = any(not isinstance(end, Head) for edge in order for end in edge[:2])  # the direct graph: embed and MLPs too
        writers: list[Head | str] = [*model.heads, *(direct_nodes(model) if nodes else [])]
        for receiver, stream in pairs:
            for sender in writers:
                edge = (sender, receiver, stream)
                if node_position(model, sender) < node_position(model, receiver) and edge not in seen:
                    order.append(edge)
                    seen.add(edge)
    if not order:
        raise GnaValueError("ranking has no edges: expected at least one (sender, receiver, stream)")
    universe = list(dict.fromkeys(atom for edge in order for atom in _atoms(model, edge)))
    if len(universe) != sum(len(_atoms(model, edge)) for edge in order):
        raise GnaValueError("ranking names an edge twice (an 'any' edge overlaps one of its streams): expected each edge once")
    return order, universe


def direct_nodes(model: GnaModel) -> list[str]:
    """The direct graph's writers besides heads: ``"embed"`` and every MLP."""
    return ["embed", *(mlp_name(layer) for layer in range(model.n_layers) if model.arch.mlp)]


def _check_end(model: GnaModel, node: Any, writer: bool) -> bool:
    """``node`` is a head of ``model`` or a node of the direct graph on that side (checked)."""
    if isinstance(node, Head):
        model.check_head(node)
        return True
    if mlp_layer(node) is not None:
        check_mlp(model, node)
        return True
    return node == ("embed" if writer else "logits")


def _check_edge(model: GnaModel, index: int, item: Any) -> Edge:
    shape_ok = isinstance(item, tuple) and len(item) == 3
    if not (shape_ok and _check_end(model, item[0], True) and _check_end(model, item[1], False) and isinstance(item[2], str)):
        raise GnaTypeError(
            f"ranking[{index}] is {item!r}: expected (sender Head, receiver Head, stream name); with path='direct' "
            "also 'embed' and MLPs ('L0MLP') as senders, MLPs and 'logits' as receivers"
        )
    sender, receiver, stream = item
    if not isinstance(receiver, Head):
        if stream != "any":
            raise GnaValueError(f"ranking[{index}] has stream {stream!r} into {receiver!r}: it reads the residual stream whole ('any')")
    elif stream != "any" and stream not in model.receiver_inputs(receiver):
        raise GnaValueError(
            f"ranking[{index}] has stream {stream!r}: receiver {receiver} has the input streams "
            f"{list(model.receiver_inputs(receiver))} (or 'any')"
        )
    if node_position(model, sender) >= node_position(model, receiver):
        raise GnaValueError(
            f"ranking[{index}] is {edge_name(item)}: sender {sender} does not precede receiver {receiver}, so there is no such edge"
        )
    return (sender, receiver, stream)
