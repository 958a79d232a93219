"""What discovery and its report may claim (issue 32, item 7): role labels and "pattern
shows the role" only with evidence clearly above chance, by thresholds the report states;
heads whose ablation alone changes nothing are members of a set; path-patching figures
with their share of the clean - corrupt gap; every accuracy with the positions it was
measured at; and the circuit's stability over prompt samples."""

from __future__ import annotations

import dataclasses
import html
import json
import re

import pytest
import torch

import gna_interp as gna
from gna_interp.discovery import (
    SEARCH_STAGES,
    GnaCircuit,
    HeadEvidence,
    RoleNeed,
    RoleScores,
    RoleThresholds,
    Stability,
    discover,
    prompt_samples,
    stability,
)
from gna_interp.discovery.roles import pattern_agrees, pattern_shortfall
from gna_interp.viz.report import write_report

from .toy_circuits import discovered

H = gna.Head.parse


def scores(**values: float) -> RoleScores:
    """Role scores, 0 where not given."""
    return RoleScores(**({f.name: 0.0 for f in dataclasses.fields(RoleScores)} | values))


# The demo's own figures (issue 32): Mamba-2's L1H6, the Llama's L1H0, FalconH1's L0H9.
MAMBA2_L1H6 = scores(aggregate_mass=0.745, selectivity=0.298, lift=1.115, uniform_ratio=1.254)
LLAMA_L1H0 = scores(aggregate_mass=0.613, selectivity=0.631, lift=6.114)
FALCON_L0H9 = scores(gather=0.0, gather_ratio=0.0)


def test_the_pattern_needs_its_scores_clearly_above_chance():
    """The thresholds docs/discovery.md states, applied to the issue's figures: Mamba-2's
    L1H6 (lift 1.12, selectivity 0.30 against chance 0.25) does not show the Aggregate role;
    the Llama's L1H0 does; FalconH1's L0H9 (gather ratio 0) does not show the Gather role."""
    t = RoleThresholds()
    assert (t.gather_ratio, t.aggregate_mass, t.lift, t.selectivity_margin) == (1.5, 0.3, 1.5, 0.05)
    assert pattern_shortfall("aggregate", MAMBA2_L1H6, t, 4) == ["lift 1.115 < 1.5", "selectivity 0.298 < chance 0.25 + 0.05"]
    assert pattern_agrees("aggregate", MAMBA2_L1H6, t, 4) is False
    assert pattern_shortfall("aggregate", LLAMA_L1H0, t, 4) == [] and pattern_agrees("aggregate", LLAMA_L1H0, t, 4) is True
    assert pattern_shortfall("gather", FALCON_L0H9, t, 4) == ["gather ratio 0.000 < 1.5"]
    assert pattern_agrees(None, LLAMA_L1H0, t, 4) is None
    # at the thresholds exactly, the pattern shows the role; just under, it does not
    edge = scores(aggregate_mass=0.3, lift=1.5, selectivity=0.25 + 0.05, gather_ratio=1.5)
    assert pattern_shortfall("aggregate", edge, t, 4) == [] and pattern_shortfall("gather", edge, t, 4) == []
    under = scores(aggregate_mass=0.299, lift=1.499, selectivity=0.299, gather_ratio=1.499)
    missed = ["aggregate mass 0.299 < 0.3", "lift 1.499 < 1.5", "selectivity 0.299 < chance 0.25 + 0.05"]
    assert pattern_shortfall("aggregate", under, t, 4) == missed
    # chance follows the number of options; the thresholds are the caller's
    assert pattern_shortfall("aggregate", MAMBA2_L1H6, t, 5) == ["lift 1.115 < 1.5"]  # 0.298 >= 0.20 + 0.05
    assert pattern_shortfall("aggregate", MAMBA2_L1H6, RoleThresholds(lift=1.1, selectivity_margin=0.04), 4) == []
    assert pattern_shortfall("aggregate", scores(aggregate_mass=1.0, lift=float("nan"), selectivity=0.9), t, 4) == ["lift nan < 1.5"]
    with pytest.raises(ValueError, match="role='vibes': expected 'gather' or 'aggregate'"):
        pattern_shortfall("vibes", LLAMA_L1H0, t, 4)


