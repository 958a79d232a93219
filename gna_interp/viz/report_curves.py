"""The report's curve sections (`viz.report`): the circuit kept alone with its faithfulness
curve (`faithfulness_html`), the keep-only curve against random heads (`retention_html`), and
the checks of ``write_report``'s ``faithfulness`` and ``retention`` arguments. They render
curves measured elsewhere (`discovery.report_inputs.circuit_faithfulness`,
`gna.retention_curve`); nothing is measured here."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import GnaTypeError, GnaValueError
from ..discovery.report_inputs import circuit_heads, drops
from .report_html import figure_html, table

if TYPE_CHECKING:
    from ..discovery.circuit import GnaCircuit
    from ..scoring.faithfulness import FaithfulnessCurve
    from ..scoring.retention_results import RetentionCurve


HOW = {
    "mean": "each ablated head's output replaced by its mean over every token of the reference prompts, the task's own by default",
    "resample": "each ablated head's output taken from the corrupted prompts, the options rotated, by default",
    "zero": "each ablated head's output set to zero",
}


def faithfulness_html(circuit: GnaCircuit, curve: FaithfulnessCurve, folder: Path, slug: str) -> str:
    """The circuit kept alone against clean and every head ablated, and the curve."""
    from .faithfulness import faithfulness_svg

    point = curve.circuit_point
    assert point is not None  # checked by write_report
    clean, floor, alone = curve.clean["accuracy"], curve.ablated["accuracy"], point["accuracy"]
    n, total = len(curve.circuit), curve.n_heads
    share = "share of clean accuracy"
    rows = [
        {"kept": "every head (clean)", "heads kept": total, "accuracy": clean, share: curve.of_clean(clean)},
        {"kept": f"the circuit alone: {circuit.named(curve.circuit)}", "heads kept": n, "accuracy": alone, share: curve.of_clean(alone)},
        {"kept": f"none (every head {curve.how}-ablated)", "heads kept": 0, "accuracy": floor, share: curve.of_clean(floor)},
    ]
    recovered = curve.recovered(alone)
    recovered_text = "" if math.isnan(recovered) else f"; it recovers {recovered:.0%} of the way from every head ablated to clean"
    lead = (
        f'<p class="caption" data-role="faithfulness-lead">Keeping only the circuit\'s {n} heads and {curve.how}-ablating the other '
        f"{total - n} ({HOW.get(curve.how, curve.how)}), accuracy on the task's {curve.n_prompts} prompts is "
        f"<b>{alone:.3f}, {curve.of_clean(alone):.0%} of clean</b> ({clean:.3f}); with every head ablated it is {floor:.3f} "
        f"(chance {curve.chance:.3f}){recovered_text}.</p>"
    )
    parts = [f'<div style="flex: 1 1 420px">{lead}{table(rows)}</div>']
    if len(curve.sizes) > 2:
        drop = drops(circuit, curve.order)
        own = curve.order[: len(drop)] == sorted(drop, key=lambda head: -drop[head])
        ranking = (
            "discovery's own: heads by their accuracy drop when ablated alone (head scan), the heads it did not measure "
            f"last, in model order ({len(drop)} of {total} measured)"
            if own
            else "the one the curve was given: " + ", ".join(map(str, curve.order[:12])) + (", ..." if total > 12 else "")
        )
        caption = (
            f"Accuracy with the top-n heads kept and every other head {curve.how}-ablated, "
            f"n = {', '.join(map(str, curve.sizes.tolist()))}. "
            f"The ranking is {ranking}; the star is the circuit's heads kept alone. Every point is in {slug}-faithfulness.csv."
        )
        figure = figure_html(faithfulness_svg(curve), html.escape(caption), role="faithfulness-curve")
        parts.append(f'<div style="flex: 1 1 480px; max-width: 720px">{figure}</div>')
        curve.to_frame().to_csv(folder / f"{slug}-faithfulness.csv", index=False)
    data = f'data-circuit="{alone!r}" data-clean="{clean!r}" data-ablated="{floor!r}" data-how="{html.escape(curve.how)}"'
    title = "<h3>Faithfulness: how much of the task does the circuit alone carry?</h3>"
    return f'<div data-role="faithfulness" {data}>{title}<div class="row">{"".join(parts)}</div></div>'


def retention_html(curve: RetentionCurve, folder: Path, slug: str) -> str:
    """The keep-only curve: the ranking's top-n heads kept against random sets, and its table."""
    from .faithfulness import retention_svg

    frame = curve.to_frame()
    rows = [
        {
            "heads kept": int(row["size"]),
            "ranking's top-n": row["accuracy"],
            "random (mean)": row["random_mean"],
            "random (std)": row["random_std"],
            "top-n share of clean": row["of_clean"],
        }
        for _, row in frame.iterrows()
    ]
    lead = (
        f'<p class="caption" data-role="retention-lead">Keeping only n of the {curve.n_heads} {curve.kind} heads and '
        f"{curve.how}-ablating the others ({HOW.get(curve.how, curve.how)}), on the task's {curve.n_prompts} prompts: the "
        f"ranking's top-n heads against {len(curve.seeds)} random orders of the same heads (seeds "
        f"{', '.join(map(str, curve.seeds))}). Clean {curve.clean:.3f}, none kept {curve.ablated:.3f}, chance {curve.chance:.3f}. "
        f"Every point is in {slug}-retention.csv.</p>"
    )
    caption = "Ranking: " + ", ".join(map(str, curve.order[:12])) + (", ..." if curve.n_heads > 12 else "")
    figure = figure_html(retention_svg(curve), html.escape(caption), role="retention-curve")
    frame.to_csv(folder / f"{slug}-retention.csv", index=False)
    data = f'data-clean="{curve.clean!r}" data-ablated="{curve.ablated!r}" data-how="{html.escape(curve.how)}"'
    title = "<h3>Keep-only: how much do the top-ranked heads carry, against random ones?</h3>"
    body = f'<div style="flex: 1 1 420px">{lead}{table(rows)}</div><div style="flex: 1 1 480px; max-width: 720px">{figure}</div>'
    return f'<div data-role="retention" {data}>{title}<div class="row">{body}</div></div>'


