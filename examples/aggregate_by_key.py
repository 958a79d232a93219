# %% [markdown]
# # What does each option's text make an Aggregate head write? (offline, toy models)
#
# On the unpruned toys, `llama_4heads` and `mamba2_8heads`, whose layer 1 shares the
# aggregation among several heads (the bundled `llama` and `mamba2` keep one of them).
#
# A last-layer head's output at the final position `t` is a sum over keys `s`:
# `sum_s A[t, s] v_s` for softmax attention, `sum_s (M[t, s] + D [s = t]) x_s` for a Mamba-2
# head (then its gate and group norm, linear at `t` once the norm's scale at `t` is read).
# Through the head's out-projection columns, the final norm (its scale at `t` read from the
# run: a direct logit attribution) and the unembedding, each key writes a vector of label
# logits. Summed over the tokens of option `i`'s line (its text, label and line end), that
# says what reading option `i` does to each label. Centred over the labels:
#
# - `own,correct`: what the correct option's line writes into the correct label;
# - `own,wrong`: what a wrong option's line writes into its own label (mean over them);
# - `lines->correct`: what all option lines together write into the correct label;
# - `rest->correct`: what every other key (query line, `Answer:`, the skip term) writes there.
#
# A copying head has both `own` columns positive (it raises the label it reads); a
# suppressing head both negative; a head that writes the sign of a match, positive then
# negative. Checked: the terms sum to the head's real output (to within 1e-4 of its largest
# value), and the final norm and unembedding of the real final residual give the real logits.
#
# The last part measures how much of each `llama_4heads` layer-1 head's effect goes through the
# MLP that follows it in the same block, which a direct write cannot see.

# %%
import torch
import torch.nn.functional as F

import gna_interp as gna


def read_run(hf, encoded, modules: dict) -> dict:
    """Inputs (pre-hooks) and outputs (hooks) of ``modules``, and the logits (``"logits"``),
    on one forward of the task."""
    seen: dict = {}
    hooks = []
    for name, (module, kind) in modules.items():
        if kind == "input":
            hooks.append(module.register_forward_pre_hook(lambda m, args, name=name: seen.update({name: args})))
        else:
            hooks.append(module.register_forward_hook(lambda m, args, out, name=name: seen.update({name: out})))
    try:
        with torch.no_grad():
            seen["logits"] = hf(input_ids=encoded.batch.input_ids, attention_mask=encoded.batch.attention_mask).logits
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def by_key_report(name: str, model, task, head_writes) -> None:
    """``head_writes(head) -> [batch, key, d_model]``: each key's direct write at the final position."""
    hf = model.hf_model
    encoded = task.encode()
    n_pos, rows = encoded.batch.n_pos, torch.arange(len(task))
    norm = hf.get_submodule(model.arch.final_norm_path)
    seen = read_run(hf, encoded, {"final": (norm, "input")})
    final_resid = seen["final"][0][rows, -1].double()  # [batch, d_model]
    scale = torch.rsqrt(final_resid.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)  # the final RMS norm at t
    unembed = hf.get_output_embeddings().weight.detach().double()[encoded.candidate_ids]  # [batch, option, d_model]
    weight = norm.weight.detach().double()
    real = seen["logits"][rows, -1].double().gather(1, encoded.candidate_ids)  # [batch, option]
    rebuilt = torch.einsum("bd,bod->bo", final_resid * scale * weight, unembed)
    assert torch.allclose(rebuilt, real, atol=1e-4 * float(real.abs().max())), "final norm and unembedding do not give the logits"
    cols = torch.arange(n_pos)
    # each option's line: its span, then the "\n" that ends the line (inside the span when the label comes first)
    stop = encoded.spans[..., 1:2] + (encoded.segment_ends == encoded.labels)[..., None].long()
    lines = (cols >= encoded.spans[..., :1]) & (cols < stop)  # [batch, option, key]
    print(f"\n{name}: per head, label logits written by each option's line (centred over labels)")
    print("head   own,correct  own,wrong  lines->correct  rest->correct")
    for head in [gna.Head(model.n_layers - 1, h) for h in range(model.heads_per_layer[-1])]:
        writes = head_writes(head)  # [batch, key, d_model]
        logits = torch.einsum("bkd,bod->bko", writes * weight * scale[:, None], unembed)
        logits = logits - logits.mean(-1, keepdim=True)  # [batch, key, label]
        per_option = torch.einsum("bik,bko->bio", lines.double(), logits)  # [batch, option line, label]
        own = per_option.diagonal(dim1=1, dim2=2)  # [batch, option]: line i into label i
        correct = encoded.correct
        is_correct = F.one_hot(correct, own.shape[1]).bool()
        own_correct = float(own[is_correct].mean())
        own_wrong = float(own[~is_correct].mean())
        from_lines = float(per_option.sum(1)[rows, correct].mean())
        from_rest = float(logits.sum(1)[rows, correct].mean()) - from_lines
        print(f"{head}   {own_correct:+10.2f}  {own_wrong:+9.2f}  {from_lines:+14.2f}  {from_rest:+13.2f}")


