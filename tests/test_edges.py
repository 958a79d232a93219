"""Edge attribution: against a hand first-order twin written with raw hooks and autograd
on the HF model (the derivative of the path-patched metric along the sender's change), on
both backends, against path patching where the model is near-linear in the change, the
result's table and frame, bad input, and no residue."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from . import path_twin
from .conftest import CLEAN, CORRUPT, no_hooks_left
from .test_path_patching import METRIC, sensitive_model

H = gna.Head
MIN_EFFECT = 1e-3  # the largest compared effect is far above the tolerance: equality is not vacuous


def twin_edge(hf, clean, corrupt, sender: gna.Head, receiver: gna.Head, stream: str, metric) -> float:
    """``d/dt`` at ``t = 0`` of the metric of C(t) (raw hooks, autograd on the scalar ``t``):

    - D(t): clean, every head's out-projection input frozen to clean, except the sender's
      columns, ``clean + t * (corrupt - clean)``; read the receiver's ``stream`` columns.
    - C(t): clean, the receiver's ``stream`` columns replaced by D(t)'s, every other head
      of its mixer given back its clean output (and, through a Mamba-2 group norm, the
      other heads' scan outputs held clean), everything after free.
    """
    clean_store, _ = path_twin.head_outputs(hf, clean)
    corrupt_store, _ = path_twin.head_outputs(hf, corrupt)
    t = torch.zeros((), requires_grad=True)
    s_mixer, s_index = path_twin.locate(hf, sender.layer, sender.head)
    r_mixer, r_index = path_twin.locate(hf, receiver.layer, receiver.head)
    mixer = path_twin.mixers(hf, receiver.layer)[r_mixer]
    module_name, columns = path_twin.stream_columns(hf, mixer.kind, stream, r_index)
    module = getattr(mixer.module, module_name)

    hooks, read = [], {}
    for layer in range(hf.config.num_hidden_layers):
        for i, m in enumerate(path_twin.mixers(hf, layer)):
            frozen = clean_store[("out", layer, i)]
            if (layer, i) == (sender.layer, s_mixer):
                cols = path_twin._columns(m, [s_index])
                change = torch.zeros_like(frozen)
                change[..., cols] = corrupt_store[("out", layer, i)][..., cols] - frozen[..., cols]
                frozen = frozen + t * change
            hooks.append((m.out_proj, "pre", lambda mod, args, f=frozen: (f, *args[1:])))
    hooks.append((module, "post", lambda mod, args, out: read.__setitem__("d", out)))
    _run_grad(hf, clean, hooks)

    def patch(mod, args, out):
        out = out.clone()
        out[..., columns] = read["d"][..., columns]
        return out

    others = path_twin._columns(mixer, [h for h in range(mixer.n_heads) if h != r_index])
    clean_out = clean_store[("out", receiver.layer, r_mixer)]

    def others_clean(mod, args):
        x = args[0].clone()
        x[..., others] = clean_out[..., others]
        return (x, *args[1:])

    hooks = [(module, "post", patch), (mixer.out_proj, "pre", others_clean)]
    if mixer.kind == "mamba2" and path_twin._has_norm(mixer):
        clean_y = clean_store[("y", receiver.layer, r_mixer)]

        def norm_others_clean(mod, args):
            y = args[0].clone()
            y[..., others] = clean_y[..., others]
            return (y, *args[1:])

        hooks.append((mixer.module.norm, "pre", norm_others_clean))
    value = metric(_run_grad(hf, clean, hooks)).float().mean()
    (grad,) = torch.autograd.grad(value, t)
    return float(grad)


def _run_grad(hf, batch, hooks):
    handles = []
    try:
        for module, kind, fn in hooks:
            handles.append(module.register_forward_hook(fn) if kind == "post" else module.register_forward_pre_hook(fn))
        return hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    finally:
        for handle in handles:
            handle.remove()


# name -> (family, config, backend)
MODELS = {
    "llama-tlens": ("llama", {}, "tlens"),
    "llama-nnsight": ("llama", {}, "nnsight"),
    "mamba2": ("mamba2", {}, "nnsight"),
    "falcon_h1": ("falcon_h1", {"mamba_rms_norm": True}, "nnsight"),
}


@pytest.fixture(scope="module")
def models(tokenizer):
    hfs = {family: sensitive_model(family, **config) for family, config, _ in MODELS.values()}
    loaded = {
        name: gna.load(copy.deepcopy(hfs[family]), tokenizer=tokenizer, backend=backend) for name, (family, _, backend) in MODELS.items()
    }
    return hfs, loaded


def receivers_of(model: gna.GnaModel) -> list[gna.Head]:
    """Two receivers in the last layer: its first and last head (in a hybrid, one
    attention and one SSM head)."""
    last = model.n_layers - 1
    return [H(last, 0), H(last, model.n_heads - 1)]


@pytest.mark.parametrize("name", list(MODELS))
def test_equals_hand_first_order_twin(models, name):
    """Every stream of two receivers, from senders in every earlier layer (and, in the
    hybrid, of both kinds), against the raw-hook autograd twin."""
    hfs, loaded = models
    model, hf = loaded[name], hfs[MODELS[name][0]]
    receivers = receivers_of(model)
    streams = list(dict.fromkeys(s for r in receivers for s in model.receiver_inputs(r)))
    result = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers, receiver_input=streams)
    assert result.dims == ("sender", "receiver", "stream") and result.streams == tuple(streams)
    senders = [h for h in result.senders if h.head in (0, model.heads_per_layer[h.layer] - 1)]
    clean, corrupt = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    compared = 0
    largest = 0.0
    for sender in senders:
        i = result.senders.index(sender)
        for j, receiver in enumerate(receivers):
            for k, stream in enumerate(streams):
                got = float(result.scores[i, j, k])
                if stream not in model.receiver_inputs(receiver):
                    assert got != got  # NaN: the receiver's mixer has no such stream
                    continue
                want = twin_edge(hf, clean, corrupt, sender, receiver, stream, METRIC)
                assert got == pytest.approx(want, abs=2e-5, rel=2e-3), (sender, receiver, stream)
                compared += 1
                largest = max(largest, abs(want))
    assert compared >= 2 * len(streams) and largest > MIN_EFFECT


@pytest.mark.parametrize("name", ["llama-tlens", "falcon_h1"])
def test_senders_scored_in_blocks_give_the_same_scores(models, monkeypatch, name):
    """`edges.SENDER_BLOCK` only bounds each product's size: blocks of 3 heads (several per
    site, the last one short) give the scores of one block per site, to float rounding."""
    from gna_interp.patching import edges

    model = models[1][name]
    receivers = receivers_of(model)
    whole = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers, progress=False)
    monkeypatch.setattr(edges, "SENDER_BLOCK", 3)
    blocked = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers, progress=False)
    assert torch.equal(whole.scores.isnan(), blocked.scores.isnan()) and whole.scores.isnan().sum() < whole.scores.numel()
    assert torch.allclose(whole.scores, blocked.scores, rtol=1e-6, atol=1e-9, equal_nan=True)


def test_backends_agree(models):
    loaded = models[1]
    receivers = [H(2, 0), H(2, 3), H(1, 5)]
    tables = [
        gna.edge_attribution(loaded[name], CLEAN, CORRUPT, METRIC, receivers=receivers, receiver_input=["q", "k", "v"]).scores
        for name in ("llama-tlens", "llama-nnsight")
    ]
    assert tables[0].isnan().equal(tables[1].isnan())
    live = ~tables[0].isnan()
    assert tables[0][live].abs().max() > MIN_EFFECT
    torch.testing.assert_close(tables[0][live], tables[1][live], atol=2e-5, rtol=1e-3)


def near_linear_llama(tokenizer):
    """The tiny Llama where each corrupt word's embedding is its clean word's plus a small
    offset: every head's corrupt-minus-clean change is small, so path patching is close
    to its first order."""
    hf = tiny_model("llama", seed=0)
    ids = {w: tokenizer.convert_tokens_to_ids(w) for w in ("w6", "w30", "w11", "w31", "w13", "w40", "w16", "w41")}
    generator = torch.Generator().manual_seed(0)
    embed = hf.get_input_embeddings().weight
    with torch.no_grad():
        for clean_word, corrupt_word in (("w6", "w30"), ("w11", "w31"), ("w13", "w40"), ("w16", "w41")):
            offset = torch.randn(embed.shape[1], generator=generator) * embed[ids[clean_word]].norm() * 0.02
            embed[ids[corrupt_word]] = embed[ids[clean_word]] + offset
    return gna.load(hf, tokenizer=tokenizer, backend="nnsight")


def test_close_to_path_patching_where_near_linear(tokenizer):
    model = near_linear_llama(tokenizer)
    receivers = [H(2, 1), H(2, 4)]
    result = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers, receiver_input=["q", "k", "v"])
    estimate, exact = [], []
    for j, receiver in enumerate(receivers):
        for k, stream in enumerate(result.streams):
            sweep = gna.path_patching_sweep(
                model, CLEAN, CORRUPT, METRIC, receivers=[receiver], receiver_input=stream, senders=result.senders, progress=False
            )
            for i, sender in enumerate(result.senders):
                estimate.append(float(result.scores[i, j, k]))
                exact.append(float(sweep.scores[sender.layer, sender.head]) - sweep.baseline)
    estimate_t, exact_t = torch.tensor(estimate), torch.tensor(exact)
    scale = exact_t.abs().max()
    assert scale > 1e-4
    assert (estimate_t - exact_t).abs().max() < 0.05 * scale, ((estimate_t - exact_t).abs().max(), scale)


def test_integrated_gradients_where_near_linear(tokenizer):
    """``steps=1`` is the first-order score; on the near-linear model every ``steps`` stays
    close to path patching, and the points move the scores (the interpolation is applied)."""
    model = near_linear_llama(tokenizer)
    receivers = [H(2, 1)]
    exact = gna.path_patching_sweep(model, CLEAN, CORRUPT, METRIC, receivers=receivers, receiver_input="v", progress=False)
    first = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers, receiver_input="v")
    one = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, steps=1, receivers=receivers, receiver_input="v")
    four = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, steps=4, receivers=receivers, receiver_input="v")
    assert torch.equal(one.scores, first.scores) and four.meta["steps"] == 4 and first.meta["method"] == "first_order"
    want = torch.tensor([float(exact.scores[h.layer, h.head]) - exact.baseline for h in four.senders])
    assert want.abs().max() > 1e-4
    assert (four.scores[:, 0] - want).abs().max() < 0.05 * want.abs().max()
    assert (four.scores - one.scores).abs().max() > 1e-4 * want.abs().max()


def test_any_is_the_sum_over_streams_and_frame(models):
    model = models[1]["falcon_h1"]
    receivers = receivers_of(model)  # an attention and an SSM receiver
    names = ["q", "k", "v", "gate", "x", "B", "C", "dt"]
    every = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers, receiver_input=names)
    whole = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers)
    assert whole.dims == ("sender", "receiver") and whole.streams == ("any",)
    torch.testing.assert_close(whole.scores, every.scores.nansum(-1), atol=1e-6, rtol=1e-5)
    one = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers[1:], receiver_input="x")
    torch.testing.assert_close(one.scores, every.scores[:, 1:, every.streams.index("x")])
    frame = every.to_frame()
    assert list(frame.columns) == ["sender", "receiver", "stream", "score", "effect"]
    assert len(frame) == int((~every.scores.isnan()).sum())  # the attention receiver has no "x": no such rows
    row = frame[(frame.sender == "L0H1") & (frame.receiver == str(receivers[1])) & (frame.stream == "B")].iloc[0]
    i = every.senders.index(H(0, 1))
    assert row.effect == pytest.approx(float(every.scores[i, 1, every.streams.index("B")]))
    assert row.score == pytest.approx(every.baseline + row.effect)
    sender, receiver, stream, effect = every.top(1)[0]
    assert abs(effect) == pytest.approx(float(every.scores.nan_to_num(0).abs().max()))
    assert every.scores[every.senders.index(sender), every.receivers.index(receiver), every.streams.index(stream)] == pytest.approx(effect)


def test_senders_after_a_receiver_have_no_edge(models):
    model = models[1]["llama-nnsight"]
    result = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=[H(1, 0), H(2, 0)], receiver_input="v")
    assert result.senders == [h for h in model.heads if h.layer < 2]
    layer1 = [i for i, h in enumerate(result.senders) if h.layer == 1]
    assert result.scores[layer1, 0].isnan().all() and not result.scores[layer1, 1].isnan().any()
    # every layer-0 sender reaches both receivers (non-zero: the tables are not vacuous)
    assert (result.scores[: model.n_heads].abs() > 0).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"steps": 0}, ValueError, r"steps=0 with method='first_order': expected an int >= 1 \(1 = first order"),
        ({"steps": 0, "method": "exact_receiver"}, ValueError, r"steps=0 with method='exact_receiver': expected an int >= 1 \(midpoints"),
        ({"steps": 2.0}, ValueError, r"steps=2.0 with method='first_order': expected an int >= 1"),
        ({"receivers": ["logits"]}, ValueError, r"receivers includes 'logits'.*'logits' has none"),
        ({"receiver_input": "x"}, ValueError, r"receiver_input='x' is not an input stream of llama heads"),
        ({"senders": [H(2, 1)]}, ValueError, r"senders has L2H1, at or after every receiver \(the last sits at layer 2\)"),
        ({"receivers": [H(0, 0)]}, ValueError, r"no head precedes the receivers \['L0H0'\]"),
        ({"method": "atp"}, ValueError, r"method='atp': expected one of \('first_order', 'exact_upstream', 'exact_receiver'\)"),
        (
            {"method": "exact_upstream", "batch_size": 8},
            ValueError,
            r"batch_size=8 with method='exact_upstream': this method does not chunk.*expected batch_size=None",
        ),
        (
            {"method": "exact_receiver", "memory_budget_mb": 64.0},
            ValueError,
            r"memory_budget_mb=64.0 with method='exact_receiver': this method does not chunk.*expected memory_budget_mb=None",
        ),
    ],
)
def test_bad_input(models, kwargs, error, message):
    model = models[1]["llama-nnsight"]
    arguments = {"receivers": [H(2, 0)], **kwargs}
    with pytest.raises(error, match=message):
        gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, **arguments)


def test_remote_is_refused(tokenizer):
    remote = gna.load(tiny_model("llama", seed=0), tokenizer=tokenizer, remote="local")
    with pytest.raises(ValueError, match=r"edge_attribution needs gradients of a local forward"):
        gna.edge_attribution(remote, CLEAN, CORRUPT, METRIC, receivers=[H(2, 0)])


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "falcon_h1"])
def test_no_residue_also_when_it_raises(models, name):
    model = models[1][name]
    before = model.logits(CLEAN)
    gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers_of(model))
    assert no_hooks_left(model) and all(p.grad is None for p in model.hf_model.parameters())

    calls = {"n": 0}

    def metric(logits):  # the corrupt run, then the gradient run: fails there
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("metric failed")
        return METRIC(logits)

    with pytest.raises(RuntimeError, match="metric failed"):
        gna.edge_attribution(model, CLEAN, CORRUPT, metric, receivers=receivers_of(model))

    # a failure inside the stacked forward (the third), while the library's edits are in place
    forwards = {"n": 0}
    target = model.hf_model.lm_head

    def fail_third(module, args):
        forwards["n"] += 1
        if forwards["n"] == 3:
            raise RuntimeError("forward failed")

    handle = target.register_forward_pre_hook(fail_third)
    try:
        with pytest.raises(RuntimeError, match="forward failed"):
            gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers_of(model))
    finally:
        handle.remove()
    assert forwards["n"] == 3
    assert torch.equal(model.logits(CLEAN), before)
    assert no_hooks_left(model) and all(p.grad is None for p in model.hf_model.parameters())


@pytest.mark.parametrize("name", ["llama-tlens", "falcon_h1"])
@pytest.mark.parametrize("steps", [1, 3])
def test_cost_meter_counts_the_stated_passes(models, name, steps):
    """The module docs' cost: the corrupt forward, then per point one clean forward and
    backward and one stacked forward and backward per chunk of (receiver, stream) copies."""
    model = models[1][name]
    last = model.n_layers - 1
    receivers = [H(last, 0), H(last, model.n_heads - 1)]
    copies = sum(len(model.receiver_inputs(r)) for r in receivers)
    n, per_chunk = len(CLEAN), 2
    chunks = -(-copies // per_chunk)
    with gna.cost_meter(model) as cost:
        gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, steps=steps, receivers=receivers, batch_size=per_chunk * n)
    assert copies >= 3 and chunks >= 2
    assert cost.forwards == 1 + steps * (1 + chunks)
    assert cost.backwards == steps * (1 + chunks)
    assert cost.rows == n * (1 + steps * (1 + copies))
    assert cost.block_rows == cost.rows * model.n_layers  # the senders start at layer 0: every forward runs every layer
    assert cost.backward_block_rows == steps * n * (1 + copies) * model.n_layers


# ----- method="exact_upstream" ---------------------------------------------------------------


def twin_exact_upstream(hf, clean, corrupt, senders, receiver, stream, metric, steps, exact_receiver=False):
    """``(K_r^T g_ig) . (stream[D_s] - stream[clean])`` by raw hooks on the HF model, for a
    receiver in layer 1 and senders in layer 0 (D: layer 0's out-projection input with the
    sender's columns corrupt); ``g_ig`` averages the metric's gradient at the receiver's slice
    of its out-projection input over ``steps`` midpoints to its output with ``stream`` from the
    run where every sender is corrupt. Returns ``{sender: score}``."""
    i, index = path_twin.locate(hf, receiver.layer, receiver.head)
    m = path_twin.mixers(hf, receiver.layer)[i]
    m0 = path_twin.mixers(hf, 0)[0]
    module_name, cols = path_twin.stream_columns(hf, m.kind, stream, index)
    proj = getattr(m.module, module_name)
    out_cols = list(range(index * m.head_dim, (index + 1) * m.head_dim))
    corrupt0 = path_twin.head_outputs(hf, corrupt)[0][("out", 0, 0)]

    def run(sender_cols=(), stream_value=None, out_value=None):
        seen = {}

        def layer0(module, args):
            x = args[0].clone()
            x[..., list(sender_cols)] = corrupt0[..., list(sender_cols)]
            return (x,)

        def at_stream(module, args, output):
            seen["stream"] = output[..., cols].detach().clone()
            if stream_value is not None:
                output = output.clone()
                output[..., cols] = stream_value
                return output
            return None

        def at_out(module, args):
            x = args[0]
            if out_value is not None:
                x = x.clone()
                x[..., out_cols] = out_value
            seen["out"] = x[..., out_cols]
            return (x,)

        hooks = [(m0.out_proj, "pre", layer0), (proj, "post", at_stream), (m.out_proj, "pre", at_out)]
        handles = [mod.register_forward_hook(fn) if kind == "post" else mod.register_forward_pre_hook(fn) for mod, kind, fn in hooks]
        try:
            with torch.enable_grad():
                logits = hf(input_ids=clean.input_ids, attention_mask=clean.attention_mask, use_cache=False).logits
        finally:
            for handle in handles:
                handle.remove()
        return seen, logits

    def columns(head):
        return range(head.head * m0.head_dim, (head.head + 1) * m0.head_dim)

    base, _ = run()
    every, _ = run([c for s in senders for c in columns(s)])
    end, _ = run(stream_value=every["stream"])
    out0, out_end = base["out"].detach(), end["out"].detach()
    g_ig = torch.zeros_like(out0)
    for k in range(steps):
        leaf = (out0 + (k + 0.5) / steps * (out_end - out0)).requires_grad_(True)
        _, logits = run(out_value=leaf)
        g_ig += torch.autograd.grad(metric(logits).float().mean(), leaf)[0] / steps
    if exact_receiver:  # g_ig . (r's output with the stream from D_s - its clean output)
        outputs = {s: run(stream_value=run(list(columns(s)))[0]["stream"])[0]["out"].detach() for s in senders}
        return {s: float((g_ig * (outputs[s] - out0)).sum()) for s in senders}
    leaf = base["stream"].clone().requires_grad_(True)
    seen, _ = run(stream_value=leaf)
    u = torch.autograd.grad((seen["out"] * g_ig).sum(), leaf)[0]
    return {s: float((u * (run(list(columns(s)))[0]["stream"] - base["stream"])).sum()) for s in senders}


@pytest.mark.parametrize(
    ("name", "receiver", "streams"),
    [
        ("llama-tlens", gna.Head(1, 3), ["q", "k", "v"]),
        ("llama-nnsight", gna.Head(1, 3), ["q", "k", "v"]),
        ("mamba2", gna.Head(1, 2), ["x", "dt"]),
    ],
)
@pytest.mark.parametrize("method", ["exact_upstream", "exact_receiver"])
def test_exact_upstream_equals_its_hand_twin(models, name, receiver, streams, method):
    hfs, loaded = models
    model, hf = loaded[name], hfs[name.split("-")[0]]
    senders = [h for h in model.heads if h.layer == 0]
    result = gna.edge_attribution(
        model, CLEAN, CORRUPT, METRIC, steps=3, receivers=[receiver], senders=senders, receiver_input=streams, method=method
    )
    assert result.meta["method"] == method
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    for k, stream in enumerate(streams):
        expected = twin_exact_upstream(hf, clean_b, corrupt_b, senders, receiver, stream, METRIC, 3, method == "exact_receiver")
        assert max(abs(v) for v in expected.values()) > 1e-3, f"{stream}: no effect, the test could not fail"
        for i, sender in enumerate(senders):
            assert float(result.scores[i, 0, k]) == pytest.approx(expected[sender], abs=1e-4, rel=1e-3), (stream, sender)


@pytest.mark.parametrize("method", ["exact_upstream", "exact_receiver"])
def test_exact_any_on_mamba1_is_the_sum_over_its_streams(tokenizer, method):
    """Mamba-1's ``x`` holds ``x_read``: ``"any"`` needs the held streams captured as each
    stream's patch does (it raised KeyError), and equals the per-stream scores summed."""
    model = gna.load(sensitive_model("mamba"), tokenizer=tokenizer, backend="nnsight")
    receivers, senders = [H(2, 0), H(2, 5)], [H(layer, h) for layer in (0, 1) for h in range(4)]
    names = list(model.layer_specs[0].mixers[0].receiver_inputs)
    assert "x" in names
    whole = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers, senders=senders, method=method)
    every = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers, senders=senders, receiver_input=names, method=method)
    assert whole.streams == ("any",) and whole.scores.shape == (len(senders), len(receivers))
    assert whole.scores.abs().max() > MIN_EFFECT
    torch.testing.assert_close(whole.scores, every.scores.nansum(-1), atol=1e-6, rtol=1e-5)
    assert no_hooks_left(model)


