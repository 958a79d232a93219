"""Views of attention patterns, for any heads of any model, that open offline.

- `attention_view`: circuitsvis patterns with token labels; ``.html`` inlines all
  JavaScript, ``_repr_html_`` shows it in notebooks, ``.save("x.html")`` writes a page.
- `heatmap_png`: a matplotlib heatmap of one head as PNG bytes.
- `circuit_view`: a discovered circuit's Gather and Aggregate heads.
- `side_by_side`: panels of several views (e.g. two models) next to each other.

circuitsvis and matplotlib are imported only when a view is rendered (the ``viz`` extra).
"""

from .heatmap import Panel, render_png
from .views import AttentionView, attention_view, circuit_view, heatmap_png, side_by_side, token_labels

__all__ = ["AttentionView", "Panel", "attention_view", "circuit_view", "heatmap_png", "render_png", "side_by_side", "token_labels"]
