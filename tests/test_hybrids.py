"""Issue 7 (part A): hybrid models under one API, each checked against an independent
reference on its tiny random config.

References share no code with the library: the HF modules are found by walking each
block (attention modules have an ``o_proj``; SSM mixers an ``out_proj`` and an ``A_log``),
heads are zeroed in the weights or with raw forward hooks, attention weights come from
HF's own eager attention, and SSM outputs from the arguments of HF's own scan calls.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
import torch.nn.functional as F

import gna_interp as gna
from gna_interp.core.plan import Edit, Plan
from gna_interp.models.tiny import HYBRIDS, tiny_model

from .conftest import CLEAN, CORRUPT, PROMPTS, no_hooks_anywhere
from .recording import hooked, recorded_calls, relative_error

H = gna.Head
EXACT = 1e-5
REL = 1e-4
KINDS = gna.LayerKind
EXPECTED_KINDS = {
    "jamba": ("ssm", "attention", "ssm", "attention"),
    "bamba": ("ssm", "attention", "ssm"),
    "granitemoehybrid": ("ssm", "attention", "ssm"),
    "nemotron_h": ("ssm", "mlp", "attention", "mlp"),
    "zamba2": ("ssm", "hybrid", "ssm", "hybrid"),
    "falcon_h1": ("hybrid", "hybrid", "hybrid"),
    "qwen3_next": ("ssm", "attention", "ssm", "attention"),
}


# ----- raw references ---------------------------------------------------------------------


def blocks(hf) -> torch.nn.ModuleList:
    return hf.model.layers if hasattr(hf, "model") else hf.backbone.layers  # hybrids; pure Mamba / Mamba-2


def raw_mixers(hf, layer: int) -> list[tuple[str, torch.nn.Module, torch.nn.Module, int, int]]:
    """``(kind, mixer, out-projection, n_heads, head_dim)`` of a block's mixers, attention
    first, found by walking the HF block."""
    found = []
    for module in blocks(hf)[layer].modules():
        if hasattr(module, "o_proj") and hasattr(module, "q_proj"):
            found.append(("attention", module, module.o_proj, hf.config.num_attention_heads, module.head_dim))
        elif hasattr(module, "num_v_heads"):  # gated DeltaNet: a head is a value head
            found.append(("ssm", module, module.out_proj, module.num_v_heads, module.head_v_dim))
        elif hasattr(module, "out_proj") and hasattr(module, "A_log"):
            mamba2 = module.A_log.dim() == 1
            n_heads = module.num_heads if mamba2 else module.intermediate_size
            found.append(("ssm", module, module.out_proj, n_heads, module.head_dim if mamba2 else 1))
    return sorted(found, key=lambda item: item[0] != "attention")


def raw_head(hf, head: gna.Head) -> tuple[str, torch.nn.Module, torch.nn.Module, int, int]:
    """The raw mixer holding a layer-level head number, with the head's index in it."""
    index = head.head
    for kind, mixer, out_proj, n_heads, head_dim in raw_mixers(hf, head.layer):
        if index < n_heads:
            return kind, mixer, out_proj, index, head_dim
        index -= n_heads
    raise AssertionError(f"no raw head {head}")


def zero_heads(hf, heads: list[gna.Head]):
    """A copy of ``hf`` with each head's out-projection weight columns zeroed."""
    edited = copy.deepcopy(hf)
    with torch.no_grad():
        for head in heads:
            _, _, out_proj, index, width = raw_head(edited, head)
            out_proj.weight[:, index * width : (index + 1) * width] = 0
    return edited


def hf_logits(hf, batch) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


def assert_close(actual: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor, tol: float = EXACT) -> None:
    """Equal on every real token (padding-position logits are unspecified)."""
    diff = (actual - expected)[mask].abs().max().item()
    assert diff < tol, f"max difference {diff} on real tokens"


def recorded_scans(family: str):
    """The family's own scan function (a module global of its modeling file) wrapped:
    each call's arguments and result are kept."""
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    name = {"jamba": "mamba_selective_scan", "qwen3_next": "torch_chunk_gated_delta_rule"}.get(family, "mamba2_chunk_scan")
    return recorded_calls(module, name)


# ----- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=HYBRIDS)
def pair(request, tokenizer):
    """(family, pristine HF model, GnaModel over a copy)."""
    hf = tiny_model(request.param, seed=3)
    return request.param, hf, gna.load(copy.deepcopy(hf), tokenizer=tokenizer)


def one_of_each_mixer(model: gna.GnaModel) -> list[gna.Head]:
    """The last head of every mixer of every layer: attention and SSM heads alike."""
    heads = []
    for spec in model.layer_specs:
        heads += [H(spec.layer, mixer.offset + mixer.n_heads - 1) for mixer in spec.mixers]
    return heads


def shared_applications(model: gna.GnaModel) -> list[int]:
    """Zamba2: the layers where the shared attention block runs."""
    return [spec.layer for spec in model.layer_specs if any(m.spec.shared for m in spec.mixers)]


# ----- structure -----------------------------------------------------------------------------


