# %% [markdown]
# # Does the conv gather? (offline, query-first toy Mamba-2)
#
# Implicit attention, as in the paper, is the SSM's linear map from its inputs `x_s`
# (after the mixer's causal conv and SiLU) to its outputs: `y_t = sum_s M[t, s] x_s + D x_t`.
# Each `x_s` already mixes the last `K` tokens (K = 4 here), so a head whose implicit
# attention reads only its own token can still gather a short segment, through the conv.
#
# Writing SiLU(p) = sigmoid(p) * p, with the sigmoid taken as a data-dependent gate (as `M`
# takes `B`, `C`, `dt` as given), the map from the conv's inputs `u_r` to `y_t` is linear
# too, per channel `c`:
#
#     y_t,c = sum_r Ã_c[t, r] u_r,c + (conv bias through the gates),
#     Ã_c[t, r] = sum_{s = r .. r+K-1} (M[t, s] + D [s = t]) sigmoid(p_s,c) w_c[K-1-(s-r)].
#
# This script checks that identity against HF's own SSM output on the bundled query-first
# toy Mamba-2 (`mamba2_query_first`, whose critical Gather head L0H0 reads outside its own
# segment; see docs/records/discovery.md), then gives the gather ratio of each layer-0 head's segment-end rows (1 = a uniform row):
# from implicit attention (the paper's pattern), from each key's contribution without the
# conv, with the conv folded in, and with the skip term D x_t folded in as well.

# %%
import torch
import torch.nn.functional as F

import gna_interp as gna

model = gna.load_toy("mamba2_query_first")
task = gna.toy_task("mamba2_query_first", 64, seed=4242)
encoded = task.encode()
mixer = model.hf_model.backbone.layers[0].mixer
inner, n_heads, width, kernel = mixer.intermediate_size, mixer.num_heads, mixer.head_dim, mixer.conv_kernel_size

seen = {}
hooks = [
    mixer.in_proj.register_forward_hook(lambda module, args, out: seen.update(projected=out.detach())),
    mixer.norm.register_forward_pre_hook(lambda module, args: seen.update(scan=args[0].detach())),  # y = M x + D x, per channel
]
try:
    with torch.no_grad():
        model.hf_model(input_ids=encoded.batch.input_ids, attention_mask=encoded.batch.attention_mask)
finally:
    for hook in hooks:
        hook.remove()
assert "scan" in seen, "mixer.norm never ran: this needs HF's eager Mamba-2 path (eval mode, no fused kernel)"
n_pos = encoded.batch.n_pos
assert bool(encoded.batch.attention_mask.all()), "toy prompts share one length: no padding to mask"
u = seen["projected"][..., inner : inner + mixer.conv_dim].double()  # [batch, pos, conv_dim]: the conv's inputs
weight, bias = mixer.conv1d.weight[:, 0].detach().double(), mixer.conv1d.bias.detach().double()  # [conv_dim, K], [conv_dim]
pre = F.conv1d(u.transpose(1, 2), weight[:, None], bias, padding=kernel - 1, groups=mixer.conv_dim)[..., :n_pos].transpose(1, 2)
gate = torch.sigmoid(pre)[..., :inner]  # [batch, pos, inner]: SiLU(p) = gate * p

# %% Segment-end rows of every layer-0 head: implicit attention alone, and with the conv folded in.
M = gna.attention_pattern(model, task, [gna.Head(0, h) for h in range(n_heads)]).double()  # [batch, head, pos, pos]
ends = encoded.segment_ends  # [batch, segment]
cols = torch.arange(n_pos)
own = (cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2] - 1)  # [batch, segment, key]: the option, end excluded
prompt = torch.arange(len(task))[:, None]


def gather_ratio(rows: torch.Tensor) -> float:
    """Mean over prompts and segments of the rows' share on their own segment over a uniform row's."""
    share = (rows / rows.sum(-1, keepdim=True) * own).sum(-1)
    return float((share / (own.sum(-1) / (ends + 1))).mean())


def fold(rows: torch.Tensor, channels: slice) -> torch.Tensor:
    """``[batch, segment, key r, channel]``: Ã_c[t, r] for the rows ``[batch, segment, key s]`` of a map on ``x``."""
    folded = torch.zeros(*rows.shape, width, dtype=torch.double)
    for k in range(kernel):  # s = r + k
        folded[:, :, : n_pos - k] += rows[..., k:, None] * gate[:, None, k:, channels] * weight[channels, kernel - 1 - k]
    return folded


print("gather ratio of the segment-end rows (1 = uniform); D = the skip term D x_t")
print("head  implicit attention |M|  contributions M x  M folded  M + D folded")
for head in range(n_heads):
    channels = slice(head * width, (head + 1) * width)
    implicit = M[:, head][prompt, ends]  # [batch, segment, key]
    skip = torch.diag_embed(mixer.D[head].detach().double().expand(len(task), n_pos))[prompt, ends]  # D at s = t
    # the identity: M + D folded, applied to u (plus the bias through the gates), is HF's own SSM output at these rows
    with_skip = fold(implicit + skip, channels)
    rebuilt = (with_skip * u[:, None, :, channels]).sum(2)
    rebuilt += torch.einsum("bqs,bsc->bqc", implicit + skip, gate[..., channels] * bias[channels])
    scan = seen["scan"][prompt, ends][..., channels].double()
    assert torch.allclose(rebuilt, scan, atol=1e-4 * float(scan.abs().max())), float((rebuilt - scan).abs().max())
    x = gate[..., channels] * pre[..., channels]  # the SSM's inputs: SiLU(p)
    ratios = [
        gather_ratio(implicit.abs()),  # the paper's pattern (what `discover` scores)
        gather_ratio((implicit[..., None] * x[:, None]).norm(dim=-1)),  # each key's contribution, no conv, no D
        gather_ratio((fold(implicit, channels) * u[:, None, :, channels]).norm(dim=-1)),  # conv folded, no D
        gather_ratio((with_skip * u[:, None, :, channels]).norm(dim=-1)),  # conv folded, with D
    ]
    print(f"L0H{head}  " + "  ".join(f"{r:>6.2f}" for r in ratios))
