"""MIB's computation graph (Mueller et al. 2025, circuit-localisation track), and this
library's extension of it to SSM and hybrid layers.

MIB's scheme (its ``eap.graph.Graph.from_model``): the nodes are ``input``, one node per
attention head ``a{layer}.h{head}``, one per MLP ``m{layer}`` and ``logits``. A node sends
to every node after it: a head reads the residual stream through three ports (``<q>``,
``<k>``, ``<v>``), an MLP and the logits read it whole. With attention and MLP in sequence
an MLP reads its own layer's heads; with ``parallel_attn_mlp`` it does not. GPT-2's shape
(12 layers of 12 heads) has 158 nodes and 32,491 edges.

The extension (this library's, not MIB's): an SSM head is ``s{layer}.h{head}`` (``head``
counted within its mixer, from 0, as attention heads are), with the ports path patching
isolates: ``<x>``, ``<B>``, ``<C>``, ``<dt>`` and, where the family has one, ``<gate>``. A
hybrid layer holds both kinds; a mixer that runs after another in the same layer (Zamba2's
Mamba-2 after its shared attention) reads it. A pure SSM has no ``m{layer}``.

Edges are numbered as MIB's tensors are: senders (``input``, then per layer its heads and
its MLP) by MIB's forward index, receivers (per layer: per mixer, per port, per head; then
the MLP; ``logits`` last) by its backward index; an edge's number is its place in the
sender-major, receiver-minor order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.arch import LayerKind
from ..core.errors import GnaValueError
from ..core.heads import Head
from ..patching.direct import EMBED, LOGITS, mlp_layer, mlp_name

if TYPE_CHECKING:
    from ..models.handle import GnaModel

PORTS = {"a": ("q", "k", "v"), "s": ("x", "B", "C", "dt", "gate")}
"""Each head kind's ports, in the order receivers are numbered."""
MLP_STAGE = 9
_NODE = re.compile(r"^(?:input|logits|m(\d+)|([as])(\d+)\.h(\d+))$")
_EDGE = re.compile(r"^([^<>]+?)->([^<>]+?)(?:<([A-Za-z]+)>)?$")


