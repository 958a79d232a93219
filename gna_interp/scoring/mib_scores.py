"""MIB's edge-budget scores: `circuit_score(..., unit="edge")`, and `mib_attribution`
(`edge_attribution` over MIB's whole graph, as one `MibGraph`).

MIB's definition (its ``evaluate_area_under_curve``, level ``"edge"``): for each budget
``p`` of `MIB_FRACTIONS` the circuit is ``Graph.apply_topn(int(p * n_edges), absolute)``
then ``Graph.prune()``: the top edges by score (``|score|`` with ``absolute``; MIB's table
takes CPR from signed scores and CMD from absolute ones), ties by edge number, then every
edge whose sender has no kept edge in or whose receiver has no kept edge out dropped, to a
fixed point. ``n_edges`` counts every edge of the graph. ``f = (m(C) - m(∅)) / (m(N) - m(∅))``
with ``m(N)`` the clean model and ``m(∅)`` no edge kept; CPR is the trapezoid area of ``f``
over the nominal ``p`` (no point at 0), CMD that of ``|1 - f|``.

What an ablated edge does is this library's (`edge_set_logits`): ``path="direct"`` on the
direct graph (MIB's nodes: ``input``, heads, MLPs, ``logits``), each receiver's input the
clean stream plus its ablated senders' corrupt-minus-clean writes; ``path="all"`` on the
heads' graph (the edges scored: head -> head port), the senders' changes
carried through every MLP and norm. MIB's own ``evaluate_graph`` chains the circuit (a kept
edge carries its sender's output in the patched run), which neither does: ``path="mib"``
is that evaluation (`gna_interp.scoring.mib_eval`; Llama-shaped Transformers), on the
direct graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..patching.edge_sets import edge_set_logits
from ..patching.edges import edge_attribution
from ..patching.metrics import Metric, logits_read, reduce_metric
from ..patching.paths import PathKind, prepare
from ..progress import progress_bar
from .edge_faithfulness import edge_senders, edge_streams
from .mib import MibGraph, as_graph
from .mib_eval import mib_metric
from .mib_graph import prune, scheme_of, top_edges

if TYPE_CHECKING:
    from ..models.handle import GnaModel


def mib_attribution(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    *,
    path: PathKind | Literal["mib"] = "direct",
    progress: bool = True,
    **options: Any,
) -> MibGraph:
    """`edge_attribution` of every edge of ``model``'s MIB graph, as one `MibGraph`.

    ``path="direct"`` (or ``"mib"``, which ranks the same graph): ``input``, heads and MLPs
    into every head port, MLP and ``logits`` (two calls: head receivers by port, the MLPs and
    logits whole); ``path="all"``: heads into head ports (edge attribution's ``"all"`` has no
    logits receiver). ``options`` go to `edge_attribution` (``method``, ``steps``, ``batch_size``).
    """
    scheme = scheme_of(model)
    ports = [p for p in ("q", "k", "v", "x", "B", "C", "dt", "gate") if any(p in model.receiver_inputs(h) for h in model.heads)]
    direct = path in ("direct", "mib")
    mlps = [f"L{layer}MLP" for layer in range(model.n_layers)] if direct and model.arch.mlp else []
    writers: list[Head | str] = ["embed", *model.heads, *mlps] if direct else list(model.heads)
    first = min(model.head_position(h) for h in model.heads)
    last = max(model.head_position(h) for h in model.heads)
    to_heads = [w for w in writers if scheme.position(scheme.to_mib(w)) < last]
    late = list(model.heads) if direct else [h for h in model.heads if model.head_position(h) > first]
    run = dict(path="direct" if direct else path, progress=progress, **options)
    results = [edge_attribution(model, clean, corrupt, metric, senders=to_heads, receivers=late, receiver_input=ports, **run)]  # type: ignore[arg-type]
    if direct:  # path="all" has no logits receiver: its graph is the heads'
        results.append(edge_attribution(model, clean, corrupt, metric, senders=writers, receivers=[*mlps, "logits"], **run))  # type: ignore[arg-type]
    return as_graph(results, model)


def mib_edge_points(
    model: GnaModel, clean: Any, corrupt: Any, metric: Metric, ranking: Any, path: Any, absolute: bool, requested: Any, progress: bool
) -> tuple[list[Any], list[float], float, float, list[int], int]:
    """MIB's edge budgets (module docs): ``(ranking, m(C) per budget, m(N), m(∅), edges
    kept per budget after the prune, prompts)``; `circuit_score` makes the `CircuitScore`."""
    graph = as_graph(ranking, model)
    edges = graph.edges()
    scored = ~torch.isnan(graph.scores)
    universe = scored if path == "all" else torch.ones_like(scored)
    if path == "all" and any(isinstance(s, str) or not isinstance(r, Head) for s, r, _ in (edges[i] for i in _where(scored))):
        raise GnaValueError(
            "path='all' (circuit_score's default) scores edges between heads, and this ranking scores input, MLP or logits "
            "edges: pass path='direct' (or 'mib') for MIB's whole graph, or rank with mib_attribution(..., path='all')"
        )
    members = _where(universe)
    if not members:
        raise GnaValueError("the ranking scores no edge: expected scores for the graph's edges (mib_attribution, edge_attribution)")
    scores = torch.where(universe, graph.scores, torch.nan)
    circuits = [prune(graph.scheme, top_edges(scores, int(p * len(members)), absolute) & universe, None, universe) for p in requested]
    chosen = [edges[i] for i in members]
    members_set = set(chosen)
    order = [e for e in graph.ranking(absolute) if e in members_set]
    if path == "mib":
        full, values = mib_metric(model, clean, corrupt, metric, graph.scheme, [torch.zeros_like(universe), *circuits])
        return order, values[1:], full, values[0], [int(c.sum()) for c in circuits], model.to_batch(clean).n_rows
    senders, receivers = edge_senders(chosen), list(dict.fromkeys(r for _, r, _ in chosen))
    setup, full, _ = prepare(model, clean, corrupt, senders, receivers, metric, edge_streams(chosen), (), path)
    keep = logits_read(metric)

    def measure(kept: torch.Tensor) -> float:
        ablated: dict[Any, list[Any]] = {}
        for i in members:
            if not kept[i]:
                sender, receiver, stream = edges[i]
                ablated.setdefault((receiver, stream), []).append(sender)
        return reduce_metric(metric(edge_set_logits(setup, ablated, keep)), metric, setup.batch.n_rows)

    empty = measure(torch.zeros_like(universe))
    values = [measure(c) for c in progress_bar(circuits, show=progress, desc="MIB edge budgets")]
    return order, values, full, empty, [int(c.sum()) for c in circuits], setup.batch.n_rows


def _where(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()
