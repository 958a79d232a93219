"""Issue 7, test 3: masking query rows of the attention weights.

The reference is a hand-written eager attention that zeroes chosen rows of the softmax
weights (no renormalisation), swapped in for HF's own ``eager_attention_forward`` on a
pristine copy of the model. It shares no code with the library, which applies the mask
as a zero on those heads' outputs at those rows."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import PROMPTS, assert_close_on_tokens, no_hooks_anywhere, real_positions

RowRule = Callable[[int, int, int], torch.Tensor]
"""``(layer, n_heads, n_queries) -> [batch | 1, head | 1, query, 1]`` bool: rows to zero."""


@contextmanager
def masked_eager(hf_model, rows_to_zero: RowRule) -> Iterator[None]:
    """Run ``hf_model`` with eager attention whose softmax rows chosen by ``rows_to_zero``
    are set to 0 after the softmax."""
    module = importlib.import_module(type(hf_model).__module__)
    original = module.eager_attention_forward

    def eager_with_rows_zeroed(attn, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
        scores = query @ key.transpose(2, 3) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, : key.shape[-2]]
        weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        zero = rows_to_zero(getattr(attn, "layer_idx", -1), query.shape[1], query.shape[2]).to(weights.device)
        weights = weights.masked_fill(zero, 0.0)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    previous = hf_model.config._attn_implementation
    hf_model.config._attn_implementation = "eager"
    module.eager_attention_forward = eager_with_rows_zeroed
    try:
        yield
    finally:
        module.eager_attention_forward = original
        hf_model.config._attn_implementation = previous


def reference_logits(hf_model, batch, rows_to_zero: RowRule) -> torch.Tensor:
    with masked_eager(hf_model, rows_to_zero), torch.no_grad():
        return hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


def rows(positions: list[int] | torch.Tensor, n_queries: int, n_rows: int = 1) -> torch.Tensor:
    """``[batch | 1, 1, query, 1]`` bool from the same positions for every row, or one per row."""
    mask = torch.zeros(n_rows, 1, n_queries, 1, dtype=torch.bool)
    if isinstance(positions, torch.Tensor):
        mask[torch.arange(n_rows), 0, positions, 0] = True
    else:
        mask[:, 0, [p % n_queries for p in positions], 0] = True
    return mask


@pytest.fixture(scope="module")
def reference_llama(llama_hf):
    return copy.deepcopy(llama_hf)


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_final_row_of_every_layer(llama_models, reference_llama, backend):
    model = llama_models[backend]
    batch = model.to_batch(PROMPTS)
    got = model.logits(PROMPTS, [gna.MaskAttentionRows(-1)])
    expected = reference_logits(reference_llama, batch, lambda layer, h, q: rows([-1], q))
    assert_close_on_tokens(got, expected, real_positions(model, PROMPTS))
    # The masked row matters: the final logits move.
    clean = model.logits(PROMPTS)
    assert (got[:, -1] - clean[:, -1]).abs().max() > 1e-3


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_per_row_positions_with_padding(llama_models, reference_llama, backend):
    """One position per prompt (here each prompt's first real token, which left padding
    puts in a different column per row)."""
    model = llama_models[backend]
    batch = model.to_batch(PROMPTS)
    first_real = batch.attention_mask.long().argmax(1)
    got = model.logits(PROMPTS, [gna.MaskAttentionRows(first_real)])
    expected = reference_logits(reference_llama, batch, lambda layer, h, q: rows(first_real, q, len(PROMPTS)))
    assert_close_on_tokens(got, expected, real_positions(model, PROMPTS))


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_chosen_layers_and_heads(llama_models, reference_llama, backend):
    model = llama_models[backend]
    batch = model.to_batch(PROMPTS)
    got = model.logits(PROMPTS, [gna.MaskAttentionRows([-1, -2], layers=[1])])
    expected = reference_logits(reference_llama, batch, lambda layer, h, q: rows([-1, -2], q) & (layer == 1))
    assert_close_on_tokens(got, expected, real_positions(model, PROMPTS))

    heads = [gna.Head(0, 4), gna.Head(2, 1)]

    def only_those_heads(layer: int, n_heads: int, n_queries: int) -> torch.Tensor:
        chosen = torch.zeros(1, n_heads, 1, 1, dtype=torch.bool)
        chosen[0, [h.head for h in heads if h.layer == layer]] = True
        return rows([-1], n_queries) & chosen

    got = model.logits(PROMPTS, [gna.MaskAttentionRows(-1, heads=heads)])
    expected = reference_logits(reference_llama, batch, only_those_heads)
    assert_close_on_tokens(got, expected, real_positions(model, PROMPTS))


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_keep_only_the_final_row(llama_models, reference_llama, backend):
    model = llama_models[backend]
    batch = model.to_batch(PROMPTS)
    got = model.logits(PROMPTS, [gna.MaskAttentionRows(-1, keep=True)])
    expected = reference_logits(reference_llama, batch, lambda layer, h, q: ~rows([-1], q))
    # Padding rows are zeroed too, so compare every real token.
    assert_close_on_tokens(got, expected, real_positions(model, PROMPTS))


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_masking_no_rows_is_the_identity(llama_models, backend):
    model = llama_models[backend]
    clean = model.logits(PROMPTS)
    assert torch.equal(model.logits(PROMPTS, [gna.MaskAttentionRows([])]), clean)
    assert torch.equal(model.logits(PROMPTS, [gna.MaskAttentionRows(torch.zeros(len(PROMPTS), clean.shape[1], dtype=torch.bool))]), clean)


def test_remote_simulation_equals_local(llama_hf, tokenizer):
    local = gna.load(copy.deepcopy(llama_hf), tokenizer=tokenizer, backend="nnsight")
    remote = gna.load(copy.deepcopy(llama_hf), tokenizer=tokenizer, backend="nnsight", remote="local")
    mask = [gna.MaskAttentionRows(-1, layers=[0, 2])]
    assert torch.allclose(remote.logits(PROMPTS, mask), local.logits(PROMPTS, mask), atol=1e-6)


def test_evaluate_under_row_mask_equals_logits(llama_nnsight):
    """`evaluate` with the mask scores the same logits as a direct call."""
    task = gna.toy_task("llama", 8, seed=3)
    model = gna.load_toy("llama")
    ev = gna.evaluate(model, task, [gna.MaskAttentionRows(-1)], progress=False)
    encoded = task.encode(model.tokenizer)
    logits = model.logits(task, [gna.MaskAttentionRows(-1)])[:, -1]
    scores = torch.log_softmax(logits.float(), -1)[:, encoded.candidate_ids]
    assert torch.allclose(ev.scores, scores, atol=1e-5)


def test_no_residue_after_a_raise(llama_nnsight, llama_hf):
    model = llama_nnsight
    before = model.logits(PROMPTS)
    with pytest.raises(RuntimeError, match="boom"), model.intervening(gna.MaskAttentionRows(-1)):
        model.logits(PROMPTS)
        raise RuntimeError("boom")
    assert torch.equal(model.logits(PROMPTS), before)
    assert no_hooks_anywhere(model.hf_model)
    assert model.hf_model.config._attn_implementation == llama_hf.config._attn_implementation


@pytest.mark.parametrize("family", ["jamba", "bamba", "granitemoehybrid", "nemotron_h", "zamba2", "falcon_h1", "qwen3_next"])
def test_hybrids_final_row_equals_hand_written_eager(family, tokenizer):
    """Every attention call of a hybrid (Zamba2: every application of the shared block)
    with its final query row zeroed; the SSM layers run as usual."""
    hf = tiny_model(family, seed=3)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight")
    batch = model.to_batch(PROMPTS)
    got = model.logits(PROMPTS, [gna.MaskAttentionRows(-1)])
    expected = reference_logits(copy.deepcopy(hf), batch, lambda layer, h, q: rows([-1], q))
    assert_close_on_tokens(got, expected, real_positions(model, PROMPTS))
    clean = model.logits(PROMPTS)
    assert (got[:, -1] - clean[:, -1]).abs().max() > 1e-4
    assert torch.equal(model.logits(PROMPTS, [gna.MaskAttentionRows([])]), clean)
    ssm_layers = [layer for layer, kind in enumerate(model.layer_kinds) if kind is gna.LayerKind.SSM]
    if ssm_layers:
        with pytest.raises(ValueError, match="no attention weights"):
            model.logits(PROMPTS, [gna.MaskAttentionRows(-1, layers=[ssm_layers[0]])])


def test_bad_input(llama_nnsight):
    mamba2 = gna.load(tiny_model("mamba2"), tokenizer=llama_nnsight.tokenizer)
    with pytest.raises(ValueError, match="no attention layers"):
        mamba2.logits(PROMPTS, [gna.MaskAttentionRows(-1)])
    with pytest.raises(ValueError, match="layer 7 out of range"):
        llama_nnsight.logits(PROMPTS, [gna.MaskAttentionRows(-1, layers=[7])])
    with pytest.raises(ValueError, match="position 40 out of range"):
        llama_nnsight.logits(PROMPTS, [gna.MaskAttentionRows(40)])
    with pytest.raises(ValueError, match="ambiguous"):
        gna.MaskAttentionRows(None)
    with pytest.raises(ValueError, match="not both"):
        gna.MaskAttentionRows(-1, layers=[0], heads=[gna.Head(0, 0)])
    with pytest.raises(ValueError, match="non-negative"):
        gna.MaskAttentionRows(-1, layers=[-1])