def test_layer_kinds_and_head_counts_follow_the_hf_blocks(pair):
    family, hf, model = pair
    assert [kind.value for kind in model.layer_kinds] == list(EXPECTED_KINDS[family])
    raw_counts = [sum(n for _, _, _, n, _ in raw_mixers(hf, layer)) for layer in range(model.n_layers)]
    assert model.heads_per_layer == tuple(raw_counts)
    assert model.n_heads == max(raw_counts) and len(model.heads) == sum(raw_counts)
    for head in model.heads:
        kind, _, _, _, width = raw_head(hf, head)
        assert model.head_kind(head).value == kind and model.head_dim_of(head) == width, head
    assert model.backend_name == "nnsight" and model.arch.layer_kind is KINDS.HYBRID


# ----- ablation == weight zeroing ----------------------------------------------------------


def test_unablated_logits_equal_hf(pair):
    _, hf, model = pair
    batch = model.to_batch(PROMPTS)
    assert_close(model.logits(PROMPTS), hf_logits(hf, batch), batch.attention_mask.bool())


def test_each_head_kind_ablated_equals_zeroed_columns(pair):
    """One attention head and one SSM head of every mixer, one at a time. Zamba2's shared
    attention weights serve every application: zeroing them is ablating the head at
    every application at once."""
    _, hf, model = pair
    batch = model.to_batch(PROMPTS)
    real, clean = batch.attention_mask.bool(), hf_logits(hf, batch)
    for head in one_of_each_mixer(model):
        applications = [H(layer, head.head) for layer in shared_applications(model)] if model.mixer_of(head)[0].spec.shared else [head]
        expected = hf_logits(zero_heads(hf, [head]), batch)
        assert (expected - clean)[real].abs().max() > 1e-3, f"{head} does not matter: the test could not fail"
        assert_close(model.logits(PROMPTS, [gna.Ablate(applications)]), expected, real)


def test_mixed_lists_equal_zeroed_columns(pair):
    """Attention and SSM heads of several layers in one Ablate, as an argument and as a context."""
    _, hf, model = pair
    batch = model.to_batch(PROMPTS)
    heads = one_of_each_mixer(model)[1:] + [H(spec.layer, 0) for spec in model.layer_specs if spec.mixers]
    heads = list(dict.fromkeys(heads))
    assert {model.head_kind(h) for h in heads} == {KINDS.ATTENTION, KINDS.SSM}
    zeroed = set(heads)
    for head in heads:  # zeroed shared weights ablate every application
        if model.mixer_of(head)[0].spec.shared:
            zeroed |= {H(layer, head.head) for layer in shared_applications(model)}
    expected = hf_logits(zero_heads(hf, heads), batch)
    assert_close(model.logits(PROMPTS, [gna.Ablate(sorted(zeroed))]), expected, batch.attention_mask.bool())
    with model.ablated(sorted(zeroed)):
        assert_close(model.logits(PROMPTS), expected, batch.attention_mask.bool())


def out_proj_inputs(hf, batch) -> dict[int, torch.Tensor]:
    """``id(out-projection) -> its input`` in a plain forward (raw pre-hooks)."""
    store: dict[int, torch.Tensor] = {}
    modules = {id(m[2]): m[2] for layer in range(len(blocks(hf))) for m in raw_mixers(hf, layer)}
    pairs = [(m, "pre", lambda mod, args: store.__setitem__(id(mod), args[0].detach().clone())) for m in modules.values()]
    with hooked(pairs):
        hf_logits(hf, batch)
    return store


def test_patch_and_mean_ablation_equal_raw_hooks(pair):
    """Patch (mixed heads, the final position only) and mean ablation (mixed heads) against
    raw pre-hooks that write the source values into those out-projection input columns."""
    _, hf, model = pair
    clean, corrupt = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    heads = one_of_each_mixer(model)[-3:]
    source = out_proj_inputs(hf, corrupt)
    reference = out_proj_inputs(hf, model.to_batch(PROMPTS))
    real = model.to_batch(PROMPTS).attention_mask.bool()
    means = {key: value[real].mean(0) for key, value in reference.items()}  # over every real token

    def run_with(values, last_only: bool):
        def edit(head):
            _, _, out_proj, index, width = raw_head(hf, head)
            cols = slice(index * width, (index + 1) * width)

            def pre(module, args):
                x = args[0].clone()
                new = values[id(module)][..., cols]
                if last_only:
                    x[:, -1, cols] = new[:, -1]
                else:
                    x[..., cols] = new
                return (x, *args[1:])

            return out_proj, "pre", pre

        with hooked([edit(head) for head in heads]):
            return hf_logits(hf, clean)

    patched = run_with(source, last_only=True)
    assert (patched - hf_logits(hf, clean))[:, -1].abs().max() > 1e-4, "the patch matters: the test could not fail"
    assert_close(model.logits(CLEAN, [gna.Patch(heads, source=CORRUPT, positions=-1)]), patched, clean.attention_mask.bool())
    mean = run_with(means, last_only=False)
    assert_close(model.logits(CLEAN, [gna.Ablate(heads, how="mean", corrupt=PROMPTS)]), mean, clean.attention_mask.bool())


