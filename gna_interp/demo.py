"""``gna-interp demo``: G&A discovery on the four label-reading toys, each toy's row of the
summary table printed as soon as that toy is done, then each circuit's lines and the offline
report.

Time: on a machine of two cores or more, the slowest toy (`DEMO_APART`) runs in a second
process beside the others, every process on one torch thread (`DEMO_THREADS`), the two
slowest toys on fewer prompts (`DEMO_TOY_PROMPTS`), and the faithfulness curve has a point per
doubling of the heads kept (`curve_sizes`). Per toy,
before and after: ``benchmarks/results/demo_time.md`` (``benchmarks/demo_time.py``). Nothing
heavy is imported at module level: the CLI's parser reads the constants below.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEMO_PROMPTS = 200
"""Prompts per toy in the demo (but `DEMO_TOY_PROMPTS`), and ``discover --task toy``'s default."""
DEMO_TOY_PROMPTS = {"falcon_h1": 100, "mamba": 150}
"""Fewer prompts for the two slowest toys, one in each process: the hybrid (half its time) and
the Mamba-1 toy (on 100 prompts its circuit changes: it is kept at 150). Their rows against
200 prompts: ``benchmarks/results/demo_time.md``."""
DEMO_SEED = 2026
DEMO_MODELS = ("llama", "mamba2", "falcon_h1", "mamba")
"""The bundled toy models the demo runs: a Transformer, two SSMs (Mamba-2 heads, Mamba-1 channels) and a hybrid."""
DEMO_APART = ("mamba",)
"""Toys run in a second process while the others run in the first (on a machine of at
least two cores): the slowest (128 channels a layer), about as long as the other three."""
DEMO_THREADS = 1
"""torch threads in each of the demo's processes: the toys' forwards are too small to share
between threads, and two threads on a busy 2-core machine spent several times the CPU of one."""
DEMO_SECONDS = 28
"""The demo's expected wall time on an idle 2-core machine at the default prompts (from its
processes' CPU time, ``benchmarks/results/demo_time.md``), printed before it starts."""