runs: dict = {}  # one forward per model and layer, shared by its heads

# %% The toy Llama: A[t, s] v_s through o_proj, checked against the head's real o_proj input.
llama = gna.load_toy("llama_4heads", backend="nnsight")  # nnsight leaves the HF modules as they are, for raw hooks
llama_task = gna.toy_task("llama_4heads", 200, seed=4242)
llama_encoded = llama_task.encode()


def llama_writes(head: gna.Head):
    hf, encoded = llama.hf_model, llama_encoded
    v_proj, o_proj = hf.model.layers[head.layer].self_attn.v_proj, hf.model.layers[head.layer].self_attn.o_proj
    if ("llama", head.layer) not in runs:
        runs["llama", head.layer] = read_run(hf, encoded, {"v": (v_proj, "output"), "o": (o_proj, "input")})
    seen = runs["llama", head.layer]
    width = llama.head_dim_of(head)
    group = hf.config.num_attention_heads // hf.config.num_key_value_heads  # 1 in this toy: GQA is not exercised here
    values = seen["v"].double().view(*seen["v"].shape[:2], -1, width)[:, :, head.head // group]  # [batch, key, d_head]
    pattern = gna.attention_pattern(llama, llama_task, [head], query_positions=[-1])[:, 0, 0].double()  # [batch, key]
    per_key = pattern[..., None] * values  # [batch, key, d_head]
    real = seen["o"][0][:, -1, head.head * width : (head.head + 1) * width].double()
    assert torch.allclose(per_key.sum(1), real, atol=1e-4 * float(real.abs().max())), "the keys do not sum to the head's output"
    columns = o_proj.weight.detach().double()[:, head.head * width : (head.head + 1) * width]  # [d_model, d_head]
    return per_key @ columns.T


by_key_report("toy-llama_4heads", llama, llama_task, llama_writes)

# %% The toy Mamba-2: (M[t, s] + D [s = t]) x_s, then the gate and group norm at t, checked against its out_proj input.
mamba2 = gna.load_toy("mamba2_8heads")
mamba2_task = gna.toy_task("mamba2_8heads", 200, seed=4242)
mamba2_encoded = mamba2_task.encode()


def mamba2_writes(head: gna.Head):
    hf, encoded = mamba2.hf_model, mamba2_encoded
    mixer = hf.backbone.layers[head.layer].mixer
    reads = {"proj": (mixer.in_proj, "output"), "norm": (mixer.norm, "input"), "out": (mixer.out_proj, "input")}
    if ("mamba2", head.layer) not in runs:
        runs["mamba2", head.layer] = read_run(hf, encoded, reads)
    seen = runs["mamba2", head.layer]
    inner, width, kernel, n_pos = mixer.intermediate_size, mixer.head_dim, mixer.conv_kernel_size, encoded.batch.n_pos
    assert bool(encoded.batch.attention_mask.all()), "toy prompts share one length: no padding to mask"
    xbc = seen["proj"][..., inner : inner + mixer.conv_dim].double()
    conv = F.conv1d(
        xbc.transpose(1, 2),
        mixer.conv1d.weight.detach().double(),
        mixer.conv1d.bias.detach().double(),
        padding=kernel - 1,
        groups=mixer.conv_dim,
    )[..., :n_pos].transpose(1, 2)
    channels = slice(head.head * width, (head.head + 1) * width)
    x = F.silu(conv)[..., channels]  # [batch, key, d_head]: the SSM's inputs
    row = gna.attention_pattern(mamba2, mamba2_task, [head], query_positions=[-1])[:, 0, 0].double()  # [batch, key]
    row[:, -1] += float(mixer.D.detach()[head.head])  # the skip term, at s = t
    y, gate = (a.double() for a in seen["norm"][:2])  # [batch, pos, inner] each
    gated = y * F.silu(gate)
    groups = gated[:, -1].view(len(mamba2_task), -1, mixer.norm.group_size)  # one group in this toy (n_groups 1)
    scale = torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + mixer.norm.variance_epsilon).expand_as(groups).reshape(len(mamba2_task), -1)
    factor = (F.silu(gate[:, -1]) * scale * mixer.norm.weight.detach().double())[:, channels]  # [batch, d_head]: linear at t
    per_key = row[..., None] * x * factor[:, None]  # [batch, key, d_head]
    real = seen["out"][0][:, -1, channels].double()
    assert torch.allclose(per_key.sum(1), real, atol=1e-4 * float(real.abs().max())), "the keys do not sum to the head's output"
    columns = mixer.out_proj.weight.detach().double()[:, channels]  # [d_model, d_head]
    return per_key @ columns.T


