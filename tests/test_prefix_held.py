"""Forwards that record gradients or read values where the model makes them, from the prefix
cache (`PrefixCache.run_held`): attribution's gated forwards and attention-pattern reads over a
batch the cache holds start at their first gated or read block, with the numbers of the
uncached run (1e-5) and the blocks they really run (`gna.cost_meter`), on both backends and
every mixer kind (softmax attention, Mamba-2's and Mamba-1's implicit attention); a batch the
cache does not hold runs in full and is not stored."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.core.compile import heads_by_site
from gna_interp.models.tiny import tiny_model
from gna_interp.patching.attribution import integrated_effects

from .conftest import CLEAN

TOL = 1e-5
NAMES = ["llama-tlens", "llama-nnsight", "mamba2", "mamba"]
METRIC = gna.logit_diff([5, 7], [6, 8])


@pytest.fixture(scope="module", params=NAMES)
def model(request, tokenizer):
    name = request.param
    hf = tiny_model(name.split("-")[0], seed=1)
    return gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="tlens" if name == "llama-tlens" else "nnsight")


def _effects(model, batch, first: int):
    """First-order effects of zero-ablating every head of layers ``first ..``: site -> [pos, head]."""
    heads = [gna.Head(layer, h) for layer in range(first, model.n_layers) for h in range(model.heads_per_layer[layer])]
    targets = {site: torch.zeros(()) for site in heads_by_site(model.layout, heads)}
    effects, baseline = integrated_effects(model, batch, [], targets, METRIC, 1, "left")
    return effects, baseline


def test_a_held_batch_differentiates_from_its_cached_prefix(model):
    batch, n_layers, first = model.to_batch(CLEAN), model.n_layers, 1
    expected, expected_base = _effects(model, batch, first)
    assert max(float(e.abs().max()) for e in expected.values()) > 1e-3, "no effect: the test could not fail"
    with model.prefix_cache(), gna.cost_meter(model) as cost:
        model.logits(batch)  # the clean run fills the cache
        before = cost.block_rows
        effects, base = _effects(model, batch, first)
        spent = cost.block_rows - before
    assert spent == batch.n_rows * (n_layers - first)  # blocks 1 .. L - 1 per row, not L
    assert abs(base - expected_base) < TOL
    assert set(effects) == set(expected)
    for site, value in effects.items():
        assert (value - expected[site]).abs().max() < TOL, site


def test_a_batch_the_cache_does_not_hold_runs_in_full_and_is_not_stored(model):
    batch, n_layers = model.to_batch(CLEAN), model.n_layers
    expected, _ = _effects(model, batch, 1)
    with model.prefix_cache() as cache, gna.cost_meter(model) as cost:
        effects, _ = _effects(model, batch, 1)
        assert cost.block_rows == batch.n_rows * n_layers and len(cache.entries) == 0
    for site, value in effects.items():
        assert (value - expected[site]).abs().max() < TOL, site


def test_a_held_batch_reads_patterns_from_its_cached_prefix(model):
    """Layer 1's patterns (softmax, or the SSM's implicit attention: its reads of ``in_proj``'s
    or ``x_proj``'s output and its parameters) from the cached stream entering block 1."""
    batch, n_layers = model.to_batch(CLEAN), model.n_layers
    heads = [gna.Head(1, h) for h in range(min(2, model.heads_per_layer[1]))]
    expected = gna.attention_pattern(model, batch, heads)
    with model.prefix_cache(), gna.cost_meter(model) as cost:
        model.logits(batch)
        before = cost.block_rows
        pattern = gna.attention_pattern(model, batch, heads)
        spent = cost.block_rows - before
    assert spent == batch.n_rows * (n_layers - 1)
    assert float(expected.abs().max()) > 1e-3
    assert (pattern - expected).abs().max() < TOL


PARAMS = {"llama-tlens": "o_proj.weight", "llama-nnsight": "o_proj.weight", "mamba2": "A_log", "mamba": "A_log"}


def test_a_parameter_read_from_a_held_prefix_is_the_parameter(model, request):
    """A read of layer 0's mixer parameter alone (no output read beside it) from a held batch:
    the parameter itself (its layer runs: the read counts as touching it)."""
    from gna_interp.core.plan import Plan, Read, ReadKind

    name = PARAMS[request.node.callspec.params["model"]]
    batch = model.to_batch(CLEAN)
    read = Read(ReadKind.PARAM, 0, name)
    expected = model.run_plan(batch, Plan(), reads=[read]).reads[0]
    with model.prefix_cache():
        model.logits(batch)
        value = model.run_plan(batch, Plan(), reads=[read]).reads[0]
    assert value.shape == expected.shape and torch.equal(value, expected)


def test_a_residual_captured_at_a_held_start_records_gradients_of_its_own(model):
    """``grad=True`` with the residual entering block 1 captured, from a held batch: the capture is
    the forward's own leaf (the logits' gradient with respect to it is the uncached run's), and the
    cache's stream is left as it was (no gradient recorded on it, the same values)."""
    from gna_interp.core.plan import Plan, Site, SiteKind

    batch, site = model.to_batch(CLEAN), Site(SiteKind.RESID, 1)
    full = model.run_plan(batch, Plan(), capture={site}, grad=True)
    (expected,) = torch.autograd.grad(full.logits.sum(), full.acts[site])
    with model.prefix_cache() as cache, gna.cost_meter(model) as cost:
        model.logits(batch)
        before = cost.block_rows
        held = model.run_plan(batch, Plan(), capture={site}, grad=True)
        assert cost.block_rows - before == batch.n_rows * (model.n_layers - 1)
        (grad,) = torch.autograd.grad(held.logits.sum(), held.acts[site])
        stream = cache.lookup(batch)[1]
        assert not stream.requires_grad and held.acts[site].data_ptr() != stream.data_ptr()
        assert (stream - full.acts[site].detach()).abs().max() < TOL
    assert (grad - expected).abs().max() < 1e-4 * max(1.0, float(expected.abs().max()))
