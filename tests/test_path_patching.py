"""Path patching against a brute-force raw-hook twin (tests/path_twin.py), the receivers'
isolation (siblings bit-identical to clean in the final run, as every out-projection
call records it), identities, the sweep form, bad input, and no residue. Tiny random
models whose attention and SSM parameters are scaled up so every receiver stream carries
a visible effect."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.core.plan import Plan, Site, SiteKind
from gna_interp.models.tiny import tiny_model

from . import path_twin
from .conftest import CLEAN, CORRUPT, TOL, no_hooks_anywhere

H = gna.Head


def METRIC(logits):
    """Logit difference summed over every position: each position's query and state counts."""
    return (logits[..., 5] - logits[..., 6]).sum(-1)


MIN_EFFECT = 1e-3  # every compared effect is at least 10x the tolerance: equality is not vacuous


def sensitive_model(family: str, seed: int = 0, **config):
    """3 layers; sharper attention (q, k x4), larger SSM step sizes (Mamba-1 ``dt_proj``
    bias, Mamba-2 ``dt_bias``) and Mamba-1 B, C, dt projections, so that each input stream
    of a receiver matters."""
    layers = {"num_hidden_layers": 3} if family in ("mamba", "mamba2") else {}
    hf = tiny_model(family, seed=seed, **layers, **config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(4)
            elif name.endswith(("dt_proj.bias", "dt_bias")):
                param.fill_(0.5)
            elif name.endswith(("x_proj.weight", "dt_proj.weight")):
                param.mul_(6)
    return hf


# name -> (family, config overrides, backend). Grouped-query attention (6 query heads, 2
# key/value heads), Mamba-2 with 2 groups and with 1, Mamba-1, and FalconH1 (attention
# and Mamba-2 side by side, with its gated norm on).
MODELS = {
    "llama-tlens": ("llama", {}, "tlens"),
    "llama-nnsight": ("llama", {}, "nnsight"),
    "mamba2": ("mamba2", {}, None),
    "mamba2-g1": ("mamba2", {"n_groups": 1}, None),
    "mamba": ("mamba", {}, None),
    "falcon_h1": ("falcon_h1", {"mamba_rms_norm": True}, None),
}


@pytest.fixture(scope="module")
def models(tokenizer):
    hfs = {name.split("-")[0] if name.startswith("llama") else name: None for name in MODELS}
    for key in hfs:
        family, config, _ = MODELS["llama-nnsight" if key == "llama" else key]
        hfs[key] = sensitive_model(family, **config)
    loaded = {
        name: gna.load(copy.deepcopy(hfs[key_of(name)]), tokenizer=tokenizer, backend=backend) for name, (_, _, backend) in MODELS.items()
    }
    return hfs, loaded


def key_of(name: str) -> str:
    return "llama" if name.startswith("llama") else name


# (senders, receivers) per model; receivers in one layer, in two layers, and with
# "logits"; receivers with and without a sibling that shares their key/value head or
# B / C group. FalconH1 heads 0..3 are attention (key/value heads 0-1, 2-3), 4..7 Mamba-2
# (groups 4-5, 6-7); each stream is checked on the cases whose receivers all have it.
CASES = {
    "llama": [
        ([H(0, 3), H(0, 4)], [H(1, 3)]),
        ([H(0, 1), H(0, 4)], [H(2, 0), H(2, 4)]),
        ([H(0, 0), H(0, 1)], [H(1, 3), H(2, 1), H(2, 4), "logits"]),
    ],
    "mamba2": [
        ([H(0, 1)], [H(1, 0), H(1, 2)]),
        ([H(1, 1), H(1, 2)], [H(2, 0), H(2, 2)]),
        ([H(0, 0), H(0, 3)], [H(1, 0), H(2, 1), "logits"]),
    ],
    "mamba2-g1": [
        ([H(0, 0)], [H(1, 0), H(1, 2)]),
        ([H(0, 3)], [H(2, 1), H(2, 2)]),
        ([H(0, 0), H(0, 3)], [H(1, 0), H(2, 1), "logits"]),
    ],
    "mamba": [
        ([H(0, c) for c in range(0, 64, 3)], [H(1, 5), H(1, 40)]),
        ([H(1, c) for c in range(1, 64, 2)], [H(2, 7), H(2, 30)]),
        ([H(0, c) for c in range(1, 64, 2)], [H(1, 7), H(2, 30), "logits"]),
    ],
    "falcon_h1": [
        ([H(0, 1), H(0, 5)], [H(1, 0)]),
        ([H(0, 0), H(0, 6)], [H(1, 1), H(1, 2)]),
        ([H(0, 2), H(0, 7)], [H(1, 4), H(1, 7)]),
        ([H(0, 0), H(0, 6)], [H(1, 6), H(2, 4), "logits"]),
        ([H(0, 1), H(0, 5)], [H(1, 2), H(1, 6), H(2, 1), "logits"]),
    ],
}
ATTENTION, MAMBA = ["q", "k", "v"], ["gate", "x", "B", "C", "dt"]
INPUTS = {"llama": ATTENTION, "mamba2": MAMBA, "mamba2-g1": MAMBA, "mamba": MAMBA, "falcon_h1": ATTENTION + MAMBA}
PARAMS = [(name, stream) for name in MODELS for stream in [*INPUTS[key_of(name)], "any"]]


def cases_for(model, name: str, stream: str) -> list:
    """The cases whose every receiver head has ``stream`` ("any": every case)."""
    return [
        (senders, receivers)
        for senders, receivers in CASES[key_of(name)]
        if stream == "any" or all(stream in model.receiver_inputs(r) for r in receivers if r != "logits")
    ]


@pytest.mark.parametrize("name", list(MODELS))
def test_receiver_inputs_list_the_streams_the_twin_checks(models, name):
    """`GnaModel.receiver_inputs` names exactly the streams that `test_matches_raw_hook_twin`
    checks as ``receiver_input`` against the twin."""
    model = models[1][name]
    have = {s for head in model.heads for s in model.receiver_inputs(head)}
    assert sorted(have) == sorted(INPUTS[key_of(name)])


@pytest.mark.parametrize(("name", "stream"), PARAMS)
def test_matches_raw_hook_twin(models, name, stream):
    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    cases = cases_for(model, name, stream)
    assert len(cases) >= 2
    for senders, receivers in cases:
        expected = path_twin.path_patch(hf, clean_b, corrupt_b, senders, receivers, stream if stream == "any" else [stream], METRIC)
        actual = gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=stream)
        assert abs(expected - clean_metric) > MIN_EFFECT, f"{senders} -> {receivers} via {stream}: no effect, the test could not fail"
        assert abs(actual - expected) < TOL, (senders, receivers, stream, actual, expected)


