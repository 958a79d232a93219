"""`to_mib` and `from_mib`: circuits and edge scores in MIB's graph files.

A file is JSON: ``cfg`` (``n_layers``, ``n_heads``, ``parallel_attn_mlp``, ``d_model``),
``nodes`` (name -> ``in_graph``, optionally ``score``) and ``edges`` (name -> ``score``,
``in_graph``), with names as `gna_interp.scoring.mib_graph` gives them. A Transformer's
file is MIB's (its ``Graph.from_json`` reads it); an SSM's or a hybrid's uses this
library's extension (``s{l}.h{h}`` heads; ``cfg["family"]`` and ``cfg["layers"]``). An edge
this library did not score is written with score 0 (what MIB's reader assumes) and
``"scored": false``, an extra field MIB ignores; reading gives it back as NaN.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..patching.results import EdgeResult
from .mib_graph import Scheme, edge_name, mib_circuit, prune, scheme_of
from .mib_read import read_file

if TYPE_CHECKING:
    from ..models.handle import GnaModel

GnaEdge = tuple[Head | str, Head | str, str]


@dataclass
class MibGraph:
    """A graph in MIB's scheme with its edge scores and membership.

    Attributes:
        scheme: the nodes and edges (`gna_interp.scoring.mib_graph.Scheme`).
        scores: ``[n_edges]`` float64, in the scheme's edge order; NaN: not scored.
        in_graph: ``[n_edges]`` bool, the circuit's edges.
        nodes_in_graph: ``[n_nodes]`` bool, in ``scheme.nodes()`` order (``logits`` last).
        node_scores: ``[n_nodes]`` float64 (NaN: not scored), or None when no node has one.
    """

    scheme: Scheme
    scores: Tensor
    in_graph: Tensor
    nodes_in_graph: Tensor
    node_scores: Tensor | None = None

    @property
    def n_edges(self) -> int:
        return self.scores.numel()

    def edge_names(self) -> list[str]:
        """MIB's names, in edge order (``"input->a0.h1<q>"``)."""
        return [edge_name(*e) for e in self.scheme.edges()]

    def edges(self) -> list[GnaEdge]:
        """Every edge as this library names it: ``(sender, receiver, stream)``, ``"any"``
        where the receiver reads the stream whole (an MLP, the logits)."""
        to = self.scheme.to_gna
        return [(to(p), to(c), port or "any") for p, c, port in self.scheme.edges()]

    def circuit(self) -> list[GnaEdge]:
        """The edges in the graph (``in_graph``), in edge order."""
        return [e for e, kept in zip(self.edges(), self.in_graph.tolist(), strict=True) if kept]

    def ranking(self, absolute: bool = True) -> list[GnaEdge]:
        """Every edge, best first, as MIB's top-k takes them (`mib_graph.top_edges`)."""
        values = torch.nan_to_num(self.scores, nan=0.0)
        order = torch.sort(values.abs() if absolute else values, descending=True, stable=True).indices
        edges = self.edges()
        return [edges[i] for i in order.tolist()]

    def at_budget(self, n: int, absolute: bool = True) -> MibGraph:
        """MIB's circuit of ``n`` edges: the top ``n`` by score (``|score|`` when
        ``absolute``), pruned (`mib_graph.mib_circuit`), with its nodes."""
        keep = mib_circuit(self.scheme, self.scores, n, absolute)
        return MibGraph(self.scheme, self.scores, keep, node_membership(self.scheme, keep), self.node_scores)


def node_membership(scheme: Scheme, keep: Tensor) -> Tensor:
    """``[n_nodes]`` bool: a node is in the graph when a kept edge leaves or enters it (MIB's
    nodes of a pruned circuit); ``input`` and ``logits`` when any edge is kept, ``logits`` always."""
    names = scheme.nodes()
    index = {n: i for i, n in enumerate(names)}
    nodes = torch.zeros(len(names), dtype=torch.bool)
    for (p, c, _), kept in zip(scheme.edges(), keep.tolist(), strict=True):
        if kept:
            nodes[index[p]] = nodes[index[c]] = True
    nodes[-1] = True
    return nodes


