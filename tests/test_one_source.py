"""One source of truth (issue 52, item 6): the summary, the demo table and the report are
rendered from the circuit's fields. For every bundled toy, each number and head list parsed
out of the three texts equals the circuit's JSON (`GnaCircuit.to_dict`) or its faithfulness
curve's fields, at the rounding the text uses; and the "carries" word never contradicts the
share it stands beside (issue 52, item 4: a tested verdict, `scoring.carries`)."""

from __future__ import annotations

import html
import json
import re
import warnings
from typing import Any

import pytest

import gna_interp as gna
from gna_interp.demo import DEMO_SEED, curve_sizes
from gna_interp.discovery.report_inputs import measure_report
from gna_interp.scoring.carries import CARRIES_SHARE, carries_from_curve, mover_interval
from gna_interp.scoring.verdicts import newcombe_interval
from gna_interp.viz.report_html import DASH, slug_of
from gna_interp.viz.summary import HEADS_SHOWN, summary_table

PROMPTS = 32
TAGS = re.compile(r" ?\((attention|ssm|a|s)\)")
ROW = re.compile(
    r"^(?P<model>\S+) +(?P<alone>\S+) +(?P<share>\S+) +(?P<path>\S+) +(?P<carries>.+?)"
    r" +(?P<mechanism>g&a|partly|counting|undetermined|none|-)"
    r" +(?P<clean>\S+) +(?P<gather_acc>\S+) +(?P<aggregate_acc>\S+) +(?P<both>\S+) +(?P<shuffled>\S+)"
    r" +(?P<gather>(?:\d+: )?\S+) +(?P<aggregate>(?:\d+: )?\S+)$"
)


@pytest.fixture(scope="module")
def toys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every bundled toy discovered once on `PROMPTS` prompts, measured for the report, and the report written."""
    measured = {}
    for name in gna.toy_names():
        model, task = gna.load_toy(name), gna.toy_task(name, PROMPTS, seed=DEMO_SEED)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            circuit = gna.discover(model, task, progress=False)
        measured[name] = measure_report(circuit, model, task, sizes=curve_sizes(len(model.heads)))
    folder = tmp_path_factory.mktemp("report")
    index = gna.write_report(list(measured.values()), folder)
    return {"inputs": measured, "html": index.read_text(), "folder": folder}


def plain(text: str) -> str:
    """Head names without their kind tags."""
    return TAGS.sub("", text)


def listed(cell: str, heads: list[str]) -> None:
    """A head-list cell of the demo table against the JSON's list: all of it, or ``"N: first,…"``."""
    if len(heads) > HEADS_SHOWN + 1:
        assert ": " in cell, (cell, heads)
        count, names = cell.split(": ")
        assert int(count) == len(heads) and plain(names).split(",") == [*heads[:HEADS_SHOWN], "…"], (cell, heads)
    else:
        assert plain(cell).split(",") == (heads or ["-"]), (cell, heads)


def share_of(curve: Any) -> float:
    """The share of the gap from every head ablated to clean the circuit recovers, from the curve's three accuracies."""
    alone, clean, none = curve.circuit_point["accuracy"], curve.clean["accuracy"], curve.ablated["accuracy"]
    return (alone - none) / (clean - none)


def word_agrees(word: str, share: float) -> None:
    """A carries word never contradicts its own estimate: "whole" only at or above the line, "partial" only below it."""
    if word.startswith("whole"):
        assert share >= CARRIES_SHARE, (word, share)
    if word.startswith("partial"):
        assert share < CARRIES_SHARE, (word, share)


def check_table(inputs: Any) -> None:
    """The demo table's row (`summary_table`, wide enough not to wrap a head list)."""
    circuit, curve = inputs.circuit, inputs.faithfulness
    data = circuit.to_dict()
    lines = summary_table([circuit], {circuit.model: curve} if curve else {}, width=1000).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(circuit.model + " "))
    row = ROW.match(lines[start])
    assert row is not None, lines[start]
    more = []  # the carries cell's wrapped words: the row's next lines
    for line in lines[start + 1 :]:
        if not line.startswith(" "):
            break
        more.append(line.strip())
    carries = " ".join([row["carries"], *more]).strip()
    acc = data["accuracy"]
    for cell, key in (
        ("clean", "clean"),
        ("gather_acc", "-gather"),
        ("aggregate_acc", "-aggregate"),
        ("both", "-both"),
        ("shuffled", "shuffled_labels"),
    ):
        assert row[cell] == (f"{acc[key]:.3f}" if key in acc else "-"), (cell, row[cell], acc.get(key))
    assert row["mechanism"] == (data["mechanism"] or "-")
    path = (data["path_patching"] or {}).get("fraction_of_effect")
    assert row["path"] == ("-" if path is None else f"{path:.2f}")
    listed(row["gather"], data["gather"])
    listed(row["aggregate"], data["aggregate"])
    if curve is None or curve.circuit_point is None:
        assert (row["alone"], row["share"], carries) == ("-", "-", "-")
        return
    assert row["alone"] == f"{curve.circuit_point['accuracy']:.3f}"
    assert row["share"] == f"{share_of(curve):.0%}"
    word_agrees(carries, share_of(curve))
    if data["mechanism"] != "none":
        assert carries.split(":")[0].split(" (")[0] == carries_from_curve(curve).word  # type: ignore[union-attr]


