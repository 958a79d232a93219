"""Path patching against a brute-force raw-hook twin (tests/path_twin.py), identities,
the sweep form, bad input, and no residue. Tiny random models whose attention and SSM
parameters are scaled up so every receiver stream carries a visible effect."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from . import path_twin
from .conftest import CLEAN, CORRUPT, TOL, no_hooks_anywhere

H = gna.Head


def METRIC(logits):
    """Logit difference summed over every position: each position's query and state counts."""
    return (logits[..., 5] - logits[..., 6]).sum(-1)


MIN_EFFECT = 1e-3  # every compared effect is at least 10x the tolerance: equality is not vacuous


def sensitive_model(family: str, seed: int = 0):
    """3 layers; sharper attention (q, k x4) and larger Mamba-1 step sizes and B, C, dt
    projections, so that each input stream of a receiver matters."""
    hf = tiny_model(family, seed=seed, **({} if family == "llama" else {"num_hidden_layers": 3}))
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(4)
            elif name.endswith("dt_proj.bias"):
                param.fill_(0.5)
            elif name.endswith(("x_proj.weight", "dt_proj.weight")):
                param.mul_(6)
    return hf


@pytest.fixture(scope="module")
def models(tokenizer):
    hfs = {family: sensitive_model(family) for family in ("llama", "mamba2", "mamba")}
    loaded = {
        "llama-tlens": gna.load(copy.deepcopy(hfs["llama"]), tokenizer=tokenizer, backend="tlens"),
        "llama-nnsight": gna.load(copy.deepcopy(hfs["llama"]), tokenizer=tokenizer, backend="nnsight"),
        "mamba2": gna.load(copy.deepcopy(hfs["mamba2"]), tokenizer=tokenizer),
        "mamba": gna.load(copy.deepcopy(hfs["mamba"]), tokenizer=tokenizer),
    }
    return hfs, loaded


# (senders, receivers) per family; receivers in one layer, in two layers, and with "logits".
CASES = {
    "llama": [
        ([H(0, 3), H(0, 4)], [H(1, 3)]),
        ([H(1, 1), H(1, 4)], [H(2, 1)]),
        ([H(0, 0), H(0, 1)], [H(1, 3), H(2, 1), H(2, 4), "logits"]),
    ],
    "mamba2": [
        ([H(0, 1)], [H(1, 0), H(1, 2)]),
        ([H(1, 0), H(1, 3)], [H(2, 0), H(2, 1)]),
        ([H(0, 0), H(0, 3)], [H(1, 0), H(2, 1), "logits"]),
    ],
    "mamba": [
        ([H(0, c) for c in range(0, 64, 3)], [H(1, 5), H(1, 40)]),
        ([H(1, c) for c in range(1, 64, 2)], [H(2, 7), H(2, 30)]),
        ([H(0, c) for c in range(1, 64, 2)], [H(1, 7), H(2, 30), "logits"]),
    ],
}
INPUTS = {"llama": ["q", "k", "v", "any"], "mamba2": ["x", "B", "C", "dt", "gate", "any"], "mamba": ["x", "B", "C", "dt", "gate", "any"]}
PARAMS = [(name, stream) for name in ("llama-tlens", "llama-nnsight", "mamba2", "mamba") for stream in INPUTS[name.split("-")[0]]]


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "mamba2", "mamba"])
def test_receiver_inputs_list_the_streams_the_twin_checks(models, name):
    """`GnaModel.receiver_inputs` names exactly the streams that `test_matches_raw_hook_twin`
    checks as ``receiver_input`` against the twin."""
    _, loaded = models
    model = loaded[name]
    receiver = CASES[name.split("-")[0]][0][1][0]
    assert sorted(model.receiver_inputs(receiver)) == sorted(s for s in INPUTS[name.split("-")[0]] if s != "any")


