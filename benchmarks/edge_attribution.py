"""Edge attribution against path patching on the bundled toys.

For each toy, the receivers are the heads of its Aggregate layer (the card's smallest
set of layer-1 heads whose ablation takes accuracy to chance: ``ablation.smallest_sets``)
and the senders are every head before them. Every edge ``sender -> (receiver, stream)`` is
scored twice on the same prompts: by `gna.edge_attribution` (``--method``, ``--steps``;
default first order, ``steps=1``)
and by `gna.path_patching_sweep` (one receiver, one stream), with the candidate logit
difference (linear in the logits) as the metric. Printed: the Spearman rank correlation
over the live edges (either score non-zero), the sign agreement, the top-k overlap and the
seconds each method took. With ``--curve``, also the edge faithfulness curve
(`gna.edge_faithfulness_curve`) of each ranking: the fewest top edges that keep 90% of the
clean accuracy, with every other edge into the receivers patched from the corrupted run.

    python benchmarks/edge_attribution.py [--prompts 200] [--seed 4242] [--curve] [--json out.json]
"""

from __future__ import annotations

import time
from typing import Any

import torch
from _common import parser, set_threads, spearman, write_json

import gna_interp as gna

TOYS = ("llama", "mamba2_counting", "falcon_h1_counting")


def measure(name: str, prompts: int, seed: int, curve: bool = False, method: str = "first_order", steps: int = 1) -> dict[str, Any]:
    model, task = gna.load_toy(name), gna.toy_task(name, prompts, seed=seed)
    corrupt = task.corrupted(seed=seed)
    encoded = task.encode()
    metric = gna.candidate_logit_diff(encoded.candidate_ids, encoded.correct)
    card = gna.toy_card(name)
    receivers = [gna.Head(1, int(h.split("H")[1])) for h in card["ablation"]["smallest_sets"]["1"]["heads"]]
    started = time.perf_counter()
    streams = _all_streams(model, receivers)
    edges = gna.edge_attribution(model, task, corrupt, metric, steps=steps, receivers=receivers, receiver_input=streams, method=method)
    edge_seconds = time.perf_counter() - started
    estimate, exact, edge_list = [], [], []
    started = time.perf_counter()
    for j, receiver in enumerate(edges.receivers):
        for k, stream in enumerate(edges.streams):
            if stream not in model.receiver_inputs(receiver):
                continue
            sweep = gna.path_patching_sweep(
                model, task, corrupt, metric, receivers=[receiver], senders=edges.senders, receiver_input=stream, progress=False
            )
            for i, sender in enumerate(edges.senders):
                estimate.append(float(edges.scores[i, j, k]))
                edge_list.append((sender, receiver, stream))
                exact.append(float(sweep.scores[sender.layer, sender.head]) - sweep.baseline)
    path_seconds = time.perf_counter() - started
    a, b = torch.tensor(estimate), torch.tensor(exact)
    live = (a.abs() > 0) | (b.abs() > 0)
    a, b = a[live], b[live]
    k = max(1, len(b) // 10)
    top = len(set(a.abs().topk(k).indices.tolist()) & set(b.abs().topk(k).indices.tolist())) / k
    curves = {}
    if curve:
        for label, values in (("attribution", estimate), ("path_patching", exact)):
            order = [edge_list[i] for i in sorted(range(len(values)), key=lambda i: -abs(values[i]))]
            started = time.perf_counter()
            result = gna.edge_faithfulness_curve(model, task, order, corrupt=corrupt, metric=metric, progress=False)
            reached = [n for n, acc in zip(result.sizes.tolist(), result.of_clean().tolist(), strict=True) if acc >= 0.9]
            curves[label] = {
                "clean": result.clean["accuracy"],
                "none_kept": result.ablated["accuracy"],
                "edges_for_90pct": reached[0] if reached else None,
                "n_edges": len(order),
                "seconds": time.perf_counter() - started,
            }
    return {
        "toy": name,
        "receivers": [str(r) for r in receivers],
        "edges": int(live.sum()),
        "spearman": spearman(a, b),
        "sign_agrees": float(((a > 0) == (b > 0)).double().mean()),
        "top_10pct_overlap": top,
        "edge_seconds": edge_seconds,
        "path_patching_seconds": path_seconds,
        "curves": curves,
    }


def _all_streams(model: Any, receivers: list[Any]) -> list[str]:
    return list(dict.fromkeys(name for r in receivers for name in model.receiver_inputs(r)))


def main(argv: list[str] | None = None) -> int:
    arguments = parser(__doc__, threads=1)
    arguments.add_argument("--toys", nargs="+", default=list(TOYS), choices=TOYS)
    arguments.add_argument("--prompts", type=int, default=200)
    arguments.add_argument("--seed", type=int, default=4242)
    arguments.add_argument("--method", default="first_order", choices=["first_order", "exact_upstream", "exact_receiver"])
    arguments.add_argument("--steps", type=int, default=1, help="edge_attribution's steps")
    arguments.add_argument("--curve", action="store_true", help="also each ranking's edge faithfulness curve")
    args = arguments.parse_args(argv)
    set_threads(args.threads)
    rows = [measure(name, args.prompts, args.seed, args.curve, args.method, args.steps) for name in args.toys]
    how = f"edge attribution (method={args.method!r}, steps={args.steps})"
    print(f"{args.prompts} prompts (toy_task seed {args.seed}), {how} vs path patching, candidate logit difference")
    print(f"{'toy':10} {'edges':>5} {'spearman':>8} {'sign':>5} {'top10%':>6} {'edge s':>7} {'path s':>7}  receivers")
    for row in rows:
        print(
            f"{row['toy']:10} {row['edges']:5d} {row['spearman']:8.3f} {row['sign_agrees']:5.2f} {row['top_10pct_overlap']:6.2f} "
            f"{row['edge_seconds']:7.2f} {row['path_patching_seconds']:7.2f}  {', '.join(row['receivers'])}"
        )
    for row in rows:
        for label, c in row["curves"].items():
            print(
                f"{row['toy']:10} edge faithfulness by {label:13}: clean acc {c['clean']:.3f}, no edge kept {c['none_kept']:.3f}, "
                f"90% of clean with the top {c['edges_for_90pct']} of {c['n_edges']} edges ({c['seconds']:.1f} s)"
            )
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
