"""The offline HTML report of one or more `GnaCircuit`s.

``index.html`` is one self-contained page: figures are inline SVG (their text is text:
the heads a figure names can be searched), and the circuitsvis bundle is inlined once
(`viz.views.bundle_script`), every view reusing it. Nothing is loaded from a URL. One
JSON per circuit is written beside it.

Per model, given the model and task (see `ReportLike`), the page shows the G&A picture
as the paper draws it, averaged over the task (`picture.role_picture`), next to one
prompt in circuitsvis: one the model answers correctly, whose Aggregate rows are the
closest to their task average (`picture.choose_prompt`). Heads-needed curves name each
head as it is added (`RoleNeed.curve`; where the circuit lacks it, measured by
`discovery.report_inputs.with_need_curves` on a copy: the circuit given is not changed). The
layout fits a 1,400 px window: wide tables scroll inside their own box.

The page claims no more than the evidence: a head has its role outright only with an
effect alone and a pattern clearly above chance, by thresholds the page states
(`GnaCircuit.standing`, `GnaCircuit.evidence_rule`); other heads of a role's set are
"members of the set", with what they lack. Every accuracy says where its heads were
ablated, path-patching figures carry their share of the clean - corrupt gap, and the
circuit's stability over prompt samples is shown when it was measured.

Given a `FaithfulnessCurve` per circuit (``write_report(..., faithfulness=...)``, made by
`discovery.report_inputs.circuit_faithfulness`), a model's section also shows how much of the task the circuit's
heads carry alone: accuracy with every other head ablated, against clean and every head
ablated, as a share of clean, and the curve of the top-n heads of discovery's own ranking.
Given a `RetentionCurve` per circuit (``write_report(..., retention=...)``, made by
`gna.retention_curve`), it shows the keep-only curve: the top-n heads of a ranking (e.g.
`gna.retrieval_ranking`) kept against random sets of the same size, with error bars.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import GnaTypeError, GnaValueError
from ..core.keywords import suggest_keywords
from ..discovery.estimate import passes_range
from ..discovery.evidence import POSITIONS, ROLES, Standing
from ..discovery.report_inputs import with_need_curves
from ..discovery.roles import entry_shares
from . import figures
from .mib_view import mib_section
from .report_curves import check_faithfulness, check_retention, faithfulness_html, retention_html
from .report_html import DASH, STYLE, figure_html, slug_of, table
from .summary import PARTIAL_BELOW, carries, carry_rows

if TYPE_CHECKING:
    from ..discovery.circuit import GnaCircuit
    from ..discovery.picture import RolePicture
    from ..scoring.faithfulness import FaithfulnessCurve
    from ..scoring.mib import MibGraph
    from ..scoring.retention_results import RetentionCurve

ReportLike = tuple["GnaCircuit", Any, Any]
"""``(circuit, model or None, task or None)``: patterns are drawn when both are given."""


def _check_items(items: object) -> None:
    """``items`` is a list of ``(circuit, model, task)`` triples; a bare circuit, or a
    triple of another shape, raises a `TypeError` naming it, before any folder is made."""
    from ..discovery.circuit import GnaCircuit

    expected = "expected a list of (circuit, model, task) tuples, e.g. [(circuit, model, task)] (model and task may be None)"
    if isinstance(items, GnaCircuit):
        raise GnaTypeError(f"write_report: items is one GnaCircuit ({items.model!r}): {expected}")
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise GnaTypeError(f"write_report: items={items!r} ({type(items).__name__}): {expected}")
    for index, item in enumerate(items):
        if not (isinstance(item, (tuple, list)) and len(item) == 3 and isinstance(item[0], GnaCircuit)):
            text = repr(item)
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise GnaTypeError(f"write_report: items[{index}]={shown} ({type(item).__name__}): {expected}")


def contrast_rows(circuits: list[GnaCircuit]) -> list[dict[str, Any]]:
    """Per model and role: the role's set, the heads with the role outright, heads needed to
    collapse accuracy, and the sharpness of the role's rows."""
    rows = []
    for circuit in circuits:
        for role in ROLES:
            heads = getattr(circuit, role)
            need = circuit.needs.get(role)
            scores = [circuit.evidence(h).scores for h in heads]
            entropies = [getattr(s, f"{role}_entropy") for s in scores if s is not None]
            tops = [getattr(s, f"{role}_top1") for s in scores if s is not None]
            standings = [circuit.standing(h) for h in heads]
            shown = sum(s is not None and s.shortfall == () for s in standings)
            outright = circuit.outright(role)
            named = f": {circuit.named(outright)}" if outright else ""
            rows.append(
                {
                    "model": circuit.model,
                    "mechanism": circuit.mechanism or "-",
                    "role": circuit.role_name(role),
                    "set": circuit.named(heads),
                    "role outright (effect alone, pattern)": f"{len(outright)} of {len(heads)}{named}",
                    "pattern shows the role": f"{shown} of {len(heads)}",
                    "heads needed": None if need is None else f"{len(need.heads)}: {circuit.named(need.heads)}",
                    "collapses to chance": None if need is None else ("yes" if need.reached_chance else "no"),
                    "accuracy, needed heads ablated at every position": None if need is None else need.accuracy,
                    "mean entropy (nats)": sum(entropies) / len(entropies) if entropies else None,
                    "mean top-1 mass": sum(tops) / len(tops) if tops else None,
                }
            )
    return rows


