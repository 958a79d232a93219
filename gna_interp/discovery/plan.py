"""`discover` as a list of stages (`PLAN`) that `run` carries out in order.

Each stage is a function ``(ctx, state) -> None``: it reads the run's fixed `Context` (model,
task, `DiscoverySettings`, the layers to scan...) and what the earlier stages recorded in the
`State`, and records its own results there (the circuit's fields, the head scan, the
evidence...). `run` marks each stage on the stage bar, measures what it cost (`StageRecord`)
and, with a run directory (`run_dir.RunDir`), saves the state after it: a run started again
reads the last finished stage's state and carries on after it. A stage may end the run
(``state.done``: nothing to explain, or no head search asked for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..cost import COUNTS
from ..scoring.evaluation import evaluate
from . import head_scans, positions, remote
from . import stages as stage
from .estimate import StageBar
from .evidence import HeadEvidence
from .joint import JointSearch
from .roles import RoleScores, RoleThresholds, role_scores
from .runner import Runner, runner_for

if TYPE_CHECKING:
    from ..cost import Cost
    from ..models.handle import GnaModel
    from ..scoring.evaluation import Evaluation
    from ..tasks.base import EncodedTask, Task
    from .circuit import GnaCircuit
    from .settings import DiscoverySettings

T = TypeVar("T")


@dataclass
class Context:
    """What every stage reads and none changes: the model, the task, the settings, and what
    follows from them (`stage.check_arguments`: the thresholds and layers to scan)."""

    model: GnaModel
    task: Task
    settings: DiscoverySettings
    thresholds: RoleThresholds
    scan_layers: list[int]
    estimate: dict[str, Any]
    bar: StageBar
    progress: bool

    @cached_property
    def runner(self) -> Runner:
        """The engine the stages ask (`runner.runner_for`): local, or remote in few requests."""
        return runner_for(self.model)

    @property
    def batched(self) -> bool:
        """Each stage's forwards in one request (`Runner.batched`: a remote model)."""
        return self.runner.batched

    @property
    def evaluate_bars(self) -> bool | None:
        """`evaluate`'s own default bars for single evaluations, or none."""
        return None if self.progress else False

    @property
    def wide(self) -> list[int]:
        """The scan layers of more than ``screen_above`` heads (group testing)."""
        if "heads" not in self.settings.stages:
            return []
        return [layer for layer in self.scan_layers if self.model.heads_per_layer[layer] > self.settings.screen_above]

    @cached_property
    def encoded(self) -> EncodedTask:
        """The task encoded for the model's tokenizer (once per run)."""
        return self.task.encode(self.task.tokenizer_for(self.model.tokenizer))


@dataclass
class State:
    """What the stages have recorded so far (the circuit, and what later stages read).

    Attributes:
        circuit: the circuit so far (from the baseline; `found` reads it).
        clean: the clean `Evaluation` (``scores`` ``[prompt, candidate]``; `baseline` reads it).
        first: a remote run's first request (`remote.FirstScans`), else ``None``.
        early: the prescreen's first-order estimates measured with the baseline
            (`head_scans.FirstOrder`, ``estimates`` ``[layer, head]``), else ``None``.
        done: the run ends after the stage that set it.
        only, adaptive, quiet: the prescreen's heads to ablate alone (``None``: every head),
            wide layers for group testing, and heads ablated together first (`stage.prescreen_stage`).
        scan: the head scan (`head_scans.HeadScan`: ``accuracy`` and ``verified`` ``[layer, head]``).
        candidates, evidence, harmful: the heads examined for roles, their `HeadEvidence`,
            and those that cost at least ``min_effect`` alone.
        labels: a local run's pattern scores measured before the entry scan (`stage.LabelInputs`).
        ahead: a remote run's joint pool heads, scored with the candidates (`remote.pool_heads`).
        measured: the pattern scores (`RoleScores`) of the candidates and ``ahead``.
        positions_pending: the layers of a remote run's position scan, measured with the confirmation.
    """

    circuit: GnaCircuit | None = None
    clean: Evaluation | None = None
    first: remote.FirstScans | None = None
    early: head_scans.FirstOrder | None = None
    done: bool = False
    only: list[Head] | None = None
    adaptive: list[int] = field(default_factory=list)
    quiet: list[Head] = field(default_factory=list)
    scan: head_scans.HeadScan | None = None
    candidates: list[Head] = field(default_factory=list)
    evidence: dict[Head, HeadEvidence] = field(default_factory=dict)
    harmful: list[Head] = field(default_factory=list)
    labels: stage.LabelInputs | None = None
    ahead: list[Head] = field(default_factory=list)
    measured: dict[Head, RoleScores] = field(default_factory=dict)
    positions_pending: list[int] | None = None

    @property
    def found(self) -> GnaCircuit:
        """The circuit (after the baseline)."""
        return _written(self.circuit, "circuit", "baseline")

    @property
    def baseline(self) -> Evaluation:
        """The clean evaluation (after the baseline)."""
        return _written(self.clean, "clean", "baseline")

    @property
    def scanned(self) -> head_scans.HeadScan:
        """The head scan (after its stage)."""
        return _written(self.scan, "scan", "head_scan")

    def resumable(self) -> bool:
        """Whether the state can be saved: not while a remote scan's search is in flight."""
        return self.scan is None or self.scan.search is None


