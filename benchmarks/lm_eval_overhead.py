"""Benchmark: what running a task through lm-eval costs next to `gna.evaluate`.

What is measured, in one process, side by side
-----------------------------------------------
``import``
    The first ``import lm_eval.evaluator`` (with ``gna_interp`` already imported) and
    the first import of the adapter (``gna_interp.harness.adapter``, which registers ``gna``).
``index``
    lm-eval's ``TaskManager`` over a folder holding one task (``include_defaults=False``),
    and over lm-eval's built-in tasks (~15,000 YAML files; what its CLI builds on every
    run, and what `gna.lm_eval` builds once per process when a task is not in
    ``include_path``). ``--no-builtin-index`` skips the second.
``run``
    The bundled Llama toy on ``--prompts`` prompts of its own task, 4 choices each:
    ``gna.evaluate`` (one forward per 64 prompts, every choice read from the final
    logits) against ``gna.lm_eval`` on the same prompts exported with
    ``gna.harness.write_task`` (lm-eval builds 4 requests per prompt, the adapter runs one
    forward per 16 distinct inputs, lm-eval scores and aggregates). Best of ``--repeats``
    runs after one warm-up; the two accuracies must be equal (else FAIL, exit 1).

Times are wall-clock seconds with ``torch.set_num_threads(--threads)``; on a shared machine
read the ratio, measured in the same process, rather than the absolute figures.

Run: ``python benchmarks/lm_eval_overhead.py [--prompts 200] [--repeats 3] [--json out.json]``
"""

from __future__ import annotations

import platform
import tempfile
import time
from typing import Any

from _common import best_of, parser, set_threads, write_json

import gna_interp as gna


def main() -> int:
    arguments = parser(__doc__, threads=2, repeats=3)
    arguments.add_argument("--prompts", type=int, default=200)
    arguments.add_argument("--no-builtin-index", action="store_true", help="skip indexing lm-eval's built-in tasks")
    args = arguments.parse_args()
    set_threads(args.threads)
    figures: dict[str, Any] = {"machine": platform.processor() or platform.machine(), "threads": args.threads, "prompts": args.prompts}

    start = time.perf_counter()
    import lm_eval.evaluator  # noqa: F401

    figures["import_lm_eval_evaluator_s"] = time.perf_counter() - start
    start = time.perf_counter()
    import gna_interp.harness.adapter  # noqa: F401

    figures["import_adapter_s"] = time.perf_counter() - start
    from lm_eval.tasks import TaskManager

    model, task = gna.load_toy("llama"), gna.toy_task("llama", args.prompts, seed=2026)
    folder = gna.harness.write_task(task, tempfile.mkdtemp(prefix="gna_bench_tasks_"), "toy_llama")
    start = time.perf_counter()
    TaskManager(include_path=str(folder), include_defaults=False).load(["toy_llama"])
    figures["index_and_load_own_task_s"] = time.perf_counter() - start
    if not args.no_builtin_index:
        start = time.perf_counter()
        builtin = TaskManager()
        figures["index_builtin_tasks_s"] = time.perf_counter() - start
        figures["builtin_task_names"] = len(builtin.all_tasks)

    evaluate_s, ours = best_of(lambda: gna.evaluate(model, task), args.repeats)
    lm_eval_s, run = best_of(lambda: gna.lm_eval(model, "toy_llama", include_path=folder), args.repeats)
    accuracy = float(run.frame.set_index("metric").loc["acc", "value"])
    figures.update(evaluate_s=evaluate_s, lm_eval_s=lm_eval_s, ratio=lm_eval_s / evaluate_s)
    figures.update(evaluate_accuracy=ours.accuracy, lm_eval_accuracy=accuracy, same=abs(accuracy - ours.accuracy) < 1e-6)

    print(f"import lm_eval.evaluator      {figures['import_lm_eval_evaluator_s']:7.2f} s")
    print(f"import the adapter            {figures['import_adapter_s']:7.2f} s")
    print(f"index + load one local task   {figures['index_and_load_own_task_s']:7.2f} s")
    if "index_builtin_tasks_s" in figures:
        print(f"index built-in tasks          {figures['index_builtin_tasks_s']:7.2f} s ({figures['builtin_task_names']} names)")
    print(f"toy-llama, {args.prompts} prompts: gna.evaluate {evaluate_s:.3f} s, gna.lm_eval {lm_eval_s:.3f} s ({figures['ratio']:.1f}x)")
    print(f"accuracy: evaluate {ours.accuracy:.4f}, lm-eval {accuracy:.4f} -> {'same' if figures['same'] else 'FAIL'}")
    if args.json is not None:
        write_json(args.json, figures)
    return 0 if figures["same"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