def to_mib(result: Any, path: str | Path, *, model: GnaModel, n_edges: int | None = None, absolute: bool = True) -> MibGraph:
    """Write ``result`` as an MIB graph file.

    Args:
        result: an `EdgeResult` of `gna.edge_attribution` (or a list of them: MIB's whole
            graph takes two, heads with ``receiver_input=["q", "k", "v"]`` and the MLPs and
            ``"logits"`` with ``"any"``; head receivers need per-port scores), a
            `CircuitScore` (its ranking: score ``n - rank``; a head ranking as node scores),
            a discovered circuit (anything with ``gather`` and ``aggregate`` head lists, as
            `GnaCircuit`: its heads, ``input`` and the MLPs are the nodes, every edge between
            them the circuit, pruned), or a `MibGraph`.
        path: the ``.json`` file to write.
        model: the model the result is of (its layers name the nodes).
        n_edges: with scores, write MIB's circuit of ``n_edges`` edges as ``in_graph``
            (top by score, pruned, `MibGraph.at_budget`); default: every edge in the graph.
        absolute: rank by ``|score|`` (MIB's CMD) or by signed score (its CPR).

    Returns:
        the `MibGraph` written.

    Raises:
        GnaValueError: an edge or head the model's graph lacks, a head receiver scored with
            ``"any"`` (no port), or ``n_edges`` outside ``0..n``.
    """
    graph = as_graph(result, model)
    if n_edges is not None:
        graph = graph.at_budget(n_edges, absolute)
    write(graph, Path(path))
    return graph


def from_mib(path: str | Path, model: GnaModel | None) -> MibGraph:
    """Read an MIB graph file (MIB's, or this library's extension) for ``model``.

    Every node, edge, port, score and ``cfg`` field is checked: a node the model lacks, a
    port its receiver cannot have, an edge whose sender does not precede its receiver, a
    score that is not a number, ``cfg`` missing or disagreeing with the model raise a
    `GnaValueError` naming the entry, the field and its line and column in the file. An
    unknown node is never skipped. ``model=None``: the graph of ``cfg`` alone.
    Edges the file leaves out are unscored (NaN) and not in the graph, as MIB's reader has them.
    """
    return MibGraph(*read_file(Path(path), None if model is None else scheme_of(model)))


def as_graph(result: Any, model: GnaModel) -> MibGraph:
    """``result`` (see `to_mib`) as a `MibGraph` of ``model``'s scheme."""
    if isinstance(result, MibGraph):
        return result
    scheme = scheme_of(model)
    n_edges = len(scheme.edges())
    if isinstance(result, EdgeResult) or (isinstance(result, Sequence) and result and all(isinstance(r, EdgeResult) for r in result)):
        scores = _edge_scores(scheme, [result] if isinstance(result, EdgeResult) else list(result))
        return MibGraph(scheme, scores, torch.ones(n_edges, dtype=torch.bool), torch.ones(len(scheme.nodes()), dtype=torch.bool))
    if hasattr(result, "unit") and hasattr(result, "ranking") and hasattr(result, "cpr"):
        return _from_ranking(scheme, result.ranking, result.unit)
    if hasattr(result, "gather") and hasattr(result, "aggregate"):
        return _from_heads(scheme, [*result.gather, *result.aggregate])
    raise GnaTypeError(
        f"to_mib(result={type(result).__name__}): expected an EdgeResult (or a list of them), a CircuitScore, "
        "a discovered circuit (GnaCircuit) or a MibGraph"
    )


def _edge_scores(scheme: Scheme, results: list[EdgeResult]) -> Tensor:
    """The edges' scores (NaN where no result scores the edge) from ``results``."""
    index = {e: i for i, e in enumerate(scheme.edges())}
    scores = torch.full((len(index),), math.nan, dtype=torch.float64)
    for result in results:
        table = result.scores if result.scores.dim() == 3 else result.scores[..., None]
        for i, sender in enumerate(result.senders):
            for j, receiver in enumerate(result.receivers):
                for k, stream in enumerate(result.streams):
                    value = float(table[i, j, k])
                    if value == value:
                        scores[index[_atom(scheme, index, sender, receiver, stream)]] = value
    return scores


