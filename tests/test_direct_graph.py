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
from gna_interp.patching.direct import node_position

from . import path_twin
from . import test_path_patching as base
from .conftest import CLEAN, CORRUPT, TOL, no_hooks_left
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
FALCON_SSM_CASES = [  # FalconH1's Mamba-2 heads (4 .. 7 of a layer) read the MLPs' and the embedding's writes
    (["L0MLP", "embed"], [H(1, 5)], "x"),
    (["L0MLP", H(0, 6)], [H(1, 4), "L1MLP"], "B"),
    ([H(0, 2)], ["L0MLP", H(1, 7)], "dt"),
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
    twin_and_ours(models, name, CASES + (FALCON_SSM_CASES if name == "falcon_h1" else []))
    model = models[1][name]
    with pytest.raises(ValueError, match=r"no MLP node|senders must precede"):  # nor after a refused call
        gna.path_patching(model, CLEAN, CORRUPT, METRIC, senders=["L2MLP"], receivers=["L1MLP"], path="direct")
    assert no_hooks_left(model)


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


# ----- edge_attribution(path="direct"): identities against raw hooks ----------------------------


def _plain_grad(hf, batch, module, value):
    """``d mean(METRIC) / d x`` of the plain HF forward of ``batch`` whose ``module`` reads
    ``x = value`` as its first input (a pre-hook; nothing else changes): ``[batch, pos, d_model]``."""
    leaf = value.detach().clone().requires_grad_(True)
    handle = module.register_forward_pre_hook(lambda m, args: (leaf, *args[1:]))
    try:
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    finally:
        handle.remove()
    return torch.autograd.grad(METRIC(logits).mean(), leaf)[0]


def _plain_input(hf, batch, module):
    seen = {}
    handle = module.register_forward_pre_hook(lambda m, args: seen.update(x=args[0].detach().clone()))
    try:
        with torch.no_grad():
            hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    finally:
        handle.remove()
    return seen["x"]


def every_sender(model):
    mlps = [f"L{layer}MLP" for layer in range(model.n_layers)] if model.arch.mlp else []
    return ["embed", *model.heads, *mlps]


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "falcon_h1", "mamba2"])
def test_first_order_edges_sum_to_the_readers_input_change(models, name):
    """Every writer's direct edge into a reader, summed, is the reader's input change dotted
    with the metric's gradient there: the final norm's input (``"logits"``) and an MLP
    norm's input are the embedding plus every earlier write (heads through their
    out-projection, MLPs), exactly. The right side is plain HF forwards with hooks."""
    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    readers = [("logits", path_twin.final_norm(hf))]
    if model.arch.mlp:
        readers.append(("L1MLP", path_twin._mlp_modules(hf, 1)[0]))
    result = gna.edge_attribution(
        model, CLEAN, CORRUPT, METRIC, senders=every_sender(model), receivers=[r for r, _ in readers], path="direct", progress=False
    )
    for reader, module in readers:
        clean_in, corrupt_in = _plain_input(hf, clean_b, module), _plain_input(hf, corrupt_b, module)
        expected = float((_plain_grad(hf, clean_b, module, clean_in) * (corrupt_in - clean_in)).sum())
        column = result.scores[:, result.receivers.index(reader)]
        assert abs(float(column.nan_to_num(0.0).sum()) - expected) < 1e-5, (reader, float(column.nansum()), expected)
        assert abs(expected) > MIN_EFFECT and column.nan_to_num(0.0).abs().max() < 0.9 * column.nan_to_num(0.0).abs().sum()
    assert result.to_frame()["receiver"].isin([r for r, _ in readers]).all()


@pytest.mark.parametrize("name", ["llama-nnsight", "falcon_h1"])
def test_integrated_gradient_edges_sum_to_the_readers_path_integral(models, name):
    """``steps=3`` with every writer a sender: at ``alpha`` each writer's output is written
    straight through at ``clean + alpha * delta`` (`tests.test_edges_ig.Twin`: raw hooks), so
    the final norm and MLP 1's norm read ``clean + alpha * delta`` and the backward runs through
    every writer. The edges into ``"logits"`` sum to the left Riemann sum of ``grad . delta``
    at the final norm's input; those into ``"L1MLP"`` to that at MLP 1's norm input (its
    gradient through MLP 1 and everything after it: layer 2's heads and MLP)."""
    from .test_edges_ig import Twin

    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    final, (norm, _) = path_twin.final_norm(hf), path_twin._mlp_modules(hf, 1)
    steps = 3
    result = gna.edge_attribution(
        model,
        CLEAN,
        CORRUPT,
        METRIC,
        senders=every_sender(model),
        receivers=["L1MLP", "logits"],
        steps=steps,
        path="direct",
        progress=False,
    )
    twin = Twin(hf, clean_b, corrupt_b, every_sender(model))
    delta_n = _plain_input(hf, corrupt_b, final) - _plain_input(hf, clean_b, final)
    delta_in = _plain_input(hf, corrupt_b, norm) - _plain_input(hf, clean_b, norm)
    alphas = [k / steps for k in range(steps)]
    into_logits = sum(float((twin.reader_gradient("logits", alpha) * delta_n).sum()) for alpha in alphas) / steps
    into_mlp = sum(float((twin.reader_gradient("L1MLP", alpha) * delta_in).sum()) for alpha in alphas) / steps
    sums = result.scores.nan_to_num(0.0).sum(0)
    assert abs(float(sums[1]) - into_logits) < 1e-5, (float(sums[1]), into_logits)
    assert abs(float(sums[0]) - into_mlp) < 1e-5, (float(sums[0]), into_mlp)
    assert min(abs(into_logits), abs(into_mlp)) > MIN_EFFECT


