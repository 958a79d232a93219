"""Wall time of `gna-interp demo` (the README's main command), end to end in a subprocess.

Target: at most 30 s on an idle 2-core machine (issue 53; per toy: demo_time.py). Prints the time of each run and the median.

    python benchmarks/demo.py --runs 3
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time

from _common import parser


def main() -> None:
    arguments = parser(__doc__, threads=False, json_file=False)
    arguments.add_argument("--runs", type=int, default=3)
    args = arguments.parse_args()
    times = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            result = subprocess.run(
                [sys.executable, "-m", "gna_interp.cli", "demo", "--quiet", "--out", folder], capture_output=True, text=True
            )
            times.append(time.perf_counter() - start)
        if result.returncode != 0:
            sys.exit(f"demo failed:\n{result.stderr[-2000:]}")
        print(f"run {run + 1}: {times[-1]:.1f} s")
    print(f"gna-interp demo: median {statistics.median(times):.1f} s over {args.runs} runs (target <= 30 s on an idle 2-core machine)")


if __name__ == "__main__":
    main()
