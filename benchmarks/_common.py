"""What every benchmark script shares: its argument parser's common flags, the thread
setting, best-of-N timing, one rank correlation, the toy case of the attribution
benchmarks, and the JSON results file.

The scripts run as ``python benchmarks/NAME.py`` (the Makefile, the docs and
tests/test_benchmarks.py call them so): Python puts a script's own folder first on
``sys.path``, so ``import _common`` finds this file with no path manipulation. Public
gna_interp API only; torch and gna_interp are imported when a function needs them (the
start-up benchmarks time fresh interpreters and import neither).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def parser(
    doc: str | None, *, threads: int | bool | None = 1, repeats: int | None = None, json_file: bool = True
) -> argparse.ArgumentParser:
    """An argument parser described by ``doc``'s first paragraph, with the shared flags:
    ``--threads`` (default ``threads``; ``None``: torch's own choice; ``False``: no flag, for
    scripts that time other interpreters), ``--repeats`` (when ``repeats`` is given: timed
    runs after one warm-up, the best is reported) and ``--json PATH``."""
    made = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if threads is not False:
        made.add_argument("--threads", type=int, default=threads, help="torch.set_num_threads (default: %(default)s; None: torch's choice)")
    if repeats is not None:
        made.add_argument("--repeats", type=int, default=repeats, help="timed runs after one warm-up; the best is reported")
    if json_file:
        made.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures to this JSON file")
    return made


def set_threads(threads: int | None) -> None:
    """``torch.set_num_threads(threads)``; ``None`` leaves torch's own choice."""
    import torch

    if threads is not None:
        if threads < 1:
            raise SystemExit(f"--threads {threads}: expected a positive number of threads")
        torch.set_num_threads(threads)


def best_of(fn: Callable[[], Any], repeats: int, *, warmup: bool = True) -> tuple[float, Any]:
    """The best wall time (seconds, ``time.perf_counter``) of ``repeats`` calls of ``fn``
    after one untimed warm-up call, and the last call's result."""
    result = fn() if warmup else None
    best = float("inf")
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def best_of_each(
    calls: dict[str, Callable[[], Any]], repeats: int, *, alternate: bool = False, warmup: bool = True
) -> tuple[dict[str, float], dict[str, Any]]:
    """Interleaved best-of-N: each round times every call once (so every call sees the
    same machine load), ``alternate`` reversing the order every other round; after one
    untimed warm-up round. Returns the best seconds and the last result of each call."""
    results = {name: call() for name, call in calls.items()} if warmup else {}
    best = dict.fromkeys(calls, float("inf"))
    for repeat in range(max(repeats, 1)):
        order = list(reversed(calls)) if alternate and repeat % 2 else list(calls)
        for name in order:
            start = time.perf_counter()
            results[name] = calls[name]()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two tensors (flattened; continuous values: no ties to
    average), in float64; NaN when either is constant (nothing to rank)."""
    a, b = a.flatten(), b.flatten()
    if bool((a == a[0]).all()) or bool((b == b[0]).all()):
        return float("nan")
    ra, rb = (x.argsort().argsort().double() for x in (a, b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def write_json(path: Path | str | None, figures: Any, *, indent: int = 1) -> None:
    """Write ``figures`` to ``path`` as JSON (ending in a newline); ``None``: nothing."""
    if path is not None:
        Path(path).write_text(json.dumps(figures, indent=indent) + "\n")


def toy_case(name: str, n: int, seed: int, backend: str | None = None) -> tuple[str, Any, Any, Any, Callable]:
    """A bundled toy model on fresh prompts of its own task; corrupt = the options rotated
    (``task.corrupted()``); metric = logit of the correct letter minus the corrupt
    prompt's. Returns ``(label, model, clean task, corrupt task, metric)``."""
    import torch

    import gna_interp as gna

    task = gna.toy_task(name, n, seed=seed)
    corrupt = task.corrupted(seed=seed)
    encoded, corrupt_encoded = task.encode(), corrupt.encode()
    rows = torch.arange(n)
    right = encoded.candidate_ids[rows, encoded.correct]
    wrong = corrupt_encoded.candidate_ids[rows, corrupt_encoded.correct]
    label = f"toy-{name} (trained{', ' + backend if backend else ''})"
    return label, gna.load_toy(name, **({"backend": backend} if backend else {})), task, corrupt, gna.logit_diff(right, wrong)


def word_pairs(n: int, length: int, seed: int) -> tuple[list[str], list[str]]:
    """Random-word prompts (``length`` words) and copies with every third word replaced."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(7, 64)]
    clean = [[rng.choice(words) for _ in range(length)] for _ in range(n)]
    corrupt = [[rng.choice(words) if i % 3 == 1 else w for i, w in enumerate(row)] for row in clean]
    return [" ".join(row) for row in clean], [" ".join(row) for row in corrupt]