@pytest.mark.parametrize(("name", "stream"), PARAMS)
def test_matches_raw_hook_twin(models, name, stream):
    hfs, loaded = models
    family = name.split("-")[0]
    model, hf = loaded[name], hfs[family]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    for senders, receivers in CASES[family]:
        expected = path_twin.path_patch(
            hf, clean_b, corrupt_b, senders, receivers, [stream] if stream != "any" else INPUTS[family][:-1], METRIC
        )
        actual = gna.path_patching(model, CLEAN, CORRUPT, senders, receivers, METRIC, receiver_input=stream)
        assert abs(expected - clean_metric) > MIN_EFFECT, f"{senders} -> {receivers} via {stream}: no effect, the test could not fail"
        assert abs(actual - expected) < TOL, (senders, receivers, stream, actual, expected)


def test_logits_receiver_matches_twin(models):
    hfs, loaded = models
    for name, model in loaded.items():
        hf = hfs[name.split("-")[0]]
        senders = [H(1, 0), H(1, 2)]
        expected = path_twin.path_patch(hf, model.to_batch(CLEAN), model.to_batch(CORRUPT), senders, ["logits"], [], METRIC)
        actual = gna.path_patching(model, CLEAN, CORRUPT, senders, "logits", METRIC)
        assert abs(expected - float(METRIC(model.logits(CLEAN)).mean())) > MIN_EFFECT
        assert abs(actual - expected) < TOL, (name, actual, expected)


def test_backends_agree_on_llama(models):
    _, loaded = models
    for senders, receivers in CASES["llama"]:
        for stream in INPUTS["llama"]:
            values = [
                gna.path_patching(loaded[n], CLEAN, CORRUPT, senders, receivers, METRIC, stream) for n in ("llama-tlens", "llama-nnsight")
            ]
            assert abs(values[0] - values[1]) < TOL


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "mamba2", "mamba"])
def test_every_downstream_head_plus_logits_is_activation_patching(models, name):
    model = models[1][name]
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    for sender in [H(0, 3), H(1, 1)]:
        receivers = [h for h in model.heads if h.layer > sender.layer] + ["logits"]
        expected = float(METRIC(model.logits(CLEAN, [gna.Patch([sender], source=CORRUPT)])).mean())
        assert abs(expected - clean_metric) > MIN_EFFECT
        assert abs(gna.path_patching(model, CLEAN, CORRUPT, [sender], receivers, METRIC) - expected) < TOL
    # In the last layer only the direct path is left.
    last = H(model.n_layers - 1, 0)
    expected = float(METRIC(model.logits(CLEAN, [gna.Patch([last], source=CORRUPT)])).mean())
    assert abs(gna.path_patching(model, CLEAN, CORRUPT, [last], "logits", METRIC) - expected) < TOL


@pytest.mark.parametrize("name", ["llama-nnsight", "mamba2"])
def test_sweep_equals_single_calls(models, name):
    model = models[1][name]
    receivers = [H(2, 1), H(2, 2)]
    sweep = gna.path_patching_sweep(model, CLEAN, CORRUPT, receivers, METRIC, "any", max_rows=2 * len(CLEAN), progress=False)
    assert sweep.scores.shape == (3, model.n_heads) and sweep.kind == "path_patching"
    assert sweep.scores[2].isnan().all() and sweep.scores[:2].isfinite().all()
    assert abs(sweep.baseline - float(METRIC(model.logits(CLEAN)).mean())) < TOL
    assert abs(sweep.reference - float(METRIC(model.logits(CORRUPT)).mean())) < TOL
    for sender in [H(0, 0), H(0, 3), H(1, 2)]:
        single = gna.path_patching(model, CLEAN, CORRUPT, [sender], receivers, METRIC)
        assert abs(float(sweep.scores[sender.layer, sender.head]) - single) < TOL
    assert sweep.effects()[:2].abs().max() > MIN_EFFECT
    assert len(sweep.to_frame()) == 2 * model.n_heads


def test_ambient_interventions_apply_to_every_run(models):
    hfs, loaded = models
    model = loaded["llama-nnsight"]
    hf = copy.deepcopy(hfs["llama"])
    with torch.no_grad():  # the twin's Ablate: zero the head's out-projection columns
        path_twin.mixer(hf, 1).o_proj.weight[:, 5 * 8 : 6 * 8] = 0
    expected = path_twin.path_patch(hf, model.to_batch(CLEAN), model.to_batch(CORRUPT), [H(0, 2)], [H(2, 0)], ["v"], METRIC)
    with model.ablated([H(1, 5)]):
        actual = gna.path_patching(model, CLEAN, CORRUPT, [H(0, 2)], [H(2, 0)], METRIC, "v")
    assert abs(actual - expected) < TOL
    assert abs(actual - gna.path_patching(model, CLEAN, CORRUPT, [H(0, 2)], [H(2, 0)], METRIC, "v")) > MIN_EFFECT / 10


