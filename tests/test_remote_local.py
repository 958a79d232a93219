"""Requirement 8: every intervention the nnsight backend builds also runs under nnsight's
``remote="local"`` simulation of NDIF, with the same numbers as the local run."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import CLEAN, CORRUPT, PROMPTS, TOL

INTERVENTIONS = {
    "plain": [],
    "zero": [gna.Ablate([gna.Head(0, 1), gna.Head(1, 0)])],
    "mean": [gna.Ablate([gna.Head(1, 2)], how="mean", corrupt=PROMPTS)],
    "resample": [gna.Ablate([gna.Head(0, 3)], how="resample", corrupt=CORRUPT)],
    "patch-head": [gna.Patch(gna.Head(1, 1), source=CORRUPT, positions=[-1, -2])],
    "patch-resid": [gna.Patch([gna.Resid(1), gna.Resid(2)], source=CORRUPT, positions=1)],
    "skip": [gna.SkipLayers(0)],
    "truncate": [gna.Truncate(1)],
}


@pytest.fixture(scope="module", params=["llama", "mamba2"])
def pair(request, llama_hf, tokenizer):
    hf = copy.deepcopy(llama_hf) if request.param == "llama" else tiny_model("mamba2", seed=4)
    local = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight")
    remote = gna.load(hf, tokenizer=tokenizer, remote="local")
    assert remote.backend.remote == "local"
    return local, remote


@pytest.mark.parametrize("name", list(INTERVENTIONS))
def test_intervention_under_remote_simulation(pair, name):
    local, remote = pair
    expected = local.logits(CLEAN, INTERVENTIONS[name])
    assert torch.allclose(remote.logits(CLEAN, INTERVENTIONS[name]), expected, atol=TOL)


def test_captures_under_remote_simulation(pair):
    local, remote = pair
    targets = [gna.Head(1, 0), gna.Resid(2)]
    for target in targets:
        assert torch.allclose(remote.cache(CLEAN, [target])[target], local.cache(CLEAN, [target])[target], atol=TOL)


def test_sweeps_under_remote_simulation(pair):
    local, remote = pair
    metric = gna.logit_diff(5, 6)
    heads = [gna.Head(layer, h) for layer in range(2) for h in range(2)]
    a = gna.ablation_sweep(local, CLEAN, None, metric, heads=heads, progress=False)
    b = gna.ablation_sweep(remote, CLEAN, None, metric, heads=heads, progress=False)
    assert torch.allclose(a.scores, b.scores, atol=TOL, equal_nan=True)
    p = gna.patching_sweep(local, CLEAN, CORRUPT, metric, sites="resid", by_position=True, progress=False)
    q = gna.patching_sweep(remote, CLEAN, CORRUPT, metric, sites="resid", by_position=True, progress=False)
    assert torch.allclose(p.scores, q.scores, atol=TOL)
