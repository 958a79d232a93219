# %% [markdown]
# # Describing an architecture the table lacks (offline)
#
# `gna.load` knows the families of its architecture table. Any other causal LM, a
# `torch.nn.Module` of your own or someone else's, is described as data, without editing
# the package: an `ArchSpec` names its block list, final norm, each mixer's path,
# out-projection, head sizes and input streams, the config fields of its sizes, and
# whether its forward takes `attention_mask`. Then every analysis works on it.
#
# The model here is a small attention LM written below (`TinyLM`, `model_type="tiny_lm"`):
# blocks at `net.blocks`, attention at `blocks[i].attn` with `q_proj`, `k_proj`, `v_proj`
# and `o_proj`, a final norm at `net.norm`; `forward(input_ids, attention_mask=None)`
# returns an object with `.logits`; the attention module returns `(output, weights)`.

# %%
from __future__ import annotations

import types

import torch
from torch import nn

import gna_interp as gna
from gna_interp.models.tiny import word_tokenizer


class Attention(nn.Module):
    """Causal multi-head attention without positions; returns ``(output, weights)``."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-1, -2) / self.head_dim**0.5
        allowed = torch.ones(t, t, dtype=torch.bool, device=x.device).tril() & mask[:, None, None, :].bool()
        weights = scores.masked_fill(~allowed, -1e9).softmax(-1)
        out = (weights @ v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out), weights


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)[0]
        return x + self.mlp(self.norm2(x))


class Net(nn.Module):
    def __init__(self, config: types.SimpleNamespace) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.blocks = nn.ModuleList(Block(config.width, config.heads) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.width)


class TinyLM(nn.Module):
    """A causal LM that no table row describes."""

    def __init__(self, config: types.SimpleNamespace) -> None:
        super().__init__()
        self.config = config
        self.net = Net(config)
        self.unembed = nn.Linear(config.width, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> types.SimpleNamespace:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        x = self.net.embed(input_ids)
        for block in self.net.blocks:
            x = block(x, mask)
        return types.SimpleNamespace(logits=self.unembed(self.net.norm(x)))


def tiny_lm_config() -> types.SimpleNamespace:
    """The model's config: any object with the fields the description reads."""
    return types.SimpleNamespace(model_type="tiny_lm", vocab_size=64, width=32, heads=4, depth=3)


# %% [markdown]
# ## The description
# One mixer per block (`uniform`): attention at `attn`, out-projection `o_proj`, sizes from
# the config (`AttentionDims(heads, key/value heads, head_dim)`), input streams `q`, `k`,
# `v` (columns of each projection's output, one unit per head). The block returns a
# tensor (`block_output=0`); sizes come from `depth` and `width`.

# %%
TINY_LM = gna.ArchSpec(
    family="tiny_lm",
    model_types=("tiny_lm",),
    layer_kind=gna.LayerKind.ATTENTION,
    layers_path="net.blocks",
    final_norm_path="net.norm",
    mixers=gna.core.uniform(
        gna.MixerSpec(
            gna.LayerKind.ATTENTION,
            path="attn",
            out_proj="o_proj",
            dims=lambda c: gna.core.AttentionDims(c.heads, c.heads, c.width // c.heads),
            streams=(
                gna.Stream("q", "q_proj", lambda d: (0, d.heads, d.head_dim)),
                gna.Stream("k", "k_proj", lambda d: (0, d.kv_heads, d.head_dim)),
                gna.Stream("v", "v_proj", lambda d: (0, d.kv_heads, d.head_dim)),
            ),
        )
    ),
    tlens=False,
    n_layers_field="depth",
    d_model_field="width",
    takes_mask=True,
)


def build(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(tiny_lm_config()).eval()


# %%
if __name__ == "__main__":
    tokenizer = word_tokenizer()
    model = gna.load(build(), arch=TINY_LM, tokenizer=tokenizer)  # or: gna.register_architecture(TINY_LM); gna.load(build(), ...)
    print(model)
    clean = ["w5 w6 w7 w8", "w9 w10 w11 w12", "w13 w14 w15 w16"]
    corrupt = ["w5 w30 w7 w8", "w9 w10 w31 w12", "w40 w14 w15 w41"]
    metric = gna.logit_diff(correct=5, incorrect=6)
    sweep = gna.ablation_sweep(model, clean, None, metric, progress=False)
    print("ablation: largest effects", [(str(h), round(s, 4)) for h, s in sweep.top(3)])
    path = gna.path_patching(model, clean, corrupt, metric, senders=[gna.Head(0, 1)], receivers=[gna.Head(2, 0)], receiver_input="k")
    print(f"path patching L0H1 -> L2H0 (k): {path:+.4f}")
    pattern = gna.attention_pattern(model, clean, [gna.Head(1, 2)], query_positions=[-1])
    print("attention of L1H2 at the last position:", [round(v, 3) for v in pattern[0, 0, 0].tolist()])
