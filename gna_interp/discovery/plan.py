"""`discover` as a list of stages (`PLAN`) that `run` carries out in order.

Each stage is a function ``(ctx, records) -> ItsRecord``: it reads the run's fixed `Context`
(model, task, `DiscoverySettings`, the runner, the layers to scan...) and the records of the
stages before it (`stage_records.Records`, read-only), and returns what it measured and
decided as its own frozen record (`stage_records`). It changes no earlier record: what it
carries further (the evidence, the head scan, a draft of the circuit) it copies first
(`stage_records.owned`). `run` marks each stage on the stage bar, sets the record's cost
and, with a run directory (`run_dir.RunDir`), saves the record: a run started again reads
the finished stages' records and carries on after them. A record may end the run
(`Record.ends_run`: nothing to explain, or no head search asked for). The circuit is
`stage_records.assemble` of the records, at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from ..core.errors import GnaTypeError
from ..cost import COUNTS
from ..scoring.evaluation import evaluate
from . import head_scans, kinds, positions
from . import stages as stage
from .context import Context
from .evidence import HeadEvidence
from .joint import JointSearch
from .roles import role_scores
from .stage_records import (
    BaselineRecord,
    ConfirmRecord,
    EntryRecord,
    HeadScanRecord,
    JointRecord,
    KindsRecord,
    LabelCheckRecord,
    LabelInputs,
    LayerScanRecord,
    PatternRecord,
    PositionRecord,
    PrescreenRecord,
    Record,
    Records,
    RoleRecord,
    assemble,
    owned,
)

if TYPE_CHECKING:
    from ..cost import Cost
    from .circuit import GnaCircuit

__all__ = ["PLAN", "Context", "Records", "Stage", "assemble", "run"]


@dataclass(frozen=True)
class Stage:
    """One step of `PLAN`: ``run(ctx, records)`` returns its ``record`` (a `Record` subclass)."""

    name: str
    run: Callable[[Context, Records], Record]
    record: type[Record]


def baseline(ctx: Context, records: Records) -> BaselineRecord:
    """Clean accuracy and the mechanism (`stage.baseline`); remotely the first request
    (`Runner.first_request`), locally the prescreen's first-order forward first, or group
    testing's order of the wide layers (`stage.early_head_order`): either is the clean forward,
    and fills the prefix cache for the baseline. Ends the run when there is no retrieval to explain."""
    ctx.bar.stage("baseline")
    s = ctx.settings
    first = ctx.runner.first_request(ctx.task, s.stages, s.check_labels, ctx.wide)
    early = stage.early_first_order(ctx) if first is None else None
    order = stage.early_head_order(ctx) if first is None and early is None else None
    clean = first.clean if first is not None else evaluate(ctx.model, ctx.task, progress=ctx.evaluate_bars)
    mechanism, notes, floor = stage.baseline(ctx.task, clean, s.chance_margin)
    stop = mechanism == "none" and not s.search_at_chance  # no retrieval to explain: no head search
    return BaselineRecord(clean, floor, mechanism, notes, stop, first, early, order)


def label_check(ctx: Context, records: Records) -> LabelCheckRecord:
    """Accuracy with the labels shuffled (`stage.label_check`)."""
    base = records.baseline
    if not ctx.settings.check_labels or base.mechanism == "none":
        return LabelCheckRecord()
    ctx.bar.stage("label check")
    measured = None if base.first is None else base.first.shuffled
    return stage.label_check(ctx, clean=base.clean, measured=measured)


def layer_scans(ctx: Context, records: Records) -> LayerScanRecord:
    """Truncation and layer scans (`stage.layer_stages`); the run ends here without ``"heads"``."""
    ctx.bar.stage("layer scans")
    base = records.baseline
    return stage.layer_stages(ctx, base.clean.accuracy, base.clean.chance, first=base.first)


def position_scan(ctx: Context, records: Records) -> PositionRecord:
    """Where each costly layer acts (`positions.position_scan`): its heads ablated together at
    each position class of the task, before any head search; on a remote run with a
    confirmation, measured in the confirmation's request (``pending``)."""
    s = ctx.settings
    if "positions" not in s.stages or not ctx.encoded.single_token:  # positions need single-token scoring
        return PositionRecord()
    ctx.bar.stage("positions")
    clean, min_effect = records.baseline.clean.accuracy, ctx.thresholds.min_effect
    layers = positions.costly_layers(records.of(LayerScanRecord).layer_scan, ctx.scan_layers, clean, min_effect)
    if ctx.batched and "confirm" in s.stages:
        return PositionRecord(pending=layers)
    return PositionRecord(positions.position_scan(ctx.runner, ctx.task, ctx.encoded, layers, clean=clean, min_effect=min_effect))