def _short(circuit: GnaCircuit, head: Any) -> str:
    """A head's label in a figure: ``L1H0``, or in a hybrid ``L1H0 attn`` / ``L1H5 ssm``."""
    return circuit.named([head]).replace(" (attention)", " attn").replace(" (ssm)", " ssm")


_ROLE_AT = {(role, positions): f"{role} ({where})" for role in ROLES for positions, where in POSITIONS.items()}


def examined_rows(circuit: GnaCircuit) -> list[dict[str, Any]]:
    """The examined-heads table: what a reader needs per head (the full evidence is in the
    JSON). A head of a role's set has the role outright only with an effect alone and a
    pattern that shows it; otherwise it is a member of the set (`GnaCircuit.standing`)."""
    clean = circuit.accuracy["clean"]
    rows = []
    for item in circuit.heads:
        standing = circuit.standing(item.head)
        role = DASH if standing is None else standing.describe() + (" (added by the joint search)" if item.joint else "")
        rows.append(
            {
                "head": str(item.head),
                "kind": item.kind or DASH,
                "role": role,
                "accuracy, ablated alone at every position": _alone(item.ablated_accuracy, item.verified),
                "effect enters at": _entry(clean, item.ablated_accuracy, item.entry),
                "pattern shows the role": _pattern(standing),
            }
        )
    return rows


def _alone(accuracy: float | None, verified: bool) -> float | str | None:
    """A head's accuracy ablated alone; for a head cleared in a group (not verified: the head
    scan's quiet heads, `head_scans.HeadScan.cleared`) its group's, said so."""
    return accuracy if verified or accuracy is None else f"{accuracy:.3f} (cleared in a group)"


def _pattern(standing: Standing | None) -> str:
    """``"yes"``, or ``"no: lift 1.115 < 1.5"``: the thresholds the pattern misses."""
    if standing is None or standing.shortfall is None:
        return DASH
    return "yes" if not standing.shortfall else "no: " + ", ".join(standing.shortfall)


def _conditions(circuit: GnaCircuit) -> list[dict[str, Any]]:
    """The accuracy table, each row with what was ablated and where."""

    def heads(n: int) -> str:
        return f"{n} head{'' if n == 1 else 's'}"

    n_gather, n_aggregate = len(circuit.gather), len(circuit.aggregate)
    every = POSITIONS["all"]
    ablated = {
        "clean": "nothing",
        "chance": "(one over the candidates)",
        "shuffled_labels": "nothing; each prompt's labels shuffled",
        "-gather": f"the Gather set ({heads(n_gather)}), {every}",
        "-aggregate": f"the Aggregate set ({heads(n_aggregate)}), {every}",
        "-both": f"both sets ({heads(n_gather + n_aggregate)}), {every}",
        "only_gna": f"every other head of their layers, {every}",
    }
    return [{"condition": k, "ablated": ablated.get(k, DASH), "accuracy": v} for k, v in circuit.accuracy.items()]


