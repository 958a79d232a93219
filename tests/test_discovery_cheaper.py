"""The joint search's ordered sets, the entry scan that measures what the labels read, and
the quiet heads a costly narrow layer clears together: each against a reference computed
here with `evaluate` (brute force) or with every measurement the old search made."""

from __future__ import annotations

import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaValueError
from gna_interp.discovery.entry import ENTRY_POSITIONS, entry_scan, segment_positions
from gna_interp.discovery.joint import ordered_set
from gna_interp.discovery.roles import entry_shares, label
from gna_interp.zoo.deep import deep_toy


@pytest.mark.parametrize("max_heads,threshold,min_drop", [(8, 0.35, 0.02), (3, 0.35, 0.02), (8, 0.05, 0.02), (8, 0.35, 0.1)])
def test_ordered_set_equals_a_loop_over_evaluate(max_heads, threshold, min_drop):
    """`ordered_set` against a loop written here with `evaluate` (no memo, no prefix cache):
    each head in order, kept if it lowers accuracy by ``min_drop``."""
    model = gna.load_toy("mamba2_counting")
    task = gna.toy_task("mamba2_counting", 60, seed=77)
    ranked = [gna.Head(1, h) for h in (6, 4, 3, 2, 1, 7, 0, 5)]
    segments = segment_positions(task.encode())
    clean = gna.evaluate(model, task).accuracy
    curve: list = []
    found = ordered_set(model, task, ranked, segments, threshold, max_heads, min_drop=min_drop, clean=clean, curve=curve, progress=False)

    kept: list = []
    current, steps = clean, []
    for head in ranked:
        if len(kept) >= max_heads or current <= threshold:
            break
        value = gna.evaluate(model, task, [gna.Ablate([*kept, head], positions=segments)]).accuracy
        if current - value >= min_drop:
            kept.append(head)
            current = value
            steps.append(value)
    assert found[0] == kept
    assert found[1] == pytest.approx(current)
    assert found[2] == (current <= threshold)
    assert [h for h, _ in curve] == kept
    assert [a for _, a in curve] == pytest.approx(steps)
    if (max_heads, threshold, min_drop) == (8, 0.35, 0.1):
        assert len(kept) < 4  # a drop of 0.1 passes heads over: the case tests the skip


@pytest.fixture(scope="module")
def deep_mamba2():
    return deep_toy("mamba2_counting", 9), gna.toy_task("mamba2_counting", 64, seed=4242)  # 72 heads: the prescreen runs


