"""Issue 20: Mamba, Mamba-2 and every hybrid through TransformerLens's bridge, with the same
numbers as nnsight and as independent references.

Per family, one tiny random model is loaded twice from the same weights (``tlens`` and
``nnsight``) and a pristine copy is kept. References share no code with the library:
weight-space zeroing and raw torch hooks on the pristine HF modules (found by walking the
blocks, `tests.test_hybrids`), HF's eager attention weights, and the arguments of HF's own
scan calls. Where a reference would only repeat what another test already pins to raw
torch (the sweeps, `MaskAttentionRows`), the two backends are compared with each other.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.core.plan import Edit, Plan, Read, ReadKind
from gna_interp.models.tiny import HYBRIDS, tiny_model

from . import path_twin
from .conftest import CLEAN, CORRUPT, PROMPTS
from .recording import hooked, relative_error
from .test_attention_identity import check_mamba2_identity, raw_mamba1
from .test_hybrids import (
    EXACT,
    assert_close,
    eager_attention,
    hf_logits,
    one_of_each_mixer,
    out_proj_inputs,
    raw_head,
    raw_mixers,
    scan_identity_errors,
    shared_applications,
    zero_heads,
)

H = gna.Head
FAMILIES = ("mamba", "falcon_mamba", "mamba2", *HYBRIDS)
REL = 1e-4


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 5] - logits[:, -1, 9]


@pytest.fixture(scope="module", params=FAMILIES)
def trio(request, tokenizer):
    """(family, pristine HF model, tlens GnaModel, nnsight GnaModel), all on the same weights."""
    hf = tiny_model(request.param, seed=3)
    tl = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="tlens")
    ns = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight")
    return request.param, hf, tl, ns


def close(a: torch.Tensor, b: torch.Tensor, atol: float = EXACT) -> bool:
    return bool(torch.allclose(a, b, atol=atol, equal_nan=True))


def tol(model: gna.GnaModel) -> float:
    """Against the pristine HF model (sdpa attention): the bridge runs attention eagerly,
    and Qwen3-Next's gated DeltaNet adds a few 1e-6 of its own (measured: 1.2e-5)."""
    return 3e-5 if model.backend_name == "tlens" and model.arch.family == "qwen3_next" else EXACT


# ----- loading ------------------------------------------------------------------------------


def test_loads_on_the_bridge_and_defaults_stay_nnsight(trio, tokenizer):
    from transformer_lens.model_bridge import TransformerBridge

    _, hf, tl, ns = trio
    assert tl.backend_name == "tlens" and isinstance(tl.backend.bridge, TransformerBridge)
    assert gna.load(copy.deepcopy(hf), tokenizer=tokenizer).backend_name == "nnsight", "nnsight stays the default (docs/backends.md)"
    assert (tl.heads_per_layer, tl.layer_kinds) == (ns.heads_per_layer, ns.layer_kinds)
    batch = tl.to_batch(PROMPTS)
    assert not batch.attention_mask.all(), "the batch must be left-padded"
    assert_close(tl.logits(PROMPTS), hf_logits(hf, batch), batch.attention_mask.bool(), tol(tl))


# ----- ablation and patching -----------------------------------------------------------------


def test_ablating_each_head_kind_equals_zeroed_columns(trio):
    """The last head of every mixer (attention and SSM), one at a time, on the bridge
    (zeroed shared weights, Zamba2's, ablate the head at every application); all of them
    together on both backends (nnsight against zeroed columns: tests/test_hybrids.py)."""
    _, hf, tl, ns = trio
    batch = tl.to_batch(PROMPTS)
    real, clean = batch.attention_mask.bool(), hf_logits(hf, batch)
    heads = one_of_each_mixer(tl)
    assert {tl.head_kind(h) for h in heads} == {tl.head_kind(h) for h in tl.heads}, "every head kind is covered"
    for head in heads:
        applications = [H(layer, head.head) for layer in shared_applications(tl)] if tl.mixer_of(head)[0].spec.shared else [head]
        expected = hf_logits(zero_heads(hf, [head]), batch)
        assert (expected - clean)[real].abs().max() > 1e-5, f"{head} does not matter: the test could not fail"
        assert_close(tl.logits(PROMPTS, [gna.Ablate(applications)]), expected, real, tol(tl))
    everything = [gna.Ablate([h for h in heads if not tl.mixer_of(h)[0].spec.shared])]
    assert_close(tl.logits(PROMPTS, everything), ns.logits(PROMPTS, everything), real)


