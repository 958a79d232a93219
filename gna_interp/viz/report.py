"""The offline HTML report of one or more circuits: it renders, and measures nothing.

``write_report(items, folder)`` takes one `ReportInputs` per circuit (every forward already
run by `discovery.report_inputs.measure_report`: the heads-needed curves, the circuit kept
alone, the averaged G&A picture and one prompt's patterns). A ``(circuit, model, task)``
triple is measured by `measure_report` first, before any rendering (faithfulness included,
so no column is blank); ``(circuit, None, None)`` is drawn from the circuit alone.

The page (Jinja2 templates in ``viz/templates``) leads each model with one figure
(`overview.overview_figure`: its heads by layer and index coloured by role, the collapse
curves, and the circuit kept alone with 95% intervals) and one sentence of what was
measured (`overview.headline`); everything else is folded (``<details>``) under a
plain-words title. ``index.html`` is self-contained: figures are inline SVG whose text stays
text, and the circuitsvis bundle is inlined once. One JSON per circuit is written beside it,
and with ``figures=("png", "svg")`` every figure is also saved alone under ``figures/``.

The page claims no more than the evidence: a head has its role outright only with an effect
alone and a pattern clearly above chance, by thresholds the page states
(`GnaCircuit.standing`, `GnaCircuit.evidence_rule`); other heads of a role's set are
"members of the set", with what they lack.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import GnaTypeError, GnaValueError
from ..core.keywords import suggest_keywords
from ..discovery.report_inputs import ReportInputs, measure_report
from ..scoring.carries import CARRIES_SHARE
from .mib_view import mib_section
from .report_context import section_context
from .report_curves import check_faithfulness, check_retention
from .report_html import STYLE, environment
from .report_rows import contrast_rows, examined_rows
from .summary import carry_rows

if TYPE_CHECKING:
    from ..discovery.circuit import GnaCircuit
    from ..scoring.faithfulness import FaithfulnessCurve
    from ..scoring.mib import MibGraph
    from ..scoring.retention_results import RetentionCurve

__all__ = ["ReportInputs", "ReportLike", "contrast_rows", "examined_rows", "save_figures", "write_report"]

ReportLike = tuple["GnaCircuit", Any, Any]
"""``(circuit, model or None, task or None)``: measured by `measure_report` when both are given."""

FIGURES = ("overview", "needs", "faithfulness", "retention", "picture", "layer-scan", "head-scan")
"""The figures of a section, by the name each is saved under (``<model>-<name>.png``)."""


def _check_items(items: object) -> None:
    """``items`` is a list of `ReportInputs` or ``(circuit, model, task)`` triples; anything
    else raises a `TypeError` naming it, before any folder is made."""
    from ..discovery.circuit import GnaCircuit

    expected = (
        "expected a list of (circuit, model, task) tuples, e.g. [(circuit, model, task)] (model and task may be None), "
        "or of ReportInputs (gna.discovery.report_inputs.measure_report)"
    )
    if isinstance(items, (GnaCircuit, ReportInputs)):
        name = items.model if isinstance(items, GnaCircuit) else items.circuit.model
        raise GnaTypeError(f"write_report: items is one {type(items).__name__} ({name!r}): {expected}")
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise GnaTypeError(f"write_report: items={items!r} ({type(items).__name__}): {expected}")
    for index, item in enumerate(items):
        triple = isinstance(item, (tuple, list)) and len(item) == 3 and isinstance(item[0], GnaCircuit)
        if not (triple or isinstance(item, ReportInputs)):
            text = repr(item)
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise GnaTypeError(f"write_report: items[{index}]={shown} ({type(item).__name__}): {expected}")


def report_inputs(
    items: Sequence[ReportInputs | ReportLike],
    faithfulness: dict[str, FaithfulnessCurve] | None = None,
    retention: dict[str, RetentionCurve] | None = None,
) -> list[ReportInputs]:
    """One `ReportInputs` per item: given ones as they are, each triple measured by
    `measure_report` (its curve taken from ``faithfulness`` when given there), or, without a
    model and task, the circuit alone. ``retention`` curves are attached by model name."""
    _check_items(items)
    circuits = [item.circuit if isinstance(item, ReportInputs) else item[0] for item in items]
    curves = check_faithfulness(faithfulness, circuits)
    kept = check_retention(retention, circuits)
    out = []
    for item in items:
        if isinstance(item, ReportInputs):
            inputs = item
        else:
            circuit, model, task = item
            inputs = ReportInputs(circuit, curves.get(circuit.model))
            if model is not None and task is not None:
                inputs = measure_report(circuit, model, task, faithfulness=curves.get(circuit.model, True))
        name = inputs.circuit.model
        if name in curves:
            inputs = dataclasses.replace(inputs, faithfulness=curves[name])
        if name in kept:
            inputs = dataclasses.replace(inputs, retention=kept[name])
        out.append(inputs)
    return out


@suggest_keywords
def write_report(
    items: Sequence[ReportInputs | ReportLike],
    directory: str | Path,
    *,
    faithfulness: dict[str, FaithfulnessCurve] | None = None,
    retention: dict[str, RetentionCurve] | None = None,
    mib: Sequence[tuple[str, MibGraph]] | None = None,
    figures: Sequence[str] = (),
) -> Path:
    """Write ``index.html`` (offline, self-contained) and one JSON per circuit into ``directory``.

    ``items``: one `ReportInputs` per circuit (`measure_report`; rendering them runs no
    forward), or ``(circuit, model, task)`` triples, each measured by `measure_report` first
    (the heads-needed curves it lacks, the circuit kept alone, the G&A picture and one
    prompt's view; the circuits passed in are not changed).

    ``faithfulness``: per circuit's ``model`` name, a `FaithfulnessCurve` whose ``circuit`` is
    that circuit's heads (`circuit_faithfulness`), used instead of measuring one.
    ``retention``: per model name, a `RetentionCurve` (`gna.retention_curve`): the keep-only
    curve against random heads. ``mib``: ``(name, MibGraph)`` pairs drawn side by side
    (`mib_view.mib_section`). ``figures``: formats (``"png"``, ``"svg"``) in which every
    figure is also saved alone, ``figures/<model>-<figure>.<format>`` (`save_figures`)."""
    from .views import bundle_script

    inputs = report_inputs(items, faithfulness, retention)
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise GnaValueError(f"report directory {str(folder)!r} is an existing file: expected a folder")
    folder.mkdir(parents=True, exist_ok=True)
    sections = [section_context(one) for one in inputs]
    for section, one in zip(sections, inputs, strict=True):
        section["files"] = _save(section, folder, figures) if figures else {}
        _write_data(section, one, folder)
    circuits = [one.circuit for one in inputs]
    views = any(s["picture"] and s["picture"]["view"] is not None for s in sections)
    page = (
        environment()
        .get_template("page.html.j2")
        .render(
            style=STYLE,
            scripts=bundle_script() if views else "",  # once, before every view
            sections=sections,
            carry_rows=carry_rows(circuits, {one.circuit.model: one.faithfulness for one in inputs if one.faithfulness}),
            contrast_rows=contrast_rows(circuits),
            carries_share=f"{CARRIES_SHARE:.0%}",
            max_heads=circuits[0].settings.get("max_heads_per_role", 8) if circuits else 8,
            mib=None if mib is None else mib_section(mib),
        )
    )
    index = folder / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def _write_data(section: dict[str, Any], inputs: ReportInputs, folder: Path) -> None:
    """The files beside the page: the circuit's JSON, and the curves' points as CSV."""
    slug = section["slug"]
    (folder / f"{slug}.json").write_text(inputs.circuit.to_json() + "\n")
    if section["faith"] and section["faith"]["figure"] is not None:
        section["faith"]["curve"].to_frame().to_csv(folder / f"{slug}-faithfulness.csv", index=False)
    if section["retention"]:
        section["retention"]["curve"].to_frame().to_csv(folder / f"{slug}-retention.csv", index=False)


def _drawings(section: dict[str, Any]) -> dict[str, Any]:
    """A section's figures by name (`FIGURES`), those it has."""
    found = {
        "overview": section["overview"],
        "needs": section["needs"] and section["needs"]["svg"],
        "faithfulness": section["faith"] and section["faith"]["figure"],
        "retention": section["retention"] and section["retention"]["figure"],
        "picture": section["picture"] and section["picture"]["figure"],
        **{scan["name"]: scan["svg"] for scan in section["scans"]},
    }
    return {name: found[name] for name in FIGURES if found.get(name) is not None}


def _save(section: dict[str, Any], folder: Path, formats: Sequence[str]) -> dict[str, list[str]]:
    """Each figure of ``section`` saved alone in ``formats``; ``{figure: [paths relative to folder]}``."""
    bad = [f for f in formats if f not in ("png", "svg")]
    if bad or isinstance(formats, str):
        raise GnaValueError(f"figures={formats!r}: expected formats among ('png', 'svg'), e.g. figures=('png', 'svg')")
    (folder / "figures").mkdir(exist_ok=True)
    saved: dict[str, list[str]] = {}
    for name, drawing in _drawings(section).items():
        for form in formats:
            relative = f"figures/{section['slug']}-{name}.{form}"
            drawing.save(folder / relative)
            saved.setdefault(name, []).append(relative)
    return saved


def save_figures(inputs: ReportInputs, folder: str | Path, formats: Sequence[str] = ("png", "svg")) -> dict[str, list[Path]]:
    """Every figure of one circuit's report section saved alone (for a paper), no forward run:
    ``{figure: [folder/figures/<model>-<figure>.<format>, ...]}``, names as in `FIGURES`."""
    if not isinstance(inputs, ReportInputs):
        raise GnaTypeError(f"save_figures: inputs is {type(inputs).__name__}: expected a ReportInputs (measure_report)")
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    saved = _save(section_context(inputs), target, formats)
    return {name: [target / path for path in paths] for name, paths in saved.items()}
