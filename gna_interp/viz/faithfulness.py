"""A faithfulness curve (`gna_interp.scoring.faithfulness.FaithfulnessCurve`) as a figure.

`faithfulness_figure` draws accuracy against the number of heads kept (every other head
ablated), with the clean and chance accuracies as lines and, when the curve has one, the
circuit's own point (its heads kept alone) marked at its size. `faithfulness_svg` is the
same figure as an inline ``<svg>`` for an HTML page (as `gna_interp.viz.figures` draws the
report's). `retention_figure` / `retention_svg` draw a keep-only `RetentionCurve`: the
ranking's top-n heads against random sets of the same size, with error bars. matplotlib's
object API, no pyplot state; matplotlib is imported when drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.errors import GnaTypeError
from .figures import to_svg

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..scoring.faithfulness import FaithfulnessCurve
    from ..scoring.retention_results import RetentionCurve

CURVE, CLEAN, CHANCE, CIRCUIT = "#2166ac", "#1a9850", "#888888", "#d73027"


def faithfulness_figure(curve: FaithfulnessCurve, *, size: tuple[float, float] = (6.0, 3.6), title: str | None = None) -> Figure:
    """Accuracy against heads kept, as a matplotlib `Figure` (``figure.savefig("x.png")``).

    Args:
        curve: from `gna.faithfulness_curve`.
        size: inches.
        title: default: the ablation and the number of prompts.
    """
    _check(curve)
    return _figure(lambda figure: draw_faithfulness(figure, curve, title=title), size)


def _figure(draw: Any, size: tuple[float, float]) -> Figure:
    """A matplotlib `Figure` of ``size`` inches, drawn by ``draw(figure)``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    draw(figure)
    return figure


def faithfulness_svg(curve: FaithfulnessCurve, *, size: tuple[float, float] = (6.0, 3.6), title: str | None = None) -> str:
    """`faithfulness_figure` as an ``<svg>`` element string (text stays text)."""
    _check(curve)
    return to_svg(lambda figure: draw_faithfulness(figure, curve, title=title), size)


def draw_faithfulness(figure: Any, curve: FaithfulnessCurve, *, title: str | None = None) -> None:
    """Draw ``curve`` on ``figure`` (one axes)."""
    axes = figure.add_subplot(1, 1, 1)
    sizes = curve.sizes.tolist()
    accuracy = curve.accuracy.tolist()
    axes.axhline(curve.clean["accuracy"], color=CLEAN, linestyle="--", linewidth=1, label=f"clean {curve.clean['accuracy']:.3f}")
    axes.axhline(curve.chance, color=CHANCE, linestyle=":", linewidth=1, label=f"chance {curve.chance:.3f}")
    unit = getattr(curve, "unit", "head")  # "edge" for an EdgeFaithfulnessCurve
    axes.plot(sizes, accuracy, color=CURVE, marker="o", markersize=3, linewidth=1.5, label=f"top-n {unit}s of the ranking kept")
    if curve.circuit_point is not None:
        n, value = len(curve.circuit), curve.circuit_point["accuracy"]
        axes.axvline(n, color=CIRCUIT, linewidth=0.8, alpha=0.4)
        label = f"circuit alone ({n} heads): {value:.3f}, {curve.of_clean(value):.0%} of clean"
        axes.plot([n], [value], color=CIRCUIT, marker="*", markersize=12, linestyle="none", label=label)
    ablated = f"every other head {curve.how}-ablated" if unit == "head" else "every other edge's corrupted sender patched in"
    axes.set_xlabel(f"{unit}s kept (of {curve.n_heads}; {ablated})")
    axes.set_ylabel("accuracy")
    axes.set_ylim(0, 1.02)
    axes.set_xlim(-0.5, curve.n_heads + 0.5)
    if curve.n_heads <= 32:
        axes.set_xticks(range(0, curve.n_heads + 1, 1 if curve.n_heads <= 16 else 2))
    axes.grid(alpha=0.25)
    axes.legend(loc="lower right", fontsize=8, frameon=False)
    axes.set_title(title if title is not None else f"Faithfulness: {curve.how} ablation, {curve.n_prompts} prompts", fontsize=10)


def _check(curve: Any) -> None:
    from ..scoring.faithfulness import FaithfulnessCurve

    if not isinstance(curve, FaithfulnessCurve):
        raise GnaTypeError(f"curve={type(curve).__name__}: expected a FaithfulnessCurve (gna.faithfulness_curve)")


RANDOM = "#8c6d31"


def retention_figure(curve: RetentionCurve, *, size: tuple[float, float] = (6.0, 3.6), title: str | None = None) -> Figure:
    """A `RetentionCurve` (`gna.retention_curve`) as a matplotlib `Figure`: accuracy against
    heads kept, the ranking's top-n against random sets (mean, error bars one standard
    deviation over the seeds), with clean and chance lines."""
    _check_retention(curve)
    return _figure(lambda figure: draw_retention(figure, curve, title=title), size)


def retention_svg(curve: RetentionCurve, *, size: tuple[float, float] = (6.0, 3.6), title: str | None = None) -> str:
    """`retention_figure` as an ``<svg>`` element string."""
    _check_retention(curve)
    return to_svg(lambda figure: draw_retention(figure, curve, title=title), size)


def draw_retention(figure: Any, curve: RetentionCurve, *, title: str | None = None) -> None:
    """Draw ``curve`` on ``figure`` (one axes)."""
    axes = figure.add_subplot(1, 1, 1)
    sizes = curve.sizes.tolist()
    axes.axhline(curve.clean, color=CLEAN, linestyle="--", linewidth=1, label=f"clean {curve.clean:.3f}")
    axes.axhline(curve.chance, color=CHANCE, linestyle=":", linewidth=1, label=f"chance {curve.chance:.3f}")
    seeds = len(curve.seeds)
    axes.errorbar(
        sizes,
        curve.random_mean.tolist(),
        yerr=curve.random_std.tolist(),
        color=RANDOM,
        marker="s",
        markersize=3,
        linewidth=1,
        capsize=2,
        label=f"random heads ({seeds} seed{'s' if seeds > 1 else ''}: mean, 1 std)",
    )
    axes.plot(sizes, curve.accuracy.tolist(), color=CURVE, marker="o", markersize=3, linewidth=1.5, label="top-n heads of the ranking")
    axes.set_xlabel(f"{curve.kind} heads kept (of {curve.n_heads}; every other one {curve.how}-ablated)")
    axes.set_ylabel("accuracy")
    axes.set_ylim(0, 1.02)
    axes.set_xlim(-0.5, curve.n_heads + 0.5)
    axes.grid(alpha=0.25)
    axes.legend(loc="best", fontsize=8, frameon=False)
    axes.set_title(title if title is not None else f"Keep-only: {curve.how} ablation, {curve.n_prompts} prompts", fontsize=10)


def _check_retention(curve: Any) -> None:
    from ..scoring.retention_results import RetentionCurve

    if not isinstance(curve, RetentionCurve):
        raise GnaTypeError(f"curve={type(curve).__name__}: expected a RetentionCurve (gna.retention_curve)")