def check_summary(inputs: Any) -> None:
    """`GnaCircuit.summary` with the curve: accuracies, role sets, outright / members, needs, path and carries."""
    circuit, curve = inputs.circuit, inputs.faithfulness
    data = circuit.to_dict()
    text = circuit.summary(curve)
    lines = text.splitlines()
    accuracy = next(line for line in lines if line.startswith("  accuracy  "))
    pairs = dict(re.findall(r"(\S+) (\d\.\d{3})", accuracy))
    assert pairs == {k: f"{v:.3f}" for k, v in data["accuracy"].items() if "@" not in k}, (pairs, data["accuracy"])
    for role in ("gather", "aggregate"):
        name = circuit.role_name(role)
        heads = data[role]
        if not heads and data["mechanism"] == "none":
            continue
        at = next(i for i, line in enumerate(lines) if line.startswith(f"  {name:9s} ") and "needs" not in line)
        assert plain(lines[at][12:]).split(", ") == (heads or ["-"]), (lines[at], heads)
        if heads:  # every head of the set once: outright, or a member only (grouped by what it lacks)
            standing = lines[at + 1].strip()
            named = re.findall(r"L\d+H\d+", standing)
            assert sorted(named) == sorted(heads), (standing, heads)
            outright = standing.split(";")[0].removeprefix("outright: ")
            assert plain(outright).split(", ") == ([str(h) for h in circuit.outright(role)] or ["none"])
    for role, need in data["needs"].items():
        assert set(need["heads"]) <= set(data[role]), (role, need["heads"], data[role])  # a needed head is one of its role's set
        line = next(line for line in lines if line.startswith(f"  {circuit.role_name(role):9s} needs"))
        assert line.split("needs ")[1].startswith(f"{len(need['heads'])} head(s): {need['accuracy']:.3f} ")
        if need["curve"]:  # the line under it: each step's head and accuracy
            steps = lines[lines.index(line) + 1].split("): ", 1)[1]
            expected = ", ".join(f"{'+' if i else ''}{p['head']} {p['accuracy']:.3f}" for i, p in enumerate(need["curve"]))
            assert plain(steps) == expected, (steps, need["curve"])
    for role, spread in data["spread"].items():
        if spread["sizes"]:
            size = next(line for line in lines if f"size: the {role.capitalize()} role needs" in line)
            assert f"needs {spread['heads_for_half']} of " in size, (size, spread["heads_for_half"])
            curve_line = lines[lines.index(size) + 1].split("): ", 1)[1]
            assert curve_line == ", ".join(f"{k}: {a:.3f}" for k, a in spread["sizes"]), (curve_line, spread["sizes"])
    if data["mechanism"] not in (None, "none"):
        clean, shuffled = data["accuracy"]["clean"], data["accuracy"].get("shuffled_labels")
        said = f"falls from {clean:.3f} to {shuffled:.3f}" if data["mechanism"] == "counting" else f"clean accuracy {clean:.3f} "
        assert said in data["headline"] and data["headline"] in text, (said, data["headline"])
    path = data["path_patching"]
    if path is not None:
        line = next(line for line in lines if line.startswith("  path      "))
        assert [f"{path[k]:.3f}" for k in ("clean", "corrupt", "gather->aggregate")] == re.findall(r"-?\d+\.\d{3}", line)
        assert f"({path['fraction_of_effect']:.2f} of the clean - corrupt gap)" in line
    if data["mechanism"] == "g&a":  # G&A is named only with heads in both roles
        assert data["gather"] and data["aggregate"], data
    carried = [line for line in lines if line.startswith("  carries   ")]
    if curve is None or curve.circuit_point is None or data["mechanism"] == "none":
        assert not carried
        return
    (line,) = carried
    numbers = re.search(r"alone (\S+) recovers (\S+) of the gap from none (\S+) to clean (\S+), against (\d+)%", line)
    assert numbers is not None, line
    alone, share, none, clean, line_pct = numbers.groups()
    assert (alone, none, clean) == tuple(f"{p['accuracy']:.3f}" for p in (curve.circuit_point, curve.ablated, curve.clean))
    assert share == f"{share_of(curve):.0%}" and int(line_pct) == round(100 * CARRIES_SHARE)
    assert clean == f"{data['accuracy']['clean']:.3f}"  # the curve's clean run is discovery's clean accuracy
    word_agrees(line.split("   ")[1], share_of(curve))


