"""Benchmark: a Mamba-2 config's ``chunk_size`` against the time of a head sweep on CPU.

What is compared
----------------
One tiny random Mamba-2 (``--layers`` layers, ``--heads`` heads of 16 channels, state 16) is
built with the same weights at each ``chunk_size`` in ``--chunk-sizes`` (HF's default is 256;
real checkpoints such as ``state-spaces/mamba2-*`` use 256 too). Each runs
``gna.ablation_sweep`` (every head zero-ablated alone) on the same ``--prompts`` prompts of
``--words`` words, through the nnsight backend, on CPU, where HF's pure-torch scan runs.

Why it matters
--------------
HF's torch scan pads the sequence up to a multiple of ``chunk_size`` and builds a
``[chunk, chunk]`` decay matrix per chunk and head. For a prompt of T tokens, T < chunk,
the work inside chunks grows with ``chunk_size ** 2`` rather than ``T ** 2``. ``limit`` is
that ratio for the padded lengths, ``(pad(T, c) * c) / (pad(T, 32) * 32)``: the most the
intra-chunk work can differ. The MLP-free model makes the scan most of the forward, so the
measured ratio approaches it; in a real model projections take a share.

How to read the output
----------------------
- ``best`` is the fastest of ``--repeats`` timed runs after one warm-up (wall clock).
- ``/c32`` is that time over ``chunk_size=32``'s.
- ``max |diff|`` compares every chunk size's ``[layer, head]`` table with ``chunk_size=32``'s:
  the chunked scan is exact in arithmetic, so only rounding differs. Above ``--tolerance``
  the script prints FAIL and exits 1; time is never checked.
- ``--json PATH`` writes the same figures, with the settings and library versions.

Run: ``python benchmarks/mamba2_chunk_size.py [--prompts 16] [--words 24]``
"""

from __future__ import annotations

import math
import platform
import sys
import time

import torch
from _common import parser, write_json

import gna_interp as gna

# Private: gna_interp.models.tiny builds random untrained models of any shape (the library has no public builder).
from gna_interp.models.tiny import tiny_model, word_tokenizer


def padded(length: int, chunk: int) -> int:
    return math.ceil(length / chunk) * chunk


def main(argv: list[str] | None = None) -> int:
    arguments = parser(__doc__, threads=1, repeats=3)
    arguments.add_argument("--chunk-sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    arguments.add_argument("--prompts", type=int, default=16)
    arguments.add_argument("--words", type=int, default=24)
    arguments.add_argument("--layers", type=int, default=2)
    arguments.add_argument("--heads", type=int, default=8)
    arguments.add_argument("--tolerance", type=float, default=1e-4)
    args = arguments.parse_args(argv)
    if 32 not in args.chunk_sizes:
        arguments.error("--chunk-sizes must include 32 (the reference)")
    gna.set_progress(False)
    torch.set_grad_enabled(False)
    generator = torch.Generator().manual_seed(0)
    words = torch.randint(4, 64, (args.prompts, args.words), generator=generator)
    prompts = [" ".join(f"w{int(i)}" for i in row) for row in words]
    tokenizer = word_tokenizer()
    length = args.words + 1  # <bos>
    fields = dict(hidden_size=16 * args.heads // 2, num_heads=args.heads, head_dim=16, state_size=16, n_groups=1, expand=2)
    fields["num_hidden_layers"] = args.layers
    metric = gna.logit_diff(5, 6)
    tables, times = {}, {}
    for chunk in sorted(args.chunk_sizes):
        hf = tiny_model("mamba2", seed=0, chunk_size=chunk, **fields)
        model = gna.load(hf, backend="nnsight", tokenizer=tokenizer)
        gna.ablation_sweep(model, prompts, None, metric)  # warm-up
        runs = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = gna.ablation_sweep(model, prompts, None, metric)
            runs.append(time.perf_counter() - start)
        tables[chunk], times[chunk] = result.scores, runs
    shape = f"{args.layers} layers x {args.heads} heads, {args.prompts} prompts x {length} tokens"
    print(f"Mamba-2, {shape}, CPU, {torch.get_num_threads()} threads")
    print(f"{'chunk_size':>10} {'best s':>8} {'/c32':>6} {'limit':>6} {'max |diff|':>11}  all")
    failed = False
    reference = min(times[32])
    rows = []
    for chunk in sorted(args.chunk_sizes):
        diff = float((tables[chunk] - tables[32]).abs().max())
        failed |= diff > args.tolerance
        limit = padded(length, chunk) * chunk / (padded(length, 32) * 32)
        runs = ", ".join(f"{t:.3f}" for t in times[chunk])
        print(f"{chunk:>10} {min(times[chunk]):>8.3f} {min(times[chunk]) / reference:>6.1f} {limit:>6.1f} {diff:>11.2e}  {runs}")
        best = min(times[chunk])
        rows.append(dict(chunk_size=chunk, best_s=best, runs_s=times[chunk], ratio=best / reference, limit=limit, max_diff=diff))
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        versions = dict(torch=torch.__version__, python=platform.python_version(), gna_interp=gna.__version__)
        max_abs_score = float(tables[32].abs().max())
        write_json(args.json, dict(settings=settings, versions=versions, tokens=length, max_abs_score=max_abs_score, rows=rows), indent=2)
    if failed:
        print(f"FAIL: a table differs from chunk_size=32's by more than {args.tolerance}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