# ----- patterns -------------------------------------------------------------------------------


def eager_attention(hf, batch) -> list[torch.Tensor]:
    """Every attention call's weights ``[batch, head, query, key]`` from HF eager attention
    (raw forward hooks), in call order; padding query rows zeroed."""
    eager = copy.deepcopy(hf)
    eager.config._attn_implementation = "eager"
    seen: list[torch.Tensor] = []
    modules = {id(m): m for layer in range(len(blocks(eager))) for kind, m, *_ in raw_mixers(eager, layer) if kind == "attention"}
    pairs = [(m, "post", lambda mod, args, out: seen.append(out[1].detach().clone())) for m in modules.values()]
    with hooked(pairs):
        hf_logits(eager, batch)
    real = batch.attention_mask.bool()
    return [weights * real[:, None, :, None] for weights in seen]


def test_attention_rows_equal_hf_eager_weights(pair):
    _, hf, model = pair
    batch = model.to_batch(PROMPTS)
    assert not batch.attention_mask.all(), "the batch must be left-padded"
    attention_layers = [spec for spec in model.layer_specs if any(m.kind is KINDS.ATTENTION for m in spec.mixers)]
    raw = eager_attention(hf, batch)
    assert len(raw) == len(attention_layers)
    for spec, expected in zip(attention_layers, raw, strict=True):
        mixer = next(m for m in spec.mixers if m.kind is KINDS.ATTENTION)
        heads = [H(spec.layer, mixer.offset + h) for h in range(mixer.n_heads)]
        got = gna.attention_pattern(model, PROMPTS, heads)
        assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-6), spec.layer


def scan_identity_errors(family: str, model: gna.GnaModel, hf, inputs) -> list[tuple[float, float]]:
    """For every SSM mixer, in layer order: relative errors of ``M x + D x`` (and of the
    ``M x`` part alone) against HF's own scan call, ``M`` from `gna.attention_pattern`
    (gated DeltaNet: ``M v`` against HF's chunked delta rule, twice)."""
    batch = model.to_batch(inputs)
    with recorded_scans(family) as calls:
        hf_logits(hf, batch)
    ssm = [(spec.layer, m) for spec in model.layer_specs for m in spec.mixers if m.kind is KINDS.SSM]
    assert len(calls) == len(ssm), "one scan call per SSM layer"
    errors = []
    for (layer, mixer), (args, kwargs, result) in zip(ssm, calls, strict=True):
        out = result[0] if isinstance(result, tuple) else result
        heads = [H(layer, mixer.offset + h) for h in range(mixer.n_heads)]
        M = gna.attention_pattern(model, inputs, heads)  # [batch, head, query, key]
        if family == "qwen3_next":  # gated DeltaNet: o = M v, no skip term
            v, y = args[2].float(), out.float()
            mixed = torch.einsum("bhts,bshp->bthp", M, v)
            errors.append((relative_error(mixed, y), relative_error(mixed, y)))
            continue
        D = kwargs["D"].detach().float()
        if family == "jamba":  # Mamba-1: x [batch, channel, pos], output gated by silu(z)
            x, gate = args[0].transpose(1, 2).float(), F.silu(kwargs["z"].transpose(1, 2).float())
            mixed = torch.einsum("bcts,bsc->btc", M, x)
            y = out.transpose(1, 2).float()
            errors.append((relative_error((mixed + D * x) * gate, y), relative_error(mixed * gate, y - D * x * gate)))
        else:  # Mamba-2: x [batch, pos, head, d_head]
            x = args[0].float()
            mixed = torch.einsum("bhts,bshp->bthp", M, x)
            y = out.reshape(x.shape).float()
            errors.append((relative_error(mixed + D[:, None] * x, y), relative_error(mixed, y - D[:, None] * x)))
    return errors


def test_ssm_rows_satisfy_the_identity_on_hf_scans(pair):
    family, hf, model = pair
    assert not model.to_batch(PROMPTS).attention_mask.all(), "the batch must be left-padded"
    for full, part in scan_identity_errors(family, model, hf, PROMPTS):
        assert full < REL and part < REL, (full, part)


# Longer prompts (token ids, T = 90): many Mamba-2 chunks (4 positions), two of the
# DeltaNet's (64), and Mamba-1's blocked full-matrix path.
LONG = [[5 + (7 * i + j) % 50 for i in range(90 - 13 * j)] for j in range(3)]


@pytest.mark.parametrize("family", ["qwen3_next", "zamba2", "jamba"])
def test_ssm_identity_on_long_prompts(family, tokenizer):
    hf = tiny_model(family, seed=11)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer)
    for full, part in scan_identity_errors(family, model, hf, LONG):
        assert full < REL and part < REL, (full, part)
    heads = [h for h in model.heads if model.head_kind(h) is KINDS.SSM][-3:]
    every_row = gna.attention_pattern(model, LONG, heads)
    last_row = gna.attention_pattern(model, LONG, heads, query_positions=[-1])
    assert torch.allclose(last_row[:, :, 0], every_row[:, :, -1], atol=1e-6), "one row equals that row of the full matrix"


