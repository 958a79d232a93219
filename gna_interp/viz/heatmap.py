"""`Panel`: one prompt's attention patterns for some heads; matplotlib heatmaps of panels, as PNG bytes.

Uses matplotlib's object API (``Figure`` + the Agg canvas), never ``pyplot``: no global
state is touched and no display is needed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core.errors import GnaValueError


@dataclass
class Panel:
    """One prompt's patterns for some heads of one model."""

    title: str
    tokens: list[str]
    """Labels of the prompt's real tokens (padding removed)."""
    pattern: Tensor
    """``[head, query, key]`` over those tokens, as displayed."""
    head_names: list[str]
    signed: bool
    """Whether the values keep their sign (raw implicit attention)."""

    def value_range(self) -> tuple[float, float]:
        top = float(self.pattern.abs().max()) or 1.0
        return (-top, top) if self.signed else (0.0, 1.0 if float(self.pattern.max()) <= 1.0 else top)


def render_png(panels: list[Panel], max_heads: int = 4, dpi: int = 110) -> bytes:
    """One heatmap per head (the first ``max_heads`` of each panel), side by side."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if isinstance(max_heads, bool) or not isinstance(max_heads, int) or max_heads < 1:
        raise GnaValueError(f"max_heads={max_heads!r}: expected a positive int")
    cells = [(panel, i) for panel in panels for i in range(min(max_heads, panel.pattern.shape[0]))]
    n_tokens = max(len(panel.tokens) for panel in panels)
    side = max(3.0, 0.28 * n_tokens + 1.5)
    figure = Figure(figsize=(side * len(cells), side), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    for axes, (panel, index) in zip(figure.subplots(1, len(cells), squeeze=False)[0], cells, strict=True):
        _draw(axes, panel, index, figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _draw(axes: Any, panel: Panel, index: int, figure: Any) -> None:
    values = panel.pattern[index].to(torch.float32).clone()
    values[torch.ones_like(values, dtype=torch.bool).triu(1)] = float("nan")  # causal: blank above the diagonal
    low, high = panel.value_range()
    image = axes.imshow(values.numpy(), cmap="RdBu_r" if panel.signed else "Blues", vmin=low, vmax=high)
    ticks = range(len(panel.tokens))
    axes.set_xticks(ticks, panel.tokens, rotation=90, fontsize=7)
    axes.set_yticks(ticks, panel.tokens, fontsize=7)
    axes.set_xlabel("key")
    axes.set_ylabel("query")
    axes.set_title(f"{panel.title}  {panel.head_names[index]}", fontsize=9)
    figure.colorbar(image, ax=axes, shrink=0.8)
