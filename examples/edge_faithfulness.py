"""Edges into the Llama toy's Aggregate head: rank them, then keep the top n and patch every
other edge's corrupted sender into its receiver's stream (docs/attribution.md, "Edge attribution"
and "Faithfulness curves over edges"). Runs on the bundled toy in about a minute on a CPU.

    python examples/edge_faithfulness.py
"""

from __future__ import annotations

import gna_interp as gna

model, task = gna.load_toy("llama"), gna.toy_task("llama", 48, seed=0)
corrupt = task.corrupted(seed=0)
encoded = task.encode()
metric = gna.candidate_logit_diff(encoded.candidate_ids, encoded.correct)  # scalar, read at the final position
aggregate = gna.Head(1, 0)

# Every layer-0 head -> the Aggregate head's q, k and v, scored at once (Spearman 0.93
# against path patching on this toy; docs/attribution.md).
edges = gna.edge_attribution(model, task, corrupt, metric, receivers=[aggregate], receiver_input=["q", "k", "v"], method="exact_receiver")
print(edges.to_frame().sort_values("effect", key=abs, ascending=False).head(6).to_string(index=False))

# How much of the task the top-n edges carry alone.
curve = gna.faithfulness_curve(model, task, edges, corrupt=corrupt)
print(curve.to_frame()[["size", "accuracy", "of_clean", "added"]].to_string(index=False))
