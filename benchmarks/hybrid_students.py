"""Issue 30, item 5: the paper's claim in miniature on the bundled teacher `llama_4x8`
(4 layers x 8 heads, label-last options with shuffled labels: it must read the labels).

Students keep (a) the top heads of the toy card's retrieval ranking: ``top8`` (its 8 G&A
heads, L0H0-3 and L2H0-3: 25%), ``top6``, ``top4`` and ``top2`` (6%); (b) as many heads the ranking scores 0:
``bottom8`` (8 drawn with seed 0 from those 24) and ``bottom2``; (c) ``none`` (a pure
Discrete Mamba-2 student). Each is distilled with `gna.distill` (stage A per layer, then
stage B's KL at the answer position; only the student's new parameters train) on fresh
prompts of the toy task. Per student: accuracy on 400 held-out prompts before and after,
the fraction of the teacher recovered, KV-cache and SSM-state bytes at a stated context
length against the teacher's KV cache, and training minutes; one JSON line per student is
appended to ``--json`` (default ``benchmarks/results/hybrid_students.jsonl``), which
docs/layer_swap.md and ``examples/hybrid_students.ipynb`` read.

    python benchmarks/hybrid_students.py STUDENT [--steps-a 150] [--steps-b 400] [--init attention] [--lr 5e-4]
    (one student per process: run them in parallel, each on one thread)

The toy task is the retrieval task here (find the line whose first word is the query, read
its label); the teacher was never trained on `gna.tasks.kv_retrieval` and is at chance on it
(0.245 with 4 pairs, 0.135 with 10; the paper's 20-50 pairs exceed its 128-token context), so
a KV-retrieval column would compare chance with chance and is not scored.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from _common import parser, set_threads

import gna_interp as gna

gna.set_progress(False)
TOY = "llama_4x8"
CONTEXT = 4096  # tokens, for the cache sizes
BYTES = 2  # bf16
# The toy card's retrieval ranking (zero ablation, 500 prompts); the 24 other heads score 0.
RANKED = [(0, 0), (0, 2), (0, 1), (0, 3), (2, 0), (2, 2), (2, 3), (2, 1)]
ZERO = sorted(set((layer, head) for layer in range(4) for head in range(8)) - set(RANKED))  # the 24 heads scoring 0.000
STUDENTS = {
    "top8": [gna.Head(*h) for h in RANKED],
    "top6": [gna.Head(*h) for h in RANKED[:6]],
    "top4": [gna.Head(*h) for h in RANKED[:4]],
    "top2": [gna.Head(*h) for h in RANKED[:2]],
    "bottom8": [gna.Head(*h) for h in sorted(random.Random(0).sample(ZERO, 8))],
    "bottom2": [gna.Head(3, 6), gna.Head(3, 7)],
    "none": [],
}
RESULTS = Path(__file__).resolve().parent / "results" / "hybrid_students.jsonl"


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
    arguments = parser(__doc__, threads=1, json_file=False)
    arguments.add_argument("student", choices=sorted(STUDENTS))
    arguments.add_argument("--steps-a", type=int, default=150)
    arguments.add_argument("--steps-b", type=int, default=400)
    arguments.add_argument("--init", default="attention", choices=("attention", "default"))
    arguments.add_argument("--lr", type=float, default=5e-4)
    arguments.add_argument("--train", default="new", choices=("new", "all"))
    arguments.add_argument("--json", type=Path, default=RESULTS, help="append a row to this JSON-lines file")
    args = arguments.parse_args()
    set_threads(args.threads)
    name, steps_a, steps_b, init, lr = args.student, args.steps_a, args.steps_b, args.init, args.lr
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
        stages=[stage for stage, n in (("A", steps_a), ("B", steps_b)) if n],
        steps={"A": steps_a, "B": steps_b},
        batch_size=16,
        lr=lr,
        seed=0,
        positions="last",
        train=args.train,
        callback=log,
        progress=False,
    )
    minutes = (time.perf_counter() - start) / 60
    after = gna.evaluate(student, task, progress=False).accuracy
    t_kv, _ = cache_bytes(teacher.hf_model.config, None)
    kv, state = cache_bytes(student.hf_model.config, student.hf_model.config.kept)
    row = {
        "student": name,
        "kept": [str(h) for h in STUDENTS[name]],
        "init": init,
        "lr": lr,
        "train": args.train,
        "steps_a": steps_a,
        "steps_b": steps_b,
        "teacher": clean,
        "before": before,
        "after": after,
        "of_teacher": after / clean,
        "kv_bytes": kv,
        "state_bytes": state,
        "teacher_kv_bytes": t_kv,
        "stage_a_last10": float(history.stage("A")[-10:].mean()) if steps_a else None,
        "stage_b_last10": float(history.stage("B")[-10:].mean()) if steps_b else None,
        "minutes": minutes,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with args.json.open("a") as out:
        out.write(json.dumps(row) + "\n")
    print(
        f"RESULT | {name} ({', '.join(map(str, STUDENTS[name])) or 'no head'}) | init {init} | lr {lr} | teacher {clean:.3f} | "
        f"before {before:.3f} | after {after:.3f} | {after / clean:.0%} of teacher | "
        f"KV {kv} B + state {state} B = {(kv + state) / t_kv:.1%} of teacher KV {t_kv} B at {CONTEXT} tokens | "
        f"stage A {row['stage_a_last10']} | stage B KL {row['stage_b_last10']} | {minutes:.1f} min",
        flush=True,
    )


if __name__ == "__main__":
    main()