def raw_patched(hf, clean, values: dict[int, torch.Tensor], heads: list[gna.Head]) -> torch.Tensor:
    """Logits of ``clean`` with each head's out-projection input columns at the final
    position set to ``values`` (``id(out-projection) -> [batch, pos, width]``)."""

    def edit(head):
        _, _, out_proj, index, width = raw_head(hf, head)
        cols = slice(index * width, (index + 1) * width)

        def pre(module, args):
            x = args[0].clone()
            x[:, -1, cols] = values[id(module)][:, -1, cols]
            return (x, *args[1:])

        return out_proj, "pre", pre

    with hooked([edit(head) for head in heads]):
        return hf_logits(hf, clean)


def test_patching_and_sweeps(trio):
    """Patch (mixed heads, final position) against raw pre-hooks on the pristine
    out-projections; the mean-ablation and patching sweeps equal on both backends."""
    _, hf, tl, ns = trio
    clean, corrupt = tl.to_batch(CLEAN), tl.to_batch(CORRUPT)
    real = clean.attention_mask.bool()
    heads = one_of_each_mixer(tl)[-3:]
    patched = raw_patched(hf, clean, out_proj_inputs(hf, corrupt), heads)
    assert (patched - hf_logits(hf, clean))[:, -1].abs().max() > 1e-5, "the patch matters: the test could not fail"
    for model in (tl, ns):
        assert_close(model.logits(CLEAN, [gna.Patch(heads, source=CORRUPT, positions=-1)]), patched, real, tol(model))

    subset = one_of_each_mixer(tl) + [h for h in tl.heads if h.head == 0]
    sweeps = [
        lambda m: gna.ablation_sweep(m, CLEAN, PROMPTS, metric, how="mean", heads=subset, progress=False),
        lambda m: gna.patching_sweep(m, CLEAN, CORRUPT, metric, heads=subset, progress=False),
    ]
    for sweep in sweeps:
        a, b = sweep(tl), sweep(ns)
        assert a.scores.isfinite().sum() >= 2 and close(a.scores, b.scores) and abs(a.baseline - b.baseline) < EXACT
        assert (a.scores - a.baseline).abs().nan_to_num().max() > 1e-5, "the sweep measured no effect: the test could not fail"


def test_skips_resid_patches_and_row_masks(trio):
    """Block skips (tuple-returning blocks included), a residual-stream patch and, where
    there is attention, masked attention rows, in one run on each backend."""
    _, _, tl, ns = trio
    items = [gna.SkipLayers([1]), gna.Patch([gna.Resid(2)], source=CORRUPT, positions=2)]
    if any(tl.head_kind(h) is gna.LayerKind.ATTENTION for h in tl.heads):
        items.append(gna.MaskAttentionRows(-1))
    got = tl.logits(CLEAN, items)
    assert (got - tl.logits(CLEAN)).abs().max() > 1e-4, "the interventions had no effect"
    assert close(got, ns.logits(CLEAN, items))


# ----- patterns --------------------------------------------------------------------------------


