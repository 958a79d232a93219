"""A family the package's table does not know (`examples/describe_architecture.py`'s
`TinyLM`, a plain ``torch.nn.Module``), described as data, passes the checks a built-in
family passes: raw logits, ablation == zeroed out-projection columns, patterns == the
module's own weights, padded == one row at a time, path patching through every later
head == activation patching; and the registration route with its errors."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import runpy
from pathlib import Path

import pytest
import torch

import gna_interp as gna
from gna_interp.models.registry import unregister_architecture

from .conftest import CLEAN, CORRUPT, PROMPTS, no_hooks_anywhere

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "describe_architecture.py"
H = gna.Head


def example_module():
    spec = importlib.util.spec_from_file_location("describe_architecture", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def user():
    module = example_module()
    raw = module.build(seed=3)
    return module, raw


def raw_row(raw, tokenizer, text):
    with torch.no_grad():
        return raw(torch.tensor([tokenizer(text)["input_ids"]])).logits[0]


def test_unknown_family_error_says_how_to_describe_it(user, tokenizer):
    raw = user[1]
    with pytest.raises(ValueError, match=r"unknown architecture model_type='tiny_lm': supported are .*gna.register_architecture"):
        gna.load(copy.deepcopy(raw), tokenizer=tokenizer)
    with pytest.raises(TypeError, match=r"arch= expects a gna_interp.ArchSpec .* got dict"):
        gna.load(copy.deepcopy(raw), tokenizer=tokenizer, arch={"family": "tiny_lm"})


def test_registration_route(user, tokenizer):
    module, raw = user
    gna.register_architecture(module.TINY_LM)
    try:
        model = gna.load(copy.deepcopy(raw), tokenizer=tokenizer)
        assert model.arch is module.TINY_LM and "tiny_lm" in gna.models.registry.known_model_types()
        with pytest.raises(ValueError, match=r"model_type\(s\) \['tiny_lm'\] are already in the architecture table: pass replace=True"):
            gna.register_architecture(module.TINY_LM)
        with pytest.raises(ValueError, match=r"model_type\(s\) \['llama'\] are already"):
            gna.register_architecture(gna.ArchSpec("mine", ("llama",), gna.LayerKind.ATTENTION, "a", "b", module.TINY_LM.mixers, False))
    finally:
        unregister_architecture("tiny_lm")
    with pytest.raises(ValueError, match=r"unknown architecture model_type='tiny_lm'"):
        gna.load(copy.deepcopy(raw), tokenizer=tokenizer)
    with pytest.raises(
        ValueError, match=r"backend='tlens' does not support the 'tiny_lm' family \(attention layers\): use backend='nnsight'"
    ):
        gna.load(copy.deepcopy(raw), tokenizer=tokenizer, arch=module.TINY_LM, backend="tlens")
    claims_tlens = dataclasses.replace(module.TINY_LM, tlens=True)
    with pytest.raises(ValueError, match=r"backend='tlens' wraps transformers models only; this TinyLM runs on backend='nnsight'"):
        gna.load(copy.deepcopy(raw), tokenizer=tokenizer, arch=claims_tlens, backend="tlens")


@pytest.fixture(scope="module")
def loaded(user, tokenizer):
    module, raw = user
    return raw, gna.load(copy.deepcopy(raw), arch=module.TINY_LM, tokenizer=tokenizer)


def test_logits_and_ablation_equal_raw_references(loaded, tokenizer):
    raw, model = loaded
    assert (model.n_layers, model.heads_per_layer, model.head_dim) == (3, (4, 4, 4), 8)
    assert not model.to_batch(PROMPTS).attention_mask.all(), "the batch must be left-padded"
    logits = model.logits(PROMPTS)
    head = H(1, 2)
    edited = copy.deepcopy(raw)
    with torch.no_grad():
        edited.net.blocks[1].attn.o_proj.weight[:, 16:24] = 0
    ablated = model.logits(PROMPTS, [gna.Ablate([head])])
    for row, text in enumerate(PROMPTS):
        alone = raw_row(raw, tokenizer, text)
        n = alone.shape[0]
        assert (logits[row, -n:] - alone).abs().max().item() < 1e-5, text
        assert (ablated[row, -n:] - raw_row(edited, tokenizer, text)).abs().max().item() < 1e-5, text
    assert (ablated - logits).abs().max().item() > 1e-3
    assert no_hooks_anywhere(model.hf_model)


def test_patterns_equal_the_modules_weights(loaded, tokenizer):
    raw, model = loaded
    heads = [H(0, 1), H(2, 3)]
    pattern = gna.attention_pattern(model, CLEAN, heads)
    store = {}
    handles = [raw.net.blocks[h.layer].attn.register_forward_hook(lambda m, a, o, h=h: store.update({h: o[1]})) for h in heads]
    try:
        with torch.no_grad():
            raw(model.to_batch(CLEAN).input_ids)
    finally:
        for handle in handles:
            handle.remove()
    for i, h in enumerate(heads):
        assert (pattern[:, i] - store[h][:, h.head]).abs().max().item() < 1e-6, h


def test_path_patching_through_every_later_head_is_activation_patching(loaded):
    _, model = loaded

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 9]

    sender = H(0, 1)
    later = [h for h in model.heads if h.layer > 0]
    got = gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[sender], receivers=[*later, "logits"])
    expected = float(metric(model.logits(CLEAN, [gna.Patch([sender], source=CORRUPT)])).mean())
    assert abs(expected - float(metric(model.logits(CLEAN)).mean())) > 1e-4, "the sender must matter"
    assert got == pytest.approx(expected, abs=1e-5)
    only_k = gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[sender], receivers=[H(1, 0)], receiver_input="k")
    assert only_k != pytest.approx(got, abs=1e-6)


def test_example_runs(capsys):
    """In this process (a subprocess would spend most of its time importing the libraries)."""
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert "family=tiny_lm, backend=nnsight, layers=3, heads=4x8" in out, out
    assert "path patching L0H1 -> L2H0 (k):" in out and "attention of L1H2" in out
