"""Discovery at depth: a deep model that computes exactly a toy (`gna_interp.zoo.deep`) gives
the toy's circuit shifted to its layers, through the prescreen, with its cost recorded;
the role curves re-measured through `evaluate`; zero-ablation attribution exact where the
metric is linear in the heads."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaValueError
from gna_interp.cost import COUNTS, tally
from gna_interp.discovery import confirm, plan, stages
from gna_interp.patching.metrics import candidate_logit_diff
from gna_interp.viz.report_rows import cost_rows
from gna_interp.zoo.deep import deep_toy

from .test_attribution import _hf, _load, linear_tail

N_PROMPTS = 60


def _discover(model, task, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gna.discovery.PositionalAnswerWarning)
        return gna.discover(model, task, progress=False, **options)


@pytest.fixture(scope="module")
def toy_and_deep():
    task = gna.toy_task("llama", N_PROMPTS, seed=4242)
    toy = _discover(gna.load_toy("llama"), task)
    deep_model = deep_toy("llama", 8)
    deep = _discover(deep_model, task, prescreen_above=0)  # force the prescreen on 32 heads
    return task, toy, deep_model, deep


def test_the_deep_model_computes_the_toy():
    toy, deep = gna.load_toy("mamba2_counting"), deep_toy("mamba2_counting", 6, at=2)
    task = gna.toy_task("mamba2_counting", 8, seed=1)
    assert deep.n_layers == 6 and torch.equal(deep.logits(task), toy.logits(task))
    with pytest.raises(ValueError, match="at=5"):
        deep_toy("mamba2_counting", 6, at=5)
    with pytest.raises(ValueError, match="n_layers=1"):
        deep_toy("mamba2_counting", 1)


def test_discovery_at_depth_finds_the_toys_heads_shifted(toy_and_deep):
    _, toy, model, deep = toy_and_deep
    shift = 3  # layers 3, 4 of 8

    def moved(heads):
        return [gna.Head(h.layer + shift, h.head) for h in heads]

    assert deep.gather == moved(toy.gather) and deep.aggregate == moved(toy.aggregate)
    assert deep.accuracy == pytest.approx(toy.accuracy)
    for role, need in toy.needs.items():
        assert deep.needs[role].heads == moved(need.heads)
        assert deep.needs[role].accuracy == pytest.approx(need.accuracy)
        assert [a for _, a in deep.needs[role].curve] == pytest.approx([a for _, a in need.curve])
    # the prescreen measured the two toy layers' heads alone: the filler layers cost nothing when removed
    measured = {(layer, head) for layer, row in enumerate(deep.head_scan) for head, v in enumerate(row) if v is not None}
    assert measured == {(layer, head) for layer in (3, 4) for head in range(model.heads_per_layer[layer])}
    filler = [deep.attribution[layer][head] for layer in range(8) if layer not in (3, 4) for head in range(4)]
    assert filler == [0.0] * len(filler)  # their out-projections are zero: the estimate is exactly 0
    assert deep.layer_scan is not None and deep.truncation is not None


def test_the_cost_is_recorded_and_prefix_reuse_pays(toy_and_deep):
    """The circuit's cost: forwards, rows, block evaluations, passes, all consistent; a deep
    model costs fewer passes per layer than the toy (prefix reuse: the filler layers before
    the toy's are not run again), and the meter round-trips through JSON and the summary."""
    _, toy, _, deep = toy_and_deep
    for circuit, n_layers in ((toy, 2), (deep, 8)):
        cost = circuit.cost
        assert cost["n_layers"] == n_layers and cost["n_prompts"] == N_PROMPTS and cost["requests"] == 0
        assert cost["passes"] == pytest.approx(cost["block_rows"] / (N_PROMPTS * n_layers))
        assert cost["rows"] >= cost["forwards"] > 0 and cost["seconds"] > 0
        assert f"{cost['forwards']} forwards" in circuit.summary()
        assert gna.GnaCircuit.from_json(circuit.to_json()) == circuit
    assert deep.cost["backwards"] > 0 and toy.cost["backwards"] == 0  # the prescreen ran only on the deep model
    assert deep.cost["passes"] < toy.cost["passes"]


CONFIRM_PARTS = {
    "needs": [(stages, "confirm")],
    "spread check": [(stages, "spread_check")],
    "coverage": [(stages, "enter_spread"), (stages, "cover_collapses")],
    "table": [(stages, "confirm_table")],
    "path patching": [(confirm, "gather_to_aggregate")],
    "MIB score": [(confirm, "mib_score")],
}
"""Each part of the confirmation (`cost["confirm"]`) and the functions it runs."""


def test_each_stage_cost_is_what_a_meter_around_it_counts(monkeypatch):
    """``cost["stages"]``: per stage of the plan run, the counts of a cost meter the test opens
    around that stage alone (the reference), its passes from them; their sums are the totals.
    ``cost["confirm"]``: per part, the counts of meters the test opens around the functions
    that part runs (`CONFIRM_PARTS`), summing to its stage's. The report lists both, and they
    round-trip through JSON."""
    model, task = gna.load_toy("mamba2"), gna.toy_task("mamba2", 24, seed=5)
    counted: dict[str, dict[str, int]] = {}

    def metered(name, run):
        def wrapped(*args, **kwargs):
            with gna.cost_meter(model) as meter:
                out = run(*args, **kwargs)
            held = counted.setdefault(name, dict.fromkeys(COUNTS, 0))
            for k in COUNTS:
                held[k] += getattr(meter, k)
            return out

        return wrapped

    monkeypatch.setattr(plan, "PLAN", tuple(dataclasses.replace(step, run=metered(step.name, step.run)) for step in plan.PLAN))
    for part, functions in CONFIRM_PARTS.items():
        for module, name in functions:
            monkeypatch.setattr(module, name, metered(f"part {part}", getattr(module, name)))
    circuit = _discover(model, task)
    stages_run = circuit.cost["stages"]
    assert list(stages_run) == [name for name in counted if not name.startswith("part ")]
    assert list(stages_run) == [step.name for step in plan.PLAN][: len(stages_run)]
    for name, spent in stages_run.items():
        assert {k: spent[k] for k in COUNTS} == counted[name]
        assert spent["passes"] == pytest.approx(spent["block_rows"] / (len(task) * model.n_layers))
    for k in COUNTS:
        assert sum(spent[k] for spent in stages_run.values()) == circuit.cost[k]
    assert stages_run["head_scan"]["forwards"] > 0 and stages_run["confirm"]["passes"] > 1
    parts = circuit.cost["confirm"]  # the confirmation's parts: each what its functions ran, nothing left out
    assert {"needs", "table", "path patching", "MIB score"} <= set(parts)
    for part, spent in parts.items():
        assert {k: spent[k] for k in COUNTS} == counted[f"part {part}"], part
    for k in COUNTS:
        assert sum(part[k] for part in parts.values()) == stages_run["confirm"][k]
    assert parts["MIB score"]["forwards"] > 0 and parts["path patching"]["forwards"] > 0
    assert parts["MIB score"]["forwards"] != parts["path patching"]["forwards"]  # a swap of the two would show
    again = gna.GnaCircuit.from_json(circuit.to_json())
    assert again.cost["stages"] == stages_run and again.cost["confirm"] == parts
    row = next(r["value"] for r in cost_rows(circuit.cost) if r["what"].startswith("passes by stage"))
    assert f"head scan {stages_run['head_scan']['passes']:.1f}" in row and f"confirm {stages_run['confirm']['passes']:.1f}" in row
    row = next(r["value"] for r in cost_rows(circuit.cost) if r["what"].startswith("passes of the confirmation"))
    assert f"MIB score {parts['MIB score']['passes']:.1f}" in row


def test_tally_counts_its_block_alone_and_refuses_no_prompts():
    """`cost.tally` against a `cost_meter` around the same forwards; an exception inside still
    counts and detaches it; zero prompts is refused before anything runs."""
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 8, seed=1)
    into: dict[str, dict[str, float]] = {}
    with gna.cost_meter(model) as outer:
        with tally(model, into, "a", len(task)):
            model.logits(task)
        with pytest.raises(RuntimeError), tally(model, into, "a", len(task)):
            model.logits(task)
            raise RuntimeError("inside")
        model.logits(task)  # outside every part
    assert into["a"]["forwards"] == 2 == outer.forwards - 1 and into["a"]["block_rows"] == 2 * 8 * model.n_layers
    assert into["a"]["passes"] == pytest.approx(2.0) and model.backend._cost_meters == []
    with pytest.raises(GnaValueError, match="n_prompts=0"), tally(model, into, "b", 0):
        pass
    assert "b" not in into