@pytest.mark.parametrize("name", ["llama-nnsight", "mamba2", "mamba2-g1", "mamba", "falcon_h1"])
def test_any_is_every_stream(models, name):
    """A receiver's output depends only on its input streams (and, in a Mamba-2 group norm,
    on the other heads' clean inputs), so taking it whole from D (``"any"``) equals
    patching all its streams."""
    model = models[1][name]
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    for senders, receivers in CASES[key_of(name)][1:]:
        whole = gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input="any")
        assert abs(whole - clean_metric) > MIN_EFFECT
        assert (
            abs(
                gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=INPUTS[key_of(name)])
                - whole
            )
            < TOL
        )


# (senders, receiver heads, streams): receivers next to a sibling that reads the same shared
# unit (key/value head, B / C group, Mamba-1's dt / B / C) or shares their group norm.
SIBLING_CASES = {
    "llama-tlens": ([H(0, 3), H(0, 4)], [H(1, 0), H(1, 1)], ["k", "v", "q", "any"]),
    "llama-nnsight": ([H(0, 3), H(0, 4)], [H(1, 0), H(1, 1)], ["k", "v", "q", "any"]),
    "mamba2": ([H(0, 1)], [H(1, 0)], ["B", "C", "x", "gate", "any"]),
    "mamba2-g1": ([H(0, 1)], [H(1, 0), H(1, 2)], ["B", "C", "x", "any"]),
    "mamba": ([H(0, c) for c in range(0, 64, 3)], [H(1, 5), H(1, 40)], ["B", "dt", "x", "any"]),
    "falcon_h1": ([H(0, 1), H(0, 5)], [H(1, 1), H(1, 4)], [["k", "B"], ["v", "x"], "any"]),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_siblings_keep_their_clean_outputs(models, name):
    """What each out-projection really receives (every `F.linear` call with its weight, under
    any wrapper): in the final run the receivers' siblings are bit-identical to clean and
    the receivers are not. The twin patching the shared unit for everyone (the earlier
    definition) moves the siblings of a shared stream: the check can fail."""
    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    senders, receivers, streams = SIBLING_CASES[name]
    by_mixer: dict = {}
    for head in receivers:
        mixer, index = model.mixer_of(head)
        by_mixer.setdefault(mixer.index, (mixer, []))[1].append(index)
    for stream in streams:
        spies = {i: path_twin.final_run_inputs(out_proj_of(model, mixer)) for i, (mixer, _) in by_mixer.items()}
        with contextlib.ExitStack() as stack:
            for spy in spies.values():
                stack.enter_context(spy)
            gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=stream)
        for i, (mixer, indices) in by_mixer.items():
            calls = spies[i].inputs
            assert len(calls) == 4, len(calls)  # clean, corrupt, D, final
            clean, final = (x.reshape(*x.shape[:2], mixer.n_heads, -1) for x in (calls[0], calls[-1]))
            others = [h for h in range(mixer.n_heads) if h not in indices]
            assert torch.equal(final[:, :, others], clean[:, :, others]), (stream, mixer.path)
            assert (final[:, :, indices] - clean[:, :, indices]).abs().max() > MIN_EFFECT, (stream, mixer.path)
    shared = {"llama-tlens": "k", "llama-nnsight": "k", "mamba2": "B", "mamba2-g1": "x", "falcon_h1": "B"}.get(name)
    if shared is None:
        return  # Mamba-1: the twin has no whole-unit mode
    mixer, indices = by_mixer[max(by_mixer)]  # FalconH1: the Mamba-2 mixer, which has B
    raw_out_proj = path_twin.mixers(hf, receivers[0].layer)[mixer.index].out_proj
    with path_twin.final_run_inputs(raw_out_proj) as spy:
        path_twin.path_patch(hf, model.to_batch(CLEAN), model.to_batch(CORRUPT), senders, receivers, [shared], METRIC, whole_unit=True)
    clean, final = (x.reshape(*x.shape[:2], mixer.n_heads, -1) for x in (spy.inputs[0], spy.inputs[-1]))
    others = [h for h in range(mixer.n_heads) if h not in indices]
    assert (final[:, :, others] - clean[:, :, others]).abs().max() > MIN_EFFECT, "the shared unit moved no sibling"