@dataclass(frozen=True)
class Mixer:
    """One mixer of a layer: ``kind`` ``"a"`` (attention) or ``"s"`` (SSM), its heads, the
    ports they read, its stage in the layer and its first head's number in the layer's
    `Head` numbering."""

    kind: str
    n_heads: int
    ports: tuple[str, ...]
    stage: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Scheme:
    """A model's graph in MIB's scheme: per layer its mixers and whether it has an MLP.

    Attributes:
        layers: per layer, its mixers (`Mixer`) in head-numbering order.
        mlp: per layer, whether an ``m{layer}`` node exists.
        parallel: MIB's ``parallel_attn_mlp`` (the MLP reads only earlier layers).
        d_model: the residual width.
        family: ``None`` for a Transformer MIB's scheme describes as it is; else the
            architecture family (the extension's ``cfg["family"]``).
    """

    layers: tuple[tuple[Mixer, ...], ...]
    mlp: tuple[bool, ...]
    parallel: bool
    d_model: int
    family: str | None = None

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    # ----- nodes ------------------------------------------------------------
    def senders(self) -> list[str]:
        """Every node that writes (MIB's forward order): ``input``, per layer heads then MLP."""
        names = ["input"]
        for layer, mixers in enumerate(self.layers):
            names += [f"{m.kind}{layer}.h{h}" for m in mixers for h in range(m.n_heads)]
            names += [f"m{layer}"] if self.mlp[layer] else []
        return names

    def nodes(self) -> list[str]:
        """Every node, as MIB's ``nodes`` dict lists them: the senders, then ``logits``."""
        return [*self.senders(), "logits"]

    def receivers(self) -> list[tuple[str, str | None]]:
        """``(node, port)`` in MIB's backward order (``port`` None: the node reads the stream whole)."""
        items: list[tuple[str, str | None]] = []
        for layer, mixers in enumerate(self.layers):
            for m in mixers:
                items += [(f"{m.kind}{layer}.h{h}", p) for p in m.ports for h in range(m.n_heads)]
            items += [(f"m{layer}", None)] if self.mlp[layer] else []
        return [*items, ("logits", None)]

    def position(self, node: str) -> tuple[int, int]:
        """Where ``node`` sits in the dataflow: a node sends to every node at a later position."""
        match = _NODE.match(node)
        if match is None:
            raise GnaValueError(f"{node!r} is not a node of MIB's scheme: expected input, a{{l}}.h{{h}}, s{{l}}.h{{h}}, m{{l}} or logits")
        if node == "input":
            return (-1, 0)
        if node == "logits":
            return (self.n_layers, 0)
        if match.group(1) is not None:
            layer = int(match.group(1))
            return (layer, min(m.stage for m in self.layers[layer]) if self.parallel else MLP_STAGE)
        layer, kind = int(match.group(3)), match.group(2)
        return (layer, next(m.stage for m in self.layers[layer] if m.kind == kind))

    def edges(self) -> list[tuple[str, str, str | None]]:
        """Every edge ``(parent, child, port)``, numbered sender-major as MIB's score matrix."""
        senders = [(name, self.position(name)) for name in self.senders()]
        receivers = [(node, port, self.position(node)) for node, port in self.receivers()]
        return [(s, r, port) for s, at in senders for r, port, to in receivers if at < to]

    # ----- between the two namings --------------------------------------------
    def to_gna(self, node: str, model: GnaModel | None = None) -> Head | str:
        """MIB's node name -> this library's: `Head`, ``"embed"``, ``"L0MLP"`` or ``"logits"``."""
        if node == "input":
            return EMBED
        if node == "logits":
            return LOGITS
        match = _NODE.match(node)
        assert match is not None
        if match.group(1) is not None:
            return mlp_name(int(match.group(1)))
        layer, kind, head = int(match.group(3)), match.group(2), int(match.group(4))
        return Head(layer, next(m.offset for m in self.layers[layer] if m.kind == kind) + head)

    def to_mib(self, node: Head | str) -> str:
        """This library's node -> MIB's name (``Head(1, 0)`` -> ``"a1.h0"`` or ``"s1.h0"``)."""
        if node == EMBED:
            return "input"
        if node == LOGITS:
            return "logits"
        if isinstance(node, Head):
            if node.layer < self.n_layers:
                for m in self.layers[node.layer]:
                    if m.offset <= node.head < m.offset + m.n_heads:
                        return f"{m.kind}{node.layer}.h{node.head - m.offset}"
            raise GnaValueError(f"{node} is not a head of this graph ({self.n_layers} layers, heads per layer {self.heads_per_layer()})")
        layer = mlp_layer(node)
        if layer is None or layer >= self.n_layers or not self.mlp[layer]:
            raise GnaValueError(f"{node!r} is not a node of this graph: expected a Head, 'embed', 'logits' or an MLP 'L{{l}}MLP'")
        return f"m{layer}"

    def heads_per_layer(self) -> list[int]:
        return [sum(m.n_heads for m in mixers) for mixers in self.layers]

    # ----- cfg -----------------------------------------------------------------
    def cfg(self) -> dict[str, Any]:
        """MIB's ``cfg``; the extension adds ``family`` and per layer its ``mixers`` and ``mlp``."""
        heads = {m.n_heads for mixers in self.layers for m in mixers} or {0}
        cfg: dict[str, Any] = {
            "n_layers": self.n_layers,
            "n_heads": max(heads),
            "parallel_attn_mlp": self.parallel,
            "d_model": self.d_model,
        }
        if self.family is not None:
            cfg["family"] = self.family
            cfg["layers"] = [
                {"mixers": [{"kind": m.kind, "heads": m.n_heads, "ports": list(m.ports), "stage": m.stage} for m in mixers], "mlp": mlp}
                for mixers, mlp in zip(self.layers, self.mlp, strict=True)
            ]
        return cfg


def edge_name(parent: str, child: str, port: str | None) -> str:
    """MIB's edge name: ``"a0.h1->m2"``, ``"input->a1.h0<q>"``."""
    return f"{parent}->{child}" if port is None else f"{parent}->{child}<{port}>"


