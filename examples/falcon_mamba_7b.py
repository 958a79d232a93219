# %% [markdown]
# # Falcon-Mamba-7B (Mamba-1): every inner channel is a head
#
# The paper's Gather channels sit in layer 35 (3186, 5143, 6607, 7305), Aggregate channels
# in layer 36 (1565, 1906, 3873, 4925). With 8,192 channels per layer, discovery
# pre-screens groups of channels by ablation and verifies the most harmful groups one
# channel at a time; the result says which heads were verified and which only screened.
#
# Environment overrides (CI smoke-checks this on a tiny random FalconMamba):
# `GNA_EXAMPLE_MODEL`, `GNA_EXAMPLE_MMLU`, `GNA_EXAMPLE_N`.

# %%
import os

import gna_interp as gna

MODEL = os.environ.get("GNA_EXAMPLE_MODEL", "tiiuae/falcon-mamba-7b-instruct")
MMLU = os.environ.get("GNA_EXAMPLE_MMLU")
N = int(os.environ.get("GNA_EXAMPLE_N", "300"))

model = gna.load(MODEL)  # nnsight: the only backend for SSMs
task = gna.tasks.mmlu(n=N, path=MMLU, seed=0)
layers = [35, 36] if model.n_layers > 36 else [model.n_layers - 2, model.n_layers - 1]

# %%
circuit = gna.discover(model, task, layers=layers, screen_above=64, max_candidates=16)
print(circuit.summary())
verified = [str(e.head) for e in circuit.heads if e.verified]
print("verified channels:", verified[:20])

# %% Implicit attention of the top Aggregate channel, final row only (O(T) memory).
if circuit.aggregate:
    row = gna.attention_pattern(model, task[:4], circuit.aggregate[:1], query_positions=[-1], normalize="row")
    print(row.shape)
