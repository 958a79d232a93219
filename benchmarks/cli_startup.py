"""How fast the command line and the library answer, next to what the interpreter itself costs.

Each case runs in a fresh interpreter (``repeats`` times; the median is reported), side by
side with two references measured in the same run: a bare ``python -c pass`` (the floor no
command can beat) and ``import torch`` (what every command that computes pays):

- ``--help``: ``gna-interp --help`` (imports no torch: the namespace is lazy);
- ``bad head``: ``gna-interp ablate --model llama --head 7.9``, refused from the toy's
  ``config.json`` before anything heavy is imported;
- ``dead hub``: ``gna.load("no-such-org/no-such-model")`` with the hub at a local port
  nothing listens on (``HF_ENDPOINT``), i.e. a machine without network: one probe, then a
  clear error (the time includes importing torch and transformers).

Usage: ``python benchmarks/cli_startup.py [--repeats 5] [--json out.json]``. The numbers
are wall-clock times of this machine as it is (load from other jobs shows up in them).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from _common import parser, write_json

CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "python -c pass (floor)": (["-c", "pass"], {}),
    "import torch (reference)": (["-c", "import torch"], {}),
    "gna-interp --help": (["-m", "gna_interp.cli", "--help"], {}),
    "bad head (ablate --head 7.9)": (["-m", "gna_interp.cli", "ablate", "--model", "llama", "--head", "7.9"], {}),
    "dead hub (gna.load)": (
        ["-c", "import gna_interp as gna\ntry:\n    gna.load('no-such-org/no-such-model')\nexcept OSError as e:\n    print(e)"],
        {"HF_ENDPOINT": "http://127.0.0.1:9"},
    ),
}
EXPECTED = {"bad head (ablate --head 7.9)": "layer 7 out of range", "dead hub (gna.load)": "cannot load 'no-such-org/no-such-model'"}


def seconds(args: list[str], env: dict[str, str], expect: str | None) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, env={**os.environ, **env})
    elapsed = time.perf_counter() - start
    if expect is not None and expect not in result.stdout + result.stderr:
        raise SystemExit(f"{args}: expected {expect!r} in the output, got:\n{result.stdout}\n{result.stderr}")
    return elapsed


def main() -> None:
    arguments = parser(__doc__, threads=False)
    arguments.add_argument("--repeats", type=int, default=5, help="fresh interpreters per case; the median is reported")
    args = arguments.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):  # interleaved: every case sees the same load
        for name, (command, env) in CASES.items():
            times[name].append(seconds(command, env, EXPECTED.get(name)))
    medians = {name: statistics.median(values) for name, values in times.items()}
    floor = medians["python -c pass (floor)"]
    torch_import = medians["import torch (reference)"]
    print(f"median of {args.repeats}, fresh interpreter each")
    for name, value in medians.items():
        print(f"{name:32s} {value:7.2f} s   {value / floor:6.1f} x the bare interpreter   {value / torch_import:5.2f} x import torch")
    write_json(args.json, {"repeats": args.repeats, "median_seconds": medians})


if __name__ == "__main__":
    main()
