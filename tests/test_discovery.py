"""G&A discovery on the bundled toy models: found heads re-measured independently through
`evaluate` and `attention_pattern`; JSON round trip; the offline report; bad input."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.discovery import GnaCircuit, NoRetrievalWarning, PositionalAnswerWarning, discover
from gna_interp.scoring.verdicts import MECHANISMS, label_verdict

from .toy_circuits import TASK_SEED, TOYS, discovered

POSITIONAL_WARNINGS: dict[str, list] = {}  # per toy: the PositionalAnswerWarnings its discovery raised


@pytest.fixture(scope="module", params=TOYS)
def found(request):
    model, task, circuit, positional = discovered(request.param)  # shared with test_report
    POSITIONAL_WARNINGS[request.param] = list(positional)
    return model, task, circuit


# Acceptance lines the bundled toy models do not meet, as measured (see docs/records/discovery.md).
# Strict: the test fails once the gap closes, so this list must then be updated.
KNOWN_GAPS: dict[tuple[str, str], str] = {}
PATTERN_GAPS: dict[tuple[str, str], str] = {  # since the pattern must clear its thresholds (issue 32), on seed 4242
    ("llama", "gather"): "L0H1's segment-end rows favour their own segment, not clearly: gather ratio 1.39 < 1.5",
    ("mamba2", "gather"): "L0H1's segment-end rows favour their own segment, not clearly: gather ratio 1.33 < 1.5",
    ("mamba2", "aggregate"): "L1H6's final row prefers the correct option, not clearly: lift 1.12 < 1.5",
}


def test_both_roles_found_and_the_bottleneck_reproduced(found):
    model, task, circuit = found
    assert circuit.gather and circuit.aggregate, circuit.summary()
    clean = gna.evaluate(model, task).accuracy
    assert clean >= 0.95
    found_heads = [*circuit.gather, *circuit.aggregate]
    single = {h: gna.evaluate(model, task, [gna.Ablate([h])]).accuracy for h in found_heads}
    assert min(single.values()) <= 0.40, single
    # the circuit's own accuracy table is what evaluate measures
    assert circuit.accuracy["-aggregate"] == pytest.approx(gna.evaluate(model, task, [gna.Ablate(circuit.aggregate)]).accuracy)
    assert circuit.accuracy["-gather"] == pytest.approx(gna.evaluate(model, task, [gna.Ablate(circuit.gather)]).accuracy)
    assert circuit.accuracy["clean"] == pytest.approx(clean)


@pytest.mark.parametrize("role", ["gather", "aggregate"])
def test_each_role_ablated_together_collapses(found, role, request):
    """At most 6 heads of the role, ablated together, bring accuracy to 35% or less (the
    counting Mamba-2's Gather needs 6 in the ordered joint search, 5 in the greedy one)."""
    model, task, circuit = found
    gap = KNOWN_GAPS.get((model.arch.family, role))
    if gap:
        request.applymarker(pytest.mark.xfail(strict=True, reason=gap))
    heads = circuit.needs[role].heads
    assert 1 <= len(heads) <= 6
    assert gna.evaluate(model, task, [gna.Ablate(heads)]).accuracy <= 0.35, circuit.summary()


def test_roles_follow_where_the_effect_enters(found):
    """Re-measured: an Aggregate head ablated only at the final position, and a Gather
    head ablated only on the segment tokens, reproduce at least half of its effect.

    Heads the joint search added are labelled by their effect within the role's set
    (alone, such a head may act elsewhere, e.g. at the final position; the set collapsing
    accuracy at the role's positions holds by construction). For each, its marginal
    effect in the set, with the rest of the set ablated in the same places, must enter at
    the role's positions: at least half of its marginal effect when everything is ablated
    everywhere, and more than nothing."""
    model, task, circuit = found
    clean = gna.evaluate(model, task).accuracy
    encoded = task.encode()
    cols = torch.arange(encoded.batch.n_pos)
    segments = ((cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2])).any(1)
    for role, heads, positions in (("aggregate", circuit.aggregate, encoded.final), ("gather", circuit.gather, segments)):
        for head in heads:
            if circuit.evidence(head).joint:
                continue
            whole = clean - gna.evaluate(model, task, [gna.Ablate([head])]).accuracy
            there = clean - gna.evaluate(model, task, [gna.Ablate([head], positions=positions)]).accuracy
            assert there >= 0.5 * whole, (role, head, there, whole)
        together = circuit.needs[role].heads

        def without(heads, where=None):
            return gna.evaluate(model, task, [gna.Ablate(heads, positions=where)] if heads else []).accuracy

        joint = [h for h in together if circuit.evidence(h).joint]
        set_there, set_whole = (without(together, positions), without(together)) if joint else (None, None)
        for head in joint:
            rest = [h for h in together if h != head]
            there = without(rest, positions) - set_there
            whole = without(rest) - set_whole
            assert there >= 0.5 * whole and there > 0, (role, head, there, whole)
    # the recorded entry accuracies, segment ends included, are these same measurements
    for head in circuit.gather[:2]:
        entry = circuit.evidence(head).entry
        assert entry is not None
        for where, positions in (("final", encoded.final), ("segments", segments), ("ends", encoded.segment_ends)):
            assert entry[where] == pytest.approx(gna.evaluate(model, task, [gna.Ablate([head], positions=positions)]).accuracy)