def test_mixed_pattern_lists_give_one_tensor(pair):
    """Attention and SSM heads in one call (interleaved, even two mixers of one layer) give
    what separate single-kind calls give."""
    _, _, model = pair
    attention = [h for h in model.heads if model.head_kind(h) is KINDS.ATTENTION][:3]
    ssm = [h for h in model.heads if model.head_kind(h) is KINDS.SSM][-3:]
    mixed = [ssm[0], attention[0], ssm[1], attention[1], ssm[2], attention[2]]
    got = gna.attention_pattern(model, PROMPTS, mixed, query_positions=[-1, 2])
    assert got.shape == (len(PROMPTS), 6, 2, model.to_batch(PROMPTS).n_pos)
    soft = gna.attention_pattern(model, PROMPTS, attention, query_positions=[-1, 2], kind="attention")
    implicit = gna.attention_pattern(model, PROMPTS, ssm, query_positions=[-1, 2], kind="ssm")
    assert torch.allclose(got[:, 1::2], soft, atol=1e-6) and torch.allclose(got[:, 0::2], implicit, atol=1e-6)
    assert torch.allclose(soft.sum(-1)[:, :, 0], torch.ones(len(PROMPTS), 3), atol=1e-5), "softmax rows sum to 1"


# ----- Zamba2's shared attention block ------------------------------------------------------


def shared_o_projs(hf) -> list[torch.nn.Module]:
    """The shared block's out-projection modules, one per distinct module object."""
    found = {id(m): m for layer in range(len(blocks(hf))) for kind, _, m, *_ in raw_mixers(hf, layer) if kind == "attention"}
    return list(found.values())


def call_counter_run(hf, batch, index: int | None, call: int | None, head_dim: int):
    """Logits with head ``index`` zeroed at the shared block's call ``call`` only (raw
    pre-hooks with one call counter over the shared o_proj), and each call's o_proj
    output and input, in call order."""
    counter = {"n": 0}
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []

    def pre(module, args):
        k = counter["n"]
        counter["n"] += 1
        x = args[0]
        if k == call:
            x = x.clone()
            x[..., index * head_dim : (index + 1) * head_dim] = 0
        inputs.append(x.detach().clone())
        return (x, *args[1:])

    def post(module, args, out):
        outputs.append(out.detach().clone())

    modules = shared_o_projs(hf)
    with hooked([(m, "pre", pre) for m in modules] + [(m, "post", post) for m in modules]):
        logits = hf_logits(hf, batch)
    return logits, inputs, outputs


def observe_o_proj_outputs(hf) -> tuple[list[torch.Tensor], list]:
    """Raw observer hooks (they change nothing) on the shared o_proj: each call's output."""
    seen: list[torch.Tensor] = []
    return seen, [(m, "post", lambda mod, args, out: seen.append(out.detach().clone())) for m in shared_o_projs(hf)]


def one_shared_module(hf):
    """The transformers 4.x layout: ONE attention-block module object serving every
    hybrid layer, so its o_proj runs once per application in every forward."""
    shared = copy.deepcopy(hf)
    hybrid = [i for i, block in enumerate(blocks(shared)) if hasattr(block, "shared_transformer")]
    for layer in hybrid[1:]:
        blocks(shared)[layer].shared_transformer = blocks(shared)[hybrid[0]].shared_transformer
    assert len(shared_o_projs(shared)) == 1
    return shared


@pytest.fixture(scope="module", params=["per-layer modules", "one shared module", "adapters"])
def zamba(request, tokenizer):
    hf = tiny_model("zamba2", seed=7, use_shared_attention_adapter=request.param == "adapters", adapter_rank=4)
    if request.param == "one shared module":
        hf = one_shared_module(hf)
    return hf, gna.load(copy.deepcopy(hf), tokenizer=tokenizer)


def test_zamba2_shared_head_names_one_application(zamba):
    hf, model = zamba
    batch = model.to_batch(PROMPTS)
    real = batch.attention_mask.bool()
    applications = shared_applications(model)
    assert applications == [1, 3]
    width = model.head_dim_of(H(1, 0))
    clean, _, clean_out = call_counter_run(hf, batch, None, None, width)
    for call, layer in enumerate(applications):
        for index in (0, 3):
            expected, ref_in, ref_out = call_counter_run(hf, batch, index, call, width)
            assert (expected - clean)[real].abs().max() > 1e-4, "the head matters: the test could not fail"
            seen, observers = observe_o_proj_outputs(model.hf_model)
            with hooked(observers):
                got = model.logits(PROMPTS, [gna.Ablate([H(layer, index)])])
            assert_close(got, expected, real)
            assert len(seen) == len(applications)
            for k, (mine, theirs) in enumerate(zip(seen, ref_out, strict=True)):
                assert torch.allclose(mine, theirs, atol=EXACT), f"application {k} differs from the reference"
            for k in range(call):  # earlier applications are untouched
                assert torch.equal(ref_out[k], clean_out[k]) and torch.allclose(seen[k], clean_out[k], atol=EXACT)
            assert not torch.allclose(seen[call], clean_out[call], atol=1e-4), "the ablated application changed"
            # the head is zero at its own application only
            heads = model.cache(PROMPTS, [H(a, index) for a in applications], [gna.Ablate([H(layer, index)])])
            for a, value in heads.items():
                zero = a.layer == layer
                assert bool((value == 0).all()) is zero, a
                assert torch.allclose(value, ref_in[applications.index(a.layer)][..., index * width : (index + 1) * width], atol=EXACT)


