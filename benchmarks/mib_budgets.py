"""MIB's edge-budget scores (CPR, CMD) of the label-reading toys, on both graphs.

    python benchmarks/mib_budgets.py --prompts 64 [--toys llama mamba2 ...] [--device cuda]

Per toy and path: `mib_attribution` (EAP, first order) over MIB's graph, then
`circuit_score(..., unit="edge")` at MIB's budgets (``path="mib"``: MIB's own chained
evaluation of the direct graph's circuits, the Llama toy only): CPR from signed scores, CMD from
|score| (MIB's table), with the logit difference of the task's candidates as the metric.
"""

from __future__ import annotations

import argparse
import time

import gna_interp as gna


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--toys", nargs="+", default=["llama", "mamba2", "falcon_h1", "mamba"])
    parser.add_argument("--paths", nargs="+", default=["direct", "all", "mib"])
    parser.add_argument("--absolute-only", action="store_true", help="CPR and CMD both from the |score| circuits (half the cost)")
    parser.add_argument("--device", default=None, help="where the toys' weights go (cuda on a GPU; default the CPU)")
    args = parser.parse_args()
    print("| toy | path | edges | CPR (signed) | CMD (abs) | f at 0.1/1/10/50% (abs) | seconds (of which ranking) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.toys:
        model, task = gna.load_toy(name, device=args.device), gna.toy_task(name, n=args.prompts, seed=1)
        encoded = task.encode(model.tokenizer)
        metric = gna.candidate_logit_diff(encoded.candidate_ids, encoded.correct)
        corrupt = task.corrupted()
        for path in args.paths:
            if path == "mib" and name != "llama":
                continue  # MIB's own evaluation: Transformers only
            start = time.time()
            graph = gna.mib_attribution(model, task, corrupt, metric, path="all" if path == "all" else "direct", progress=False)
            ranked = time.time() - start
            absolute = gna.circuit_score(model, task, corrupt, metric, graph, unit="edge", path=path, absolute=True, progress=False)
            signed = (
                absolute
                if args.absolute_only
                else gna.circuit_score(model, task, corrupt, metric, graph, unit="edge", path=path, absolute=False, progress=False)
            )
            f = absolute.faithfulness.tolist()
            points = "/".join(f"{f[i]:.2f}" for i in (0, 3, 6, 8))
            print(
                f"| {name} | {path} | {absolute.n_units} | {signed.cpr:.3f} | {absolute.cmd:.3f} | {points} | "
                f"{time.time() - start:.0f} ({ranked:.0f} ranking) |",
                flush=True,
            )


if __name__ == "__main__":
    main()
