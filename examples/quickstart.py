# %% [markdown]
# # gna_interp quickstart (offline)
#
# Head ablation, activation patching and sweeps with one API on a Transformer
# (TransformerLens bridge and nnsight) and an SSM (Mamba-2 on nnsight). The models are
# tiny random ones built from configs, so this runs anywhere, offline, in seconds.
# Swap `tiny_model(...)` for `gna.load("meta-llama/Llama-3.1-8B-Instruct")` on a real model.

# %%
import gna_interp as gna
from gna_interp.models.tiny import tiny_model, word_tokenizer

tokenizer = word_tokenizer()
llama = gna.load(tiny_model("llama", seed=0), tokenizer=tokenizer)  # tlens by default
mamba2 = gna.load(tiny_model("mamba2", seed=0), tokenizer=tokenizer)  # nnsight
print(llama)
print(mamba2)

# %% Ablate one head: zero, mean or resample; as an argument or as a context.
clean = ["w5 w6 w7 w8", "w9 w10 w11 w12", "w13 w14 w15 w16"]
corrupt = ["w5 w30 w7 w8", "w9 w10 w31 w12", "w40 w14 w15 w41"]
head = gna.Head(1, 2)
logits = llama.logits(clean, interventions=[gna.Ablate([head], how="zero")])
with llama.ablated([head], how="mean", corrupt=corrupt):
    mean_ablated = llama.logits(clean)
print("logits", tuple(logits.shape), "change from mean-ablating", head, f"{(mean_ablated - llama.logits(clean)).abs().max():.4f}")

# %% Sweeps: every head ablated alone (batched), and activation patching.
metric = gna.logit_diff(correct=5, incorrect=6)
for model in (llama, mamba2):
    sweep = gna.ablation_sweep(model, clean, None, metric, progress=False)
    print(f"{model.arch.family}: baseline {sweep.baseline:+.4f}; largest effects:", [(str(h), round(s, 4)) for h, s in sweep.top(3)])
    patch = gna.patching_sweep(model, clean, corrupt, metric, sites="resid", by_position=True, progress=False)
    print(patch.to_frame().head().round(4))

# %% Truncation to the first k layers (the paper's scan) and layer ablation.
print("truncated to 1 layer:", tuple(llama.logits(clean, [gna.Truncate(1)]).shape))
print("layer 0 skipped:", tuple(mamba2.logits(clean, [gna.SkipLayers([0])]).shape))
