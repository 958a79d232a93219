# %% [markdown]
# # Discovery at depth: what it costs, locally and on NDIF
#
# A deep model that computes exactly the bundled toy Mamba-2 (its two layers in the
# middle, every other layer writing zero: `gna_interp.zoo.deep.deep_toy`), so the answer
# is known: the toy's heads, shifted. `gna.cost_meter` counts forwards, rows, block
# evaluations (passes) and remote requests; `discover` records its own cost. The same
# model loaded with `remote="local"` runs every request through nnsight's simulation of
# NDIF: discovery takes a handful of session requests. Offline; `python
# benchmarks/discover_scale.py` runs the 2-, 8- and 32-layer versions.

# %%
import copy
import os
import warnings

import gna_interp as gna
from gna_interp.zoo.deep import deep_toy

LAYERS = int(os.environ.get("GNA_EXAMPLE_LAYERS", "8"))
N = int(os.environ.get("GNA_EXAMPLE_N", "200"))

model = deep_toy("mamba2_counting", LAYERS)
task = gna.toy_task("mamba2_counting", N, seed=4242)
warnings.simplefilter("ignore", gna.discovery.PositionalAnswerWarning)  # this toy answers by place (the circuit notes it)

# %% What one sweep costs: every head, with prefix reuse (a head of layer l costs L - l blocks).
encoded = task.encode()
with gna.cost_meter(model) as cost:
    gna.ablation_sweep(model, task, None, gna.candidate_accuracy(encoded.candidate_ids, encoded.correct), progress=False)
print(f"ablation sweep of {len(model.heads)} heads: {cost.describe(len(task))}")

# %% Discovery records its cost in the circuit (summary, JSON, report).
circuit = gna.discover(model, task, progress=False)
print(circuit.summary())

# %% The same on a "remote" model: each stage is one nnsight session request.
# The cover step (spread sets, each collapse covered) orders heads by a local backward, which a
# remote model has not: compare the search itself, every stage but "cover".
searched = tuple(stage for stage in gna.discovery.STAGES if stage != "cover")
circuit = gna.discover(model, task, progress=False, stages=searched)
remote = gna.load(copy.deepcopy(model.hf_model), tokenizer=model.tokenizer, remote="local")
remote_circuit = gna.discover(remote, task, progress=False, stages=searched)
print(f"remote='local': {remote_circuit.cost['requests']} requests, heads {remote_circuit.gather} | {remote_circuit.aggregate}")
assert remote_circuit.gather == circuit.gather and remote_circuit.aggregate == circuit.aggregate