def parse_edge(name: str) -> tuple[str, str, str | None] | None:
    """``"input->a1.h0<q>"`` -> ``("input", "a1.h0", "q")``; None when it is not of that form."""
    match = _EDGE.match(name)
    return None if match is None else (match.group(1), match.group(2), match.group(3))


def scheme_of(model: GnaModel) -> Scheme:
    """``model``'s graph: MIB's own scheme for a Transformer with an MLP in every layer,
    the extension (with ``family``) for anything else."""
    layers = []
    for spec in model.layout.layer_specs:
        mixers = []
        for mixer in spec.mixers:
            kind = "a" if mixer.kind is LayerKind.ATTENTION else "s"
            ports = tuple(p for p in PORTS[kind] if p in mixer.receiver_inputs)
            mixers.append(Mixer(kind, mixer.n_heads, ports, mixer.spec.stage, mixer.offset))
        layers.append(tuple(mixers))
    mlp = tuple(bool(model.arch.mlp) for _ in layers)
    transformer = all(len(m) == 1 and m[0].kind == "a" and m[0].ports == PORTS["a"] for m in layers) and all(mlp)
    transformer = transformer and len({m[0].n_heads for m in layers}) <= 1
    return Scheme(tuple(layers), mlp, False, model.layout.d_model, None if transformer else model.arch.family)


def top_edges(scores: Tensor, n: int, absolute: bool = True) -> Tensor:
    """MIB's ``Graph.apply_topn(n, absolute, level="edge")`` before its prune: the ``n``
    edges of largest score (``|score|`` when ``absolute``), ties by edge number (MIB's
    ``torch.argsort`` leaves ties unordered). ``scores`` ``[n_edges]``; NaN counts as 0
    (MIB's reader leaves an unscored edge at 0). Returns ``[n_edges]`` bool."""
    if not 0 <= n <= scores.numel():
        raise GnaValueError(f"n={n}: expected 0..{scores.numel()} edges")
    values = torch.nan_to_num(scores.double(), nan=0.0)
    values = values.abs() if absolute else values
    order = torch.sort(values, descending=True, stable=True).indices
    keep = torch.zeros(scores.numel(), dtype=torch.bool)
    keep[order[:n]] = True
    return keep


def prune(scheme: Scheme, keep: Tensor, edges: list[tuple[str, str, str | None]] | None = None, universe: Tensor | None = None) -> Tensor:
    """MIB's ``Graph.prune``: until nothing changes, a node stays only with a kept edge out
    and a kept edge in (``input`` needs none in), and an edge only between staying nodes
    (``logits`` always stays). ``keep`` ``[n_edges]`` bool -> the pruned ``[n_edges]`` bool.
    ``universe`` ``[n_edges]`` bool (default: every edge): the edges that can be kept; a node
    with none of them in (out) needs no kept edge in (out), as ``input`` (``logits``)."""
    edges = scheme.edges() if edges is None else edges
    index = {name: i for i, name in enumerate(scheme.senders())}
    logits = len(index)
    parent = torch.tensor([index[p] for p, _, _ in edges], dtype=torch.long)
    child = torch.tensor([index.get(c, logits) for _, c, _ in edges], dtype=torch.long)
    universe = torch.ones_like(keep) if universe is None else universe
    fed = ~torch.zeros(logits + 1, dtype=torch.bool).index_fill_(0, child[universe], True)
    sink = ~torch.zeros(logits + 1, dtype=torch.bool).index_fill_(0, parent[universe], True)
    fed[0] = sink[logits] = True
    keep = keep.clone()
    while True:
        out = sink.clone().index_fill_(0, parent[keep], True)
        into = fed.clone().index_fill_(0, child[keep], True)
        stays = out & into
        pruned = keep & stays[parent] & stays[child]
        if torch.equal(pruned, keep):
            return keep
        keep = pruned


def mib_circuit(scheme: Scheme, scores: Tensor, n: int, absolute: bool = True) -> Tensor:
    """The circuit MIB evaluates at ``n`` edges: `top_edges`, then `prune` (``[n_edges]`` bool)."""
    return prune(scheme, top_edges(scores, n, absolute))
