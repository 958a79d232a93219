"""Head pruning (weight space) for toy training: a pruned model computes what the
library's zero-ablation of those heads computes; training keeps the pruned weights at
exactly 0 and leaves no hook; fine-tuning recipes load the toy they start from."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model
from gna_interp.zoo import recipe
from gna_interp.zoo.prune import frozen_at_zero, prune_heads, still_pruned
from gna_interp.zoo.store import toy_path
from gna_interp.zoo.train import build_model, train

from .conftest import CLEAN, TOL, no_hooks_anywhere

CASES = {  # family, overrides, heads to prune
    "llama": ({}, ["L1H0", "L1H4", "L2H5"]),  # grouped-query: 6 query heads share 2 key/value heads
    "llama-mha": ({"num_key_value_heads": 6}, ["L0H2", "L2H5"]),  # each head owns its k, v (the toys' case)
    "mamba2": ({}, ["L0H1", "L1H3"]),
}


def _expected_zeros(hf, heads: list[str]) -> dict[str, torch.Tensor]:
    """Written out per family: the entries a pruned head must have at 0, by parameter name."""
    zeros = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in hf.named_parameters()}
    for head in map(gna.Head.parse, heads):
        if hf.config.model_type == "mamba2":
            width, prefix = hf.config.head_dim, f"backbone.layers.{head.layer}.mixer."
            rows = slice(head.head * width, (head.head + 1) * width)  # the gate z comes first in in_proj's output
            zeros[prefix + "in_proj.weight"][rows] = True
            zeros[prefix + "out_proj.weight"][:, rows] = True
            continue
        width, prefix = hf.config.head_dim, f"model.layers.{head.layer}.self_attn."
        rows = slice(head.head * width, (head.head + 1) * width)
        zeros[prefix + "q_proj.weight"][rows] = True
        zeros[prefix + "o_proj.weight"][:, rows] = True
        if hf.config.num_key_value_heads == hf.config.num_attention_heads:
            zeros[prefix + "k_proj.weight"][rows] = True
            zeros[prefix + "v_proj.weight"][rows] = True
    return zeros


def _reference_logits(hf, heads: list[str], tokenizer) -> torch.Tensor:
    """Attention: the library's zero-ablation (activation hooks). Mamba-2: a raw pre-hook
    that zeroes the heads' channels of the gated norm's input (the head's gated output,
    before the norm its group shares), on the unpruned model."""
    if hf.config.model_type != "mamba2":
        model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight")
        return model.logits(CLEAN, [gna.Ablate([gna.Head.parse(h) for h in heads])])
    edited, width = copy.deepcopy(hf), hf.config.head_dim
    hooks = []
    for head in map(gna.Head.parse, heads):

        def zero_channels(module, args, head=head):
            scan_output = args[0].clone()
            scan_output[..., head.head * width : (head.head + 1) * width] = 0
            return (scan_output, *args[1:])

        hooks.append(edited.backbone.layers[head.layer].mixer.norm.register_forward_pre_hook(zero_channels))
    try:
        return gna.load(edited, tokenizer=tokenizer, backend="nnsight").logits(CLEAN)
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_pruned_model_equals_its_reference_and_zeroes_exactly_its_heads(case, tokenizer):
    overrides, heads = CASES[case]
    hf = tiny_model(case.split("-")[0], seed=3, **overrides)
    pruned_hf = copy.deepcopy(hf)
    masks = prune_heads(pruned_hf, heads)
    pruned = gna.load(pruned_hf, tokenizer=tokenizer, backend="nnsight").logits(CLEAN)
    clean = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight").logits(CLEAN)
    reference = _reference_logits(hf, heads, tokenizer)
    assert (pruned - clean).abs().max() > 1e-2  # the heads mattered
    assert torch.allclose(pruned, reference, atol=TOL), (pruned - reference).abs().max()
    # exactly the heads' entries are zero (and masked); every other entry is the original
    expected = _expected_zeros(hf, heads)
    original = dict(hf.named_parameters())
    by_name = {name: p for name, p in pruned_hf.named_parameters()}
    masked = {name for name, p in by_name.items() if any(p is q for q in masks)}
    assert masked == {name for name, zero in expected.items() if zero.any()}
    for name, parameter in by_name.items():
        zero = expected[name]
        assert bool((parameter[zero] == 0).all()), name
        assert torch.equal(parameter[~zero], original[name][~zero]), name
        if name in masked:
            mask = next(m for q, m in masks.items() if q is parameter)
            assert torch.equal(mask == 0, zero), name
    assert still_pruned(masks)


@pytest.mark.parametrize("name,heads", [("mamba2_8heads", ("L1H2", "L0H5")), ("llama_4heads", ("L1H1", "L0H3"))])
def test_training_keeps_pruned_heads_at_zero_and_leaves_no_hook(name, heads):
    short = dataclasses.replace(recipe(name), max_steps=3, eval_every=3, batch_size=8, pruned_heads=heads)
    start = build_model(short)
    zeros = _expected_zeros(start, list(heads))
    result = train(short, progress=False, log=lambda _: None)
    before, after = dict(start.named_parameters()), dict(result.model.named_parameters())
    for name_, zero in zeros.items():
        if zero.any():
            assert bool((after[name_][zero] == 0).all()), name_
            assert bool((after[name_][~zero] != before[name_][~zero]).any()), f"{name_}: the rest trains"
    assert no_hooks_anywhere(result.model)
    assert all(not p._backward_hooks for p in result.model.parameters())


def test_frozen_at_zero_removes_its_hooks_when_the_block_raises():
    model = tiny_model("llama", seed=1)
    masks = prune_heads(model, ["L0H2"])
    with pytest.raises(RuntimeError, match="boom"), frozen_at_zero(masks):
        assert all(p._backward_hooks for p in masks)
        raise RuntimeError("boom")
    assert all(not p._backward_hooks for p in model.parameters())


def test_the_fine_tuned_llama_recipe_starts_from_its_bundled_toy():
    fine = recipe("llama")
    assert fine.init_from == "llama_4heads" and fine.init_from in gna.toy_names()
    model = build_model(fine)
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(toy_path("llama_4heads"))
    same = build_model(fine, init=toy_path("llama_4heads"))  # the folder, given explicitly
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values(), strict=True))
    o_proj = model.model.layers[1].self_attn.o_proj.weight
    assert bool((o_proj[:, 16:] == 0).all())  # L1H1..L1H3 pruned
    assert torch.equal(o_proj[:, :16], trained.model.layers[1].self_attn.o_proj.weight[:, :16])
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, trained.model.layers[0].self_attn.q_proj.weight)


def test_bad_input():
    model = tiny_model("llama", seed=1)
    with pytest.raises(ValueError, match=r"head L7H0: the model has layers 0\.\.2"):
        prune_heads(model, ["L7H0"])
    with pytest.raises(ValueError, match=r"head L1H9: layer 1 has heads 0\.\.5"):
        prune_heads(model, ["L1H9"])
    with pytest.raises(ValueError, match="cannot parse head 'one'"):
        prune_heads(model, ["one"])
    with pytest.raises(ValueError, match="pruning heads of a 'mamba' model is not supported"):
        prune_heads(tiny_model("mamba", seed=1), ["L0H0"])
    mamba = tiny_model("mamba", seed=1)  # nothing to prune: any family trains (the Mamba-1 toy's recipe)
    before = {k: v.clone() for k, v in mamba.state_dict().items()}
    assert prune_heads(mamba, []) == {} and all(torch.equal(v, before[k]) for k, v in mamba.state_dict().items())
    with pytest.raises(ValueError, match="trains from scratch"):
        build_model(recipe("mamba2_8heads"), init="somewhere")
    with pytest.raises(ValueError, match="init='somewhere': expected the folder of a trained toy"):
        build_model(recipe("mamba2_counting"), init="somewhere")
    with pytest.raises(ValueError, match="starts from toy 'nowhere', which is not bundled"):
        build_model(dataclasses.replace(recipe("llama"), init_from="nowhere"))
    with pytest.raises(ValueError, match="is not a llama model of the recipe's config"):
        build_model(dataclasses.replace(recipe("llama"), init_from="mamba2"))


def test_resuming_from_another_init_is_refused(tmp_path):
    short = dataclasses.replace(recipe("llama"), max_steps=2, eval_every=2, batch_size=8)
    checkpoint = tmp_path / "fine.pt"
    train(short, checkpoint=checkpoint, progress=False, log=lambda _: None)
    longer = dataclasses.replace(short, max_steps=4)
    with pytest.raises(ValueError, match="was written from init=None"):
        train(longer, checkpoint=checkpoint, init=toy_path("llama_4heads"), progress=False, log=lambda _: None)
    resumed = train(longer, checkpoint=checkpoint, progress=False, log=lambda _: None)  # the same start resumes
    assert resumed.steps == 4
