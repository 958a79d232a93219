"""Matplotlib heatmaps of attention panels, as PNG bytes.

Uses matplotlib's object API (``Figure`` + the Agg canvas), never ``pyplot``: no global
state is touched and no display is needed.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..attention.sharpness import Normalize
from ..core.heads import Head
from .views import Panel, attention_view

if TYPE_CHECKING:
    from ..models.handle import GnaModel


def heatmap_png(
    model: GnaModel,
    inputs: Any,
    head: Head,
    row: int = 0,
    *,
    normalize: Normalize = "row",
    include_skip: bool = False,
    path: str | Path | None = None,
) -> bytes:
    """A heatmap of one head on prompt ``row`` as PNG bytes (also written to ``path``).
    Arguments as for `attention_view`."""
    if not isinstance(head, Head):
        raise TypeError(f"heatmap_png draws one head: expected a gna_interp.Head, got {head!r}")
    return attention_view(model, inputs, head, row, normalize=normalize, include_skip=include_skip).png(path)


def render_png(panels: list[Panel], max_heads: int = 4, dpi: int = 110) -> bytes:
    """One heatmap per head (the first ``max_heads`` of each panel), side by side."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if isinstance(max_heads, bool) or not isinstance(max_heads, int) or max_heads < 1:
        raise ValueError(f"max_heads={max_heads!r}: expected a positive int")
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
