"""Reading MIB graph files, every entry checked (`gna_interp.scoring.mib.from_mib`).

A reader that meets a node, port or edge it does not know fails, naming the entry, the
field, and where it is in the file: it never skips one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..core.errors import GnaValueError
from .mib_graph import PORTS, Mixer, Scheme, parse_edge


class _At:
    """Where an entry is, found only when an error prints it."""

    def __init__(self, where: _Where, key: str, after: int) -> None:
        self.where, self.key, self.after = where, key, after

    def __str__(self) -> str:
        return self.where.locate(self.key, self.after)

    def __format__(self, spec: str) -> str:
        return str(self)


CFG_FIELDS = {"n_layers": int, "n_heads": int, "parallel_attn_mlp": bool, "d_model": int}


class _Where:
    """Line and column of an entry's key in the file's text (for errors)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path, self.text = path, text

    def __call__(self, key: str, after: int = 0) -> _At:
        return _At(self, key, after)

    def locate(self, key: str, after: int) -> str:
        at = self.text.find(json.dumps(key), after)
        if at < 0:
            return f"{self.path}"
        line = self.text.count("\n", 0, at) + 1
        return f"{self.path}, line {line}, column {at - (self.text.rfind(chr(10), 0, at) + 1) + 1}"

    def section(self, name: str) -> int:
        return max(self.text.find(json.dumps(name)), 0)


