"""Attention views that open offline: circuitsvis HTML with its JavaScript inlined.

circuitsvis's string form (``str(html)``, and ``_repr_html_`` whenever it finds the
internet) loads its JavaScript from a CDN; its ``local_src`` inlines the whole bundle
(about 1.3 MB) into every call, and opens its element with ``<div .../>``, which HTML
does not close (what follows lands inside it). Views here inline the bundle once
(`bundle_script`, a classic script defining the global ``CircuitsVis``) and give each
panel a closed element and a short render call, so a saved file or a notebook cell
renders with no network. A page with many views (the report) puts `bundle_script` once
and each view's `AttentionView.fragment` after it.

A view is a list of panels (one prompt of one model, one or more heads); `side_by_side`
puts panels of different models next to each other (e.g. a Transformer's Aggregate head
beside an SSM's).
"""

from __future__ import annotations

import html as html_lib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..attention.pattern import attention_pattern
from ..attention.sharpness import Normalize
from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..core.inputs import Batch
from ..core.keywords import renamed
from ..discovery.report_inputs import PromptView, token_labels
from .heatmap import Panel, render_png

if TYPE_CHECKING:
    from ..discovery.circuit import GnaCircuit
    from ..models.handle import GnaModel


@dataclass
class AttentionView:
    """Panels of attention patterns: ``.html`` (self-contained), ``_repr_html_`` for
    notebooks, ``.png()`` for a matplotlib heatmap, ``.save(path)`` for either."""

    panels: list[Panel]
    _html: str | None = field(default=None, repr=False)

    @property
    def html(self) -> str:
        """An HTML fragment with every script inlined (no external URL): the circuitsvis
        bundle once, then `fragment`."""
        if self._html is None:
            self._html = bundle_script() + "\n" + self.fragment()
        return self._html

    def fragment(self) -> str:
        """The panels' elements and render calls without the bundle: for a page that
        already holds `bundle_script` before this point."""
        return _render(self.panels)

    def _repr_html_(self) -> str:
        return self.html

    def document(self, title: str = "gna_interp attention") -> str:
        """A full HTML page around `html`."""
        head = f'<meta charset="utf-8"><title>{html_lib.escape(title)}</title>'
        return f"<!DOCTYPE html>\n<html><head>{head}</head><body>\n{self.html}\n</body></html>\n"

    def png(self, path: str | Path | None = None, max_heads: int = 4) -> bytes:
        """Heatmaps (up to ``max_heads`` per panel) as PNG bytes; also written to ``path`` if given."""
        data = render_png(self.panels, max_heads)
        if path is not None:
            Path(path).write_bytes(data)
        return data

    def save(self, path: str | Path) -> Path:
        """``.png``: heatmaps; anything else: the offline HTML page."""
        target = Path(path)
        if target.suffix.lower() == ".png":
            self.png(target)
        else:
            target.write_text(self.document(), encoding="utf-8")
        return target


def prompt_view_html(view: PromptView, title: str) -> AttentionView:
    """A `PromptView` measured before (`discovery.report_inputs.prompt_view`) as an
    `AttentionView`: no forward is run."""
    names = [str(h) for h in view.heads]
    return AttentionView([Panel(title, view.tokens, view.pattern, names, bool((view.pattern < 0).any()))])