def out_proj_of(model, mixer) -> torch.nn.Module:
    return model.hf_model.get_submodule(mixer.out_proj_path)


@pytest.mark.parametrize(
    ("family", "config", "cases"),
    [
        (
            "llama",
            {"num_key_value_heads": 6},
            [([H(0, 3), H(0, 4)], [H(1, 0), H(1, 3)]), ([H(0, 0), H(0, 1), H(0, 4)], [H(1, 2), H(1, 3)])],
        ),
        ("mamba2", {"n_groups": 4}, [([H(0, 1)], [H(1, 0), H(1, 2)]), ([H(0, 0), H(0, 3)], [H(1, 0), H(1, 3)])]),
    ],
    ids=["llama-kv6", "mamba2-g4"],
)
def test_without_shared_units_the_earlier_definition_is_unchanged(tokenizer, family, config, cases):
    """With a key/value head per query head, or a B / C group (and so a norm group) per
    Mamba-2 head, no stream is shared: isolating the receivers changes nothing, and the
    result equals the twin's earlier definition (the shared unit patched for everyone)."""
    hf = sensitive_model(family, **config)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight")
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    streams = list(model.receiver_inputs(H(1, 0)))
    for stream in [*streams, "any"]:
        chosen = streams if stream == "any" else [stream]
        effects = []
        for senders, receivers in cases:
            earlier = path_twin.path_patch(hf, clean_b, corrupt_b, senders, receivers, chosen, METRIC, whole_unit=True)
            assert (
                abs(gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=stream) - earlier)
                < TOL
            ), stream
            effects.append(abs(earlier - clean_metric))
        assert max(effects) > MIN_EFFECT, stream