def test_zamba2_per_application_sweeps_and_patterns(zamba):
    """Sweeps start chunks late (blocks before them are not run, so call counts shift):
    every shared head at every application, alone and stacked, equals the raw reference."""
    hf, model = zamba
    batch = model.to_batch(PROMPTS)
    width = model.head_dim_of(H(1, 0))
    heads = [H(layer, i) for layer in shared_applications(model) for i in range(4)]

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 7]

    expected = torch.tensor(
        [float(metric(call_counter_run(hf, batch, h.head, shared_applications(model).index(h.layer), width)[0]).mean()) for h in heads]
    )
    for batch_size in (len(PROMPTS), 100):
        sweep = gna.ablation_sweep(model, PROMPTS, None, metric, heads=heads, batch_size=batch_size, progress=False)
        got = torch.stack([sweep.scores[h.layer, h.head] for h in heads])
        assert torch.allclose(got, expected, atol=1e-5), batch_size
    raw = eager_attention(hf, batch)
    for call, layer in enumerate(shared_applications(model)):
        got = gna.attention_pattern(model, PROMPTS, [H(layer, i) for i in range(4)])
        assert torch.allclose(got, raw[call], atol=1e-6), layer


def test_zamba2_layouts_agree(tokenizer):
    """One module serving every application (per-call addressing in nnsight) and one
    module per application (tied weights) are the same function: path patching into the
    second application's attention gives the same number on both."""
    hf = tiny_model("zamba2", seed=7)
    per_layer = gna.load(copy.deepcopy(hf), tokenizer=tokenizer)
    shared = gna.load(one_shared_module(hf), tokenizer=tokenizer)
    assert not per_layer.backend._shared_modules() and shared.backend._shared_modules()

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 7]

    for receivers, stream in (([H(3, 1)], "q"), ([H(3, 2), H(3, 5)], "any"), ([H(3, 0), "logits"], "v")):
        a = gna.path_patching(per_layer, CLEAN, CORRUPT, metric, senders=[H(1, 2)], receivers=receivers, receiver_input=stream)
        b = gna.path_patching(shared, CLEAN, CORRUPT, metric, senders=[H(1, 2)], receivers=receivers, receiver_input=stream)
        assert abs(a - b) < 1e-5, (receivers, a, b)


def test_zamba2_mamba_heads_receive_from_the_shared_attention_of_their_layer(tokenizer):
    model = gna.load(tiny_model("zamba2", seed=7), tokenizer=tokenizer)

    def metric(logits):
        return logits[:, -1, 5]

    clean = float(metric(model.logits(CLEAN)).mean())
    through = gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[H(1, 2)], receivers=[H(1, 5)])
    assert abs(through - clean) > 1e-4, "L1H2 reaches the output through L1H5 (same layer, later stage)"
    with pytest.raises(ValueError, match=r"sender L1H5 is in layer 1, at or after every receiver \(the last is layer 1 \(stage 1"):
        gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[H(1, 5)], receivers=[H(1, 2), H(1, 6)])
    with pytest.raises(ValueError, match=r"sender L1H2 is in layer 1, at or after every receiver \(the last is layer 1\)"):
        gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[H(1, 2)], receivers=[H(1, 1)])


def test_heads_without_streams_receive_whole(tokenizer):
    """Zamba2 with adapters (q = q_proj + adapter: no module outputs the query) and
    Qwen3-Next's gated DeltaNet (q, k, v, z interleaved per key head) have no streams:
    they are receivers for ``"any"`` only (their output is taken whole), and a named
    stream is refused by name. Qwen3-Next's attention has k and v (its q_proj also holds
    the output gate)."""
    zamba = gna.load(tiny_model("zamba2", use_shared_attention_adapter=True, adapter_rank=4), tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"receiver L3H1 is an attention head whose input streams are none"):
        gna.path_patching(zamba, CLEAN, CORRUPT, lambda x: x[:, -1, 5], senders=[H(0, 0)], receivers=[H(3, 1)], receiver_input="x")
    qwen = gna.load(tiny_model("qwen3_next"), tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"receiver L2H1 is an SSM head whose input streams are none"):
        gna.path_patching(qwen, CLEAN, CORRUPT, lambda x: x[:, -1, 5], senders=[H(0, 0)], receivers=[H(2, 1)], receiver_input="k")
    with pytest.raises(ValueError, match=r"receiver_input='q' is not an input stream of qwen3_next heads \(ssm, attention\)"):
        gna.path_patching(qwen, CLEAN, CORRUPT, lambda x: x[:, -1, 5], senders=[H(0, 0)], receivers=[H(1, 1)], receiver_input="q")
    clean = float(qwen.logits(CLEAN)[:, -1, 5].mean())
    through_k = gna.path_patching(qwen, CLEAN, CORRUPT, lambda x: x[:, -1, 5], senders=[H(0, 0)], receivers=[H(1, 1)], receiver_input="k")
    assert abs(through_k - clean) > 1e-5, "the change reaches the output through L1H1's keys"