def _written(value: T | None, name: str, by: str) -> T:
    if value is None:
        raise GnaValueError(f"state.{name} read before the {by!r} stage wrote it: a stage of PLAN runs too early")
    return value


@dataclass(frozen=True)
class StageRecord:
    """A finished stage: its name and what it cost (`cost.COUNTS` added to the meter)."""

    name: str
    cost: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cost": dict(self.cost)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageRecord:
        return cls(data["name"], {k: int(data["cost"].get(k, 0)) for k in COUNTS})


@dataclass(frozen=True)
class Stage:
    """One step of `PLAN`: ``run(ctx, state)`` records its results in ``state``."""

    name: str
    run: Callable[[Context, State], None]


def baseline(ctx: Context, state: State) -> None:
    """Clean accuracy and the circuit (`stage.baseline`); remotely the first request
    (`stage.first_request`), locally the prescreen's first-order forward first (it is the
    clean one: it fills the prefix cache for the baseline). Ends the run when there is no
    retrieval to explain."""
    ctx.bar.stage("baseline")
    s, model, task = ctx.settings, ctx.model, ctx.task
    if ctx.batched:
        state.first = stage.first_request(model, task, s.stages, s.check_labels, ctx.wide)
    else:
        backward = ctx.runner.has_backward
        state.early = stage.early_first_order(model, task, s.stages, ctx.scan_layers, s.screen_above, s.prescreen_above, backward)
    state.clean = state.first.clean if state.first is not None else evaluate(model, task, progress=ctx.evaluate_bars)
    settings = {**s.circuit_dict(ctx.scan_layers), "estimate": ctx.estimate}
    state.circuit = stage.baseline(model, task, state.clean, s.chance_margin, settings)
    state.done = state.circuit.mechanism == "none" and not s.search_at_chance  # no retrieval to explain: no head search


def label_check(ctx: Context, state: State) -> None:
    """Accuracy with the labels shuffled (`stage.label_check`)."""
    circuit = state.found
    if ctx.settings.check_labels and circuit.mechanism != "none":
        ctx.bar.stage("label check")
        shuffled = None if state.first is None else state.first.shuffled
        stage.label_check(ctx.model, ctx.task, circuit, state.baseline, ctx.settings.chance_margin, ctx.evaluate_bars, shuffled)


def layer_scans(ctx: Context, state: State) -> None:
    """Truncation and layer scans (`stage.layer_stages`); the run ends here without ``"heads"``."""
    ctx.bar.stage("layer scans")
    s = ctx.settings
    stage.layer_stages(ctx.model, ctx.task, state.found, s.stages, state.first, ctx.thresholds.min_effect, ctx.progress)
    state.done = "heads" not in s.stages


def position_scan(ctx: Context, state: State) -> None:
    """Where each costly layer acts (`positions.position_scan`): its heads ablated together at
    each position class of the task, before any head search."""
    s, circuit = ctx.settings, state.found
    if "positions" in s.stages and ctx.encoded.single_token:  # positions need single-token scoring
        ctx.bar.stage("positions")
        clean, min_effect = state.baseline.accuracy, ctx.thresholds.min_effect
        layers = positions.costly_layers(circuit.layer_scan, ctx.scan_layers, clean, min_effect)
        if ctx.batched and "confirm" in s.stages:  # remotely, measured in the confirmation's request
            state.positions_pending = layers
        else:
            circuit.positions = positions.position_scan(ctx.runner, ctx.task, ctx.encoded, layers, clean=clean, min_effect=min_effect)