def read_file(path: Path, model: Scheme | None) -> tuple[Scheme, Tensor, Tensor, Tensor, Tensor | None]:
    """``(scheme, scores, in_graph, nodes_in_graph, node_scores)`` of the file at ``path``
    (shapes as `MibGraph`), checked against ``model``'s scheme when given."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise GnaValueError(f"{path}, line {error.lineno}, column {error.colno}: not JSON ({error.msg})") from None
    where = _Where(path, text)
    if not isinstance(data, dict):
        raise GnaValueError(f"{path}: expected a JSON object with 'cfg', 'nodes' and 'edges', got {type(data).__name__}")
    for key in ("cfg", "nodes", "edges"):
        if not isinstance(data.get(key), dict):
            missing = "missing" if key not in data else f"a {type(data[key]).__name__}, not an object"
            raise GnaValueError(f"{path}: {key!r} is {missing}: an MIB graph file holds 'cfg', 'nodes' and 'edges'")
    scheme = scheme_from_cfg(data["cfg"], where)
    if model is not None:
        check_against(scheme, model, where)
        scheme = model
    nodes_in, node_scores = _nodes(scheme, data["nodes"], where)
    scores, in_graph = _edges(scheme, data["edges"], where)
    return scheme, scores, in_graph, nodes_in, node_scores


def scheme_from_cfg(cfg: dict[str, Any], where: _Where) -> Scheme:
    """The graph ``cfg`` describes: MIB's Transformer, or the extension's ``layers``."""
    at = where("cfg")
    for name, kind in CFG_FIELDS.items():
        value = cfg.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)) or (isinstance(value, int) and value < 0):
            raise GnaValueError(f"{at}: cfg[{name!r}] is {value!r}: expected {'true or false' if kind is bool else 'an integer >= 0'}")
    n_layers, n_heads = cfg["n_layers"], cfg["n_heads"]
    if "layers" not in cfg:
        layers = tuple((Mixer("a", n_heads, PORTS["a"]),) for _ in range(n_layers))
        return Scheme(layers, (True,) * n_layers, cfg["parallel_attn_mlp"], cfg["d_model"], None)
    rows = cfg["layers"]
    if not isinstance(rows, list) or len(rows) != n_layers:
        raise GnaValueError(f"{at}: cfg['layers'] must list the {n_layers} layers (cfg['n_layers']), got {rows!r:.80}")
    built: list[tuple[Mixer, ...]] = []
    mlp: list[bool] = []
    for layer, row in enumerate(rows):
        try:
            mixers, offset = [], 0
            for m in row["mixers"]:
                kind, heads, ports = m["kind"], int(m["heads"]), tuple(m["ports"])
                if kind not in PORTS or not set(ports) <= set(PORTS[kind]):
                    raise ValueError(f"kind {kind!r} with ports {list(ports)}")
                mixers.append(Mixer(kind, heads, ports, int(m.get("stage", 0)), offset))
                offset += heads
            built.append(tuple(mixers))
            mlp.append(bool(row["mlp"]))
        except (KeyError, TypeError, ValueError) as error:
            raise GnaValueError(
                f"{at}: cfg['layers'][{layer}] is {row!r:.120}: expected {{'mixers': [{{'kind': 'a' or 's', 'heads': n, "
                f"'ports': [...], 'stage': s}}], 'mlp': true/false}} ({error})"
            ) from None
    return Scheme(tuple(built), tuple(mlp), cfg["parallel_attn_mlp"], cfg["d_model"], str(cfg.get("family", "")) or None)


def check_against(scheme: Scheme, model: Scheme, where: _Where) -> None:
    """The file's graph is the model's: each differing ``cfg`` field named."""
    at = where("cfg")
    ours, theirs = model.cfg(), scheme.cfg()
    for name in ("n_layers", "n_heads", "parallel_attn_mlp", "d_model", "family", "layers"):
        if ours.get(name) != theirs.get(name):
            have = "absent" if name not in theirs else f"{theirs[name]!r:.120}"
            raise GnaValueError(f"{at}: cfg[{name!r}] is {have}; the model's is {ours.get(name, 'absent')!r:.120}")


def _number(value: Any, entry: str, field: str, at: _At) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GnaValueError(f"{at}: {entry}[{field!r}] is {value!r}: expected a number")
    return float(value)


def _flag(value: Any, entry: str, at: _At) -> bool:
    if not isinstance(value, bool):
        raise GnaValueError(f"{at}: {entry}['in_graph'] is {value!r}: expected true or false")
    return value


def _nodes(scheme: Scheme, nodes: dict[str, Any], where: _Where) -> tuple[Tensor, Tensor | None]:
    names = scheme.nodes()
    index = {n: i for i, n in enumerate(names)}
    member = torch.zeros(len(names), dtype=torch.bool)
    member[-1] = True  # logits: always in the graph, as in MIB
    scores = torch.full((len(names),), math.nan, dtype=torch.float64)
    start = where.section("nodes")
    for name, info in nodes.items():
        entry, at = f"nodes[{name!r}]", where(name, start)
        if name not in index:
            raise GnaValueError(
                f"{at}: {entry}: the model's graph has no node {name!r} (its nodes: {names[0]}, {names[1]}, ..., {names[-1]})"
            )
        if not isinstance(info, dict) or "in_graph" not in info:
            raise GnaValueError(f"{at}: {entry} is {info!r:.80}: expected {{'in_graph': true/false, optionally 'score': x}}")
        if "neurons" in info or "neurons_scores" in info:
            raise GnaValueError(f"{at}: {entry} has neurons: MIB's neuron-level circuits are not read here (edges and nodes only)")
        member[index[name]] = _flag(info["in_graph"], entry, at) or name == "logits"
        if "score" in info:
            scores[index[name]] = _number(info["score"], entry, "score", at)
    return member, (None if bool(torch.isnan(scores).all()) else scores)


def _edges(scheme: Scheme, edges: dict[str, Any], where: _Where) -> tuple[Tensor, Tensor]:
    order = scheme.edges()
    index = {e: i for i, e in enumerate(order)}
    nodes = set(scheme.nodes())
    scores = torch.full((len(order),), math.nan, dtype=torch.float64)
    in_graph = torch.zeros(len(order), dtype=torch.bool)
    start = where.section("edges")
    for name, info in edges.items():
        entry, at = f"edges[{name!r}]", where(name, start)
        key = parse_edge(name)
        if key is None:
            raise GnaValueError(f"{at}: {entry}: not an edge name: expected 'parent->child' or 'parent->child<port>'")
        for end in key[:2]:
            if end not in nodes:
                raise GnaValueError(f"{at}: {entry}: the model's graph has no node {end!r}")
        if key not in index:
            raise GnaValueError(f"{at}: {entry}: {_why_not(scheme, key)}")
        if not isinstance(info, dict) or "score" not in info or "in_graph" not in info:
            raise GnaValueError(f"{at}: {entry} is {info!r:.80}: expected {{'score': x, 'in_graph': true/false}}")
        i = index[key]
        score = _number(info["score"], entry, "score", at)
        scores[i] = math.nan if info.get("scored", True) is False else score
        in_graph[i] = _flag(info["in_graph"], entry, at)
    return scores, in_graph


def _why_not(scheme: Scheme, key: tuple[str, str, str | None]) -> str:
    parent, child, port = key
    if child in ("logits",) or child.startswith("m"):
        if port is not None:
            return f"port <{port}>: {child} reads the residual stream whole (no port)"
    else:
        kind, layer = child[0], int(child[1:].split(".")[0])
        ports = next((m.ports for m in scheme.layers[layer] if m.kind == kind), ())
        if port not in ports:
            return f"port {'none' if port is None else '<' + port + '>'}: {child}'s ports are {['<' + p + '>' for p in ports]}"
    return f"{parent} does not precede {child}, so there is no such edge"