def falcon_like() -> GnaCircuit:
    """A circuit with FalconH1's cases from the demo (clean 0.990): L1H2 an Aggregate head
    outright; L1H1 and L1H9 in the Aggregate set with no effect alone (0.990), L1H9's pattern
    not showing it either; L0H0 a Gather head outright; L0H9 in the Gather set with a gather
    ratio of 0; L0H3 examined, no role; L1H4 in the set, not measured alone."""
    heads = [
        HeadEvidence(H("L0H0"), "gather", 0.790, True, scores(gather_ratio=2.733)),
        HeadEvidence(H("L0H3"), None, 0.990, True, scores(gather_ratio=0.037)),
        HeadEvidence(H("L0H9"), "gather", 0.710, True, FALCON_L0H9),
        HeadEvidence(H("L1H1"), "aggregate", 0.990, True, scores(aggregate_mass=0.834, selectivity=0.40, lift=1.9)),
        HeadEvidence(H("L1H2"), "aggregate", 0.850, True, scores(aggregate_mass=0.970, selectivity=0.338, lift=1.852)),
        HeadEvidence(H("L1H4"), "aggregate", None, False, scores(aggregate_mass=0.9, selectivity=0.5, lift=2.0)),
        HeadEvidence(H("L1H9"), "aggregate", 0.990, True, scores(aggregate_mass=0.430, selectivity=0.360, lift=0.749)),
    ]
    heads[3].joint = heads[6].joint = True
    return GnaCircuit(
        model="toy-falcon_h1",
        family="falcon_h1",
        task="toy_mcq",
        n_prompts=200,
        gather=[H("L0H0"), H("L0H9")],
        aggregate=[H("L1H2"), H("L1H1"), H("L1H9"), H("L1H4")],
        heads=heads,
        accuracy={"clean": 0.990, "chance": 0.25, "-gather": 0.25, "-aggregate": 0.54, "-both": 0.205},
        needs={"aggregate": RoleNeed([H("L1H2"), H("L1H1")], 0.54, False, [(H("L1H2"), 0.85), (H("L1H1"), 0.68)], "final")},
        settings={"thresholds": RoleThresholds().to_dict(), "pattern_prompts": 64, "chance_margin": 0.1},
        path_patching={"clean": 10.0, "corrupt": -10.0, "gather->aggregate": -8.6, "fraction_of_effect": 0.93},
        n_segments=4,
    )


def test_a_head_without_its_own_evidence_is_a_member_of_the_set():
    """Ablated alone, FalconH1's L1H1 and L1H9 leave the clean 0.990: each is a member of the
    Aggregate set, not an Aggregate head; L0H9's pattern does not gather: a member of the
    Gather set. Only heads with an effect alone and a pattern that shows the role have it
    outright, and the summary, the frame and the JSON say the same."""
    circuit = falcon_like()
    described = {str(h): circuit.standing(h).describe() for h in [*circuit.gather, *circuit.aggregate]}
    assert described == {
        "L0H0": "Gather",
        "L0H9": "member of the Gather set; pattern: not shown",
        "L1H2": "Aggregate",
        "L1H1": "member of the Aggregate set; alone: no effect",
        "L1H9": "member of the Aggregate set; alone: no effect; pattern: not shown",
        "L1H4": "member of the Aggregate set; alone: not measured",
    }
    assert circuit.standing(H("L0H3")) is None
    assert circuit.standing(H("L1H9")).describe(detail=True).endswith("pattern: not shown (lift 0.749 < 1.5)")
    assert circuit.outright("aggregate") == [H("L1H2")] and circuit.outright("gather") == [H("L0H0")]
    assert circuit.describe_role("aggregate") == (
        "outright: L1H2; members of the set only: L1H1 - alone: no effect; L1H9 - alone: no effect, pattern: not shown; "
        "L1H4 - alone: not measured"
    )
    summary = circuit.summary()
    assert "members of the set only: L0H9 - pattern: not shown" in summary
    assert "lift >= 1.5 (chance 1) and selectivity >= 0.30 (chance 0.25 + 0.05)" in summary
    assert "ablation alone lowers accuracy by at least 0.02" in summary
    frame = circuit.to_frame().set_index("head")
    assert frame.loc["L0H9", "standing"] == "member of the Gather set; pattern: not shown (gather ratio 0.000 < 1.5)"
    assert frame.loc["L1H2", "standing"] == "Aggregate" and frame.isna().loc["L0H3", "standing"]
    # the standing is read from the evidence: it survives the JSON, and stricter thresholds recorded there apply
    assert GnaCircuit.from_json(circuit.to_json()) == circuit
    strict = falcon_like()
    strict.settings["thresholds"] = RoleThresholds(lift=2.0).to_dict()
    assert strict.outright("aggregate") == [] and "lift 1.852 < 2" in strict.standing(H("L1H2")).describe(detail=True)
    # a circuit written before n_segments and the margin were recorded: chance from the accuracy table, default margin
    old = json.loads(circuit.to_json())
    del old["n_segments"], old["stability"], old["settings"]["thresholds"]["selectivity_margin"]
    loaded = GnaCircuit.from_json(json.dumps(old))
    assert loaded.n_segments is None and loaded.thresholds == RoleThresholds()
    assert [loaded.standing(h) for h in loaded.aggregate] == [circuit.standing(h) for h in circuit.aggregate]