def test_edge_attribution_node_errors(models):
    model = models[1]["llama-nnsight"]
    kwargs = dict(progress=False)
    with pytest.raises(ValueError, match="senders has 'embed': the embedding is a sender with path='direct' only"):
        gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, senders=["embed"], receivers=[H(1, 0)], **kwargs)
    with pytest.raises(ValueError, match="receivers has 'L1MLP': an MLP is an edge's end with path='direct' only"):
        gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=["L1MLP"], **kwargs)
    with pytest.raises(ValueError, match=r"receivers has 'L1MLP' with receiver_input=.*read the residual stream whole"):
        gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=["L1MLP", H(2, 0)], receiver_input="q", path="direct", **kwargs)
    with pytest.raises(ValueError, match="method='exact_upstream' with path='direct'"):
        gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=["L1MLP"], method="exact_upstream", path="direct", **kwargs)
    with pytest.raises(ValueError, match="'L0MLP': the mamba2 family has no MLP node"):
        gna.edge_attribution(models[1]["mamba2"], CLEAN, CORRUPT, METRIC, receivers=["L0MLP"], path="direct", **kwargs)


# ----- edge sets with the other ends: the faithfulness curve and MIB's circuit score -------------


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "falcon_h1", "mamba2"])
def test_edge_sets_with_node_ends_against_the_twin(models, name):
    """``edge_faithfulness_curve`` and ``circuit_score`` with ``path="direct"`` on every edge
    from the writers (``"embed"``, heads, MLPs) into a layer-1 head's query (Mamba-2: ``x``),
    MLP 1 and the logits: keeping no edge is the direct path of every writer into every reader
    at once (each reader gets the writers before it), keeping all but one is that edge alone
    (the raw-hook twin both times)."""
    from gna_interp.tasks.base import Example

    hfs, loaded = models
    model, hf = loaded[name], hfs[key_of(name)]
    readers = [(H(1, 0), "q" if model.arch.mlp else "x"), *((m, "any") for m in ["L1MLP"] if model.arch.mlp), ("logits", "any")]
    senders = every_sender(model)
    edges = [(s, r, stream) for r, stream in readers for s in senders if node_position(model, s) < node_position(model, r)]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    clean_metric = float(METRIC(model.logits(CLEAN)).mean())
    last = edges[-1]  # kept last: ablated alone at size n - 1
    alone = path_twin.path_patch_direct(hf, clean_b, corrupt_b, [last[0]], [last[1]], [last[2]], METRIC)
    every = path_twin.path_patch_direct(
        hf, clean_b, corrupt_b, senders, [r for r, _ in readers], [s for _, s in readers if s != "any"], METRIC
    )
    task = gna.tasks.Task("words", [Example(text=text, segments=(), correct=0, candidates=(" w5", " w6")) for text in CLEAN])
    curve = gna.edge_faithfulness_curve(
        model, task, edges, sizes=[0, len(edges) - 1], corrupt=CORRUPT, metric=METRIC, path="direct", progress=False
    )
    assert curve.metric.tolist() == pytest.approx([every, alone, clean_metric], abs=TOL)
    assert abs(every - clean_metric) > MIN_EFFECT and abs(alone - clean_metric) > 3 * TOL
    score = gna.circuit_score(model, CLEAN, CORRUPT, METRIC, edges, fractions=[0.5, 1.0], path="direct", progress=False)
    assert score.metric_empty == pytest.approx(every, abs=TOL) and score.metric_full == pytest.approx(clean_metric, abs=TOL)
    with pytest.raises(ValueError, match=r"senders has '(embed|L0MLP)': .* with path='direct' only"):
        gna.circuit_score(model, CLEAN, CORRUPT, METRIC, edges, progress=False)