def _path_rows(path: dict[str, float]) -> list[dict[str, Any]]:
    """The path-patching table: each logit difference with its share of the clean ->
    corrupt change, ``(clean - value) / (clean - corrupt)``."""
    clean, corrupt = path["clean"], path["corrupt"]
    gap = clean - corrupt

    def share(value: float) -> float | None:
        return (clean - value) / gap if abs(gap) > 1e-9 else None

    runs = [
        ("clean prompts", clean),
        ("corrupted prompts", corrupt),
        ("clean, Gather heads corrupted, reaching the output only through the Aggregate heads", path["gather->aggregate"]),
    ]
    return [{"run": run, "logit difference": value, "share of the clean → corrupt gap": share(value)} for run, value in runs]


def _score_html(score: dict[str, Any]) -> str:
    """MIB's CPR and CMD of discovery's ranking, and f at each circuit size (`GnaCircuit.score`)."""
    rows = [
        {score["unit"] + "s kept": k, "fraction": round(x, 4), "metric m(C)": m, "faithfulness f": f}
        for k, x, m, f in zip(score["sizes"], score["fractions"], score["metric"], score["faithfulness"], strict=True)
    ]
    return (
        f'<div data-role="score"><p>MIB circuit score (Mueller et al. 2025): <b>CPR {score["cpr"]:.3f}</b> (area under f, '
        f"higher is better), <b>CMD {score['cmd']:.3f}</b> (area under |1 &minus; f|, lower is better)<br>f = (m(C) &minus; "
        f"m(&empty;)) / (m(N) &minus; m(&empty;)): the top-k of discovery's ranking (the circuit's {score['circuit_size']} "
        f"heads first) kept, every other head on the corrupted prompt; m: logit difference, {score['metric_full']:.3f} "
        f"clean, {score['metric_empty']:.3f} every head corrupted:</p>" + table(rows) + "</div>"
    )


def _stability_html(circuit: GnaCircuit) -> str:
    """How often each head was chosen on other prompt samples (when measured)."""
    stability = circuit.stability
    if stability is None:
        return ""
    frame = stability.to_frame()
    role_of = {h: role for role in ROLES for h in map(str, getattr(circuit, role))}
    rows = [
        {
            "head": row["head"],
            "set in this run": role_of.get(row["head"], DASH),
            **{f"in the {role.capitalize()} set": f"{row[role]} of {stability.k}" for role in ROLES},
        }
        for _, row in frame.iterrows()
    ]
    how = (
        f"{stability.k} bootstrap samples of the task's prompts ({stability.n_prompts[0]} each, drawn with replacement, seeds "
        f"{stability.seed}..{(stability.seed or 0) + stability.k - 1})"
        if stability.sampling == "bootstrap"
        else f"{stability.k} prompt samples given ({', '.join(map(str, stability.n_prompts))} prompts)"
    )
    sizes = "; ".join(f"{role.capitalize()} set sizes {', '.join(map(str, stability.sizes(role)))}" for role in ROLES)
    caption = (
        f'<p class="caption">Stability: discovery\'s search re-run on {html.escape(how)}: how many samples put each head in '
        f"each role's set. {html.escape(sizes)}.</p>"
    )
    return f'<div data-role="stability">{caption}{table(rows)}</div>'


def _entry(clean: float, ablated: float | None, entry: dict[str, float] | None) -> str:
    """Where a head's effect enters the residual stream, with the share of it that ablating
    the head there alone reproduces (`entry_shares`)."""
    if ablated is None or entry is None:
        return DASH
    shares = entry_shares(clean, ablated, entry)
    if shares is None:
        return "no effect"
    final, segments = shares
    if final is None:  # not measured: no label read it (`discover` measures it where one does)
        return f"segments ({segments:.0%}; final position not measured)"
    return f"final position ({final:.0%})" if final >= segments else f"segments ({segments:.0%})"


