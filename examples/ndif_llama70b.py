# %% [markdown]
# # Llama-3.1-70B-Instruct on NDIF (remote nnsight)
#
# Nothing is downloaded: the model's structure is built on the meta device and every
# trace (ablations, patching, pattern reads) runs on the NDIF server. Needs an NDIF API
# key (`NDIF_API_KEY`). The same code runs locally through nnsight's simulation of remote
# execution with `GNA_EXAMPLE_REMOTE=local` (CI does that on a tiny random Llama folder).

# %%
import os

import gna_interp as gna

MODEL = os.environ.get("GNA_EXAMPLE_MODEL", "meta-llama/Llama-3.1-70B-Instruct")
REMOTE = True if os.environ.get("GNA_EXAMPLE_REMOTE", "ndif") == "ndif" else "local"
MMLU = os.environ.get("GNA_EXAMPLE_MMLU")
N = int(os.environ.get("GNA_EXAMPLE_N", "200"))

model = gna.load(MODEL, backend="nnsight", remote=REMOTE)
task = gna.tasks.mmlu(subjects=None, n=N, path=MMLU, seed=0)

# %% A few heads of a late layer, ablated on the server, scored here.
layer = model.n_layers // 2
print(f"clean {gna.evaluate(model, task).accuracy:.3f}")
for head in [gna.Head(layer, h) for h in range(min(4, model.n_heads))]:
    print(f"{head} ablated {gna.evaluate(model, task, [gna.Ablate([head])]).accuracy:.3f}")

# %% Patterns come back as the final rows only.
print(gna.attention_pattern(model, task[:2], [gna.Head(layer, 0)], query_positions=[-1]).shape)
