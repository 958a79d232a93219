"""Benchmark: attribution patching against the full activation-patching sweep.

What is compared
----------------
For each model, on one set of clean prompts and their same-length corruptions:

``attribution``
    ``gna.attribution_patching(model, clean, corrupt, metric)``: every head's effect to
    first order, from a forward on ``clean``, a forward on ``corrupt`` with autograd and
    one backward.
``IG-k`` / ``IG-k mid``
    ``gna.attribution_patching(..., steps=k)`` (``rule="midpoint"`` for ``mid``): integrated
    gradients over ``k`` points of the path that patches every head at once (``k``
    forwards and ``k`` backwards).
``patching``
    ``gna.patching_sweep(model, clean, corrupt, metric)``: every head patched alone (many
    heads per stacked forward, the library's default memory budget).

All use ``direction="denoise"`` (run corrupt, patch in clean values) and the same metric.
The same methods also estimate zero ablation (``gna.patching.ablation_attribution(..., steps=k)``
on the clean prompts, the estimate `discover`'s prescreen ranks by) against
``gna.ablation_sweep`` (every head zero-ablated alone), with the same metric.

Models (nothing downloaded):

- ``toy-mamba2``, ``toy-llama`` (``tlens`` and ``nnsight``), ``toy-falcon_h1`` (the hybrid
  toy: attention and Mamba-2 heads side by side in each layer): the bundled toy models
  (``gna.load_toy``), each on fresh prompts of its own task (``gna.toy_task``);
  corrupt = ``task.corrupted()`` (options rotated); metric = logit of the correct letter
  minus the corrupt prompt's correct letter.
- Where no toy is bundled (a Llama, a Mamba-1), tiny *random* models (so their heads have
  no learnt function): a Llama (4 layers x 8 heads of 16, 2 key/value heads; ``tlens``
  and ``nnsight``) and a Mamba-1 (4 layers x 128 channels), on random-word prompts with
  every third word replaced; metric = ``logit_diff(5, 6)`` at the last position.

How to read the output
----------------------
- ``attr s`` / ``patch s``: best of ``--repeats`` timed runs after one warm-up (wall clock).
- ``speed-up``: ``patch s / attr s``.
- ``passes``: the method's cost from ``gna.cost_meter`` in full passes over the prompts:
  forward passes + backward passes (a backward costs about two forwards).
- ``saved MB``: the peak of the tensors autograd holds for the backward during the
  method (``torch.autograd.graph.saved_tensors_hooks``, weights included): what the
  backward adds to a forward's memory; integrated gradients hold one point at a time.
- ``live``: heads that change the metric in either table; a pruned head (the bundled
  toys' layer 1 keeps one head) is exactly 0 in both, and ties have no rank.
- ``spearman``: rank correlation of the two ``[layer, head]`` effect tables (live heads).
- ``top-k``: of the ``k`` live heads with the largest ``|effect|`` under patching, the
  fraction also among attribution's top ``k``.

Then, on ``toy-mamba2``, path patching of the G&A pair: the receiver is the last-layer
head with the largest activation-patching effect; ``gna.path_patching_sweep`` scores every
layer-0 head as its sender (``receiver_input="any"``, timed once), and the best sender is
path-patched through each input stream alone. Figures are ``normalized`` (0 = clean,
1 = the whole clean-to-corrupt change of the metric).

Run: ``python benchmarks/attribution.py [--prompts 32] [--repeats 3] [--threads 1] [--json PATH]``
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import best_of, parser, set_threads, spearman, toy_case, word_pairs, write_json

import gna_interp as gna

# Private: gna_interp.models.tiny builds random untrained models of any shape (the library has no public builder).
from gna_interp.models.tiny import tiny_model, word_tokenizer

TOP_K = (5, 10)


def top_k_overlap(attribution: torch.Tensor, exact: torch.Tensor, k: int) -> float:
    """Over the live heads (see `measure`): fraction of the ``k`` largest ``|exact|`` heads that attribution also ranks in its
    top ``k``; NaN when no head changes the metric, or when ``k`` covers every head
    (the overlap is then 1 whatever the ranking)."""
    if not bool(exact.abs().gt(0).any()) or k >= exact.numel():
        return float("nan")
    mine = set(attribution.abs().topk(k).indices.tolist())
    true = set(exact.abs().topk(k).indices.tolist())
    return len(mine & true) / k


def random_models(n: int, seed: int) -> list[tuple[str, Any, Any, Any, Callable]]:
    tokenizer = word_tokenizer()
    clean, corrupt = word_pairs(n, 12, seed)
    metric = gna.logit_diff(5, 6)
    llama_cfg = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2)
    out = []
    if "llama" in gna.toy_names():
        out += [toy_case("llama", n, seed, backend) for backend in ("tlens", "nnsight")]
    else:
        hf = tiny_model("llama", seed=seed, **llama_cfg)
        for backend in ("tlens", "nnsight"):
            model = gna.load(
                tiny_model("llama", seed=seed, **llama_cfg) if backend == "nnsight" else hf, tokenizer=tokenizer, backend=backend
            )
            out.append((f"random llama 4x8 ({backend})", model, clean, corrupt, metric))
    if "mamba" in gna.toy_names():
        out.append(toy_case("mamba", n, seed))
    else:
        hf = tiny_model("mamba", seed=seed, hidden_size=64, num_hidden_layers=4, state_size=8)
        out.append(("random mamba-1 4x128", gna.load(hf, tokenizer=tokenizer), clean, corrupt, metric))
    return out


METHODS: tuple[tuple[str, int, str], ...] = (
    ("attribution", 1, "left"),
    ("IG-2", 2, "left"),
    ("IG-4", 4, "left"),
    ("IG-8", 8, "left"),
    ("IG-2 mid", 2, "midpoint"),
    ("IG-4 mid", 4, "midpoint"),
    ("IG-8 mid", 8, "midpoint"),
)


class SavedBytes:
    """Bytes of the tensors autograd saves for backward, now and at the peak (a saved
    tensor counts until its graph is freed)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def pack(self, tensor: torch.Tensor) -> Any:
        size = tensor.numel() * tensor.element_size()
        self.now += size
        self.peak = max(self.peak, self.now)
        # hold a detached view (same storage): holding ``tensor`` itself would, for a tensor that is its own
        # node's output, make a cycle through autograd's C++ graph that Python's gc cannot see, and the meter
        # would then count (and keep alive) every graph it ever measured
        return _Held(tensor.detach(), size, self)

    @staticmethod
    def unpack(held: Any) -> torch.Tensor:
        return held.tensor


