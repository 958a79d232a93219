"""The screened layer scan (issue 42, item 3): `layer_scans.screen_layers` finds the layers whose
removal costs accuracy, each measured alone, against the layer-by-layer scan (oracles and the
deep toys); a group's removal starts from the prefix cache's embeddings."""

from __future__ import annotations

import random

import pytest
import torch

import gna_interp as gna
from gna_interp.core.interventions import SkipLayers, Truncate
from gna_interp.discovery import layer_scans
from gna_interp.zoo.deep import deep_toy

MIN_EFFECT = 0.02


def _oracle(effect, clean=1.0):
    """``measure(first, last)`` from ``effect(set of layers skipped)``, recording what it is asked."""
    asked = []

    def measure(first, last):
        asked.append((first, last))
        return clean - effect(set(range(first, last + 1)))

    return measure, asked


def _passes(asked, n_layers):
    """A forward skipping ``first..last`` runs blocks ``last + 1 ..`` (the prefix cache)."""
    return sum((n_layers - 1 - last) / n_layers for _, last in set(asked))


@pytest.mark.parametrize("seed", range(12))
def test_additive_effects_are_found_as_the_layer_by_layer_scan_finds_them(seed):
    """Additive effects, a few layers costly (some above ``min_effect``, some below, some
    zero): the costly layers are exactly those the layer-by-layer scan finds, each with its
    own accuracy; every cleared layer's recorded group was measured and costs less than
    ``min_effect``; it costs at most twice the layer-by-layer scan."""
    rng = random.Random(seed)
    n_layers = rng.choice([2, 3, 8, 16, 32])
    effects = [0.0] * n_layers
    for layer in rng.sample(range(n_layers), rng.randint(0, min(n_layers, 6))):
        effects[layer] = rng.choice([0.005, 0.01, 0.05, 0.3, 0.6])
    measure, asked = _oracle(lambda skipped: sum(effects[layer] for layer in skipped))
    scan = layer_scans.screen_layers(n_layers, 1.0, MIN_EFFECT, measure)
    costly = [layer for layer in range(n_layers) if effects[layer] >= MIN_EFFECT]
    assert [layer for layer in range(n_layers) if 1.0 - scan.accuracy[layer] >= MIN_EFFECT] == costly
    for layer in range(n_layers):
        first, last = scan.skipped[layer]
        assert first <= layer <= last and (first, last) in asked
        assert scan.accuracy[layer] == pytest.approx(1.0 - sum(effects[first : last + 1]))
        if layer in costly:
            assert (first, last) == (layer, layer)
    assert scan.tests == len(set(asked))
    assert _passes(asked, n_layers) <= 2 * (n_layers - 1) / 2 + 1e-9


def test_a_model_whose_every_layer_costs_is_scanned_layer_by_layer():
    """Every layer costly: each measured alone, no group but the free truncations."""
    measure, asked = _oracle(lambda skipped: 0.1 * len(skipped))
    scan = layer_scans.screen_layers(16, 1.0, MIN_EFFECT, measure)
    assert scan.skipped == [(layer, layer) for layer in range(16)] and scan.grouped == []
    assert _passes(asked, 16) == pytest.approx(sum((15 - layer) / 16 for layer in range(16)))


def test_two_costly_layers_in_the_middle_cost_four_forwards():
    """The deep toys' shape: layers 15 and 16 of 32 costly. Layers 17-31 are cleared by
    their truncations (free), 16, 15 and 14 measured alone, 0-13 cleared together: about
    2 passes, against 15.5 layer by layer."""
    measure, asked = _oracle(lambda skipped: 0.7 * bool(skipped & {15, 16}))
    scan = layer_scans.screen_layers(32, 1.0, MIN_EFFECT, measure)
    assert scan.skipped[:14] == [(0, 13)] * 14 and scan.skipped[14:17] == [(14, 14), (15, 15), (16, 16)]
    assert scan.skipped[17:] == [(layer, 31) for layer in range(17, 32)]
    assert _passes(asked, 32) == pytest.approx((15 + 16 + 17 + 18) / 32)