# The paths of the issue that asked for isolation (#18), on this file's tiny models.
ISSUE_PATHS = {
    "llama-nnsight": [([H(0, 1)], [H(1, 2)]), ([H(0, 4)], [H(2, 0), H(2, 3)]), ([H(1, 5)], [H(2, 1)])],
    "mamba2-g1": [([H(0, 1)], [H(1, 2)])],
}


@pytest.mark.parametrize("name", list(ISSUE_PATHS))
def test_shared_streams_no_longer_leak(models, name):
    """``"any"`` into a grouped-query or Mamba-2 receiver equals the isolated reference, and
    differs from the earlier definition (every stream patched for everyone who shares it)
    by more than the tolerance: the leak was real."""
    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    streams = list(model.receiver_inputs(H(1, 0)))
    for senders, receivers in ISSUE_PATHS[name]:
        isolated = gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers)
        assert abs(isolated - path_twin.path_patch(hf, clean_b, corrupt_b, senders, receivers, "any", METRIC)) < TOL
        earlier = path_twin.path_patch(hf, clean_b, corrupt_b, senders, receivers, streams, METRIC, whole_unit=True)
        assert abs(isolated - earlier) > MIN_EFFECT, (senders, receivers, isolated, earlier)


def test_logits_receiver_matches_twin(models):
    hfs, loaded = models
    for name, model in loaded.items():
        hf = hfs[key_of(name)]
        senders = [H(1, 0), H(1, 2)]
        expected = path_twin.path_patch(hf, model.to_batch(CLEAN), model.to_batch(CORRUPT), senders, ["logits"], [], METRIC)
        actual = gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers="logits")
        assert abs(expected - float(METRIC(model.logits(CLEAN)).mean())) > MIN_EFFECT
        assert abs(actual - expected) < TOL, (name, actual, expected)


def test_backends_agree_on_llama(models):
    _, loaded = models
    for senders, receivers in CASES["llama"]:
        for stream in [*INPUTS["llama"], "any"]:
            values = [
                gna.path_patching(loaded[n], CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=stream)
                for n in ("llama-tlens", "llama-nnsight")
            ]
            assert abs(values[0] - values[1]) < TOL


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "mamba2", "mamba", "falcon_h1"])
def test_every_downstream_head_plus_logits_is_activation_patching(models, name):
    model = models[1][name]
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    for sender in [H(0, 3), H(1, 1)]:
        receivers = [h for h in model.heads if h.layer > sender.layer] + ["logits"]
        expected = float(METRIC(model.logits(CLEAN, [gna.Patch([sender], source=CORRUPT)])).mean())
        assert abs(expected - clean_metric) > MIN_EFFECT
        assert abs(gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=[sender], receivers=receivers) - expected) < TOL
    # In the last layer only the direct path is left.
    last = H(model.n_layers - 1, 0)
    expected = float(METRIC(model.logits(CLEAN, [gna.Patch([last], source=CORRUPT)])).mean())
    assert abs(gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=[last], receivers="logits") - expected) < TOL


