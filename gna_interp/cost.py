"""`cost_meter`: what a computation cost, counted where every forward goes through.

Every forward of a `GnaModel` goes through its backend's ``run``; the backend charges
each forward to every meter open on that model (nested meters all count). A meter counts:

- ``forwards``: backend forward calls;
- ``rows``: prompt rows forwarded (a forward of ``k`` stacked copies of a 64-row batch
  counts ``64 k``);
- ``block_rows``: rows x blocks actually evaluated. A forward that starts at block ``k``
  from a given residual stream (prefix reuse, `gna_interp.core.plan.Plan.start`) counts
  ``L - k`` blocks per row; a skipped block that still runs (its output replaced) counts;
- ``requests``: remote round trips, on NDIF or under ``remote="local"``'s simulation (one
  per trace, or one per session holding many traces);
- ``backwards`` / ``backward_block_rows``: backward passes (attribution) and the rows x
  blocks they went back through (a backward costs about two forwards of the same size).

``passes(n_prompts)`` is ``block_rows / (n_prompts * L)``: the cost in full forward passes
over the task.

A meter also records the peak memory the block added, ``peak_memory_mb`` (MiB, above what
was in use when the block began), and how, ``memory_source``:

- ``"cuda"`` (a model on a GPU): ``torch.cuda.max_memory_allocated`` above
  ``memory_allocated`` at entry, the allocator's exact peak of live tensors (not its cache).
  Nested meters each keep their own peak (an inner one folds the peak so far into every open
  meter before it resets the counter).
- ``"rss"`` (CPU): the process's resident memory, sampled every ``SAMPLE_SECONDS`` (1 ms) by a
  background thread from ``/proc/self/statm`` (Linux; elsewhere ``psutil`` if installed),
  above the resident memory at entry (freed heap memory is first returned to the system,
  glibc's ``malloc_trim``, so that reused free memory is not missed; no ``gc.collect()``: it
  takes about 0.6 s in a process that has imported transformers, and garbage cycles only raise
  the baseline, not the peak above it). Resolution: a page, and
  the sampling period: memory held for less than a millisecond or two may be missed. It
  counts the whole process (other threads' allocations too). ``resource.getrusage``'s
  ``ru_maxrss`` cannot do this: it is the process's lifetime maximum, blind to a block
  that follows a bigger one.
- ``""``, ``peak_memory_mb`` ``None``: no way to read it (not Linux, no ``psutil``).

Example::

    with gna.cost_meter(model) as cost:
        gna.discover(model, task)
    print(cost.forwards, cost.passes(len(task)))
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .core.errors import GnaTypeError, GnaValueError

COUNTS = ("forwards", "rows", "block_rows", "requests", "backwards", "backward_block_rows")
SAMPLE_SECONDS = 0.001
"""How often the CPU meter samples resident memory."""


@dataclass(eq=False)
class Cost:
    """Counts of one metered computation (see the module docs)."""

    n_layers: int
    forwards: int = 0
    rows: int = 0
    block_rows: int = 0
    requests: int = 0
    backwards: int = 0
    backward_block_rows: int = 0
    peak_memory_mb: float | None = None
    """Peak memory added during the block, MiB (module docs); ``None`` while the block runs."""
    memory_source: str = ""
    """``"cuda"`` (allocator peak), ``"rss"`` (sampled resident memory) or ``""`` (none)."""

    def passes(self, n_prompts: int) -> float:
        """``block_rows / (n_prompts * n_layers)``: full forward passes over ``n_prompts`` rows."""
        if n_prompts < 1:
            raise GnaValueError(f"n_prompts={n_prompts} must be >= 1")
        return self.block_rows / (n_prompts * max(1, self.n_layers))

    def add(self, **counts: int) -> None:
        for name, value in counts.items():
            setattr(self, name, getattr(self, name) + int(value))

    def to_dict(self, n_prompts: int | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {name: getattr(self, name) for name in COUNTS}
        data["n_layers"] = self.n_layers
        data["peak_memory_mb"] = self.peak_memory_mb
        data["memory_source"] = self.memory_source
        if n_prompts is not None:
            data["n_prompts"] = n_prompts
            data["passes"] = self.passes(n_prompts)
        return data

    def describe(self, n_prompts: int) -> str:
        text = f"{self.forwards} forwards, {self.rows} rows, {self.passes(n_prompts):.1f} passes, {self.requests} requests"
        if self.backwards:
            text += f", {self.backwards} backward(s) over {self.backward_block_rows / (n_prompts * max(1, self.n_layers)):.1f} passes"
        if self.peak_memory_mb is not None:
            text += f", peak memory +{self.peak_memory_mb:.0f} MiB ({self.memory_source})"
        return text


def _meters(backend: Any) -> list[Cost]:
    meters = getattr(backend, "_cost_meters", None)
    if meters is None:
        meters = []
        backend._cost_meters = meters
    return meters


def charge(backend: Any, **counts: int) -> None:
    """Add ``counts`` to every meter open on ``backend`` (called by the backends)."""
    for meter in getattr(backend, "_cost_meters", ()):
        meter.add(**counts)


def charge_forward(backend: Any, rows: int, start_layer: int, n_layers: int, request: bool = False) -> None:
    """One forward of ``rows`` rows that evaluates blocks ``start_layer .. n_layers - 1``."""
    charge(backend, forwards=1, rows=rows, block_rows=rows * (n_layers - start_layer), requests=int(request))


@contextmanager
def uncharged(model: Any) -> Iterator[None]:
    """Inside the block, nothing run through ``model`` is charged to the meters open on it
    (`cost_meter`); they count again on exit, exceptions included (a meter opened inside
    the block is detached then too)."""
    meters = getattr(getattr(model, "backend", None), "_cost_meters", None)
    held = list(meters) if meters is not None else []
    if meters is not None:
        meters.clear()
    try:
        yield
    finally:
        if meters is not None:
            meters[:] = held


@contextmanager
def tally(model: Any, into: dict[str, dict[str, float]], part: str, n_prompts: int) -> Iterator[None]:
    """Add what the block runs through ``model`` (a `GnaModel`) to ``into[part]``: the counts of
    `COUNTS` and ``passes`` over ``n_prompts`` prompts, summed where the part runs twice. A
    bare meter (no memory sampled), detached on exit, exceptions included. Parts run one after
    another: a part opened inside itself would count its inner block twice."""
    if isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1:
        raise GnaValueError(f"tally: n_prompts={n_prompts!r}: expected a positive number of prompts")
    meter = Cost(n_layers=int(model.n_layers))
    meters = _meters(model.backend)
    meters.append(meter)
    try:
        yield
    finally:
        meters[:] = [other for other in meters if other is not meter]
        held = into.get(part, {})
        meter.add(**{name: int(held.get(name, 0)) for name in COUNTS})  # a part met again adds up
        into[part] = counts_and_passes(meter, n_prompts)


def counts_and_passes(cost: Cost, n_prompts: int) -> dict[str, Any]:
    """``cost``'s counts (`COUNTS`) and its ``passes`` over ``n_prompts`` prompts, as a plain dict
    (the per-stage and per-part entries of a circuit's cost)."""
    return {name: getattr(cost, name) for name in COUNTS} | {"passes": cost.passes(n_prompts)}


@contextmanager
def cost_meter(model: Any) -> Iterator[Cost]:
    """Count the forwards, rows, block evaluations and remote requests of everything run
    through ``model`` inside the block (see the module docs). Meters nest: each counts
    everything inside it. The meter is detached on exit, exceptions included."""
    backend = getattr(model, "backend", None)
    if backend is None:
        hint = (
            f"; load it first: gna.load_toy({model!r}) or gna.load({model!r})"
            if isinstance(model, str)
            else " (gna.load or gna.load_toy returns one)"
        )
        shown = repr(model) if len(repr(model)) <= 80 else repr(model)[:77] + "..."
        raise GnaTypeError(f"cost_meter: model={shown} ({type(model).__name__}): expected a gna_interp GnaModel{hint}")
    meter = Cost(n_layers=int(model.n_layers))
    meters = _meters(backend)
    meters.append(meter)
    try:
        with _peak_memory(meter, str(getattr(model, "device", "cpu"))):
            yield meter
    finally:
        meters[:] = [other for other in meters if other is not meter]


_open_cuda: list[list[int]] = []
"""``[peak so far]`` of every open CUDA meter (an inner meter's reset folds into them)."""


@contextmanager
def _peak_memory(meter: Cost, device: str) -> Iterator[None]:
    """Set ``meter.peak_memory_mb`` / ``memory_source`` to the peak memory the block adds
    (module docs), exceptions included."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()
        for peak in _open_cuda:  # fold the peak so far into the open meters before the reset
            peak[0] = max(peak[0], torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
        start, mine = torch.cuda.memory_allocated(), [0]
        _open_cuda.append(mine)
        try:
            yield
        finally:
            torch.cuda.synchronize()
            _open_cuda.remove(mine)
            meter.peak_memory_mb = (max(mine[0], torch.cuda.max_memory_allocated()) - start) / 2**20
            meter.memory_source = "cuda"
        return
    read = _rss_reader()
    if read is None:
        yield
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc: freed heap memory back to the system first
    start = read()
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_SECONDS):
            peak[0] = max(peak[0], read())

    sampler = threading.Thread(target=sample, name="gna-cost-meter-rss", daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        meter.peak_memory_mb = max(0, max(peak[0], read()) - start) / 2**20
        meter.memory_source = "rss"


def _rss_reader() -> Callable[[], int] | None:
    """A function returning the process's resident memory in bytes, or ``None``."""
    if os.path.exists("/proc/self/statm"):
        page = os.sysconf("SC_PAGE_SIZE")

        def statm() -> int:
            with open("/proc/self/statm", "rb") as handle:
                return int(handle.read().split()[1]) * page

        return statm
    try:
        import psutil  # type: ignore[import-untyped]
    except ImportError:
        return None
    process = psutil.Process()
    return lambda: int(process.memory_info().rss)