# ----- layer skips (tuple-returning blocks) and nnsight's remote simulation ------------------


@pytest.mark.parametrize("family", ["bamba", "falcon_h1", "zamba2"])
def test_skipped_layers_equal_raw_pass_through(family, tokenizer):
    """Bamba's blocks return ``(hidden, weights)``, FalconH1's ``(hidden,)``, Zamba2's a
    tensor: a skipped block passes its input through in every case (raw forward hooks)."""
    hf = tiny_model(family, seed=8)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer)
    batch = model.to_batch(PROMPTS)

    def through(module, args, kwargs, out):
        hidden = args[0] if args else kwargs["hidden_states"]
        return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

    for layers in ([1], [0, 2]):
        handles = [blocks(hf)[layer].register_forward_hook(through, with_kwargs=True) for layer in layers]
        try:
            expected = hf_logits(hf, batch)
        finally:
            for handle in handles:
                handle.remove()
        assert_close(model.logits(PROMPTS, [gna.SkipLayers(layers)]), expected, batch.attention_mask.bool())
    truncated = model.logits(PROMPTS, [gna.Truncate(1)])
    assert_close(truncated, model.logits(PROMPTS, [gna.SkipLayers(range(1, model.n_layers))]), batch.attention_mask.bool())


@pytest.mark.parametrize("family", ["falcon_h1", "zamba2-shared"])
def test_hybrids_under_remote_simulation(family, tokenizer):
    """The same numbers under nnsight's ``remote="local"`` simulation of NDIF, per-call
    addressing of a shared module included."""
    hf = one_shared_module(tiny_model("zamba2", seed=9)) if family == "zamba2-shared" else tiny_model(family, seed=9)
    local = gna.load(copy.deepcopy(hf), tokenizer=tokenizer)
    remote = gna.load(hf, tokenizer=tokenizer, remote="local")
    heads = [H(3, 1), H(1, 5), H(0, 2)] if family == "zamba2-shared" else [H(1, 1), H(1, 6), H(2, 3)]
    for interventions in ([gna.Ablate(heads)], [gna.Patch(heads, source=CORRUPT, positions=-1)], [gna.SkipLayers(1)]):
        assert torch.allclose(remote.logits(CLEAN, interventions), local.logits(CLEAN, interventions), atol=EXACT)
    pattern = gna.attention_pattern(local, CLEAN, heads, query_positions=[-1])
    assert torch.allclose(gna.attention_pattern(remote, CLEAN, heads, query_positions=[-1]), pattern, atol=1e-6)


# ----- sweeps, path and attribution patching, discovery ------------------------------------


def test_ablation_sweep_has_nan_for_missing_heads(pair):
    _, hf, model = pair
    batch = model.to_batch(CLEAN)

    def metric(logits):
        return logits[:, -1, 5]

    sweep = gna.ablation_sweep(model, CLEAN, None, metric, progress=False)
    assert sweep.scores.shape == (model.n_layers, model.n_heads)
    for layer, n in enumerate(model.heads_per_layer):
        assert not sweep.scores[layer, :n].isnan().any() and sweep.scores[layer, n:].isnan().all()
    for head in one_of_each_mixer(model):
        if model.mixer_of(head)[0].spec.shared:
            continue  # weight zeroing would ablate every application
        expected = float(metric(hf_logits(zero_heads(hf, [head]), batch)).mean())
        assert sweep.scores[head.layer, head.head] == pytest.approx(expected, abs=1e-5), head
    assert all(h.layer < model.n_layers and h.head < model.heads_per_layer[h.layer] for h, _ in sweep.top(5))


@pytest.mark.parametrize("family", ["falcon_h1", "nemotron_h"])
def test_patching_sweep_cells_equal_single_patches(family, tokenizer):
    model = gna.load(tiny_model(family, seed=4), tokenizer=tokenizer)

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 9]

    sweep = gna.patching_sweep(model, CLEAN, CORRUPT, metric, progress=False)
    for head in one_of_each_mixer(model):
        single = float(metric(model.logits(CORRUPT, [gna.Patch([head], source=CLEAN)])).mean())
        assert sweep.scores[head.layer, head.head] == pytest.approx(single, abs=1e-5), head
    assert sweep.scores.isnan().sum() == sum(model.n_heads - n for n in model.heads_per_layer)


