"""The report's style sheet and cell format (`fmt`: floats to 3 decimals, a dash for nothing
measured); the page itself comes from the templates in ``viz/templates``."""

from __future__ import annotations

import math
import re
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

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
.headline { font-size: 1.05em; max-width: 70em; }
details { margin: 0.3em 0; } details > summary { cursor: pointer; font-size: 1.0em; padding: 2px 0; }
details[open] > summary { font-weight: bold; margin-bottom: 0.4em; }
.files { white-space: nowrap; }
"""

DASH = "\u2014"
"""What a cell with no value shows (a head with no role, a quantity not measured)."""


def slug_of(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "model"


def fmt(value: Any) -> str:
    """Floats to 3 decimals; ``None`` and NaN (a head with no role, a score not measured) to a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


@cache
def environment() -> jinja2.Environment:
    """The templates shipped in ``gna_interp/viz/templates`` (autoescaped; a missing value is an error)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gna_interp.viz", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["fmt"] = fmt
    env.tests["numeric"] = lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    env.globals["dash"] = DASH
    return env
