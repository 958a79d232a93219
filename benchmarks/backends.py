"""Benchmark: the ``tlens`` and ``nnsight`` backends side by side on SSMs and hybrids.

What is compared
----------------
Each model is loaded twice from the same weights, once per backend, and every operation
runs on both in the same process, alternating which goes first (best of ``--repeats``
timed runs after one warm-up each). The operations:

``forward``
    ``model.logits(prompts)``.
``ablation``
    ``gna.ablation_sweep`` (zero ablation of every head, stacked variants).
``patching``
    ``gna.patching_sweep`` (every head, clean into corrupt).
``patterns``
    ``gna.attention_pattern`` of every head at the final query row.
``path``
    ``gna.path_patching`` of the first head of the first layer with heads into every head
    of the last layer (all their streams), plus the direct path to the logits.
``attribution``
    ``gna.attribution_patching`` (two forwards and one backward).

Models (nothing downloaded): the bundled toys ``mamba2`` and ``falcon_h1`` on fresh
prompts of their own task (corrupt: options rotated), tiny *random* models of every SSM and
hybrid family (`gna_interp.models.tiny`) and a wider random Mamba-2 (``mamba2-wide``: 4
layers, d_model 512, 16 heads of 64, state 64) on random-word prompts of 12 words (corrupt:
every third word replaced). ``--models`` picks a subset.

How to read the output
----------------------
- ``nnsight s`` / ``tlens s``: best wall-clock time of the operation on each backend.
- ``tlens / nnsight``: the ratio; below 1 the bridge is faster.
- ``max |diff|``: the largest difference between the two backends' results (logits,
  scores, patterns or the path-patching value): the same numbers, or the row is wrong.
  The JSON output also has ``max_abs_value``, the largest result itself.

Run: ``python benchmarks/backends.py [--prompts 16] [--repeats 3] [--threads 1] [--models mamba2 ...] [--json PATH]``
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
import platform
from collections.abc import Callable
from typing import Any

import torch
from _common import best_of_each, parser, set_threads, word_pairs, write_json

import gna_interp as gna

# Private: gna_interp.models.tiny builds random untrained models of any shape (the library has no public builder).
from gna_interp.models.tiny import HYBRIDS, tiny_model, word_tokenizer

TOYS = ("mamba2_counting", "falcon_h1_counting")
RANDOM = ("mamba", "falcon_mamba", "mamba2", *HYBRIDS)
WIDE = {"mamba2-wide": ("mamba2", dict(hidden_size=512, num_heads=16, head_dim=64, num_hidden_layers=4, state_size=64, chunk_size=16))}
"""Larger random models, where compute rather than per-call overhead dominates."""
OPERATIONS = ("forward", "ablation", "patching", "patterns", "path", "attribution")


def toy_case(name: str, n: int, seed: int) -> tuple[dict[str, Any], Any, Any, Callable]:
    """Both backends on a bundled toy, its task's prompts and the letter-logit metric."""
    task = gna.toy_task(name, n, seed=seed)
    corrupt = task.corrupted(seed=seed)
    encoded, corrupt_encoded = task.encode(), corrupt.encode()
    rows = torch.arange(n)
    metric = gna.logit_diff(encoded.candidate_ids[rows, encoded.correct], corrupt_encoded.candidate_ids[rows, corrupt_encoded.correct])
    models = {backend: gna.load_toy(name, backend=backend) for backend in ("nnsight", "tlens")}
    return models, task, corrupt, metric


def random_case(name: str, n: int, seed: int) -> tuple[dict[str, Any], Any, Any, Callable]:
    tokenizer = word_tokenizer()
    clean, corrupt = word_pairs(n, 12, seed)
    family, sizes = WIDE.get(name, (name, {}))
    hf = tiny_model(family, seed=seed, **sizes)
    models = {backend: gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend=backend) for backend in ("nnsight", "tlens")}
    return models, clean, corrupt, gna.logit_diff(5, 6)


