"""Requirement 3: our activation patching equals TransformerLens's own patching
utilities (and ``run_with_hooks`` on ``hook_z``) on the same bridge."""

from __future__ import annotations

import torch
from transformer_lens import patching as tl_patching

import gna_interp as gna

from .conftest import CLEAN, CORRUPT, TOL


def _tl_metric(metric):
    return lambda logits: metric(logits).mean()


def test_head_patching_sweep_equals_transformer_lens(llama_tlens):
    bridge = llama_tlens.backend.bridge
    clean, corrupt = llama_tlens.to_batch(CLEAN), llama_tlens.to_batch(CORRUPT)
    metric = gna.logit_diff(5, 6)
    _, clean_cache = bridge.run_with_cache(clean.input_ids, attention_mask=clean.attention_mask)
    expected = tl_patching.get_act_patch_attn_head_out_all_pos(bridge, corrupt.input_ids, clean_cache, _tl_metric(metric))
    ours = gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, metric, sites="heads", progress=False)
    assert expected.shape == ours.scores.shape
    assert torch.allclose(ours.scores, expected.float(), atol=TOL)
    assert expected.std() > 1e-3, "patching effects are all equal: the comparison could not fail"


def test_resid_by_position_equals_transformer_lens(llama_tlens):
    bridge = llama_tlens.backend.bridge
    clean, corrupt = llama_tlens.to_batch(CLEAN), llama_tlens.to_batch(CORRUPT)
    metric = gna.logit_diff(5, 6)
    _, clean_cache = bridge.run_with_cache(clean.input_ids, attention_mask=clean.attention_mask)
    expected = tl_patching.get_act_patch_resid_pre(bridge, corrupt.input_ids, clean_cache, _tl_metric(metric))
    ours = gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, metric, sites="resid", by_position=True, progress=False)
    assert torch.allclose(ours.scores, expected.float(), atol=TOL)


def test_single_patch_equals_run_with_hooks_on_hook_z(llama_tlens):
    bridge = llama_tlens.backend.bridge
    clean, corrupt = llama_tlens.to_batch(CLEAN), llama_tlens.to_batch(CORRUPT)
    _, clean_cache = bridge.run_with_cache(clean.input_ids, attention_mask=clean.attention_mask)
    z_clean = clean_cache["blocks.1.attn.hook_z"]

    def hook(z, hook):
        z[:, -1, 3] = z_clean[:, -1, 3]
        return z

    expected = bridge.run_with_hooks(corrupt.input_ids, fwd_hooks=[("blocks.1.attn.hook_z", hook)])
    ours = llama_tlens.logits(CORRUPT, [gna.Patch(gna.Head(1, 3), source=CLEAN, positions=-1)])
    assert torch.allclose(ours, expected, atol=TOL)
