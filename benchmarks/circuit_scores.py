"""Benchmark: MIB's circuit scores (CPR, CMD) of the bundled toys, by several rankings.

What is measured
----------------
For each toy of ``--toys``, ``--prompts`` prompts of its task (``toy_task(name, n,
seed=4242)``) against ``task.corrupted()``, metric discover's (the logit of the clean
answer minus the corrupted prompt's answer, final position), MIB's fractions:

- ``discover``: ``gna.discover``'s own score (``circuit.score``: its ranking, the circuit's
  heads first), its passes and the score's passes alone;
- the same ranking with ``how="mean"`` and ``how="zero"``;
- ``attribution_patching`` and ``patching_sweep(direction="noise")`` rankings (|effect|);
- with ``--edges``: an ``edge_attribution`` ranking of every edge from layer 0 into layer 1's
  streams (q, k, v for attention, x, B, C, dt for SSM heads), on toys of at most
  `EDGE_HEADS` heads a layer.

Reported per row: CPR, CMD, the realised sizes and f at each.

Run: ``python benchmarks/circuit_scores.py [--toys llama mamba2 falcon_h1 mamba] [--prompts 200]
[--edges] [--json PATH]``
"""

from __future__ import annotations

import time
import warnings

from _common import parser, set_threads, write_json

import gna_interp as gna

# Private: discover's metric (the logit difference of the two prompts' answers), to score other rankings with the same m.
from gna_interp.discovery.confirm import answer_metric

EDGE_HEADS = 32
"""``--edges`` scores toys of at most this many heads a layer (the Mamba-1 toy's 128 x 128 x 4
edges would take an edge curve of 128 receivers per size)."""


def main() -> None:
    arguments = parser(__doc__, threads=1)
    arguments.add_argument("--toys", nargs="+", default=["llama", "mamba2", "falcon_h1", "mamba"])
    arguments.add_argument("--prompts", type=int, default=200)
    arguments.add_argument("--edges", action="store_true", help="also score an edge_attribution ranking")
    args = arguments.parse_args()
    set_threads(args.threads)
    gna.set_progress(False)
    warnings.simplefilter("ignore")
    rows = []
    for name in args.toys:
        model, task = gna.load_toy(name), gna.toy_task(name, args.prompts, seed=4242)
        started = time.perf_counter()
        circuit = gna.discover(model, task, progress=False)
        seconds = time.perf_counter() - started
        corrupt = task.corrupted()
        metric = answer_metric(model, task, corrupt)
        ranking = [gna.Head.parse(h) for h in circuit.score["ranking"]]
        with gna.cost_meter(model) as cost:
            again = gna.circuit_score(model, task, corrupt, metric, ranking, progress=False)
        base = {"toy": name, "heads": len(model.heads), "circuit": len(circuit.gather) + len(circuit.aggregate)}
        rows.append(
            {
                **base,
                "ranking": "discover",
                **_figures(again),
                "circuit.score cpr": circuit.score["cpr"],
                "circuit.score cmd": circuit.score["cmd"],
                "discover passes": circuit.cost["passes"],
                "score passes": cost.passes(len(task)),
                "discover s": seconds,
            }
        )
        for how in ("mean", "zero"):
            rows.append(
                {
                    **base,
                    "ranking": f"discover, how={how}",
                    **_figures(gna.circuit_score(model, task, corrupt, metric, ranking, how=how, progress=False)),
                }
            )
        for label, sweep in (
            ("attribution_patching", gna.attribution_patching(model, task, corrupt, metric, progress=False)),
            ("patching_sweep (noise)", gna.patching_sweep(model, task, corrupt, metric, direction="noise", progress=False)),
        ):
            rows.append({**base, "ranking": label, **_figures(gna.circuit_score(model, task, corrupt, metric, sweep, progress=False))})
        if args.edges and max(model.heads_per_layer) <= EDGE_HEADS:
            receivers = [h for h in model.heads if h.layer == 1]
            streams = sorted({s for r in receivers for s in model.receiver_inputs(r)} & {"q", "k", "v", "x", "B", "C", "dt"})
            edges = gna.edge_attribution(model, task, corrupt, metric, receivers=receivers, receiver_input=streams, progress=False)
            rows.append(
                {**base, "ranking": "edge_attribution", **_figures(gna.circuit_score(model, task, corrupt, metric, edges, progress=False))}
            )
        for row in [row for row in rows if row["toy"] == name]:
            print(f"{row['toy']:10s} {row['ranking']:24s} CPR {row['cpr']:.3f} CMD {row['cmd']:.3f} sizes {row['sizes']} f {row['f']}")
    write_json(args.json, {"prompts": args.prompts, "rows": rows})


def _figures(score: gna.CircuitScore) -> dict:
    return {
        "cpr": score.cpr,
        "cmd": score.cmd,
        "unit": score.unit,
        "sizes": score.sizes.tolist(),
        "f": [round(v, 3) for v in score.faithfulness.tolist()],
        "m(N)": score.metric_full,
        "m(empty)": score.metric_empty,
    }


if __name__ == "__main__":
    main()
