"""The data each model's section of the report renders (`section_context`), built from a
`ReportInputs` measured before: plain values, rows and figures for the Jinja templates
(``viz/templates``). No forward is run and nothing is written here."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..discovery.circuit import STABLE_FREQUENCY, unstable_heads
from ..discovery.evidence import POSITIONS, ROLES
from ..discovery.report_inputs import drops
from . import figures
from .faithfulness import faithfulness_svg, retention_svg
from .overview import headline, overview_figure
from .report_curves import HOW
from .report_html import DASH, slug_of
from .report_rows import _ROLE_AT, _short, conditions, cost_rows, coverage_rows, examined_rows, kinds_rows, path_rows, position_rows
from .summary import carries_words

if TYPE_CHECKING:
    from ..discovery.circuit import GnaCircuit
    from ..discovery.report_inputs import ReportInputs
    from ..scoring.faithfulness import FaithfulnessCurve
    from ..scoring.retention_results import RetentionCurve

OVERVIEW_CAPTION = (
    "Left: every head by layer and index, coloured by role (filled: the role outright, an effect alone and a pattern "
    "above chance; hatched: a member of the role's set only). Middle: accuracy as each role's needed heads are "
    "ablated together at every position, one more at each step. Right: accuracy with every head, only the circuit's "
    "heads, and none, each with its 95% Wilson interval over the prompts; the dotted line is chance."
)


def section_context(inputs: ReportInputs) -> dict[str, Any]:
    """Everything one model's section shows, by the name its template uses."""
    circuit, curve = inputs.circuit, inputs.faithfulness
    needs = needs_svg(circuit)
    named = "; ".join(f"{role}: {circuit.named(need.heads)}" for role, need in sorted(circuit.needs.items()))
    return {
        "slug": slug_of(circuit.model),
        "model": circuit.model,
        "family": circuit.family,
        "task": circuit.task,
        "headline": headline(inputs),
        "overview": overview_figure(inputs),
        "overview_caption": OVERVIEW_CAPTION,
        "mechanism": circuit.headline() if circuit.mechanism is not None else None,
        "carries": carries_words(circuit, curve),
        "warnings": list(circuit.warnings),
        "spread": spread_notes(circuit),
        "evidence": circuit.evidence_rule() if circuit.gather or circuit.aggregate else None,
        "conditions": conditions(circuit),
        "needs": needs
        and {
            "svg": needs,
            "caption": f"Heads needed to collapse accuracy, each step named by the head added ({named}), ablated where each "
            "title says. The role table's accuracy ablates them all at every position.",
        },
        "faith": faithfulness_context(circuit, curve),
        "retention": retention_context(inputs.retention),
        "path": circuit.path_patching and path_rows(circuit.path_patching),
        "score": circuit.score,
        "score_rows": score_rows(circuit.score) if circuit.score else None,
        "stability": stability_context(circuit),
        "kinds": kinds_rows(circuit),
        "positions": position_rows(circuit),
        "positions_note": None
        if circuit.positions is None
        else f"whole layer {circuit.positions.how}-ablated at each class"
        + "".join(f"; {name} = {twin}" for name, twin in circuit.positions.same.items()),
        "coverage": coverage_rows(circuit),
        "picture": picture_context(inputs),
        "scans": scans(circuit),
        "examined": examined_rows(circuit),
        "cost": cost_rows(circuit.cost) if circuit.cost and "passes" in circuit.cost else None,
        "files": {},
    }


def spread_notes(circuit: GnaCircuit) -> list[dict[str, str | None]]:
    """Each spread role's note: what it is, its best set's curve, and its size when measured."""
    notes = []
    for role, item in sorted(circuit.spread.items()):
        text = item.describe()
        if item.best:
            text += f"; curve {POSITIONS[item.best.curve_positions]}: {item.best.describe_curve()}"
        size = item.describe_size(unit=circuit.unit()) if item.sizes else None
        size_curve = (
            f"size curve (k most important {circuit.unit()} ablated, accuracy; most important: costly alone, then by the size of "
            f"their attribution): {item.describe_curve()}"
        )
        notes.append({"role": role.capitalize(), "text": text, "size": size or None, "size_curve": size_curve})
    return notes


