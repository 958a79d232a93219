"""How much of each toy's task its G&A circuit alone carries (docs/report.md, "Faithfulness").

For each bundled toy: discover the circuit, rank every head by a mean-ablation sweep, and
print the faithfulness curve (top-n heads kept, every other head ablated) with mean and
resample ablation, and the circuit's own point. About 10 minutes on one CPU thread.

    python examples/faithfulness_toys.py            # the docs' numbers (200 prompts, seed 2026)
    GNA_EXAMPLE_N=48 python examples/faithfulness_toys.py
"""

from __future__ import annotations

import os
import warnings

import gna_interp as gna
from gna_interp.viz.faithfulness import faithfulness_figure

N = int(os.environ.get("GNA_EXAMPLE_N", "200"))
gna.set_progress(False)

for name in ("llama", "mamba2", "falcon_h1"):
    model, task = gna.load_toy(name), gna.toy_task(name, N, seed=2026)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # discover's warnings (e.g. answers by position) are in docs/discovery.md
        circuit = gna.discover(model, task, progress=False)
    heads = [*circuit.gather, *circuit.aggregate]
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    metric = gna.candidate_logit_diff(encoded.candidate_ids, encoded.correct)
    sweep = gna.ablation_sweep(model, task, task, metric, how="mean", progress=False)
    for how in ("mean", "resample"):
        curve = gna.faithfulness_curve(model, task, sweep, how=how, circuit=heads, progress=False)
        point = curve.circuit_point
        assert point is not None
        print(f"{name}, {how} ablation: circuit {', '.join(map(str, heads))}")
        print(
            f"clean {curve.clean['accuracy']:.3f}, all ablated {curve.ablated['accuracy']:.3f}, "
            f"circuit alone {point['accuracy']:.3f} ({curve.of_clean(point['accuracy']):.0%} of clean)"
        )
        print(curve.to_frame()[["size", "accuracy", "of_clean", "added"]].to_string(index=False))
        print()
        if how == "mean":
            faithfulness_figure(curve, title=f"toy {name}: {how} ablation, {N} prompts").savefig(f"faithfulness_{name}.png")
