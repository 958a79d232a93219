"""The offline HTML report of one or more `GnACircuit`s.

``index.html`` embeds every script (circuitsvis ``local_src``) and references only
PNGs written beside it, so the folder opens with no network. One JSON per circuit is
written too. Figures use matplotlib's object API (no pyplot global state).
"""

from __future__ import annotations

import html
import io
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .circuit import GnACircuit

ReportLike = tuple["GnACircuit", Any, Any]
"""``(circuit, model or None, task or None)``: patterns are drawn when both are given."""

_STYLE = """
body { font-family: sans-serif; max-width: 1200px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.note { color: #8a5a00; } img { max-width: 100%; }
"""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "model"


def _figure_png(draw: Any, size: tuple[float, float]) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(figure)
    draw(figure)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def scan_png(circuit: GnACircuit) -> bytes | None:
    """Truncation and leave-one-layer-out accuracy per layer, with the clean and chance lines."""
    if circuit.truncation is None and circuit.layer_scan is None:
        return None

    def draw(figure: Any) -> None:
        axes = figure.add_subplot(1, 1, 1)
        if circuit.truncation is not None:
            axes.plot(range(len(circuit.truncation)), circuit.truncation, "o-", label="keep layers 0..l")
        if circuit.layer_scan is not None:
            axes.plot(range(len(circuit.layer_scan)), circuit.layer_scan, "s--", label="skip layer l")
        axes.axhline(circuit.accuracy["clean"], color="green", lw=0.8, label="clean")
        axes.axhline(circuit.accuracy["chance"], color="gray", lw=0.8, ls=":", label="chance")
        n_layers = len(circuit.truncation or circuit.layer_scan or [])
        axes.set_xticks(range(n_layers))
        axes.set_xlabel("layer")
        axes.set_ylabel("accuracy")
        axes.set_ylim(0, 1.02)
        axes.legend(fontsize=8)

    return _figure_png(draw, (5, 3))


def head_scan_png(circuit: GnACircuit) -> bytes | None:
    """Heatmap of single-head ablation accuracy ``[layer, head]``."""
    if circuit.head_scan is None:
        return None
    import numpy as np

    values = np.array([[np.nan if v is None else v for v in row] for row in circuit.head_scan], dtype=float)

    def draw(figure: Any) -> None:
        axes = figure.add_subplot(1, 1, 1)
        image = axes.imshow(values, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        axes.set_xlabel("head")
        axes.set_ylabel("layer")
        axes.set_title("accuracy with the head zero-ablated")
        figure.colorbar(image, ax=axes)

    width = min(12.0, 3 + 0.35 * values.shape[1])
    return _figure_png(draw, (width, 1.2 + 0.45 * values.shape[0]))


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>-</p>"
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(c)))}</td>" for c in columns) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


def contrast_rows(circuits: list[GnACircuit]) -> list[dict[str, Any]]:
    """Per model and role: heads needed to collapse accuracy, and the sharpness of the role's rows."""
    rows = []
    for circuit in circuits:
        for role in ("gather", "aggregate"):
            heads = getattr(circuit, role)
            need = circuit.needs.get(role)
            scores = [circuit.evidence(h).scores for h in heads]
            key = "aggregate" if role == "aggregate" else "gather"
            entropies = [getattr(s, f"{key}_entropy") for s in scores if s is not None]
            tops = [getattr(s, f"{key}_top1") for s in scores if s is not None]
            rows.append(
                {
                    "model": circuit.model,
                    "role": role,
                    "heads": circuit.named(heads),
                    "heads needed": None if need is None else len(need.heads),
                    "collapses to chance": None if need is None else ("yes" if need.reached_chance else "no"),
                    "accuracy with them ablated": None if need is None else need.accuracy,
                    "mean entropy (nats)": sum(entropies) / len(entropies) if entropies else None,
                    "mean top-1 mass": sum(tops) / len(tops) if tops else None,
                    "pattern shows the role": f"{sum(bool(circuit.evidence(h).pattern_agrees) for h in heads)} of {len(heads)}",
                }
            )
    return rows


