"""The offline report of two toy models (a Transformer and an SSM), built from the
circuits test_discovery re-measures: its numbers against raw HF attention and the
circuits' own evidence, the prompt it shows, one script bundle per page, and the page
rendered in headless Chromium: no horizontal overflow at 1,400 px, every circuitsvis
view drawn, every found head named in the figures, the thresholds, the path shares and
the stability table on the page. (tests/test_claims.py checks what those texts say.)"""

from __future__ import annotations

import copy
import html
import itertools
import json
import math
import re
import shutil
import subprocess

import pytest
import torch

import gna_interp as gna
from gna_interp.discovery import Stability
from gna_interp.discovery.picture import choose_prompt, role_picture
from gna_interp.discovery.report_inputs import circuit_faithfulness, circuit_heads, circuit_ranking
from gna_interp.viz.report import write_report
from gna_interp.viz.report_html import slug_of
from gna_interp.viz.views import bundle_script

from .toy_circuits import TOYS, discovered

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WINDOW = 1400


def _with_stability(circuit):
    """A copy of ``circuit`` with a `Stability` for the page's layout (three samples: its own
    sets twice, then without its last Gather head): the table's texts are checked by
    tests/test_claims.py on a measured one."""
    copied = copy.deepcopy(circuit)
    sets = [{"gather": list(circuit.gather), "aggregate": list(circuit.aggregate)}] * 2
    sets.append({"gather": list(circuit.gather[:-1]), "aggregate": list(circuit.aggregate)})
    shape = (len(circuit.head_scan), len(circuit.head_scan[0]))
    copied.stability = Stability("bootstrap", [circuit.n_prompts] * 3, sets, shape, 0, 1.0)
    return copied


@pytest.fixture(scope="module")
def items():
    """``(circuit, model, task)`` per toy, as `write_report` takes them; the first with a
    stability table."""
    found = [(circuit, model, task) for model, task, circuit, _ in map(discovered, TOYS)]
    return [(_with_stability(found[0][0]), *found[0][1:]), *found[1:]]


FAITH_SIZES = [1, 3, 5]
"""Sizes of the report's faithfulness curves here (the demo draws every n): 0 and every head are added."""


@pytest.fixture(scope="module")
def curves(items):
    """Per model, `circuit_faithfulness` of its circuit (mean ablation, discovery's ranking)."""
    return {circuit.model: circuit_faithfulness(circuit, model, task, sizes=FAITH_SIZES) for circuit, model, task in items}


@pytest.fixture(scope="module")
def report(items, curves, tmp_path_factory):
    index = write_report(items, tmp_path_factory.mktemp("report"), faithfulness=curves)
    return index, index.read_text(encoding="utf-8")


def test_faithfulness_section_equals_an_independent_evaluate(report, items):
    """Each section's numbers (the lead sentence, the table, the data attributes) are the
    task's accuracy with only the circuit's Gather and Aggregate heads kept and every other
    head mean-ablated over the task's prompts, against clean and every head ablated, each
    from `gna.evaluate` here, and the share of clean is their ratio."""
    _, page = report
    sections = re.findall(r'(<div data-role="faithfulness".*?)(?=<h3>The G&amp;A picture|</section>)', page, re.S)
    assert len(sections) == len(items)
    for (circuit, model, task), section in zip(items, sections, strict=True):
        kept = set(circuit.gather) | set(circuit.aggregate)
        others = [head for head in model.heads if head not in kept]
        assert kept and others
        alone = gna.evaluate(model, task, [gna.Ablate(others, how="mean", corrupt=task)]).accuracy
        clean = gna.evaluate(model, task).accuracy
        floor = gna.evaluate(model, task, [gna.Ablate(list(model.heads), how="mean", corrupt=task)]).accuracy
        attributes = dict(re.findall(r'data-(circuit|clean|ablated)="([^"]+)"', section))
        assert float(attributes["circuit"]) == pytest.approx(alone, abs=1e-9)
        assert float(attributes["clean"]) == pytest.approx(clean, abs=1e-9)
        assert float(attributes["ablated"]) == pytest.approx(floor, abs=1e-9)
        lead = f"<b>{alone:.3f}, {alone / clean:.0%} of clean</b> ({clean:.3f}); with every head ablated it is {floor:.3f}"
        assert lead in section, section[:1500]
        assert f"the circuit alone: {html.escape(circuit.named(circuit_heads(circuit)))}" in section
        cells = re.findall(r'<td class="num">([^<]+)</td>', section)
        assert cells == [
            str(len(model.heads)), f"{clean:.3f}", "1.000",
            str(len(kept)), f"{alone:.3f}", f"{alone / clean:.3f}",
            "0", f"{floor:.3f}", f"{floor / clean:.3f}",
        ]  # fmt: skip