@pytest.mark.parametrize("name", ["llama-tlens", "mamba2"])
def test_exact_upstream_leaves_no_residue_when_the_metric_raises(models, name):
    model = models[1][name]
    before = model.logits(CLEAN)
    calls = {"n": 0}

    def metric(logits):  # clean, corrupt, then the first integrated-gradient forward: fails there
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("metric failed")
        return METRIC(logits)

    receiver = H(1, 2)
    with pytest.raises(RuntimeError, match="metric failed"):
        gna.edge_attribution(model, CLEAN, CORRUPT, metric, steps=2, receivers=[receiver], method="exact_upstream")
    assert calls["n"] == 3
    assert torch.equal(model.logits(CLEAN), before)
    assert no_hooks_left(model) and all(p.grad is None for p in model.hf_model.parameters())


def test_exact_upstream_cost_meter(models):
    """Stated cost: clean and corrupt forwards; the stacked D forward (senders + 2 copies);
    per stream name one D and one recompute forward; ``steps`` + 1 stacked forwards and
    backwards (one copy per receiver stream)."""
    model = models[1]["llama-nnsight"]
    senders = [h for h in model.heads if h.layer == 0]
    with gna.cost_meter(model) as cost:
        gna.edge_attribution(
            model, CLEAN, CORRUPT, METRIC, steps=3, receivers=[H(1, 3)], senders=senders, receiver_input=["q", "k"], method="exact_upstream"
        )
    n, pairs = len(CLEAN), 2
    assert cost.forwards == 2 + 1 + 2 * 2 + 3 + 1
    assert cost.backwards == 3 + 1
    assert cost.rows == 2 * n + (len(senders) + 2) * n + 2 * (n + n) + 4 * pairs * n


def test_exact_receiver_cost_meter(models):
    """As `test_exact_upstream_cost_meter`, without the ``K_r^T`` pass and with one stacked
    forward per stream name of one copy per (sender, receiver)."""
    model = models[1]["llama-nnsight"]
    senders = [h for h in model.heads if h.layer == 0]
    with gna.cost_meter(model) as cost:
        gna.edge_attribution(
            model, CLEAN, CORRUPT, METRIC, steps=3, receivers=[H(1, 3)], senders=senders, receiver_input=["q", "k"], method="exact_receiver"
        )
    n, pairs = len(CLEAN), 2
    assert cost.forwards == 2 + 1 + 2 * 2 + 3 + 2
    assert cost.backwards == 3
    assert cost.rows == 2 * n + (len(senders) + 2) * n + 2 * (n + n) + 3 * pairs * n + 2 * len(senders) * n
