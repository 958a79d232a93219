"""Many forwards at once: one request on a remote nnsight model, one forward each elsewhere.

`run_jobs` runs a list of `Job` (`gna_interp.backends.jobs`) in order:

- on a remote nnsight model (NDIF, or ``remote="local"``'s simulation), as traces of one
  nnsight session per request (`NNsightBackend.run_many`, chunked by payload): a prefix
  or source captured by one job is used by later jobs on the server, never sent back
  and forth, and only what ``keep`` asks for comes back;
- elsewhere, one forward each, through `GnaModel.run_plan` (so an open
  `GnaModel.prefix_cache` applies), references resolved from the earlier outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backends.base import RunOutput
from ..backends.jobs import Job, kept, resolved
from ..core.errors import GnaValueError
from ..core.inputs import Batch
from ..core.plan import Plan, Read, Ref, Site, SiteKind
from .handle import GnaModel
from .prefix import PrefixCache


def is_batched_remote(model: GnaModel) -> bool:
    """Whether `run_jobs` sends the model's jobs as session requests."""
    return model.is_remote and hasattr(model.backend, "run_many")


def run_jobs(model: GnaModel, jobs: Sequence[Job]) -> list[RunOutput | None]:
    """The outputs of ``jobs``, in order (``None`` for ``keep=0``); see the module docs."""
    for index, job in enumerate(jobs):
        if job.keep not in (0, 1, 2, 3):
            raise GnaValueError(f"job {index}: keep={job.keep!r}, expected 0, 1, 2 or 3")
        start = job.plan.start
        if start is not None and isinstance(start[1], Ref) and not 0 <= start[1].job < index:
            raise GnaValueError(f"job {index} starts from job {start[1].job}'s capture: a job can use only an earlier job's")
    if is_batched_remote(model):
        return model.backend.run_many(jobs)  # type: ignore[no-any-return]
    full: list[RunOutput] = []
    outputs: list[RunOutput | None] = []
    for job in jobs:
        plan = resolved(job.plan, full)
        last = 0 if job.keep == 1 else 1  # keep 0 / 2 / 3: the final position's logits alone are computed
        out = model.run_plan(job.batch, plan, job.capture, logits_to_keep=last, reads=job.reads)  # reads: from a held prefix only
        full.append(out)
        outputs.append(kept(out, job.keep))
    return outputs


class JobList:
    """Jobs collected, then run together by `run_jobs`, with prefix reuse on the server.

    On a remote nnsight model every added job whose edits all sit at layer ``>= k``
    starts from the clean residual at ``k`` of its batch, captured by one clean job per
    distinct batch at the head of the request (kept on the server). Elsewhere jobs run as
    added (an open `GnaModel.prefix_cache` gives the same reuse locally).
    """

    def __init__(self, model: GnaModel) -> None:
        self.model = model
        self.jobs: list[Job] = []

    def add(self, batch: Batch, plan: Plan, capture: frozenset[Site] = frozenset(), reads: tuple[Read, ...] = (), keep: int = 1) -> int:
        """Queue a forward; returns its index into `run`'s outputs."""
        self.jobs.append(Job(batch, plan, capture, reads, keep))
        return len(self.jobs) - 1

    def run(self) -> list[RunOutput | None]:
        if not is_batched_remote(self.model):
            return run_jobs(self.model, self.jobs)
        n_layers = self.model.n_layers
        starts: list[tuple[int, int] | None] = []
        needed: dict[bytes, tuple[Batch, set[int]]] = {}
        for job in self.jobs:
            first, resume = job.plan.reusable_start(n_layers, job.capture)
            if job.reads or job.plan.start is not None or first == 0:
                starts.append(None)
                continue
            starts.append((first, resume))
            needed.setdefault(_batch_key(job.batch), (job.batch, set()))[1].add(first)
        clean = {key: index for index, key in enumerate(needed)}
        jobs = [Job(batch, Plan(), frozenset(Site(SiteKind.RESID, layer) for layer in layers), keep=0) for batch, layers in needed.values()]
        for job, start in zip(self.jobs, starts, strict=True):
            if start is not None:
                first, resume = start
                ref = Ref(clean[_batch_key(job.batch)], Site(SiteKind.RESID, first))
                job = Job(
                    job.batch, Plan(edits=job.plan.edits, skips=job.plan.skips, start=(resume, ref)), job.capture, job.reads, job.keep
                )
            jobs.append(job)
        return run_jobs(self.model, jobs)[len(needed) :]


def _batch_key(batch: Batch) -> bytes:
    return PrefixCache.key(batch)