def _found(model, task, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the toy's spread roles warn
        return gna.discover(model, task, progress=False, **options)


@pytest.fixture(scope="module")
def both_searches(deep_mamba2):
    model, task = deep_mamba2
    return _found(model, task), _found(model, task, joint_search="greedy")


@pytest.mark.slow
@pytest.mark.slow  # the deep toy discovered twice: make test stays within 5 minutes
def test_the_entry_scan_measures_what_the_labels_read(deep_mamba2, both_searches):
    """Every label equals the label from all three position sets measured (here, with
    `evaluate`: each scanned head ablated only at the final position, only on the segment
    tokens, only at the segment ends, those masks built here from the encoded spans); the
    values the entry scan measured equal `evaluate`'s."""
    model, task = deep_mamba2
    circuit = both_searches[0]
    encoded = task.encode()
    clean = circuit.accuracy["clean"]
    scanned = [e for e in circuit.heads if e.entry is not None]
    assert scanned
    n_rows, n_pos = encoded.batch.n_rows, encoded.batch.n_pos
    cols = torch.arange(n_pos)
    starts, stops = encoded.spans[..., 0], encoded.spans[..., 1]  # [batch, segment]: first token, one past the end
    masks = {  # [batch, pos] bool
        "final": (cols == n_pos - 1).expand(n_rows, n_pos),  # left padding: every prompt ends at the last position
        "segments": ((cols >= starts[..., None]) & (cols < stops[..., None])).any(1),
        "ends": (cols == (stops - 1)[..., None]).any(1),  # a segment's end is its last token, its newline
    }
    assert bool((encoded.final == n_pos - 1).all()) and torch.equal(stops - 1, encoded.segment_ends)
    full = {
        e.head: {name: gna.evaluate(model, task, [gna.Ablate([e.head], positions=mask)]).accuracy for name, mask in masks.items()}
        for e in scanned
    }
    thresholds = circuit.thresholds
    skipped = 0
    for item in scanned:
        assert set(item.entry) <= set(ENTRY_POSITIONS) and "segments" in item.entry
        for name, value in item.entry.items():
            assert value == pytest.approx(full[item.head][name])
        skipped += len(ENTRY_POSITIONS) - len(item.entry)
        # the label from every position set, before the joint search and the layer order
        own = label(item.scores, thresholds, entry_shares(clean, item.ablated_accuracy, full[item.head]))
        lazy = label(item.scores, thresholds, entry_shares(clean, item.ablated_accuracy, item.entry))
        assert own == lazy
        if "final" not in item.entry:
            assert own is None
        if item.role == "gather" and not item.joint:
            assert "ends" in item.entry
    assert skipped > 0  # something was left unmeasured: the test shows the saving is real


@pytest.mark.slow  # make test stays within 5 minutes; CI runs it in make test-slow
def test_ordered_and_greedy_find_the_same_heads_on_the_deep_toy(both_searches):
    ordered, greedy = both_searches
    assert set(ordered.gather) == set(greedy.gather)
    assert set(ordered.aggregate) == set(greedy.aggregate)
    assert ordered.cost["passes"] < greedy.cost["passes"]
    assert ordered.settings["joint_search"] == "ordered" and greedy.settings["joint_search"] == "greedy"


@pytest.mark.slow  # the deep toy discovered twice: make test stays within 5 minutes
def test_quiet_heads_are_cleared_by_their_group(deep_mamba2, both_searches):
    """The heads a costly narrow layer cleared together: their prescreen estimate is exactly
    0, their group's accuracy is `evaluate`'s with them ablated, and (the premise) each
    alone costs less than the minimum effect."""
    model, task = deep_mamba2
    circuit = both_searches[0]
    cleared = [e for e in circuit.heads if not e.verified and e.ablated_accuracy is not None]
    assert cleared
    clean = circuit.accuracy["clean"]
    for layer in sorted({e.head.layer for e in cleared}):
        group = [e.head for e in cleared if e.head.layer == layer]
        assert len(group) >= 2
        assert all(circuit.attribution[h.layer][h.head] == 0.0 for h in group)
        together = gna.evaluate(model, task, [gna.Ablate(group)]).accuracy
        assert all(e.ablated_accuracy == pytest.approx(together) for e in cleared if e.head.layer == layer)
        assert clean - together < circuit.thresholds.min_effect
        for head in group:
            assert clean - gna.evaluate(model, task, [gna.Ablate([head])]).accuracy < circuit.thresholds.min_effect
    from gna_interp.viz.report import examined_rows

    shown = {row["head"]: row["accuracy, ablated alone at every position"] for row in examined_rows(circuit)}
    assert all(shown[str(e.head)] == f"{e.ablated_accuracy:.3f} (cleared in a group)" for e in cleared)
    assert all(isinstance(shown[str(e.head)], float) for e in circuit.heads if e.verified)


def test_joint_search_is_checked():
    model = gna.load_toy("llama")
    with pytest.raises(GnaValueError, match=r"joint_search='best'.*'ordered', 'greedy'"):
        gna.discover(model, gna.toy_task("llama", 8), joint_search="best", progress=False)


def test_a_label_that_reads_an_unmeasured_final_share_raises():
    """An unmeasured final-position share raises exactly where the label depends on it: the
    reference is `label` itself with the share measured, brute force over a grid of final
    shares. Where every final share gives one label, the unmeasured share gives that label."""
    from dataclasses import replace

    from gna_interp.discovery.roles import RoleScores, RoleThresholds

    thresholds = RoleThresholds()
    nan = float("nan")
    unscored = RoleScores(**{name: nan for name in RoleScores.__dataclass_fields__})
    finals = [k / 20 - 0.5 for k in range(41)]  # -0.5 .. 1.5: below, between and above every threshold
    raised = kept = 0
    for mass in (nan, 0.0, thresholds.aggregate_mass - 0.01, thresholds.aggregate_mass, 0.9):
        scores = replace(unscored, aggregate_mass=mass)
        for segments in (-0.2, 0.1, thresholds.entry_share - 0.01, thresholds.entry_share, 0.9, 1.2):
            measured = {label(scores, thresholds, (final, segments)) for final in finals}
            if len(measured) > 1:  # the label reads the final share: not measuring it must raise
                with pytest.raises(GnaValueError, match="final-position share"):
                    label(scores, thresholds, (None, segments))
                raised += 1
            else:
                assert label(scores, thresholds, (None, segments)) == measured.pop()
                kept += 1
    assert raised and kept  # both sides of the rule are exercised


@pytest.mark.slow
def test_an_ordered_search_short_of_chance_continues_by_the_greedy_rule():
    """The Llama toy's Gather: in order, L0H0 (0.400), +L0H1 passed over, +L0H2 (0.375), +L0H3 rose (0.395): the
    ordered search ends short of chance, and the greedy rule continues from the two heads it
    kept: its set and curve are the ordered search's, then the greedy steps, as a reference
    run here with `evaluate` alone (no memo, no prefix cache) computes them."""
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 200, seed=4242)
    ordered = _found(model, task)
    # The reference: the greedy rule from {L0H0, L0H2} over the Gather pool, every head of the Gather
    # heads' layers but the Aggregate ones (all of them before the Aggregate head), ablated at the
    # segments; stop at chance + margin.
    pool = [h for h in model.heads if h.layer in {g.layer for g in ordered.gather} and h not in ordered.aggregate]
    assert all(model.head_position(h) < min(map(model.head_position, ordered.aggregate)) for h in pool)
    segments = segment_positions(task.encode())
    threshold = ordered.accuracy["chance"] + ordered.settings["chance_margin"]
    in_order = [gna.Head(0, h) for h in (0, 2, 3)]  # the ranking's first three, as the search tried them
    tried = [gna.evaluate(model, task, [gna.Ablate(in_order[:k], positions=segments)]).accuracy for k in (1, 2, 3)]
    assert tried[1] < tried[0] - 0.02 and tried[2] > tried[1] > threshold
    chosen, current, steps = in_order[:2], tried[1], []
    rest = [h for h in pool if h not in chosen]
    while rest and len(chosen) < ordered.settings["max_heads_per_role"] and current > threshold:
        value, best = min((gna.evaluate(model, task, [gna.Ablate([*chosen, h], positions=segments)]).accuracy, h) for h in rest)
        if value >= current:
            break
        chosen.append(best)
        rest.remove(best)
        current = value
        steps.append((best, value))
    assert steps, "the case needs a set the greedy rule grows"
    assert ordered.needs["gather"].heads == chosen and current <= threshold
    assert [h for h, _ in ordered.needs["gather"].curve] == chosen
    assert [a for _, a in ordered.needs["gather"].curve] == pytest.approx([tried[0], tried[1], *(a for _, a in steps)])


