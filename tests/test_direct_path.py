"""``path="direct"`` (the edge of TransformerLens, EAP and MIB: only the senders' own
writes reach the receivers' inputs) against a raw-hook twin (`tests.path_twin.path_patch_direct`),
on attention (q, k, v) and SSM (x, B, C, dt, gate) receivers, both backends, and its
difference from ``path="all"``. The models and cases are those of tests/test_path_patching.py."""

from __future__ import annotations

import pytest
import torch

import gna_interp as gna

from . import path_twin
from . import test_path_patching as base
from .conftest import CLEAN, CORRUPT, TOL
from .test_path_patching import INPUTS, METRIC, MIN_EFFECT, MODELS, cases_for, key_of

models = base.models  # the same fixture: tiny models scaled so every receiver stream matters

H = gna.Head
SSM_ONLY = ("mamba2", "mamba2-g1", "mamba")  # no MLPs
PARAMS = [(name, stream) for name in MODELS for stream in [*INPUTS[key_of(name)], "any"]]


@pytest.mark.parametrize(("name", "stream"), PARAMS)
def test_direct_matches_raw_hook_twin(models, name, stream):
    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    effects, gaps = [], []
    for senders, receivers in cases_for(model, name, stream):
        streams = stream if stream == "any" else [stream]
        expected = path_twin.path_patch_direct(hf, clean_b, corrupt_b, senders, receivers, streams, METRIC)
        actual = gna.path_patching(
            model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=stream, path="direct"
        )
        every = gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, receiver_input=stream)
        assert abs(expected - clean_metric) > 3 * TOL, f"{senders} -> {receivers} via {stream}: no effect, the test could not fail"
        assert abs(actual - expected) < TOL, (senders, receivers, stream, actual, expected)
        effects.append(abs(expected - clean_metric))
        gaps.append(abs(every - actual))
        if key_of(name) in SSM_ONLY and len({r.layer for r in receivers if r != "logits"}) == 1 and "logits" not in receivers:
            # No MLP: with the other heads frozen, D's residual at the receivers is the clean
            # one plus the senders' writes, so the two definitions coincide.
            assert abs(every - actual) < TOL
    assert max(effects) > MIN_EFFECT
    if key_of(name) not in SSM_ONLY:
        assert max(gaps) > 3 * TOL, "path='direct' equals path='all' on every case: the twin could not tell them apart"


def test_bad_path_is_refused(models):
    model = models[1]["mamba2"]
    with pytest.raises(ValueError, match="path='straight': expected 'all'"):
        gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=H(0, 0), receivers=[H(1, 0)], path="straight")


@pytest.mark.parametrize("name", ["mamba2", "mamba"])
def test_direct_edges_equal_all_without_mlps(models, name):
    """No MLP between sender and receiver: with the heads frozen, the residual stream moves
    by the sender's write alone, so the first-order scores of the two definitions agree,
    stream by stream (x, B, C, dt, gate), on the nnsight backend."""
    model = models[1][name]
    receivers, senders = ([H(1, 0), H(1, 2)], [H(0, 1), H(0, 3)]) if name == "mamba2" else ([H(1, 5), H(1, 40)], [H(0, 3), H(0, 7)])
    # Mamba-1's dt / B / C (x_proj of the receiver's held x) score 0 to first order in both definitions
    streams = INPUTS[name] if name == "mamba2" else ["x", "gate"]
    kwargs = dict(senders=senders, receivers=receivers, receiver_input=streams, progress=False)
    direct = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, path="direct", **kwargs)
    every = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, **kwargs)
    assert torch.allclose(direct.scores, every.scores, atol=TOL, rtol=0)
    assert direct.scores.abs().amax((0, 1)).min() > 3 * TOL, "a stream scores nothing: the comparison could not fail"


