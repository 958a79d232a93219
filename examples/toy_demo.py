# %% [markdown]
# # G&A discovery on the bundled toy models (offline, CPU, about a minute)
#
# The same pipeline the paper's authors ran by hand: truncation scan, layer scan, head
# ablation, then where each head acts (final position, segments, segment ends), role
# labels checked against (softmax or implicit) attention patterns, a joint search for
# backup heads, and confirmation, on a Transformer, an SSM and a hybrid. `gna-interp demo`
# runs this and writes the report.

# %%
import os

import gna_interp as gna

N = int(os.environ.get("GNA_EXAMPLE_N", "200"))  # prompts per model (the test suite runs fewer)

circuits = []
for name in gna.toy_names():
    if name not in ("llama", "mamba2", "falcon_h1"):
        continue
    model, task = gna.load_toy(name), gna.toy_task(name, n=N, seed=2026)
    circuit = gna.discover(model, task, progress=False)  # warns for toys that answer by place
    circuits.append((circuit, model, task))
    print(circuit.summary(), "\n")

# %% The evidence, per examined head, as a DataFrame.
columns = ["head", "kind", "role", "ablated_accuracy", "final_ablated_accuracy", "segments_ablated_accuracy", "ends_ablated_accuracy"]
print(circuits[0][0].to_frame()[[*columns, "pattern_agrees"]].round(3))

# %% The G&A picture the report draws, averaged over the task's prompts: per Aggregate head,
# the final row's mass on the correct option's segment end against another option's; per
# Gather head, each segment end's mass on its own segment against an earlier one.
circuit, model, task = circuits[0]
print(gna.discovery.role_picture(circuit, model, task).to_frame().round(3).to_string())

# %% An offline report: those figures beside one prompt in circuitsvis, heads-needed curves,
# scans and tables, in one self-contained page.
print(gna.write_report(circuits, "gna-report"))
