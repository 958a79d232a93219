# %% [markdown]
# # The paper's comparison through lm-eval, on the toy zoo (offline)
#
# The paper reports accuracy clean, with the Gather heads ablated, with the Aggregate heads
# ablated, and with both, measured by EleutherAI's lm-evaluation-harness. `gna.lm_eval_table`
# runs any lm-eval tasks that way, clean and under each intervention set, as one table.
# Here the tasks are each toy's own prompts, exported as local lm-eval tasks
# (`gna.harness.write_task`: a JSONL file and a task YAML reading it, no hub), and the heads
# are the ones `gna.discover` finds (docs/records/discovery.md, docs/records/hybrids.md).
#
# On a real model the same call takes lm-eval's task names:
# `gna.lm_eval_table(model, ["mmlu", "arc_easy", "arc_challenge", "hellaswag", "piqa",
# "winogrande", "openbookqa"], {"-Gather": [...], ...})`.
# Needs the `[eval]` extra: `pip install "gna-interp[eval]"`.

# %%
import os
import tempfile

import gna_interp as gna

N = int(os.environ.get("GNA_EXAMPLE_N", "200"))  # prompts per toy (the docs' tables: 200, seed 2026)
SEED = 2026
H = gna.Head.parse
CONDITIONS = {
    "llama": {"Gather": ["L0H0", "L0H1", "L0H3", "L0H2"], "Aggregate": ["L1H0"]},
    "mamba2_counting": {"Gather": ["L0H3", "L0H1", "L0H2", "L0H5", "L0H6", "L0H4"], "Aggregate": ["L1H6"]},
    "falcon_h1_counting": {  # attention heads 0-3, then Mamba-2 heads 4-11, in each layer
        "Gather": ["L0H1", "L0H2", "L0H0", "L0H9", "L0H4", "L0H6", "L0H5", "L0H11", "L0H7"],
        "Aggregate": ["L1H2", "L1H0", "L1H1", "L1H5", "L1H7", "L1H9"],
    },
}
folder = tempfile.mkdtemp(prefix="gna_lm_eval_tasks_")

# %% One table per toy: clean, -Gather, -Aggregate, -both (and, for the hybrid, the paper's
# Zamba2 experiment: the final query row of every attention call masked).
for name, roles in CONDITIONS.items():
    model, task = gna.load_toy(name), gna.toy_task(name, N, seed=SEED)
    gna.harness.write_task(task, folder, f"toy_{name}")
    gather, aggregate = [H(h) for h in roles["Gather"]], [H(h) for h in roles["Aggregate"]]
    conditions = {"-Gather": [gna.Ablate(gather)], "-Aggregate": [gna.Ablate(aggregate)], "-both": [gna.Ablate(gather + aggregate)]}
    if name == "falcon_h1_counting":
        conditions["mask final attention row"] = [gna.MaskAttentionRows(-1)]
    result = gna.lm_eval_table(model, f"toy_{name}", conditions, include_path=folder)
    print(f"toy-{name} ({model.backend_name}), {N} prompts, lm-eval accuracy:")
    print(result.table.round(3).to_string())
    # The same prompts scored by gna.evaluate, condition by condition.
    ours = [gna.evaluate(model, task, items).accuracy for items in [[], *conditions.values()]]
    same = all(abs(a - b) < 1e-6 for a, b in zip(result.table.loc[f"toy_{name}"], ours, strict=True))
    print(f"same as gna.evaluate: {same}\n")

# %% The tidy frame behind the tables: task, metric, filter, value, stderr, n, intervention.
print(result.frame.to_string(index=False))