def _needs_svg(circuit: GnaCircuit) -> str | None:
    curves = [
        (_ROLE_AT[role, need.curve_positions], [_short(circuit, h) for h, _ in need.curve], [a for _, a in need.curve], need.reached_chance)
        for role, need in sorted(circuit.needs.items())
        if need.curve
    ]
    chance = circuit.accuracy["chance"]
    threshold = chance + float(circuit.settings.get("chance_margin", 0.0))
    return figures.needs_figure(curves, circuit.accuracy["clean"], chance, threshold)


def _picture_html(circuit: GnaCircuit, picture: RolePicture, model: Any, task: Any) -> str:
    """The averaged figure beside the circuitsvis view of the chosen prompt."""
    from .views import attention_view

    svg = figures.role_figure(picture, lambda head: _short(circuit, head).replace(" ", "\n"))
    left = ""
    if svg is not None:
        aggregate, gather = circuit.named(circuit.aggregate), circuit.named(circuit.gather)
        caption = (
            f"Averaged over the task's first {picture.n_prompts} prompts, aligned by its annotations (rows as "
            "distributions of |w|). <b>Aggregate</b> heads: the final row's mass on the correct option's segment end "
            "against another option's (the mean over the others), and on all of each option's tokens. <b>Gather</b> "
            "heads: each segment end's row's mass on its own segment against an earlier one (the mean over those it "
            f"sees). Black ticks: a uniform causal row. Aggregate set: {html.escape(aggregate)}. Gather set: {html.escape(gather)}."
        )
        listed = {role: " ".join(map(str, getattr(circuit, role))) for role in ("aggregate", "gather")}
        left = figure_html(svg, caption, role="picture", **listed)
    right = "<p>No prompt of those is answered correctly: no single prompt is shown.</p>"
    if picture.prompt is not None:
        row = picture.prompt
        heads = [*circuit.aggregate, *circuit.gather]
        view = attention_view(model, task, heads, row=row, title=f"{circuit.model}: prompt {row}")
        answered = int(picture.answered.sum())
        chosen = ""
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
        right = (
            f'<p class="caption">One prompt (row {row}) in circuitsvis, heads {html.escape(circuit.named(heads))}. Of the '
            f"{answered} of {picture.n_prompts} prompts the model answers correctly, it is the one whose Aggregate rows are, in "
            "total, closest to those of the others (the medoid; profiles: segment-end, then option masses, each the correct "
            "option's first, the others sorted; L1)"
            f"{chosen}.</p>" + view.fragment()
        )
    return f'<div class="pair"><div>{left}</div><div data-role="view">{right}</div></div>'


def _section(
    circuit: GnaCircuit,
    model: Any,
    task: Any,
    folder: Path,
    curve: FaithfulnessCurve | None = None,
    retention: RetentionCurve | None = None,
) -> str:
    """One circuit's section of the page (its JSON written beside it): the headline and notes,
    the tables, the curves, the averaged picture (with ``model`` and ``task``), the scans and
    the examined heads."""
    from ..discovery.picture import role_picture

    slug = slug_of(circuit.model)
    parts = [f'<section class="model" id="{slug}">', *_headline_html(circuit, curve)]
    parts.append(f'<div class="row">{"".join(_tables_html(circuit))}</div>')
    parts.append(_stability_html(circuit))
    if curve is not None:
        parts.append(faithfulness_html(circuit, curve, folder, slug))
    if retention is not None:
        parts.append(retention_html(retention, folder, slug))
    if model is not None and task is not None and (circuit.gather or circuit.aggregate):
        picture = role_picture(circuit, model, task)
        parts.append("<h3>The G&amp;A picture, averaged over the task</h3>")
        parts.append(_picture_html(circuit, picture, model, task))
    parts += _scans_html(circuit)
    parts.append("<h3>Examined heads</h3>")
    parts.append(
        f'<p class="caption">Every head discovery ablated alone or screened; its pattern scores and the rest are in {slug}.json '
        "(and <code>circuit.to_frame()</code>).</p>"
    )
    parts.append(f'<div data-role="examined">{table(examined_rows(circuit))}</div>')
    parts.append("</section>")
    (folder / f"{slug}.json").write_text(circuit.to_json() + "\n")
    return "\n".join(parts)


