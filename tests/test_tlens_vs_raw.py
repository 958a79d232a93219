"""Requirement 1: the TransformerLens backend against raw PyTorch hooks on HF ``o_proj``,
on a tiny grouped-query Llama (6 query heads, 2 KV heads)."""

from __future__ import annotations

import pytest
import torch

import gna_interp as gna

from .conftest import CLEAN, CORRUPT, PROMPTS, assert_close_on_tokens, raw_head_outputs, raw_logits, real_positions


def test_plain_forward_matches_hf(llama_hf, llama_tlens):
    batch = llama_tlens.to_batch(PROMPTS)
    assert_close_on_tokens(llama_tlens.logits(PROMPTS), raw_logits(llama_hf, batch), real_positions(llama_tlens, PROMPTS))


def test_every_head_zero_ablation_matches_raw_hook(llama_hf, llama_tlens):
    batch = llama_tlens.to_batch(PROMPTS)
    mask = real_positions(llama_tlens, PROMPTS)
    clean = raw_logits(llama_hf, batch)
    for head in llama_tlens.heads:

        def zero(h, head=head):
            h[:, :, head.head] = 0
            return h

        expected = raw_logits(llama_hf, batch, {head.layer: zero})
        assert (expected - clean)[mask].abs().max() > 1e-3, f"{head} has no effect: the test could not fail"
        assert_close_on_tokens(llama_tlens.logits(PROMPTS, [gna.Ablate([head])]), expected, mask)


def test_mean_ablation_matches_raw_hook(llama_hf, llama_tlens):
    batch = llama_tlens.to_batch(PROMPTS)
    reference = CLEAN + CORRUPT
    ref_batch = llama_tlens.to_batch(reference)
    for head in [gna.Head(0, 1), gna.Head(2, 5)]:
        acts = raw_head_outputs(llama_hf, ref_batch, head.layer)[:, :, head.head]  # [batch, pos, d_head]
        real = ref_batch.attention_mask.bool()
        mean = acts[real].mean(0)

        def to_mean(h, head=head, mean=mean):
            h[:, :, head.head] = mean
            return h

        expected = raw_logits(llama_hf, batch, {head.layer: to_mean})
        actual = llama_tlens.logits(PROMPTS, [gna.Ablate([head], how="mean", corrupt=reference)])
        assert_close_on_tokens(actual, expected, real_positions(llama_tlens, PROMPTS))


def test_resample_ablation_matches_raw_hook(llama_hf, llama_tlens):
    batch = llama_tlens.to_batch(CLEAN)
    ref_batch = llama_tlens.to_batch(CORRUPT)
    heads = [gna.Head(1, 0), gna.Head(1, 3)]
    acts = raw_head_outputs(llama_hf, ref_batch, 1)

    def resample(h):
        h[:, :, [0, 3]] = acts[:, :, [0, 3]]
        return h

    expected = raw_logits(llama_hf, batch, {1: resample})
    actual = llama_tlens.logits(CLEAN, [gna.Ablate(heads, how="resample", corrupt=CORRUPT)])
    assert_close_on_tokens(actual, expected, real_positions(llama_tlens, CLEAN))


@pytest.mark.parametrize("positions", [None, -1, [1, 3], torch.tensor([4, 2, 0])])
def test_head_patch_matches_raw_hook(llama_hf, llama_tlens, positions):
    batch = llama_tlens.to_batch(CORRUPT)
    source = raw_head_outputs(llama_hf, llama_tlens.to_batch(CLEAN), 2)
    n_rows, n_pos = batch.input_ids.shape
    where = torch.zeros(n_rows, n_pos, dtype=torch.bool)
    if positions is None:
        where[:] = True
    elif isinstance(positions, torch.Tensor):
        where[torch.arange(n_rows), positions] = True
    elif isinstance(positions, int):
        where[:, positions] = True
    else:
        where[:, positions] = True

    def patch(h):
        h[:, :, 4][where] = source[:, :, 4][where]
        return h

    expected = raw_logits(llama_hf, batch, {2: patch})
    actual = llama_tlens.logits(CORRUPT, [gna.Patch([gna.Head(2, 4)], source=CLEAN, positions=positions)])
    assert_close_on_tokens(actual, expected, real_positions(llama_tlens, CORRUPT))
