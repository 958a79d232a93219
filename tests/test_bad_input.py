"""Requirement 7: bad input gets a ValueError / TypeError naming the value and what was valid."""

from __future__ import annotations

import pytest
import torch

import gna_interp as gna

from .conftest import CLEAN, CORRUPT


@pytest.mark.parametrize(
    ("head", "pattern"),
    [(gna.Head(3, 0), r"layer 3 out of range.*0\.\.2"), (gna.Head(0, 6), r"head L0H6 out of range.*0\.\.5")],
)
def test_head_or_layer_out_of_range(llama_tlens, head, pattern):
    with pytest.raises(ValueError, match=pattern):
        llama_tlens.logits(CLEAN, [gna.Ablate([head])])
    with pytest.raises(ValueError, match=pattern):
        gna.ablation_sweep(llama_tlens, CLEAN, None, gna.logit_diff(5, 6), heads=[head], progress=False)


def test_negative_head_or_layer():
    with pytest.raises(ValueError, match=r"Head.layer must be >= 0, got -1"):
        gna.Head(-1, 0)
    with pytest.raises(ValueError, match=r"Head.head must be >= 0, got -2"):
        gna.Head(0, -2)
    with pytest.raises(TypeError, match=r"Head.layer must be an int, got '1'"):
        gna.Head("1", 0)  # type: ignore[arg-type]


def test_skip_layer_out_of_range(llama_tlens):
    with pytest.raises(ValueError, match=r"layer 7 out of range"):
        llama_tlens.logits(CLEAN, [gna.SkipLayers([7])])
    with pytest.raises(ValueError, match=r"Truncate\(9\) exceeds the model's 3 layers"):
        llama_tlens.logits(CLEAN, [gna.Truncate(9)])


def test_unknown_backend(llama_hf, tokenizer):
    with pytest.raises(ValueError, match=r"unknown backend 'pytorch'.*\('tlens', 'nnsight'\)"):
        gna.load(llama_hf, tokenizer=tokenizer, backend="pytorch")


def test_unknown_architecture(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match=r"unknown architecture model_type='gpt2': supported are \[.*'llama'.*'mamba2'"):
        gna.load(model, tokenizer=tokenizer)


def test_different_lengths_with_by_position(llama_tlens):
    with pytest.raises(ValueError, match=r"clean has 5 token positions and corrupt has 3 \(by_position=True\)"):
        gna.patching_sweep(llama_tlens, CLEAN, ["w5 w6", "w7 w8", "w9 w10"], gna.logit_diff(5, 6), by_position=True, progress=False)


def test_patch_source_of_other_length(llama_tlens):
    with pytest.raises(ValueError, match=r"patch source tokenizes to 3 positions but the inputs to 5"):
        llama_tlens.logits(CLEAN, [gna.Patch(gna.Head(0, 0), source="w5 w6")])


@pytest.mark.parametrize("empty", [[], "", torch.zeros(0, 0, dtype=torch.long), [[]]])
def test_empty_inputs(llama_tlens, empty):
    with pytest.raises(ValueError, match=r"empty"):
        llama_tlens.logits(empty)


def test_empty_heads(llama_tlens):
    with pytest.raises(ValueError, match=r"Ablate heads is empty"):
        gna.Ablate([])
    with pytest.raises(ValueError, match=r"heads is empty"):
        gna.ablation_sweep(llama_tlens, CLEAN, None, gna.logit_diff(5, 6), heads=[], progress=False)


@pytest.mark.parametrize("how", ["zeros", "Mean", None])
def test_unknown_ablation_kind(llama_tlens, how):
    expected = r"how=.* is not an ablation kind: expected one of \('zero', 'mean', 'resample'\)"
    with pytest.raises(ValueError, match=expected):
        gna.Ablate([gna.Head(0, 0)], how=how)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=expected):
        gna.ablation_sweep(llama_tlens, CLEAN, None, gna.logit_diff(5, 6), how=how, progress=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=expected), llama_tlens.ablated([gna.Head(0, 0)], how=how):  # type: ignore[arg-type]
        pass


