"""A `Job`: one forward of a list that runs together (`gna_interp.models.jobs.run_jobs`).

A job is a batch, a `Plan`, the sites to capture, the reads. Its plan may start from a
`Ref`: the residual an earlier job of the same list captures. A backend that runs many
jobs in one request (`NNsightBackend.run_many`) resolves those references with `resolved`.

``keep``: ``0`` nothing comes back (a prefix or source for later jobs; ``None`` in the
outputs); ``1`` the logits and the captures; ``2`` the final position's logits only,
shaped ``[batch, 1, vocab]``, no captures (what single-token scoring reads; far less to
download from a server); ``3`` the captures and the final position's logits (a metric of the
final position over captured runs, as path patching's clean and corrupt runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import Tensor

from ..core.inputs import Batch
from ..core.plan import Plan, Read, Ref, Site
from .base import RunOutput


@dataclass
class Job:
    batch: Batch
    plan: Plan
    capture: frozenset[Site] = field(default_factory=frozenset)
    reads: tuple[Read, ...] = ()
    keep: int = 1
    """``0`` nothing back, ``1`` logits and captures, ``2`` final logits only, ``3`` captures and
    final logits (module docs)."""


def resolved(plan: Plan, outputs: Sequence[RunOutput]) -> Plan:
    """``plan`` with a `Ref` start replaced by the captured tensor it names."""
    if plan.start is None or not isinstance(plan.start[1], Ref):
        return plan
    layer, ref = plan.start
    assert isinstance(ref, Ref)
    value = outputs[ref.job].acts[ref.site]
    return Plan(edits=plan.edits, skips=plan.skips, start=(layer, tile(value, ref.copies)))


def tile(value: Tensor, copies: int) -> Tensor:
    return value if copies == 1 else value.repeat(copies, *([1] * (value.dim() - 1)))


def kept(out: RunOutput, keep: int) -> RunOutput | None:
    if keep == 0:
        return None
    if keep == 2:
        return RunOutput(logits=out.logits[:, -1:])
    if keep == 3:
        return RunOutput(logits=out.logits[:, -1:], acts=out.acts, reads=out.reads)
    return out