by_key_report("toy-mamba2_8heads", mamba2, mamba2_task, mamba2_writes)

# %% Through the MLP? The toy Llama's layer-1 heads zero-ablated at the final position, with layer 1's MLP
# output there left free (total effect) or held at its clean value (the head's direct effect only).


# (The zeroing is `gna.Ablate([head], positions=final)` written as a raw hook, so that it runs next to the MLP hold.)


def centred_correct_logit(seen: dict) -> float:
    """Mean over prompts of the correct label's logit minus the mean of the labels' logits."""
    logits = seen["logits"][:, -1].double().gather(1, llama_encoded.candidate_ids)  # [batch, option]
    logits = logits - logits.mean(1, keepdim=True)
    return float(logits[torch.arange(len(llama_task)), llama_encoded.correct].mean())


last_block = llama.hf_model.model.layers[-1]
clean_run = read_run(llama.hf_model, llama_encoded, {"mlp": (last_block.mlp, "output")})
clean, clean_mlp = centred_correct_logit(clean_run), clean_run["mlp"][:, -1]  # [batch, d_model]: the MLP's output at t


def llama_ablated(head: gna.Head, hold_mlp: bool) -> float:
    """The centred correct-label logit with ``head`` zeroed at the final position (and the MLP there held)."""
    width = llama.head_dim_of(head)

    def zero_head(module, args):
        x = args[0].clone()
        x[:, -1, head.head * width : (head.head + 1) * width] = 0
        return (x, *args[1:])

    def hold(module, args, out):
        out = out.clone()
        out[:, -1] = clean_mlp
        return out

    hooks = [last_block.self_attn.o_proj.register_forward_pre_hook(zero_head)]
    if hold_mlp:
        hooks.append(last_block.mlp.register_forward_hook(hold))
    try:
        return centred_correct_logit(read_run(llama.hf_model, llama_encoded, {}))
    finally:
        for hook in hooks:
            hook.remove()


print(
    f"\ntoy-llama_4heads: correct label's logit (centred over labels), clean {clean:+.2f}; "
    "change when a head is ablated at the final position"
)
print("head   total  direct only (MLP held)")
for index in range(llama.heads_per_layer[-1]):
    head = gna.Head(llama.n_layers - 1, index)
    total, direct = llama_ablated(head, False) - clean, llama_ablated(head, True) - clean
    print(f"{head}  {total:+6.2f}  {direct:+6.2f}")
