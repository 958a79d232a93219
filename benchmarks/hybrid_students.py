"""Issue 30, item 5: the paper's claim in miniature on the bundled teacher `llama_4x8`
(4 layers x 8 heads, label-last options with shuffled labels: it must read the labels).

Students keep (a) the top-2 heads of the toy card's retrieval ranking (2 of 32 heads,
6%), (b) the 2 lowest-ranked heads, (c) none (a pure Discrete Mamba-2 student); each is
distilled with `gna.distill` (stage A per layer, then stage B's KL at the answer position)
on fresh prompts of the toy task. Printed per student: accuracy on 400 held-out prompts
before and after, the fraction of the teacher recovered, KV-cache and SSM-state bytes at a
stated context length against the teacher's KV cache, and training minutes.

    python benchmarks/hybrid_students.py STUDENT [STEPS_A STEPS_B INIT LR]   # STUDENT: top2, bottom2, none
    (one student per process: run them in parallel, each on one thread)

The toy task is the retrieval task here (find the line whose first word is the query, read
its label); the teacher was never trained on `gna.tasks.kv_retrieval`, so that probe is not
scored.
"""

from __future__ import annotations

import sys
import time

import torch

import gna_interp as gna

torch.set_num_threads(1)
gna.set_progress(False)
TOY = "llama_4x8"
CONTEXT = 4096  # tokens, for the cache sizes
BYTES = 2  # bf16
# The toy card's retrieval ranking (zero ablation, 500 prompts); the 24 other heads score 0.
RANKED = [(0, 0), (0, 2), (0, 1), (0, 3), (2, 0), (2, 2), (2, 3), (2, 1)]
STUDENTS = {
    "top2": [gna.Head(*h) for h in RANKED[:2]],
    "bottom2": [gna.Head(3, 6), gna.Head(3, 7)],  # two of the 24 heads that score 0.000
    "none": [],
}


def cache_bytes(config: object, kept: list[list[int]] | None) -> tuple[int, int]:
    """(KV-cache bytes at CONTEXT tokens, SSM-state bytes) of the teacher (``kept`` None)
    or a student: K and V of each attention head; the mixer's state ``n_heads x head_dim x
    d_state`` plus its conv window (kernel - 1 positions of x, B, C) per layer."""
    n_layers, n_heads = int(config.num_hidden_layers), int(config.num_attention_heads)  # type: ignore[attr-defined]
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // n_heads)  # type: ignore[attr-defined]
    if kept is None:
        return n_layers * n_heads * 2 * head_dim * CONTEXT * BYTES, 0
    kv = sum(len(layer) for layer in kept) * 2 * head_dim * CONTEXT * BYTES
    d_state = int(getattr(config, "d_state", head_dim))
    conv = 3 * (n_heads * head_dim + 2 * n_heads * d_state)  # kernel 4: 3 past positions of x, B, C
    state = n_layers * (n_heads * head_dim * d_state + conv) * BYTES
    return kv, state


def main() -> None:
    name = sys.argv[1]
    steps_a = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    steps_b = int(sys.argv[3]) if len(sys.argv) > 3 else 240
    init = sys.argv[4] if len(sys.argv) > 4 else "attention"
    lr = float(sys.argv[5]) if len(sys.argv) > 5 else 2e-3
    teacher, task = gna.load_toy(TOY), gna.toy_task(TOY, 400, seed=2026)
    train = gna.toy_task(TOY, 8000, seed=1).prompts
    clean = gna.evaluate(teacher, task, progress=False).accuracy
    student = gna.hybridize(teacher, STUDENTS[name], init=init, combine="sum")
    before = gna.evaluate(student, task, progress=False).accuracy
    start = time.perf_counter()

    def log(stage: str, step: int, loss: float) -> None:
        if step % 20 == 0:
            print(f"  {name} stage {stage} step {step} loss {loss:.4f} ({(time.perf_counter() - start) / 60:.1f} min)", flush=True)

    history = gna.distill(
        student,
        teacher,
        train,
        steps={"A": steps_a, "B": steps_b},
        batch_size=16,
        lr=lr,
        seed=0,
        positions="last",
        callback=log,
        show_progress=False,
    )
    minutes = (time.perf_counter() - start) / 60
    after = gna.evaluate(student, task, progress=False).accuracy
    t_kv, _ = cache_bytes(teacher.hf_model.config, None)
    kv, state = cache_bytes(student.hf_model.config, student.hf_model.config.kept)
    print(
        f"RESULT | {name} ({', '.join(map(str, STUDENTS[name])) or 'no head'}) | init {init} | lr {lr} | teacher {clean:.3f} | "
        f"before {before:.3f} | after {after:.3f} | {after / clean:.0%} of teacher | "
        f"KV {kv} B + state {state} B = {(kv + state) / t_kv:.1%} of teacher KV {t_kv} B at {CONTEXT} tokens | "
        f"stage A {float(history.stage('A')[-10:].mean()):.3f} | "
        f"stage B KL {float(history.stage('B')[-10:].mean()):.4f} | {minutes:.1f} min",
        flush=True,
    )


if __name__ == "__main__":
    main()
