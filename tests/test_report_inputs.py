"""The report measures before it renders: `measure_report` runs every forward into a
`ReportInputs`, and `write_report` given one runs none (counted by a forward hook on the HF
model itself and by the cost meter). The first screen's sentence and every table's numbers
are the inputs' own fields, re-measured here with `gna.evaluate`; no column of the first
table is blank by default; each figure is saved alone as PNG and SVG."""

from __future__ import annotations

import copy
import dataclasses
import html
import math
import re
import statistics
import xml.etree.ElementTree as ET
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch

import gna_interp as gna
from gna_interp.discovery.report_inputs import ReportInputs, circuit_heads, measure_report
from gna_interp.scoring.verdicts import wilson_interval
from gna_interp.viz.overview import head_grid, headline
from gna_interp.viz.report import FIGURES, save_figures, write_report
from gna_interp.viz.report_html import fmt

from .toy_circuits import discovered

ROOT = Path(__file__).resolve().parents[1]
SIZES = [1, 3, 5]


@pytest.fixture(scope="module")
def measured():
    """``(model, task, circuit, inputs)`` of the Llama toy, measured by `measure_report`."""
    model, task, circuit, _ = discovered("llama")
    return model, task, circuit, measure_report(circuit, model, task, sizes=SIZES)


def _count_forwards(model) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """A forward pre-hook on the HF model under the backend: it counts every forward run."""
    calls = [0]
    handle = model.backend.root.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls, handle


def test_write_report_runs_no_forward(measured, tmp_path):
    """Rendering the measured inputs (figures saved too) runs no forward of the HF model and
    charges nothing to the cost meter, while measuring them ran some (the counter counts)."""
    model, task, circuit, inputs = measured
    calls, handle = _count_forwards(model)
    try:
        with gna.cost_meter(model) as cost:
            write_report([inputs], tmp_path / "page", figures=("svg",))
        assert calls[0] == 0 and cost.forwards == 0 and cost.rows == 0
        measure_report(circuit, model, task, faithfulness=False)
        assert calls[0] > 0, "the hook counts the forwards measuring runs"
    finally:
        handle.remove()


def test_the_headline_and_tables_are_the_inputs_numbers(measured, tmp_path):
    """The sentence under each model's title and the tables give the inputs' numbers; the
    circuit kept alone is `gna.evaluate` with every other head mean-ablated, here."""
    model, task, circuit, inputs = measured
    curve = inputs.faithfulness
    others = [h for h in model.heads if h not in set(circuit_heads(circuit))]
    alone = gna.evaluate(model, task, [gna.Ablate(others, how="mean", corrupt=task)]).accuracy
    assert curve.circuit_point["accuracy"] == pytest.approx(alone, abs=1e-12)
    page = (write_report([inputs], tmp_path)).read_text(encoding="utf-8")
    headline = html.unescape(re.search(r'<p class="headline" data-role="headline">(.*?)</p>', page, re.S).group(1))
    low, high = inputs.interval("alone")
    clean, floor = curve.clean["accuracy"], curve.ablated["accuracy"]
    assert f"answer {alone:.3f} of {len(task)} prompts (95% interval {low:.3f}-{high:.3f})" in headline, headline
    assert f"against {clean:.3f} with every head and {floor:.3f} with none: {(alone - floor) / (clean - floor):.0%} of the gap" in headline
    acc = circuit.accuracy
    assert f"the Gather set {acc['-gather']:.3f} and the Aggregate set {acc['-aggregate']:.3f} (chance {acc['chance']:.3f})" in headline
    carries = page[page.index('data-fold="carries"') :]
    cells = re.findall(r'<td class="num">([^<]+)</td>', carries[: carries.index("</table>")])
    assert cells[:2] == [f"{alone:.3f}", f"{(alone - floor) / (clean - floor):.3f}"], cells
    accuracy = page[page.index('data-fold="accuracy"') :]
    accuracy = accuracy[: accuracy.index("</table>")]
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>[^<]*</td><td class=\"num\">([^<]+)</td></tr>", accuracy))
    assert rows == {k: fmt(v) for k, v in acc.items()}
    cost = html.unescape(page[page.index('data-role="cost"') :])
    assert f"<td>passes over the prompts (forward)</td><td>{circuit.cost['passes']:.1f}</td>" in cost
    assert f"<td>time</td><td>{circuit.cost['seconds']:.1f} s</td>" in cost
    assert "backward_block_rows" not in cost and "peak_memory_mb" not in cost and "block_rows" not in cost


def test_no_blank_column_by_default(measured, tmp_path):
    """``write_report([(circuit, model, task)])`` with no ``faithfulness=`` measures the circuit
    kept alone: the first table's "alone" and "share" are the numbers `gna.evaluate` gives."""
    model, task, circuit, inputs = measured
    page = write_report([(circuit, model, task)], tmp_path).read_text(encoding="utf-8")
    carries = page[page.index('data-fold="carries"') :]
    table = carries[: carries.index("</table>")]
    header = re.findall(r"<th>([^<]*)</th>", table)
    row = re.findall(r"<td[^>]*>([^<]*)</td>", table)
    assert len(header) == len(row) and "\u2014" not in row and "-" not in row[:5], row
    curve = inputs.faithfulness
    assert row[1] == f"{curve.circuit_point['accuracy']:.3f}" and row[2] == f"{curve.recovered(curve.circuit_point['accuracy']):.3f}"


