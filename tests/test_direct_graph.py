"""The direct graph's other nodes (EAP's, MIB's, TransformerLens's edge granularity):
``"embed"`` and MLPs (``"L0MLP"``) as senders, MLPs and ``"logits"`` as receivers, with
``path="direct"``, against the raw-hook twin (`tests.path_twin.path_patch_direct`: plain HF
forwards with hooks, the sender's corrupt-minus-clean write added to the receiver's input
alone). Llama on both backends, FalconH1 (attention, Mamba-2 and an MLP per block) and
Mamba-2 (no MLP: embed and logits only). The models are those of tests/test_path_patching.py."""

from __future__ import annotations

import pytest
import torch

import gna_interp as gna

from . import path_twin
from . import test_path_patching as base
from .conftest import CLEAN, CORRUPT, TOL
from .test_path_patching import METRIC, MIN_EFFECT, key_of

models = base.models

H = gna.Head
# (senders, receivers, receiver_input): every new kind of end, alone and mixed with heads
CASES = [
    (["embed"], ["L0MLP"], "any"),
    ([H(0, 1)], ["L0MLP"], "any"),
    (["L0MLP"], [H(1, 2)], "any"),
    (["L0MLP"], [H(1, 2)], "q"),
    (["L0MLP"], ["L1MLP"], "any"),
    (["L0MLP", "embed"], ["logits"], "any"),
    (["L1MLP", H(0, 3)], ["logits", H(2, 0)], "any"),
    ([H(0, 1)], ["L0MLP", H(1, 0), "L1MLP", "logits"], "any"),
    (["embed", "L0MLP", H(1, 1)], ["L1MLP", H(2, 0)], "v"),
]
SSM_CASES = [(["embed"], ["logits"], "any"), (["embed", H(0, 1)], ["logits", H(1, 2)], "x"), ([H(1, 0)], ["logits"], "any")]


def twin_and_ours(models, name, cases):
    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    gaps, effects = [], []
    for senders, receivers, stream in cases:
        streams = stream if stream == "any" else [stream]
        expected = path_twin.path_patch_direct(hf, clean_b, corrupt_b, senders, receivers, streams, METRIC)
        actual = gna.path_patching(
            model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=stream, path="direct"
        )
        gaps.append(abs(actual - expected))
        effects.append(abs(expected - clean_metric))
        assert abs(expected - clean_metric) > 3 * TOL, f"{senders} -> {receivers}: no effect, the test could not fail"
        assert abs(actual - expected) < TOL, (senders, receivers, stream, actual, expected)
    assert max(effects) > MIN_EFFECT
    return max(gaps)


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "falcon_h1"])
def test_mlp_and_embed_nodes_match_raw_hook_twin(models, name):
    twin_and_ours(models, name, CASES)


def test_ssm_embed_and_logits_match_raw_hook_twin(models):
    twin_and_ours(models, "mamba2", SSM_CASES)
    with pytest.raises(ValueError, match="'L0MLP': the mamba2 family has no MLP node"):
        gna.path_patching(models[1]["mamba2"], CLEAN, CORRUPT, METRIC, senders=["L0MLP"], receivers=["logits"], path="direct")
    with pytest.raises(ValueError, match="'L1MLP': the mamba2 family has no MLP node"):
        gna.path_patching(models[1]["mamba2"], CLEAN, CORRUPT, METRIC, senders=["embed"], receivers=["L1MLP"], path="direct")


def test_mlp_nodes_need_path_direct(models):
    model = models[1]["llama-nnsight"]
    with pytest.raises(ValueError, match="senders has 'L0MLP': an MLP is an edge's end with path='direct' only"):
        gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=["L0MLP"], receivers=[H(1, 0)])
    with pytest.raises(ValueError, match="receivers has 'L1MLP': an MLP is an edge's end with path='direct' only"):
        gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=[H(0, 0)], receivers=["L1MLP"])
    with pytest.raises(ValueError, match="receivers has 'L1MLP': an MLP is an edge's end with path='direct' only"):
        gna.path_patching_sweep(model, CLEAN, CORRUPT, METRIC, receivers=["L1MLP"], progress=False)
    with pytest.raises(ValueError, match="'L7MLP': the model has 3 layers"):
        gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=["L7MLP"], receivers=["logits"], path="direct")
    with pytest.raises(ValueError, match="sender L1MLP is in layer 1, at or after every receiver"):
        gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=["L1MLP"], receivers=["L1MLP"], path="direct")


@pytest.mark.parametrize("name", ["llama-tlens", "falcon_h1"])
def test_sweep_into_mlps_equals_single_calls(models, name):
    """Each sender head is one copy of the batch in the sweep's stacked forwards."""
    model = models[1][name]
    receivers = ["L0MLP", H(1, 0), "L1MLP"]
    sweep = gna.path_patching_sweep(model, CLEAN, CORRUPT, METRIC, receivers=receivers, path="direct", progress=False)
    assert sweep.meta["receivers"] == ["L1H0", "L0MLP", "L1MLP"]
    heads = [h for h in model.heads if h.layer < 2]
    singles = [gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=h, receivers=receivers, path="direct") for h in heads]
    assert [float(sweep.scores[h.layer, h.head]) for h in heads] == pytest.approx(singles, abs=TOL)
    assert torch.isnan(sweep.scores[2]).all()
    assert max(singles) - min(singles) > MIN_EFFECT