def test_the_report_states_thresholds_standings_positions_and_path_shares(tmp_path):
    """The page of a circuit (no model: no patterns drawn) gives each head its standing, the
    thresholds with their values, where each accuracy was measured, and beside each path-
    patching logit difference its share of the clean - corrupt gap, (clean - value) /
    (clean - corrupt), computed here: (10 - (-8.6)) / 20 = 0.93."""
    circuit = falcon_like()
    page = html.unescape(write_report([(circuit, None, None)], tmp_path).read_text())
    examined = page[page.index('data-role="examined"') :]
    for head, text in (("L1H1", "member of the Aggregate set; alone: no effect"), ("L0H9", "member of the Gather set; pattern: not shown")):
        assert re.search(rf"<td>{head}</td><td>[^<]*</td><td>{re.escape(text)}( \(added by the joint search\))?</td>", examined), head
    assert "<td>no: gather ratio 0.000 < 1.5</td>" in examined and "<td>no: lift 0.749 < 1.5</td>" in examined
    assert "<td>L1H2</td><td>\u2014</td><td>Aggregate</td>" in examined
    evidence = re.search(r'<p class="caption" data-role="evidence">(.*?)</p>', page, re.S).group(1)
    stated = ["at least 0.02", "gather ratio >= 1.5", "aggregate mass >= 0.3", "lift >= 1.5", "selectivity >= 0.30 (chance 0.25 + 0.05)"]
    assert all(text in evidence for text in stated), evidence
    contrast = page[page.index('data-fold="roles"') :]  # the role table, folded below the models
    assert "<td>1 of 4: L1H2</td>" in contrast and "<td>3 of 4</td>" in contrast  # outright; pattern shows it (L1H9 does not)
    assert '<td>-aggregate</td><td>the Aggregate set (4 heads), at every position</td><td class="num">0.540</td>' in page
    shares = dict(re.findall(r"<tr><td>([^<]*)</td><td class=\"num\">-?[\d.]+</td><td class=\"num\">([\d.]+)</td></tr>", page))
    clean, corrupt, path = 10.0, -10.0, -8.6
    assert float(shares["clean, Gather heads corrupted, reaching the output only through the Aggregate heads"]) == pytest.approx(
        (clean - path) / (clean - corrupt), abs=5e-4
    )
    assert float(shares["clean prompts"]) == 0.0 and float(shares["corrupted prompts"]) == 1.0
    assert "aggregate (at the final position)" in page  # the curve's title says where it ablated


def test_each_need_figure_names_where_it_was_measured():
    """The figures of the issue ("gather needs 5 head(s) (0.330)" beside a table where six
    heads give 0.355), re-measured here: a need's accuracy is its heads ablated at every
    position; the joint search's last step, its heads ablated only on the segments (or at
    the final position); the table's ``-gather``, the whole set at every position."""
    model, task, circuit, _ = discovered("mamba2_counting")
    encoded = task.encode()
    cols = torch.arange(encoded.batch.n_pos)
    where = {
        "on the segments": ((cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2])).any(1),
        "at the final position": encoded.final,
    }
    for role, need in circuit.needs.items():
        text = need.describe(role)
        found = re.fullmatch(rf"{role} needs (\d+) head\(s\): ([\d.]+) with them ablated at every position \((not )?to chance\)(.*)", text)
        assert found and int(found.group(1)) == len(need.heads), text
        everywhere = gna.evaluate(model, task, [gna.Ablate(need.heads)]).accuracy
        assert float(found.group(2)) == pytest.approx(everywhere, abs=5e-4)
        joint = re.fullmatch(r"; ([\d.]+) where the joint search ablated them, (on the segments|at the final position)", found.group(4))
        assert joint, text  # the toy's roles both come from the joint search
        there = gna.evaluate(model, task, [gna.Ablate(need.heads, positions=where[joint.group(2)])]).accuracy
        assert float(joint.group(1)) == pytest.approx(there, abs=5e-4)
    whole = gna.evaluate(model, task, [gna.Ablate(circuit.gather)]).accuracy
    assert circuit.accuracy["-gather"] == pytest.approx(whole)
    assert "(-gather, -aggregate, -both, only_gna: their heads ablated at every position)" in circuit.summary()


