"""Requirement 4: SSM head ablation (Mamba-1 / FalconMamba channels, Mamba-2 heads)
equals zeroing that head's out_proj weight columns."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import PROMPTS, TOL, assert_close_on_tokens, raw_logits, real_positions, zero_columns

FAMILIES = ["mamba", "falcon_mamba", "mamba2"]


@pytest.fixture(scope="module", params=FAMILIES)
def ssm(request, tokenizer):
    hf = tiny_model(request.param, seed=3)
    return hf, gna.load(copy.deepcopy(hf), tokenizer=tokenizer)


def test_defaults_to_nnsight_with_heads_from_config(ssm):
    hf, model = ssm
    assert model.backend_name == "nnsight"
    if hf.config.model_type == "mamba2":
        assert (model.n_heads, model.head_dim) == (hf.config.num_heads, hf.config.head_dim)
    else:
        assert (model.n_heads, model.head_dim) == (hf.config.intermediate_size, 1)


def test_plain_forward_matches_hf(ssm):
    hf, model = ssm
    assert_close_on_tokens(model.logits(PROMPTS), raw_logits(hf, model.to_batch(PROMPTS)), real_positions(model, PROMPTS))


def test_head_ablation_equals_weight_zeroing(ssm):
    hf, model = ssm
    batch = model.to_batch(PROMPTS)
    mask = real_positions(model, PROMPTS)
    clean = raw_logits(hf, batch)
    heads = [gna.Head(0, 0), gna.Head(0, model.n_heads - 1), gna.Head(1, model.n_heads // 2)]
    for head in heads:
        expected = raw_logits(zero_columns(hf, head, model.head_dim), batch)
        assert (expected - clean)[mask].abs().max() > 1e-5, f"{head} has no effect: the test could not fail"
        assert_close_on_tokens(model.logits(PROMPTS, [gna.Ablate([head])]), expected, mask)


def test_ablation_sweep_equals_weight_zeroing_loop(ssm):
    hf, model = ssm
    metric = gna.logit_diff(5, 6)
    layer1 = [gna.Head(1, h) for h in range(model.n_heads)]
    sweep = gna.ablation_sweep(model, PROMPTS, None, metric, heads=layer1, progress=False, batch_size=64)
    batch = model.to_batch(PROMPTS)
    expected = torch.tensor([float(metric(raw_logits(zero_columns(hf, head, model.head_dim), batch)).mean()) for head in layer1])
    assert torch.allclose(sweep.scores[1], expected, atol=TOL)
    assert sweep.scores[0].isnan().all()
