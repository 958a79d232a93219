"""The kinds check (issue 52, item 5): the circuit's role sets ablated by mean and resample
ablation after the confirmation, and the bootstrap resamples' membership frequencies.

References: `gna.evaluate` with the same `Ablate(heads, how=...)` run directly, Wilson's
`collapse_verdict` on its per-prompt correctness, the JSON round trips of the circuit and of
the stage's record, and (slow) `discover` run by hand on the same bootstrap resamples."""

from __future__ import annotations

import dataclasses
import html
import re
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaValueError
from gna_interp.core.heads import Head
from gna_interp.core.interventions import Ablate
from gna_interp.discovery import DiscoverySettings, ablation_kinds
from gna_interp.discovery.circuit import STABLE_FREQUENCY, GnaCircuit, unstable_heads
from gna_interp.discovery.evidence import Stability
from gna_interp.discovery.pipeline import discover_records
from gna_interp.discovery.records import record_from_dict, record_to_dict
from gna_interp.discovery.stage_records import KindsRecord
from gna_interp.scoring.verdicts import collapse_verdict
from gna_interp.tasks.base import Task
from gna_interp.viz.report import write_report
from gna_interp.viz.report_html import DASH
from gna_interp.viz.report_rows import kinds_rows

N = 24


@pytest.fixture(scope="module")
def checked():
    model, task = gna.load_toy("llama"), gna.toy_task("llama", N, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        circuit, records = discover_records(model, task, ablation_kinds=("mean", "resample"))
    return model, task, circuit, records


def test_the_kinds_accuracies_are_evaluate_with_the_same_ablation(checked):
    """Every accuracy of the check is `evaluate`'s with the same `Ablate` run directly: mean
    over the task's own tokens, resample from its corrupted prompts; at every position and at
    the set's positions (Gather: the segment ends, Aggregate: the final position); and each
    verdict is Wilson's on `evaluate`'s per-prompt correctness."""
    model, task, circuit, _ = checked
    assert circuit.gather and circuit.aggregate
    encoded, corrupt = task.encode(), task.corrupted()
    sources = {"mean": task, "resample": corrupt}
    at = {"-gather": ("ends", encoded.segment_ends), "-aggregate": ("final", encoded.final)}
    sets = {"-gather": circuit.gather, "-aggregate": circuit.aggregate, "-both": [*circuit.gather, *circuit.aggregate]}
    assert circuit.settings["kinds_checked"] == {"kinds": ["zero", "mean", "resample"], "where": {"-gather": "ends", "-aggregate": "final"}}
    margin, chance = circuit.settings["chance_margin"], circuit.accuracy["chance"]
    for name, heads in sets.items():
        for kind, source in sources.items():
            direct = gna.evaluate(model, task, [Ablate(heads, how=kind, corrupt=source)], progress=False)
            assert circuit.accuracy[f"{name}@{kind}"] == pytest.approx(direct.accuracy, abs=1e-9), (name, kind)
            expected = collapse_verdict(direct.is_correct, chance, margin)
            verdict = circuit.verdicts[f"collapses:{name}@{kind}"]
            assert (verdict.word, verdict.interval) == (expected.word, pytest.approx(expected.interval)) and kind in verdict.kind
            if name in at:
                where, positions = at[name]
                there = gna.evaluate(model, task, [Ablate(heads, how=kind, corrupt=source, positions=positions)], progress=False)
                assert circuit.accuracy[f"{name}@{kind}:{where}"] == pytest.approx(there.accuracy, abs=1e-9)
        if name in at:
            zero = gna.evaluate(model, task, [Ablate(heads, positions=at[name][1])], progress=False).accuracy
            assert circuit.accuracy[f"{name}@zero:{at[name][0]}"] == pytest.approx(zero, abs=1e-9)
    # the kinds differ here: the test can tell them apart
    assert len({round(circuit.accuracy[k], 6) for k in ("-gather", "-gather@mean", "-gather@resample")}) == 3


def test_every_collapse_verdict_states_its_kind(checked):
    _, _, circuit, _ = checked
    collapse = {k: v for k, v in circuit.verdicts.items() if k.startswith("collapses:")}
    assert collapse and all(any(kind in (v.kind or "") for kind in ablation_kinds.KINDS) for v in collapse.values()), collapse


def test_the_summary_and_the_report_say_which_sets_hold_under_which_kinds(checked):
    """A set holds under a kind exactly when its verdict at every position collapses: the
    summary's line and the report's row list those kinds, with the accuracies."""
    _, _, circuit, _ = checked
    summary, rows = circuit.summary(), {r["set"]: r for r in kinds_rows(circuit)}
    assert set(rows) == {"-gather", "-aggregate", "-both"}
    for name, row in rows.items():
        held = [k for k in ablation_kinds.KINDS if circuit.verdicts[f"collapses:{ablation_kinds.key(name, k)}"].word == "collapses"]
        assert row["holds under"] == (", ".join(held) or "none")
        assert f"{name}: zero {circuit.accuracy[name]:.3f}" in summary and f"holds under {', '.join(held) or 'none'}" in summary
        assert row["mean, every position"] == circuit.accuracy[f"{name}@mean"]
    assert "@" not in summary.split("  accuracy  ")[1].splitlines()[0]  # the kinds are in their own lines


def test_the_kinds_survive_json_and_the_record_round_trips(checked):
    _, _, circuit, records = checked
    again = GnaCircuit.from_json(circuit.to_json())
    assert again.accuracy == circuit.accuracy and again.settings["kinds_checked"] == circuit.settings["kinds_checked"]
    assert {k: v.to_dict() for k, v in again.verdicts.items()} == {k: v.to_dict() for k, v in circuit.verdicts.items()}
    assert again.summary() == circuit.summary()
    record = records.of(KindsRecord)
    assert record.accuracy and record.cost["forwards"] > 0
    estimated = circuit.settings["estimate"]["stages"]["kinds"]  # 5 forwards a kind, 2 zero: 12
    assert estimated == 12.0 and estimated / 1.6 <= record.cost["block_rows"] / (N * 2) <= estimated * 1.6
    read = record_from_dict(record_to_dict(record), None)  # type: ignore[arg-type]
    assert read.accuracy == record.accuracy and read.settings == record.settings and read.note == record.note
    assert {k: v.to_dict() for k, v in read.verdicts.items()} == {k: v.to_dict() for k, v in record.verdicts.items()}


def test_the_check_is_off_by_default_and_refuses_unknown_kinds():
    assert DiscoverySettings().ablation_kinds == ()
    assert DiscoverySettings(ablation_kinds=["resample", "mean", "mean"]).ablation_kinds == ("resample", "mean")
    with pytest.raises(GnaValueError, match=r"ablation_kinds=.*'zero'"):
        DiscoverySettings(ablation_kinds=("zero",))
    with pytest.raises(GnaValueError, match="give one of the two"):
        gna.discover(gna.load_toy("llama"), gna.toy_task("llama", 8), resamples=2, stability=2, progress=False)


def test_heads_below_the_stable_frequency_are_marked(checked):
    """Membership frequencies of a `Stability` built by hand (a head in 3 of 4 samples is
    below 0.8; one in 4 of 4 is not): the summary and the report mark only the first."""
    _, _, circuit, _ = checked
    shown = copy_with_stability(circuit)
    kept, dropped = circuit.gather[0], circuit.gather[1]
    assert unstable_heads(shown) == {"gather": [(dropped, 0.75)]} and STABLE_FREQUENCY > 0.75
    assert f"unstable gather heads (in fewer than 80% of the samples): {dropped} 0.75" in shown.summary()
    assert str(kept) not in shown.summary().split("unstable gather heads")[1]
    from gna_interp.viz.report_context import stability_context

    rows = {r["head"]: r for r in stability_context(shown)["rows"]}
    assert rows[str(dropped)]["marked"] == "unstable: 0.75 < 0.80" and rows[str(kept)]["marked"] == DASH


def copy_with_stability(circuit: GnaCircuit) -> GnaCircuit:
    sets = [{"gather": list(circuit.gather), "aggregate": list(circuit.aggregate)} for _ in range(4)]
    sets[0]["gather"] = [h for h in circuit.gather if h != circuit.gather[1]]
    shape = (2, max(h.head for h in [*circuit.gather, *circuit.aggregate]) + 1)
    return dataclasses.replace(circuit, stability=Stability("bootstrap", [N] * 4, sets, shape, 0))


@pytest.mark.slow
def test_resamples_are_discover_on_bootstrap_resamples_by_hand():
    """``resamples=3``: each head's frequency is the share of three `discover` runs (the search
    stages, no label check) on the prompts drawn with replacement by seeds 0, 1, 2."""
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 24, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        circuit = gna.discover(model, task, resamples=3, progress=False)
        search = ("layers", "heads", "entry", "roles", "joint")
        counts = torch.zeros(2, model.n_layers, model.n_heads)
        for seed in range(3):
            rows = torch.randint(len(task), (len(task),), generator=torch.Generator().manual_seed(seed)).tolist()
            assert len(set(rows)) < len(rows)  # duplicates: a bootstrap resample
            drawn = Task(task.name, [task.examples[r] for r in rows], tokenizer=task.tokenizer, corrupter=task.corrupter)
            found = gna.discover(model, drawn, stages=search, check_labels=False, progress=False)
            for r, role in enumerate(("gather", "aggregate")):
                for head in getattr(found, role):
                    counts[r, head.layer, head.head] += 1
    assert circuit.stability is not None and circuit.stability.k == 3
    assert torch.equal(circuit.stability.frequency, counts / 3)
    assert any(h == Head(0, 0) for h in circuit.gather)


@pytest.mark.slow  # make test stays within 5 minutes; CI runs it in make test-slow
def test_the_report_folds_the_kinds_table(checked, tmp_path):
    """The page's kinds table: one row per set with the circuit's accuracies, at every position
    and at the set's positions, in the same columns for every set."""
    _, _, circuit, _ = checked
    page = html.unescape(write_report([(circuit, None, None)], tmp_path).read_text())
    table = re.search(r'<div data-role="kinds">(.*?)</table>', page, re.S).group(1)
    acc, cell = circuit.accuracy, '<td class="num">{:.3f}</td>'.format
    for name, where in (("-gather", "ends"), ("-aggregate", "final")):
        zero = cell(acc[name]) + cell(acc[f"{name}@zero:{where}"])
        mean = cell(acc[f"{name}@mean"]) + cell(acc[f"{name}@mean:{where}"])
        assert re.search(rf"<td>{name}</td><td>{where}</td>{zero}<td>[^<]*</td>{mean}", table), name
    assert f"<td>-both</td><td>{DASH}</td>{cell(acc['-both'])}<td>{DASH}</td>" in table
    assert kinds_rows(without_check(circuit)) == [] and kinds_rows(circuit)


def without_check(circuit: GnaCircuit) -> GnaCircuit:
    """The circuit without the check: its keys, verdicts and setting gone."""
    settings = {k: v for k, v in circuit.settings.items() if k != "kinds_checked"}
    accuracy = {k: v for k, v in circuit.accuracy.items() if "@" not in k}
    return dataclasses.replace(circuit, settings=settings, accuracy=accuracy)


def test_a_run_dir_resumes_with_the_check(tmp_path):
    """With the check on, a finished run's folder gives the same circuit without a forward,
    the kinds record read back from its JSON (reference: the run that wrote it)."""
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 16, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = gna.discover(model, task, ablation_kinds=("mean", "resample"), run_dir=tmp_path, progress=False)
        with gna.cost_meter(model) as spent:
            again = gna.discover(model, task, ablation_kinds=("mean", "resample"), run_dir=tmp_path, progress=False)
    assert spent.forwards == 0 and "-gather@resample" in first.accuracy
    assert again.accuracy == first.accuracy and again.settings["kinds_checked"] == first.settings["kinds_checked"]
    assert {k: v.to_dict() for k, v in again.verdicts.items()} == {k: v.to_dict() for k, v in first.verdicts.items()}
