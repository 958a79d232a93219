"""The size curve of the wide deep Mamba-1's Aggregate role, measured alone.

``discover`` sizes a spread role (`gna_interp.discovery.sizes`): the entry layer's heads in
order of importance, then accuracy with the ``k`` most important ablated at the role's
positions, by bisection on ``k``. On the 32 x 4,096 wide toy a whole discovery takes over an
hour on a CPU, so this runs only that step, as the spread check runs it: the entry layer (the
toy's layer 1, placed) and the toy's Aggregate channel L1H22 measured alone (the head scan's
single ablation) are given, the rest is `importance_order` and `size_curve`.

Prints the curve, the heads for half of the layer's effect, and the cost (the curve's own, then
with the layer's and the single channel's evaluations).

Run: ``python benchmarks/spread_size.py [--width 4096] [--layers 32] [--prompts 32] [--json PATH]``
"""

from __future__ import annotations

import time

import torch
from _common import parser, set_threads, write_json

import gna_interp as gna

# Private: the size curve's steps and the wide toy's builder (no public entry for either alone).
from gna_interp.discovery import memo, sizes
from gna_interp.discovery.evidence import SpreadRole
from gna_interp.discovery.head_scans import HeadScan
from gna_interp.zoo.deep import deep_head, deep_toy, placed_channels


def main() -> None:
    arguments = parser(__doc__, threads=1)
    arguments.add_argument("--width", type=int, default=4096)
    arguments.add_argument("--layers", type=int, default=32)
    arguments.add_argument("--prompts", type=int, default=32)
    args = arguments.parse_args()
    set_threads(args.threads)
    task = gna.toy_task("mamba", args.prompts, seed=4242)
    model = deep_toy("mamba", args.layers, width=args.width)
    aggregate = deep_head("L1H22", args.layers // 2 - 1, placed_channels(128, args.width))
    entry, encoded = aggregate.layer, task.encode(task.tokenizer_for(model.tokenizer))
    start = time.perf_counter()
    with model.prefix_cache(), memo.accuracy_memo(model), gna.cost_meter(model) as total:
        clean = memo.accuracy(model, task)
        whole = memo.accuracy(model, task, [gna.Ablate([gna.Head(entry, h) for h in range(args.width)], positions=encoded.final)])
        alone = memo.accuracy(model, task, [gna.Ablate([aggregate])])
        accuracy = torch.full((model.n_layers, model.n_heads), float("nan"))
        verified = torch.zeros(model.n_layers, model.n_heads, dtype=torch.bool)
        accuracy[entry, aggregate.head], verified[entry, aggregate.head] = alone, True
        scan = HeadScan(accuracy, verified)
        with gna.cost_meter(model) as cost:
            order = sizes.importance_order(model, task, encoded, entry, encoded.final, scan, clean, 0.02)
            curve = sizes.size_curve(sizes.measure(model, task, entry, order, encoded.final), args.width, clean, whole)
    role = SpreadRole("aggregate", "final", {entry: whole}, entry, None, 8, sizes=curve, order=order)
    spent = sizes.spent(cost, args.prompts, len(curve) - 2)
    print(f"{aggregate} alone {alone:.3f}; its rank in the order: {order.index(aggregate.head) + 1}")
    print("size curve:", role.describe_curve())
    print(role.describe_size(unit="channels"))
    print(f"cost: {spent}; with the layer and the single channel: {total.passes(args.prompts):.1f} passes")
    print(f"{time.perf_counter() - start:.0f} s")
    if args.json:
        write_json(args.json, {"width": args.width, "layers": args.layers, "prompts": args.prompts, "curve": curve, "cost": spent})


if __name__ == "__main__":
    main()