def needs_svg(circuit: GnaCircuit) -> str | None:
    curves = [
        (_ROLE_AT[role, need.curve_positions], [_short(circuit, h) for h, _ in need.curve], [a for _, a in need.curve], need.reached_chance)
        for role, need in sorted(circuit.needs.items())
        if need.curve
    ]
    chance = circuit.accuracy["chance"]
    threshold = chance + float(circuit.settings.get("chance_margin", 0.0))
    return figures.needs_figure(curves, circuit.accuracy["clean"], chance, threshold)


def score_rows(score: dict[str, Any]) -> list[dict[str, Any]]:
    """MIB's faithfulness f at each circuit size (`GnaCircuit.score`)."""
    return [
        {score["unit"] + "s kept": k, "fraction": round(x, 4), "metric m(C)": m, "faithfulness f": f}
        for k, x, m, f in zip(score["sizes"], score["fractions"], score["metric"], score["faithfulness"], strict=True)
    ]


def stability_context(circuit: GnaCircuit) -> dict[str, Any] | None:
    """How often each head was chosen on other prompt samples (when measured)."""
    stability = circuit.stability
    if stability is None:
        return None
    role_of = {h: role for role in ROLES for h in map(str, getattr(circuit, role))}
    unstable = {str(h): f for low in unstable_heads(circuit).values() for h, f in low}
    rows = [
        {
            "head": row["head"],
            "set in this run": role_of.get(row["head"], DASH),
            **{f"in the {role.capitalize()} set": f"{row[role]} of {stability.k}" for role in ROLES},
            "marked": f"unstable: {unstable[row['head']]:.2f} < {STABLE_FREQUENCY:.2f}" if row["head"] in unstable else DASH,
        }
        for _, row in stability.to_frame().iterrows()
    ]
    how = (
        f"{stability.k} bootstrap samples of the task's prompts ({stability.n_prompts[0]} each, drawn with replacement, seeds "
        f"{stability.seed}..{(stability.seed or 0) + stability.k - 1})"
        if stability.sampling == "bootstrap"
        else f"{stability.k} prompt samples given ({', '.join(map(str, stability.n_prompts))} prompts)"
    )
    sizes = "; ".join(f"{role.capitalize()} set sizes {', '.join(map(str, stability.sizes(role)))}" for role in ROLES)
    return {"how": how, "sizes": sizes, "rows": rows, "threshold": STABLE_FREQUENCY}


def faithfulness_context(circuit: GnaCircuit, curve: FaithfulnessCurve | None) -> dict[str, Any] | None:
    """The circuit kept alone against clean and every head ablated, and the curve's figure."""
    if curve is None or curve.circuit_point is None:
        return None
    clean, floor, alone = curve.clean["accuracy"], curve.ablated["accuracy"], curve.circuit_point["accuracy"]
    n, total, share = len(curve.circuit), curve.n_heads, "share of clean accuracy"
    rows = [
        {"kept": "every head (clean)", "heads kept": total, "accuracy": clean, share: curve.of_clean(clean)},
        {"kept": f"the circuit alone: {circuit.named(curve.circuit)}", "heads kept": n, "accuracy": alone, share: curve.of_clean(alone)},
        {"kept": f"none (every head {curve.how}-ablated)", "heads kept": 0, "accuracy": floor, share: curve.of_clean(floor)},
    ]
    recovered = curve.recovered(alone)
    out = {
        "alone": alone, "clean": clean, "floor": floor, "chance": curve.chance, "how": curve.how, "n": n, "others": total - n,
        "alone_repr": repr(alone), "clean_repr": repr(clean), "floor_repr": repr(floor), "how_text": HOW.get(curve.how, curve.how),
        "n_prompts": curve.n_prompts, "alone_of_clean": curve.of_clean(alone), "recovered": None if math.isnan(recovered) else recovered,
        "rows": rows, "figure": None, "caption": None, "curve": curve,
    }  # fmt: skip
    if len(curve.sizes) > 2:
        drop = drops(circuit, curve.order)
        own = curve.order[: len(drop)] == sorted(drop, key=lambda head: -drop[head])
        ranking = (
            "discovery's own: heads by their accuracy drop when ablated alone (head scan), the heads it did not measure "
            f"last, in model order ({len(drop)} of {total} measured)"
            if own
            else "the one the curve was given: " + ", ".join(map(str, curve.order[:12])) + (", ..." if total > 12 else "")
        )
        out["caption"] = (
            f"Accuracy with the top-n heads kept and every other head {curve.how}-ablated, "
            f"n = {', '.join(map(str, curve.sizes.tolist()))}. The ranking is {ranking}; the star is the circuit's heads kept "
            f"alone. Every point is in {slug_of(circuit.model)}-faithfulness.csv."
        )
        out["figure"] = faithfulness_svg(curve)
    return out


