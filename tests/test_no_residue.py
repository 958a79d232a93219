"""Requirement 6: no hook or weight edit survives a failure mid-sweep."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import CLEAN, CORRUPT, no_hooks_anywhere


class Boom(RuntimeError):
    pass


def _exploding_metric(after: int):
    calls = {"n": 0}

    def metric(logits):
        calls["n"] += 1
        if calls["n"] > after:
            raise Boom("metric failed mid-sweep")
        return logits[:, -1, 5]

    return metric


@pytest.fixture(scope="module", params=["tlens", "nnsight", "mamba2"])
def fresh(request, llama_hf, tokenizer):
    hf = tiny_model("mamba2", seed=2) if request.param == "mamba2" else copy.deepcopy(llama_hf)
    backend = "nnsight" if request.param != "tlens" else "tlens"
    model = gna.load(hf, tokenizer=tokenizer, backend=backend)
    hf = model.hf_model  # the modules the backend runs (on tlens, the bridge's twin of the caller's model)
    batch = model.to_batch(CLEAN)
    with torch.no_grad():
        hf_before = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.clone()
    weights = {k: v.clone() for k, v in hf.state_dict().items()}
    return model, hf_before, model.logits(CLEAN), weights


@pytest.mark.parametrize("sweep", ["ablation", "patching", "context"])
def test_failure_leaves_no_residue(fresh, sweep):
    model, hf_before, logits_before, weights = fresh
    with pytest.raises(Boom):
        if sweep == "ablation":
            gna.ablation_sweep(model, CLEAN, None, _exploding_metric(after=2), batch_size=len(CLEAN), progress=False)
        elif sweep == "patching":
            gna.patching_sweep(model, CLEAN, CORRUPT, _exploding_metric(after=3), batch_size=len(CLEAN), progress=False)
        else:
            with model.ablated([gna.Head(0, 0)]):
                raise Boom("user code failed inside the context")
    assert not model.active_interventions
    assert torch.equal(model.logits(CLEAN), logits_before)
    hf = model.hf_model
    batch = model.to_batch(CLEAN)
    with torch.no_grad():
        assert torch.equal(hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, hf_before)
    assert all(torch.equal(v, weights[k]) for k, v in hf.state_dict().items())
    if model.backend_name == "tlens":
        assert all(not hp._forward_hooks for hp in model.backend.bridge.hook_dict.values())
    else:
        assert no_hooks_anywhere(hf)


def test_failure_inside_a_hook_leaves_no_residue(fresh):
    """An error raised inside the forward itself (a bad edit value) also cleans up."""
    model, _, logits_before, _ = fresh
    from gna_interp.core.plan import Edit, Plan, Site, SiteKind

    bad = Plan()
    bad.add(Site(SiteKind.HEADS, 0), Edit(torch.ones(1, 1, model.n_heads, 1, dtype=torch.bool), torch.zeros(3, 3, 3, 3, 3)))
    with pytest.raises(Exception):  # noqa: B017 - any error from inside the forward
        model.backend.run(model.to_batch(CLEAN), bad)
    assert torch.equal(model.logits(CLEAN), logits_before)