def test_the_demo_printout_says_where_and_how_sure(demo_run):
    """The demo's lines: each role's heads outright and members, each need with its
    positions, the path with its share, the thresholds, all as the JSON it wrote records."""
    result, report = demo_run
    out = result.stdout
    assert "-gather, -aggr, -both: accuracy with every head of the set(s) ablated at every position" in out
    assert "evidence: a head has its role outright when its ablation alone lowers accuracy by at least 0.02" in out
    for file in sorted(report.glob("*.json")):
        circuit = GnaCircuit.from_json(file)
        for role, need in circuit.needs.items():
            named = circuit.role_name(role)
            line = f"{circuit.model}: {named} needs {len(need.heads)} head(s): {need.accuracy:.3f} with them ablated at every position"
            assert line in out, line
        for role in ("gather", "aggregate"):
            if getattr(circuit, role):
                assert f"{circuit.model}: {circuit.role_name(role)} {circuit.describe_role(role)}" in out
        if circuit.path_patching is not None:
            share = circuit.path_patching["fraction_of_effect"]
            assert re.search(rf"{re.escape(circuit.model)}: path patching .*\({share:.2f} of the clean - corrupt gap\)", out)


# ----- stability ----------------------------------------------------------------------


def test_prompt_samples_are_seeded_draws_with_replacement():
    task = gna.toy_task("llama", 30, seed=5)
    samples = prompt_samples(task, 3, seed=7)
    assert [len(s) for s in samples] == [30, 30, 30]
    for i, sample in enumerate(samples):
        rows = torch.randint(30, (30,), generator=torch.Generator().manual_seed(7 + i)).tolist()
        assert sample.examples == [task.examples[r] for r in rows]
        assert sample.tokenizer is task.tokenizer and sample.corrupter is task.corrupter
    assert len({tuple(e.text for e in s.examples) for s in samples}) == 3
    assert any(len(set(map(id, s.examples))) < 30 for s in samples)  # with replacement: a prompt drawn twice
    again = prompt_samples(task, 3, seed=7)
    assert [s.examples for s in again] == [s.examples for s in samples]


@pytest.fixture(scope="module")
def llama_samples():
    """The toy Llama, 40 prompts of its task, two bootstrap samples of them, and each
    sample's sets found here by `discover` alone (the search's stages, no label check)."""
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 40, seed=11)
    samples = prompt_samples(task, 2, seed=0)
    sets = []
    for sample in samples:
        found = discover(model, sample, stages=SEARCH_STAGES, check_labels=False, progress=False)
        sets.append({"gather": found.gather, "aggregate": found.aggregate})
    return model, task, samples, sets


def test_stability_counts_the_heads_each_sample_chooses(llama_samples):
    """Given sample tasks, `stability` re-runs the search on each and counts, per role and
    head, the samples that chose it: the same sets as `discover` on each sample, counted
    here head by head."""
    model, _, samples, sets = llama_samples
    result = stability(model, samples, progress=False)
    assert result.sets == sets and result.sampling == "tasks" and result.seed is None and result.n_prompts == [40, 40]
    expected = torch.zeros(2, model.n_layers, model.n_heads, dtype=torch.long)
    for chosen in sets:
        for r, role in enumerate(("gather", "aggregate")):
            for head in chosen[role]:
                expected[r, head.layer, head.head] += 1
    assert torch.equal(result.counts, expected) and expected.sum() > 0
    assert torch.equal(result.frequency, expected.float() / 2)
    assert result.sizes("gather") == [len(s["gather"]) for s in sets]
    frame = result.to_frame()
    assert set(frame["head"]) == {str(gna.Head(layer, head)) for layer, head in expected.sum(0).nonzero().tolist()}
    for _, row in frame.iterrows():
        head = H(row["head"])
        assert (row["gather"], row["aggregate"]) == (int(expected[0, head.layer, head.head]), int(expected[1, head.layer, head.head]))
        assert row["gather_share"] == row["gather"] / 2


