"""`discover`: find, label and confirm the Gather and Aggregate heads of a model.

The stages follow the paper's procedure (causal, not by attention scores), then label
roles from the patterns and confirm them:

1. **baseline**: task accuracy; below `stages.retrieval_floor` there is no retrieval to
   explain (warning; ``mechanism`` ``"none"``, and discovery stops there).
   On multiple-choice tasks, also the accuracy with each prompt's labels shuffled: near
   chance there, the model answers by the option's place, not by its label (warning;
   ``mechanism`` ``"counting"``: the heads found are named counting heads).
2. **truncation scan** and critical layer (`layer_scans.truncation_scan`).
3. **layer scan**: leave one layer out.
4. **head scan**: single-head zero-ablation of the candidate layers (every layer by
   default); adaptive group testing where a layer has very many heads (`group_testing.group_testing`).
5. **entry**: where each candidate's effect enters: accuracy with the head ablated only
   at the final position, and only on the segment tokens.
6. **roles**: pattern scores of the examined heads (`roles`); labels from the entry
   shares (or the patterns alone without the entry stage), by `RoleThresholds`.
7. **joint**: per role, a greedy search over the heads of the role's layers, ablated
   together at the role's positions (final position / segments), for the set that
   collapses accuracy: it adds backup heads, which do little alone because others
   compensate, to the role.
8. **confirmation**: accuracy with the Gather heads ablated, the Aggregate heads, both,
   and with only the G&A heads kept in their layers; per role, how many heads are needed
   to collapse accuracy to chance. A role no set of up to ``max_heads_per_role`` heads
   collapses (an empty one included) is reported with where it enters (`spread_check`).

`stability` re-runs the search on other prompt samples and counts how often each head
is chosen (``discover(..., stability=k)`` records it in the circuit).

Before the stages, `estimate.estimate_passes` says about how many passes they will take
(the stage bar's description; ``circuit.cost["estimate"]``).

The settings are one `DiscoverySettings`; the stages are `plan.PLAN`, carried out by
`plan.run`: each returns its record (`stage_records`), and the circuit is assembled from the
records (`stage_records.assemble`; `discover_records` returns both). With ``run_dir`` each
finished stage's record is saved (`run_dir.RunDir`): a run started again carries on after
the last one.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..core.errors import GnaTypeError, GnaValueError
from ..cost import COUNTS, Cost, cost_meter, counts_and_passes
from ..models.handle import check_model, check_model_and_task
from ..progress import progress_bar
from ..tasks.base import Task
from . import memo, plan
from . import stages as stage
from .circuit import GnaCircuit
from .estimate import StageBar, estimate_passes
from .evidence import ROLES, Stability
from .run_dir import RunDir
from .settings import DiscoverySettings
from .stage_records import Records
from .stages import SEARCH_STAGES

if TYPE_CHECKING:
    from ..models.handle import GnaModel


def discover(
    model: GnaModel,
    task: Task,
    *,
    settings: DiscoverySettings | None = None,
    progress: bool = True,
    stability: int | Sequence[Task] | None = None,
    resamples: int | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> GnaCircuit:
    """Find the G&A heads of ``model`` on ``task``.

    Args:
        model: any `GnaModel` (attention or SSM heads, any backend).
        task: a `Task` with segments (options / dictionary lines).
        settings: what to run (`DiscoverySettings`, where each setting is documented);
            or give its fields as keywords (``discover(model, task, max_candidates=8)``),
            not both. Default: ``DiscoverySettings()``.
        progress: progress bars: one per scan, and `evaluate`'s per-batch bars (its
            default: tasks of more than 4 batches) for the single evaluations of the
            baseline, the label check and the confirmation. ``False``: no bar at all.
        stability: also re-run the search on other prompt samples (`stability`, with
            these settings) and record how often each head is chosen as
            ``circuit.stability``: a number of bootstrap samples of ``task`` (at least
            2), or the sample tasks themselves. ``None`` (default): not measured.
        resamples: ``k`` bootstrap resamples of the prompts (``len(task)`` drawn with
            replacement, seeds ``0..k-1``, `prompt_samples`): the search re-run on each, and
            each head's membership frequency recorded as ``circuit.stability``
            (`Stability.frequency`); a head of the circuit's set below
            `circuit.STABLE_FREQUENCY` is marked in the summary and the report. The same as
            ``stability=k``; give one of the two.
        run_dir: a folder that keeps the run across a crash (`run_dir.RunDir`): each
            finished stage and every accuracy measured is saved there; run again with the
            same model, task and settings, discovery carries on after the last finished
            stage (a finished run's folder gives its circuit without a forward). A folder
            of another model, task or settings is refused, naming what differs.
        options: `DiscoverySettings` fields (an unknown one: `GnaTypeError` with the
            closest names).

    Returns:
        a `GnaCircuit`; its ``cost`` holds what discovery ran (`gna_interp.cost`): forwards,
        rows, block evaluations, passes over the task, remote requests, seconds, and the passes
        estimated before it started (``estimate``: ``low``, ``mid``, ``high``;
        `estimate.estimate_passes`, also in the stage bar's description), and where they went:
        ``stages`` (each stage's counts and passes) and ``confirm`` (the confirmation's parts;
        `GnaCircuit`'s ``cost``). Forwards
        over a batch seen before start from its cached clean prefix (`GnaModel.prefix_cache`).
        A resumed run's counts are the uninterrupted run's (each stage's, summed); its
        ``seconds`` those of the last run.
    """
    check_model_and_task(model, task, "discover")  # a swapped (task, model) named as such
    settings = _settings(settings, options, "discover")
    if resamples is not None:
        if stability is not None:
            raise GnaValueError(f"resamples={resamples!r} and stability={stability!r}: give one of the two (resamples=k is stability=k)")
        _check_k(resamples, "resamples")
        stability = resamples
    if stability is not None:
        _check_samples(stability, "stability")
    with model.prefix_cache(), memo.accuracy_memo(model), cost_meter(model) as cost:
        started = time.perf_counter()
        circuit, records = _run(model, task, settings, progress, run_dir, cost, plan.PLAN)
    spent = Cost(n_layers=cost.n_layers)
    spent.add(**{k: sum(r.cost[k] for r in records) for k in COUNTS})
    spent.peak_memory_mb, spent.memory_source = cost.peak_memory_mb, cost.memory_source
    circuit.cost = {**spent.to_dict(len(task)), "seconds": time.perf_counter() - started, **(circuit.cost or {})}  # + size curves
    circuit.cost["stages"] = stage_costs(records, cost.n_layers, len(task))
    circuit.cost["estimate"] = {k: circuit.settings["estimate"][k] for k in ("low", "mid", "high")}
    if stability is not None:
        circuit.stability = _stability(model, _sample_tasks(task, stability, 0), settings, progress)
    return circuit


def stage_costs(records: Records, n_layers: int, n_prompts: int) -> dict[str, dict[str, Any]]:
    """What each stage run (or read back from a run directory) cost, in `PLAN` order:
    ``{stage: {forwards, rows, block_rows, requests, backwards, backward_block_rows, passes}}``
    (``passes``: its block rows / (prompts x layers)); the stages' sums are ``discover``'s totals."""
    costs = {}
    for record in records:
        spent = Cost(n_layers=n_layers)
        spent.add(**{k: record.cost[k] for k in COUNTS})
        costs[record.stage] = counts_and_passes(spent, n_prompts)
    return costs


def discover_records(
    model: GnaModel,
    task: Task,
    *,
    steps: Sequence[plan.Stage] = plan.PLAN,
    settings: DiscoverySettings | None = None,
    progress: bool = False,
    run_dir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> tuple[GnaCircuit, Records]:
    """`discover`'s stages with their records: the circuit `assemble`d from the records
    (`stage_records.assemble`; without `discover`'s cost summary), and the records, one per
    stage run (`stage_records.Records`: ``records.of(HeadScanRecord)``...). ``steps``:
    `plan.PLAN`, or a plan with a stage of your own (docs/architecture.md, "Add a stage").
    The other arguments as for `discover` (``stages=`` is its setting: the optional stages
    to run); ``run_dir`` keeps these steps' records."""
    check_model_and_task(model, task, "discover_records")
    settings = _settings(settings, options, "discover_records")
    with model.prefix_cache(), memo.accuracy_memo(model), cost_meter(model) as cost:
        return _run(model, task, settings, progress, run_dir, cost, steps)


def _run(
    model: GnaModel,
    task: Task,
    settings: DiscoverySettings,
    progress: bool,
    run_dir: str | os.PathLike[str] | None,
    meter: Cost,
    stages: Sequence[plan.Stage],
) -> tuple[GnaCircuit, Records]:
    """``stages`` carried out (`plan.run`) in the run's context, with the stage bar, in a run
    directory when given (inside the caller's memo, prefix cache and ``meter``)."""
    ctx = _context(model, task, settings, progress, meter)
    saved = None if run_dir is None else RunDir(run_dir, model, task, settings, stages)
    try:
        return plan.run(ctx, meter, saved, stages)
    finally:
        ctx.bar.close()


def _settings(settings: DiscoverySettings | None, options: dict[str, Any], where: str) -> DiscoverySettings:
    """``settings``, or one built from ``options`` (`DiscoverySettings.build`); both: an error."""
    if settings is None:
        return DiscoverySettings.build(where, **options)
    if not isinstance(settings, DiscoverySettings):
        raise GnaTypeError(f"{where}: settings={settings!r} ({type(settings).__name__}): expected a DiscoverySettings")
    if options:
        raise GnaTypeError(
            f"{where}: settings= and setting keywords {sorted(options)} both given: put them in the settings "
            "(dataclasses.replace(settings, ...)), or give keywords alone"
        )
    return settings


def _context(model: GnaModel, task: Task, settings: DiscoverySettings, progress: bool, meter: Cost | None) -> plan.Context:
    """The run's `plan.Context`: the arguments checked (`stage.check_arguments`), the pass
    estimate (`estimate_passes`, in ``circuit.settings["estimate"]``) and the stage bar
    (shown with ``progress`` and a ``meter``)."""
    thresholds, scan_layers = stage.check_arguments(model, task, settings)
    s = settings
    knobs = (s.max_candidates, s.pattern_prompts, s.check_labels, s.screen_above, s.prescreen_above, s.keep)
    estimate = estimate_passes(model, len(task), s.stages, scan_layers, *knobs, kinds=len(s.ablation_kinds))
    bar = StageBar(meter, len(task), show=progress and meter is not None)
    return plan.Context(model, task, settings, thresholds, scan_layers, estimate, bar, progress)


def prompt_samples(task: Task, k: int, seed: int = 0) -> list[Task]:
    """``k`` bootstrap samples of ``task``: sample ``i`` holds ``len(task)`` of its prompts
    drawn with replacement (`torch.randint` with a generator seeded ``seed + i``), with
    the task's tokenizer and corruption rule."""
    _check_k(k, "k")
    out = []
    for i in range(k):
        rows = torch.randint(len(task), (len(task),), generator=torch.Generator().manual_seed(seed + i)).tolist()
        out.append(Task(task.name, [task.examples[r] for r in rows], tokenizer=task.tokenizer, corrupter=task.corrupter))
    return out


def stability(
    model: GnaModel, task: Task | Sequence[Task], k: int | None = None, *, seed: int = 0, progress: bool = True, **options: Any
) -> Stability:
    """How stable the circuit is: the search (`SEARCH_STAGES` of ``discover``) re-run on
    ``k`` prompt samples, and how often each head lands in each role's set.

    Args:
        model: as for `discover`.
        task: a `Task`, of which ``k`` bootstrap samples are drawn (`prompt_samples`), or
            a sequence of tasks, each one sample (e.g. ``toy_task(name, 200, seed=s)`` for
            several ``s``).
        k: samples (at least 2; default 5 for a task, the number given for a sequence).
        seed: the first bootstrap sample's seed.
        progress: one bar over the samples (the re-runs draw none).
        options: `discover`'s settings (``stages``, ``thresholds``, ...); stages that do
            not choose heads (truncation, confirmation) are skipped, and so is the label check.

    Returns:
        `Stability`: ``counts`` (``[role, layer, head]`` tensor), ``to_frame()`` (one row per
        head chosen at least once), each sample's sets and their ``sizes(role)``.

    Example::

        found = gna.discovery.stability(model, task, k=5)
        found.to_frame()                  # head, gather, aggregate (samples of 5), shares
    """
    check_model(model, "stability")
    if isinstance(task, Task):
        samples: int | Sequence[Task] = 5 if k is None else k
        _check_samples(samples, "k")
    else:
        _check_samples(task, "task")
        samples = task
        if k is not None and k != len(task):
            raise GnaValueError(f"k={k!r} with {len(task)} sample tasks given: leave k out, or give k tasks")
    settings = _settings(options.pop("settings", None), options, "stability")
    return _stability(model, _sample_tasks(task, samples, seed) if isinstance(task, Task) else (list(task), None), settings, progress)


def _check_k(k: Any, name: str) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise GnaValueError(f"{name}={k!r}: expected an int of at least 2 prompt samples")


def _check_samples(samples: Any, name: str) -> None:
    """``samples``: a number of bootstrap samples (at least 2), or at least 2 tasks."""
    if isinstance(samples, int):
        _check_k(samples, name)
        return
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
        raise GnaTypeError(f"{name}={samples!r}: expected a number of prompt samples or a sequence of Task")
    bad = [i for i, t in enumerate(samples) if not isinstance(t, Task)]
    if bad:
        raise GnaTypeError(f"{name}[{bad[0]}] is a {type(samples[bad[0]]).__name__}: expected a gna_interp Task per sample")
    _check_k(len(samples), f"len({name})")


def _sample_tasks(task: Task, samples: int | Sequence[Task], seed: int) -> tuple[list[Task], int | None]:
    """``(sample tasks, bootstrap seed)``: ``samples`` bootstrap samples of ``task`` from
    ``seed``, or the tasks given (seed ``None``)."""
    if isinstance(samples, int):
        return prompt_samples(task, samples, seed), seed
    return list(samples), None


def _stability(model: GnaModel, sampled: tuple[list[Task], int | None], settings: DiscoverySettings, progress: bool) -> Stability:
    """`Stability` of the search, run with ``settings`` on each of the sampled tasks
    (`_sample_tasks`): only `SEARCH_STAGES`, without the label check."""
    tasks, seed = sampled
    chosen = dataclasses.replace(settings, stages=tuple(s for s in settings.stages if s in SEARCH_STAGES), check_labels=False)
    started = time.perf_counter()
    sets = []
    for sample in progress_bar(tasks, show=progress, desc="stability"):
        with model.prefix_cache(), memo.accuracy_memo(model):
            ctx = _context(model, sample, chosen, False, None)
            circuit, _ = plan.run(ctx, None)
            ctx.bar.close()
        sets.append({role: list(getattr(circuit, role)) for role in ROLES})
    shape = (model.n_layers, max(model.heads_per_layer))
    seconds = time.perf_counter() - started
    return Stability("tasks" if seed is None else "bootstrap", [len(t) for t in tasks], sets, shape, seed, seconds)