def operations(model: Any, clean: Any, corrupt: Any, metric: Callable) -> dict[str, Callable[[], Any]]:
    """Each operation as a call returning a tensor (or a float) to compare across backends."""
    layers = [layer for layer, n in enumerate(model.heads_per_layer) if n]
    sender = gna.Head(layers[0], 0)
    receivers = [h for h in model.heads if h.layer == layers[-1] and model.receiver_inputs(h)]
    return {
        "forward": lambda: model.logits(clean),
        "ablation": lambda: gna.ablation_sweep(model, clean, None, metric, progress=False).scores,
        "patching": lambda: gna.patching_sweep(model, clean, corrupt, metric, progress=False).scores,
        "patterns": lambda: gna.attention_pattern(model, clean, model.heads, query_positions=[-1]),
        "path": lambda: gna.path_patching(model, clean, corrupt, metric, senders=[sender], receivers=[*receivers, "logits"]),
        "attribution": lambda: gna.attribution_patching(model, clean, corrupt, metric).scores,
    }


def difference(a: Any, b: Any) -> float:
    if isinstance(a, float):
        return abs(a - b)
    return float((a - b).abs().nan_to_num().max())


def magnitude(a: Any) -> float:
    return abs(a) if isinstance(a, float) else float(a.abs().nan_to_num().max())


def measure(label: str, models: dict[str, Any], clean: Any, corrupt: Any, metric: Callable, repeats: int) -> list[dict[str, Any]]:
    calls = {backend: operations(model, clean, corrupt, metric) for backend, model in models.items()}
    rows = []
    for op in OPERATIONS:
        seconds, results = best_of_each({backend: calls[backend][op] for backend in models}, repeats, alternate=True)
        rows.append(
            {
                "model": label,
                "operation": op,
                "nnsight_s": seconds["nnsight"],
                "tlens_s": seconds["tlens"],
                "ratio": seconds["tlens"] / seconds["nnsight"],
                "max_abs_diff": difference(results["tlens"], results["nnsight"]),
                "max_abs_value": magnitude(results["nnsight"]),
            }
        )
        print(
            f"{label:26s} {op:12s} {rows[-1]['nnsight_s']:9.4f} {rows[-1]['tlens_s']:9.4f} {rows[-1]['ratio']:8.2f}x"
            f" {rows[-1]['max_abs_diff']:10.1e}",
            flush=True,
        )
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per operation: the geometric mean and the range of the ratio over models."""
    out = {}
    for op in OPERATIONS:
        ratios = torch.tensor([r["ratio"] for r in rows if r["operation"] == op])
        if len(ratios):
            out[op] = {"geomean": float(ratios.log().mean().exp()), "min": float(ratios.min()), "max": float(ratios.max())}
    return out


def main() -> None:
    arguments = parser(__doc__, threads=1, repeats=3)
    arguments.add_argument("--prompts", type=int, default=16)
    arguments.add_argument("--seed", type=int, default=0)
    arguments.add_argument("--models", nargs="*", default=None, help="toy-<name> or a tiny family name (default: all)")
    args = arguments.parse_args()
    set_threads(args.threads)
    loads = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    versions = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "transformer-lens", "nnsight")}
    print(f"{versions}, {platform.processor() or platform.machine()}, {args.threads} thread(s), load average {loads[0]:.2f}")
    cases = [f"toy-{name}" for name in TOYS if name in gna.toy_names()] + list(RANDOM) + list(WIDE)
    chosen = cases if args.models is None else [c for c in cases if c in args.models]
    unknown = sorted(set(args.models or ()) - set(cases))
    if unknown:
        arguments.error(f"unknown models {unknown}: expected some of {cases}")
    print(f"{'model':26s} {'operation':12s} {'nnsight s':>9s} {'tlens s':>9s} {'tlens/nnsight':>9s} {'max |diff|':>10s}")
    rows: list[dict[str, Any]] = []
    for case in chosen:
        if case.startswith("toy-"):
            models, clean, corrupt, metric = toy_case(case[4:], args.prompts, args.seed)
            label = f"{case} (trained)"
        else:
            models, clean, corrupt, metric = random_case(case, args.prompts, args.seed)
            label = f"random {case}"
        rows += measure(label, models, clean, corrupt, metric, args.repeats)
    figures = {"versions": versions, "threads": args.threads, "load": loads[0], "rows": rows, "summary": summary(rows)}
    print("\ntlens / nnsight per operation over models: geometric mean (min - max)")
    for op, values in figures["summary"].items():
        print(f"  {op:12s} {values['geomean']:.2f}x ({values['min']:.2f} - {values['max']:.2f})")
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