def prescreen(ctx: Context, records: Records) -> PrescreenRecord:
    """The heads the head scan ablates alone, when the scan layers hold too many (`stage.prescreen_stage`)."""
    if sum(ctx.model.heads_per_layer[layer] for layer in ctx.scan_layers) <= ctx.settings.prescreen_above:
        return PrescreenRecord()
    ctx.bar.stage("prescreen")
    base = records.baseline
    return stage.prescreen_stage(ctx, base.clean.accuracy, records.of(LayerScanRecord).layer_scan, early=base.early)


def head_scan(ctx: Context, records: Records) -> HeadScanRecord:
    """Single-head ablation (`head_scans.head_scan`), the candidates and their evidence."""
    ctx.bar.stage("head scan")
    s, base, screened = ctx.settings, records.baseline, records.of(PrescreenRecord)
    clean, min_effect = base.clean.accuracy, ctx.thresholds.min_effect
    scan = head_scans.head_scan(
        ctx.model,
        ctx.task,
        ctx.scan_layers,
        screen_above=s.screen_above,
        only=screened.only,
        adaptive=screened.adaptive,
        clean=clean,
        min_effect=min_effect,
        progress=ctx.progress,
        known=None if base.first is None else base.first.groups,
        order=base.order,
        defer_search=ctx.batched and "entry" in s.stages,  # the spread groups' search travels with the entry scan
        search_spread=ctx.batched,  # locally, only the groups the spread report shows are searched (`spread_check`)
        quiet=screened.quiet,
    )
    candidates = stage.candidates(scan.accuracy, scan.verified, s.max_candidates, scan.cleared)
    evidence = {h: HeadEvidence(h, None, float(scan.accuracy[h.layer, h.head]), bool(scan.verified[h.layer, h.head])) for h in candidates}
    harmful = [h for h, e in evidence.items() if e.ablated_accuracy is not None and clean - e.ablated_accuracy >= min_effect]
    return HeadScanRecord(scan, candidates, evidence, harmful)


def patterns(ctx: Context, records: Records) -> PatternRecord:
    """Locally the pattern scores come first: the entry scan then measures only what the labels read."""
    candidates = records.head_scan.candidates
    if ctx.batched or "roles" not in ctx.settings.stages or not candidates:
        return PatternRecord()
    ctx.bar.stage("roles")
    scores = role_scores(ctx.model, ctx.encoded, candidates, ctx.settings.pattern_prompts)
    return PatternRecord(LabelInputs(scores, ctx.thresholds, records.baseline.clean.accuracy))


def entry(ctx: Context, records: Records) -> EntryRecord:
    """Where each harmful head's effect enters (`stage.entry_stage`), on the evidence; the
    head scan's search finished (`HeadScan.record_search`, on the stage's copy) and its
    group forwards recorded; remotely, the joint pool heads to score with the candidates."""
    s, scanned = ctx.settings, records.head_scan
    scan, evidence, harmful = owned(ctx, scanned.scan), scanned.evidence, scanned.harmful
    if "entry" in s.stages:
        ctx.bar.stage("entry")
        where = records.of(PositionRecord).position_scan  # its layers cleared at every position but the final one
        labels = records.of(PatternRecord).labels
        entries = stage.entry_stage(ctx, evidence, scan, harmful=harmful, labels=labels, cleared=None if where is None else where.cleared)
        evidence = {h: replace(e, entry=entries.get(h, e.entry)) for h, e in evidence.items()}
    scan.record_search()
    tests = {str(layer): tests for layer, tests in scan.tests.items()} if scan.tests else None
    ahead = ctx.runner.pool_ahead(harmful, evidence, s.screen_above) if "joint" in s.stages else []
    return EntryRecord(evidence, scan, tests, ahead)