class _Held:
    def __init__(self, tensor: torch.Tensor, size: int, meter: SavedBytes) -> None:
        self.tensor, self.size, self.meter = tensor, size, meter

    def __del__(self) -> None:
        self.meter.now -= self.size


def metered(model: Any, fn: Callable[[], Any], n_prompts: int) -> tuple[Any, float, float]:
    """``fn()``, its cost in passes (forward + backward) and its peak saved-for-backward MB."""
    saved = SavedBytes()
    with gna.cost_meter(model) as cost, torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        result = fn()
    backward = cost.backward_block_rows / (n_prompts * model.n_layers)
    return result, cost.passes(n_prompts) + backward, saved.peak / 2**20


def compare(estimate: torch.Tensor, exact: torch.Tensor) -> dict[str, Any]:
    a, e = estimate.flatten(), exact.flatten()
    live = (a != 0) | (e != 0)  # a pruned head changes nothing in either table: exact ties, nothing to rank
    a, e = a[live], e[live]
    row = {"heads": live.numel(), "live": e.numel(), "spearman": spearman(a, e), "max_abs_effect": float(e.abs().max())}
    row.update({f"top{k}": top_k_overlap(a, e, k) for k in TOP_K})
    return row


def measure(
    name: str, model: Any, clean: Any, corrupt: Any, metric: Callable, repeats: int, methods: tuple[tuple[str, int, str], ...] = METHODS
) -> list[dict[str, Any]]:
    """One row per (estimate, method): patching and zero ablation, each method against its full sweep."""
    n = model.to_batch(clean).n_rows
    rows = []
    sweeps = {
        "patching": lambda: gna.patching_sweep(model, clean, corrupt, metric, progress=False),
        "ablation": lambda: gna.ablation_sweep(model, clean, None, metric, progress=False),
    }
    for estimate, sweep in sweeps.items():
        patch_s, _ = best_of(sweep, repeats)
        exact, exact_passes, _ = metered(model, sweep, n)
        for method, steps, rule in methods:

            def run(steps: int = steps, rule: str = rule, estimate: str = estimate) -> Any:
                if estimate == "patching":
                    return gna.attribution_patching(model, clean, corrupt, metric, steps=steps, rule=rule)
                return gna.patching.ablation_attribution(model, clean, metric, steps=steps, rule=rule)

            attr_s, _ = best_of(run, repeats)
            result, passes, saved_mb = metered(model, run, n)
            row = {"model": name, "backend": model.backend_name, "estimate": estimate, "method": method, "steps": steps, "rule": rule}
            row.update(compare(result.effects(), exact.effects()))
            row.update(attr_s=attr_s, patch_s=patch_s, speedup=patch_s / attr_s, passes=passes, sweep_passes=exact_passes)
            row["saved_mb"] = saved_mb
            rows.append(row)
    return rows


