"""Keep a toy's top heads, distil the rest into a Discrete Mamba-2 mixer (docs/layer_swap.md,
"Hybrid students"): a miniature of Bick, Xing, Gu (2026) on the bundled Llama toy
`llama_4x8` (4 layers x 8 heads, a task that can only be read through the labels).

Heads are ranked by a mean-ablation sweep (the drop of the correct option's logit
difference); students keep the top-2 heads (with either initialisation), the bottom-2, or
none, with `combine="sum"` (the kept heads reach the residual as in the teacher), and are
distilled (stage A, then stage B's KL at the answer token, `positions="last"`) on fresh
prompts of the toy's task. About 8 minutes per student on one CPU thread with the defaults;
`benchmarks/hybrid_students.py` is the measured version (docs/layer_swap.md has its table).

    python examples/hybrid_student.py
    GNA_DISTILL_STEPS=20 GNA_EXAMPLE_N=48 python examples/hybrid_student.py   # a quick look
"""

from __future__ import annotations

import os
import time

import torch

import gna_interp as gna

torch.set_num_threads(1)
gna.set_progress(False)
N = int(os.environ.get("GNA_EXAMPLE_N", "400"))
STEPS = int(os.environ.get("GNA_DISTILL_STEPS", "300"))
TOY = "llama_4x8"

teacher, task = gna.load_toy(TOY), gna.toy_task(TOY, N, seed=2026)
train = gna.toy_task(TOY, 4000, seed=1).prompts  # other prompts than the evaluation's
encoded = task.encode(task.tokenizer_for(teacher.tokenizer))
metric = gna.candidate_logit_diff(encoded.candidate_ids, encoded.correct)
sweep = gna.ablation_sweep(teacher, task, task, metric, how="mean", progress=False)
drops = sweep.baseline - sweep.scores  # [layer, head]: how much ablating the head costs
order = [gna.Head(int(i) // drops.shape[1], int(i) % drops.shape[1]) for i in torch.argsort(drops.flatten(), descending=True)]
print("ranking (drop of the logit difference):", ", ".join(f"{h} {float(drops[h.layer, h.head]):+.2f}" for h in order))

clean = gna.evaluate(teacher, task, progress=False).accuracy
print(f"teacher: accuracy {clean:.3f} ({teacher.heads_per_layer} heads per layer)")
CASES = [
    ("top-2", order[:2], "attention"),
    ("top-2", order[:2], "default"),
    ("bottom-2", order[-2:], "attention"),
    ("none", [], "attention"),
]
for label, keep, init in CASES[: int(os.environ.get("GNA_EXAMPLE_CASES", len(CASES)))]:
    student = gna.hybridize(teacher, keep, init=init, combine="sum")
    before = gna.evaluate(student, task, progress=False).accuracy
    start = time.perf_counter()
    history = gna.distill(
        student, teacher, train, steps={"A": STEPS // 3, "B": STEPS}, batch_size=16, lr=2e-3, seed=0, positions="last", progress=False
    )
    minutes = (time.perf_counter() - start) / 60
    after = gna.evaluate(student, task, progress=False).accuracy
    last_a, last_b = float(history.stage("A")[-10:].mean()), float(history.stage("B")[-10:].mean())
    print(
        f"keep {label} ({', '.join(map(str, keep)) or 'no head'}), init {init}: accuracy {before:.3f} before, {after:.3f} after "
        f"({after / clean:.0%} of the teacher); stage A loss {last_a:.4f}, stage B KL {last_b:.4f}; {minutes:.1f} min"
    )
