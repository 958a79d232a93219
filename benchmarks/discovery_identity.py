"""Identity check for refactors of `gna.discover`: run it on every bundled toy and dump the
circuit, field for field, so two versions of the code can be diffed.

For each toy of ``gna.zoo.toy_names()`` (or ``--toys``): ``discover(load_toy(name),
toy_task(name, n), progress=False)``, and with ``--remote`` the same under nnsight's
``remote="local"`` simulation of NDIF for the toys named there. Each circuit's
``to_dict()`` (``cost["seconds"]`` and ``cost["peak_memory_mb"]`` removed: wall time and
sampled memory differ between runs of the same code) is
written to ``OUT/<toy>[-remote].json``. Run it before and after a change and diff::

    python benchmarks/discovery_identity.py /tmp/before
    python benchmarks/discovery_identity.py /tmp/after
    python benchmarks/discovery_identity.py --compare /tmp/before /tmp/after

``--resume`` also checks ``discover(..., run_dir=...)``: each run cut back after each of its
stages and resumed must give the same circuit, cost included (`resumed`).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import gna_interp as gna

MEASURED = ("seconds", "peak_memory_mb")
"""Cost fields that differ between runs of the same code (wall time, sampled memory): not compared."""


def circuit_dict(circuit: Any) -> dict[str, Any]:
    """``circuit.to_dict()`` without the wall time and peak memory (`MEASURED`)."""
    data = circuit.to_dict()
    for key in MEASURED:
        (data.get("cost") or {}).pop(key, None)
    return data


def resumed(model: Any, task: Any, plain: dict[str, Any]) -> str:
    """``discover(..., run_dir=...)`` cut back after each stage and resumed, against ``plain``
    (the circuit without a run directory): the folder's later stages deleted, and its memo
    either kept whole (the later stages' accuracies owed) or cut to the stages kept (as a
    kill at the stage's end leaves it). Returns ``"k of k identical"`` or what differed."""
    import tempfile

    bad, tried = [], 0
    with tempfile.TemporaryDirectory() as folder:
        first = circuit_dict(gna.discover(model, task, progress=False, run_dir=folder))
        if first != plain:
            return "the run with a run_dir differs from the plain run"
        saved = {p.name: p.read_bytes() for p in Path(folder).iterdir()}
        stages = sorted(name for name in saved if name.startswith("stage-"))
        for cut in range(len(stages)):
            for memo_cut in (False, True):
                for name in stages[cut:]:
                    (Path(folder) / name).unlink(missing_ok=True)
                memo = json.loads((Path(folder) / "memo.json").read_text())
                if memo_cut:  # the entries of the stages kept: [key, value, stage, counts]
                    memo["entries"] = [row for row in memo["entries"] if row[2] < int(stages[cut][6:8])]
                (Path(folder) / "memo.json").write_text(json.dumps(memo))
                tried += 1
                again = circuit_dict(gna.discover(model, task, progress=False, run_dir=folder))
                if again != plain:
                    fields = sorted(k for k in plain if plain[k] != again.get(k))
                    bad.append(f"after {stages[cut]} (memo {'cut' if memo_cut else 'whole'}): {fields}")
                for name, data in saved.items():  # back to the finished run
                    (Path(folder) / name).write_bytes(data)
    return f"{tried} of {tried} resumed runs identical" if not bad else "; ".join(bad)


def run(out: Path, toys: list[str], remote: list[str], n: int, resume: bool = False) -> None:
    """Discover on each toy (and remotely on the ``remote`` ones), one JSON file each; with
    ``resume``, also cut back after each stage and resumed (`resumed`)."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(name, False) for name in toys] + [(name, True) for name in remote]
    for name, simulated in jobs:
        model = gna.load_toy(name)
        if simulated:
            model = gna.load(copy.deepcopy(model.hf_model), tokenizer=model.tokenizer, remote="local")
            model.name = f"toy-{name}"
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            circuit = gna.discover(model, gna.toy_task(name, n=n), progress=False)
        data = circuit_dict(circuit)
        tag = f"{name}-remote" if simulated else name
        (out / f"{tag}.json").write_text(json.dumps(data, indent=1, sort_keys=True))
        cost = data.get("cost", {})
        print(f"{tag}: {time.perf_counter() - started:.1f}s passes={cost.get('passes')} forwards={cost.get('forwards')}", flush=True)
        if resume:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                print(f"{tag}: resume: {resumed(model, gna.toy_task(name, n=n), data)}", flush=True)


def compare(before: Path, after: Path) -> int:
    """Per file: identical, or the top-level fields that differ. Returns the number differing."""
    differing = 0
    for path in sorted(before.glob("*.json")):
        other = after / path.name
        if not other.exists():
            print(f"{path.stem}: missing in {after}")
            differing += 1
            continue
        a, b = json.loads(path.read_text()), json.loads(other.read_text())
        for data in (a, b):
            for key in MEASURED:
                (data.get("cost") or {}).pop(key, None)
        fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        passes = (a.get("cost", {}).get("passes"), b.get("cost", {}).get("passes"))
        print(f"{path.stem}: {'identical' if not fields else 'DIFFERS in ' + ', '.join(fields)} (passes {passes[0]} -> {passes[1]})")
        differing += bool(fields)
    return differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the JSON files (or, with --compare, the 'before' folder)")
    parser.add_argument("after", type=Path, nargs="?", help="with --compare: the 'after' folder")
    parser.add_argument("--compare", action="store_true", help="diff two folders instead of running")
    parser.add_argument("--toys", nargs="*", default=None, help="toys to run locally (default: every bundled toy)")
    parser.add_argument("--remote", nargs="*", default=["llama", "mamba2"], help="toys to also run under remote='local'")
    parser.add_argument("-n", type=int, default=64, help="prompts per task")
    parser.add_argument("--resume", action="store_true", help="also resume each run after each of its stages (run_dir)")
    args = parser.parse_args()
    if args.compare:
        sys.exit(1 if compare(args.out, args.after) else 0)
    run(args.out, gna.zoo.toy_names() if args.toys is None else args.toys, args.remote, args.n, args.resume)


if __name__ == "__main__":
    main()
