"""A brute-force twin of path patching on the raw HF model: forward hooks only, written
from the HF modelling code, sharing no code with gna_interp.

The definition: a path into a receiver R changes R's output (its slice of the
out-projection input) and nothing else. As a fixed point of two runs on the clean input:

- D: every head's output (out-projection input), in every layer, frozen to its value in
  C, the senders' set to their corrupt values; MLPs and norms recomputed. What each
  receiver would output there (before the freeze) and its input streams are read. For
  ``"any"``, the other heads of a receiver's Mamba-2 group norm feed the norm their
  inputs in C (scan output and gate).
- C: clean, except for the receivers' outputs. ``"any"``: each receiver's slice is its
  D value. Streams: the receivers' mixer runs a second time, as a *copy*, with the
  receivers' stream columns (a shared unit: all of it) set to their D values, and each
  receiver's slice is taken from the copy; everything else comes from the ordinary call.
  In the copy, R's other inputs stay as in the ordinary call: Mamba-1's ``x_proj`` reads
  the receivers' unpatched ``x`` columns, and a Mamba-2 group norm reads the other heads'
  unpatched input. Receivers of one mixer share the copy.

Starting from C = clean and alternating at most ``n_layers + 1`` times reaches the fixed
point (each round settles at least one more layer; it stops once C reproduces itself). The answer is the metric of C's logits,
or of D's when ``"logits"`` is a receiver.

``whole_unit=True`` is the earlier definition (attention and Mamba-2), kept to measure
what it leaked: the receivers' stream columns are patched in the ordinary call, so every
head reading a shared unit (and, through a group norm, every head of the group) sees the
patch.

Families: Llama-like, Mamba-2, Mamba-1 and FalconH1 (attention heads, then Mamba-2 heads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Mixer:
    module: torch.nn.Module
    kind: str  # "attention", "mamba2", "mamba1"
    n_heads: int
    head_dim: int
    offset: int  # layer-level number of the first head

    @property
    def out_proj(self) -> torch.nn.Module:
        return self.module.o_proj if self.kind == "attention" else self.module.out_proj


def blocks(hf):
    return (hf.model if hasattr(hf, "model") else hf.backbone).layers


def mixers(hf, layer: int) -> list[Mixer]:
    """The layer's mixers, attention first, with their heads."""
    c, block = hf.config, blocks(hf)[layer]
    if c.model_type == "mamba2":
        return [Mixer(block.mixer, "mamba2", c.num_heads, c.head_dim, 0)]
    if c.model_type in ("mamba", "falcon_mamba"):
        return [Mixer(block.mixer, "mamba1", c.intermediate_size, 1, 0)]
    attention = Mixer(block.self_attn, "attention", c.num_attention_heads, c.hidden_size // c.num_attention_heads, 0)
    if c.model_type == "falcon_h1":
        return [attention, Mixer(block.mamba, "mamba2", c.mamba_n_heads, c.mamba_d_head, c.num_attention_heads)]
    return [attention]


def mixer(hf, layer: int) -> torch.nn.Module:
    return mixers(hf, layer)[0].module


def n_heads(hf) -> int:
    """Heads per layer of a family with one mixer per layer (Llama-like, Mamba-1, Mamba-2)."""
    return mixers(hf, 0)[0].n_heads


def locate(hf, layer: int, head: int) -> tuple[int, int]:
    """(mixer number, head index in it) of a layer-level head."""
    for i, m in enumerate(mixers(hf, layer)):
        if m.offset <= head < m.offset + m.n_heads:
            return i, head - m.offset
    raise ValueError(f"layer {layer} has no head {head}")


def _mamba2_sizes(c):
    if c.model_type == "falcon_h1":
        return c.mamba_n_heads, c.mamba_d_head, c.mamba_n_groups, c.mamba_d_state
    return c.num_heads, c.head_dim, c.n_groups, c.state_size


def stream_columns(hf, kind: str, name: str, head: int) -> tuple[str, list[int]]:
    """(submodule whose *output* holds the stream, its columns for ``head`` of a ``kind`` mixer)."""
    c = hf.config
    if kind == "attention":
        hd = c.hidden_size // c.num_attention_heads
        unit = head if name == "q" else head // (c.num_attention_heads // c.num_key_value_heads)
        return f"{name}_proj", list(range(unit * hd, (unit + 1) * hd))
    if kind == "mamba2":
        heads, hd, groups, state = _mamba2_sizes(c)
        inner = heads * hd
        group = head // (heads // groups)
        first = {
            "gate": head * hd,
            "x": inner + head * hd,
            "B": 2 * inner + group * state,
            "C": 2 * inner + groups * state + group * state,
            "dt": 2 * inner + 2 * groups * state + head,
        }[name]
        width = {"gate": hd, "x": hd, "B": state, "C": state, "dt": 1}[name]
        return "in_proj", list(range(first, first + width))
    inner, rank, state = c.intermediate_size, c.time_step_rank, c.state_size
    if name in ("x", "gate"):
        return "in_proj", [head if name == "x" else inner + head]
    first, width = {"dt": (0, rank), "B": (rank, state), "C": (rank + state, state)}[name]
    return "x_proj", list(range(first, first + width))


STREAMS = {"attention": ("q", "k", "v"), "mamba2": ("gate", "x", "B", "C", "dt"), "mamba1": ("x", "gate", "dt", "B", "C")}


def _columns(m: Mixer, heads: list[int]) -> list[int]:
    return [col for h in heads for col in range(h * m.head_dim, (h + 1) * m.head_dim)]


def _run(hf, batch, hooks, grad: bool = False):
    """Logits with ``hooks`` = [(module, "pre" | "pre_kw" | "post", fn)] registered; all removed after.
    ``grad``: keep the autograd graph (a twin that differentiates)."""
    handles = []
    try:
        for module, kind, fn in hooks:
            if kind == "post":
                handles.append(module.register_forward_hook(fn))
            else:
                handles.append(module.register_forward_pre_hook(fn, with_kwargs=kind == "pre_kw"))
        with torch.set_grad_enabled(grad):
            return hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    finally:
        for handle in handles:
            handle.remove()


def _capture_outputs(hf, store):
    """Hooks storing every mixer's out-projection input (after any replacement by earlier
    hooks) and every Mamba-2 norm input, as flat ``[batch, pos, features]``."""
    hooks = []
    for layer in range(hf.config.num_hidden_layers):
        for i, m in enumerate(mixers(hf, layer)):

            def keep(module, args, key=("out", layer, i)):
                store[key] = args[0].clone()

            hooks.append((m.out_proj, "pre", keep))
            if m.kind == "mamba2" and _has_norm(m):

                def keep_y(module, args, layer=layer, i=i):
                    store[("y", layer, i)] = args[0].clone()
                    store[("gate", layer, i)] = args[1].clone()

                hooks.append((m.module.norm, "pre", keep_y))
    return hooks


def _has_norm(m: Mixer) -> bool:
    return not isinstance(m.module.norm, torch.nn.Identity) and getattr(m.module, "mamba_rms_norm", True)


def head_outputs(hf, batch):
    store = {}
    logits = _run(hf, batch, _capture_outputs(hf, store))
    return store, logits


def path_patch(hf, clean, corrupt, senders, receivers, streams, metric, whole_unit=False):
    """``receivers``: Heads and/or "logits"; ``streams``: "any" or names (each receiver uses
    those its mixer has)."""
    to_logits = "logits" in receivers
    by_mixer: dict[tuple[int, int], list[int]] = {}
    for r in receivers:
        if r != "logits":
            i, index = locate(hf, r.layer, r.head)
            by_mixer.setdefault((r.layer, i), []).append(index)
    clean_store, _ = head_outputs(hf, clean)
    corrupt_store, _ = head_outputs(hf, corrupt)
    c_store = clean_store
    c_logits = d_logits = None
    for _ in range(hf.config.num_hidden_layers + 1):
        d_store: dict = {}
        d_logits = _run(hf, clean, _d_hooks(hf, senders, by_mixer, streams, c_store, corrupt_store, d_store))
        c_next: dict = {}
        c_hooks = []
        for (layer, i), heads in by_mixer.items():
            c_hooks += _c_hooks(hf, layer, i, heads, streams, d_store, whole_unit)
        c_hooks += _capture_outputs(hf, c_next)
        c_logits = _run(hf, clean, c_hooks)
        settled = c_next.keys() == c_store.keys() and all(torch.equal(c_next[k], c_store[k]) for k in c_next)
        c_store = c_next
        if settled:  # C reproduced itself: the next D would too
            break
    return float(metric(d_logits if to_logits else c_logits).mean())


def path_patch_direct(hf, clean, corrupt, senders, receivers, streams, metric):
    """``path="direct"`` (TransformerLens's, EAP's and MIB's edge): D is the clean run with
    each receiver block's input plus the senders' own writes (out-projection of their
    corrupt-minus-clean slice, times FalconH1's out multiplier); nothing is frozen, and the
    MLPs see the senders unchanged. C as in `path_patch`. With "logits", the final norm
    reads C's residual stream plus every sender's write. MLP nodes (``"L0MLP"``): as a sender,
    its write is its corrupt-minus-clean output; as a receiver, its norm reads the clean
    input of that norm plus the writes of the senders before it (the heads of its own block
    included), in C."""
    by_mixer: dict[tuple[int, int], list[int]] = {}
    for r in receivers:
        if r != "logits" and not _is_mlp(r):
            i, index = locate(hf, r.layer, r.head)
            by_mixer.setdefault((r.layer, i), []).append(index)
    clean_store, _ = head_outputs(hf, clean)
    corrupt_store, _ = head_outputs(hf, corrupt)
    writes = []  # (layer, [batch, pos, d_model])
    for s in senders:
        if s == "embed":  # what the embedding writes: the residual stream entering block 0
            writes.append((-1, _block0_input(hf, corrupt) - _block0_input(hf, clean)))
            continue
        if _is_mlp(s):  # an MLP writes its output, after the heads of its block
            layer = int(s[1:-3])
            writes.append((layer + 0.5, _mlp_io(hf, corrupt, layer)[1] - _mlp_io(hf, clean, layer)[1]))
            continue
        i, index = locate(hf, s.layer, s.head)
        m = mixers(hf, s.layer)[i]
        cols = _columns(m, [index])
        delta = (corrupt_store[("out", s.layer, i)] - clean_store[("out", s.layer, i)])[..., cols]
        scale = 1.0
        if hf.config.model_type == "falcon_h1":
            scale = hf.config.attention_out_multiplier if m.kind == "attention" else hf.config.ssm_out_multiplier
        writes.append((s.layer, delta @ m.out_proj.weight[:, cols].T * scale))

    inputs: dict = {}  # the clean residual stream entering each block (and the final norm)

    def keep_input(key):
        def hook(module, args, kwargs):
            inputs[key] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).clone()

        return hook

    n_layers = hf.config.num_hidden_layers
    _run(hf, clean, [(module, "pre_kw", keep_input(k)) for k, module in enumerate([*blocks(hf), final_norm(hf)])])

    def add_writes(before, from_clean=True):
        """The block's input: the clean residual (or, for the final norm, C's) plus the writes
        of the senders before it."""

        def hook(module, args, kwargs):
            total = sum(w for layer, w in writes if layer < before)
            current = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            value = (inputs[before] if from_clean else current) + total
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": value}
            return (value, *args[1:]), kwargs

        return hook

    c_store = clean_store
    for _ in range(hf.config.num_hidden_layers + 1):
        d_store: dict = {}
        d_hooks = [(blocks(hf)[layer], "pre_kw", add_writes(layer)) for layer in {layer for layer, _ in by_mixer}]
        d_hooks += _d_hooks(hf, [], by_mixer, streams, c_store, corrupt_store, d_store, freeze=False)
        _run(hf, clean, d_hooks)
        c_next: dict = {}
        c_hooks = []
        for (layer, i), heads in by_mixer.items():
            c_hooks += _c_hooks(hf, layer, i, heads, streams, d_store, False)
        c_hooks += _capture_outputs(hf, c_next)
        if "logits" in receivers:
            c_hooks.append((final_norm(hf), "pre_kw", add_writes(n_layers, from_clean=False)))
        for r in filter(_is_mlp, receivers):  # the MLP's norm reads its clean input plus the writes before it
            layer = int(r[1:-3])
            value = _mlp_io(hf, clean, layer)[0] + sum(w for at, w in writes if at < layer + 0.5)
            c_hooks.append((_mlp_modules(hf, layer)[0], "pre", lambda module, args, value=value: (value, *args[1:])))
        c_logits = _run(hf, clean, c_hooks)
        settled = c_next.keys() == c_store.keys() and all(torch.equal(c_next[k], c_store[k]) for k in c_next)
        c_store = c_next
        if settled:
            break
    return float(metric(c_logits).mean())