def test_role_curves_are_what_evaluate_measures(toy_and_deep):
    """Each curve point: accuracy with the heads so far ablated at the curve's positions."""
    task, _, model, deep = toy_and_deep
    encoded = task.encode()
    cols = torch.arange(encoded.batch.n_pos)
    where = {"final": encoded.final, "segments": ((cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2])).any(1), "all": None}
    for role, need in deep.needs.items():
        assert [head for head, _ in need.curve] == need.heads
        for count, (_, accuracy) in enumerate(need.curve, start=1):
            ablate = gna.Ablate(need.heads[:count], positions=where[need.curve_positions])
            assert accuracy == pytest.approx(gna.evaluate(model, task, [ablate]).accuracy)
        assert str(need.heads[0]) in deep.summary().split(f"{role:9s} needs")[1]
    assert deep.settings["max_heads_per_role"] == 8


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "mamba2"])
def test_ablation_attribution_is_exact_where_the_metric_is_linear(tokenizer, name):
    """With the logits linear in the last layer's head outputs, the first-order estimate of
    zero-ablating each of them is the exact effect (`ablation_sweep`)."""
    model = _load(name, tokenizer, linear_tail(_hf(name)))
    last = [gna.Head(model.n_layers - 1, h) for h in range(model.n_heads)]
    metric = candidate_logit_diff([5, 6, 7], [0, 1, 2, 0])
    prompts = ["w5 w6 w7 w8", "w9 w10 w11 w12", "w13 w14 w15 w16", "w17 w18 w19 w20"]
    estimate = gna.patching.ablation_attribution(model, prompts, metric, heads=last)
    exact = gna.ablation_sweep(model, prompts, None, metric, heads=last, progress=False)
    assert estimate.kind == "attribution" and abs(estimate.baseline - exact.baseline) < 1e-4
    assert (exact.scores[-1] - exact.baseline).abs().max() > 1e-2  # the comparison is not vacuous
    assert torch.allclose(estimate.scores, exact.scores, atol=1e-4, equal_nan=True)
