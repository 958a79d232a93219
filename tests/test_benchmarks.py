"""The benchmark scripts run end to end on tiny settings (in subprocesses) and their JSON
figures are not vacuous: the numbers the docs quote come from scripts that still work.
No timing is asserted here."""

from __future__ import annotations

import json
import math
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gna_interp.zoo.store import toy_path

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(name: str, *args: str, out: Path) -> dict:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_attribution_benchmark_compares_real_effects(tmp_path):
    """Every model's exact sweep moves the metric (a constant table would make the rank
    correlation meaningless); top-10 is not reported where 10 covers every head."""
    figures = run_benchmark(
        "attribution", "--prompts", "4", "--repeats", "1", "--methods", "attribution", "IG-2 mid", out=tmp_path / "attribution.json"
    )
    rows = figures["rows"]
    assert {r["model"].split(" ")[0] for r in rows} >= {"toy-mamba2_counting", "toy-llama"}
    for row in rows:
        assert row["max_abs_effect"] > 1e-3, row
        assert math.isfinite(row["spearman"]) and -1.0 <= row["spearman"] <= 1.0, row
        assert 1 <= row["live"] <= row["heads"], row
        if row["live"] <= 10:
            assert math.isnan(row["top10"]), row  # 10 of at most 10 heads: no information
    assert math.isfinite(figures["path_demo"]["by_stream"]["any"])


@pytest.mark.slow  # 10-17 s: run by `make test-slow` (CI), not `make test`
def test_implicit_attention_benchmark_agrees_with_its_loop(tmp_path):
    figures = run_benchmark(
        "implicit_attention", "--seq-len", "48", "--prompts", "1", "--repeats", "1", "--loop-keys", "4", out=tmp_path / "implicit.json"
    )
    assert figures["results"]
    for result in figures["results"].values():
        assert result["max_abs_value"] > 0, result
        assert result["rows_max_diff"] <= 1e-5 and result["loop_max_diff"] <= 1e-5, result


