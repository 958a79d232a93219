"""The demo's summary table (`summary_table`): one row per circuit, led by how much of the
task the circuit carries (`carries`: whole, partial with each spread role's size, or undetermined)."""

from __future__ import annotations

from typing import Any

from ..scoring.carries import CARRIES_SHARE, carries_from_curve, percent
from ..scoring.verdicts import LEVEL

SUMMARY_WIDTH = 120
"""The demo's summary table fits this many columns (head lists wrap inside their cells)."""
CARRIES_WIDTH = 12
"""The demo table's ``carries`` column wraps its words at this width."""
HEADS_SHOWN = 3
"""A head list longer than `HEADS_SHOWN` + 1 shows in the demo table as its count and its first
`HEADS_SHOWN` heads (``"33: L0H70,L0H4,L0H6,…"``); the full list is in the JSON and the report."""


def carried_share(circuit: Any, curve: Any) -> float | None:
    """``(alone - every head ablated) / (clean - every head ablated)``: how much of the task the
    circuit's heads carry kept alone (``None``: no curve, or no circuit point)."""
    if curve is None or curve.circuit_point is None:
        return None
    value = curve.recovered(curve.circuit_point["accuracy"])
    return None if value != value else float(value)


def carries(circuit: Any, curve: Any) -> str:
    """The demo table's verdict (`scoring.carries.carries_from_curve`: the circuit kept alone
    against `CARRIES_SHARE` of the gap from every head ablated to clean, tested): ``"whole"``,
    ``"partial"`` with the size of each spread role whose curve was measured (``"partial:
    Aggregate spread, 5/128 for half"``), or ``"undetermined (N prompts settle)"``; ``"-"``
    without a curve or when there is nothing to carry."""
    verdict = None if circuit.mechanism == "none" else carries_from_curve(curve)
    if verdict is None:
        return "-"
    if verdict.word == "undetermined":
        return "undetermined" + (f" ({verdict.prompts_to_settle} prompts settle)" if verdict.prompts_to_settle else "")
    if verdict.word == "whole":
        return "whole"
    sized = [
        f"{role.capitalize()} spread, {item.heads_for(0.5)}/{item.width} for half"
        for role, item in sorted(getattr(circuit, "spread", {}).items())
        if item.sizes
    ]
    return "partial" + (": " + "; ".join(sized) if sized else "")


def carries_words(circuit: Any, curve: Any) -> str | None:
    """The carries verdict in words with its numbers (`carries_from_curve`'s text); ``None``
    without a curve or when there is nothing to carry."""
    verdict = None if circuit.mechanism == "none" else carries_from_curve(curve)
    return None if verdict is None else verdict.text


def compact_heads(names: list[str], shown: int = HEADS_SHOWN) -> str:
    """``names`` joined by commas, or when more than ``shown + 1`` their count and the first ``shown``."""
    if len(names) <= shown + 1:
        return ",".join(names) or "-"
    return f"{len(names)}: " + ",".join(names[:shown]) + ",…"


_COLUMNS = (
    "model",
    "alone",
    "share",
    "path",
    "carries",
    "mechanism",
    "clean",
    "-gather",
    "-aggr",
    "-both",
    "shuffled",
    "gather",
    "aggregate",
)
"""The summary table's column names."""
_ALIGNED = ["<", ">", ">", ">", "<", "<", ">", ">", ">", ">", ">", "<", "<"]
_VERDICT = 4
"""The `carries` column: its words wrap."""


def summary_table(circuits: list[Any], curves: dict[str, Any] | None = None, width: int = SUMMARY_WIDTH) -> str:
    """One row per circuit, fitting ``width`` columns: first how much of the task the circuit
    carries (``alone``: accuracy with only its heads kept, every other head mean-ablated, and
    ``share``, the gap from every head ablated to clean it recovers, from ``curves``: the
    model's faithfulness curve; ``path``: path patching's share of the clean -> corrupt gap;
    ``carries``: the tested verdict, `carries`), then the mechanism and the confirmation
    accuracies, then its heads per role, wrapped inside their cells. In models with both
    kinds of heads, each head is tagged ``(a)`` attention or ``(s)`` SSM."""
    rows = [_summary_row(c, (curves or {}).get(c.model)) for c in circuits]
    widths = _column_widths(rows, width)
    header = _lines_of(_COLUMNS, widths)[0]
    lines = [header, "-" * len(header), *(line for r in rows for line in _lines_of(r, widths))]
    return "\n".join([*lines, *_legend(rows)])


