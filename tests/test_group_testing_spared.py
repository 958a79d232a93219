"""Issue 52, item 8: a spread group's search spares the parts whose un-ablation leaves a group
the scan measured costly ablated (`group_testing.spared`): the same heads as brute force and
as the search without it, at fewer evaluations, locally, staged and after a resume."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import gna_interp as gna
from gna_interp.discovery.group_testing import group_testing, staged_group_testing
from gna_interp.discovery.head_scans import head_scan


def _heads(n: int, layer: int = 0) -> list[gna.Head]:
    return [gna.Head(layer, i) for i in range(n)]


def _quorum_oracle(n: int, quorums: list[tuple[float, set[int]]], clean: float = 1.0):
    """Accuracy ``clean`` minus the weight of every quorum wholly ablated: a monotone oracle
    (ablating more heads never costs less), so brute force names the needed heads exactly."""

    def measure(groups):
        return [clean - sum(w for w, q in quorums if {h.head for h in g} >= q) for g in groups]

    return measure, _heads(n)


@pytest.mark.parametrize("seed", range(8))
def test_the_spread_search_spares_what_a_costly_group_measured_inside_settles(seed):
    """Issue 52, item 8. A monotone oracle whose layer is a spread group (a quorum of 3 or 4
    heads in both halves costs 0.4 together, and one of them 0.04 alone: the halves explain
    less than half the layer). The search names exactly the heads brute force names (each head un-ablated alone,
    the rest of the group ablated), and spares the parts whose un-ablation leaves a group the
    scan measured costly ablated (`spared`): never more tests than the search without what
    the scan measured (parts and inside groups dropped), fewer wherever a costly group lies
    outside a part; the staged design finds the same."""
    from gna_interp.discovery.group_testing import search_needed

    generator = torch.Generator().manual_seed(seed)
    low, high = torch.randperm(32, generator=generator)[:3].tolist(), torch.randperm(32, generator=generator)[:3].tolist()
    quorum = {low[0], 32 + high[0]} | ({low[1]} if seed % 2 else set())  # in both halves: neither half holds it
    alone = 32 + high[1] if seed % 4 < 2 else low[2]
    measure, heads = _quorum_oracle(64, [(0.4, quorum | {alone}), (0.04, {alone})])
    found = group_testing(measure, heads, clean=1.0, min_effect=0.02, search=False)
    [group] = [g for g in found.spread if g.heads == heads]
    blind = dataclasses.replace(group, parts=(), inside=[])  # the search before it read the scan's values
    tests, blind_tests = search_needed(measure, group, 1.0, 0.02), search_needed(measure, blind, 1.0, 0.02)
    brute = [h for h in heads if 1.0 - measure([[g for g in heads if g != h]])[0] < 0.02]
    assert group.needed == blind.needed == brute == [gna.Head(0, alone)]
    assert tests < blind_tests and tests == math.ceil(math.log2(64)) - 1  # only the parts holding the head: 32..1 heads
    [staged] = staged_group_testing(measure, [heads], 1.0, 0.02)
    assert staged.spread == found.spread and [g.needed for g in staged.spread] == [g.needed for g in found.spread]


def test_a_saved_head_scan_keeps_what_spares_its_search():
    """A crash-resumed discovery reads its head scan back from the run directory
    (`records._scan`, through JSON): each spread group's `SpreadGroup.inside` comes back, so
    the resumed search spares the same parts: the same tests (5: the parts holding the costly
    head, as `test_the_spread_search_spares_what_a_costly_group_measured_inside_settles`)
    and the same heads as the uninterrupted one."""
    import json

    from gna_interp.discovery import records
    from gna_interp.discovery.group_testing import search_needed
    from gna_interp.discovery.head_scans import HeadScan

    measure, heads = _quorum_oracle(64, [(0.4, {3, 40, 41}), (0.04, {40})])
    found = group_testing(measure, heads, clean=1.0, min_effect=0.02, search=False)
    scan = HeadScan(torch.zeros(1, 64), torch.zeros(1, 64, dtype=torch.bool), found.spread, {0: found.tests})
    back = records._read_scan(json.loads(json.dumps(records._scan(scan))))
    [group], [again] = found.spread, back.spread
    assert again == group and again.inside == group.inside and gna.Head(0, 40) in {h for g in group.inside for h in g}
    assert search_needed(measure, again, 1.0, 0.02) == search_needed(measure, group, 1.0, 0.02) == 5
    assert again.needed == group.needed == [gna.Head(0, 40)]


@pytest.mark.slow
def test_the_mamba1_toys_spread_search_spares_tests_and_names_what_brute_force_names():
    """The trained 2 x 128 Mamba-1 toy, 200 prompts (seed 4242), layer 1 group-tested, its heads
    in index order (`group_testing` itself): its spread groups (the layer, 0.26 together;
    L1H20-L1H23, 0.74) searched with what the scan measured inside them (`spared`) name the same
    heads as the search without it (parts and inside groups dropped: the search before issue 52's
    cut) at fewer evaluations (1 against 8 here), and L1H20-L1H23's names what brute force does:
    each channel un-ablated alone, the other three ablated, back within ``min_effect`` of clean.
    In the head scan's order (largest write first, `head_order`) its one spread group is the
    first 8 channels of that order (0.445 together, its halves 0.745 and 1.0; redundant): its search, spared or not, names
    what brute force names (no channel), the spared one in no evaluation (each of its quarters
    leaves a costly group measured inside it ablated) against 4."""
    from gna_interp.discovery.group_testing import search_needed
    from gna_interp.discovery.head_scans import group_measure

    if "mamba" not in gna.toy_names():
        pytest.skip("the Mamba-1 toy is not bundled yet")
    model, task = gna.load_toy("mamba"), gna.toy_task("mamba", 200, seed=4242)
    clean = gna.evaluate(model, task).accuracy
    measure = group_measure(model, task)
    indexed = group_testing(measure, _heads(128, layer=1), clean, 0.02, search=False)
    scan = head_scan(model, task, [1], screen_above=0, clean=clean, progress=False, search_spread=False)
    orders = {"index": [group for group in indexed.spread if group.searched], "write": [group for group in scan.spread if group.searched]}
    assert [(g.heads[0], len(g.heads)) for g in orders["index"]] == [(gna.Head(1, 0), 128), (gna.Head(1, 20), 4)]
    assert [g.heads for g in orders["write"]] == [[gna.Head(1, h) for h in (10, 22, 92, 74, 53, 16, 20, 101)]]
    for order, groups in orders.items():
        tests = {"spared": 0, "blind": 0}
        for group in groups:
            blind = dataclasses.replace(group, parts=(), inside=[])
            tests["spared"] += search_needed(measure, group, clean, 0.02)
            tests["blind"] += search_needed(measure, blind, clean, 0.02)
            assert group.needed == blind.needed
            if len(group.heads) <= 8:
                heads = group.heads
                brute = [h for h in heads if clean - gna.evaluate(model, task, [gna.Ablate([g for g in heads if g != h])]).accuracy < 0.02]
                assert group.needed == sorted(brute), (order, group.heads)
        assert [g.needed for g in groups] == {"index": [[], [gna.Head(1, 22)]], "write": [[]]}[order]
        assert tests == {"index": {"spared": 1, "blind": 8}, "write": {"spared": 0, "blind": 4}}[order], (order, tests)