def test_faithfulness_curve_is_drawn_with_its_numbers(report, items, curves):
    """The figure is there with the ranking discovery measured (no extra sweep): heads by
    their head-scan accuracy drop, largest first; the CSV beside the page holds every point."""
    index, page = report
    figures = re.findall(r'<figure data-role="faithfulness-curve">(.*?)</figure>', page, re.S)
    assert len(figures) == len(items)
    for (circuit, model, _), figure in zip(items, figures, strict=True):
        curve = curves[circuit.model]
        scan = torch.tensor([[math.nan if v is None else v for v in row] for row in circuit.head_scan])
        measured = [h for h in model.heads if not math.isnan(float(scan[h.layer, h.head]))]
        worst = min(measured, key=lambda h: (float(scan[h.layer, h.head]), h))
        ranking = circuit_ranking(circuit, model)
        assert ranking[0] == worst and set(ranking) == set(measured) and curve.order[: len(ranking)] == ranking
        assert [float(scan[h.layer, h.head]) for h in ranking] == sorted(float(scan[h.layer, h.head]) for h in ranking)
        assert curve.sizes.tolist() == [0, *FAITH_SIZES, len(model.heads)]
        labels = " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", figure))
        alone = curve.circuit_point["accuracy"]
        assert f"{alone:.3f}" in labels and f"clean {curve.clean['accuracy']:.3f}" in labels, labels
        assert f"n = 0, {', '.join(map(str, FAITH_SIZES))}, {len(model.heads)}" in figure
        assert "discovery's own" in html.unescape(figure)  # escaped as &#39; or &#x27;
        table = (index.parent / f"{slug_of(circuit.model)}-faithfulness.csv").read_text().splitlines()
        assert [float(line.split(",")[1]) for line in table[1:]] == pytest.approx(curve.accuracy.tolist())


def test_faithfulness_argument_is_checked(items, curves, tmp_path):
    """A curve for a model the report lacks, not a curve, or of other heads: refused, named."""
    circuit, _, _ = items[0]
    with pytest.raises(KeyError, match=r"faithfulness\['nope'\].*expected one of"):
        write_report(items[:1], tmp_path, faithfulness={"nope": curves[circuit.model]})
    with pytest.raises(TypeError, match=r"faithfulness\[.*\] is dict: expected a FaithfulnessCurve"):
        write_report(items[:1], tmp_path, faithfulness={circuit.model: {}})
    other = copy.deepcopy(curves[circuit.model])
    other.circuit = other.circuit[:1]
    with pytest.raises(ValueError, match=rf"has circuit heads {other.circuit[0]}: expected the circuit's own"):
        write_report(items[:1], tmp_path, faithfulness={circuit.model: other})


def test_retention_section_shows_the_keep_only_curve(items, tmp_path):
    """Issue 30: the keep-only curve of a retrieval ranking against random heads, its numbers
    on the page and in the CSV equal to `evaluate` with the heads kept by hand; refused when
    not a curve or for a model the report lacks."""
    circuit, model, task = items[0]
    ranking = gna.retrieval_ranking(model, task, progress=False)
    curve = gna.retention_curve(model, task, ranking, sizes=[2], seeds=2, kind="all", progress=False)
    index = write_report(items[:1], tmp_path, retention={circuit.model: curve})
    page = index.read_text(encoding="utf-8")
    section = re.search(r'<div data-role="retention".*?</figure>', page, re.S).group(0)
    kept = ranking.order[:2]
    others = [h for h in model.heads if h not in kept]
    by_hand = gna.evaluate(model, task, [gna.Ablate(others, how="mean", corrupt=task)], progress=False).accuracy
    assert curve.accuracy[1].item() == by_hand
    cells = re.findall(r'<td class="num">([^<]*)</td>', section)
    assert f"{by_hand:.3f}" in cells and f"{curve.random_mean[1].item():.3f}" in cells
    assert f"Clean {curve.clean:.3f}, none kept {curve.ablated:.3f}" in section and "random heads (2 seeds" in section
    table = (index.parent / f"{circuit.model}-retention.csv").read_text().splitlines()
    assert [float(line.split(",")[2]) for line in table[1:]] == pytest.approx(curve.accuracy.tolist())
    with pytest.raises(TypeError, match=r"retention\[.*\] is dict: expected a RetentionCurve"):
        write_report(items[:1], tmp_path, retention={circuit.model: {}})
    with pytest.raises(KeyError, match=r"retention\['nope'\]: no circuit of the report has that model"):
        write_report(items[:1], tmp_path, retention={"nope": curve})


