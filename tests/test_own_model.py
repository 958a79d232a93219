"""The user's model stays theirs (issue 43, item 1): after ``gna.load(hf_model)`` the caller's
object saves (``save_pretrained``), reloads with transformers and gives the logits it gave
before, on both backends, for every family with a tiny config. TransformerLens's bridge
boots on a twin that shares every tensor (no weight is copied)."""

from __future__ import annotations

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import TINY_CONFIGS, tiny_model

IDS = torch.tensor([[1, 5, 6, 7, 8, 9], [1, 10, 11, 12, 13, 14]])
CASES = [(family, backend) for family in TINY_CONFIGS for backend in ("tlens", "nnsight")]


def raw_logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


def structure(model):
    return [(name, type(module)) for name, module in model.named_modules()]


@pytest.mark.parametrize(("family", "backend"), CASES, ids=[f"{f}-{b}" for f, b in CASES])
def test_loaded_object_saves_reloads_and_runs_as_before(family, backend, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    hf = tiny_model(family, seed=1)
    before, modules, config = raw_logits(hf), structure(hf), hf.config.to_dict()
    model = gna.load(hf, tokenizer=tokenizer, backend=backend)
    assert (model.hf_model is hf) == (backend == "nnsight")  # tlens runs a twin sharing hf's tensors
    text = ["w5 w6 w7 w8 w9", "w10 w11 w12 w13 w14"]
    torch.testing.assert_close(model.logits(text), before, atol=1e-4, rtol=1e-4)  # the wrapper runs the same weights
    assert structure(hf) == modules, "the caller's module tree changed"
    assert hf.config.to_dict() == config, "the caller's config changed"
    torch.testing.assert_close(raw_logits(hf), before, atol=0, rtol=0)
    hf.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(raw_logits(reloaded), before, atol=0, rtol=0)


def test_bridge_twin_shares_every_tensor(tokenizer):
    """No weight copied: the bridge's model holds the caller's own parameter and buffer
    objects (plus the zero unembedding bias the bridge adds), so an in-place weight edit on the caller's model reaches the wrapper."""
    hf = tiny_model("qwen2", seed=2)
    model = gna.load(hf, tokenizer=tokenizer, backend="tlens")
    twin = model.hf_model
    assert twin is not hf and twin is model.backend.root
    mine = {id(t) for t in (*hf.parameters(), *hf.buffers())}
    theirs = {id(t): t for t in (*twin.parameters(), *twin.buffers())}
    assert mine <= theirs.keys()
    added = sum(t.numel() for key, t in theirs.items() if key not in mine)  # the bridge's zero unembedding bias
    assert added == hf.config.vocab_size
    with torch.no_grad():
        hf.lm_head.weight.mul_(2.0)
    torch.testing.assert_close(model.logits(["w5 w6 w7"])[0], raw_logits(hf, IDS[:1, :4])[0], atol=1e-4, rtol=1e-4)


def test_user_module_of_a_described_family_unchanged(tokenizer):
    """A plain ``torch.nn.Module`` with ``arch=`` (examples/describe_architecture.py): its
    module tree and state dict are as they were, and it computes what it did."""
    from .test_user_family import example_module

    module = example_module()
    raw = module.build(seed=4)
    modules, state = structure(raw), {k: v.clone() for k, v in raw.state_dict().items()}
    before = raw_logits(raw, IDS[:1])
    gna.load(raw, tokenizer=tokenizer, arch=module.TINY_LM)
    assert structure(raw) == modules
    assert raw.state_dict().keys() == state.keys() and all(torch.equal(raw.state_dict()[k], v) for k, v in state.items())
    torch.testing.assert_close(raw_logits(raw, IDS[:1]), before, atol=0, rtol=0)
