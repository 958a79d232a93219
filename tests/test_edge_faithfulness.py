"""Faithfulness curves over edges (issue 29, item 3: "for edges, patch the corrupted sender
into the receiver's stream") against independent references:

- keeping every edge is the clean run (`evaluate` and the metric of plain logits);
- keeping none is path patching of every edge at once, by the brute-force raw-hook twin
  (tests/path_twin.py) on tiny Llama (both backends), Mamba-2 and FalconH1 models;
- keeping all but one edge is `path_patching` of that one edge, and its twin;
- the backends agree; hooks are gone even when the metric raises; the cost meter counts
  the stated forwards; bad rankings are named.
"""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.scoring.edge_faithfulness import EdgeFaithfulnessCurve, rank_edges
from gna_interp.tasks.base import Example
from gna_interp.viz.faithfulness import faithfulness_figure

from . import path_twin
from .conftest import CLEAN, CORRUPT, TOL, no_hooks_anywhere
from .test_path_patching import MIN_EFFECT, sensitive_model

H = gna.Head


def METRIC(logits):
    """Logit difference summed over every position (every position's query counts)."""
    return (logits[..., 5] - logits[..., 6]).sum(-1)


# name -> (family, config, backend, receivers, streams). One receiver per Mamba-2 group
# norm (see `edge_set_logits`: each receiver is normalised with the others' clean outputs).
MODELS = {
    "llama-tlens": ("llama", {}, "tlens", [H(1, 3), H(1, 0)], ["q", "k", "v"]),
    "llama-nnsight": ("llama", {}, "nnsight", [H(1, 3), H(1, 0)], ["q", "k", "v"]),
    "mamba2": ("mamba2", {}, None, [H(1, 2)], ["x", "B", "C", "dt"]),
    "falcon_h1": ("falcon_h1", {"mamba_rms_norm": True}, None, [H(1, 1), H(1, 6)], ["k", "v", "x", "B"]),
}


@pytest.fixture(scope="module")
def models(tokenizer):
    hfs = {
        "llama": sensitive_model("llama"),
        "mamba2": sensitive_model("mamba2"),
        "falcon_h1": sensitive_model("falcon_h1", mamba_rms_norm=True),
    }
    loaded = {
        name: gna.load(copy.deepcopy(hfs[family]), tokenizer=tokenizer, backend=backend)
        for name, (family, _, backend, _, _) in MODELS.items()
    }
    return hfs, loaded


@pytest.fixture(scope="module")
def task():
    return gna.tasks.Task("words", [Example(text=text, segments=(), correct=0, candidates=(" w5", " w6")) for text in CLEAN])


def universe(model, receivers, streams):
    """Every (sender, receiver, stream) edge from a layer-0 head, ranked in a fixed order."""
    return [(s, r, st) for r in receivers for st in streams if st in model.receiver_inputs(r) for s in model.heads if s.layer == 0]


@pytest.mark.parametrize("name", list(MODELS))
def test_ends_and_single_edge_against_the_twin(models, task, name):
    hfs, loaded = models
    family, _, _, receivers, streams = MODELS[name]
    model, hf = loaded[name], hfs[family]
    edges = universe(model, receivers, streams)
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    # Kept last (the point before the end ablates it alone): an edge with a visible effect.
    last = max(
        edges[::3],
        key=lambda e: abs(
            gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=[e[0]], receivers=[e[1]], receiver_input=e[2]) - clean_metric
        ),
    )
    order = [e for e in edges if e != last] + [last]
    curve = gna.edge_faithfulness_curve(model, task, order, sizes=[len(order) - 1], corrupt=CORRUPT, metric=METRIC, progress=False)
    assert isinstance(curve, EdgeFaithfulnessCurve)
    assert curve.sizes.tolist() == [0, len(order) - 1, len(order)] and curve.order == order
    # Every edge kept: the clean run.
    clean = gna.evaluate(model, task, progress=False)
    assert curve.metric[-1].item() == pytest.approx(clean_metric, abs=TOL)
    assert curve.accuracy[-1].item() == clean.accuracy
    assert curve.margin[-1].item() == pytest.approx(float(clean.margins.double().mean()), abs=TOL)
    # None kept: path patching of every sender into every receiver stream, by the raw-hook twin.
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    senders = sorted({s for s, _, _ in edges})
    expected = path_twin.path_patch(hf, clean_b, corrupt_b, senders, receivers, streams, METRIC)
    assert abs(expected - clean_metric) > MIN_EFFECT
    assert curve.metric[0].item() == pytest.approx(expected, abs=TOL)
    # All but one kept: path patching of that one edge (the library's, and the twin's).
    s, r, st = last
    single = path_twin.path_patch(hf, clean_b, corrupt_b, [s], [r], [st], METRIC)
    assert abs(single - clean_metric) > MIN_EFFECT, f"{last}: no effect, the test could not fail"
    assert curve.metric[1].item() == pytest.approx(single, abs=TOL)
    assert curve.metric[1].item() == pytest.approx(
        gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=[s], receivers=[r], receiver_input=st), abs=TOL
    )