@pytest.fixture(scope="module")
def llama_picture():
    model, task, circuit, _ = discovered("llama")
    return model, task, circuit, role_picture(circuit, model, task)


def _segment_tokens(encoding, segment) -> tuple[list[int], int]:
    """``(tokens of [start, end) without the end, the end's token)`` from the tokenizer's
    character offsets (not the task's own mapping)."""
    offsets = encoding["offset_mapping"]
    inside = [i for i, (a, b) in enumerate(offsets) if b > a and segment.start <= a and b <= segment.end]
    end = next(i for i, (a, b) in enumerate(offsets) if a <= segment.end < b)
    return inside, end


def test_averaged_masses_equal_raw_hf_attention(llama_picture):
    """The figures' numbers, recomputed prompt by prompt from HF's own eager attention
    weights on each unpadded prompt, positions from the tokenizer's character offsets."""
    from transformers import AutoModelForCausalLM

    from gna_interp.zoo.store import toy_path

    _, task, circuit, picture = llama_picture
    hf = AutoModelForCausalLM.from_pretrained(toy_path("llama"), attn_implementation="eager").eval()
    tokenizer = task.tokenizer
    sums = {h: torch.zeros(4, dtype=torch.float64) for h in [*circuit.aggregate, *circuit.gather]}
    n_rows = 0
    for example in task.examples[: picture.n_prompts]:
        encoding = tokenizer(example.text, return_offsets_mapping=True)
        with torch.no_grad():
            attentions = hf(input_ids=torch.tensor([encoding["input_ids"]]), output_attentions=True).attentions
        segments = [_segment_tokens(encoding, s) for s in example.segments]
        ends = [end for _, end in segments]
        for head in circuit.aggregate:
            final = attentions[head.layer][0, head.head, -1].double()
            on_ends = final[ends]
            correct = on_ends[example.correct]
            others = (on_ends.sum() - correct) / (len(ends) - 1)
            sums[head] += torch.stack([correct, others, on_ends.argmax() == example.correct, torch.tensor(0.0)])
        for head in circuit.gather:
            rows = attentions[head.layer][0, head.head].double()
            own = [rows[end, inside].sum() for inside, end in segments]
            earlier = [rows[end_i, segments[j][0]].sum() for i, (_, end_i) in enumerate(segments) for j in range(i)]
            uniform_own = [len(inside) / (end + 1) for inside, end in segments]
            above = sum(float(o > u) for o, u in zip(own, uniform_own, strict=True)) / len(own)
            sums[head] += torch.tensor([sum(own) / len(own), sum(earlier) / len(earlier), above, 0.0])
        n_rows += 1
    for item in picture.aggregate:
        correct, other, top, _ = (sums[item.head] / n_rows).tolist()
        assert (item.correct_end, item.other_end, item.end_argmax) == pytest.approx((correct, other, top), abs=1e-5)
    for item in picture.gather:
        own, other, above, _ = (sums[item.head] / n_rows).tolist()
        assert (item.own, item.other, item.own_above_uniform) == pytest.approx((own, other, above), abs=1e-5)
    # the Aggregate head reads the correct option's end more than another's, as the paper draws it
    assert all(item.correct_end > 2 * item.other_end for item in picture.aggregate), picture.to_frame()