@pytest.mark.parametrize("family", ["falcon_h1", "zamba2", "jamba", "qwen3_next", "zamba2-adapters"])
def test_path_patching_through_every_later_head_is_activation_patching(family, tokenizer):
    """Receivers = every head after the sender (attention and SSM, each taken whole) plus
    the logits: every path is open, so the result is activation patching. In a Zamba2
    hybrid layer the Mamba-2 heads come after the shared-attention heads. Qwen3-Next's
    DeltaNet heads and Zamba2's adapted attention heads have no streams, only ``"any"``."""
    extra = {"use_shared_attention_adapter": True, "adapter_rank": 4} if family == "zamba2-adapters" else {}
    family = family.split("-")[0]
    model = gna.load(tiny_model(family, seed=5, **extra), tokenizer=tokenizer)

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 9]

    for sender in one_of_each_mixer(model)[:2]:
        later = [h for h in model.heads if h.layer > sender.layer]
        if family == "zamba2" and model.heads_per_layer[sender.layer] == 8 and sender.head < 4:
            later += [H(sender.layer, h) for h in range(4, 8)]  # the layer's Mamba-2 reads the shared attention's output
        got = gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[sender], receivers=[*later, "logits"])
        expected = float(metric(model.logits(CLEAN, [gna.Patch([sender], source=CORRUPT)])).mean())
        clean = float(metric(model.logits(CLEAN)).mean())
        assert abs(expected - clean) > 1e-4, f"{sender} has no effect: the test could not fail"
        assert got == pytest.approx(expected, abs=1e-5), sender


def test_path_patching_streams_per_receiver_kind(tokenizer):
    """["q", "x"]: the query of attention receivers, x of SSM receivers; a receiver whose
    mixer has none of the chosen streams is refused by name."""
    model = gna.load(tiny_model("falcon_h1", seed=5), tokenizer=tokenizer)

    def metric(logits):
        return logits[:, -1, 5]

    both = gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[H(0, 1)], receivers=[H(1, 2), H(1, 6)], receiver_input=["q", "x"])
    q = gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[H(0, 1)], receivers=[H(1, 2)], receiver_input="q")
    x = gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[H(0, 1)], receivers=[H(1, 6)], receiver_input="x")
    assert both != pytest.approx(q, abs=1e-6) and both != pytest.approx(x, abs=1e-6)
    with pytest.raises(ValueError, match=r"receiver L1H6 is an SSM head whose input streams are \('gate', 'x', 'B', 'C', 'dt'\)"):
        gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[H(0, 1)], receivers=[H(1, 2), H(1, 6)], receiver_input="q")


@pytest.mark.parametrize("family", ["falcon_h1", "zamba2"])
def test_attribution_equals_raw_gradient_reference(family, tokenizer):
    """(clean - corrupt) . d metric / d head output, from raw hooks on the HF out-projections
    (their inputs are nodes of the corrupt run's graph; autograd differentiates through them)."""
    hf = tiny_model(family, seed=6)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer)

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 9]

    result = gna.attribution_patching(model, CLEAN, CORRUPT, metric)
    batch_clean, batch_corrupt = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    modules = {(layer, i): m[2] for layer in range(model.n_layers) for i, m in enumerate(raw_mixers(hf, layer))}

    def run(batch, grad: bool):
        store: dict = {}

        def keep(key):
            def pre(module, args):
                store[key] = args[0]  # with grad: a node of the graph, differentiated through

            return pre

        with hooked([(m, "pre", keep(key)) for key, m in modules.items()]), torch.set_grad_enabled(grad):
            logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return logits, store

    clean_acts = run(batch_clean, False)[1]
    logits, corrupt_acts = run(batch_corrupt, True)
    value = metric(logits).mean()
    keys = list(corrupt_acts)
    grads = dict(zip(keys, torch.autograd.grad(value, [corrupt_acts[k] for k in keys]), strict=True))
    for head in model.heads:
        _, _, _, index, width = raw_head(hf, head)
        key = next(k for k, m in modules.items() if k[0] == head.layer and m is raw_head(hf, head)[2])
        cols = slice(index * width, (index + 1) * width)
        effect = ((clean_acts[key][..., cols] - corrupt_acts[key][..., cols].detach()) * grads[key][..., cols]).sum()
        assert result.scores[head.layer, head.head] == pytest.approx(float(value.detach()) + float(effect), abs=1e-5), head


def test_discover_runs_on_a_hybrid(tokenizer):
    """A random hybrid retrieves nothing, but every stage runs over mixed attention and SSM
    heads, and the head scan is a [layer, head] table with NaN where a layer has no head."""
    from gna_interp.tasks.toy import VOCAB

    model = gna.load(tiny_model("nemotron_h", seed=1, vocab_size=len(VOCAB)), tokenizer=tokenizer)
    task = gna.tasks.toy_mcq(12, seed=3)
    with pytest.warns(gna.discovery.NoRetrievalWarning):
        circuit = gna.discover(model, task, max_candidates=8, search_at_chance=True, progress=False)
    scan = torch.tensor([[float("nan") if v is None else v for v in row] for row in circuit.head_scan])
    assert scan.shape == (model.n_layers, model.n_heads)
    assert scan[1].isnan().all() and scan[3].isnan().all() and not scan[[0, 2]].isnan().any()
    assert {model.head_kind(e.head) for e in circuit.heads} == {KINDS.ATTENTION, KINDS.SSM}
    assert all(e.scores is not None for e in circuit.heads), "role scores need patterns of both kinds"


