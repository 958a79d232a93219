"""Time per toy of `gna-interp demo`, before and after issue 53's cut, side by side in one run.

Each toy's share of the demo (load, discovery, faithfulness curve: `gna_interp.demo.run_toy`)
runs under the two settings, alternating toy by toy so that both see the same machine load:

- before: torch's own thread count (what ``make demo`` got: one per core), 200 prompts for
  every toy, the faithfulness curve at every n up to 32 heads, else 24 sizes
  (`faithfulness_curve`'s default);
- after: one torch thread (`DEMO_THREADS`), the demo's prompts per toy (`demo_prompts`), the
  curve at doubling sizes (`curve_sizes`).

Per toy: wall and CPU seconds (this process's, ``time.process_time``) and their ratios, the
toy's row of the demo table under each (the same circuit), then the whole demo, end to end in
a fresh interpreter (``--quiet``), with its CPU time (its processes') and, as the demo runs its
slowest toy in a second process, what an idle 2-core machine would take: the longer of the
two processes' CPU time. The load average is printed at the start and at the end.

    python benchmarks/demo_time.py [--n 200] [--toys llama mamba2 falcon_h1 mamba] [--markdown]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

from _common import parser

# Private: the demo's own per-toy run and settings (gna_interp.demo), timed as the demo runs them.
from gna_interp.demo import DEMO_APART, DEMO_MODELS, DEMO_PROMPTS, DEMO_THREADS, curve_sizes, demo_prompts, run_toy, torch_threads


def every_size(n_heads: int) -> None:
    """The curve before the cut: `faithfulness_curve`'s default sizes."""
    return None


def toy_times(name: str, n: int, threads: int, sizes) -> tuple[float, float, str, int]:
    """``(wall s, CPU s, the toy's table row, curve points)`` of one toy's share of the demo."""
    from gna_interp.viz.summary import stream_widths, summary_row_lines

    with torch_threads(threads):
        run = run_toy(name, n, progress=False, sizes=sizes)
    row = summary_row_lines(run.circuit, run.curve, stream_widths([f"toy-{m}" for m in DEMO_MODELS]))[0]
    return run.seconds, run.cpu_seconds, row, len(run.curve.sizes) if run.curve is not None else 0


def timed_run(command: list[str]) -> tuple[float, float]:
    """``(wall s, CPU s of the command's processes, its children's included)`` of ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{command} failed:\n{result.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


START_UP = "from gna_interp.zoo import load_toy; [load_toy(name) for name in ('llama', 'mamba')]"
"""What each of the demo's processes does before its first toy: import, load a toy of each backend."""


def toy_table(toys: list[str], n: int | None, before_threads: int) -> dict[str, float]:
    """Print each toy's times before and after (a markdown table) and its rows; the CPU
    seconds of each toy after."""
    prompts = demo_prompts(toys, n)
    head = "| toy | n before -> after | wall before (s) | wall after (s) | wall ratio | CPU before (s) | CPU after (s) | CPU ratio |"
    print(head + " curve points |\n|" + "---|" * head.count("|"))
    rows, totals, after_cpu = [], [0.0, 0.0, 0.0, 0.0], {}
    for name in toys:
        after = toy_times(name, prompts[name], DEMO_THREADS, curve_sizes)
        before = toy_times(name, n or DEMO_PROMPTS, before_threads, every_size)
        figures = (before[0], after[0], before[1], after[1])
        totals = [t + f for t, f in zip(totals, figures, strict=True)]
        ratios = f"{before[0] / after[0]:.2f} | {before[1]:.1f} | {after[1]:.1f} | {before[1] / after[1]:.2f}"
        print(
            f"| {name} | {n or DEMO_PROMPTS} -> {prompts[name]} | {before[0]:.1f} | {after[0]:.1f} | {ratios} | {before[3]} -> {after[3]} |"
        )
        rows.append((before[2], after[2]))
        after_cpu[name] = after[1]
    w0, w1, c0, c1 = totals
    print(f"| all | | {w0:.1f} | {w1:.1f} | {w0 / w1:.2f} | {c0:.1f} | {c1:.1f} | {c0 / c1:.2f} | |\n")
    print("each toy's row of the demo table (its first line), before then after:\n```")
    print("\n".join(line for pair in rows for line in pair) + "\n```")
    return after_cpu


def main() -> None:
    arguments = parser(__doc__, threads=False, json_file=False)
    arguments.add_argument("--n", type=int, default=None, help="prompts per toy, before and after (default: 200 before, the demo's after)")
    arguments.add_argument("--toys", nargs="+", default=list(DEMO_MODELS), help="toys (default: the demo's)")
    arguments.add_argument("--before-threads", type=int, default=None, help="torch threads before (default: torch's own choice)")
    arguments.add_argument("--no-whole", action="store_true", help="skip the end-to-end run of the demo")
    args = arguments.parse_args()
    import torch

    before_threads = args.before_threads or torch.get_num_threads()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start; torch's threads {torch.get_num_threads()}")
    print(f"before: {before_threads} thread(s), every size; after: {DEMO_THREADS} thread(s), doubling sizes\n")
    run_toy(args.toys[0], 8, progress=False)  # imports and first loads, outside every toy's time
    after_cpu = toy_table(args.toys, args.n, before_threads)
    _, start_up = timed_run([sys.executable, "-c", START_UP])
    apart = sum(c for name, c in after_cpu.items() if name in DEMO_APART)
    first = sum(c for name, c in after_cpu.items() if name not in DEMO_APART)
    print(
        f"\nstart-up of a process (import, load a toy): {start_up:.1f} s CPU. On an idle 2-core machine the demo takes about "
        f"{start_up + max(first, apart):.0f} s (start-up + the longer of its two processes' toys: {first:.1f} s here, "
        f"{apart:.1f} s in the second; the report adds a second or two); on one core about {start_up + first + apart:.0f} s"
    )
    if not args.no_whole:
        with tempfile.TemporaryDirectory() as folder:
            given = ["--n", str(args.n)] if args.n else []
            wall, cpu = timed_run([sys.executable, "-m", "gna_interp.cli", "demo", "--quiet", "--out", folder, *given])
        print(f"whole demo (gna-interp demo --quiet {' '.join(given)}), as loaded: {wall:.1f} s wall, {cpu:.1f} s CPU in its processes")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