def test_patterns_equal_hf_and_nnsight(trio):
    """Softmax rows equal HF's eager weights; implicit attention satisfies the scan identity
    on HF's own scan calls (every row); query rows of every head equal on both backends."""
    family, hf, tl, ns = trio
    batch = tl.to_batch(PROMPTS)
    rows = [-1, 2]  # query-row mode on both backends; every row is checked against HF below
    assert close(
        gna.attention_pattern(tl, PROMPTS, tl.heads, query_positions=rows),
        gna.attention_pattern(ns, PROMPTS, ns.heads, query_positions=rows),
        1e-6,
    )
    attention = [spec for spec in tl.layer_specs if any(m.kind is gna.LayerKind.ATTENTION for m in spec.mixers)]
    for spec, expected in zip(attention, eager_attention(hf, batch), strict=True):
        mixer = next(m for m in spec.mixers if m.kind is gna.LayerKind.ATTENTION)
        got = gna.attention_pattern(tl, PROMPTS, [H(spec.layer, mixer.offset + h) for h in range(mixer.n_heads)])
        assert torch.allclose(got, expected, atol=1e-6), spec.layer
    if family in HYBRIDS:
        for full, part in scan_identity_errors(family, tl, hf, PROMPTS):
            assert full < REL and part < REL, (full, part)
    elif family == "mamba2":
        check_mamba2_identity(hf, tl, PROMPTS)
    else:  # Mamba-1: out_proj's input = (M x + D x) * silu(z)
        heads = [H(layer, c) for layer in range(tl.n_layers) for c in range(tl.n_heads)]
        patterns = gna.attention_pattern(tl, PROMPTS, heads, include_skip=True).unflatten(1, (tl.n_layers, tl.n_heads))
        for layer, raw in enumerate(raw_mamba1(hf, batch)):
            mixed = torch.einsum("bcts,bsc->btc", patterns[:, layer], raw["x"])
            assert relative_error(mixed * torch.nn.functional.silu(raw["z"]), raw["gated"]) < REL


# ----- path patching and attribution -----------------------------------------------------------