def test_direct_edges_agree_across_backends(models):
    """Llama (attention receivers, MLPs in between) on the tlens and nnsight backends."""
    kwargs = dict(senders=[H(0, 3), H(0, 4)], receivers=[H(1, 0), H(2, 1)], receiver_input=["q", "k", "v"], path="direct", progress=False)
    tlens = gna.edge_attribution(models[1]["llama-tlens"], CLEAN, CORRUPT, METRIC, **kwargs)
    nnsight = gna.edge_attribution(models[1]["llama-nnsight"], CLEAN, CORRUPT, METRIC, **kwargs)
    assert torch.allclose(tlens.scores, nnsight.scores, atol=TOL, rtol=0)
    assert tlens.scores.abs().max() > MIN_EFFECT


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "mamba2", "falcon_h1"])
def test_edge_faithfulness_direct_ends_against_the_twin(models, name):
    """``edge_faithfulness_curve(path="direct")``: keeping no edge is the direct path of every
    sender into every receiver stream at once, keeping all but one is that edge alone (the
    raw-hook twin both times). Receivers and streams as in tests/test_edge_faithfulness.py."""
    from gna_interp.tasks.base import Example

    from .test_edge_faithfulness import MODELS as CURVES
    from .test_edge_faithfulness import universe

    hfs, loaded = models
    _, _, _, receivers, streams = CURVES[name]
    model, hf = loaded[name], hfs[key_of(name)]
    task = gna.tasks.Task("words", [Example(text=text, segments=(), correct=0, candidates=(" w5", " w6")) for text in CLEAN])
    edges = universe(model, receivers, streams)
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    single = {e: path_twin.path_patch_direct(hf, clean_b, corrupt_b, [e[0]], [e[1]], [e[2]], METRIC) for e in edges[::3]}
    last = max(single, key=lambda e: abs(single[e] - clean_metric))
    order = [e for e in edges if e != last] + [last]
    curve = gna.edge_faithfulness_curve(
        model, task, order, sizes=[len(order) - 1], corrupt=CORRUPT, metric=METRIC, path="direct", progress=False
    )
    senders = sorted({s for s, _, _ in edges})
    expected = path_twin.path_patch_direct(hf, clean_b, corrupt_b, senders, receivers, streams, METRIC)
    assert abs(expected - clean_metric) > 5 * TOL and abs(single[last] - clean_metric) > 3 * TOL
    assert curve.metric[0].item() == pytest.approx(expected, abs=TOL)
    assert curve.metric[1].item() == pytest.approx(single[last], abs=TOL)
    assert curve.metric[2].item() == pytest.approx(clean_metric, abs=TOL)


def test_direct_scores_hold_no_graph(models):
    model = models[1]["llama-nnsight"]
    kwargs = dict(senders=[H(0, 3)], receivers=[H(1, 0)], receiver_input="q", path="direct", progress=False)
    assert not gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, **kwargs).scores.requires_grad


@pytest.mark.parametrize("name", ["llama-tlens", "falcon_h1"])
def test_direct_sweep_equals_single_calls(models, name):
    """Each sender is one copy of the batch in the sweep's stacked forwards, with its own writes."""
    model = models[1][name]
    receivers = [H(1, 0), H(2, 1), "logits"]
    sweep = gna.path_patching_sweep(model, CLEAN, CORRUPT, METRIC, receivers=receivers, path="direct", progress=False)
    assert sweep.meta["path"] == "direct"
    singles = [
        gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=h, receivers=receivers, path="direct") for h in model.heads if h.layer < 2
    ]
    scored = [float(sweep.scores[h.layer, h.head]) for h in model.heads if h.layer < 2]
    assert scored == pytest.approx(singles, abs=TOL)
    assert max(singles) - min(singles) > MIN_EFFECT


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "mamba2", "falcon_h1"])
def test_embed_sender_matches_raw_hook_twin(models, name):
    """``"embed"`` as a sender (path="direct"): the embedding's corrupt-minus-clean write into
    the receivers' inputs (and the logits), alone and beside a head."""
    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    for senders, receivers in ((["embed"], [H(0, 1), H(1, 2)]), (["embed", H(0, 1)], [H(1, 2), "logits"])):
        expected = path_twin.path_patch_direct(hf, clean_b, corrupt_b, senders, receivers, "any", METRIC)
        actual = gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=senders, receivers=receivers, path="direct")
        assert abs(expected - clean_metric) > MIN_EFFECT
        assert abs(actual - expected) < TOL, (senders, receivers, actual, expected)
    with pytest.raises(ValueError, match="senders has 'embed': the embedding is a sender with path='direct' only"):
        gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=["embed"], receivers=[H(1, 2)])
