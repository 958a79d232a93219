# %% [markdown]
# # G&A discovery on the bundled toy models (offline, CPU, about a minute)
#
# The same pipeline the paper's authors ran by hand: truncation scan, layer scan, head
# ablation, role labels from (softmax or implicit) attention patterns, confirmation.
# `gna-interp demo` runs this and writes the report.

# %%
import gna_interp as gna

task = gna.tasks.toy_mcq(n=200, seed=2026)
circuits = []
for name in gna.toy_names():
    if name not in ("llama", "mamba2"):
        continue
    model = gna.load_toy(name)
    circuit = gna.discover(model, task, progress=False)
    circuits.append((circuit, model, task))
    print(circuit.summary(), "\n")

# %% The evidence, per examined head, as a DataFrame.
print(circuits[0][0].to_frame()[["head", "role", "ablated_accuracy", "gather", "uniform_ratio", "aggregate_entropy"]])

# %% An offline report with scans, tables and circuitsvis patterns.
print(gna.write_report(circuits, "gna-report"))
