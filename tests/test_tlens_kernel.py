"""The tlens backend runs HF's own attention kernel inside the bridge when a forward reads
no pattern, and the bridge's step-by-step attention when it does; and HF's own norms where
no hook sits on a norm (`TLensBackend._native_forwards`). Checked against the pristine HF
model (raw forward, sdpa), by counting calls of the bridge's own forwards, and for residue
after calls that raise."""

from __future__ import annotations

import copy

import pytest
import torch
from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge
from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
    PositionEmbeddingsAttentionBridge,
)

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import CLEAN, PROMPTS

H = gna.Head
FAMILIES = ("llama", "qwen2", "falcon_h1", "qwen3_next")


def hf_logits(hf, batch) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


def count_calls(monkeypatch, cls: type) -> dict[str, int]:
    """Calls of ``cls.forward`` (the class's own, not an instance's shadow) from now on."""
    calls = {"n": 0}
    original = cls.forward

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", counting)
    return calls


@pytest.fixture
def count_bridge_attention(monkeypatch):
    """Calls of the bridge's own (step-by-step) attention forward."""
    return count_calls(monkeypatch, PositionEmbeddingsAttentionBridge)


@pytest.fixture
def count_bridge_norms(monkeypatch):
    """Calls of the bridge's own normalization forward."""
    return count_calls(monkeypatch, NormalizationBridge)


def attentions(model: gna.GnaModel) -> list[torch.nn.Module]:
    return [m for m in model.backend.bridge.modules() if isinstance(m, PositionEmbeddingsAttentionBridge)]


def norms(model: gna.GnaModel) -> list[torch.nn.Module]:
    return [m for m in model.backend.bridge.modules() if isinstance(m, NormalizationBridge)]


def loaded(hf: torch.nn.Module, tokenizer) -> gna.GnaModel:
    """``hf`` on the bridge, with the attention kernel its config names after booting: the
    bridge's eager on TransformerLens 4.x, HF's own kernel on 3.9 (which leaves the config)."""
    model = gna.load(hf, tokenizer=tokenizer, backend="tlens")
    model.booted_kernel = model.backend.root.config._attn_implementation
    return model


def assert_pristine(model: gna.GnaModel) -> None:
    """No attention or norm forward left shadowed, and the config back on the kernel it had after booting."""
    assert all("forward" not in m.__dict__ for m in attentions(model) + norms(model))
    assert model.backend.root.config._attn_implementation == model.booted_kernel


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_forwards_run_hf_attention_and_equal_hf(family, tokenizer, count_bridge_attention, count_bridge_norms):
    hf = tiny_model(family, seed=4)
    model = loaded(copy.deepcopy(hf), tokenizer)
    assert attentions(model) and model.backend.attn_implementation == hf.config._attn_implementation
    assert len(model.backend._norms()) == len(norms(model)) > 0
    batch = model.to_batch(PROMPTS)  # left-padded
    expected = hf_logits(hf, batch)
    logits = model.logits(PROMPTS)
    assert count_bridge_attention["n"] == 0 and count_bridge_norms["n"] == 0
    # Every position, padding included: the same kernel on the same inputs (Qwen3-Next's
    # gated DeltaNet, which the bridge wraps its own way, adds about 1e-6).
    atol = 1e-5 if family == "qwen3_next" else 1e-6
    assert torch.allclose(logits, expected, atol=atol, rtol=0), float((logits - expected).abs().max())
    assert_pristine(model)


def test_pattern_reads_run_the_bridge_attention(tokenizer, count_bridge_attention):
    hf = tiny_model("llama", seed=4)
    model = loaded(copy.deepcopy(hf), tokenizer)
    n_attention = len(attentions(model))
    patterns = gna.attention_pattern(model, CLEAN, [H(1, 2)])
    assert count_bridge_attention["n"] == n_attention  # hook_pattern needs the bridge's own attention
    assert patterns.shape[-2:] == (5, 5) and torch.allclose(patterns.sum(-1), torch.ones(()))
    assert_pristine(model)
    count_bridge_attention["n"] = 0
    model.logits(CLEAN, [gna.Ablate([H(1, 2)])])  # an edit of a projection's hook point only
    assert count_bridge_attention["n"] == 0
    assert_pristine(model)


def test_ablation_on_the_kernel_equals_a_raw_hook(tokenizer):
    """The head hook (``o.hook_in``) still fires inside HF's attention: zeroing a head equals
    a raw pre-hook on the pristine model's ``o_proj``."""
    hf = tiny_model("llama", seed=4)
    model = loaded(copy.deepcopy(hf), tokenizer)
    batch = model.to_batch(PROMPTS)
    o_proj = hf.model.layers[1].self_attn.o_proj
    width = hf.config.head_dim if getattr(hf.config, "head_dim", None) else hf.config.hidden_size // hf.config.num_attention_heads

    def zero_head(module, args):
        x = args[0].clone()
        x[..., 2 * width : 3 * width] = 0
        return (x,)

    handle = o_proj.register_forward_pre_hook(zero_head)
    try:
        expected = hf_logits(hf, batch)
    finally:
        handle.remove()
    actual = model.logits(PROMPTS, [gna.Ablate([H(1, 2)])])
    assert torch.allclose(actual, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(actual, hf_logits(hf, batch), atol=1e-4)  # the ablation did something


class Boom(RuntimeError):
    pass


def test_a_failing_forward_leaves_the_bridge_as_it_was(tokenizer):
    model = loaded(tiny_model("llama", seed=4), tokenizer)
    before = model.logits(CLEAN)

    def exploding(values):
        raise Boom("metric failed")

    with pytest.raises(Boom):
        gna.ablation_sweep(model, CLEAN, None, exploding, heads=[H(0, 1), H(1, 2)], progress=False)
    assert_pristine(model)
    bad = gna.core.plan.Plan()
    bad.add(model.head_site(H(1, 2))[0], gna.core.plan.Edit(torch.ones(1, 1, 1, 1, dtype=torch.bool), torch.zeros(3, 3, 3, 3, 3)))
    with pytest.raises(RuntimeError):
        model.backend.run(model.to_batch(CLEAN), bad)  # raises inside the kernel's forward
    assert_pristine(model)
    assert torch.equal(model.logits(CLEAN), before)


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_a_hooked_norm_runs_the_bridge_norm(family, tokenizer, count_bridge_norms):
    """A hook on any hook point of a norm keeps that norm on the bridge's own forward (so
    the hook fires, and an edit there acts); every other norm runs HF's."""
    hf = tiny_model(family, seed=4)
    model = loaded(copy.deepcopy(hf), tokenizer)
    backend = model.backend
    norm = norms(model)[1]
    name = norm.hook_out.name
    seen: list[torch.Tensor] = []

    def double(act, hook=None):
        seen.append(act)
        return 2 * act

    batch = model.to_batch(PROMPTS)
    plain = model.logits(PROMPTS)
    with backend._native_forwards([name], patterns=False), backend._named_hooks([(name, double)]):
        assert "forward" not in norm.__dict__
        assert all("forward" in other.__dict__ for other in norms(model) if other is not norm)
        with torch.no_grad():
            edited = backend.bridge(batch.input_ids, attention_mask=batch.attention_mask)
    assert count_bridge_norms["n"] == 1 and len(seen) == 1
    assert not torch.allclose(edited, plain, atol=1e-3)  # the edit at hook_out acted
    assert_pristine(model)
    assert not norm.hook_out.fwd_hooks  # the hook went with its context
    assert torch.equal(model.logits(PROMPTS), plain)
