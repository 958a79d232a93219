# %% [markdown]
# # Zamba2-7B (hybrid): do the attention layers do the Aggregate job?
#
# The paper masked the final query row of every attention call of Zamba2-7B (its shared
# attention block, applied at several depths between Mamba-2 layers): MMLU fell from
# 64.3% to 34.9%. Here: the same experiment, its opposite (keep only the final row), and
# discovery over attention and SSM heads together, which says which kind of head ends up
# in each role.
#
# Environment overrides (CI smoke-checks this on a tiny random Zamba2):
# `GNA_EXAMPLE_MODEL`, `GNA_EXAMPLE_MMLU`, `GNA_EXAMPLE_N`.

# %%
import os

import gna_interp as gna

MODEL = os.environ.get("GNA_EXAMPLE_MODEL", "Zyphra/Zamba2-7B-instruct")
MMLU = os.environ.get("GNA_EXAMPLE_MMLU")
N = int(os.environ.get("GNA_EXAMPLE_N", "500"))

model = gna.load(MODEL)  # nnsight: the only backend for hybrids
task = gna.tasks.mmlu(n=N, path=MMLU, seed=0)
print(model)
print("layer kinds:", [kind.value for kind in model.layer_kinds])

# %% The paper's experiment: zero the final query row of every attention call.
clean = gna.evaluate(model, task)
masked = gna.evaluate(model, task, [gna.MaskAttentionRows(-1)])
kept = gna.evaluate(model, task, [gna.MaskAttentionRows(-1, keep=True)])
print(f"clean {clean.accuracy:.3f}  final row masked {masked.accuracy:.3f}  only the final row kept {kept.accuracy:.3f}")

# %% Discovery over attention and SSM heads in one list; each found head's kind.
circuit = gna.discover(model, task, stages=("heads", "entry", "roles", "confirm"), max_candidates=16)
print(circuit.summary())
for role, heads in (("gather", circuit.gather), ("aggregate", circuit.aggregate)):
    print(role, [(str(h), model.head_kind(h).value) for h in heads])