def test_mixed_sender_sets_equal_separate_path_patching_where_additive(models, task):
    """Two receivers in different heads of one layer, each with its own sender set: the
    scored run patches r1's output as in path patching of set A into r1 and r2's as of set B
    into r2. Checked where the receivers' effects add: the metric's change is the sum of the
    two separate twin runs' changes only to first order, so instead the logits are checked
    against one twin run per receiver on the receiver's own output (read from the twin's C)."""
    hfs, loaded = models
    model, hf = loaded["llama-nnsight"], hfs["llama"]
    a = [(H(0, 1), H(1, 3), "k"), (H(0, 4), H(1, 3), "k")]
    b = [(H(0, 2), H(1, 0), "q")]
    kept = [(s, r, st) for s, r, st in universe(model, [H(1, 3), H(1, 0)], ["q", "k"]) if (s, r, st) not in a + b]
    order = kept + a + b
    curve = gna.edge_faithfulness_curve(model, task, order, sizes=[len(kept)], corrupt=CORRUPT, metric=METRIC, progress=False)
    # Reference: the twin with receiver r1 alone via k (senders A) gives r1's patched output;
    # with r2 alone via q (senders B) r2's; the scored run has both, so equals a clean run
    # whose two head slices are replaced by those outputs, done here with raw hooks.
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    outputs = {}
    for senders, receiver, stream in (([H(0, 1), H(0, 4)], H(1, 3), "k"), ([H(0, 2)], H(1, 0), "q")):
        outputs[receiver] = _twin_receiver_output(hf, clean_b, corrupt_b, senders, receiver, stream)
    expected = float(METRIC(_run_with_outputs(hf, clean_b, outputs)).mean())
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    assert abs(expected - clean_metric) > MIN_EFFECT
    assert curve.metric[1].item() == pytest.approx(expected, abs=TOL)


def _twin_receiver_output(hf, clean_b, corrupt_b, senders, receiver, stream):
    """The receiver's head slice (o_proj input) in the twin's final C run."""
    store = {}
    d = hf.config.hidden_size // hf.config.num_attention_heads
    o_proj = path_twin.blocks(hf)[receiver.layer].self_attn.o_proj

    def spy(module, args, output):  # a forward hook sees the input after the twin's pre-hooks
        store["x"] = args[0][..., receiver.head * d : (receiver.head + 1) * d].clone()

    handle = o_proj.register_forward_hook(spy)
    try:
        path_twin.path_patch(hf, clean_b, corrupt_b, senders, [receiver], [stream], METRIC)
    finally:
        handle.remove()
    return store["x"]  # the last o_proj call of that layer: the final C run


def _run_with_outputs(hf, batch, outputs):
    d = hf.config.hidden_size // hf.config.num_attention_heads
    handles = []

    def hook_for(heads):
        def hook(module, args):
            x = args[0].clone()
            for head, value in heads:
                x[..., head * d : (head + 1) * d] = value
            return (x,)

        return hook

    by_layer: dict[int, list] = {}
    for receiver, value in outputs.items():
        by_layer.setdefault(receiver.layer, []).append((receiver.head, value))
    try:
        for layer, heads in by_layer.items():
            handles.append(path_twin.blocks(hf)[layer].self_attn.o_proj.register_forward_pre_hook(hook_for(heads)))
        with torch.no_grad():
            return hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    finally:
        for handle in handles:
            handle.remove()


