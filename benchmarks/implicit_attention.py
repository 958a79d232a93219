"""Benchmark: implicit attention of SSM heads at T = 1024.

What is compared
----------------
Two tiny random 2-layer SSMs (nothing downloaded), layer 1 of each, every head of that layer,
on ``--prompts`` left-padded prompts of random token ids (the longest ``--seq-len`` tokens,
each next one 24 shorter):

- Mamba-2: hidden 32, 4 heads x 16, state 8, 2 groups, chunk size 64.
- Mamba-1: hidden 32, expand 2 -> 64 channels (64 heads), state 16.

For each, one forward reads the layer's ``SSMInputs`` (``gna.attention.ssm_inputs``;
timed as ``read``), and then:

``full``
    ``implicit_rows`` for every query row: the ``[batch, head, T, T]`` matrix.
``rows``
    ``implicit_rows`` for one query row per prompt (its final token): ``[batch, head, 1, T]``.
``loop``
    ``implicit_loop``, the step-by-step twin (one Python iteration per recurrence step,
    ``T (T + 1) / 2`` steps per call). At T = 1024 a full call takes minutes, so only
    ``--loop-keys`` key columns, evenly spaced, are run; a column ``s`` costs ``T - s``
    steps of equal work, so the full time is estimated as the sampled time times
    (all steps / sampled steps). The output says so, and checks the sampled columns
    against ``full``.
``e2e full`` / ``e2e rows``
    ``gna.attention_pattern`` end to end (forward included), full matrix and
    ``query_positions=[-1]``.

How to read the output
----------------------
Memory first, then time, for each model:

- ``peak +MiB``: one run of the phase, the process's peak resident memory above its level
  at the start, sampled every millisecond by a thread (see `PeakRss`), with glibc's default
  allocator (large tensors get fresh pages and give them back when freed).
- ``best s``: the fastest of ``--repeats`` runs after one warm-up (the loop twin: one
  run), with glibc told to keep freed memory for reuse (`reuse_memory`), as a long-running
  process's allocator does. On the machine the documented figures come from, touching a
  fresh page is very slow, and without this the time of small phases measured the
  allocator's page churn (e.g. 0.47 s instead of 0.02 s for Mamba-1's rows) rather than
  the computation. ``--no-reuse-memory`` turns it off.

``max |diff|`` compares ``rows`` and ``loop`` with the same entries of ``full``; above
``--tolerance`` the script prints FAIL and exits 1.

Run: ``python benchmarks/implicit_attention.py [--seq-len 1024] [--prompts 2] [--loop-keys 16]``
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import os
import platform
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import best_of, parser, set_threads, write_json

import gna_interp as gna
from gna_interp.attention import implicit_loop, implicit_rows, ssm_inputs

# Private: gna_interp.models.tiny builds random untrained models of any shape (the library has no public builder).
from gna_interp.models.tiny import tiny_model, word_tokenizer

MODELS = {
    "mamba2": dict(hidden_size=32, num_heads=4, head_dim=16, state_size=8, n_groups=2, chunk_size=64),
    "mamba": dict(hidden_size=32, expand=2, state_size=16),
}
LAYER = 1
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


class PeakRss:
    """Peak resident memory during a ``with`` block, above the level at entry.

    A background thread samples ``/proc/self/statm`` every millisecond (a peak shorter than
    that can be missed). The kernel's own high-water mark is not used: resetting it
    (``/proc/self/clear_refs``) made every later memory access slower on the machine the
    figures come from, which would distort the timings.
    """

    def __enter__(self) -> PeakRss:
        gc.collect()
        self.start = self.peak = _rss_mib()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, _rss_mib())

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.extra_mib = max(0.0, max(self.peak, _rss_mib()) - self.start)


def _rss_mib() -> float:
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def reuse_memory(on: bool) -> bool:
    """glibc: keep freed memory for reuse (``on``) or restore the defaults and give it
    back. Returns False where this is not glibc (nothing is changed then)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        threshold = (1 << 30) if on else 128 * 1024
        ok = libc.mallopt(M_MMAP_THRESHOLD, threshold) == 1 and libc.mallopt(M_TRIM_THRESHOLD, threshold) == 1
        if not on:
            libc.malloc_trim(0)
        return ok
    except (OSError, AttributeError):
        return False


def peak_mib(fn: Callable[[], Any]) -> float:
    with PeakRss() as memory:
        fn()
    return memory.extra_mib


def prompts(n: int, seq_len: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 64, (seq_len - 24 * i,), generator=g).tolist() for i in range(n)]