def _masks(encoded, n_pos):
    cols = torch.arange(n_pos)
    own = (cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2] - 1)  # label..text, "\n" excluded
    with_end = (cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2])
    return own, with_end


def test_role_labels_agree_with_the_patterns(found):
    """Recomputed here from raw patterns, with the thresholds docs/discovery.md states (the
    defaults of `RoleThresholds`): a Gather head's segment-end rows put at least 1.5x a
    uniform row's mass on their own segment; an Aggregate head's final row puts at least 0.3
    on the options, at least 1.5x as much on a slot when it holds the correct option as when
    it does not (lift), and a share of its option mass on the correct option at least 0.05
    above 1 / options (selectivity). The circuit records the agreement head by head,
    truthfully, and a Gather head's pattern shows its role in every toy."""
    model, task, circuit = found
    encoded = task.encode()
    own, with_end = _masks(encoded, encoded.batch.n_pos)
    n = 64
    first_real = encoded.batch.attention_mask.long().argmax(1)
    agrees = {}
    for head in circuit.gather:
        rows = gna.attention_pattern(model, task, [head], query_positions=encoded.segment_ends)[:n, 0].abs()
        p = rows / rows.sum(-1, keepdim=True)
        inside = (p * own[:n]).sum(-1)  # [prompt, segment]
        uniform = own[:n].sum(-1) / (encoded.segment_ends[:n] - first_real[:n, None] + 1)
        agrees[head] = float((inside / uniform).mean()) >= 1.5
    correct = encoded.correct[:n]
    for head in circuit.aggregate:
        row = gna.attention_pattern(model, task, [head], query_positions=[-1])[:n, 0, 0].abs()
        p = row / row.sum(-1, keepdim=True)
        per_option = (p[:, None, :] * with_end[:n]).sum(-1)  # [prompt, option]
        total = per_option.sum(-1)
        on_correct = per_option[torch.arange(n), correct]
        selectivity = float((on_correct / total).mean())
        slots = [j for j in range(task.n_segments) if 0 < int((correct == j).sum()) < n]
        when_correct = sum(float(per_option[correct == j, j].mean()) for j in slots)
        when_not = sum(float(per_option[correct != j, j].mean()) for j in slots)
        lift = when_correct / when_not
        agrees[head] = float(total.mean()) >= 0.3 and lift >= 1.5 and selectivity >= 1 / task.n_segments + 0.05
    for head, value in agrees.items():
        assert circuit.evidence(head).pattern_agrees is value, head
    assert any(agrees[h] for h in circuit.gather), agrees


@pytest.mark.parametrize("role", ["gather", "aggregate"])
def test_every_found_heads_pattern_shows_its_role(found, role, request):
    """The acceptance line: every Gather head's segment-end rows favour their own segment,
    every Aggregate head's final row favours the correct option, clearly above chance
    (`pattern_agrees`, which test_role_labels_agree_with_the_patterns recomputes from raw
    patterns)."""
    model, _, circuit = found
    gap = PATTERN_GAPS.get((model.arch.family, role))
    if gap:
        request.applymarker(pytest.mark.xfail(strict=True, reason=gap))
    heads = circuit.gather if role == "gather" else circuit.aggregate
    assert all(circuit.evidence(head).pattern_agrees for head in heads), circuit.to_frame()[["head", "role", "pattern_agrees"]]


