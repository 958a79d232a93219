"""Integrated-gradient edge attribution (``steps > 1``) against a raw-hook twin on the HF
model, with ``path="all"`` and ``path="direct"``, on Llama (both backends), Mamba-2 and
FalconH1 of 4 layers (so that senders sit downstream of a receiver).

The twin's point ``alpha``: the plain HF forward with every sender's output (a head's
slice of its out-projection input; ``"embed"``: the residual entering block 0; an MLP: its
output) written straight through, ``live + (clean + alpha * delta - live).detach()``: the
forward value is interpolated, and the backward runs through every sender as in an unedited
run. ``alpha = 0`` is then the plain clean run, the same definition as every other point.
The score is the mean over ``alpha = 0, 1/k, ...`` of (``path="all"``) ``d/dt <g_r, out_r>``
with every head frozen at its value at the point but the sender's, moved by ``t * delta``
(`tests.test_edges.twin_edge` at a point), or (``path="direct"``) the sender's write dotted
with the gradient at the receiver's own copy of the residual stream; ``g_r`` is the point's
gradient of the metric at the receiver's output, every path downstream included.
"""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from . import path_twin
from .conftest import CLEAN, CORRUPT, no_hooks_left
from .test_path_patching import METRIC

H = gna.Head
STEPS = 2
MIN_EFFECT = 1e-3