def cells(table: str) -> list[list[str]]:
    """An HTML table's rows of cell texts."""
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, re.S)] for r in rows]


def check_report(inputs: Any, page: str) -> None:
    """The report: the side-by-side carries table, each role's set and needed heads, the section's carries line."""
    circuit, curve = inputs.circuit, inputs.faithfulness
    data = circuit.to_dict()
    carries_table = cells(page.split('<div data-role="carries">')[1].split("</table>")[0])
    head, rows = carries_table[0], {r[0]: dict(zip(carries_table[0], r, strict=True)) for r in carries_table[1:]}
    row = rows[circuit.model]
    assert row["mechanism"] == (data["mechanism"] or "-")
    path = (data["path_patching"] or {}).get("fraction_of_effect")
    assert row[head[3]] == (DASH if path is None else f"{path:.3f}")
    if curve is not None and curve.circuit_point is not None:
        assert row[head[1]] == f"{curve.circuit_point['accuracy']:.3f}"
        assert row[head[2]] == f"{share_of(curve):.3f}"
        word_agrees(row["carries"], share_of(curve))
    roles = cells(page.split('<details data-fold="roles">')[1].split("</table>")[0])
    by_role = {(r[0], r[2]): dict(zip(roles[0], r, strict=True)) for r in roles[1:]}
    for role in ("gather", "aggregate"):
        got = by_role[(circuit.model, circuit.role_name(role))]
        assert plain(got["set"]).split(", ") == (data[role] or ["-"])
        need = data["needs"].get(role)
        if need is not None:
            assert plain(got["heads needed"]) == f"{len(need['heads'])}: {', '.join(need['heads'])}"
    section = page.split(f'id="{slug_of(circuit.model)}"')[1].split("</section>")[0]
    verdict = None if data["mechanism"] == "none" else carries_from_curve(curve)
    said = re.search(r'<p data-role="carries"><b>Carries: (.*?)</b></p>', section)
    assert (said and html.unescape(said.group(1))) == (verdict and verdict.text)


@pytest.mark.slow
def test_every_toy_renders_its_json(toys: dict[str, Any]) -> None:
    """Per bundled toy: the demo table's row, the summary and the report agree with the JSON."""
    assert len(toys["inputs"]) == len(gna.toy_names()) >= 4
    for inputs in toys["inputs"].values():
        check_table(inputs)
        check_summary(inputs)
        check_report(inputs, toys["html"])
        written = json.loads((toys["folder"] / f"{slug_of(inputs.circuit.model)}.json").read_text())
        assert written == json.loads(json.dumps(inputs.circuit.to_dict())), inputs.circuit.model  # the report's JSON is the circuit's


def test_mover_is_newcombe_for_two_terms() -> None:
    """`mover_interval` of ``p1 - p2`` is Newcombe's hybrid score interval (the reference), and
    the carries verdict's interval holds its estimate."""
    for k1, n1, k2, n2 in ((30, 40, 12, 40), (40, 40, 0, 40), (7, 32, 25, 32)):
        assert mover_interval([(1.0, k1, n1), (-1.0, k2, n2)]) == pytest.approx(newcombe_interval(k1, n1, k2, n2), abs=1e-12)


def test_carries_word_follows_the_interval() -> None:
    """The same share at more prompts moves from undetermined to settled; the prompts said to
    settle it do (the verdict recomputed at that count)."""
    from types import SimpleNamespace

    def curve(n: int, alone: float) -> Any:
        def recovered(a: float) -> float:
            return (a - 0.25) / (1.0 - 0.25)

        return SimpleNamespace(
            n_prompts=n, circuit_point={"accuracy": alone}, clean={"accuracy": 1.0}, ablated={"accuracy": 0.25}, recovered=recovered
        )

    small = carries_from_curve(curve(40, 0.75))  # share 67% against 80%
    assert small is not None and small.word == "undetermined" and small.prompts_to_settle is not None
    settled = carries_from_curve(curve(small.prompts_to_settle * 2, 0.75))
    assert settled is not None and settled.word == "partial"
    assert carries_from_curve(curve(400, 1.0)).word == "whole"  # type: ignore[union-attr]