def test_the_label_check_is_measured_independently(found):
    """``accuracy["shuffled_labels"]`` equals `evaluate` on `shuffle_labels(task)` (whose
    prompts test_tasks checks line by line), and the warning fires exactly when that is
    near chance. A toy trained with its labels in order answers by the option's place
    and falls to chance; one trained on shuffled labels reads them and does not."""
    model, task, circuit = found
    relabelled = gna.evaluate(model, gna.tasks.shuffle_labels(task))
    shuffled = relabelled.accuracy
    assert circuit.accuracy["shuffled_labels"] == pytest.approx(shuffled)
    clean = gna.evaluate(model, task)
    verdict = label_verdict(clean.is_correct, relabelled.is_correct, clean.chance, circuit.settings["chance_margin"])[0]
    assert circuit.verdicts["labels"] == verdict and circuit.mechanism == MECHANISMS[verdict.word]
    near_chance = verdict.word == "by place"
    assert near_chance or verdict.word == "by label", verdict.text  # each toy settled on 200 prompts
    name = model.name.removeprefix("toy-")
    assert bool(POSITIONAL_WARNINGS[name]) == near_chance
    assert any("labels shuffled" in note for note in circuit.warnings) == near_chance
    trained_on_shuffled_labels = gna.toy_card(name).get("task", {}).get("shuffle_labels", False)  # older cards: in order
    assert near_chance is not trained_on_shuffled_labels, shuffled


def test_json_round_trip(found, tmp_path):
    circuit = found[2]
    assert GnaCircuit.from_json(circuit.to_json()) == circuit
    circuit.to_json(tmp_path / "c.json")
    assert GnaCircuit.from_json(tmp_path / "c.json") == circuit
    frame = circuit.to_frame()
    assert set(frame["head"]) == {str(e.head) for e in circuit.heads}


def test_bad_input():
    model = gna.load_toy("mamba2_counting")
    one_option = gna.tasks.toy_mcq(4, n_options=2).examples
    no_segments = gna.tasks.Task("flat", [gna.tasks.Example("Query: apple\nAnswer:", (), 0, (" A",))], tokenizer=gna.tasks.toy_tokenizer())
    with pytest.raises(ValueError, match="has 0 segment"):
        discover(model, no_segments, progress=False)
    with pytest.raises(ValueError, match="unknown stages"):
        discover(model, gna.tasks.Task("t", one_option), stages=["heads", "vibes"])
    with pytest.raises(TypeError, match="expected a gna_interp Task with prompts and answers"):
        discover(model, ["Query: apple"])
    with pytest.raises(ValueError, match="layer 5 out of range"):
        discover(model, gna.tasks.toy_mcq(4), layers=[5])


@pytest.mark.slow
def test_progress_false_draws_no_bars(capfd):
    """``progress=False`` silences every bar, also the per-evaluation ones that `evaluate`
    draws by default for tasks of more than 4 batches (as this one is: the control)."""
    from gna_interp.zoo.card import ablation_facts

    model, task = gna.load_toy("llama"), gna.tasks.toy_mcq(300, seed=3, **gna.toy_card("llama")["task"])
    gna.evaluate(model, task)
    assert "evaluate" in capfd.readouterr().err
    discover(model, task, progress=False)
    ablation_facts(model, task, progress=False)
    assert capfd.readouterr().err == ""


def test_near_chance_warns(tmp_path):
    random_model = gna.load(gna.models.tiny.tiny_model("mamba2", seed=0, vocab_size=192), tokenizer=gna.tasks.toy_tokenizer())
    with pytest.warns(NoRetrievalWarning, match="near chance"):
        circuit = discover(random_model, gna.tasks.toy_mcq(40, seed=1), stages=["truncation"], search_at_chance=True, progress=False)
    assert circuit.warnings and circuit.truncation is not None and len(circuit.truncation) == random_model.n_layers


def test_multi_token_candidates_fall_back_to_the_patterns():
    """Candidates of several tokens are scored over re-padded batches, where positions
    move: no entry or joint stage, labels from the patterns, needs from the role's heads."""
    import dataclasses

    base = gna.toy_task("mamba2_counting", 40, seed=TASK_SEED)
    examples = [dataclasses.replace(e, candidates=tuple(c + " ." for c in e.candidates)) for e in base.examples]
    task = gna.tasks.Task("toy_multi", examples, tokenizer=gna.tasks.toy_tokenizer())
    assert not task.encode().single_token
    circuit = discover(gna.load_toy("mamba2_counting"), task, stages=["heads", "entry", "roles", "joint", "confirm"], progress=False)
    assert all(item.entry is None and not item.joint for item in circuit.heads)
    for role, need in circuit.needs.items():
        assert need.heads == getattr(circuit, role)[: len(need.heads)]


