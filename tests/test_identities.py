"""Requirement 5: identities patching must satisfy, on both backends and on SSMs."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import CLEAN, CORRUPT, TOL, assert_close_on_tokens, out_proj, raw_logits, real_positions


@pytest.fixture(scope="module")
def all_models(llama_models, tokenizer):
    models = dict(llama_models)
    models["mamba2"] = gna.load(tiny_model("mamba2", seed=1), tokenizer=tokenizer)
    models["mamba"] = gna.load(tiny_model("mamba", seed=1), tokenizer=tokenizer)
    return models


@pytest.mark.parametrize("name", ["tlens", "nnsight", "mamba2", "mamba"])
def test_patching_a_head_with_its_own_clean_value_changes_nothing(all_models, name):
    model = all_models[name]
    clean = model.logits(CLEAN)
    heads = [gna.Head(0, 1), gna.Head(model.n_layers - 1, model.n_heads - 1)]
    patched = model.logits(CLEAN, [gna.Patch(heads, source=CLEAN)])
    assert torch.allclose(patched, clean, atol=TOL)


@pytest.mark.parametrize("name", ["tlens", "nnsight", "mamba2", "mamba"])
def test_patching_every_residual_site_reproduces_the_source(all_models, name):
    model = all_models[name]
    source = model.logits(CORRUPT)
    assert (source - model.logits(CLEAN)).abs().max() > 1e-3
    mask = real_positions(model, CLEAN)
    for layer in range(model.n_layers + 1):
        patched = model.logits(CLEAN, [gna.Patch(gna.Resid(layer), source=CORRUPT)])
        assert_close_on_tokens(patched, source, mask)
    every = [gna.Resid(layer) for layer in range(model.n_layers + 1)]
    assert_close_on_tokens(model.logits(CLEAN, [gna.Patch(every, source=CORRUPT)]), source, mask)


@pytest.mark.parametrize("name", ["tlens", "mamba2"])
def test_resid_sweep_at_all_positions_restores_the_clean_metric(all_models, name):
    """Denoising the whole residual stream at any layer gives the clean run exactly."""
    model = all_models[name]
    result = gna.patching_sweep(model, CLEAN, CORRUPT, gna.logit_diff(5, 6), sites="resid", progress=False)
    assert torch.allclose(result.scores, torch.full_like(result.scores, result.reference), atol=TOL)
    assert abs(result.reference - result.baseline) > 1e-3
    assert torch.allclose(result.normalized(), torch.ones_like(result.scores), atol=1e-3)


@pytest.mark.parametrize("name", ["tlens", "nnsight", "mamba2"])
def test_ablating_every_head_equals_zeroing_the_out_projection(all_models, llama_hf, name):
    """Zeroing every head of a layer equals zeroing the whole out-projection weight."""
    model = all_models[name]
    hf = copy.deepcopy(llama_hf if name in ("tlens", "nnsight") else model.hf_model)
    heads = [gna.Head(0, h) for h in range(model.n_heads)]
    ablated = model.logits(CLEAN, [gna.Ablate(heads)])
    with torch.no_grad():
        out_proj(hf, 0).weight.zero_()
    expected = raw_logits(hf, model.to_batch(CLEAN))
    assert (expected - model.logits(CLEAN)).abs().max() > 1e-3
    assert torch.allclose(ablated, expected, atol=TOL)


@pytest.mark.parametrize("name", ["tlens", "nnsight"])
def test_chunking_does_not_change_scores(all_models, name):
    model = all_models[name]
    metric = gna.logit_diff(5, 6)
    one = gna.ablation_sweep(model, CLEAN, None, metric, batch_size=len(CLEAN), progress=False)
    many = gna.ablation_sweep(model, CLEAN, None, metric, batch_size=7 * len(CLEAN), progress=False)
    assert torch.allclose(one.scores, many.scores, atol=TOL)


@pytest.mark.parametrize("name", ["tlens", "nnsight", "mamba2"])
def test_truncation_equals_skipping_later_layers(all_models, name):
    model = all_models[name]
    k = model.n_layers - 1
    truncated = model.logits(CLEAN, [gna.Truncate(k)])
    skipped = model.logits(CLEAN, [gna.SkipLayers(range(k, model.n_layers))])
    assert torch.equal(truncated, skipped)
    # Truncating to 0 layers: the embedding goes straight to the final norm + unembedding.
    assert not torch.allclose(model.logits(CLEAN, [gna.Truncate(0)]), model.logits(CLEAN), atol=1e-3)
