# %% [markdown]
# # Reproducing the paper on Llama-3.1-8B-Instruct (truncated to its first 18 layers)
#
# Expected: Gather head L16H22, Aggregate head L17H24; ablating either takes MMLU from
# about 66% to chance. Needs the weights (about 16 GB) and MMLU (`pip install
# 'gna-interp[data]'`, or local files in `cais/mmlu`'s schema).
#
# Environment overrides (CI smoke-checks this script on a tiny random Llama):
# `GNA_EXAMPLE_MODEL` (folder or hub id), `GNA_EXAMPLE_MMLU` (local MMLU files), `GNA_EXAMPLE_N`.

# %%
import os

import gna_interp as gna

MODEL = os.environ.get("GNA_EXAMPLE_MODEL", "meta-llama/Llama-3.1-8B-Instruct")
MMLU = os.environ.get("GNA_EXAMPLE_MMLU")  # None: the hub
N = int(os.environ.get("GNA_EXAMPLE_N", "500"))

model = gna.load(MODEL, dtype="bfloat16" if MODEL.startswith("meta-llama/") else None)
task = gna.tasks.mmlu(n=N, path=MMLU, seed=0)
keep = min(18, model.n_layers)
late = [layer for layer in (16, 17) if layer < keep] or list(range(keep))

# %% Everything inside the block runs on layers 0..17 plus the final norm and unembedding.
with model.intervening(gna.Truncate(keep)):
    circuit = gna.discover(model, task, layers=late, stages=("layers", "heads", "roles", "confirm"))
print(circuit.summary())

# %% Check the paper's heads directly.
paper = [gna.Head(16, 22), gna.Head(17, 24)] if model.n_layers >= 18 and model.n_heads >= 25 else circuit.gather[:1] + circuit.aggregate[:1]
with model.intervening(gna.Truncate(keep)):
    for head in paper:
        print(f"{head} ablated {gna.evaluate(model, task, [gna.Ablate([head])]).accuracy:.3f}")