def four_layer_model(family: str, **config):
    """`tests.test_path_patching.sensitive_model`'s scaling, with 4 layers."""
    hf = tiny_model(family, seed=0, num_hidden_layers=4, **config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(4)
            elif name.endswith("dt_bias"):
                param.fill_(0.5)
    return hf


# name -> (family, config, backend, streams with path="all", stream of the direct head receiver)
MODELS = {
    "llama-tlens": ("llama", {}, "tlens", ["k", "v"], "q"),
    "llama-nnsight": ("llama", {}, "nnsight", ["k", "v"], "q"),
    "mamba2": ("mamba2", {}, "nnsight", ["x", "B"], "x"),
    "falcon_h1": ("falcon_h1", {"mamba_rms_norm": True}, "nnsight", ["v", "x"], "x"),
}


@pytest.fixture(scope="module")
def models(tokenizer):
    hfs = {family: four_layer_model(family, **config) for family, config, *_ in MODELS.values()}
    loaded = {name: gna.load(copy.deepcopy(hfs[m[0]]), tokenizer=tokenizer, backend=m[2]) for name, m in MODELS.items()}
    return hfs, loaded


def _run(hf, batch, hooks):
    return path_twin._run(hf, batch, hooks, grad=True)


def _hidden(args, kwargs):
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def _with_hidden(args, kwargs, value):
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": value}
    return (value, *args[1:]), kwargs


class Twin:
    """The clean and corrupt values of every writer, and the point runs."""

    def __init__(self, hf, clean, corrupt, senders):
        self.hf, self.clean, self.senders = hf, clean, senders
        self.stores = [path_twin.head_outputs(hf, batch)[0] for batch in (clean, corrupt)]
        self.embeds = [path_twin._block0_input(hf, batch) for batch in (clean, corrupt)]
        mlps = [int(s[1:-3]) for s in senders if isinstance(s, str) and s != "embed"]
        self.mlps = {layer: [path_twin._mlp_io(hf, batch, layer)[1] for batch in (clean, corrupt)] for layer in mlps}

    def heads_of(self, layer, i):
        """The senders' indices in mixer ``i`` of ``layer``."""
        places = [path_twin.locate(self.hf, s.layer, s.head) for s in self.senders if isinstance(s, gna.Head) and s.layer == layer]
        return [index for mixer, index in places if mixer == i]

    def delta(self, key, cols):
        return (self.stores[1][key] - self.stores[0][key])[..., cols]

    def point_hooks(self, alpha, leaf_at=None, keep=None):
        """Every sender written straight through at ``alpha``; ``leaf_at = (layer, i, cols)``:
        those out-projection input columns replaced by a leaf (``keep["leaf"]``); ``keep``
        gets every out-projection input and Mamba-2 norm input (detached)."""

        def st(live, clean, corrupt, cols=...):
            new = live.clone()
            target = clean[..., cols] + alpha * (corrupt[..., cols] - clean[..., cols])
            new[..., cols] = live[..., cols] + (target - live[..., cols]).detach()
            return new

        hooks = []
        if "embed" in self.senders:
            hooks.append((path_twin.blocks(self.hf)[0], "pre_kw", lambda m, a, k: _with_hidden(a, k, st(_hidden(a, k), *self.embeds))))
        for layer, (clean, corrupt) in self.mlps.items():
            hooks.append((path_twin._mlp_modules(self.hf, layer)[1], "post", lambda m, a, out, c=clean, x=corrupt: st(out, c, x)))
        for layer in range(self.hf.config.num_hidden_layers):
            for i, mixer in enumerate(path_twin.mixers(self.hf, layer)):

                def pre(module, args, layer=layer, i=i, mixer=mixer):
                    x = args[0]
                    cols = path_twin._columns(mixer, self.heads_of(layer, i))
                    if cols:
                        x = st(x, self.stores[0][("out", layer, i)], self.stores[1][("out", layer, i)], cols)
                    if leaf_at is not None and leaf_at[:2] == (layer, i):
                        keep["leaf"] = x[..., leaf_at[2]].detach().clone().requires_grad_(True)
                        x = x.clone()
                        x[..., leaf_at[2]] = keep["leaf"]
                    if keep is not None:
                        keep[("out", layer, i)] = x.detach().clone()
                    return (x, *args[1:])

                hooks.append((mixer.out_proj, "pre", pre))
                if keep is not None and mixer.kind == "mamba2" and path_twin._has_norm(mixer):
                    hooks.append((mixer.module.norm, "pre", lambda m, a, key=("y", layer, i): keep.__setitem__(key, a[0].detach().clone())))
        return hooks

    def stream_modules(self, receiver, streams):
        """``{module: the receiver's columns of its output}`` for ``streams``."""
        i, index = path_twin.locate(self.hf, receiver.layer, receiver.head)
        mixer = path_twin.mixers(self.hf, receiver.layer)[i]
        modules: dict = {}
        for stream in streams:
            name, columns = path_twin.stream_columns(self.hf, mixer.kind, stream, index)
            modules.setdefault(getattr(mixer.module, name), []).extend(columns)
        return modules

    def receiver_output(self, receiver, streams, point, d_outs):
        """The receiver's output slice at the point, its ``streams`` columns taken from
        ``d_outs`` (``{module: output}``, with a graph), the other heads' inputs to its group
        norm at the point."""
        hf = self.hf
        i, index = path_twin.locate(hf, receiver.layer, receiver.head)
        mixer = path_twin.mixers(hf, receiver.layer)[i]
        seen = {}

        def patch(module, args, out, columns):
            out = out.clone()
            out[..., columns] = d_outs[module][..., columns]
            return out

        def read(module, args):
            seen["out"] = args[0][..., path_twin._columns(mixer, [index])]

        hooks = [*self.point_hooks(self.alpha), (mixer.out_proj, "pre", read)]
        for module, columns in self.stream_modules(receiver, streams).items():
            hooks.append((module, "post", lambda m, a, out, c=columns: patch(m, a, out, c)))
        if mixer.kind == "mamba2" and path_twin._has_norm(mixer):
            others = path_twin._columns(mixer, [h for h in range(mixer.n_heads) if h != index])

            def hold(module, args):
                y = args[0].clone()
                y[..., others] = point[("y", receiver.layer, i)][..., others]
                return (y, *args[1:])

            hooks.append((mixer.module.norm, "pre", hold))
        _run(hf, self.clean, hooks)
        return seen["out"]

    def d_outputs(self, receiver, streams, hooks):
        """Run with ``hooks`` and keep the outputs of the receiver's stream modules."""
        d_outs: dict = {}
        keep = [(module, "post", lambda m, a, out: d_outs.__setitem__(m, out)) for module in self.stream_modules(receiver, streams)]
        _run(self.hf, self.clean, [*hooks, *keep])
        return d_outs

    def point(self, receiver, alpha):
        """``(g_r, the point's stored values)`` at ``alpha``."""
        i, index = path_twin.locate(self.hf, receiver.layer, receiver.head)
        mixer = path_twin.mixers(self.hf, receiver.layer)[i]
        keep = {}
        logits = _run(self.hf, self.clean, self.point_hooks(alpha, (receiver.layer, i, path_twin._columns(mixer, [index])), keep))
        (g_r,) = torch.autograd.grad(METRIC(logits).float().mean(), keep["leaf"])
        return g_r, keep

    def edge_all(self, sender, receiver, stream, alpha):
        """``d/dt <g_r, out_r>``: every head frozen at the point, the sender moved by ``t * delta``."""
        g_r, point = self.point(receiver, alpha)
        t = torch.zeros((), requires_grad=True)
        s_i, s_index = path_twin.locate(self.hf, sender.layer, sender.head)
        hooks = []
        for layer in range(self.hf.config.num_hidden_layers):
            for i, mixer in enumerate(path_twin.mixers(self.hf, layer)):
                frozen = point[("out", layer, i)]
                if (layer, i) == (sender.layer, s_i):
                    cols = path_twin._columns(mixer, [s_index])
                    change = torch.zeros_like(frozen)
                    change[..., cols] = self.delta(("out", layer, i), cols)
                    frozen = frozen + t * change
                hooks.append((mixer.out_proj, "pre", lambda m, a, f=frozen: (f, *a[1:])))
        self.alpha = alpha
        out_r = self.receiver_output(receiver, [stream], point, self.d_outputs(receiver, [stream], hooks))
        return float(torch.autograd.grad((out_r * g_r).sum(), t)[0])

    def write(self, sender):
        if sender == "embed":
            return self.embeds[1] - self.embeds[0]
        if isinstance(sender, str):
            clean, corrupt = self.mlps[int(sender[1:-3])]
            return corrupt - clean
        i, index = path_twin.locate(self.hf, sender.layer, sender.head)
        mixer = path_twin.mixers(self.hf, sender.layer)[i]
        cols = path_twin._columns(mixer, [index])
        scale = 1.0
        if self.hf.config.model_type == "falcon_h1":
            scale = self.hf.config.attention_out_multiplier if mixer.kind == "attention" else self.hf.config.ssm_out_multiplier
        return self.delta(("out", sender.layer, i), cols) @ mixer.out_proj.weight.detach()[:, cols].T * scale

    def reader_gradient(self, receiver, alpha):
        """``d metric / d (the receiver's own copy of the residual stream)`` at the point:
        a head through every stream of its mixer (``<g_r, out_r>``), an MLP through its norm,
        the logits at the final norm."""
        if isinstance(receiver, str):
            module = path_twin.final_norm(self.hf) if receiver == "logits" else path_twin._mlp_modules(self.hf, int(receiver[1:-3]))[0]
            seen = {}

            def leaf(m, args):
                seen["x"] = args[0].detach().clone().requires_grad_(True)
                return (seen["x"], *args[1:])

            logits = _run(self.hf, self.clean, [*self.point_hooks(alpha), (module, "pre", leaf)])
            return torch.autograd.grad(METRIC(logits).float().mean(), seen["x"])[0]
        g_r, point = self.point(receiver, alpha)
        seen = {}

        def block_leaf(m, args, kwargs):
            seen["x"] = _hidden(args, kwargs).detach().clone().requires_grad_(True)
            return _with_hidden(args, kwargs, seen["x"])

        r_mixer = path_twin.mixers(self.hf, receiver.layer)[path_twin.locate(self.hf, receiver.layer, receiver.head)[0]]
        streams = path_twin.STREAMS[r_mixer.kind]
        hooks = [*self.point_hooks(alpha), (path_twin.blocks(self.hf)[receiver.layer], "pre_kw", block_leaf)]
        self.alpha = alpha
        out_r = self.receiver_output(receiver, streams, point, self.d_outputs(receiver, streams, hooks))
        return torch.autograd.grad((out_r * g_r).sum(), seen["x"])[0]


def alphas():
    return [k / STEPS for k in range(STEPS)]


@pytest.mark.parametrize("name", list(MODELS))
def test_path_all_equals_the_straight_through_twin(models, name):
    """Receivers in layers 1 and 3, senders every head of layers 0 .. 2: layer 2's heads sit
    downstream of the layer-1 receiver, so its gradient runs through them (the old
    definition cut it there at ``alpha > 0``; see CHANGELOG)."""
    hfs, loaded = models
    family, _, _, streams, _ = MODELS[name]
    model, hf = loaded[name], hfs[family]
    last = model.heads_per_layer[3] - 1
    receivers = [H(1, 0), H(3, last)]
    result = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, receivers=receivers, receiver_input=streams, steps=STEPS, progress=False)
    twin = Twin(hf, model.to_batch(CLEAN), model.to_batch(CORRUPT), result.senders)
    checked = [(H(0, 0), H(1, 0)), (H(0, last), H(1, 0)), (H(2, 1), H(3, last))]
    largest = 0.0
    for sender, receiver in checked:
        for k, stream in enumerate(streams):
            got = float(result.scores[result.senders.index(sender), receivers.index(receiver), k])
            if stream not in model.receiver_inputs(receiver):
                assert got != got
                continue
            want = sum(twin.edge_all(sender, receiver, stream, alpha) for alpha in alphas()) / STEPS
            assert got == pytest.approx(want, abs=2e-5, rel=2e-3), (sender, receiver, stream)
            largest = max(largest, abs(want))
    assert largest > MIN_EFFECT