def test_backends_agree(models, task):
    loaded = models[1]
    order = universe(loaded["llama-tlens"], [H(1, 3), H(1, 0)], ["q", "k", "v"])[::-1]
    curves = [
        gna.edge_faithfulness_curve(loaded[name], task, order, sizes=[3, 17], corrupt=CORRUPT, metric=METRIC, progress=False)
        for name in ("llama-tlens", "llama-nnsight")
    ]
    assert torch.allclose(curves[0].metric, curves[1].metric, atol=TOL)
    assert torch.allclose(curves[0].margin, curves[1].margin, atol=TOL)
    assert torch.equal(curves[0].accuracy, curves[1].accuracy)


def test_an_edge_result_ranks_by_effect_and_faithfulness_curve_takes_it(models, task):
    model = models[1]["llama-nnsight"]
    metric = gna.patching.metrics.reads_position(lambda logits: logits[:, -1, 5] - logits[:, -1, 6])
    result = gna.edge_attribution(model, CLEAN, CORRUPT, metric, receivers=[H(1, 3)], receiver_input=["q", "k"])
    order, atoms = rank_edges(model, result)
    effects = [abs(float(result.scores[result.senders.index(s), 0, result.streams.index(st)])) for s, _, st in order]
    assert effects == sorted(effects, reverse=True) and len(order) == 2 * 6 == len(atoms)
    via_sibling = gna.edge_faithfulness_curve(model, task, result, sizes=[2], corrupt=CORRUPT, progress=False)
    via_curve = gna.faithfulness_curve(model, task, result, sizes=[2], corrupt=CORRUPT, progress=False)
    assert via_curve.order == via_sibling.order == order
    assert torch.equal(via_curve.margin, via_sibling.margin)
    labels = faithfulness_figure(via_curve).axes[0]
    assert labels.get_xlabel() == "edges kept (of 12; every other edge's corrupted sender patched in)"
    frame = via_curve.to_frame()
    assert frame["size"].tolist() == [0, 2, 12]
    assert frame["added"][1] == ", ".join(f"{s}->{r}.{st}" for s, r, st in order[:2])
    # "any" edges stand for every stream of the receiver: one "any" edge kept of one sender
    # is the same run as keeping each of its streams.
    any_curve = gna.edge_faithfulness_curve(
        model, task, [(H(0, 1), H(1, 3), "any")], sizes=[1], corrupt=CORRUPT, metric=METRIC, progress=False
    )
    streams = [(H(0, 1), H(1, 3), st) for st in ("q", "k", "v")]
    rest = [(s, H(1, 3), st) for st in ("q", "k", "v") for s in model.heads if s.layer == 0 and s != H(0, 1)]
    named = gna.edge_faithfulness_curve(model, task, streams + rest, sizes=[3], corrupt=CORRUPT, metric=METRIC, progress=False)
    assert any_curve.metric[1].item() == pytest.approx(named.metric[1].item(), abs=TOL)


def test_cost_is_the_stated_forwards(models, task):
    model = models[1]["llama-nnsight"]
    order = universe(model, [H(1, 3), H(1, 0)], ["q", "k"])
    with gna.cost_meter(model) as cost:
        gna.edge_faithfulness_curve(model, task, order, sizes=[5], corrupt=CORRUPT, progress=False)
    # clean + corrupt once; per size with something ablated: D, the recompute, the scored
    # run (one receiver position); every edge kept: the scored run alone.
    assert cost.forwards == 2 + 3 * 2 + 1
    # D stacks one copy per distinct sender set; the recompute one per receiver.
    n = len(CLEAN)
    # Size 0: the 4 (receiver, stream) pairs share one sender set (every layer-0 head).
    # Size 5 keeps L0H0..L0H4 -> L1H3.q: {L0H5} is left there, every head elsewhere: 2 sets.
    d_rows = n * 1 + n * 2
    assert cost.rows == 2 * n + d_rows + 2 * (2 * n) + 3 * n


@pytest.mark.parametrize("name", ["llama-tlens", "mamba2"])
def test_no_hook_outlives_a_raising_metric(models, task, name):
    model = models[1][name]
    before = model.logits(CLEAN)
    calls = {"n": 0}

    def metric(logits):
        calls["n"] += 1
        if calls["n"] > 1:  # after the setup's clean run: at the first point
            raise RuntimeError("metric failed")
        return logits[:, -1, 5]

    _, _, _, receivers, streams = MODELS[name]
    with pytest.raises(RuntimeError, match="metric failed"):
        gna.edge_faithfulness_curve(model, task, universe(model, receivers, streams), corrupt=CORRUPT, metric=metric, progress=False)
    assert torch.equal(model.logits(CLEAN), before)
    if model.backend_name == "tlens":
        assert all(not hp._forward_hooks for hp in model.backend.bridge.hook_dict.values())
    else:
        assert no_hooks_anywhere(model.hf_model)