# ----- bad input and residue ---------------------------------------------------------------


def test_bad_heads_name_the_layer_and_its_heads(tokenizer):
    zamba = gna.load(tiny_model("zamba2"), tokenizer=tokenizer)
    nemotron = gna.load(tiny_model("nemotron_h"), tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"head L0H4 out of range: layer 0 of .* has heads 0..3$"):
        zamba.logits(PROMPTS, [gna.Ablate([H(0, 4)])])
    with pytest.raises(ValueError, match=r"head L1H8 out of range: layer 1 of .* has heads 0..7 \(attention 0..3, ssm 4..7\)"):
        gna.attention_pattern(zamba, PROMPTS, [H(1, 8)])
    with pytest.raises(ValueError, match=r"head L1H0 out of range: layer 1 of .* has 0 heads \(no attention or SSM mixer"):
        gna.ablation_sweep(nemotron, PROMPTS, None, lambda x: x[:, -1, 5], heads=[H(1, 0)], progress=False)
    with pytest.raises(ValueError, match=r"head L3H2 out of range: layer 3 of .* has 0 heads"), nemotron.ablated([H(0, 1), H(3, 2)]):
        pass
    with pytest.raises(ValueError, match=r"kind='attention' but heads \['L1H5'\] are not attention heads: .* has attention and ssm"):
        gna.attention_pattern(zamba, PROMPTS, [H(1, 0), H(1, 5)], kind="attention")
    with pytest.raises(ValueError, match=r"heads \['L1H1'\] of .* are attention heads: SSM inputs exist only for SSM heads"):
        gna.attention.ssm_inputs(zamba, PROMPTS, 1, heads=[4, 1])
    with pytest.raises(ValueError, match=r"layer 1 of .* is an mlp layer: SSM inputs exist only in SSM layers"):
        gna.attention.ssm_inputs(nemotron, PROMPTS, 1)
    assert not zamba.active_interventions and not nemotron.active_interventions


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("family", ["zamba2-shared", "falcon_h1"])
def test_failures_leave_no_residue(family, tokenizer):
    hf = one_shared_module(tiny_model("zamba2", seed=2)) if family == "zamba2-shared" else tiny_model(family, seed=2)
    model = gna.load(hf, tokenizer=tokenizer)
    batch = model.to_batch(CLEAN)
    before, logits = hf_logits(hf, batch).clone(), model.logits(CLEAN)
    weights = {k: v.clone() for k, v in hf.state_dict().items()}
    implementation = hf.config._attn_implementation
    calls = {"n": 0}

    def exploding(logits):
        calls["n"] += 1
        if calls["n"] > 2:
            raise Boom("metric failed mid-sweep")
        return logits[:, -1, 5]

    heads = [H(3, 1), H(1, 6), H(0, 2)] if family == "zamba2-shared" else [H(0, 1), H(1, 6), H(2, 3)]
    with pytest.raises(Boom):
        gna.ablation_sweep(model, CLEAN, None, exploding, heads=heads, batch_size=len(CLEAN), progress=False)
    with pytest.raises(Boom), model.ablated(heads):
        gna.attention_pattern(model, CLEAN, heads)
        raise Boom("user code failed inside the context")
    with pytest.raises(Exception):  # noqa: B017 - any error from inside the forward
        bad = Plan()
        bad.add(model.head_site(heads[0])[0], Edit(torch.ones(1, 1, 4, 1, dtype=torch.bool), torch.zeros(3, 3, 3, 3, 3)))
        model.backend.run(batch, bad)
    assert not model.active_interventions
    assert torch.equal(model.logits(CLEAN), logits)
    assert torch.equal(hf_logits(hf, batch), before)
    assert all(torch.equal(v, weights[k]) for k, v in hf.state_dict().items())
    assert no_hooks_anywhere(hf)
    assert hf.config._attn_implementation == implementation, "the eager switch for patterns was undone"


def test_entry_stage_skips_heads_that_a_later_mixer_of_their_block_reads(tokenizer):
    """Zamba2: a hybrid layer's Mamba-2 scans its shared attention's output across
    positions, so those attention heads do not act only where they write; FalconH1's two
    mixers run side by side, so all of its heads do."""
    from gna_interp.models.structure import acts_where_it_writes as _acts_where_it_writes

    zamba = gna.load(tiny_model("zamba2", seed=0), tokenizer=tokenizer, backend="nnsight")
    for head in zamba.heads:
        hybrid_layer = zamba.layer_kinds[head.layer] is gna.LayerKind.HYBRID
        attention = zamba.head_kind(head) is gna.LayerKind.ATTENTION
        assert _acts_where_it_writes(zamba, head) is not (hybrid_layer and attention), head
    assert any(zamba.head_kind(h) is gna.LayerKind.ATTENTION for h in zamba.heads)
    falcon = gna.load(tiny_model("falcon_h1", seed=0), tokenizer=tokenizer, backend="nnsight")
    assert all(_acts_where_it_writes(falcon, head) for head in falcon.heads)