def prescreen(ctx: Context, state: State) -> None:
    """The heads the head scan ablates alone, when the scan layers hold too many (`stage.prescreen_stage`)."""
    s, model = ctx.settings, ctx.model
    if sum(model.heads_per_layer[layer] for layer in ctx.scan_layers) > s.prescreen_above:
        ctx.bar.stage("prescreen")
        state.only, state.adaptive, state.quiet = stage.prescreen_stage(
            model,
            ctx.task,
            state.found,
            ctx.scan_layers,
            ctx.wide,
            ctx.thresholds,
            s.screen_above,
            s.keep,
            ctx.batched,
            state.early,
        )


def head_scan(ctx: Context, state: State) -> None:
    """Single-head ablation (`head_scans.head_scan`), the candidates and their evidence."""
    ctx.bar.stage("head scan")
    s, clean = ctx.settings, state.baseline.accuracy
    scan = head_scans.head_scan(
        ctx.model,
        ctx.task,
        ctx.scan_layers,
        screen_above=s.screen_above,
        only=state.only,
        adaptive=state.adaptive,
        clean=clean,
        min_effect=ctx.thresholds.min_effect,
        progress=ctx.progress,
        known=None if state.first is None else state.first.groups,
        defer_search=ctx.batched and "entry" in s.stages,  # the spread groups' search travels with the entry scan
        search_spread=ctx.batched,  # locally, only the groups the spread report shows are searched (`spread_check`)
        quiet=state.quiet,
    )
    state.scan = scan
    state.found.head_scan = [[None if v != v else float(v) for v in row] for row in scan.accuracy.tolist()]
    state.candidates = stage.candidates(scan.accuracy, scan.verified, s.max_candidates, scan.cleared)
    evidence = {
        h: HeadEvidence(h, None, float(scan.accuracy[h.layer, h.head]), bool(scan.verified[h.layer, h.head])) for h in state.candidates
    }
    state.evidence = evidence
    min_effect = ctx.thresholds.min_effect
    state.harmful = [h for h, e in evidence.items() if e.ablated_accuracy is not None and clean - e.ablated_accuracy >= min_effect]


def patterns(ctx: Context, state: State) -> None:
    """Locally the pattern scores come first: the entry scan then measures only what the labels read."""
    if not ctx.batched and "roles" in ctx.settings.stages and state.candidates:
        ctx.bar.stage("roles")
        scores = role_scores(ctx.model, ctx.encoded, state.candidates, ctx.settings.pattern_prompts)
        state.labels = stage.LabelInputs(scores, ctx.thresholds, state.baseline.accuracy)


def entry(ctx: Context, state: State) -> None:
    """Where each harmful head's effect enters (`stage.entry_stage`); the head scan's search
    finished (`HeadScan.record_search`) and its group forwards recorded."""
    s, scan, circuit = ctx.settings, state.scanned, state.found
    if "entry" in s.stages:
        ctx.bar.stage("entry")
        stage.entry_stage(ctx.model, ctx.task, ctx.encoded, state.evidence, state.harmful, scan, ctx.progress, state.labels)
    scan.record_search()
    if scan.tests:
        circuit.settings["group_testing"] = {str(layer): tests for layer, tests in scan.tests.items()}
    if ctx.batched and "joint" in s.stages:
        state.ahead = remote.pool_heads(ctx.model, state.harmful, state.evidence, s.screen_above)


def roles(ctx: Context, state: State) -> None:
    """Pattern scores (remotely: with the joint pool's) and the role labels (`stage.role_stage`)."""
    s, circuit, candidates = ctx.settings, state.found, state.candidates
    if state.labels is not None:
        measured = state.labels.scores
    else:
        ctx.bar.stage("roles")
        measured = (
            role_scores(ctx.model, ctx.encoded, [*candidates, *state.ahead], s.pattern_prompts)
            if "roles" in s.stages and candidates
            else {}
        )
    if "roles" in s.stages and candidates:
        clean = state.baseline.accuracy
        stage.role_stage(ctx.model, ctx.task, state.evidence, candidates, state.harmful, measured, ctx.thresholds, clean)
        if state.labels is not None and "entry" in s.stages:
            stage.entry_ends(ctx.model, ctx.task, ctx.encoded, state.evidence, ctx.progress)
    by_harm = sorted(state.evidence.values(), key=lambda e: (e.ablated_accuracy if e.ablated_accuracy is not None else 1.0, e.head))
    circuit.gather = [e.head for e in by_harm if e.role == "gather"]
    circuit.aggregate = [e.head for e in by_harm if e.role == "aggregate"]
    state.measured = measured