def test_discover_records_its_stability_and_the_report_shows_it(llama_samples, tmp_path):
    """``discover(..., stability=2)``: two bootstrap samples (`prompt_samples`, seed 0) of its
    own task, searched with its own settings; recorded in the circuit, its JSON, its summary
    and the report's stability table."""
    model, task, _, sets = llama_samples
    circuit = discover(model, task, stages=[*SEARCH_STAGES, "confirm"], progress=False, stability=2)
    found = circuit.stability
    assert found is not None and found.sets == sets and found.sampling == "bootstrap" and found.seed == 0
    assert found.shape == (model.n_layers, model.n_heads) and found.seconds > 0
    assert GnaCircuit.from_json(circuit.to_json()) == circuit
    assert "stability over 2 bootstrap samples of 40 prompts:" in circuit.summary()
    page = html.unescape(write_report([(circuit, model, task)], tmp_path).read_text())
    table = re.search(r'<div data-role="stability">(.*?)</table>', page, re.S).group(1)
    assert "2 bootstrap samples of the task's prompts (40 each, drawn with replacement, seeds 0..1)" in table
    assert f"Gather set sizes {', '.join(str(len(s['gather'])) for s in sets)}" in table
    counts = found.counts
    for layer, head in counts.sum(0).nonzero().tolist():
        name = str(gna.Head(layer, head))
        cells = f"<td>{int(counts[0, layer, head])} of 2</td><td>{int(counts[1, layer, head])} of 2</td>"
        assert re.search(rf"<td>{name}</td><td>[^<]*</td>{cells}", table), name
    assert "Stability" not in html.unescape(write_report([(falcon_like(), None, None)], tmp_path / "none").read_text())


def test_stability_bad_input_and_progress(capfd):
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 12, seed=3)
    for bad in (1, 0, True, -2):
        with pytest.raises(ValueError, match=rf"stability={bad!r}: expected an int of at least 2 prompt samples"):
            discover(model, task, stability=bad, progress=False)
    with pytest.raises(TypeError, match=r"stability='abc': expected a number of prompt samples or a sequence of Task"):
        discover(model, task, stability="abc", progress=False)
    with pytest.raises(TypeError, match=r"stability\[1\] is a str: expected a gna_interp Task per sample"):
        discover(model, task, stability=[task, "x"], progress=False)
    with pytest.raises(ValueError, match=r"len\(stability\)=1: expected an int of at least 2"):
        discover(model, task, stability=[task], progress=False)
    with pytest.raises(ValueError, match=r"k=3 with 2 sample tasks given"):
        stability(model, [task, task], k=3)
    with pytest.raises(ValueError, match=r"k=1: expected an int of at least 2"):
        stability(model, task, k=1)
    with pytest.raises(TypeError, match=r"unknown discover settings \['max_heads'\]"):
        stability(model, task, k=2, max_heads=3)
    with pytest.raises(ValueError, match=r"k=1: expected an int of at least 2"):
        prompt_samples(task, 1)
    capfd.readouterr()
    quick = stability(model, task, k=2, stages=["heads"], progress=True)  # no roles: empty sets, one bar
    assert "stability" in capfd.readouterr().err
    assert quick.sets == [{"gather": [], "aggregate": []}] * 2 and quick.to_frame().empty
    stability(model, task, k=2, stages=["heads"], progress=False)
    assert capfd.readouterr().err == ""


def test_stability_round_trips_alone():
    found = Stability("bootstrap", [10, 10, 10], [{"gather": [H("L0H1")], "aggregate": [H("L1H0")]}] * 3, (2, 4), 0, 1.5)
    assert Stability.from_dict(json.loads(json.dumps(found.to_dict()))) == found
    assert found.counts[0, 0, 1] == 3 and found.counts[1, 1, 0] == 3 and int(found.counts.sum()) == 6
