"""Requirement 2: on the same weights, nnsight gives the same numbers as tlens, for
ablation, patching and both sweeps."""

from __future__ import annotations

import pytest
import torch

import gna_interp as gna

from .conftest import CLEAN, CORRUPT, PROMPTS, TOL, assert_close_on_tokens, real_positions

INTERVENTIONS = {
    "plain": [],
    "zero": [gna.Ablate([gna.Head(0, 2), gna.Head(2, 1)])],
    "mean": [gna.Ablate([gna.Head(1, 5)], how="mean", corrupt=PROMPTS)],
    "patch-head": [gna.Patch([gna.Head(1, 2)], source=CORRUPT, positions=[-1])],
    "patch-resid": [gna.Patch([gna.Resid(2)], source=CORRUPT, positions=2)],
    "skip": [gna.SkipLayers([1])],
    "truncate": [gna.Truncate(2)],
    "resample": [gna.Ablate([gna.Head(2, 0)], how="resample", corrupt=CORRUPT)],
}


@pytest.mark.parametrize("name", list(INTERVENTIONS))
def test_interventions_agree(llama_models, name):
    tl, ns = llama_models["tlens"], llama_models["nnsight"]
    actual = ns.logits(CLEAN, INTERVENTIONS[name])
    expected = tl.logits(CLEAN, INTERVENTIONS[name])
    assert_close_on_tokens(actual, expected, real_positions(tl, CLEAN))
    if name != "plain":
        assert (expected - tl.logits(CLEAN)).abs().max() > 1e-3, "intervention had no effect"


def test_padded_batch_agrees(llama_models):
    tl, ns = llama_models["tlens"], llama_models["nnsight"]
    ablate = [gna.Ablate([gna.Head(1, 1)])]
    assert_close_on_tokens(ns.logits(PROMPTS, ablate), tl.logits(PROMPTS, ablate), real_positions(tl, PROMPTS))


@pytest.mark.parametrize("how", ["zero", "mean", "resample"])
def test_ablation_sweeps_agree(llama_models, how):
    metric = gna.logit_diff(5, 6)
    reference = None if how == "zero" else CORRUPT
    results = {name: gna.ablation_sweep(m, CLEAN, reference, metric, how=how, progress=False) for name, m in llama_models.items()}
    assert torch.allclose(results["tlens"].scores, results["nnsight"].scores, atol=TOL)
    assert abs(results["tlens"].baseline - results["nnsight"].baseline) < TOL
    assert results["tlens"].scores.isfinite().all()


@pytest.mark.parametrize(("sites", "by_position"), [("heads", False), ("heads", True), ("resid", False), ("resid", True)])
def test_patching_sweeps_agree(llama_models, sites, by_position):
    metric = gna.logit_diff(5, 6)
    results = {
        name: gna.patching_sweep(m, CLEAN, CORRUPT, metric, sites=sites, by_position=by_position, progress=False)
        for name, m in llama_models.items()
    }
    assert torch.allclose(results["tlens"].scores, results["nnsight"].scores, atol=TOL, equal_nan=True)
    assert results["tlens"].scores.isfinite().all()


def test_ablated_context_equals_intervention(llama_models):
    for model in llama_models.values():
        expected = model.logits(CLEAN, [gna.Ablate([gna.Head(2, 3)], how="mean", corrupt=PROMPTS)])
        with model.ablated([gna.Head(2, 3)], how="mean", corrupt=PROMPTS):
            inside = model.logits(CLEAN)
        assert torch.allclose(inside, expected, atol=TOL)
        assert not model.active_interventions