def test_mean_without_corrupt():
    with pytest.raises(ValueError, match=r"how='mean' needs corrupt="):
        gna.Ablate([gna.Head(0, 0)], how="mean")


def test_remote_true_with_a_local_model_object(llama_hf, tokenizer):
    with pytest.raises(ValueError, match=r"remote=True needs a hub id.*got a local LlamaForCausalLM object"):
        gna.load(llama_hf, tokenizer=tokenizer, remote=True)


def test_remote_true_without_api_key(monkeypatch):
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setattr("gna_interp.models.loading.ndif_api_key", lambda: None)
    with pytest.raises(ValueError, match=r"remote=True needs an NDIF API key: set NDIF_API_KEY"):
        gna.load("meta-llama/Llama-3.1-70B-Instruct", remote=True)


def test_remote_with_tlens(llama_hf, tokenizer):
    with pytest.raises(ValueError, match=r"remote execution runs through nnsight"):
        gna.load(llama_hf, tokenizer=tokenizer, backend="tlens", remote="local")


def test_position_out_of_range(llama_tlens):
    with pytest.raises(ValueError, match=r"position 9 out of range for 5 positions: expected -5\.\.4"):
        llama_tlens.logits(CLEAN, [gna.Patch(gna.Head(0, 0), source=CORRUPT, positions=9)])


def test_token_id_out_of_vocabulary(llama_tlens):
    with pytest.raises(ValueError, match=r"token id 500 out of range.*vocabulary of 64"):
        llama_tlens.logits(torch.tensor([[1, 500]]))


def test_missing_local_folder():
    with pytest.raises(ValueError, match=r"model path './no/such/model' does not exist"):
        gna.load("./no/such/model")


def test_wrong_input_type(llama_tlens):
    with pytest.raises(TypeError, match=r"inputs of type float not understood"):
        llama_tlens.logits(3.5)


def test_metric_token_spec_is_unambiguous():
    logits = torch.randn(3, 2, 10)
    shared = gna.candidate_accuracy([4, 5, 6], correct=[0, 1, 2])(logits)  # a list: one set for every row
    best = logits[:, -1, [4, 5, 6]].argmax(-1)
    assert torch.equal(shared, (best == torch.tensor([0, 1, 2])).float())
    per_row = gna.target_logprob(torch.tensor([4, 5, 6]))(logits)  # a 1-D tensor: one id per row
    expected = logits[:, -1].log_softmax(-1)[torch.arange(3), torch.tensor([4, 5, 6])]
    assert torch.allclose(per_row, expected)
    with pytest.raises(ValueError, match=r"1-D tensor of 2 ids: expected one id per row \(3\)"):
        gna.target_logprob(torch.tensor([4, 5]))(logits)
    with pytest.raises(ValueError, match=r"target_logprob takes one id per row"):
        gna.target_logprob([4, 5])(logits)


def test_positions_tensor_needs_one_entry_per_row(llama_tlens):
    with pytest.raises(ValueError, match=r"positions is a 1-D tensor of 2 entries: expected one position per row \(3\)"):
        llama_tlens.logits(CLEAN, [gna.Patch(gna.Head(0, 0), source=CORRUPT, positions=torch.tensor([0, 1]))])


def test_resid_sweep_rejects_heads(llama_tlens):
    with pytest.raises(ValueError, match=r"heads= .* no meaning with sites='resid'"):
        gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, gna.logit_diff(5, 6), sites="resid", heads=[gna.Head(0, 0)], progress=False)


def test_skip_layers_type():
    with pytest.raises(TypeError, match=r"SkipLayers layers must be ints, got '1'"):
        gna.SkipLayers(["1"])  # type: ignore[list-item]