def demo_prompts(names: list[str], n: int | None = None) -> dict[str, int]:
    """Prompts per toy: ``n`` for every toy when given, else `DEMO_TOY_PROMPTS` or `DEMO_PROMPTS`."""
    return {name: n or DEMO_TOY_PROMPTS.get(name, DEMO_PROMPTS) for name in names}


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def curve_sizes(n_heads: int) -> list[int]:
    """The demo's faithfulness curve: the top 1, 2, 4, 8, ... heads kept (`faithfulness_curve`
    adds 0 and every head): a point per doubling, not one per n."""
    return [1 << k for k in range(max(n_heads, 1).bit_length()) if 1 << k < n_heads]


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` for the block, restored after it (exceptions included)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class ToyRun:
    """One toy's share of the demo: the toy's name, its circuit, model and task, its faithfulness curve (None
    for a circuit without heads) with the curve's cost (`cost.Cost`), and the time each part took.

    ``seconds`` / ``cpu_seconds``: wall and process CPU time from loading the toy to the end
    of its curve; ``discovery_seconds`` and ``curve_seconds``: wall time of those two parts."""

    name: str
    circuit: Any
    model: Any
    task: Any
    curve: Any
    curve_cost: Any
    seconds: float
    cpu_seconds: float
    discovery_seconds: float
    curve_seconds: float


def run_toy(name: str, n: int, *, progress: bool, sizes: Callable[[int], list[int] | None] = curve_sizes) -> ToyRun:
    """Discovery on toy ``name`` over ``n`` prompts of its task (seed `DEMO_SEED`), then its
    circuit's faithfulness curve (`discovery.report_inputs.circuit_faithfulness`) at
    ``sizes(number of heads)`` (None: `faithfulness_curve`'s default, every n up to 32 heads)."""
    from .cost import cost_meter
    from .discovery import discover
    from .discovery.report_inputs import circuit_faithfulness
    from .zoo import load_toy, toy_task

    start, cpu = time.perf_counter(), time.process_time()
    model, task = load_toy(name), toy_task(name, n, seed=DEMO_SEED)
    with warnings.catch_warnings():  # the circuit keeps its notes; printed below the table
        warnings.simplefilter("ignore")
        circuit = discover(model, task, progress=progress)
    found = time.perf_counter()
    with cost_meter(model) as cost:
        curve = circuit_faithfulness(circuit, model, task, sizes=sizes(len(model.heads)), progress=progress)
    end = time.perf_counter()
    return ToyRun(name, circuit, model, task, curve, cost, end - start, time.process_time() - cpu, found - start, end - found)


def faithfulness_line(circuit: Any, curve: Any, forwards: int, passes: float, seconds: float) -> str:
    """What ``circuit``'s heads carry alone (``curve``'s circuit point, against clean and every
    head ablated), and what its curve cost: ``forwards``, ``passes`` over the task, ``seconds``."""
    from .scoring.carries import carries_from_curve

    alone = curve.circuit_point["accuracy"]
    carried = carries_from_curve(curve)
    discovery = f" (discovery: {circuit.cost['passes']:.1f})" if circuit.cost and "passes" in circuit.cost else ""
    return (
        f"{circuit.model}: faithfulness: the circuit's {len(curve.circuit)} heads alone (every other head mean-ablated) "
        f"{alone:.3f}, {curve.of_clean(alone):.0%} of clean {curve.clean['accuracy']:.3f} (every head ablated "
        f"{curve.ablated['accuracy']:.3f}); curve of {len(curve.sizes)} sizes: {forwards} forwards, "
        f"{passes:.1f} passes{discovery}, {seconds:.1f} s"
        + ("" if carried is None or circuit.mechanism == "none" else f"; carries {carried.text}")
    )


def circuit_lines(circuit: Any) -> list[str]:
    """The demo's lines under the table for one circuit: its headline, each role's heads, each
    need, its path patching and its notes."""
    lines = [f"{circuit.model}: {circuit.headline()}"] if circuit.mechanism is not None else []
    lines += [f"{circuit.model}: {circuit.role_name(r)} {circuit.describe_role(r)}" for r in ("gather", "aggregate") if getattr(circuit, r)]
    lines += [f"{circuit.model}: {need.describe(circuit.role_name(role))}" for role, need in circuit.needs.items()]
    if circuit.path_patching is not None:
        lines.append(f"{circuit.model}: path patching {circuit.describe_path()}")
    return lines + [f"{circuit.model}: note: {note}" for note in circuit.warnings]


def run_demo(prompts: dict[str, int], out: Path, *, progress: bool, estimate: bool = True) -> list[ToyRun]:
    """The demo on the toys of ``prompts`` (name -> prompts), printed as it goes: the expected
    time (``estimate``: the run is at the default prompts), the table's header, each toy's row
    when that toy is done, then `print_after` and the report written to ``out``. The toys of
    `DEMO_APART` run in a second process when there are two cores; a line on stderr names each
    toy as this process starts it (``progress``)."""
    from .viz.summary import stream_widths, summary_header, summary_row_lines

    start = time.perf_counter()
    apart = [name for name in prompts if name in DEMO_APART] if cores() >= 2 else []
    expected = f"about {DEMO_SECONDS} s on an idle 2-core machine" + ("" if estimate else " at the default prompts")
    toys = ", ".join(f"{name} ({n} prompts{', second process' if name in apart else ''})" for name, n in prompts.items())
    print(f"demo: {len(prompts)} toys, {expected}: {toys}", flush=True)
    widths = stream_widths([f"toy-{name}" for name in prompts])
    print("\n".join(summary_header(widths)), flush=True)
    runs = []
    with torch_threads(DEMO_THREADS), second_process(apart, prompts) as pending:
        for name, n in prompts.items():
            if name in pending:
                if progress and not pending[name].done():
                    print(f"waiting for toy {name} (second process) ...", file=sys.stderr, flush=True)
                runs.append(_with_model(pending[name].result(), name, n))
            else:
                if progress:
                    print(f"discovering G&A heads in toy {name} ({n} prompts) ...", file=sys.stderr, flush=True)
                runs.append(run_toy(name, n, progress=progress))
            print("\n".join(summary_row_lines(runs[-1].circuit, runs[-1].curve, widths)), flush=True)
        index = print_after(runs, out, apart)
    print(f"\nreport: {index} (opens offline); the demo took {time.perf_counter() - start:.1f} s")
    return runs


def print_after(runs: list[ToyRun], out: Path, apart: list[str]) -> Path:
    """What follows the table's rows: its legend, the time per toy, each circuit's faithfulness
    and lines, the evidence rule; then the report, written to ``out`` (its index page returned)."""
    from .viz.report import write_report
    from .viz.summary import summary_legend

    circuits = [run.circuit for run in runs]
    curves = {run.circuit.model: run.curve for run in runs if run.curve is not None}
    print("\n".join(summary_legend(circuits, curves)))
    times = [f"{run.circuit.model} {run.seconds:.1f} s" + (" (second process)" if run.name in apart else "") for run in runs]
    print(f"time per toy (load, discovery, faithfulness curve): {', '.join(times)}\n")
    for run in runs:
        if run.curve is not None and run.curve.circuit_point is not None:
            passes = run.curve_cost.passes(len(run.task))
            print(faithfulness_line(run.circuit, run.curve, run.curve_cost.forwards, passes, run.curve_seconds))
        for line in circuit_lines(run.circuit):
            print(line)
    for rule in dict.fromkeys(c.evidence_rule() for c in circuits if c.gather or c.aggregate):
        print(f"\nevidence: {rule}")
    return write_report([(run.circuit, run.model, run.task) for run in runs], out, faithfulness=curves)


@contextlib.contextmanager
def second_process(names: list[str], prompts: dict[str, int]) -> Iterator[dict[str, Any]]:
    """``{name: future ToyRun}``: the toys ``names`` run one after another in a second (spawned)
    process (`run_apart`), started now; ``{}`` when ``names`` is empty. The process ends with
    the block; on an exception it is stopped rather than waited for."""
    if not names:
        yield {}
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield {name: pool.submit(run_apart, name, prompts[name]) for name in names}
    except BaseException:
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()  # its toy will not be read
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_apart(name: str, n: int) -> ToyRun:
    """`run_toy` in the second process: no bars, transformers' logs silenced, `DEMO_THREADS`
    threads. Its model and task are not sent back (`_with_model` rebuilds them)."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    with torch_threads(DEMO_THREADS):
        run = run_toy(name, n, progress=False)
    run.model = run.task = None
    return run


def _with_model(run: ToyRun, name: str, n: int) -> ToyRun:
    """A toy run from the second process with its model and task, loaded again here (the same
    weights, the same ``n`` prompts of seed `DEMO_SEED`) for the report."""
    from .zoo import load_toy, toy_task

    run.model, run.task = load_toy(name), toy_task(name, n, seed=DEMO_SEED)
    return run