_MECHANISM_WORDS = ("g&a", "partly", "counting", "undetermined", "none")
"""The ``mechanism`` cell's words (`stream_widths` fits the longest)."""


def stream_widths(models: list[str], width: int = SUMMARY_WIDTH) -> list[int]:
    """Column widths fixed before any row is known, for a table printed a row at a time
    (`summary_header`, `summary_row_lines`, `summary_legend`): each figure's widest form,
    ``carries`` at `CARRIES_WIDTH`, the two head lists sharing the rest of ``width`` evenly."""
    room = "x" * width  # head cells as wide as the table: the two lists split what is left
    mechanism = max(_MECHANISM_WORDS, key=len)
    template = (max(models, key=len, default="model"), "0.000", "100%", "0.00", "x" * CARRIES_WIDTH, mechanism, *["0.000"] * 5, room, room)
    return _column_widths([template], width)


def summary_header(widths: list[int]) -> list[str]:
    """The table's header line and its rule, at ``widths`` (`stream_widths`)."""
    header = _lines_of(_COLUMNS, widths)[0]
    return [header, "-" * len(header)]


def summary_row_lines(circuit: Any, curve: Any, widths: list[int]) -> list[str]:
    """One circuit's row (``curve``: its faithfulness curve, or None) at ``widths``, wrapped as in `summary_table`."""
    return _lines_of(_summary_row(circuit, curve), widths)


def summary_legend(circuits: list[Any], curves: dict[str, Any] | None = None) -> list[str]:
    """The lines under the table of ``circuits`` (what its columns, tags and mechanisms mean)."""
    return _legend([_summary_row(c, (curves or {}).get(c.model)) for c in circuits])


def _summary_row(c: Any, curve: Any) -> tuple[str, ...]:
    """One circuit's cells (``curve``: its model's faithfulness curve, or None)."""

    def heads(role: str) -> str:
        return compact_heads([c.named([h]).replace(" (attention)", "(a)").replace(" (ssm)", "(s)") for h in getattr(c, role)])

    def cell(key: str) -> str:
        return f"{c.accuracy[key]:.3f}" if key in c.accuracy else "-"

    share = carried_share(c, curve)
    alone = "-" if curve is None or curve.circuit_point is None else f"{curve.circuit_point['accuracy']:.3f}"
    path = (getattr(c, "path_patching", None) or {}).get("fraction_of_effect")
    carried = (alone, percent(share), "-" if path is None or path != path else f"{path:.2f}", carries(c, curve))
    accuracies = (cell(k) for k in ("clean", "-gather", "-aggregate", "-both", "shuffled_labels"))
    return (c.model, *carried, c.mechanism or "-", *accuracies, heads("gather"), heads("aggregate"))