def test_old_json_without_new_fields_loads(found):
    data = json.loads(found[2].to_json())
    for item in data["heads"]:
        for key in ("entry", "pattern_agrees", "joint", "kind"):
            item.pop(key)
        if item["scores"] is not None:
            item["scores"].pop("gather_ratio")
    circuit = GnaCircuit.from_json(json.dumps(data))
    assert all(item.scores is None or item.scores.gather_ratio != item.scores.gather_ratio for item in circuit.heads)


def test_joint_search_equals_a_brute_force_greedy():
    """`joint_set` against a loop written here: every step tries every remaining head."""
    from gna_interp.discovery.joint import joint_set

    model = gna.load_toy("mamba2_counting")
    task = gna.toy_task("mamba2_counting", 60, seed=77)
    pool = [gna.Head(1, h) for h in range(8)]
    final = task.encode().final
    chosen, accuracy, reached = joint_set(model, task, pool, final, threshold=0.3, max_heads=3, progress=False)

    expected: list[gna.Head] = []
    current = gna.evaluate(model, task).accuracy
    for _ in range(3):
        trials = [(gna.evaluate(model, task, [gna.Ablate([*expected, h], positions=final)]).accuracy, h) for h in pool if h not in expected]
        best_accuracy, best = min(trials)
        if best_accuracy >= current:
            break
        expected.append(best)
        current = best_accuracy
        if current <= 0.3:
            break
    assert chosen == expected
    assert accuracy == pytest.approx(current)
    assert reached == (current <= 0.3)


def test_a_measured_label_is_never_overridden_by_the_heads_order(monkeypatch):
    """No structural rule (a Gather head before every Aggregate head) overrides a measured
    label: `stages.role_stage` gives each harmful head `roles.label`'s word, whatever the
    heads' positions; here a layer-0 Aggregate label beside a layer-0 and a layer-1 Gather
    label, which the old rule (`gather_before_aggregate`) dropped, and a head that is not
    harmful keeps no label."""
    from types import SimpleNamespace

    from gna_interp.discovery import stages
    from gna_interp.discovery.evidence import HeadEvidence

    words = {gna.Head(0, 0): "gather", gna.Head(0, 2): "aggregate", gna.Head(1, 1): "gather", gna.Head(1, 3): "aggregate"}
    monkeypatch.setattr(stages, "label", lambda scores, thresholds, shares: scores)  # each head's "scores" is its word
    monkeypatch.setattr(stages, "pattern_agrees", lambda *args: None)
    ctx = SimpleNamespace(thresholds=None, task=SimpleNamespace(n_segments=4))
    evidence = {h: HeadEvidence(h, None, 0.5, True) for h in words}
    harmful = [h for h in words if h != gna.Head(1, 3)]
    out = stages.role_stage(ctx, evidence, harmful=harmful, measured=dict(words), clean=1.0)
    assert {h: e.role for h, e in out.items()} == {h: (w if h in harmful else None) for h, w in words.items()}
    assert all(e.role is None for e in evidence.values())  # the stage's own copies


PREDECESSOR_GAPS = {  # what docs/records/discovery.md says the bundled toys' predecessors miss
    "llama_4heads": ("aggregate", "L1H3"),  # closed by pruning (`llama`)
    "mamba2_8heads": ("aggregate", "L1H6"),  # closed by pruning (`mamba2_query_first`)
    "mamba2_query_first": ("gather", "L0H0"),  # closed by the query-last task (`mamba2`)
}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PREDECESSOR_GAPS if n in gna.toy_names()])
def test_the_predecessor_toys_miss_the_lines_the_bundled_ones_close(name):
    """Why the bundled `llama` and `mamba2` are what they are, re-measured. In the unpruned
    toys an Aggregate head's final row does not favour the correct option, and the
    Llama's Aggregate heads ablated together leave more than 0.35. In the pruned
    query-first Mamba-2, the critical Gather head's segment-end rows look outside their
    own segment (it moves the query into the options)."""
    model, task = gna.load_toy(name), gna.toy_task(name, 200, seed=TASK_SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PositionalAnswerWarning)
        circuit = discover(model, task, progress=False)
    role, head = PREDECESSOR_GAPS[name]
    assert gna.Head.parse(head) in getattr(circuit, role), circuit.summary()
    assert circuit.evidence(gna.Head.parse(head)).pattern_agrees is False
    together = gna.evaluate(model, task, [gna.Ablate(circuit.needs["aggregate"].heads)]).accuracy
    assert (together > 0.35) is (name == "llama_4heads"), together