@pytest.mark.parametrize("name", TOYS)
def test_figures_agree_with_the_circuits_scores(name):
    """Identities with the scores discovery recorded on the same prompts: a Gather head's
    own-segment mass is its ``gather`` score; an Aggregate head's end masses add up to its
    ``end_mass`` and its option masses to its ``aggregate_mass``."""
    model, task, circuit, _ = discovered(name)
    picture = role_picture(circuit, model, task)
    n_others = task.n_segments - 1
    assert picture.n_prompts == circuit.settings["pattern_prompts"] == 64
    for item in picture.gather:
        assert item.own == pytest.approx(circuit.evidence(item.head).scores.gather, abs=1e-5)
    for item in picture.aggregate:
        scores = circuit.evidence(item.head).scores
        assert item.correct_end + n_others * item.other_end == pytest.approx(scores.end_mass, abs=1e-5)
        assert item.correct_option + n_others * item.other_option == pytest.approx(scores.aggregate_mass, abs=1e-5)
    frame = picture.to_frame()
    assert list(frame["head"]) == [str(h) for h in [*circuit.aggregate, *circuit.gather]]


def test_the_prompt_shown_is_answered_and_representative(llama_picture):
    """Re-measured alone, the chosen prompt is answered correctly; a brute-force loop over
    the prompts finds the same one (its Aggregate profile, segment-end then option masses,
    in total closest to those of the other answered prompts)."""
    model, task, circuit, picture = llama_picture
    row = picture.prompt
    assert gna.evaluate(model, task[row : row + 1]).is_correct.item()
    answered = gna.evaluate(model, task[: picture.n_prompts]).is_correct
    assert torch.equal(answered, picture.answered)
    profiles = {}
    for k in range(picture.n_prompts):
        correct = int(task.examples[k].correct)
        rows = []
        for i in range(len(circuit.aggregate)):
            for values in (picture.masses.final_on_ends[k, i], picture.masses.final_on_options[k, i]):
                others = sorted((float(v) for j, v in enumerate(values) if j != correct), reverse=True)
                rows.append([float(values[correct]), *others])
        profiles[k] = torch.tensor(rows)
    kept = [k for k in profiles if answered[k]]
    best = min(kept, key=lambda k: sum(float((profiles[k] - profiles[j]).abs().sum()) for j in kept))
    assert row == best
    # with no prompt answered there is nothing to show
    assert choose_prompt(picture.masses, torch.zeros_like(answered), len(circuit.aggregate)) is None


def _single(evidence, positions: str) -> float:
    """A head's accuracy ablated alone where a curve ablates: everywhere (the head scan) or
    at the final position / on the segments (the entry scan)."""
    return evidence.ablated_accuracy if positions == "all" else evidence.entry[positions]


def test_heads_needed_curves_are_recorded_and_named(report, items):
    """Each role's curve (recorded by discover) names its heads in order, starts at its first
    head's single ablation at the curve's positions (the head and entry scans, other code
    paths) and, ablated everywhere, ends at the role's own accuracy (tests/test_discovery_depth.py
    re-measures every step of a joint-search curve); the page names every head of every curve,
    and the role table names them too."""
    index, page = report
    for circuit, _, _ in items:
        data = json.loads((index.parent / f"{slug_of(circuit.model)}.json").read_text())
        for role, need in circuit.needs.items():
            curve, positions = data["needs"][role]["curve"], data["needs"][role]["curve_positions"]
            assert [point["head"] for point in curve] == [str(h) for h in need.heads]
            if positions == "all":  # the role's accuracy is measured with its heads ablated everywhere
                assert curve[-1]["accuracy"] == pytest.approx(need.accuracy)
            assert curve[0]["accuracy"] == pytest.approx(_single(circuit.evidence(need.heads[0]), positions))
            assert f"{len(need.heads)}: {circuit.named(need.heads)}" in page
    figures = re.findall(r'<figure data-role="needs">(.*?)</figure>', page, re.S)
    assert len(figures) == len(items)
    for (circuit, _, _), figure in zip(items, figures, strict=True):
        labels = set(re.findall(r"<text[^>]*>([^<]*)</text>", figure))
        assert {f"+{h}" for need in circuit.needs.values() for h in need.heads} <= labels


