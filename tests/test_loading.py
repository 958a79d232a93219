"""The real loading path (``from_pretrained`` on a folder) and every table row."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

import gna_interp as gna
from gna_interp.models.registry import ARCHITECTURES
from gna_interp.models.tiny import TINY_CONFIGS, tiny_model

from .conftest import CLEAN, TOL, raw_logits


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_load_from_a_local_folder(tmp_path, tokenizer, family):
    hf = tiny_model(family, seed=5)
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model = gna.load(str(tmp_path))
    assert model.backend_name == ("tlens" if family == "llama" else "nnsight")
    assert torch.allclose(model.logits(CLEAN), raw_logits(hf, model.to_batch(CLEAN)), atol=TOL)
    assert model.name == str(tmp_path)  # the config's name_or_path, set by from_pretrained


def test_every_table_row_has_a_tiny_config():
    # llamba: not a transformers class, its tiny model is gna_interp.models.llamba.tiny_llamba;
    # gna_hybrid_student: built from a tiny Llama by gna.hybridize (tests/test_hybrid_student.py)
    twins = {"llamba", "gna_hybrid_student"}
    assert {spec.family for spec in ARCHITECTURES} - twins <= set(TINY_CONFIGS)


# SSM and hybrid rows on both backends: tests/test_tlens_ssm.py.
@pytest.mark.parametrize("family", [spec.family for spec in ARCHITECTURES if spec.tlens and spec.layer_kind is gna.LayerKind.ATTENTION])
def test_transformer_rows_agree_across_backends(family, tokenizer):
    hf = tiny_model(family, seed=6)
    tl = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="tlens")
    ns = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight")
    ablate = [gna.Ablate([gna.Head(1, 1)])]
    assert torch.allclose(tl.logits(CLEAN, ablate), ns.logits(CLEAN, ablate), atol=TOL)
    assert torch.allclose(tl.logits(CLEAN), raw_logits(hf, tl.to_batch(CLEAN)), atol=TOL)


def test_model_structure(llama_tlens):
    assert llama_tlens.n_layers == 3 and llama_tlens.n_heads == 6 and llama_tlens.head_dim == 8
    assert llama_tlens.layer_kinds == (gna.LayerKind.ATTENTION,) * 3
    assert len(llama_tlens.heads) == 18 and llama_tlens.heads[7] == gna.Head(1, 1)
    captured = llama_tlens.cache(CLEAN, [gna.Head(1, 1), gna.Resid(3)])
    assert captured[gna.Head(1, 1)].shape == (3, 5, 8) and captured[gna.Resid(3)].shape == (3, 5, 48)


def test_cli_bad_command_is_one_line():
    result = subprocess.run([sys.executable, "-m", "gna_interp.cli", "nope"], capture_output=True, text=True)
    assert result.returncode == 2 and "invalid choice: 'nope'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_nnsight_leaves_a_cpu_model_on_the_cpu_when_a_gpu_exists(monkeypatch, family):
    """nnsight wraps the model in a transformers pipeline, which moves it to the GPU when one
    exists (seen on an H200: a CPU model's logits came back on cuda:0). Here CUDA is faked
    as present, so any move to it raises; the handle must run where the weights are."""
    from gna_interp.models.tiny import word_tokenizer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    hf = tiny_model(family, seed=0)
    tokenizer = word_tokenizer()
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight")
    assert model.device == torch.device("cpu")
    ids = tokenizer(["w5 w6 w7 w8"], return_tensors="pt").input_ids
    torch.testing.assert_close(model.logits(["w5 w6 w7 w8"]), hf(ids).logits, rtol=0, atol=1e-5)