def curve_table(circuit: GnACircuit) -> list[dict[str, Any]]:
    """One row per head added to a role's set: role, heads ablated so far, the head's name,
    accuracy, and where the heads were ablated."""
    rows = []
    for role, need in circuit.needs.items():
        for count, (head, accuracy) in enumerate(need.curve, start=1):
            rows.append(
                {"role": role, "heads ablated": count, "head added": str(head), "accuracy": accuracy, "positions": need.curve_positions}
            )
    return rows


def _section(circuit: GnACircuit, model: Any, task: Any, folder: Path) -> str:
    slug = _slug(circuit.model)
    parts = [f"<h2>{html.escape(circuit.model)} <small>({html.escape(circuit.family)}, {html.escape(circuit.task)})</small></h2>"]
    parts += [f'<p class="note">{html.escape(w)}</p>' for w in circuit.warnings]
    parts.append(_table([{"condition": k, "accuracy": v} for k, v in circuit.accuracy.items()]))
    curve_rows = curve_table(circuit)
    if curve_rows:
        parts.append("<p>Accuracy as each role's set grows (heads ablated together, in the order added):</p>")
        parts.append(_table(curve_rows))
    if circuit.cost is not None:
        parts.append("<p>What discovery ran (passes: rows x blocks evaluated / (prompts x layers)):</p>")
        parts.append(_table([{"quantity": k, "value": v} for k, v in circuit.cost.items()]))
    if circuit.path_patching is not None:
        parts.append("<p>Path patching, Gather &rarr; Aggregate (logit of the clean answer minus the corrupted one):</p>")
        parts.append(_table([{"quantity": k, "value": v} for k, v in circuit.path_patching.items()]))
    for name, data in (("scans", scan_png(circuit)), ("heads", head_scan_png(circuit))):
        if data is not None:
            (folder / f"{slug}-{name}.png").write_bytes(data)
            parts.append(f'<img src="{slug}-{name}.png" alt="{name} of {html.escape(circuit.model)}">')
    parts.append("<h3>Examined heads</h3>")
    parts.append(_table(circuit.to_frame().to_dict(orient="records")))
    chosen = [*circuit.gather, *circuit.aggregate]
    if model is not None and task is not None and chosen:
        view = circuit.show(model, task)
        (folder / f"{slug}-patterns.png").write_bytes(view.png())
        parts.append("<h3>Patterns of the G&amp;A heads (first prompt)</h3>")
        parts.append(f'<img src="{slug}-patterns.png" alt="patterns of {html.escape(circuit.model)}">')
        parts.append(view.html)
    (folder / f"{slug}.json").write_text(circuit.to_json() + "\n")
    return "\n".join(parts)


def write_report(items: list[ReportLike], directory: str | Path) -> Path:
    """Write ``index.html`` (offline), PNGs and one JSON per circuit into ``directory``."""
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"report directory {str(folder)!r} is an existing file: expected a folder")
    folder.mkdir(parents=True, exist_ok=True)
    circuits = [item[0] for item in items]
    body = ["<h1>Gather-and-Aggregate report</h1>"]
    body.append("<h2>Heads per role and sharpness</h2>")
    body.append(
        "<p>How many heads of each role, ablated together, bring accuracy to chance (at most "
        f"{circuits[0].settings.get('max_heads_per_role', 8)} tried), and how sharp the rows they use are "
        "(Gather: segment-end rows; Aggregate: the final row). Reported as measured.</p>"
    )
    body.append(_table(contrast_rows(circuits)))
    body += [_section(circuit, model, task, folder) for circuit, model, task in items]
    page = f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>gna_interp report</title><style>{_STYLE}</style></head>'
    page += "<body>\n" + "\n".join(body) + "\n</body></html>\n"
    index = folder / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