def check_faithfulness(faithfulness: Any, circuits: list[GnaCircuit]) -> dict[str, FaithfulnessCurve]:
    """``write_report``'s ``faithfulness``: model names of ``circuits`` to curves of their heads."""
    from ..scoring.faithfulness import FaithfulnessCurve

    if faithfulness is None:
        return {}
    if not isinstance(faithfulness, dict):
        raise GnaTypeError(f"faithfulness={type(faithfulness).__name__}: expected a dict of circuit.model -> FaithfulnessCurve")
    by_name = {circuit.model: circuit for circuit in circuits}
    for name, curve in faithfulness.items():
        if name not in by_name:
            raise KeyError(f"faithfulness[{name!r}]: no circuit of the report has that model; expected one of {sorted(by_name)}")
        if not isinstance(curve, FaithfulnessCurve):
            raise GnaTypeError(f"faithfulness[{name!r}] is {type(curve).__name__}: expected a FaithfulnessCurve (circuit_faithfulness)")
        heads = circuit_heads(by_name[name])
        if curve.circuit_point is None or set(curve.circuit) != set(heads):
            given = ", ".join(map(str, curve.circuit)) or "none"
            raise GnaValueError(
                f"faithfulness[{name!r}] has circuit heads {given}: expected the circuit's own, "
                f"{', '.join(map(str, heads))} (faithfulness_curve(..., circuit=...); circuit_faithfulness does it)"
            )
    return dict(faithfulness)


def check_retention(retention: Any, circuits: list[GnaCircuit]) -> dict[str, RetentionCurve]:
    """``write_report``'s ``retention``: model names of ``circuits`` to keep-only curves."""
    from ..scoring.retention_results import RetentionCurve

    if retention is None:
        return {}
    if not isinstance(retention, dict):
        raise GnaTypeError(f"retention={type(retention).__name__}: expected a dict of circuit.model -> RetentionCurve")
    names = sorted(circuit.model for circuit in circuits)
    for name, curve in retention.items():
        if name not in names:
            raise KeyError(f"retention[{name!r}]: no circuit of the report has that model; expected one of {names}")
        if not isinstance(curve, RetentionCurve):
            raise GnaTypeError(f"retention[{name!r}] is {type(curve).__name__}: expected a RetentionCurve (gna.retention_curve)")
    return dict(retention)