def _headline_html(circuit: GnaCircuit, curve: FaithfulnessCurve | None) -> list[str]:
    """The section's title, mechanism, what the circuit carries, its warnings, each spread
    role's note and the evidence rule."""
    parts = [f"<h2>{html.escape(circuit.model)} <small>({html.escape(circuit.family)}, {html.escape(circuit.task)})</small></h2>"]
    if circuit.mechanism is not None:
        parts.append(f'<p data-role="mechanism"><b>{html.escape(circuit.headline())}</b></p>')
    if curve is not None or circuit.path_patching is not None:  # how much of the task it carries (`viz.summary.carries`)
        parts.append(f'<p data-role="carries"><b>Carries: {html.escape(carries(circuit, curve))}</b></p>')
    parts += [f'<p class="note">{html.escape(w)}</p>' for w in circuit.warnings]
    parts += [
        f'<p class="note" data-role="spread">{role.capitalize()}: {html.escape(item.describe())}'
        + (f"; curve {html.escape(POSITIONS[item.best.curve_positions])}: {html.escape(item.best.describe_curve())}" if item.best else "")
        + (
            f'<br><b data-role="size">Size: {html.escape(item.describe_size(unit=circuit.unit()) or "")}</b>; size curve (k most '
            f"important {circuit.unit()} ablated, accuracy; most important: costly alone, then by the size of their "
            f"attribution): {html.escape(item.describe_curve())}"
            if item.sizes
            else ""
        )
        + "</p>"
        for role, item in sorted(circuit.spread.items())
    ]
    if circuit.gather or circuit.aggregate:
        parts.append(f'<p class="caption" data-role="evidence">Evidence: {html.escape(circuit.evidence_rule())}.</p>')
    return parts


def _tables_html(circuit: GnaCircuit) -> list[str]:
    """The section's row of tables: the conditions, the cost, path patching, the circuit
    score, and the heads-needed figure."""
    tables = [table(_conditions(circuit))]
    if circuit.cost is not None:
        tables.append(
            '<div data-role="cost"><p>What discovery ran<br>(passes: rows x blocks evaluated / (prompts x layers)):</p>'
            + table([{"quantity": k, "value": _cost_value(k, v)} for k, v in circuit.cost.items()])
            + "</div>"
        )
    if circuit.path_patching is not None:
        tables.append(
            '<div data-role="path"><p>Path patching, Gather &rarr; Aggregate, at the final position<br>(logit of the clean '
            "answer minus that of the corrupted prompt's answer;<br>share: (clean &minus; value) / (clean &minus; corrupt), "
            "0 = clean, 1 = corrupted):</p>" + table(_path_rows(circuit.path_patching)) + "</div>"
        )
    if circuit.score is not None:
        tables.append(_score_html(circuit.score))
    needs = _needs_svg(circuit)
    if needs is not None:
        named = "; ".join(f"{role}: {html.escape(circuit.named(need.heads))}" for role, need in sorted(circuit.needs.items()))
        caption = (
            f"Heads needed to collapse accuracy, each step named by the head added ({named}), ablated where each title says. "
            "The role table's accuracy ablates them all at every position."
        )
        tables.append(figure_html(needs, caption, role="needs"))
    return tables


def _scans_html(circuit: GnaCircuit) -> list[str]:
    """The truncation / layer scan and head scan figures, side by side (nothing without them)."""
    scans = [
        figures.scan_figure(
            circuit.truncation,
            circuit.layer_scan,
            circuit.accuracy["clean"],
            circuit.accuracy["chance"],
            circuit.settings.get("layer_scan", {}).get("skipped"),
        ),
        figures.head_scan_figure(circuit.head_scan),
    ]
    if not any(svg is not None for svg in scans):
        return []
    cells = "".join(f'<div style="flex: 1 1 380px">{svg}</div>' for svg in scans if svg is not None)
    return ["<h3>Scans</h3>", f'<div class="row">{cells}</div>']