def _atom(scheme: Scheme, index: dict[Any, int], sender: Head | str, receiver: Head | str, stream: str) -> tuple[str, str, str | None]:
    parent, child = scheme.to_mib(sender), scheme.to_mib(receiver)
    port = None if stream == "any" else stream
    if port is None and isinstance(receiver, Head):
        raise GnaValueError(
            f"edge {sender}->{receiver} is scored with receiver_input='any': MIB's edges into a head name its port; "
            "score head receivers with receiver_input=['q', 'k', 'v'] (an SSM's ports: ['x', 'B', 'C', 'dt', 'gate'])"
        )
    edge = (parent, child, port)
    if edge not in index:
        raise GnaValueError(f"{edge_name(*edge)} is not an edge of the model's graph (MIB's scheme): the sender must precede the receiver")
    return edge


def _from_ranking(scheme: Scheme, ranking: Sequence[Any], unit: str) -> MibGraph:
    """A `CircuitScore`'s ranking: edges (or heads) scored ``n - rank``."""
    n_nodes, n_edges = len(scheme.nodes()), len(scheme.edges())
    scores = torch.full((n_edges,), math.nan, dtype=torch.float64)
    node_scores = None
    if unit == "edge":
        index = {e: i for i, e in enumerate(scheme.edges())}
        for rank, (sender, receiver, stream) in enumerate(ranking):
            ports = scheme_ports(scheme, receiver) if stream == "any" and isinstance(receiver, Head) else [stream]
            for port in ports:
                scores[index[_atom(scheme, index, sender, receiver, port)]] = float(len(ranking) - rank)
    else:
        node_scores = torch.full((n_nodes,), math.nan, dtype=torch.float64)
        where = {name: i for i, name in enumerate(scheme.nodes())}
        for rank, head in enumerate(ranking):
            node_scores[where[scheme.to_mib(head)]] = float(len(ranking) - rank)
    return MibGraph(scheme, scores, torch.ones(n_edges, dtype=torch.bool), torch.ones(n_nodes, dtype=torch.bool), node_scores)


def scheme_ports(scheme: Scheme, head: Head) -> list[str]:
    """The ports of ``head``'s node."""
    name = scheme.to_mib(head)
    kind = name[0]
    return list(next(m.ports for m in scheme.layers[head.layer] if m.kind == kind))


def _from_heads(scheme: Scheme, heads: Sequence[Head]) -> MibGraph:
    """A head set as MIB's node circuit: its heads, ``input``, the MLPs and ``logits`` the
    nodes, every edge between two of them kept, then pruned."""
    chosen = {scheme.to_mib(h) for h in heads}
    names = scheme.nodes()
    nodes = torch.tensor([n in chosen or not n.startswith(("a", "s")) for n in names])
    keep_node = dict(zip(names, nodes.tolist(), strict=True))
    edges = scheme.edges()
    keep = prune(scheme, torch.tensor([keep_node[p] and keep_node[c] for p, c, _ in edges]), edges)
    scores = torch.full((len(edges),), math.nan, dtype=torch.float64)
    return MibGraph(scheme, scores, keep, node_membership(scheme, keep) & nodes)


def write(graph: MibGraph, path: Path) -> None:
    """The JSON of ``graph`` at ``path`` (MIB's layout: ``cfg``, ``nodes``, ``edges``)."""
    nodes: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(graph.scheme.nodes()):
        nodes[name] = {"in_graph": bool(graph.nodes_in_graph[i])}
        if graph.node_scores is not None and not math.isnan(float(graph.node_scores[i])):
            nodes[name]["score"] = float(graph.node_scores[i])
    edges: dict[str, dict[str, Any]] = {}
    for name, score, kept in zip(graph.edge_names(), graph.scores.tolist(), graph.in_graph.tolist(), strict=True):
        edges[name] = {"score": 0.0, "in_graph": kept, "scored": False} if math.isnan(score) else {"score": score, "in_graph": kept}
    path.write_text(json.dumps({"cfg": graph.scheme.cfg(), "nodes": nodes, "edges": edges}))