def test_the_ordered_search_tries_only_heads_that_cost_alone():
    """`JointSearch.ranked`: heads whose ablation alone costs at least ``min_effect``, those the
    entry scan measured at the role's positions first (by that accuracy), then the others by
    their head-scan accuracy; a head that costs nothing alone is the greedy search's."""
    from gna_interp.discovery.evidence import HeadEvidence
    from gna_interp.discovery.joint import JointSearch
    from gna_interp.discovery.roles import RoleThresholds

    def item(name, alone, entry=None):
        found = HeadEvidence(gna.Head.parse(name), None, alone, True)
        found.entry = entry
        return found

    evidence = {
        e.head: e
        for e in (
            item("L0H0", 0.90, {"segments": 0.95}),
            item("L0H1", 0.80, {"segments": 0.85, "final": 0.97}),
            item("L0H2", 0.70),  # costly, not entry-scanned: after the scanned ones
            item("L0H3", 0.985),  # costs 0.005 alone: left out
            item("L0H4", 0.60, {"final": 0.6}),  # no segments value: ranked by its scan
        )
    }
    search = JointSearch(None, None, None, evidence, None, RoleThresholds(), 64, 64, False)  # type: ignore[arg-type]
    pool = [*evidence, gna.Head(0, 5)]  # L0H5: never measured
    assert search.ranked(pool, "gather", clean=0.99) == [gna.Head.parse(n) for n in ("L0H1", "L0H0", "L0H4", "L0H2")]
    assert search.ranked(pool, "aggregate", clean=0.99) == [gna.Head.parse(n) for n in ("L0H4", "L0H1", "L0H2", "L0H0")]


def test_the_entry_scan_refuses_an_unknown_position_set():
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 8)
    with pytest.raises(GnaValueError, match=r"where=\['final', 'start'\]: 'start' is not an entry position set; expected some of"):
        entry_scan(model, task, task.encode(), [gna.Head(0, 0)], progress=False, where=("final", "start"))