def _column_widths(rows: list[tuple[str, ...]], width: int) -> list[int]:
    """Each column's width: the widest cell (``carries`` at most `CARRIES_WIDTH`), the two head
    lists sharing what is left of ``width``."""
    table = [_COLUMNS, *rows]
    verdict_width = min(max(len(str(r[_VERDICT])) for r in table), CARRIES_WIDTH)
    fixed = [verdict_width if i == _VERDICT else max(len(str(r[i])) for r in table) for i in range(len(_COLUMNS) - 2)]
    room = max(width - sum(fixed) - (len(_COLUMNS) - 1), 2 * len("aggregate"))  # what the two head lists share (1-space gaps)
    full = [max(len(str(r[i])) for r in table) for i in (-2, -1)]
    gather_width = min(full[0], max(len("gather"), room - min(full[1], room // 2)))
    return [*fixed, gather_width, max(len("aggregate"), min(full[1], room - gather_width))]


def _wrap(text: str, cell_width: int, by: str = ",") -> list[str]:
    """``text``'s ``by``-separated items (heads, or words) packed into lines of at most ``cell_width``."""
    if len(text) <= cell_width:
        return [text]
    glue = "," if by == "," else " "
    out = [""]
    for item in text.split(by):
        joined = f"{out[-1]}{glue}{item}" if out[-1] else item
        if len(joined) < cell_width + (glue == " ") or not out[-1]:  # a comma ending a wrapped line needs room
            out[-1] = joined
        else:
            out[-1] += "," if glue == "," else ""
            out.append(item)
    return out


def _lines_of(row: tuple[str, ...], widths: list[int]) -> list[str]:
    """A row's text lines, its ``carries`` words and head lists wrapped inside their cells."""
    cells = [_wrap(str(v), widths[i], " ") if i == _VERDICT else [str(v)] for i, v in enumerate(row[:-2])]
    cells += [_wrap(v, w) for v, w in zip(row[-2:], widths[-2:], strict=True)]
    depth = max(len(c) for c in cells)
    out = []
    for k in range(depth):
        values = [c[k] if k < len(c) else "" for c in cells]
        out.append(" ".join(f"{v:{a}{w}}" for v, a, w in zip(values, _ALIGNED, widths, strict=True)).rstrip())
    return out


def _legend(rows: list[tuple[str, ...]]) -> list[str]:
    """The lines under the table: what its columns mean, and the tags and mechanisms it shows."""
    lines = []
    if any("(a)" in r[-2] + r[-1] or "(s)" in r[-2] + r[-1] for r in rows):
        lines.append("(a) attention head, (s) SSM head")
    lines.append("alone: accuracy with only the circuit's heads kept (every other head mean-ablated); share: of the gap from")
    lines.append("  every head ablated to clean; path: Gather -> Aggregate path patching's share of the clean -> corrupt gap")
    lines.append(f"carries: alone against {CARRIES_SHARE:.0%} of the gap from every head ablated to clean, tested ({LEVEL:.0%} interval):")
    lines.append("  whole above, partial below (with each spread role's size: the most important heads of its entry layer that")
    lines.append("  carry half of that layer's effect, of the layer's heads), undetermined with the prompts that would settle it")
    if any(r[-2].split(":")[0].isdigit() or r[-1].split(":")[0].isdigit() for r in rows):
        lines.append(f"gather, aggregate: a long list as its count and its first {HEADS_SHOWN} heads (every head: the JSON and the report)")
    if any(r[5] == "counting" for r in rows):
        lines.append("mechanism counting: answers by the option's place; its gather/aggregate cells hold counting heads")
    if any(r[5] == "partly" for r in rows):
        lines.append("mechanism partly: with the labels shuffled, accuracy above chance but below clean (a 90% interval each)")
    if any(r[5] == "undetermined" for r in rows):
        lines.append("mechanism undetermined: the label check's interval straddles a line (its note says how many prompts settle it)")
    if any(r[5] == "none" for r in rows):
        lines.append("mechanism none: clean accuracy near chance, no retrieval to explain (no heads searched)")
    if any(r[10] != "-" for r in rows):
        lines.append("shuffled: clean accuracy with each prompt's labels in a random order (chance: answers by the option's place)")
    lines.append("-gather, -aggr, -both: accuracy with every head of the set(s) ablated at every position")
    return lines


def carry_rows(circuits: list[Any], curves: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The report's first table: per circuit, how much of the task it carries (the demo
    table's first columns: ``alone``, ``share``, ``path``, ``carries``) and its mechanism."""
    rows = []
    for c in circuits:
        curve = (curves or {}).get(c.model)
        share = carried_share(c, curve)
        path = (getattr(c, "path_patching", None) or {}).get("fraction_of_effect")
        rows.append(
            {
                "model": c.model,
                "alone (only its heads kept)": None if curve is None or curve.circuit_point is None else curve.circuit_point["accuracy"],
                "share of the gap from every head ablated to clean": share,
                "path patching's share of the clean → corrupt gap": None if path is None or path != path else path,
                "carries": carries(c, curve),
                "mechanism": c.mechanism or "-",
            }
        )
    return rows