def test_a_group_whose_split_does_not_add_up_is_searched_layer_by_layer():
    """Layer 3 costs 0.3 alone; skipped with layer 6 it costs nothing unless layer 12 (0.5) is
    skipped too. The group 0..10 costs nothing, but the whole model (0.8) is not that group
    plus 11..15 (0.5): the masked check (`group_testing.masked_parts`) measures 0..10 layer by
    layer and finds layer 3. Without the interaction the same group clears it."""

    def effect(skipped, interacts=True):
        masked = 6 in skipped and not (interacts and 12 in skipped)
        return 0.5 * (12 in skipped) + 0.3 * (3 in skipped and not masked)

    for interacts, found in ((True, [3, 12]), (False, [12])):
        measure, _ = _oracle(lambda skipped, i=interacts: effect(skipped, i))
        scan = layer_scans.screen_layers(16, 1.0, MIN_EFFECT, measure)
        assert [layer for layer in range(16) if 1.0 - scan.accuracy[layer] >= MIN_EFFECT] == found, interacts
        assert (scan.skipped[3] == (3, 3)) is interacts


@pytest.mark.parametrize("family", ["llama", "mamba2_counting"])
def test_the_deep_toys_screen_equals_the_layer_by_layer_scan(family):
    """8 layers (the toy at 3 and 4; both backends): every value equals the layer-by-layer
    scan's (the other layers write nothing, so a group's value is each member's), in fewer
    passes (2.25 against 3.5 from the cached prefixes)."""
    model, task = deep_toy(family, 8), gna.toy_task(family, 32, seed=4242)
    with model.prefix_cache(), gna.cost_meter(model) as cost:
        clean = gna.evaluate(model, task).accuracy
        before = cost.passes(len(task))
        plain = layer_scans.layer_scan(model, task, progress=False)
        middle = cost.passes(len(task))
        scan = layer_scans.screened_layer_scan(model, task, clean, MIN_EFFECT, progress=False)
        after = cost.passes(len(task))
    assert scan.accuracy == plain and scan.grouped == [0, 1, 5, 6]
    assert (middle - before, after - middle) == (pytest.approx(3.5), pytest.approx(2.25))
    assert layer_scans.screen_ranges(8)[:3] == [(0, 0), (0, 1), (0, 2)] and len(layer_scans.screen_ranges(8)) == 8 + 7 + 6


@pytest.mark.parametrize("family", ["llama", "mamba2_counting"])
def test_skipping_the_first_layers_starts_from_the_cached_embeddings(family):
    """Inside `prefix_cache`, a forward that skips blocks 0..k-1 starts at block k from the
    cached embeddings: the logits of the uncached forward, the cost of blocks k.. alone."""
    model, task = deep_toy(family, 4), gna.toy_task(family, 8, seed=4242)
    batch = task.encode().batch
    cases = {(SkipLayers([0, 1]),): 0.5, (Truncate(0),): 0.0, (SkipLayers([0]),): 0.75, (SkipLayers([0, 2]),): 0.75}
    expected = {case: model.logits(batch, list(case)) for case in cases}
    with model.prefix_cache() as cache, gna.cost_meter(model) as cost:
        model.logits(batch)
        for case, passes in cases.items():
            before = cost.block_rows
            assert torch.equal(model.logits(batch, list(case)), expected[case]), case
            assert (cost.block_rows - before) / (batch.n_rows * 4) == pytest.approx(passes), case
        assert cache.layers_to_keep(batch) == [0, 1, 2, 3, 4]
    # a cache that keeps every second layer keeps the embeddings too; a forward whose first
    # touched block is 1 starts from scratch there, as before (no cached layer at 1)
    per_layer = batch.n_rows * batch.n_pos * model.d_model * 4
    cases |= {(SkipLayers([1]),): 1.0}
    expected[SkipLayers([1]),] = model.logits(batch, [SkipLayers([1])])
    with model.prefix_cache(max_mb=32 * per_layer / 2**20) as cache, gna.cost_meter(model) as cost:
        model.logits(batch)
        assert cache.layers_to_keep(batch) == [0, 2, 4]
        for case, passes in cases.items():
            before = cost.block_rows
            assert torch.equal(model.logits(batch, list(case)), expected[case]), case
            assert (cost.block_rows - before) / (batch.n_rows * 4) == pytest.approx(passes), case
