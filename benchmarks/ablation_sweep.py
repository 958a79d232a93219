"""Benchmark: `gna_interp.ablation_sweep` against a plain per-head hook loop.

What is compared
----------------
One tiny random Llama (grouped-query attention, vocabulary of 64 words) and one set of
left-padded prompts (random words ``w4..w63``, fixed seed) are scored three ways:

``tlens`` / ``nnsight``
    ``gna.ablation_sweep(model, prompts, None, gna.logit_diff(5, 6), how="zero")``: every head
    zero-ablated alone, many heads per forward (the batch is stacked once per head, up
    to ``--max-rows`` rows, or the library's memory-budget estimate when unset).
``loop``
    The reference: a deep copy of the same HF model, taken before gna boots the tlens
    bridge (which wraps the modules in place). One forward per head, with a raw
    ``register_forward_pre_hook`` on ``model.model.layers[l].self_attn.o_proj`` that
    zeroes that head's slice of its input (viewed ``[batch, pos, n_heads, head_dim]``),
    removed after the forward, under ``torch.inference_mode()``, on the same
    ``input_ids`` / ``attention_mask`` that gna builds (``model.to_batch(prompts)``).
    Both sides also compute the unablated baseline, so they do the same work.

How to read the output
----------------------
- ``best`` is the fastest of ``--repeats`` timed runs after one untimed warm-up
  (wall clock, ``time.perf_counter``); ``all`` lists every timed run.
- ``loop/batched`` above 1 means the batched sweep is faster than the loop. ``limit`` is
  ``2L / (L + 1)``: the loop's block evaluations over the batched sweep's, whose chunks
  start at their heads' layer from the baseline's residual (prefix reuse). ``blocks`` is
  that ratio as `gna.cost_meter` counts it (the baseline and layer-0 chunks included). A
  time ratio above it comes from stacking variants (per-call overhead saved), not blocks.
- ``max |diff|`` is the largest absolute difference between the backend's
  ``[layer, head]`` score table and the loop's (and between the two baselines). Above
  ``--tolerance`` (1e-4) the script prints FAIL and exits with status 1; time is never
  checked.
- ``peak RSS +MiB`` is how far the process's resident memory rose above its level at the
  start of the phase (warm-up and timed runs); see `PeakRss` for how it is measured.
- ``--json PATH`` writes the same figures, with the settings and library versions.

Run: ``python benchmarks/ablation_sweep.py [--prompts 64] [--layers 4] [--heads 8] ...``
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.metadata
import platform
import random
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import parser, set_threads, write_json

import gna_interp as gna

# Private: gna_interp.models.tiny builds random untrained models of any shape (the library has no public builder).
from gna_interp.models.tiny import tiny_model, word_tokenizer

VOCAB_SIZE = 64
FIRST_WORD = 4  # ids 0..3 are <pad> <bos> <eos> <unk>
CORRECT, INCORRECT = 5, 6  # logit_diff(w5, w6) at the last position


class PeakRss:
    """Peak resident memory of this process during a ``with`` block, above its level at entry.

    torch allocates CPU tensors with malloc, outside Python's allocator, so
    ``tracemalloc`` does not see them; resident set size (RSS) does. The process-wide
    peak (``ru_maxrss`` / ``VmHWM``) is a lifetime high-water mark, so a plain
    before/after difference of it says nothing about a phase that stays below an earlier
    peak. On Linux the high-water mark is reset at entry (writing ``5`` to
    ``/proc/self/clear_refs``) and read back from ``VmHWM`` at exit, so ``extra_mib`` is
    the phase's own peak minus the RSS it started from (``exact = True``). ``VmHWM`` is
    used rather than ``ru_maxrss`` because ``ru_maxrss`` also counts the peak of the
    parent's memory when this process was started by vfork + exec. Where the reset is not
    available, ``extra_mib`` is how far the phase raised the lifetime ``ru_maxrss``
    (``exact = False``: a lower bound, 0 if an earlier phase peaked higher).
    """

    def __enter__(self) -> PeakRss:
        gc.collect()
        self.exact = _reset_peak_rss()
        self.start_mib = _status_mib("VmRSS") if self.exact else _ru_maxrss_mib()
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak_mib = _status_mib("VmHWM") if self.exact else _ru_maxrss_mib()
        self.extra_mib = max(0.0, self.peak_mib - self.start_mib)


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_mib("VmHWM") > 0
    except OSError:
        return False


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    return 0.0


def _ru_maxrss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def make_prompts(n: int, length: int, seed: int) -> list[str]:
    """``n`` prompts of random words; the tokenizer prepends ``<bos>``, so each has
    ``length - 3`` to ``length`` tokens (unequal, so left padding is exercised)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(FIRST_WORD, VOCAB_SIZE)]
    return [" ".join(rng.choices(words, k=rng.randint(max(1, length - 4), max(1, length - 1)))) for _ in range(n)]