def bench(family: str, args: argparse.Namespace) -> dict[str, Any]:
    model = gna.load(tiny_model(family, seed=args.seed, **MODELS[family]), tokenizer=word_tokenizer())
    inputs = prompts(args.prompts, args.seq_len, args.seed)
    heads = [gna.Head(LAYER, h) for h in range(model.n_heads)]
    ssm = ssm_inputs(model, inputs, LAYER)
    n_rows, n_pos, _ = ssm.dt.shape
    every = torch.arange(n_pos).expand(n_rows, n_pos)
    final = torch.full((n_rows, 1), n_pos - 1)
    phases: dict[str, Callable[[], Any]] = {
        "read": lambda: ssm_inputs(model, inputs, LAYER),
        "full": lambda: implicit_rows(ssm, every),
        "rows": lambda: implicit_rows(ssm, final),
        "e2e_full": lambda: gna.attention_pattern(model, inputs, heads),
        "e2e_rows": lambda: gna.attention_pattern(model, inputs, heads, query_positions=[-1]),
    }
    mib = {name: peak_mib(fn) for name, fn in phases.items()}
    reused = args.reuse_memory and reuse_memory(True)
    try:
        seconds = {name: best_of(fn, args.repeats)[0] for name, fn in phases.items()}
        full, rows = phases["full"](), phases["rows"]()
        keys = torch.linspace(0, n_pos - 1, args.loop_keys).round().long().tolist()
        loop_sample_s, loop = best_of(lambda: implicit_loop(ssm, keys=keys), 1, warmup=False)
    finally:
        if reused:
            reuse_memory(False)
    scale = (n_pos * (n_pos + 1) / 2) / sum(n_pos - s for s in keys)
    read_s, full_s, rows_s, e2e_full_s, e2e_rows_s = (seconds[name] for name in phases)
    full_mib, rows_mib, e2e_full_mib, e2e_rows_mib = mib["full"], mib["rows"], mib["e2e_full"], mib["e2e_rows"]
    return {
        "model": f"{family}: {model.n_heads} heads x {model.head_dim}, state {ssm.B.shape[-1]}, layer {LAYER} of {model.n_layers}",
        "reuse_memory": reused,
        "shape": [n_rows, model.n_heads, n_pos, n_pos],
        "read_s": read_s,
        "full_s": full_s,
        "read_mib": mib["read"],
        "full_mib": full_mib,
        "rows_s": rows_s,
        "rows_mib": rows_mib,
        "loop_sample_s": loop_sample_s,
        "loop_keys": len(keys),
        "loop_estimated_s": loop_sample_s * scale,
        "loop_over_full": loop_sample_s * scale / full_s,
        "full_over_rows_time": full_s / rows_s,
        "e2e_full_s": e2e_full_s,
        "e2e_full_mib": e2e_full_mib,
        "e2e_rows_s": e2e_rows_s,
        "e2e_rows_mib": e2e_rows_mib,
        "rows_max_diff": float((rows[:, :, 0] - full[:, :, -1]).abs().max()),
        "loop_max_diff": float((loop[..., keys] - full[..., keys]).abs().max()),
        "max_abs_value": float(full.abs().max()),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    arguments = parser(__doc__, threads=None, repeats=5)
    arguments.add_argument("--seq-len", type=int, default=1024)
    arguments.add_argument("--prompts", type=int, default=2)
    arguments.add_argument("--loop-keys", type=int, default=16, help="key columns the loop twin runs (its time is scaled)")
    arguments.add_argument("--seed", type=int, default=0)
    arguments.add_argument("--tolerance", type=float, default=1e-5)
    arguments.add_argument("--no-reuse-memory", dest="reuse_memory", action="store_false", help="time with glibc's default allocator")
    return arguments.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, python {platform.python_version()}, T = {args.seq_len}")
    results = {family: bench(family, args) for family in MODELS}
    failed = False
    for r in results.values():
        ok = max(r["rows_max_diff"], r["loop_max_diff"]) <= args.tolerance * max(1.0, r["max_abs_value"])
        failed |= not ok
        print(f"\n{r['model']}; patterns {r['shape']} (left-padded); times with reuse_memory={r['reuse_memory']}")
        print(f"  read (one forward + SSM inputs)   {r['read_s']:8.3f} s   peak +{r['read_mib']:7.1f} MiB")
        print(f"  full   vectorised                 {r['full_s']:8.3f} s   peak +{r['full_mib']:7.1f} MiB")
        rows = f"  rows   vectorised, 1 row/prompt   {r['rows_s']:8.4f} s   peak +{r['rows_mib']:7.1f} MiB"
        print(f"{rows}   full/rows {r['full_over_rows_time']:.0f}x")
        print(
            f"  loop   twin, {r['loop_keys']} of {r['shape'][-1]} key columns {r['loop_sample_s']:8.2f} s -> "
            f"estimated full {r['loop_estimated_s']:.1f} s   loop/full {r['loop_over_full']:.0f}x (scaled by step count)"
        )
        print(f"  e2e    attention_pattern full     {r['e2e_full_s']:8.3f} s   peak +{r['e2e_full_mib']:7.1f} MiB")
        print(f"  e2e    attention_pattern [-1]     {r['e2e_rows_s']:8.3f} s   peak +{r['e2e_rows_mib']:7.1f} MiB")
        print(f"  max |diff| rows vs full {r['rows_max_diff']:.1e}, loop vs full {r['loop_max_diff']:.1e}  {'ok' if ok else 'FAIL'}")
    if args.json is not None:
        write_json(args.json, {"settings": vars(args) | {"json": str(args.json)}, "results": results}, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
