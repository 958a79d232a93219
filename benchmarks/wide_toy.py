"""Benchmark: building and running a wide deep Mamba-1 toy at Falcon-Mamba-like scale.

What is measured
----------------
``gna_interp.zoo.deep.deep_toy(toy, --layers, width=--width)``: the toy's 2 layers of
128 trained channels placed among live filler channels, ``--width`` channels in every
layer (Falcon-Mamba-7B: 8,192 per layer, 64 layers; default here 4,096 x 32). Reported:

- ``build s``: wall time of `deep_toy` (HF initialisation of every filler weight included);
- ``params``: parameters of the wide model, and its float32 size;
- ``peak RSS MiB``: the process's peak resident memory after building and one forward
  (``ru_maxrss``: includes Python, torch and the toy);
- ``forward s``: one forward over ``--prompts`` prompts of the toy's task (HF's reference
  PyTorch scan on CPU: no Mamba kernels there);
- with ``--accuracy``, the toy's and the wide model's accuracy on those prompts and the
  largest change of a final-position logit.

``toy`` is a bundled Mamba-1 toy or a trained toy's folder (``gna-interp zoo train mamba
--out DIR``).

Run: ``python benchmarks/wide_toy.py [--toy mamba] [--width 4096] [--layers 32]
[--prompts 200] [--accuracy] [--json PATH]``
"""

from __future__ import annotations

import resource
import time

from _common import parser, set_threads, write_json

import gna_interp as gna

# Private: gna_interp.zoo.deep builds the wide copy of a toy this benchmark measures (no public builder).
from gna_interp.zoo.deep import FILLER_SCALE, deep_toy


def main() -> None:
    arguments = parser(__doc__, threads=1)
    arguments.add_argument("--toy", default="mamba")
    arguments.add_argument("--width", type=int, default=4096)
    arguments.add_argument("--layers", type=int, default=32)
    arguments.add_argument("--prompts", type=int, default=200)
    arguments.add_argument("--filler-scale", type=float, default=FILLER_SCALE)
    arguments.add_argument("--accuracy", action="store_true")
    args = arguments.parse_args()
    set_threads(args.threads)
    start = time.perf_counter()
    wide = deep_toy(args.toy, args.layers, width=args.width, filler_scale=args.filler_scale)
    built = time.perf_counter() - start
    params = sum(p.numel() for p in wide.hf_model.parameters())
    task = gna.toy_task(args.toy, args.prompts, seed=4242)
    start = time.perf_counter()
    logits = wide.logits(task)
    forward = time.perf_counter() - start
    row = {
        "toy": str(args.toy),
        "width": args.width,
        "layers": args.layers,
        "filler_scale": args.filler_scale,
        "build_s": round(built, 2),
        "params": params,
        "float32_mib": round(params * 4 / 2**20, 1),
        "forward_s": round(forward, 2),
        "prompts": args.prompts,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if args.accuracy:
        toy = gna.load(str(gna.zoo.store.toy_path(args.toy))) if args.toy in gna.toy_names() else gna.load(str(args.toy))
        row["toy_accuracy"] = gna.evaluate(toy, task, progress=False).accuracy
        row["wide_accuracy"] = gna.evaluate(wide, task, progress=False).accuracy
        row["max_final_logit_change"] = float((logits[:, -1] - toy.logits(task)[:, -1]).abs().max())
    print(" ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        write_json(args.json, row)


if __name__ == "__main__":
    main()