def retention_context(curve: RetentionCurve | None) -> dict[str, Any] | None:
    """The keep-only curve: the ranking's top-n heads kept against random sets, and its table."""
    if curve is None:
        return None
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
    caption = "Ranking: " + ", ".join(map(str, curve.order[:12])) + (", ..." if curve.n_heads > 12 else "")
    return {
        "clean": curve.clean, "ablated": curve.ablated, "chance": curve.chance, "how": curve.how, "kind": curve.kind,
        "clean_repr": repr(curve.clean), "ablated_repr": repr(curve.ablated), "how_text": HOW.get(curve.how, curve.how),
        "n_heads": curve.n_heads, "n_prompts": curve.n_prompts, "seeds": list(curve.seeds), "rows": rows,
        "figure": retention_svg(curve), "caption": caption, "curve": curve,
    }  # fmt: skip


def scans(circuit: GnaCircuit) -> list[dict[str, Any]]:
    """The truncation / layer scan and head scan figures (none without them)."""
    layer = figures.scan_figure(
        circuit.truncation,
        circuit.layer_scan,
        circuit.accuracy["clean"],
        circuit.accuracy["chance"],
        circuit.settings.get("layer_scan", {}).get("skipped"),
    )
    head = figures.head_scan_figure(circuit.head_scan)
    return [
        {"name": name, "svg": svg, "caption": caption}
        for name, svg, caption in (
            ("layer-scan", layer, "Accuracy keeping layers 0..l, and skipping layer l."),
            ("head-scan", head, "Accuracy with each head zero-ablated alone."),
        )
        if svg is not None
    ]


def picture_context(inputs: ReportInputs) -> dict[str, Any] | None:
    """The averaged figure beside the circuitsvis view of the chosen prompt (both measured)."""
    from .views import prompt_view_html

    circuit, picture, view = inputs.circuit, inputs.picture, inputs.view
    if picture is None:
        return None
    svg = figures.role_figure(picture, lambda head: _short(circuit, head).replace(" ", "\n"))
    aggregate, gather = circuit.named(circuit.aggregate), circuit.named(circuit.gather)
    caption = (
        f"Averaged over the task's first {picture.n_prompts} prompts, aligned by its annotations (rows as distributions of |w|). Aggregate "
        "heads: the final row's mass on the correct option's segment end against another option's (the mean over the others), "
        "and on all of each option's tokens. Gather heads: each segment end's row's mass on its own segment against an "
        f"earlier one (the mean over those it sees). Black ticks: a uniform causal row. Aggregate set: {aggregate}. Gather set: {gather}."
    )
    out = {
        "figure": svg, "caption": caption, "view": None, "n_prompts": picture.n_prompts,
        "aggregate": " ".join(map(str, circuit.aggregate)), "gather": " ".join(map(str, circuit.gather)),
    }  # fmt: skip
    if view is None:
        return out
    row, chosen = view.row, ""
    if circuit.aggregate:
        m, mean = picture.masses, picture.aggregate[0]
        correct = int(m.correct[row])
        ends, options = m.final_on_ends[row, 0], m.final_on_options[row, 0]  # [segment]
        other_end = max(float(v) for j, v in enumerate(ends) if j != correct)
        chosen = (
            f": {circuit.aggregate[0]}'s final row puts {float(ends[correct]):.2f} on the correct option's end (task mean "
            f"{mean.correct_end:.2f}), at most {other_end:.2f} on another's (task mean per option {mean.other_end:.2f}), and "
            f"{float(options[correct]):.2f} on all of the correct option's tokens (task mean {mean.correct_option:.2f})"
        )
    fragment = prompt_view_html(view, f"{circuit.model}: prompt {row}").fragment()
    out |= {
        "view": fragment,
        "row": row,
        "heads": circuit.named(view.heads),
        "answered": int(picture.answered.sum()),
        "chosen": chosen,
    }
    return out