@renamed(inputs="clean")
def attention_view(
    model: GnaModel,
    clean: Any,
    heads: Head | Iterable[Head],
    row: int = 0,
    *,
    normalize: Normalize = "row",
    include_skip: bool = False,
    title: str | None = None,
) -> AttentionView:
    """Attention patterns of ``heads`` on prompt ``row`` of ``clean``, any kind of head.

    Args:
        model: as for `gna_interp.attention_pattern`.
        clean: the prompts, as for `gna_interp.attention_pattern`.
        heads: as for `gna_interp.attention_pattern`.
        include_skip: as for `gna_interp.attention_pattern`.
        row: which prompt of the batch to show (its padding is dropped).
        normalize: ``"row"`` (default: ``|w|`` as a distribution over keys, on a 0..1
            scale shared by softmax and SSM heads), ``"abs"``, or ``None`` (raw signed
            values, drawn with a diverging scale).
        title: panel title; default: the model's name.
    """
    batch = model.to_batch(clean)
    if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < batch.n_rows:
        raise GnaValueError(f"row={row!r} out of range: the inputs have prompts 0..{batch.n_rows - 1}")
    start = int(batch.attention_mask[row].argmax())  # first real token (left padding)
    one = Batch(batch.input_ids[row : row + 1, start:], batch.attention_mask[row : row + 1, start:])
    head_list = [heads] if isinstance(heads, Head) else list(heads)
    pattern = attention_pattern(model, one, head_list, include_skip=include_skip, normalize=normalize)[0].cpu()
    signed = normalize is None and bool((pattern < 0).any())
    return AttentionView([Panel(title or model.name, token_labels(model, one.input_ids[0]), pattern, [str(h) for h in head_list], signed)])


def side_by_side(*views: AttentionView) -> AttentionView:
    """One view with the panels of ``views`` next to each other (e.g. two models)."""
    if len(views) < 2 or not all(isinstance(v, AttentionView) for v in views):
        raise GnaValueError(f"side_by_side needs at least two AttentionView values, got {[type(v).__name__ for v in views]}")
    return AttentionView([panel for view in views for panel in view.panels])


@cache
def bundle_script() -> str:
    """``<script>`` with circuitsvis's whole JavaScript bundle (about 1.3 MB), defining the
    global ``CircuitsVis`` that every view's render calls use: once per page."""
    from importlib.resources import files

    source = files("circuitsvis").joinpath("dist", "cdn", "iife.js").read_text(encoding="utf-8")
    return "<script>\n" + source.replace("</script>", "<\\/script>") + "\n</script>"


def _render(panels: list[Panel]) -> str:
    from circuitsvis.utils.convert_props import convert_props

    blocks = []
    for panel in panels:
        low, high = panel.value_range()
        props = convert_props(
            {
                "attention": panel.pattern.to(torch.float32),
                "tokens": panel.tokens,
                "attentionHeadNames": panel.head_names,
                "minValue": low,
                "maxValue": high,
                "maskUpperTri": True,
            }
        ).replace("<", "\\u003c")  # JSON still; a token such as "</s>" cannot close the script
        element = f"circuits-vis-{uuid.uuid4().hex[:13]}"
        title = f'<h4 style="font-family: sans-serif; margin: 4px 0;">{html_lib.escape(panel.title)}</h4>'
        call = f'<script>CircuitsVis.render("{element}", CircuitsVis.AttentionHeads, {props})</script>'
        blocks.append(f'<div style="flex: 1 1 420px; min-width: 0;">{title}<div id="{element}" style="margin: 15px 0;"></div>{call}</div>')
    return (
        '<div class="gna-attention" style="display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start;">'
        + "".join(blocks)
        + "</div>"
    )


@renamed(inputs="clean")
def heatmap_png(
    model: GnaModel,
    clean: Any,
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
        raise GnaTypeError(f"heatmap_png draws one head: expected a gna_interp.Head, got {head!r}")
    return attention_view(model, clean, head, row, normalize=normalize, include_skip=include_skip).png(path)


@renamed(inputs="clean")
def circuit_view(circuit: GnaCircuit, model: GnaModel, clean: Any, row: int = 0) -> AttentionView:
    """The circuitsvis view (offline) of a circuit's Gather and Aggregate heads on prompt ``row``."""
    heads = [*circuit.gather, *circuit.aggregate]
    if not heads:
        raise GnaValueError("the circuit has no Gather or Aggregate head to show")
    return attention_view(model, clean, heads, row=row, title=f"{circuit.model}: G&A heads")