@pytest.mark.slow  # 10-17 s: run by `make test-slow` (CI), not `make test`
def test_ablation_sweep_benchmark_matches_its_hook_loop(tmp_path):
    figures = run_benchmark(
        "ablation_sweep",
        *("--prompts", "2", "--prompt-len", "8", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--repeats", "1"),
        out=tmp_path / "ablation.json",
    )
    assert figures["ok"]
    assert figures["phases"]["loop"]["max_abs_effect"] > 1e-4  # the heads move the metric: equality is not vacuous
    for backend in ("tlens", "nnsight"):
        phase = figures["phases"][backend]
        assert phase["ok"] and phase["max_abs_diff_scores"] <= 1e-5, phase


def test_backends_benchmark_compares_equal_nonzero_results(tmp_path, monkeypatch):
    """In this process: a subprocess would spend most of its time importing the libraries."""
    out = tmp_path / "backends.json"
    args = ["backends.py", "--models", "mamba2", "--prompts", "2", "--repeats", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", args)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # what `python benchmarks/x.py` puts first on sys.path
    runpy.run_path(str(ROOT / "benchmarks" / "backends.py"), run_name="__main__")
    figures = json.loads(out.read_text())
    rows = figures["rows"]
    assert {r["operation"] for r in rows} == {"forward", "ablation", "patching", "patterns", "path", "attribution"}
    for row in rows:
        assert row["max_abs_value"] > 1e-3 and row["max_abs_diff"] <= 1e-5, row
        assert row["nnsight_s"] > 0 and row["tlens_s"] > 0 and math.isfinite(row["ratio"]), row


@pytest.mark.slow
def test_discover_scale_benchmark_finds_the_toy_at_depth(tmp_path):
    """The 2-layer toy and its 3-layer deep copy (toy at layers 0, 1): the toy's heads,
    shifted, with their cost (the remote comparison is tests/test_sessions.py's). The toy
    is given by its folder, as a trained toy not yet bundled is."""
    folder = str(toy_path("llama"))
    figures = run_benchmark(
        "discover_scale", *("--layers", "2", "3", "--prompts", "16", "--families", folder, "--no-remote"), out=tmp_path / "scale.json"
    )
    assert figures["ok"] and [row["layers"] for row in figures["rows"]] == [2, 3]
    for row in figures["rows"]:
        assert row["toy_heads_shifted"] and row["forwards"] > 0 and row["passes"] > 0, row
        assert row["family"] == folder and row["width"] == 4 and row["group_tests"] is None, row
    assert figures["prescreen"][folder]["live"] >= 2


def test_bridge_overhead_benchmark_variants_equal_hf(tmp_path, monkeypatch):
    """In this process: every variant of the forward (tlens with the bridge's own or HF's
    attention and norms, hooks through `bridge.hooks()` or direct; nnsight) gives HF's
    logits on the real tokens."""
    out = tmp_path / "overhead.json"
    args = ["bridge_overhead.py", "--layers", "2", "--prompts", "4", "--repeats", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", args)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    with pytest.raises(SystemExit) as exit_code:
        runpy.run_path(str(ROOT / "benchmarks" / "bridge_overhead.py"), run_name="__main__")
    assert exit_code.value.code == 0
    figures = json.loads(out.read_text())
    assert len(figures["max_abs_diff"]) == 7 and {"hf", "nnsight"} <= set(figures["max_abs_diff"])
    assert all(diff <= 1e-5 for diff in figures["max_abs_diff"].values()), figures
    assert all(seconds > 0 for seconds in figures["seconds"].values())


@pytest.mark.slow  # 10-17 s: run by `make test-slow` (CI), not `make test`
def test_mamba2_chunk_size_benchmark_gives_equal_tables(tmp_path):
    """Every chunk size's head table equals chunk 32's (the figures the performance page
    quotes compare the same numbers), and the table is not all zeros."""
    figures = run_benchmark(
        "mamba2_chunk_size", *("--chunk-sizes", "32", "64", "--prompts", "2", "--words", "6", "--repeats", "1"), out=tmp_path / "chunk.json"
    )
    assert [row["chunk_size"] for row in figures["rows"]] == [32, 64]
    assert figures["max_abs_score"] > 1e-3
    assert all(row["max_diff"] <= 1e-4 for row in figures["rows"]), figures["rows"]
    assert figures["rows"][1]["limit"] == 4.0  # 7 tokens: padded to 64 x 64 against 32 x 32


@pytest.mark.slow  # 10-17 s: run by `make test-slow` (CI), not `make test`
def test_ig_heads_gates_reproduce_the_sweep(monkeypatch):
    """`benchmarks/ig_heads.py` builds every estimate from per-row, per-head gates: moving one
    head's gate to 1 on every row must be `patching_sweep`'s effect of that head, and its
    gradient at 0 the first-order attribution."""
    import gna_interp as gna

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = runpy.run_path(str(ROOT / "benchmarks" / "ig_heads.py"))
    _, model, clean, corrupt, metric = bench["toy_case"]("falcon_h1", 4, 0)
    gates = bench["Gates"](model, clean, corrupt, metric)
    heads, n = gates.heads, len(gates.heads)
    exact = gna.patching_sweep(model, clean, corrupt, metric, progress=False).effects()
    first = gna.attribution_patching(model, clean, corrupt, metric).effects()
    m0, g0 = gates(torch.zeros(gates.rows, n))
    for column in (0, 5, n - 1):  # an attention head, an SSM head of layer 0, the last SSM head
        head = heads[column]
        moved = torch.zeros(gates.rows, n)
        moved[:, column] = 1.0
        effect = float((gates(moved, grad=False)[0] - m0).mean())
        assert abs(effect - float(exact[head.layer, head.head])) < 1e-4, (head, effect)
        assert abs(float(g0[:, column].mean()) - float(first[head.layer, head.head])) < 1e-4, head
    assert float(exact.abs().max()) > 0.1


# ----- the shared module --------------------------------------------------------------------------


@pytest.fixture
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return runpy.run_path(str(ROOT / "benchmarks" / "_common.py"))


def test_common_spearman_against_the_textbook_formula(common):
    """No ties: rho = 1 - 6 sum d^2 / (n (n^2 - 1)), d the rank differences (by hand here);
    NaN for a constant input; one implementation for every script."""
    a = torch.tensor([0.3, -1.0, 2.5, 0.7, 0.1])  # ranks 2 0 4 3 1
    b = torch.tensor([1.0, 0.2, 0.9, 3.0, -4.0])  # ranks 3 1 2 4 0
    d2 = sum((x - y) ** 2 for x, y in zip([2, 0, 4, 3, 1], [3, 1, 2, 4, 0], strict=True))
    assert common["spearman"](a, b) == pytest.approx(1 - 6 * d2 / (5 * 24), abs=1e-12)  # 0.6
    assert common["spearman"](a, -a) == pytest.approx(-1.0)
    assert math.isnan(common["spearman"](a, torch.ones(5)))
    for script in (ROOT / "benchmarks").glob("*.py"):
        text = script.read_text()
        assert "def spearman" not in text or script.name == "_common.py", script.name
        assert "sys.path" not in text.replace("``sys.path``", ""), script.name


def test_common_best_of_and_json(common, tmp_path):
    calls = []
    best, result = common["best_of"](lambda: calls.append(1) or len(calls), 3)
    assert calls == [1] * 4 and result == 4 and 0 <= best < 1  # one warm-up, three timed
    order = []
    best, results = common["best_of_each"]({"a": lambda: order.append("a") or 1, "b": lambda: order.append("b") or 2}, 2, alternate=True)
    assert order == ["a", "b", "a", "b", "b", "a"] and results == {"a": 1, "b": 2} and set(best) == {"a", "b"}
    common["write_json"](tmp_path / "f.json", {"x": [1.5, None]})
    assert json.loads((tmp_path / "f.json").read_text()) == {"x": [1.5, None]}
    args = common["parser"]("Title.\n\nMore.", threads=1, repeats=2).parse_args(["--json", str(tmp_path / "g.json")])
    assert (args.threads, args.repeats, args.json) == (1, 2, tmp_path / "g.json")


def test_private_imports_are_named_in_the_script():
    """Every import of a gna_interp internal (not the top level or a public subpackage's
    names) sits under a comment starting "Private" that says why."""
    import re

    for script in (ROOT / "benchmarks").glob("*.py"):
        lines = script.read_text().splitlines()
        for i, line in enumerate(lines):
            private = re.match(r"\s*from gna_interp\.(\w+(?:\.\w+)+) import", line)
            if private:
                above = "\n".join(lines[max(0, i - 12) : i])
                assert "# Private" in above, (script.name, line)


@pytest.mark.slow
def test_circuit_scores_benchmark_reproduces_discovers_score(tmp_path):
    """The discover row is `circuit_score` of discovery's own ranking again (the same CPR as
    ``circuit.score``, which it reads its ranking from); every row runs from f = 0 at no head to
    f = 1 at all of them, and the areas lie within their ranges."""
    figures = run_benchmark("circuit_scores", "--toys", "llama", "--prompts", "16", "--edges", out=tmp_path / "scores.json")
    rows = {row["ranking"]: row for row in figures["rows"]}
    assert set(rows) == {
        "discover",
        "discover, how=mean",
        "discover, how=zero",
        "attribution_patching",
        "patching_sweep (noise)",
        "edge_attribution",
    }
    for row in rows.values():
        assert row["f"][0] == 0.0 and row["f"][-1] == 1.0 and row["sizes"][0] == 0
        assert row["cmd"] >= 0 and row["cpr"] + row["cmd"] >= 1 - 1e-9  # |1 - f| >= 1 - f, integrated over [0, 1]
    assert rows["edge_attribution"]["unit"] == "edge" and rows["discover"]["sizes"] == [0, 1, 4, 8]
    found = rows["discover"]
    assert found["cpr"] == pytest.approx(found["circuit.score cpr"], abs=1e-9) and found["cmd"] == pytest.approx(
        found["circuit.score cmd"], abs=1e-9
    )


@pytest.mark.slow
def test_discovery_passes_benchmark_attributes_every_forward(tmp_path):
    """Per stage, the passes are `discover`'s own (``cost["stages"]``, summing to its total);
    the suffix estimate lies between 0 and the final-position-only one, and that at most at the
    passes; a stage with no edited forward (the baseline) and the head scan (each head ablated
    at every position) keep all of their passes; the estimate saves somewhere on a deep toy."""
    figures = run_benchmark("discovery_passes", "--models", "deep_mamba2", "--depth", "4", "--prompts", "24", out=tmp_path / "passes.json")
    (result,) = figures["results"]
    stages = {row["stage"]: row for row in result["stages"]}
    assert sum(row["passes"] for row in stages.values()) == pytest.approx(result["passes"])
    assert sum(row["suffix"] for row in stages.values()) == pytest.approx(result["suffix"])
    for row in stages.values():
        assert 0 <= row["suffix"] <= row["suffix_final"] + 1e-12 and row["suffix_final"] <= row["passes"] + 1e-12, row
    assert stages["baseline"]["suffix"] == stages["baseline"]["passes"] > 0
    assert stages["head_scan"]["suffix"] == pytest.approx(stages["head_scan"]["passes"]) and stages["head_scan"]["passes"] > 0
    assert stages["confirm: MIB score"]["passes"] > 0 and "confirm" not in stages  # the confirmation by its parts
    assert result["suffix"] < result["passes"]


def test_the_suffix_bound_starts_at_the_first_edited_position(monkeypatch):
    """`first_edited` on plans built by hand: the earliest True column over rows and heads; a
    broadcast or position-free mask, a skip, no edit, or a mask with no True: 0."""
    from gna_interp.core.plan import Edit, Plan, Site, SiteKind

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    first_edited = runpy.run_path(str(ROOT / "benchmarks" / "discovery_passes.py"))["first_edited"]
    mask = torch.zeros(3, 12, 4, 1, dtype=torch.bool)
    mask[2, 9, 1] = mask[1, 5, 3] = True
    plan = Plan()
    plan.add(Site(SiteKind.HEADS, 1), Edit(mask, torch.zeros(())))
    assert first_edited(plan, 12) == 5
    later = torch.zeros(3, 12, 4, 1, dtype=torch.bool)
    later[0, 11] = True
    plan.add(Site(SiteKind.HEADS, 2), Edit(later, torch.zeros(())))
    assert first_edited(plan, 12) == 5
    assert first_edited(Plan(), 12) == 0
    nothing = Plan()
    nothing.add(Site(SiteKind.HEADS, 1), Edit(torch.zeros(3, 12, 4, 1, dtype=torch.bool), torch.zeros(())))
    assert first_edited(nothing, 12) == 0  # edits no position: counted whole, as a clean forward
    broadcast = Plan()
    broadcast.add(Site(SiteKind.HEADS, 1), Edit(torch.ones(1, 1, 4, 1, dtype=torch.bool), torch.zeros(())))
    assert first_edited(broadcast, 12) == 0
    skipped = Plan()
    skipped.add(Site(SiteKind.HEADS, 1), Edit(mask, torch.zeros(())))
    skipped.add_skip(0, torch.ones(3, dtype=torch.bool))
    assert first_edited(skipped, 12) == 0