def test_a_circuit_without_curves_gets_them_measured(items, tmp_path):
    """A circuit without curves (e.g. loaded from an older JSON): the report measures each
    at every position, one evaluate per head, and leaves the circuit passed in unchanged."""
    circuit, model, task = items[0]
    bare = copy.deepcopy(circuit)
    for need in bare.needs.values():
        need.curve = []
    index = write_report([(bare, model, task)], tmp_path)
    data = json.loads((index.parent / f"{slug_of(circuit.model)}.json").read_text())
    for role, need in bare.needs.items():
        curve = data["needs"][role]["curve"]
        assert data["needs"][role]["curve_positions"] == "all" and not need.curve, "the circuit passed in is not changed"
        assert [point["head"] for point in curve] == [str(h) for h in need.heads]
        assert curve[0]["accuracy"] == pytest.approx(circuit.evidence(need.heads[0]).ablated_accuracy)


def _snapshot(value):
    """``value`` as plain nested data, every field of every dataclass and object, tensors by
    dtype, shape and bytes, floats by ``repr`` (NaN equals NaN): equal exactly when nothing
    in it changed."""
    import dataclasses

    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.detach().cpu().contiguous().numpy().tobytes())
    if isinstance(value, float):
        return ("float", repr(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, {f.name: _snapshot(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, dict):
        return ("dict", [(_snapshot(k), _snapshot(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_snapshot(v) for v in value])
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return (type(value).__name__, {k: _snapshot(v) for k, v in vars(value).items()})
    return value


def test_write_report_leaves_its_circuits_and_curves_bit_identical(items, curves, tmp_path):
    """`write_report` only renders: every circuit given (one of them without its curves, which
    the report then measures on a copy) and every faithfulness curve are, field by field and
    tensor by tensor, and as JSON, exactly as they were before."""
    bare = copy.deepcopy(items[0][0])
    for need in bare.needs.values():
        need.curve = []
    given = [(bare, *items[0][1:]), *items[1:]]
    before = [(_snapshot(circuit), circuit.to_json()) for circuit, _, _ in given]
    curves_before = {name: _snapshot(curve) for name, curve in curves.items()}
    write_report(given, tmp_path, faithfulness={**curves, bare.model: curves[bare.model]})
    assert [(_snapshot(circuit), circuit.to_json()) for circuit, _, _ in given] == before
    assert {name: _snapshot(curve) for name, curve in curves.items()} == curves_before
    assert all(not need.curve for need in bare.needs.values()) and bare.needs


def test_one_bundle_per_page_and_offline(report, items):
    """The circuitsvis bundle is inlined once, however many views; everything else is
    well under a second bundle; nothing is fetched; no cell shows ``nan``."""
    _, page = report
    bundle = bundle_script()
    assert page.count(bundle) == 1 and page.count("var CircuitsVis=") == 1
    assert page.count("CircuitsVis.render(") == len(items) >= 2
    assert len(page) - len(bundle) < len(bundle) / 2, "a second bundle would not fit: the page is one bundle plus the report"
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "external reference in the report"
    assert "unpkg" not in page and "cdn" not in page.lower()
    assert not re.search(r"<div[^>]*/>", page), "a <div .../> is never closed in HTML"
    assert not re.search(r">\s*nan\s*<", page, re.I)
    no_role = [e for c, _, _ in items for e in c.heads if e.role is None]
    assert no_role and f"<td>{no_role[0].head}</td>" in page and "<td>\u2014</td>" in page


def test_the_pass_estimate_is_shown_as_the_range_discover_recorded(report, items):
    """The cost table gives discover's pass estimate as its recorded range, not a raw dict."""
    _, page = report
    for circuit, _, _ in items:
        estimate = circuit.cost["estimate"]
        assert f"{estimate['low']:.0f}-{estimate['high']:.0f} passes (mid {estimate['mid']:.0f})" in page
    assert "{&#x27;low&#x27;" not in page and "{'low'" not in page


def test_head_scan_ticks_are_integers(report):
    """The head-scan heatmap's axes are ticked at layers and heads, not -0.5...1.5."""
    _, page = report
    for heatmap in re.findall(r"<svg.*?</svg>", page, re.S):
        if "accuracy with the head zero-ablated" not in heatmap:
            continue
        main_axes = heatmap[heatmap.index('axes_1"') : heatmap.index('axes_2"')]
        ticks = [t for t in re.findall(r"<text[^>]*>([^<]*)</text>", main_axes) if t not in ("head", "layer")]
        assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks if "ablated" not in t), ticks


MEASURE = """<script>
(function () {
  function views() { return Array.from(document.querySelectorAll('[id^="circuits-vis-"]')); }
  function box(element) {
    const r = element.getBoundingClientRect(); return { left: r.left, right: r.right, top: r.top, width: r.width, bottom: r.bottom };
  }
  function measure() {
    const root = document.documentElement;
    const overview = Array.from(document.querySelectorAll('figure[data-role="overview"]')).map((f) => box(f));
    const folds = Array.from(document.querySelectorAll("section.model details")).filter((d) => !d.open).length;
    document.querySelectorAll("details").forEach((d) => { d.open = true; });  // the rest measured unfolded
    const out = {
      overview: overview, folds: folds,
      scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, innerWidth: window.innerWidth,
      views: views().map((v) => v.childElementCount),
      sections: Array.from(document.querySelectorAll("section.model")).map((s) => box(s)),
      pairs: Array.from(document.querySelectorAll("section.model")).map((s) => {
        const figure = s.querySelector('figure[data-role="picture"]'), view = s.querySelector('[data-role="view"]');
        return {
          figure: figure && box(figure), view: view && box(view),
          aggregate: figure && figure.dataset.aggregate, gather: figure && figure.dataset.gather,
          text: figure ? Array.from(figure.querySelectorAll("svg text")).map((t) => t.textContent) : [],
        };
      }),
      titles: Array.from(document.querySelectorAll("section.model")).map((s) =>
        Array.from(s.querySelectorAll('[id$="-needs-title-aggregate"], [id$="-needs-title-gather"]')).map((t) => {
          const r = t.getBoundingClientRect(); return { left: r.left, right: r.right, top: r.top, bottom: r.bottom };
        })),
      costGaps: Array.from(document.querySelectorAll('[data-role="cost"]')).map((c) =>
        c.querySelector("table").getBoundingClientRect().top - c.querySelector("p").getBoundingClientRect().bottom),
      examined: Array.from(document.querySelectorAll('[data-role="examined"] .scroll')).map((d) => [d.scrollWidth, d.clientWidth]),
      stability: Array.from(document.querySelectorAll('[data-role="stability"] .scroll')).map((d) => [d.scrollWidth, d.clientWidth]),
      paths: Array.from(document.querySelectorAll('[data-role="path"] .scroll')).map((d) => [d.scrollWidth, d.clientWidth]),
      evidence: Array.from(document.querySelectorAll('[data-role="evidence"]')).map((e) => [box(e).width, e.textContent]),
      faithfulness: Array.from(document.querySelectorAll("section.model")).map((s) => {
        const f = s.querySelector('[data-role="faithfulness"]'), figure = f && f.querySelector("figure svg");
        const scroll = f && f.querySelector(".scroll");
        return f && {
          section: box(s), box: box(f), figure: figure && box(figure), scroll: [scroll.scrollWidth, scroll.clientWidth],
          lead: f.querySelector('[data-role="faithfulness-lead"]').textContent,
          cells: Array.from(f.querySelectorAll("td")).map((td) => td.textContent),
        };
      }),
    };
    const pre = document.createElement("pre");
    pre.id = "gna-measure";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  function check() { views().every((v) => v.childElementCount > 0) ? measure() : setTimeout(check, 50); }
  window.addEventListener("load", check);
})();
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium; .ci/run installs it)")
def test_the_page_in_headless_chromium(report, items, curves, tmp_path):
    """Chromium loads the page at 1,400 px, React draws every view, then the page's own
    measurement is written into the DOM (no wall-clock wait: virtual time only advances
    when the page is idle). The page must not be wider than the window, each model's
    section must sit below the previous one at full width, each averaged figure must sit
    beside its circuitsvis view and name every Aggregate and Gather head of its circuit. The
    heads-needed panels' titles must not overlap, the cost table must sit under its caption,
    and the examined-heads table must fit without scrolling, as must the path-patching and
    stability tables. Each section states its evidence thresholds, with their values. Each
    has its faithfulness section, whose figure and table fit inside it, and whose rendered
    text gives the curve's numbers."""
    index, page = report
    probe = index.parent / "measure.html"
    probe.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WINDOW},1000"]
    command += ["--virtual-time-budget=60000", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", probe.as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r'<pre id="gna-measure">(.*?)</pre>', result.stdout, re.S)
    assert found, f"the views never rendered (rc {result.returncode}): {result.stderr[-2000:]}"
    measured = json.loads(html.unescape(found.group(1)))
    assert measured["innerWidth"] == WINDOW
    first = measured["overview"]
    assert len(first) == len(items) and first[0]["bottom"] <= 1000 and all(f["width"] >= 900 for f in first), first  # the first screen
    assert measured["folds"] >= 8 * len(items), "everything but the figure and the sentence is folded"
    assert measured["scrollWidth"] <= measured["clientWidth"], measured["scrollWidth"]
    assert measured["views"] == [v for v in measured["views"] if v > 0] and len(measured["views"]) == len(items)
    sections = measured["sections"]
    assert len(sections) == len(items)
    assert all(s["left"] == sections[0]["left"] and s["width"] == sections[0]["width"] for s in sections)
    assert all(a["top"] < b["top"] for a, b in itertools.pairwise(sections)), "each model below the previous one"
    for (circuit, _, _), pair in zip(items, measured["pairs"], strict=True):
        assert pair["view"]["left"] >= pair["figure"]["right"] and pair["view"]["top"] < pair["figure"]["top"] + 200
        assert pair["aggregate"].split() == [str(h) for h in circuit.aggregate] and circuit.aggregate
        assert pair["gather"].split() == [str(h) for h in circuit.gather] and circuit.gather
        drawn = {line for text in pair["text"] for line in text.split()}
        assert {str(h) for h in [*circuit.aggregate, *circuit.gather]} <= drawn, (circuit.model, sorted(drawn))
    for titles in measured["titles"]:
        assert len(titles) == 2, titles  # one per role
        first, second = sorted(titles, key=lambda t: t["left"])
        assert first["right"] <= second["left"] or first["bottom"] <= second["top"], ("the titles overlap", titles)
    assert measured["costGaps"] and all(0 <= gap < 30 for gap in measured["costGaps"]), measured["costGaps"]
    assert len(measured["examined"]) == len(items) and all(scroll <= client for scroll, client in measured["examined"]), measured[
        "examined"
    ]
    assert len(measured["stability"]) == 1 and all(scroll <= client for scroll, client in measured["stability"]), measured["stability"]
    assert len(measured["paths"]) == len(items) and all(scroll <= client for scroll, client in measured["paths"]), measured["paths"]
    assert len(measured["evidence"]) == len(items)
    for (circuit, _, _), (width, text) in zip(items, measured["evidence"], strict=True):
        assert 0 < width <= WINDOW and " ".join(text.split()) == f"Evidence: {circuit.evidence_rule()}.", text
    assert len(measured["faithfulness"]) == len(items)
    for (circuit, model, _), faith in zip(items, measured["faithfulness"], strict=True):
        assert faith is not None, circuit.model
        section, figure = faith["section"], faith["figure"]
        assert figure is not None and figure["width"] > 300 and section["left"] <= figure["left"] and figure["right"] <= section["right"]
        assert faith["box"]["right"] <= section["right"] and faith["scroll"][0] <= faith["scroll"][1], faith
        curve = curves[circuit.model]
        clean, alone, floor = curve.clean["accuracy"], curve.circuit_point["accuracy"], curve.ablated["accuracy"]
        lead = " ".join(faith["lead"].split())
        assert f"accuracy on the task's {curve.n_prompts} prompts is {alone:.3f}, {alone / clean:.0%} of clean ({clean:.3f})" in lead
        assert f"with every head ablated it is {floor:.3f}" in lead, lead
        assert faith["cells"][1:4] == [str(len(model.heads)), f"{clean:.3f}", "1.000"]
        assert faith["cells"][5:8] == [str(len(curve.circuit)), f"{alone:.3f}", f"{alone / clean:.3f}"], faith["cells"]
        assert faith["cells"][9:12] == ["0", f"{floor:.3f}", f"{floor / clean:.3f}"], faith["cells"]
