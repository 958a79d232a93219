"""The report's figures, as inline SVG (matplotlib's object API, no pyplot state).

Text stays text (``svg.fonttype: none``), so a page can be searched for the heads a
figure names, and figures scale to their column. Each returns an ``<svg>`` element
string, or ``None`` when there is nothing to draw.

- `role_figure`: per Aggregate head, the final row's mass on the correct option's
  segment end against another option's; per Gather head, a segment end's mass on its
  own segment against another (`discovery.picture`).
- `needs_figure`: accuracy against the heads of a role ablated together, each named.
- `scan_figure`, `head_scan_figure`: the layer scans, and single-head ablation
  accuracy per ``[layer, head]`` (integer ticks).
"""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import GnaValueError

if TYPE_CHECKING:
    from ..discovery.picture import RolePicture

CORRECT, OTHER, UNIFORM = "#2166ac", "#b8b8b8", "#222222"


class Drawing(str):
    """A figure's inline ``<svg>`` (a `str`, as the page embeds it) that can also be saved
    on its own: `save` redraws it into a PNG or SVG file, for a paper."""

    draw: Callable[[Any], None]
    size: tuple[float, float]

    def __new__(cls, svg: str, draw: Callable[[Any], None], size: tuple[float, float]) -> Drawing:
        self = super().__new__(cls, svg)
        self.draw, self.size = draw, size
        return self

    def save(self, path: str | Path, dpi: int = 200) -> Path:
        """Write the figure to ``path``: ``.png`` (at ``dpi``) or ``.svg`` (text as text)."""
        target = Path(path)
        if target.suffix.lower() not in (".png", ".svg"):
            raise GnaValueError(f"Drawing.save({str(target)!r}): expected a .png or .svg path")
        figure = _new_figure(self.draw, self.size, dpi=dpi)
        with _style():
            figure.savefig(target, format=target.suffix[1:].lower(), metadata={"Date": None} if target.suffix.lower() == ".svg" else None)
        return target


def _style() -> Any:
    import matplotlib

    return matplotlib.rc_context({"svg.fonttype": "none", "font.size": 9})


def _new_figure(draw: Callable[[Any], None], size: tuple[float, float], dpi: int = 72) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with _style():
        figure = Figure(figsize=size, dpi=dpi, layout="constrained")
        FigureCanvasAgg(figure)
        draw(figure)
    return figure


def to_svg(draw: Callable[[Any], None], size: tuple[float, float]) -> Drawing:
    """``draw(figure)`` on a new ``size`` (inches) figure, as an ``<svg>`` element whose
    width follows its container (at most the figure's own width); `Drawing.save` writes it
    on its own."""
    figure = _new_figure(draw, size)
    buffer = io.StringIO()
    with _style():
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]  # no XML prolog or doctype inside HTML
    prefix = f"f{uuid.uuid4().hex[:8]}-"  # matplotlib's ids (figure_1, axes_1...) repeat in every figure of a page
    text = re.sub(r'(\bid="|url\(#|href="#)', rf"\g<1>{prefix}", text)
    width = round(size[0] * 96)
    text = re.sub(
        r'<svg([^>]*?) width="[^"]*" height="[^"]*"',
        rf'<svg\1 class="figure" style="max-width: {width}px"',
        text,
        count=1,
    )
    return Drawing(text, draw, size)


def _bars(axes: Any, labels: Sequence[str], groups: Sequence[tuple[str, str, Sequence[float], Sequence[float] | None]]) -> None:
    """Grouped bars: per label, one bar per ``(name, colour, values, uniform)`` group;
    ``uniform`` values are drawn as a black tick across their bar."""
    width = 0.8 / len(groups)
    for g, (name, colour, values, uniform) in enumerate(groups):
        x = [i - 0.4 + width * (g + 0.5) for i in range(len(labels))]
        axes.bar(x, values, width, color=colour, label=name, edgecolor="white", linewidth=0.5)
        if uniform is not None:
            axes.plot(x, uniform, "_", color=UNIFORM, markersize=max(4.0, 60 * width), markeredgewidth=1.5)
    axes.plot([], [], "_", color=UNIFORM, markeredgewidth=1.5, label="uniform causal row")
    axes.set_xticks(range(len(labels)), labels)
    axes.set_xlim(-0.6, len(labels) - 0.4)


def role_figure(picture: RolePicture, name: Callable[[Any], str]) -> str | None:
    """One panel per role present, stacked: the averaged masses of every Aggregate and
    Gather head of ``picture``; ``name(head)`` labels a head."""
    roles = [role for role in ("aggregate", "gather") if getattr(picture, role)]
    if not roles:
        return None

    def draw(figure: Any) -> None:
        panels = figure.subplots(len(roles), 1, squeeze=False)[:, 0]
        for axes, role in zip(panels, roles, strict=True):
            (_aggregate if role == "aggregate" else _gather)(axes, picture, name)
            axes.set_ylim(0, 1.12)
            axes.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
            axes.set_ylabel("mass")
            axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)

    n_heads = max(len(picture.aggregate), len(picture.gather))
    return to_svg(draw, (min(7.0, 5.6 + 0.2 * n_heads), 2.6 * len(roles)))


def _shares(axes: Any, shares: Sequence[float]) -> None:
    for i, share in enumerate(shares):
        axes.annotate(f"{share:.0%}", (i, 1.02), ha="center", va="bottom", fontsize=7)