@suggest_keywords
def write_report(
    items: list[ReportLike],
    directory: str | Path,
    *,
    faithfulness: dict[str, FaithfulnessCurve] | None = None,
    retention: dict[str, RetentionCurve] | None = None,
    mib: Sequence[tuple[str, MibGraph]] | None = None,
) -> Path:
    """Write ``index.html`` (offline, self-contained) and one JSON per circuit into
    ``directory``. Heads-needed curves the circuits lack are measured when the model and
    task are given, and written in the JSON (the circuits passed in are not changed).

    ``faithfulness``: per circuit's ``model`` name, a `FaithfulnessCurve` whose
    ``circuit`` is that circuit's heads (`circuit_faithfulness` makes one); its section
    then shows the circuit kept alone against clean and every head ablated, and the curve
    (with its points in ``<model>-faithfulness.csv``). Nothing is measured for it here.

    ``retention``: per circuit's ``model`` name, a `RetentionCurve` (`gna.retention_curve`);
    its section then shows the keep-only curve against random heads (points in
    ``<model>-retention.csv``).

    ``mib``: ``(name, MibGraph)`` pairs (`gna.from_mib`, `gna.mib_attribution`), drawn side by
    side as MIB's format holds them (`mib_view.mib_section`)."""
    from .views import bundle_script

    _check_items(items)
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise GnaValueError(f"report directory {str(folder)!r} is an existing file: expected a folder")
    folder.mkdir(parents=True, exist_ok=True)
    curves = check_faithfulness(faithfulness, [item[0] for item in items])
    kept = check_retention(retention, [item[0] for item in items])
    items = [(with_need_curves(circuit, model, task), model, task) for circuit, model, task in items]
    circuits = [item[0] for item in items]
    body = ["<h1>Gather-and-Aggregate report</h1>"]
    body.append("<h2>What each circuit carries</h2>")
    body.append(
        '<p class="caption">Per model: accuracy with only the circuit\'s heads kept (every other head mean-ablated), the share '
        "of the gap from every head ablated to clean that it recovers, and the share of the clean &rarr; corrupt gap that path "
        f"patching through its Gather &rarr; Aggregate edge moves. Under {PARTIAL_BELOW:g} on either, the circuit carries the "
        "task only in part (partial), with each spread role's size: the most important heads of its entry layer that carry "
        "half of that layer's effect, of the layer's heads.</p>"
    )
    body.append(f'<div data-role="carries">{table(carry_rows(circuits, curves))}</div>')
    body.append("<h2>Heads per role and sharpness</h2>")
    body.append(
        '<p class="caption">Per role, its set (the heads discovery put in it), the heads with the role outright '
        "(ablating the head alone costs accuracy and its pattern shows the role clearly above chance, by the thresholds "
        "stated in each model's section; the others are members of the set only), how many heads of the set, ablated "
        f"together, bring accuracy to chance (at most {circuits[0].settings.get('max_heads_per_role', 8)} tried), and how "
        "sharp the rows they use are (Gather: segment-end rows; Aggregate: the final row). Reported as measured.</p>"
    )
    body.append(table(contrast_rows(circuits)))
    body += [mib_section(mib)] if mib is not None else []
    body += [_section(circuit, model, task, folder, curves.get(circuit.model), kept.get(circuit.model)) for circuit, model, task in items]
    scripts = bundle_script() if any("CircuitsVis.render(" in part for part in body) else ""  # once, before every view
    page = f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>gna_interp report</title><style>{STYLE}</style>'
    page += f"{scripts}</head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    index = folder / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def _cost_value(quantity: str, value: Any) -> Any:
    """A cost table's cell: the pass estimate as a range (``24-62 (mid 39)``), the rest as recorded."""
    if quantity == "estimate" and isinstance(value, dict) and {"low", "mid", "high"} <= set(value):
        return f"{passes_range(value)} (mid {value['mid']:.0f})"
    if quantity == "size_curves" and isinstance(value, dict):  # per spread role sized: its curve's cost
        return "; ".join(f"{role}: {c['passes']:.1f} passes, {c['backwards']:.0f} backward(s)" for role, c in value.items())
    return value