def roles(ctx: Context, records: Records) -> RoleRecord:
    """Pattern scores (remotely: with the joint pool's) and the role labels (`stage.role_stage`)."""
    s, candidates, labels = ctx.settings, records.head_scan.candidates, records.of(PatternRecord).labels
    evidence = records.evidence
    if labels is not None:
        measured = labels.scores
    else:
        ctx.bar.stage("roles")
        ahead = records.of(EntryRecord).ahead
        measured = (
            role_scores(ctx.model, ctx.encoded, [*candidates, *ahead], s.pattern_prompts) if "roles" in s.stages and candidates else {}
        )
    if "roles" in s.stages and candidates:
        clean = records.baseline.clean.accuracy
        evidence = stage.role_stage(ctx, evidence, harmful=records.head_scan.harmful, measured=measured, clean=clean)
        if labels is not None and "entry" in s.stages:
            ends = stage.entry_ends(ctx, evidence)
            evidence = {h: replace(e, entry=ends[h]) if h in ends else e for h, e in evidence.items()}
    by_harm = sorted(evidence.values(), key=lambda e: (e.ablated_accuracy if e.ablated_accuracy is not None else 1.0, e.head))
    gather, aggregate = [e.head for e in by_harm if e.role == "gather"], [e.head for e in by_harm if e.role == "aggregate"]
    return RoleRecord(measured, evidence, gather, aggregate)


def joint(ctx: Context, records: Records) -> JointRecord:
    """Per role, the set that collapses accuracy (`Runner.joint_search`, on the stage's draft
    of the circuit and copy of the evidence); the examined heads with their kinds."""
    s, draft, evidence = ctx.settings, assemble(ctx, records), owned(ctx, records.evidence)
    needs = {}
    if "joint" in s.stages and "roles" in s.stages and ctx.encoded.single_token:  # positions need single-token scoring
        ctx.bar.stage("joint")
        search = JointSearch(
            ctx.model,
            ctx.task,
            ctx.encoded,
            evidence=evidence,
            scan=records.scan,
            thresholds=ctx.thresholds,
            pattern_prompts=s.pattern_prompts,
            screen_above=s.screen_above,
            progress=ctx.progress,
            method=s.joint_search,
        )
        measured = records.of(RoleRecord).measured
        search.scored = {h: measured[h] for h in records.of(EntryRecord).ahead}
        needs = ctx.runner.joint_search(search, draft, _threshold(ctx, records), s.max_heads_per_role)
    for item in evidence.values():
        item.kind = ctx.model.head_kind(item.head).value
    return JointRecord(evidence, draft.gather, draft.aggregate, needs)


def confirm(ctx: Context, records: Records) -> ConfirmRecord:
    """The confirmation, the spread check, the spread sets into the circuit, then path
    patching and MIB's score on them (`stage.confirm_stage`), measured on the stage's draft of
    the circuit: the record keeps what they added to it."""
    if "confirm" not in ctx.settings.stages:
        return ConfirmRecord()
    ctx.bar.stage("confirm")
    before, draft = assemble(ctx, records), assemble(ctx, records)
    layers = records.of(PositionRecord).pending
    names = [*positions.position_classes(ctx.encoded)[0], positions.REST]  # screened as a local scan is
    pending = None if layers is None else positions.scan_runs(ctx.runner, ctx.task, ctx.encoded, layers, names=names)
    stage.confirm_stage(ctx, draft, owned(ctx, records.scan), threshold=_threshold(ctx, records), positions_pending=pending)
    cost = None if draft.cost is None else draft.cost.get("size_curves")
    return ConfirmRecord(
        accuracy=_added(before.accuracy, draft.accuracy),
        needs=_added(before.needs, draft.needs),
        path_patching=draft.path_patching,
        score=draft.score,
        spread=_added(before.spread, draft.spread),
        settings=_added(before.settings, draft.settings),
        size_curves=cost,
        parts=None if draft.cost is None else draft.cost.get("confirm"),
        gather=draft.gather,
        aggregate=draft.aggregate,
        heads=draft.heads,
        verdicts=_added(before.verdicts, draft.verdicts),
        positions=draft.positions if pending is not None else None,
    )