def test_path_patching(trio):
    """Every later head (through all its streams) plus the logits as receivers is activation
    patching of the sender; a receiver subset, through one stream per kind, gives the same
    number on both backends and (Mamba, Mamba-2) as the raw-hook twin (tests/path_twin.py)."""
    family, hf, tl, ns = trio
    layers = sorted({h.layer for h in tl.heads})
    sender = next(h for h in one_of_each_mixer(tl) if h.layer == layers[-2])
    later = [h for h in tl.heads if tl.head_position(h) > tl.head_position(sender) and tl.receiver_inputs(h)]
    clean_metric = float(metric(tl.logits(CLEAN)).mean())
    if family != "qwen3_next":  # its gated DeltaNet heads have no streams: not every path can be opened
        got = gna.path_patching(tl, CLEAN, CORRUPT, metric, senders=[sender], receivers=[*later, "logits"])
        expected = float(metric(tl.logits(CLEAN, [gna.Patch([sender], source=CORRUPT)])).mean())
        assert abs(expected - clean_metric) > 1e-5, f"{sender} has no effect: the test could not fail"
        assert got == pytest.approx(expected, abs=EXACT)
    receivers = later[:: max(1, len(later) // 3)][:3]
    if family == "mamba":  # a channel is a head: three channels of 64 carry too little of an isolated path
        receivers = [h for h in later if h.layer == receivers[0].layer]
    streams = sorted({tl.receiver_inputs(h)[-1] for h in receivers})
    got = gna.path_patching(tl, CLEAN, CORRUPT, metric, senders=[sender], receivers=receivers, receiver_input=streams)
    assert abs(got - clean_metric) > 1e-6, f"{sender} -> {receivers} via {streams}: no effect, the test could not fail"
    assert got == pytest.approx(
        gna.path_patching(ns, CLEAN, CORRUPT, metric, senders=[sender], receivers=receivers, receiver_input=streams), abs=EXACT
    )
    if family in ("mamba", "mamba2"):
        twin = path_twin.path_patch(hf, tl.to_batch(CLEAN), tl.to_batch(CORRUPT), [sender], receivers, streams, metric)
        assert got == pytest.approx(twin, abs=EXACT)


def raw_attribution(hf, model, clean, corrupt) -> dict[gna.Head, float]:
    """metric(corrupt) + (clean - corrupt) . d metric / d head output, from raw pre-hooks on
    the pristine out-projections (their inputs are nodes of the corrupt run's graph)."""
    modules = {id(m[2]): m[2] for layer in range(model.n_layers) for m in raw_mixers(hf, layer)}

    def run(batch, grad: bool):
        store: dict = {}
        pairs = [(m, "pre", lambda mod, args: store.__setitem__(id(mod), args[0])) for m in modules.values()]
        with hooked(pairs), torch.set_grad_enabled(grad):
            logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return logits, store

    clean_acts = run(clean, False)[1]
    logits, corrupt_acts = run(corrupt, True)
    value = metric(logits).mean()
    keys = list(corrupt_acts)
    grads = dict(zip(keys, torch.autograd.grad(value, [corrupt_acts[k] for k in keys]), strict=True))
    scores = {}
    for head in model.heads:
        _, _, out_proj, index, width = raw_head(hf, head)
        key, cols = id(out_proj), slice(index * width, (index + 1) * width)
        effect = ((clean_acts[key][..., cols] - corrupt_acts[key][..., cols].detach()) * grads[key][..., cols]).sum()
        scores[head] = float(value.detach()) + float(effect)
    return scores


def test_attribution_equals_raw_gradients(trio):
    _, hf, tl, ns = trio
    got = gna.attribution_patching(tl, CLEAN, CORRUPT, metric)
    assert close(got.scores, gna.attribution_patching(ns, CLEAN, CORRUPT, metric).scores)
    expected = raw_attribution(hf, tl, tl.to_batch(CLEAN), tl.to_batch(CORRUPT))
    for head in tl.heads[:: max(1, len(tl.heads) // 16)]:
        assert float(got.scores[head.layer, head.head]) == pytest.approx(expected[head], abs=1e-5), head


# ----- swaps, the shared Zamba2 block, residue, bad input ----------------------------------------


@pytest.mark.parametrize("family", ["mamba", "mamba2"])
def test_same_family_swap_on_the_bridge(family, tokenizer):
    """swap_layers on a tlens SSM: the donor's block weights, restored exactly on exit."""
    hf, donor = tiny_model(family, seed=3), tiny_model(family, seed=4)
    reference = copy.deepcopy(hf)
    reference.backbone.layers[1].load_state_dict(donor.backbone.layers[1].state_dict())
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="tlens")
    batch = model.to_batch(PROMPTS)
    real = batch.attention_mask.bool()
    head = H(1, model.n_heads - 1)
    before = model.logits(PROMPTS, [gna.Ablate([head])])
    with gna.swap_layers(model, donor, [1]):
        assert_close(model.logits(PROMPTS), hf_logits(reference, batch), real)
        assert_close(model.logits(PROMPTS, [gna.Ablate([head])]), hf_logits(zero_heads(reference, [head]), batch), real)
    assert torch.equal(model.logits(PROMPTS, [gna.Ablate([head])]), before)


def test_zamba2_shared_module_layout_addresses_one_application(tokenizer):
    """One attention-block module object serving both hybrid layers: a head ablated at one
    application equals raw pre-hooks that zero it at that call only."""
    from .test_hybrids import call_counter_run, one_shared_module

    hf = one_shared_module(tiny_model("zamba2", seed=7))
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="tlens")
    batch = model.to_batch(PROMPTS)
    width = model.head_dim_of(H(1, 0))
    for call, layer in enumerate(shared_applications(model)):
        expected = call_counter_run(hf, batch, 2, call, width)[0]
        assert_close(model.logits(PROMPTS, [gna.Ablate([H(layer, 2)])]), expected, batch.attention_mask.bool())


def torch_hooks(module: torch.nn.Module) -> set[tuple[str, int]]:
    """Every torch hook on the module tree (TransformerLens keeps some of its own)."""
    found = set()
    for name, m in module.named_modules():
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks"):
            found |= {(f"{name}.{kind}", key) for key in getattr(m, kind, {})}
    return found


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("family", ["mamba2", "zamba2"])
def test_failures_leave_no_residue_on_the_bridge(family, tokenizer):
    """Bridge hook points (Mamba-2) and raw module hooks (Zamba2's hybrid layers) alike."""
    hf = tiny_model(family, seed=2)
    model = gna.load(hf, tokenizer=tokenizer, backend="tlens")
    batch = model.to_batch(CLEAN)
    logits = model.logits(CLEAN)
    hooks, weights = torch_hooks(hf), {k: v.clone() for k, v in hf.state_dict().items()}
    heads = one_of_each_mixer(model)
    calls = {"n": 0}

    def exploding(values):
        calls["n"] += 1
        if calls["n"] > 2:
            raise Boom("metric failed mid-sweep")
        return values[:, -1, 5]

    with pytest.raises(Boom):
        gna.ablation_sweep(model, CLEAN, None, exploding, heads=heads, batch_size=len(CLEAN), progress=False)
    with pytest.raises(Boom):
        gna.path_patching(model, CLEAN, CORRUPT, exploding, senders=[heads[0]], receivers=[*heads[1:], "logits"])
    with pytest.raises(Boom), model.ablated(heads):
        gna.attention_pattern(model, CLEAN, heads)
        raise Boom("user code failed inside the context")
    bad = Plan()
    bad.add(model.head_site(heads[-1])[0], Edit(torch.ones(1, 1, 1, 1, dtype=torch.bool), torch.zeros(3, 3, 3, 3, 3)))
    with pytest.raises(RuntimeError):
        model.backend.run(batch, bad)
    assert not model.active_interventions
    assert torch_hooks(hf) == hooks
    assert all(not point._forward_hooks for point in model.backend.bridge.hook_dict.values())
    assert all(torch.equal(v, weights[k]) for k, v in hf.state_dict().items())
    assert torch.equal(model.logits(CLEAN), logits)


def test_bad_input_on_the_bridge(tokenizer):
    model = gna.load(tiny_model("mamba2", seed=1), tokenizer=tokenizer, backend="tlens")
    batch = model.to_batch(CLEAN)
    hooks = torch_hooks(model.hf_model)
    with pytest.raises(RuntimeError, match=r"backend 'tlens': the output of layer 0's hook 'blocks.0.mixer.conv1d.hook_out' never ran"):
        model.backend.run(batch, Plan(), reads=[Read(ReadKind.OUTPUT, 0, "conv1d")])
    with pytest.raises(ValueError, match=r"head L1H4 out of range: layer 1 of .* has heads 0..3"):
        model.logits(CLEAN, [gna.Ablate([H(1, 4)])])
    with pytest.raises(ValueError, match=r"receiver_input='q' is not an input stream of mamba2 heads \(ssm\): expected 'any' or one of"):
        gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[H(0, 0)], receivers=[H(1, 1)], receiver_input="q")
    with pytest.raises(ValueError, match="remote execution runs through nnsight"):
        gna.load(tiny_model("mamba2"), tokenizer=tokenizer, backend="tlens", remote="local")
    assert torch_hooks(model.hf_model) == hooks, "nothing is left behind by the raises"
    assert all(not point._forward_hooks for point in model.backend.bridge.hook_dict.values())


# ----- discovery on the bundled toys -------------------------------------------------------------


@pytest.mark.parametrize("name", [name for name in ("mamba2", "falcon_h1") if name in gna.toy_names()])
def test_discover_finds_the_same_circuit_on_both_backends(name):
    """A reduced configuration (16 prompts, the head scan, entry and roles stages) keeps the
    test cheap. The found heads and their roles are the same, the accuracies equal and the
    head scans agree to 1e-5."""
    task = gna.toy_task(name, 16, seed=4242)
    found = {}
    for backend in ("tlens", "nnsight"):
        model = gna.load_toy(name, backend=backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gna.discovery.PositionalAnswerWarning)
            found[backend] = gna.discover(
                model, task, stages=("heads", "entry", "roles"), max_candidates=12, pattern_prompts=8, check_labels=False, progress=False
            )
    a, b = found["tlens"], found["nnsight"]
    assert a.gather and a.aggregate, a.summary()
    assert (a.gather, a.aggregate) == (b.gather, b.aggregate)
    assert [(e.head, e.role) for e in a.heads] == [(e.head, e.role) for e in b.heads]
    assert a.accuracy == b.accuracy
    scan = [[float("nan") if v is None else v for v in row] for row in a.head_scan]
    assert close(torch.tensor(scan), torch.tensor([[float("nan") if v is None else v for v in row] for row in b.head_scan]))