@pytest.mark.parametrize("name", ["llama-nnsight", "mamba2"])
def test_sweep_equals_single_calls(models, name):
    model = models[1][name]
    receivers = [H(2, 1), H(2, 2)]
    sweep = gna.path_patching_sweep(
        model, CLEAN, CORRUPT, METRIC, receivers=receivers, receiver_input="any", batch_size=2 * len(CLEAN), progress=False
    )
    assert sweep.scores.shape == (3, model.n_heads) and sweep.kind == "path_patching"
    assert sweep.scores[2].isnan().all() and sweep.scores[:2].isfinite().all()
    assert abs(sweep.baseline - float(METRIC(model.logits(CLEAN)).mean())) < TOL
    assert abs(sweep.reference - float(METRIC(model.logits(CORRUPT)).mean())) < TOL
    for sender in [H(0, 0), H(0, 3), H(1, 2)]:
        single = gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=[sender], receivers=receivers)
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
        actual = gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=[H(0, 2)], receivers=[H(2, 0)], receiver_input="v")
    assert abs(actual - expected) < TOL
    assert (
        abs(actual - gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=[H(0, 2)], receivers=[H(2, 0)], receiver_input="v"))
        > MIN_EFFECT / 10
    )


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
        gna.path_patching(models[1]["mamba2"], CLEAN, CORRUPT, METRIC, senders=[H(0, 0)], receivers=[3])
    with pytest.raises(ValueError, match=r"sender L2H1 is in layer 2"):
        gna.path_patching_sweep(models[1]["mamba2"], CLEAN, CORRUPT, METRIC, receivers=[H(2, 0)], senders=[H(2, 1)], progress=False)


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "mamba2", "mamba"])
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
        gna.path_patching_sweep(model, CLEAN, CORRUPT, metric, receivers=[H(2, 0), "logits"], batch_size=len(CLEAN), progress=False)
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
    stream = "k" if family == "llama" else ["x", "B"]  # shared streams; SSM module inputs and outputs
    expected = gna.path_patching(local, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=stream)
    assert (
        abs(gna.path_patching(remote, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=stream) - expected) < TOL
    )


def test_pre_norm_site_only_where_a_group_norm_runs(models, tokenizer):
    """The pre-norm head site exists for mixers that run a group norm (both backends): not
    for attention, nor for FalconH1's Mamba-2 without ``mamba_rms_norm``."""
    _, loaded = models
    site = Site(SiteKind.PRE_NORM, 1)
    with pytest.raises(ValueError, match=r"layer 1 mixer 0 has no gated group norm: no pre_norm site"):
        loaded["llama-tlens"].backend.tap(site)
    with pytest.raises(ValueError, match=r"mixer 0 of layer 1 \(model.layers.1.self_attn\) has no pre_norm site"):
        loaded["llama-nnsight"].backend.steps(Plan(), {site})
    assert [m.norm_path for m in loaded["falcon_h1"].layer_specs[1].mixers] == ["", "model.layers.1.mamba.norm"]
    plain = gna.load(tiny_model("falcon_h1"), tokenizer=tokenizer)
    assert [m.norm_path for m in plain.layer_specs[1].mixers] == ["", ""]


@pytest.mark.parametrize(
    ("name", "stream", "unit"), [("llama-nnsight", "k", [H(1, 0), H(1, 1), H(1, 2)]), ("mamba2", "B", [H(1, 2), H(1, 3)])]
)
def test_a_shared_unit_for_everyone_is_every_head_that_reads_it(models, name, stream, unit):
    """The earlier definition (the receiver's key/value head or B group patched for every
    head that reads it) equals naming all those heads as receivers."""
    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    senders = CASES[key_of(name)][0][0]
    earlier = path_twin.path_patch(hf, model.to_batch(CLEAN), model.to_batch(CORRUPT), senders, unit[:1], [stream], METRIC, whole_unit=True)
    alone = gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=unit[:1], receiver_input=stream)
    assert abs(gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=unit, receiver_input=stream) - earlier) < TOL
    assert abs(alone - earlier) > MIN_EFFECT
