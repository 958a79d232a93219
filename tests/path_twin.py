"""A brute-force twin of path patching on the raw HF model: forward hooks only, written
from the HF modelling code, sharing no code with gna_interp.

The definition, as a fixed point of two runs on the clean input:

- D: every head output (out-projection input) of every layer frozen to its value in C,
  the senders' heads set to their corrupt values; MLPs and norms recomputed.
- C: clean, with the receivers' chosen input-stream columns replaced by their values in D
  (Mamba-1 ``x``: the channel's ``x_proj`` input column is recomputed from the unpatched
  ``in_proj`` output, so only the channel's own scan sees the change).

Starting from C = clean and alternating ``n_layers + 1`` times reaches the fixed point
(each round settles at least one more layer). The answer is the metric of C's logits,
or of D's when ``"logits"`` is a receiver.
"""

from __future__ import annotations

import torch


def mixer(hf, layer: int):
    backbone = hf.model if hasattr(hf, "model") else hf.backbone
    block = backbone.layers[layer]
    return block.self_attn if hasattr(block, "self_attn") else block.mixer


def n_heads(hf) -> int:
    c = hf.config
    if c.model_type in ("mamba", "falcon_mamba"):
        return c.intermediate_size
    return c.num_heads if c.model_type == "mamba2" else c.num_attention_heads


def stream_columns(hf, name: str, head: int) -> tuple[str, list[int]]:
    """(module of the mixer whose *output* holds the stream, its columns for ``head``)."""
    c = hf.config
    if c.model_type in ("llama", "mistral", "qwen2"):
        hd = c.hidden_size // c.num_attention_heads
        unit = head if name == "q" else head // (c.num_attention_heads // c.num_key_value_heads)
        return f"{name}_proj", list(range(unit * hd, (unit + 1) * hd))
    if c.model_type == "mamba2":
        inner, conv_dim = c.num_heads * c.head_dim, c.num_heads * c.head_dim + 2 * c.n_groups * c.state_size
        group = head // (c.num_heads // c.n_groups)
        first = {
            "gate": head * c.head_dim,
            "x": inner + head * c.head_dim,
            "B": 2 * inner + group * c.state_size,
            "C": 2 * inner + c.n_groups * c.state_size + group * c.state_size,
            "dt": inner + conv_dim + head,
        }[name]
        width = {"gate": c.head_dim, "x": c.head_dim, "B": c.state_size, "C": c.state_size, "dt": 1}[name]
        return "in_proj", list(range(first, first + width))
    inner, rank, state = c.intermediate_size, c.time_step_rank, c.state_size
    if name in ("x", "gate"):
        return "in_proj", [head if name == "x" else inner + head]
    first, width = {"dt": (0, rank), "B": (rank, state), "C": (rank + state, state)}[name]
    return "x_proj", list(range(first, first + width))


def _run(hf, batch, hooks):
    handles = []
    try:
        for module, kind, fn in hooks:
            register = module.register_forward_pre_hook if kind == "pre" else module.register_forward_hook
            handles.append(register(fn))
        with torch.no_grad():
            return hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    finally:
        for handle in handles:
            handle.remove()


def _out_proj(hf, layer):
    m = mixer(hf, layer)
    return m.o_proj if hasattr(m, "o_proj") else m.out_proj


def head_outputs(hf, batch, frozen=None):
    """Every layer's out-projection input ``[batch, pos, head, d_head]`` (optionally after
    replacing it by ``frozen[layer]``), and the logits."""
    store, hooks = {}, []
    for layer in range(hf.config.num_hidden_layers):

        def pre(module, args, layer=layer):
            x = args[0]
            if frozen is not None:
                x = frozen[layer].reshape(x.shape)
            store[layer] = x.reshape(*x.shape[:2], n_heads(hf), -1).clone()
            return (x, *args[1:])

        hooks.append((_out_proj(hf, layer), "pre", pre))
    logits = _run(hf, batch, hooks)
    return store, logits


def path_patch(hf, clean, corrupt, senders, receivers, streams, metric):
    """``receivers``: Heads and/or "logits"; ``streams``: names from the family's table."""
    to_logits = "logits" in receivers
    heads = [r for r in receivers if r != "logits"]
    clean_heads, _ = head_outputs(hf, clean)
    corrupt_heads, _ = head_outputs(hf, corrupt)
    c_heads = clean_heads
    c_logits = d_logits = None
    for _ in range(hf.config.num_hidden_layers + 1):
        frozen = {layer: value.clone() for layer, value in c_heads.items()}
        for s in senders:
            frozen[s.layer][:, :, s.head] = corrupt_heads[s.layer][:, :, s.head]
        d_store, d_hooks = {}, []
        for layer in {h.layer for h in heads}:
            for name in ("q_proj", "k_proj", "v_proj", "in_proj", "x_proj"):
                if hasattr(mixer(hf, layer), name):
                    d_hooks.append((getattr(mixer(hf, layer), name), "post", _keep(d_store, (layer, name))))
        d_heads_hooks = [(_out_proj(hf, layer), "pre", _freeze(frozen[layer])) for layer in frozen]
        d_logits = _run(hf, clean, d_hooks + d_heads_hooks)
        c_hooks = []
        for layer in {h.layer for h in heads}:
            c_hooks += _patch_hooks(hf, layer, [h.head for h in heads if h.layer == layer], streams, d_store, clean)
        c_store = {}
        c_hooks += [(_out_proj(hf, layer), "pre", _keep_heads(hf, c_store, layer)) for layer in range(hf.config.num_hidden_layers)]
        c_logits = _run(hf, clean, c_hooks)
        c_heads = c_store
    return float(metric(d_logits if to_logits else c_logits).mean())


def _keep(store, key):
    def hook(module, args, out):
        store[key] = out.clone()

    return hook


def _keep_heads(hf, store, layer):
    def pre(module, args):
        store[layer] = args[0].reshape(*args[0].shape[:2], n_heads(hf), -1).clone()

    return pre


def _freeze(value):
    def pre(module, args):
        return (value.reshape(args[0].shape), *args[1:])

    return pre


def _patch_hooks(hf, layer, heads, streams, d_store, batch):
    m = mixer(hf, layer)
    columns: dict[str, set[int]] = {}
    for name in streams:
        for head in heads:
            module, cols = stream_columns(hf, name, head)
            columns.setdefault(module, set()).update(cols)
    stash = {}

    def post_for(module_name, cols):
        def hook(module, args, out):
            stash[module_name] = out.clone()
            out = out.clone()
            out[..., cols] = d_store[(layer, module_name)][..., cols]
            return out

        return hook

    hooks = [(getattr(m, name), "post", post_for(name, sorted(cols))) for name, cols in columns.items()]
    if hf.config.model_type in ("mamba", "falcon_mamba") and "x" in streams:
        channels = [head for head in heads]

        def hold(module, args):  # x_proj reads the channel's unpatched (convolved) x
            natural = stash["in_proj"][..., : hf.config.intermediate_size].transpose(1, 2)
            x = m.act(m.conv1d(natural)[..., : natural.shape[-1]]).transpose(1, 2) * batch.attention_mask[..., None]
            held = args[0].clone()
            held[..., channels] = x[..., channels].to(held.dtype)
            return (held, *args[1:])

        hooks.append((m.x_proj, "pre", hold))
    return hooks