@pytest.mark.parametrize(
    ("ranking", "kwargs", "error", "match"),
    [
        ([(H(0, 1), H(1, 3), "x")], {}, ValueError, r"ranking\[0\] has stream 'x': receiver L1H3 has the input streams \['q', 'k', 'v'\]"),
        ([(H(1, 1), H(1, 3), "q")], {}, ValueError, r"ranking\[0\] is L1H1->L1H3.q: sender L1H1 does not precede receiver L1H3"),
        ([(H(0, 1), "L1H3", "q")], {}, TypeError, r"ranking\[0\] is .*: expected \(sender Head, receiver Head, stream name\)"),
        ([(H(0, 1), H(1, 3), "q"), (H(0, 1), H(1, 3), "any")], {}, ValueError, "names an edge twice"),
        ([(H(0, 1), H(1, 3), "q")], {"sizes": [7]}, ValueError, r"sizes\[0\]=7: expected edges kept in 0..6"),
    ],
)
def test_bad_rankings_are_named(models, task, ranking, kwargs, error, match):
    with pytest.raises(error, match=match):
        gna.edge_faithfulness_curve(models[1]["llama-nnsight"], task, ranking, corrupt=CORRUPT, progress=False, **kwargs)


def test_head_options_with_an_edge_ranking_are_refused(models, task):
    with pytest.raises(ValueError, match=r"how='mean' with an edge ranking: .* expected how=None or 'resample'"):
        gna.faithfulness_curve(models[1]["llama-nnsight"], task, [(H(0, 1), H(1, 3), "q")], how="mean")
    with pytest.raises(ValueError, match=r"circuit=\[Head\(layer=0, head=2\)\]: circuit= is for head rankings.*expected circuit=None"):
        gna.faithfulness_curve(models[1]["llama-nnsight"], task, [(H(0, 1), H(1, 3), "q")], circuit=[H(0, 2)])
    with pytest.raises(ValueError, match=r"batch_size=8 with an edge ranking: .*one batch; expected the default batch_size=64"):
        gna.faithfulness_curve(models[1]["llama-nnsight"], task, [(H(0, 1), H(1, 3), "q")], batch_size=8)


def test_edge_name_spells_an_edge():
    from gna_interp.scoring.edge_faithfulness import edge_name

    assert edge_name((H(0, 1), H(1, 3), "k")) == "L0H1->L1H3.k"
    assert edge_name((H(2, 0), H(3, 5), "any")) == "L2H0->L3H5.any"


def test_receivers_in_two_layers_chain_as_path_patching(models, task):
    """Receivers in layers 1 and 2: with the edges from layer-1 senders kept and those from
    layer 0 ablated, the run is path patching of layer 0 into both (the layer-2 receiver also
    reads the layer-1 receiver's change), by the raw-hook twin."""
    hfs, loaded = models
    model, hf = loaded["llama-nnsight"], hfs["llama"]
    receivers, streams = [H(1, 3), H(2, 0)], ["k", "v"]
    first = [(s, H(2, 0), st) for st in streams for s in model.heads if s.layer == 1]  # kept
    order = first + [(s, r, st) for r in receivers for st in streams for s in model.heads if s.layer == 0]
    curve = gna.edge_faithfulness_curve(model, task, order, sizes=[len(first)], corrupt=CORRUPT, metric=METRIC, progress=False)
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    senders = [s for s in model.heads if s.layer == 0]
    expected = path_twin.path_patch(hf, clean_b, corrupt_b, senders, receivers, streams, METRIC)
    one_layer = path_twin.path_patch(hf, clean_b, corrupt_b, senders, [H(2, 0)], streams, METRIC)
    assert abs(expected - one_layer) > MIN_EFFECT  # the layer-1 receiver's change reaches layer 2: the chain matters
    assert curve.metric[1].item() == pytest.approx(expected, abs=TOL)
