"""The HTML pieces of the report (`viz.report`): its style sheet, tables (numbers
right-aligned, floats to 3 decimals, a dash for nothing measured) and figures."""

from __future__ import annotations

import html
import math
import re
from typing import Any

STYLE = """
body { font-family: sans-serif; max-width: 1320px; margin: 1.5em auto; padding: 0 16px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f3f3f3; } td.num { text-align: right; }
section.model { border-top: 2px solid #888; margin-top: 2em; }
.note { color: #8a5a00; } .caption { font-size: 0.85em; color: #444; max-width: 60em; }
.scroll { overflow-x: auto; max-width: 100%; }
.row { display: flex; flex-wrap: wrap; gap: 16px 32px; align-items: flex-start; }
.row > * { min-width: 0; max-width: 100%; }
.pair { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 24px; align-items: start; }
.pair > div { min-width: 0; overflow-x: auto; }
svg.figure { width: 100%; height: auto; display: block; }
figure { margin: 0 0 1em; } figcaption { font-size: 0.85em; color: #444; }
"""

DASH = "\u2014"
"""What a cell with no value shows (a head with no role, a quantity not measured)."""


def slug_of(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "model"


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"<p>{DASH}</p>"
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(row.get(c)) for c in columns) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def cell(value: Any) -> str:
    """A table cell; numbers right-aligned, text left."""
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f'<td class="num">{html.escape(fmt(value))}</td>' if numeric else f"<td>{html.escape(fmt(value))}</td>"


def fmt(value: Any) -> str:
    """Floats to 3 decimals; ``None`` and NaN (a head with no role, a score not measured) to a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def figure_html(svg: str, caption: str, **data: str) -> str:
    attributes = "".join(f' data-{key}="{html.escape(value)}"' for key, value in data.items())
    return f"<figure{attributes}>{svg}<figcaption>{caption}</figcaption></figure>"
