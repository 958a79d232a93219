"""Issue 3, test 4: softmax patterns equal HF's own eager attention weights
(``output_attentions=True`` on a pristine eager copy), on both backends, also under an
ablation and under nnsight's ``remote="local"`` simulation; the eager switch the nnsight
backend makes for one trace never outlives it."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.core.plan import Edit, Plan, Read, ReadKind, Site, SiteKind
from gna_interp.models.tiny import tiny_model

from .conftest import PROMPTS, no_hooks_anywhere, zero_columns

ALL_HEADS = [gna.Head(layer, head) for layer in range(3) for head in range(6)]


def hf_eager_weights(hf_model, batch) -> torch.Tensor:
    """``[batch, layer * head, query, key]`` from HF eager attention, real query rows only kept."""
    eager = copy.deepcopy(hf_model)
    eager.config._attn_implementation = "eager"
    with torch.no_grad():
        out = eager(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    weights = torch.cat(list(out.attentions), dim=1)
    real = batch.attention_mask.bool()
    return weights * real[:, None, :, None]


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_softmax_equals_hf_eager_weights(llama_models, llama_hf, backend):
    model = llama_models[backend]
    expected = hf_eager_weights(llama_hf, model.to_batch(PROMPTS))
    got = gna.attention_pattern(model, PROMPTS, ALL_HEADS)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-6)
    real = model.to_batch(PROMPTS).attention_mask.bool()
    sums = got.sum(-1).transpose(1, 2)  # [batch, query, head]
    assert torch.allclose(sums[real], torch.ones_like(sums[real]), atol=1e-5)
    assert torch.all(sums[~real] == 0), "padding query rows are zero"


def test_backends_agree(llama_models):
    heads = [gna.Head(1, 4), gna.Head(0, 1), gna.Head(2, 0)]
    a = gna.attention_pattern(llama_models["tlens"], PROMPTS, heads)
    b = gna.attention_pattern(llama_models["nnsight"], PROMPTS, heads)
    assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_patterns_under_ablation(llama_models, llama_hf, backend):
    """An ablated layer-0 head changes layer-1 patterns exactly as zeroing its o_proj columns does."""
    model = llama_models[backend]
    ablated = gna.Head(0, 2)
    batch = model.to_batch(PROMPTS)
    expected = hf_eager_weights(zero_columns(llama_hf, ablated, model.head_dim), batch)[:, 6:12]
    heads = [gna.Head(1, h) for h in range(6)]
    with model.ablated([ablated]):
        inside = gna.attention_pattern(model, PROMPTS, heads)
    assert torch.allclose(inside, expected, atol=1e-6)
    assert (inside - gna.attention_pattern(model, PROMPTS, heads)).abs().max() > 1e-4, "the ablation had no effect"
    assert torch.allclose(gna.attention_pattern(model, PROMPTS, heads, interventions=[gna.Ablate([ablated])]), inside, atol=1e-7)


def test_eager_switch_is_restored(llama_nnsight):
    config = llama_nnsight.hf_model.config
    before = config._attn_implementation
    assert before != "eager", "the fixture must not run eager attention already"
    gna.attention_pattern(llama_nnsight, PROMPTS, [gna.Head(0, 0)])
    assert config._attn_implementation == before
    logits_before = llama_nnsight.logits(PROMPTS)
    bad = Plan()  # an edit that fails inside the forward, after the switch
    bad.add(Site(SiteKind.HEADS, 0), Edit(torch.ones(1, 1, 6, 1, dtype=torch.bool), torch.zeros(3, 3, 3, 3, 3)))
    read = Read(ReadKind.PATTERN, 1)
    with pytest.raises(Exception):  # noqa: B017 - any error from inside the forward
        llama_nnsight.backend.run(llama_nnsight.to_batch(PROMPTS), bad, reads=[read])
    assert config._attn_implementation == before
    assert no_hooks_anywhere(llama_nnsight.hf_model)
    assert torch.equal(llama_nnsight.logits(PROMPTS), logits_before)


def test_tlens_leaves_no_hooks(llama_tlens):
    gna.attention_pattern(llama_tlens, PROMPTS, [gna.Head(2, 2)], query_positions=[-1])
    assert all(not hp._forward_hooks for hp in llama_tlens.backend.bridge.hook_dict.values())


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_remote_local_simulation(family, llama_hf, tokenizer):
    hf = copy.deepcopy(llama_hf) if family == "llama" else tiny_model("mamba2", seed=7)
    local = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight")
    remote = gna.load(hf, tokenizer=tokenizer, remote="local")
    heads = [gna.Head(1, 1), gna.Head(0, 3)]
    for query_positions in (None, [-1]):
        expected = gna.attention_pattern(local, PROMPTS, heads, query_positions=query_positions)
        assert expected.abs().max() > 1e-3
        got = gna.attention_pattern(remote, PROMPTS, heads, query_positions=query_positions)
        assert torch.allclose(got, expected, atol=1e-7)