def reference_loop(
    hf_model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, metric: Callable, n_heads: int, head_dim: int
) -> tuple[torch.Tensor, float]:
    """``([layer, head] scores, baseline)``: one plain HF forward per zero-ablated head."""
    layers = hf_model.model.layers
    scores = torch.empty(len(layers), n_heads)

    def score() -> float:
        logits = hf_model(input_ids=input_ids, attention_mask=attention_mask).logits
        return float(metric(logits).float().mean())

    with torch.inference_mode():
        baseline = score()
        for layer, block in enumerate(layers):
            for head in range(n_heads):

                def zero_head(module: Any, args: tuple, head: int = head) -> tuple:
                    z = args[0].unflatten(-1, (n_heads, head_dim)).clone()  # [batch, pos, n_heads, head_dim]
                    z[:, :, head] = 0
                    return (z.flatten(-2), *args[1:])

                handle = block.self_attn.o_proj.register_forward_pre_hook(zero_head)
                try:
                    scores[layer, head] = score()
                finally:
                    handle.remove()
    return scores, baseline


def timed(fn: Callable[[], Any], repeats: int) -> tuple[Any, list[float], PeakRss]:
    """The result of ``fn``, the wall time of ``repeats`` runs after one untimed warm-up,
    and the peak memory over all of them."""
    times = []
    with PeakRss() as memory:
        result = fn()
        for _ in range(repeats):
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
    return result, times, memory


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    arguments = parser(__doc__, threads=None, repeats=3)
    arguments.add_argument("--prompts", type=int, default=64, help="number of prompts")
    arguments.add_argument("--prompt-len", type=int, default=24, help="longest prompt, in tokens (<bos> included)")
    arguments.add_argument("--layers", type=int, default=4, help="decoder layers")
    arguments.add_argument("--heads", type=int, default=8, help="query heads per layer")
    arguments.add_argument("--kv-heads", type=int, default=2, help="key/value heads per layer (must divide --heads)")
    arguments.add_argument("--head-dim", type=int, default=8, help="hidden size = heads * head-dim; MLP width = 2 * hidden size")
    arguments.add_argument("--max-rows", type=int, default=None, help="rows per stacked forward; None: gna's memory-budget estimate")
    arguments.add_argument("--seed", type=int, default=0, help="seed of the model weights and the prompts")
    arguments.add_argument("--device", default="cpu", help="where the model runs (e.g. cuda); peak RSS then counts host memory only")
    arguments.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed |score difference| before exiting with 1")
    args = arguments.parse_args(argv)
    for name in ("prompts", "prompt_len", "layers", "heads", "kv_heads", "head_dim", "repeats"):
        if getattr(args, name) < 1:
            arguments.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.heads % args.kv_heads:
        arguments.error(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    hidden = args.heads * args.head_dim
    hf_model = tiny_model(
        "llama",
        seed=args.seed,
        vocab_size=VOCAB_SIZE,
        num_hidden_layers=args.layers,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
    ).to(args.device)
    # Copies before anything boots a bridge: tlens wraps hf_model's modules in place.
    reference_model = copy.deepcopy(hf_model)
    nnsight_hf_model = copy.deepcopy(hf_model)
    tokenizer = word_tokenizer(vocab_size=VOCAB_SIZE)
    models = {
        "tlens": gna.load(hf_model, backend="tlens", tokenizer=tokenizer),
        "nnsight": gna.load(nnsight_hf_model, backend="nnsight", tokenizer=tokenizer),
    }
    prompts = make_prompts(args.prompts, args.prompt_len, args.seed)
    batch = models["tlens"].to_batch(prompts)
    metric = gna.logit_diff(CORRECT, INCORRECT)

    settings = {
        "model": f"tiny random llama: {args.layers} layers x {args.heads} heads ({args.kv_heads} kv), head_dim {args.head_dim}, "
        f"hidden {hidden}, mlp {2 * hidden}, vocab {VOCAB_SIZE}",
        "prompts": args.prompts,
        "tokens": f"{batch.n_pos} (left-padded; {int(batch.attention_mask.sum())} real of {batch.input_ids.numel()})",
        "metric": f"logit_diff({CORRECT}, {INCORRECT}) at the last position, mean over prompts",
        "how": "zero",
        "max_rows": args.max_rows if args.max_rows is not None else "auto (gna memory budget)",
        "repeats": f"best of {args.repeats} after 1 warm-up",
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "device": str(args.device) + (f" ({torch.cuda.get_device_name()})" if str(args.device).startswith("cuda") else ""),
        "seed": args.seed,
    }
    versions = {"python": platform.python_version(), "torch": torch.__version__, "gna_interp": gna.__version__}
    for name in ("transformers", "transformer-lens", "nnsight"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "?"

    (ref_scores, ref_baseline), ref_times, ref_memory = timed(
        lambda: reference_loop(reference_model, batch.input_ids, batch.attention_mask, metric, args.heads, args.head_dim), args.repeats
    )
    max_effect = float((ref_scores - ref_baseline).abs().max())  # 0 would make the comparison vacuous
    loop_blocks = (args.layers * args.heads + 1) * args.prompts * args.layers  # every head, and the baseline, over every block
    limit = 2 * args.layers / (args.layers + 1)  # prefix reuse: head i of layer l costs L - l blocks, (L + 1) / 2 on average
    phases: dict[str, dict[str, Any]] = {
        "loop": {"times_s": ref_times, "memory": ref_memory, "max_abs_effect": max_effect, "block_rows": loop_blocks}
    }
    failed = False
    for backend, model in models.items():
        result, times, memory = timed(
            lambda model=model: gna.ablation_sweep(model, prompts, None, metric, how="zero", batch_size=args.max_rows, progress=False),
            args.repeats,
        )
        with gna.cost_meter(model) as cost:  # one more, untimed run: the block evaluations it makes
            gna.ablation_sweep(model, prompts, None, metric, how="zero", batch_size=args.max_rows, progress=False)
        diff = float((result.scores - ref_scores).abs().max())
        diff = diff if diff == diff else float("inf")  # NaN (a head not swept) counts as a failure
        baseline_diff = abs(result.baseline - ref_baseline)
        ok = max(diff, baseline_diff) <= args.tolerance
        failed |= not ok
        phases[backend] = {
            "times_s": times,
            "memory": memory,
            "loop_over_batched": min(ref_times) / min(times),
            "block_rows": cost.block_rows,
            "loop_over_batched_blocks": loop_blocks / cost.block_rows,
            "max_abs_diff_scores": diff,
            "abs_diff_baseline": baseline_diff,
            "ok": ok,
        }

    print("settings")
    for key, value in settings.items():
        print(f"  {key:22} {value}")
    print(f"  {'versions':22} " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    exact = all(p["memory"].exact for p in phases.values())
    memory_note = "phase peak minus RSS at phase start" if exact else "rise of the lifetime ru_maxrss: a lower bound"
    header = f"{'phase':8} {'best s':>8} {'loop/batched':>13} {'limit':>6} {'blocks':>7} {'max |diff|':>11} {'baseline diff':>14}"
    print(f"\n{header} {'peak RSS +MiB':>14}  all s")
    for name, phase in phases.items():
        ratio = f"{phase['loop_over_batched']:.2f}x" if "loop_over_batched" in phase else "-"
        bound = f"{limit:.2f}x" if "loop_over_batched" in phase else "-"
        blocks = f"{phase['loop_over_batched_blocks']:.2f}x" if "loop_over_batched_blocks" in phase else "-"
        diff = f"{phase['max_abs_diff_scores']:.2e}" if "max_abs_diff_scores" in phase else "-"
        baseline_diff = f"{phase['abs_diff_baseline']:.2e}" if "abs_diff_baseline" in phase else "-"
        all_s = " ".join(f"{t:.4f}" for t in phase["times_s"])
        best, extra = min(phase["times_s"]), phase["memory"].extra_mib
        print(f"{name:8} {best:8.4f} {ratio:>13} {bound:>6} {blocks:>7} {diff:>11} {baseline_diff:>14} {extra:14.1f}  {all_s}")
    print(f"(peak RSS +MiB: {memory_note}; process peak RSS overall {max(p['memory'].peak_mib for p in phases.values()):.0f} MiB)")
    print(
        f"limit: 2L/(L+1) = {limit:.2f}x, the loop's block evaluations over the batched sweep's with prefix reuse (L = {args.layers}); "
        "blocks: that ratio as counted by gna.cost_meter (the rest of a ratio above it is per-call overhead saved by stacking)"
    )
    print(f"\nheads swept: {args.layers * args.heads}; baseline metric {ref_baseline:.6f}")
    for name in models:
        worst = max(phases[name]["max_abs_diff_scores"], phases[name]["abs_diff_baseline"])
        verdict = "OK" if phases[name]["ok"] else "FAIL"
        print(f"{name}: {verdict} (largest |difference| from the loop {worst:.3e}, tolerance {args.tolerance:g})")

    if args.json is not None:
        figures = {
            "settings": settings,
            "versions": versions,
            "memory_measure": memory_note,
            "baseline_metric": ref_baseline,
            "limit": limit,
            "phases": {
                name: {
                    **{k: v for k, v in phase.items() if k != "memory"},
                    "best_s": min(phase["times_s"]),
                    "peak_rss_extra_mib": phase["memory"].extra_mib,
                    "peak_rss_mib": phase["memory"].peak_mib,
                }
                for name, phase in phases.items()
            },
            "ok": not failed,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, figures, indent=2)
        print(f"figures written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