def path_demo(model: Any, clean: Any, corrupt: Any, metric: Callable) -> dict[str, Any]:
    """Path patching into the strongest last-layer head of ``model`` (see the module docstring)."""
    exact = gna.patching_sweep(model, clean, corrupt, metric, direction="noise", progress=False)
    last = model.n_layers - 1
    receiver = gna.Head(last, int(exact.effects()[last].abs().argmax()))
    start = time.perf_counter()
    sweep = gna.path_patching_sweep(model, clean, corrupt, metric, receivers=[receiver], progress=False)
    seconds = time.perf_counter() - start
    normalized = sweep.normalized()
    sender = sweep.top(1)[0][0]
    span = sweep.reference - sweep.baseline
    streams = {}
    for name in (*model.receiver_inputs(receiver), "any"):
        value = gna.path_patching(model, clean, corrupt, metric, senders=[sender], receivers=[receiver], receiver_input=name)
        streams[name] = (value - sweep.baseline) / span
    return {
        "receiver": str(receiver),
        "sweep_s": seconds,
        "senders": {str(gna.Head(0, h)): float(normalized[0, h]) for h in range(model.n_heads)},
        "best_sender": str(sender),
        "by_stream": streams,
        "activation_patching": {str(receiver): float(exact.normalized()[receiver.layer, receiver.head])},
    }


def main() -> None:
    arguments = parser(__doc__, threads=1, repeats=3)
    arguments.add_argument("--prompts", type=int, default=32)
    arguments.add_argument("--seed", type=int, default=0)
    names = [method for method, _, _ in METHODS]
    arguments.add_argument(
        "--methods", nargs="+", default=names, choices=names, metavar="METHOD", help=f"of {', '.join(names)} (default: all)"
    )
    args = arguments.parse_args()
    methods = tuple(m for m in METHODS if m[0] in args.methods)
    set_threads(args.threads)
    loads = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(
        f"torch {torch.__version__}, gna_interp {gna.__version__}, transformers {importlib.metadata.version('transformers')}, "
        f"{platform.machine()} with {os.cpu_count()} CPUs, {args.threads} torch thread(s), load average {loads[0]:.1f} at start "
        f"(other jobs share the machine: times are indicative); {args.prompts} prompts, best of {args.repeats}"
    )
    cases = [toy_case("mamba2_counting", args.prompts, args.seed), *random_models(args.prompts, args.seed)]
    if "falcon_h1_counting" in gna.toy_names():
        cases.append(toy_case("falcon_h1_counting", args.prompts, args.seed))
    rows = [row for case in cases for row in measure(*case, repeats=args.repeats, methods=methods)]
    columns = ("attr s", "patch s", "speed-up", "passes", "sweep", "saved MB", "max|eff|", "spearman")
    header = f"{'model':<30} {'estimate':<9} {'method':<11} {'heads':>5} {'live':>5} " + " ".join(f"{c:>8}" for c in columns) + " "
    header += " ".join(f"{'top-' + str(k):>6}" for k in TOP_K)
    print(header)
    for r in rows:
        tops = " ".join(f"{r[f'top{k}']:>6.2f}" for k in TOP_K)
        times = f"{r['attr_s']:>8.3f} {r['patch_s']:>8.3f} {r['speedup']:>7.1f}x {r['passes']:>8.1f} {r['sweep_passes']:>8.1f}"
        print(
            f"{r['model']:<30} {r['estimate']:<9} {r['method']:<11} {r['heads']:>5} {r['live']:>5} {times} {r['saved_mb']:>8.2f} "
            f"{r['max_abs_effect']:>8.3f} {r['spearman']:>8.3f} {tops}"
        )
    demo = path_demo(*cases[0][1:])
    print(
        f"\npath patching on toy-mamba2 into {demo['receiver']} (noise-direction activation patching of it: "
        f"{demo['activation_patching'][demo['receiver']]:.3f}); sweep of {len(demo['senders'])} layer-0 senders "
        f"in {demo['sweep_s']:.3f} s"
    )
    print("  senders, normalized: " + ", ".join(f"{h} {v:.3f}" for h, v in demo["senders"].items()))
    print(f"  {demo['best_sender']} -> {demo['receiver']} by stream: " + ", ".join(f"{k} {v:.3f}" for k, v in demo["by_stream"].items()))
    settings = {"prompts": args.prompts, "repeats": args.repeats, "threads": args.threads, "seed": args.seed, "load_average": loads}
    write_json(args.json, {"settings": settings, "torch": torch.__version__, "rows": rows, "path_demo": demo})


if __name__ == "__main__":
    main()
