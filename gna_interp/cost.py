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

Example::

    with gna.cost_meter(model) as cost:
        gna.discover(model, task)
    print(cost.forwards, cost.passes(len(task)))
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .core.errors import GnaTypeError, GnaValueError

COUNTS = ("forwards", "rows", "block_rows", "requests", "backwards", "backward_block_rows")


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
        if n_prompts is not None:
            data["n_prompts"] = n_prompts
            data["passes"] = self.passes(n_prompts)
        return data

    def describe(self, n_prompts: int) -> str:
        text = f"{self.forwards} forwards, {self.rows} rows, {self.passes(n_prompts):.1f} passes, {self.requests} requests"
        if self.backwards:
            text += f", {self.backwards} backward(s) over {self.backward_block_rows / (n_prompts * max(1, self.n_layers)):.1f} passes"
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
        yield meter
    finally:
        meters[:] = [other for other in meters if other is not meter]