def _is_mlp(node) -> bool:
    return isinstance(node, str) and node.startswith("L") and node.endswith("MLP")


def _mlp_modules(hf, layer: int):
    """(the norm before the MLP, the MLP) of block ``layer`` (Llama-like, FalconH1)."""
    block = blocks(hf)[layer]
    if hf.config.model_type == "falcon_h1":
        return block.pre_ff_layernorm, block.feed_forward
    return block.post_attention_layernorm, block.mlp


def _mlp_io(hf, batch, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the input of block ``layer``'s MLP norm, the MLP's output) in the plain run of ``batch``."""
    seen = {}
    norm, mlp = _mlp_modules(hf, layer)

    def keep_in(module, args):
        seen["in"] = args[0].clone()

    def keep_out(module, args, out):
        seen["out"] = out.clone()

    _run(hf, batch, [(norm, "pre", keep_in), (mlp, "post", keep_out)])
    return seen["in"], seen["out"]


def _block0_input(hf, batch) -> torch.Tensor:
    seen = {}

    def keep(module, args, kwargs):
        seen["x"] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).clone()

    _run(hf, batch, [(blocks(hf)[0], "pre_kw", keep)])
    return seen["x"]


def final_norm(hf) -> torch.nn.Module:
    body = hf.model if hasattr(hf, "model") else hf.backbone
    return body.norm_f if hasattr(body, "norm_f") else (body.final_layernorm if hasattr(body, "final_layernorm") else body.norm)


def _d_hooks(hf, senders, by_mixer, streams, c_store, corrupt_store, d_store, freeze=True):
    hooks = []
    for layer in range(hf.config.num_hidden_layers):
        for i, m in enumerate(mixers(hf, layer)):
            frozen = c_store[("out", layer, i)].clone()
            for s in senders:
                si, index = locate(hf, s.layer, s.head)
                if (s.layer, si) == (layer, i):
                    cols = _columns(m, [index])
                    frozen[..., cols] = corrupt_store[("out", layer, i)][..., cols]

            def freeze_heads(module, args, frozen=frozen, key=("out", layer, i)):
                d_store[key] = args[0].clone()  # what the heads would output here
                return (frozen, *args[1:]) if freeze else None

            hooks.append((m.out_proj, "pre", freeze_heads))
            if (layer, i) not in by_mixer:
                continue
            for name in ("q_proj", "k_proj", "v_proj", "in_proj", "x_proj"):
                if hasattr(m.module, name):

                    def keep(module, args, out, key=(name, layer, i)):
                        d_store[key] = out.clone()

                    hooks.append((getattr(m.module, name), "post", keep))
            if streams == "any" and m.kind == "mamba2" and _has_norm(m):
                others = _columns(m, [h for h in range(m.n_heads) if h not in by_mixer[(layer, i)]])
                held = c_store[("y", layer, i)], c_store[("gate", layer, i)]

                def hold_others(module, args, cols=others, held=held):
                    y, gate = args[0].clone(), args[1].clone()
                    y[..., cols], gate[..., cols] = held[0][..., cols], held[1][..., cols]
                    return (y, gate, *args[2:])

                hooks.append((m.module.norm, "pre", hold_others))
    return hooks


def _c_hooks(hf, layer, i, heads, streams, d_store, whole_unit):
    m = mixers(hf, layer)[i]
    cols = _columns(m, heads)
    if streams == "any":

        def put_back(module, args):
            x = args[0].clone()
            x[..., cols] = d_store[("out", layer, i)][..., cols]
            return (x, *args[1:])

        return [(m.out_proj, "pre", put_back)]
    columns: dict[str, set[int]] = {}
    for name in (s for s in streams if s in STREAMS[m.kind]):
        for head in heads:
            module, unit = stream_columns(hf, m.kind, name, head)
            columns.setdefault(module, set()).update(unit)
    state = {"mode": "ordinary"}
    plain: dict = {}
    copy: dict = {}

    def patch_for(name, chosen):
        def hook(module, args, out):
            if state["mode"] == "plain" or (state["mode"] == "ordinary" and not whole_unit):
                return None
            out = out.clone()
            out[..., chosen] = d_store[(name, layer, i)][..., chosen]
            return out

        return hook

    hooks = [(getattr(m.module, name), "post", patch_for(name, sorted(chosen))) for name, chosen in columns.items()]
    if whole_unit:
        assert m.kind != "mamba1", "whole_unit: attention and Mamba-2 only"
        return hooks

    def x_proj_reads_unpatched_x(module, args):  # Mamba-1: the shared dt / B / C stay clean
        if state["mode"] == "plain":
            plain["x_read"] = args[0].clone()
        elif state["mode"] == "copy" and "x" in streams:
            x = args[0].clone()
            x[..., heads] = plain["x_read"][..., heads]
            return (x, *args[1:])
        return None

    def norm_reads_unpatched_others(module, args):  # Mamba-2: the group norm's other heads stay clean
        if state["mode"] == "plain":
            plain["y"] = args[0].clone()
        elif state["mode"] == "copy":
            y = args[0].clone()
            others = _columns(m, [h for h in range(m.n_heads) if h not in heads])
            y[..., others] = plain["y"][..., others]
            return (y, *args[1:])
        return None

    def out_proj(module, args):
        if state["mode"] == "copy":
            copy["out"] = args[0].clone()
        elif state["mode"] == "ordinary":
            x = args[0].clone()
            x[..., cols] = copy["out"][..., cols]
            return (x, *args[1:])
        return None

    def run_copy_first(module, args, kwargs):
        if state["mode"] != "ordinary":
            return None
        try:
            state["mode"] = "plain"
            module(*args, **kwargs)
            state["mode"] = "copy"
            module(*args, **kwargs)
        finally:
            state["mode"] = "ordinary"
        return None

    hooks.append((m.module, "pre_kw", run_copy_first))
    hooks.append((m.out_proj, "pre", out_proj))
    if m.kind == "mamba1":
        hooks.append((m.module.x_proj, "pre", x_proj_reads_unpatched_x))
    if m.kind == "mamba2" and _has_norm(m):
        hooks.append((m.module.norm, "pre", norm_reads_unpatched_others))
    return hooks


def final_run_inputs(weight_module: torch.nn.Module):
    """A context that records the input of every ``F.linear`` call with ``weight_module``'s
    weight (whatever wraps the module): what an out-projection really receives, even when
    a library edits its input inside its own call."""
    return _LinearSpy(weight_module)


class _LinearSpy:
    def __init__(self, module: torch.nn.Module) -> None:
        self.weight = module.weight if hasattr(module, "weight") else module.original_component.weight
        self.inputs: list[torch.Tensor] = []

    def __enter__(self):
        self.original = torch.nn.functional.linear
        spy = self

        def linear(x, weight, bias=None):
            if weight is spy.weight:
                spy.inputs.append(x.detach().clone())
            return spy.original(x, weight, bias)

        torch.nn.functional.linear = linear
        return self

    def __exit__(self, *exc):
        torch.nn.functional.linear = self.original
        return False