def joint(ctx: Context, state: State) -> None:
    """Per role, the set that collapses accuracy (`Runner.joint_search`); the examined heads
    with their kinds into the circuit."""
    s, circuit = ctx.settings, state.found
    if "joint" in s.stages and "roles" in s.stages and ctx.encoded.single_token:  # positions need single-token scoring
        ctx.bar.stage("joint")
        search = JointSearch(
            ctx.model,
            ctx.task,
            ctx.encoded,
            state.evidence,
            state.scanned,
            ctx.thresholds,
            s.pattern_prompts,
            s.screen_above,
            ctx.progress,
            s.joint_search,
        )
        search.scored = {h: state.measured[h] for h in state.ahead}
        circuit.needs |= ctx.runner.joint_search(search, circuit, _threshold(state, ctx), s.max_heads_per_role)
    for item in state.evidence.values():
        item.kind = ctx.model.head_kind(item.head).value
    circuit.heads = sorted(state.evidence.values(), key=lambda e: e.head)


def confirm(ctx: Context, state: State) -> None:
    """The confirmation and the spread check (`stage.confirm_stage`)."""
    if "confirm" in ctx.settings.stages:
        ctx.bar.stage("confirm")
        args = (state.scanned, _threshold(state, ctx), ctx.settings.max_heads_per_role, ctx.evaluate_bars, ctx.batched)
        layers = state.positions_pending
        pending = None if layers is None else positions.scan_runs(ctx.runner, ctx.task, ctx.encoded, layers)
        stage.confirm_stage(ctx.model, ctx.task, ctx.encoded, state.found, *args, positions_pending=pending)


def _threshold(state: State, ctx: Context) -> float:
    """Chance + ``chance_margin``: at most this, accuracy has collapsed."""
    return state.baseline.chance + ctx.settings.chance_margin


PLAN: tuple[Stage, ...] = (
    Stage("baseline", baseline),
    Stage("label_check", label_check),
    Stage("layer_scans", layer_scans),
    Stage("positions", position_scan),
    Stage("prescreen", prescreen),
    Stage("head_scan", head_scan),
    Stage("patterns", patterns),
    Stage("entry", entry),
    Stage("roles", roles),
    Stage("joint", joint),
    Stage("confirm", confirm),
)
"""`discover`'s stages in the order `run` carries them out (module docs)."""


class Saved(Protocol):
    """Where a run's stages are kept (`run_dir.RunDir`)."""

    def read(self, ctx: Context) -> tuple[list[StageRecord], State]:
        """The records of the stages kept, and the state after the last."""

    def begin(self, index: int) -> None:
        """Stage ``index`` starts."""

    def write(self, index: int, records: list[StageRecord], state: State) -> None:
        """Stage ``index`` ended: ``records`` so far and the state after it."""


def run(ctx: Context, meter: Cost | None, saved: Saved | None = None) -> tuple[GnaCircuit, list[StageRecord]]:
    """Carry out `PLAN` on ``ctx``: the circuit, and a record per stage run or read. With
    ``saved`` (a `run_dir.RunDir`), the stages it holds are read, not run (their `State` is
    the last one's), and each stage run is saved there when it ends."""
    records, state = ([], State()) if saved is None else saved.read(ctx)
    ctx.bar.start(ctx.estimate)
    for index in range(len(records), len(PLAN)):
        if state.done:
            break
        step = PLAN[index]
        before = _counts(meter)
        if saved is not None:
            saved.begin(index)
        step.run(ctx, state)
        after = _counts(meter)
        records.append(StageRecord(step.name, {k: after[k] - before[k] for k in COUNTS}))
        if saved is not None:
            saved.write(index, records, state)
    return state.found, records


def _counts(meter: Cost | None) -> dict[str, int]:
    return {k: 0 if meter is None else getattr(meter, k) for k in COUNTS}
