"""Circuits in MIB's exchange format, drawn: each graph's nodes by layer (``input`` at the
bottom, ``logits`` at the top), the circuit's edges as lines, side by side for several
models (`mib_section`; `write_report`'s ``mib=``). Rendering only: the graphs come measured
(`gna.mib_attribution`, `gna.from_mib`, `gna.to_mib`'s inputs).

Nodes: attention heads ``a{l}.h{h}`` (blue), SSM heads ``s{l}.h{h}`` (orange, this library's
extension of the scheme), MLPs ``m{l}`` (green), ``input`` and ``logits`` (black); a node of
the circuit is filled, one outside it hollow.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.errors import GnaTypeError
from .figures import to_svg
from .report_html import environment

if TYPE_CHECKING:
    from ..scoring.mib import MibGraph

KIND_COLOURS = {"a": "#2166ac", "s": "#e08214", "m": "#1b7837", "": "#222222"}
_NODE = re.compile(r"^(?:(a|s)(\d+)\.h(\d+)|m(\d+)|input|logits)$")


def node_places(graph: MibGraph) -> dict[str, tuple[float, float, str]]:
    """``{node: (x, y, kind)}``: ``y`` the node's row (``input`` -1, layer ``l``'s heads
    ``l``, its MLP ``l + 0.5``, ``logits`` ``n_layers``), ``x`` its place in the row
    (heads in order, centred); ``kind`` ``"a"``, ``"s"``, ``"m"`` or ``""``."""
    rows: dict[float, list[tuple[str, str]]] = {}
    n_layers = graph.scheme.n_layers
    for node in graph.scheme.nodes():
        match = _NODE.match(node)
        if match is None:
            raise GnaTypeError(f"node {node!r} is not in MIB's scheme (or its SSM extension)")
        if match.group(1):
            rows.setdefault(float(match.group(2)), []).append((node, match.group(1)))
        elif match.group(4) is not None:
            rows.setdefault(int(match.group(4)) + 0.5, []).append((node, "m"))
        else:
            rows.setdefault(-1.0 if node == "input" else float(n_layers), []).append((node, ""))
    places = {}
    for y, nodes in rows.items():
        for i, (node, kind) in enumerate(nodes):
            places[node] = (i - (len(nodes) - 1) / 2, y, kind)
    return places


def mib_figure(graph: MibGraph, title: str) -> str:
    """One graph as an ``<svg>`` (`figures.to_svg`): every node, the circuit's edges."""
    places = node_places(graph)
    kept = [(p, c) for (p, c, _), keep in zip(graph.scheme.edges(), graph.in_graph.tolist(), strict=True) if keep]
    in_circuit = dict(zip(graph.scheme.nodes(), graph.nodes_in_graph.tolist(), strict=True))
    width = max(abs(x) for x, _, _ in places.values()) + 1

    def draw(figure: Any) -> None:
        axes = figure.add_subplot()
        for parent, child in kept:
            (x0, y0, _), (x1, y1, _) = places[parent], places[child]
            axes.plot([x0, x1], [y0, y1], color="#555555", alpha=0.35, linewidth=0.7, zorder=1)
        for node, (x, y, kind) in places.items():
            colour = KIND_COLOURS[kind]
            axes.scatter([x], [y], s=36, color=colour if in_circuit[node] else "white", edgecolors=colour, zorder=2)
        rows = sorted({y for _, y, _ in places.values()})
        axes.set_yticks(rows, [_row_name(y, graph.scheme.n_layers) for y in rows])
        axes.set_xticks([])
        axes.set_xlim(-width, width)
        axes.set_title(f"{title}: {len(kept)} of {graph.n_edges} edges", fontsize=9)
        for side in ("top", "right", "bottom"):
            axes.spines[side].set_visible(False)

    return to_svg(draw, (max(3.0, 0.28 * 2 * width + 1.2), 0.6 * len({y for _, y, _ in places.values()}) + 1.2))


def _row_name(y: float, n_layers: int) -> str:
    if y < 0:
        return "input"
    if y >= n_layers:
        return "logits"
    return f"L{int(y)} MLP" if y % 1 else f"L{int(y)} heads"


def mib_section(graphs: Sequence[tuple[str, MibGraph]]) -> str:
    """The report's section: each ``(name, graph)``'s figure, side by side, with a legend
    (``viz/templates/mib.html.j2``)."""
    if not graphs:
        raise GnaTypeError("mib=[]: expected (name, MibGraph) pairs to draw")
    return environment().get_template("mib.html.j2").render(figures=[mib_figure(graph, name) for name, graph in graphs])