@pytest.mark.parametrize("name", list(MODELS))
def test_path_direct_equals_the_straight_through_twin(models, name):
    """Every writer a sender (``"embed"``, heads, MLPs); receivers a layer-1 head (every
    stream), MLP 1 and the logits: the writers after the head or MLP 1 sit downstream."""
    hfs, loaded = models
    model, hf = loaded[name], hfs[MODELS[name][0]]
    mlps = [f"L{layer}MLP" for layer in range(3)] if model.arch.mlp else []
    senders = ["embed", *model.heads, *mlps]
    reader = H(1, model.heads_per_layer[1] - 1)  # FalconH1: an SSM head
    receivers = [reader, *(["L1MLP"] if mlps else []), "logits"]
    kwargs = dict(senders=senders, receivers=receivers, steps=STEPS, path="direct", progress=False)
    result = gna.edge_attribution(model, CLEAN, CORRUPT, METRIC, **kwargs)
    twin = Twin(hf, model.to_batch(CLEAN), model.to_batch(CORRUPT), senders)
    largest = 0.0
    for receiver in receivers:
        grads = [twin.reader_gradient(receiver, alpha) for alpha in alphas()]
        chosen = ["embed", H(0, 1), *mlps[:1], *([H(1, 2), H(2, 0), H(3, 1), *mlps[1:]] if receiver == "logits" else [])]
        for sender in chosen:
            want = sum(float((twin.write(sender) * g).sum()) for g in grads) / STEPS
            got = float(result.scores[result.senders.index(sender), result.receivers.index(receiver)])
            assert got == pytest.approx(want, abs=2e-5, rel=2e-3), (sender, receiver)
            largest = max(largest, abs(want))
    assert largest > MIN_EFFECT


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight"])
def test_straight_through_edit_against_raw_hooks(models, name):
    """`Edit(..., straight_through=True)` at every kind of site: the forward of the plain edit
    (bit for bit), and the gradient at an upstream site as raw hooks give it with the site
    written ``live + (value - live).detach()``; the plain edit cuts what ran through the site."""
    from gna_interp.core.plan import Edit, Plan, Site, SiteKind

    hfs, loaded = models
    model, hf = loaded[name], hfs["llama"]
    clean, corrupt = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    block = path_twin.blocks(hf)[1]
    hf_sites = {  # site -> (module, hook kind): where raw hooks see the same tensor, flat
        Site(SiteKind.RESID, 1): (block, "pre_kw"),
        Site(SiteKind.HEADS, 1): (block.self_attn.o_proj, "pre"),
        Site(SiteKind.STREAM, 1, "v"): (block.self_attn.v_proj, "post"),
        Site(SiteKind.MLP_IN, 1): (block.post_attention_layernorm, "pre"),
        Site(SiteKind.MLP_OUT, 1): (block.mlp, "post"),
    }
    upstream = Site(SiteKind.HEADS, 0)
    values = model.backend.run(corrupt, model.compile_plan(corrupt, []), capture=set(hf_sites)).acts
    for site, (module, kind) in hf_sites.items():
        runs = {}
        for through in (False, True):
            plan = Plan()
            plan.add(site, Edit(torch.ones((), dtype=torch.bool), values[site], straight_through=through))
            out = model.backend.run(clean, plan, capture={upstream}, grad=True)
            runs[through] = (out.logits.detach(), torch.autograd.grad(METRIC(out.logits).float().mean(), out.acts[upstream])[0])
        assert torch.equal(runs[True][0], runs[False][0]), site
        value, seen = values[site].flatten(2), {}

        def write(live, value=value):
            return live + (value - live).detach()

        def leaf(m, args, seen=seen):
            seen["x"] = args[0].detach().clone().requires_grad_(True)
            return (seen["x"], *args[1:])

        if kind == "pre_kw":
            hook = (module, kind, lambda m, a, k: _with_hidden(a, k, write(_hidden(a, k))))
        elif kind == "pre":
            hook = (module, kind, lambda m, a: (write(a[0]), *a[1:]))
        else:
            hook = (module, kind, lambda m, a, out: write(out))
        logits = _run(hf, clean, [(path_twin.blocks(hf)[0].self_attn.o_proj, "pre", leaf), hook])
        want = torch.autograd.grad(METRIC(logits).float().mean(), seen["x"])[0]
        got = runs[True][1].flatten(2)
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-4), (site, float((got - want).abs().max()))
        assert torch.allclose(runs[True][0], logits.detach(), atol=1e-5)
        cut = runs[False][1].flatten(2)
        assert float((got - cut).abs().max()) > 10 * float((got - want).abs().max()) + 1e-4, site  # the cut differs
    assert no_hooks_left(model)


def test_stacked_variants_refuse_a_straight_through_edit(models):
    """`stacked_plan` merges a site's edits into one plain `Edit`: a straight-through one would
    lose its flag there, so it is refused rather than silently turned into a plain edit."""
    from gna_interp.core.plan import Edit, Plan
    from gna_interp.patching.variants import Variant, stacked_plan

    model = models[1]["llama-tlens"]
    batch = model.to_batch(CLEAN)
    site = model.head_site(gna.Head(0, 0))[0]
    value = torch.zeros((batch.n_rows, batch.n_pos, *model.site_shape(site)))
    mask = torch.ones((*value.shape[:-1], 1), dtype=torch.bool)
    plain, through = Variant([(site, Edit(mask, value))]), Variant([(site, Edit(mask, value, straight_through=True))])
    assert stacked_plan(model, batch, Plan(), [plain, plain]) is not None
    with pytest.raises(NotImplementedError, match="straight-through"):
        stacked_plan(model, batch, Plan(), [plain, through])