@pytest.mark.slow  # about 10 s: twelve files drawn
def test_each_figure_is_saved_alone_as_png_and_svg(measured, tmp_path):
    """`save_figures` writes each figure of a section as PNG (its size at 200 dpi) and as SVG
    (well-formed XML, its heads' names as text); ``write_report(figures=...)`` links them."""
    inputs = measured[3]
    saved = save_figures(inputs, tmp_path)
    assert set(saved) == {"overview", "needs", "faithfulness", "picture", "layer-scan", "head-scan"} <= set(FIGURES)
    for name, (png, svg) in saved.items():
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width > 300 and height > 200, (name, width, height)
        root = ET.parse(svg).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name
    overview = " ".join(t.text or "" for t in ET.parse(saved["overview"][1]).getroot().iter("{http://www.w3.org/2000/svg}text"))
    assert "Heads by layer and index" in overview and f"{inputs.faithfulness.circuit_point['accuracy']:.3f}" in overview
    png = int.from_bytes(saved["overview"][0].read_bytes()[16:20], "big")
    assert abs(png - 12.0 * 200) <= 2, png  # 12 inches at 200 dpi
    page = write_report([inputs], tmp_path / "page", figures=("svg",)).read_text(encoding="utf-8")
    assert '<a href="figures/toy-llama-overview.svg">' in page and (tmp_path / "page/figures/toy-llama-overview.svg").exists()
    with pytest.raises(ValueError, match="figures='png'"):
        write_report([inputs], tmp_path / "bad", figures="png")


def test_wilson_interval_is_the_score_test_inverted():
    """Each bound is where the score test is exactly at z: |p - q| = z sqrt(q (1 - q) / n),
    solved here by bisection."""

    def bound(p: float, n: int, upper: bool) -> float:
        lo, hi = (p, 1.0) if upper else (0.0, p)
        for _ in range(200):
            q = (lo + hi) / 2
            inside = abs(p - q) <= Z95 * math.sqrt(q * (1 - q) / n)
            if inside == upper:
                lo = q
            else:
                hi = q
        return (lo + hi) / 2

    for p, n in [(0.965, 200), (0.3, 64), (0.5, 10), (0.0, 50), (1.0, 50)]:
        low, high = wilson_interval(p * n, n, 0.95)  # what `ReportInputs.interval` gives
        assert low == pytest.approx(bound(p, n, False), abs=1e-9) and high == pytest.approx(bound(p, n, True), abs=1e-9), (p, n)


Z95 = statistics.NormalDist().inv_cdf(0.975)


def test_a_circuit_alone_gets_an_error_naming_the_measuring_function(measured):
    """Measuring needs the model and task; `save_figures` takes `ReportInputs` only."""
    _, _, circuit, _ = measured
    with pytest.raises(ValueError, match=r"measure_report\('toy-llama'\): model and task are needed"):
        measure_report(circuit, None, None)
    with pytest.raises(TypeError, match=r"expected a ReportInputs \(measure_report\)"):
        save_figures(circuit, "x")  # type: ignore[arg-type]
    assert isinstance(ReportInputs(circuit), ReportInputs)


def test_the_templates_ship_as_package_data():
    """Every template under gna_interp/viz/templates matches pyproject's package-data."""
    data = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]")[1]  # Python 3.10 has no tomllib
    globs = re.findall(r'"([^"]+)"', re.search(r"gna_interp = \[(.*?)\]", data).group(1))
    templates = sorted((ROOT / "gna_interp/viz/templates").glob("*"))
    assert templates and all(any(fnmatch(str(t.relative_to(ROOT / "gna_interp")), g) for g in globs) for t in templates)


def test_the_sentence_names_no_empty_set_and_the_grid_is_the_models(measured):
    """A role with no heads is not said to be ablated (its "-gather" accuracy is the clean
    run's); the overview's grid has the model's layers and heads, each role head in its cell."""
    model, _, circuit, inputs = measured
    bare = copy.deepcopy(circuit)
    bare.gather = []
    sentence = headline(dataclasses.replace(inputs, circuit=bare))
    assert "Gather set" not in sentence and f"ablating the Aggregate set {circuit.accuracy['-aggregate']:.3f}" in sentence, sentence
    layers, width, cells = head_grid(circuit)
    assert (layers, width) == (model.n_layers, model.n_heads)
    assert {(h.layer, h.head) for h in [*circuit.gather, *circuit.aggregate]} == set(cells)
    assert all(cells[h.layer, h.head][0] == "gather" for h in circuit.gather if h not in circuit.aggregate)