# ----- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("llama-tlens", dict(receiver_input="x"), r"receiver_input='x' is not an input stream of llama heads .*'q', 'k', 'v'"),
        ("mamba2", dict(receiver_input="q"), r"receiver_input='q' is not an input stream of mamba2 heads .*'gate', 'x', 'B'"),
        ("mamba", dict(receiver_input=["x", "k"]), r"receiver_input='k' is not an input stream of mamba heads"),
        ("mamba", dict(receiver_input="x_read"), r"receiver_input='x_read'"),
        ("mamba2", dict(senders=[]), r"senders is empty"),
        ("mamba2", dict(receivers=[]), r"receivers is empty"),
        ("mamba2", dict(receivers=["logit"]), r"receivers has 'logit'.*'logits'"),
        ("llama-nnsight", dict(senders=[H(2, 0)], receivers=[H(1, 0), H(2, 1)]), r"sender L2H0 is in layer 2, at or after every receiver"),
        ("llama-nnsight", dict(corrupt=["w5 w6 w7"] * 3), r"clean has 5 token positions and corrupt has 4"),
        ("llama-nnsight", dict(senders=[H(0, 6)]), r"head L0H6 out of range"),
    ],
)
def test_bad_input(models, name, kwargs, message):
    model = models[1][name]
    args = dict(clean=CLEAN, corrupt=CORRUPT, senders=[H(0, 0)], receivers=[H(1, 0)], metric=METRIC) | kwargs
    with pytest.raises(ValueError, match=message):
        gna.path_patching(model, **args)


def test_bad_receiver_type(models):
    with pytest.raises(TypeError, match=r"receivers must be gna_interp.Head values or 'logits', got 3"):
        gna.path_patching(models[1]["mamba2"], CLEAN, CORRUPT, [H(0, 0)], [3], METRIC)
    with pytest.raises(ValueError, match=r"sender L2H1 is in layer 2"):
        gna.path_patching_sweep(models[1]["mamba2"], CLEAN, CORRUPT, [H(2, 0)], METRIC, senders=[H(2, 1)], progress=False)


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "mamba"])
def test_raising_metric_leaves_no_residue(models, name):
    model = models[1][name]
    before = model.logits(CLEAN)
    calls = {"n": 0}

    def metric(logits):
        calls["n"] += 1
        if calls["n"] > 2:  # after the clean and corrupt runs: inside the chain
            raise RuntimeError("metric failed")
        return logits[:, -1, 5]

    with pytest.raises(RuntimeError, match="metric failed"):
        gna.path_patching_sweep(model, CLEAN, CORRUPT, [H(2, 0), "logits"], metric, max_rows=len(CLEAN), progress=False)
    assert calls["n"] == 3
    assert torch.equal(model.logits(CLEAN), before)
    if model.backend_name == "tlens":
        assert all(not hp._forward_hooks for hp in model.backend.bridge.hook_dict.values())
    else:
        assert no_hooks_anywhere(model.hf_model)


@pytest.mark.parametrize("family", ["llama", "mamba"])
def test_runs_under_remote_simulation(models, tokenizer, family):
    """The stream edits are plain torch in the trace body: nnsight's local simulation of
    NDIF gives the same numbers."""
    hfs, loaded = models
    remote = gna.load(copy.deepcopy(hfs[family]), tokenizer=tokenizer, remote="local")
    local = loaded["llama-nnsight" if family == "llama" else family]
    senders, receivers = CASES[family][-1]
    stream = "k" if family == "llama" else "any"  # a shared stream; SSM module inputs and outputs
    expected = gna.path_patching(local, CLEAN, CORRUPT, senders, receivers, METRIC, stream)
    assert abs(gna.path_patching(remote, CLEAN, CORRUPT, senders, receivers, METRIC, stream) - expected) < TOL