def kinds_check(ctx: Context, records: Records) -> KindsRecord:
    """The roles ablated by the other kinds (`kinds.kinds_check`, ``ablation_kinds``), on the
    circuit as the confirmation left it: which roles hold under mean and resample ablation."""
    s = ctx.settings
    draft = assemble(ctx, records)
    if "confirm" not in s.stages or not s.ablation_kinds or not (draft.gather or draft.aggregate):
        return KindsRecord()
    ctx.bar.stage("kinds")
    encoded = ctx.encoded if ctx.encoded.single_token else None  # positions need single-token scoring
    accuracy, verdicts, checked, note = kinds.kinds_check(ctx.runner, ctx.task, encoded, draft, s.ablation_kinds, s.chance_margin)
    return KindsRecord(accuracy, verdicts, checked, note)


def _added(before: dict, after: dict) -> dict:
    """The entries of ``after`` new or changed since ``before``."""
    return {k: v for k, v in after.items() if k not in before or before[k] != v}


def _threshold(ctx: Context, records: Records) -> float:
    """Chance + ``chance_margin``: at most this, accuracy has collapsed."""
    return records.baseline.clean.chance + ctx.settings.chance_margin


PLAN: tuple[Stage, ...] = (
    Stage("baseline", baseline, BaselineRecord),
    Stage("label_check", label_check, LabelCheckRecord),
    Stage("layer_scans", layer_scans, LayerScanRecord),
    Stage("positions", position_scan, PositionRecord),
    Stage("prescreen", prescreen, PrescreenRecord),
    Stage("head_scan", head_scan, HeadScanRecord),
    Stage("patterns", patterns, PatternRecord),
    Stage("entry", entry, EntryRecord),
    Stage("roles", roles, RoleRecord),
    Stage("joint", joint, JointRecord),
    Stage("confirm", confirm, ConfirmRecord),
    Stage("kinds", kinds_check, KindsRecord),
)
"""`discover`'s stages in the order `run` carries them out (module docs)."""


class Saved(Protocol):
    """Where a run's stages are kept (`run_dir.RunDir`)."""

    def read(self, ctx: Context) -> Records:
        """The records of the stages kept."""

    def begin(self, index: int) -> None:
        """Stage ``index`` starts."""

    def write(self, index: int, records: Records) -> None:
        """Stage ``index`` ended: ``records`` so far, its own last."""


def run(ctx: Context, meter: Cost | None, saved: Saved | None = None, stages: Sequence[Stage] = PLAN) -> tuple[GnaCircuit, Records]:
    """Carry out ``stages`` (`PLAN`) on ``ctx``: the circuit (`assemble`d from the records),
    and the record of each stage run or read. With ``saved`` (a `run_dir.RunDir` of the
    same stages), the stages it holds are read, not run, and each stage run is saved there
    when it ends."""
    records = Records() if saved is None else saved.read(ctx)
    ctx.bar.start(ctx.estimate)
    for index in range(len(records), len(stages)):
        if records.stopped:
            break
        step = stages[index]
        before = _counts(meter)
        if saved is not None:
            saved.begin(index)
        record = step.run(ctx, records)
        if type(record) is not step.record:
            raise GnaTypeError(f"stage {step.name!r} returned a {type(record).__name__}: expected its {step.record.__name__}")
        after = _counts(meter)
        records = records.added(replace(record, cost={k: after[k] - before[k] for k in COUNTS}))
        if saved is not None:
            saved.write(index, records)
    return assemble(ctx, records), records


def _counts(meter: Cost | None) -> dict[str, int]:
    return {k: 0 if meter is None else getattr(meter, k) for k in COUNTS}