def _aggregate(axes: Any, picture: RolePicture, name: Callable[[Any], str]) -> None:
    items = picture.aggregate
    uniform = [m.uniform_end for m in items]
    _bars(
        axes,
        [name(m.head) for m in items],
        [
            ("correct option's end", CORRECT, [m.correct_end for m in items], uniform),
            ("another option's end", OTHER, [m.other_end for m in items], uniform),
            ("correct option, all tokens", "#92c5de", [m.correct_option for m in items], None),
            ("another option, all tokens", "#e3e3e3", [m.other_option for m in items], None),
        ],
    )
    _shares(axes, [m.end_argmax for m in items])
    axes.set_title(
        f"Aggregate heads: the final row ({picture.n_prompts} prompts; %: the top end is the correct one's)", fontsize=8, loc="left"
    )


def _gather(axes: Any, picture: RolePicture, name: Callable[[Any], str]) -> None:
    items = picture.gather
    _bars(
        axes,
        [name(m.head) for m in items],
        [
            ("own segment", CORRECT, [m.own for m in items], [m.uniform_own for m in items]),
            ("an earlier segment", OTHER, [m.other for m in items], [m.uniform_other for m in items]),
        ],
    )
    _shares(axes, [m.own_above_uniform for m in items])
    axes.set_title(
        f"Gather heads: each segment end's row ({picture.n_prompts} prompts; %: rows with their own segment above uniform)",
        fontsize=8,
        loc="left",
    )


def needs_figure(curves: Sequence[tuple[str, list[str], list[float], bool]], clean: float, chance: float, threshold: float) -> str | None:
    """Per role ``(role, head names, accuracy after each, reached)``: accuracy as the
    heads are ablated together, one more at each step, each step named by its head."""
    if not curves:
        return None

    def draw(figure: Any) -> None:
        panels = figure.subplots(1, len(curves), squeeze=False, sharey=True)[0]
        for axes, (role, names, accuracy, reached) in zip(panels, curves, strict=True):
            steps = range(len(names) + 1)
            axes.plot(steps, [clean, *accuracy], "o-", color=CORRECT)
            axes.axhline(threshold, color="#b2182b", lw=0.8, ls="--", label="collapsed below")
            axes.axhline(chance, color="gray", lw=0.8, ls=":", label="chance")
            axes.set_xticks(steps, ["none", *(f"+{n}" for n in names)], rotation=35, ha="right", fontsize=7)
            verdict = "collapses" if reached else "does not collapse"
            title = axes.set_title(f"{role}\n{len(names)} head{'s' if len(names) != 1 else ''}: {verdict}", fontsize=9)
            title.set_gid(f"needs-title-{role.split()[0]}")  # found by the report's layout test
            axes.set_ylim(0, 1.02)
        panels[0].set_ylabel("accuracy, heads ablated together")
        panels[-1].legend(fontsize=7, frameon=False)

    width = sum(max(2.8, 1.6 + 0.45 * len(c[1])) for c in curves)  # each panel wide enough for its two-line title
    return to_svg(draw, (min(7.2, max(3.2, width)), 2.9))


def scan_figure(
    truncation: list[float] | None,
    layer_scan: list[float] | None,
    clean: float,
    chance: float,
    skipped: list[list[int]] | None = None,
) -> str | None:
    """Accuracy per layer: keeping layers ``0..l``, and skipping layer ``l``. ``skipped[l]``
    (``settings["layer_scan"]["skipped"]``): the layers skipped in the forward that gave
    layer ``l``'s value; a layer cleared in a group is drawn hollow (its group's value)."""
    if truncation is None and layer_scan is None:
        return None
    grouped = [layer for layer, (first, last) in enumerate(skipped or []) if first != last]

    def draw(figure: Any) -> None:
        axes = figure.add_subplot(1, 1, 1)
        if truncation is not None:
            axes.plot(range(len(truncation)), truncation, "o-", label="keep layers 0..l")
        if layer_scan is not None:
            alone = [layer for layer in range(len(layer_scan)) if layer not in grouped]
            axes.plot(range(len(layer_scan)), layer_scan, "--", color="C1", lw=0.8)
            axes.plot(alone, [layer_scan[layer] for layer in alone], "s", color="C1", label="skip layer l")
            if grouped:
                values = [layer_scan[layer] for layer in grouped]
                axes.plot(grouped, values, "s", color="C1", mfc="none", label="cleared in a group (its value)")
        axes.axhline(clean, color="green", lw=0.8, label="clean")
        axes.axhline(chance, color="gray", lw=0.8, ls=":", label="chance")
        n_layers = len(truncation or layer_scan or [])
        axes.set_xticks(range(0, n_layers, max(1, -(-n_layers // 16))))
        axes.set_xlabel("layer")
        axes.set_ylabel("accuracy")
        axes.set_ylim(0, 1.02)
        axes.legend(fontsize=7, frameon=False)

    return to_svg(draw, (4.2, 2.7))


def head_scan_figure(head_scan: list[list[float | None]] | None) -> str | None:
    """Heatmap of single-head ablation accuracy ``[layer, head]`` (blank: not measured)."""
    if head_scan is None:
        return None
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    values = np.array([[np.nan if v is None else v for v in row] for row in head_scan], dtype=float)

    def draw(figure: Any) -> None:
        axes = figure.add_subplot(1, 1, 1)
        image = axes.imshow(values, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        for axis in (axes.xaxis, axes.yaxis):
            axis.set_major_locator(MaxNLocator(nbins=min(16, max(values.shape)), integer=True))
        axes.set_xlabel("head")
        axes.set_ylabel("layer")
        axes.set_title("accuracy with the head zero-ablated", fontsize=9)
        figure.colorbar(image, ax=axes)

    return to_svg(draw, (min(6.4, 2.6 + 0.3 * values.shape[1]), 1.3 + 0.4 * values.shape[0]))
