"""`Ablate(..., positions=)`: a head ablated only at chosen positions equals raw forward
pre-hooks on the HF out-projection that edit only those positions; the effect of a head
enters the residual stream only where it is ablated."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import PROMPTS, assert_close_on_tokens, raw_logits, real_positions


@pytest.fixture(scope="module", params=["llama-tlens", "llama-nnsight", "mamba2", "mamba"])
def pair(request, llama_hf, tokenizer):
    family, _, backend = request.param.partition("-")
    hf = llama_hf if family == "llama" else tiny_model(family, seed=2)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend=backend or None)
    return model, hf


def test_zero_at_final_position_equals_raw_hook(pair):
    model, hf = pair
    batch = model.to_batch(PROMPTS)
    heads = [gna.Head(1, 0), gna.Head(1, 2)]

    def zero_final(x):
        x[:, -1, [0, 2]] = 0
        return x

    got = model.logits(PROMPTS, [gna.Ablate(heads, positions=-1)])
    expected = raw_logits(hf, batch, {1: zero_final})
    assert_close_on_tokens(got, expected, real_positions(model, PROMPTS))
    # Earlier real tokens are untouched: a head's output at t reaches only the stream at
    # t and later ones (padding rows are left out: HF lets them attend everywhere).
    clean = model.logits(PROMPTS)
    earlier = real_positions(model, PROMPTS)[:, :-1]
    assert torch.equal(got[:, :-1][earlier], clean[:, :-1][earlier])
    assert (got[:, -1] - clean[:, -1]).abs().max() > 1e-4


def test_per_row_mask_and_mean_ablation(pair):
    model, hf = pair
    batch = model.to_batch(PROMPTS)
    mask = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    mask[0, 2] = mask[2, -3] = mask[3, -1] = True
    head = gna.Head(0, 1)
    reference = ["w40 w41 w42", "w43 w44 w45 w46 w47"]
    ref_batch = model.to_batch(reference)
    heads_ref = model.cache(reference, [head])[head]  # [batch, pos, d_head]
    real = ref_batch.attention_mask.bool()
    mean = heads_ref[real].mean(0)

    def replace(x):
        x[:, :, 1] = torch.where(mask[..., None], mean, x[:, :, 1])
        return x

    got = model.logits(PROMPTS, [gna.Ablate([head], how="mean", corrupt=reference, positions=mask)])
    expected = raw_logits(hf, batch, {0: replace})
    assert_close_on_tokens(got, expected, real_positions(model, PROMPTS))


def test_positions_none_is_the_plain_ablation(pair):
    model, _ = pair
    head = gna.Head(1, 1)
    assert torch.equal(model.logits(PROMPTS, [gna.Ablate([head], positions=None)]), model.logits(PROMPTS, [gna.Ablate([head])]))


def test_bad_positions(pair):
    model, _ = pair
    with pytest.raises(ValueError, match="position 99 out of range"):
        model.logits(PROMPTS, [gna.Ablate([gna.Head(0, 0)], positions=99)])
    with pytest.raises(ValueError, match="positions mask has shape"):
        model.logits(PROMPTS, [gna.Ablate([gna.Head(0, 0)], positions=torch.ones(2, 3, dtype=torch.bool))])


def test_evaluate_chunks_positional_interventions_like_one_forward():
    """Per-row positions are sliced with the rows: small batches give the scores of one
    whole-task forward, for per-row, [rows, k] and mask forms alike."""
    model = gna.load_toy("mamba2_counting")
    task = gna.toy_task("mamba2_counting", 23, seed=5)
    encoded = task.encode()
    n_rows, n_pos = encoded.batch.input_ids.shape
    ends_mask = torch.zeros(n_rows, n_pos, dtype=torch.bool).scatter_(1, encoded.segment_ends, True)
    head = gna.Head(0, 0)
    for item in (
        gna.Ablate([head], positions=encoded.final),
        gna.Ablate([head], positions=encoded.segment_ends),
        gna.Ablate([head], positions=ends_mask),
        gna.Ablate([head], positions=[-1, -3]),
    ):
        whole = gna.evaluate(model, task, [item], batch_size=n_rows).scores
        chunked = gna.evaluate(model, task, [item], batch_size=5).scores
        assert torch.allclose(whole, chunked, atol=1e-5), item.positions
    # [rows, k] positions mean the same as the mask they spell.
    a = gna.evaluate(model, task, [gna.Ablate([head], positions=encoded.segment_ends)]).scores
    b = gna.evaluate(model, task, [gna.Ablate([head], positions=ends_mask)]).scores
    assert torch.equal(a, b)


def test_positions_of_the_wrong_kind_are_refused(llama_nnsight):
    head = [gna.Head(0, 0)]
    with pytest.raises(TypeError, match="position True"):
        llama_nnsight.logits(PROMPTS, [gna.Ablate(head, positions=[True, False])])
    with pytest.raises(ValueError, match=r"dtype torch\.float32"):
        llama_nnsight.logits(PROMPTS, [gna.Ablate(head, positions=torch.tensor([1.0, 2.0]))])
    with pytest.raises(ValueError, match="with 2 rows"):
        llama_nnsight.logits(PROMPTS, [gna.Ablate(head, positions=torch.tensor([[1], [2]]))])
    with pytest.raises(ValueError, match="layers=\\[\\] is empty"):
        llama_nnsight.logits(PROMPTS, [gna.MaskAttentionRows(-1, layers=[])])
