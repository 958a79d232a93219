"""What each stage of `plan.PLAN` measured and decided: one frozen record per stage, the
read-only view of the records so far (`Records`) that a stage reads, and `assemble`, the one
function that builds the `GnaCircuit` from them.

A stage never changes an earlier record: a stage that carries an earlier value further (the
evidence, the head scan) works on its own copy (`owned`) and keeps the result in its record.
Each record knows which circuit fields it fills (`Record.apply`); `assemble` starts from the
baseline's circuit and applies the others in the order they ran. A record's ``cost`` is what
its stage added to the meter (`cost.COUNTS`), set by `plan.run`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..scoring.evaluation import Evaluation
from ..scoring.verdicts import Verdict
from . import head_scans, remote
from .circuit import GnaCircuit
from .evidence import HeadEvidence, RoleNeed, SpreadRole
from .positions import PositionScan
from .roles import RoleScores, RoleThresholds, entry_shares

if TYPE_CHECKING:
    from .context import Context

R = TypeVar("R", bound="Record")
T = TypeVar("T")


@dataclass(frozen=True)
class Record:
    """A finished stage: what it measured and decided (the subclasses' fields) and its cost."""

    stage: ClassVar[str] = ""
    cost: dict[str, int] = field(default_factory=dict, kw_only=True)
    """What the stage added to the meter (`cost.COUNTS`)."""

    def ends_run(self) -> bool:
        """Whether the run ends after this stage."""
        return False

    def apply(self, circuit: GnaCircuit) -> None:
        """Fill the circuit fields this stage decides (`assemble` calls it on its own draft)."""


@dataclass(frozen=True)
class BaselineRecord(Record):
    """Clean accuracy and whether there is a retrieval to explain (``mechanism``: ``"none"``
    below ``floor``, `stages.retrieval_floor`); a remote run's first request (``first``),
    a local run's early first-order estimates (``early``, ``estimates`` ``[layer, head]``)
    or group testing's order of the wide layers (``order``: layer -> its heads, `stages.early_head_order`)."""

    stage: ClassVar[str] = "baseline"
    clean: Evaluation
    floor: dict[str, float]
    mechanism: str
    warnings: list[str]
    stop: bool
    first: remote.FirstScans | None = None
    early: head_scans.FirstOrder | None = None
    order: dict[int, list[Head]] | None = None

    def ends_run(self) -> bool:
        return self.stop

    def circuit(self, ctx: Context) -> GnaCircuit:
        """The circuit of the baseline alone: nothing found yet."""
        model, task = ctx.model, ctx.task
        settings = {**ctx.settings.circuit_dict(ctx.scan_layers), "estimate": ctx.estimate, "retrieval_floor": self.floor}
        return GnaCircuit(
            model=model.name,
            family=model.arch.family,
            task=task.name,
            n_prompts=len(task),
            gather=[],
            aggregate=[],
            heads=[],
            accuracy={"clean": self.clean.accuracy, "chance": self.clean.chance},
            needs={},
            warnings=list(self.warnings),
            n_segments=task.n_segments,
            settings=settings,
            mechanism=self.mechanism,
        )


@dataclass(frozen=True)
class LabelCheckRecord(Record):
    """Accuracy with each prompt's labels shuffled (``None``: not measured), the mechanism it
    shows (`verdicts.label_verdict`: ``"g&a"``, ``"partly"``, ``"counting"``,
    ``"undetermined"``), its tested verdicts, and a ``warning`` for every word but "by label"."""

    stage: ClassVar[str] = "label_check"
    shuffled: float | None = None
    warning: str | None = None
    mechanism: str | None = None
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    def apply(self, circuit: GnaCircuit) -> None:
        if self.shuffled is not None:
            circuit.accuracy["shuffled_labels"] = self.shuffled
        if self.mechanism is not None:
            circuit.mechanism = self.mechanism
        circuit.verdicts.update(self.verdicts)
        if self.warning is not None:
            circuit.warnings.append(self.warning)


@dataclass(frozen=True)
class LayerScanRecord(Record):
    """The truncation scan and its critical layer, the screened layer scan and its groups
    (``screen``: ``skipped`` and ``tests``, `layer_scans.screen_layers`); ``None``: not run."""

    stage: ClassVar[str] = "layer_scans"
    stop: bool
    truncation: list[float] | None = None
    critical_layer: int | None = None
    layer_scan: list[float] | None = None
    screen: dict[str, Any] | None = None

    def ends_run(self) -> bool:
        return self.stop

    def apply(self, circuit: GnaCircuit) -> None:
        circuit.truncation, circuit.critical_layer, circuit.layer_scan = self.truncation, self.critical_layer, self.layer_scan
        if self.screen is not None:
            circuit.settings["layer_scan"] = self.screen


@dataclass(frozen=True)
class PrescreenRecord(Record):
    """The heads the head scan ablates alone (``None``: every head), the wide layers it scans
    by group testing, the quiet heads it ablates together first, how they were chosen
    (``method``) and the attribution estimates (``[layer][head]``); ``method`` ``None``: not run."""

    stage: ClassVar[str] = "prescreen"
    only: list[Head] | None = None
    adaptive: list[int] = field(default_factory=list)
    quiet: list[Head] = field(default_factory=list)
    method: str | None = None
    attribution: list[list[float | None]] | None = None

    def apply(self, circuit: GnaCircuit) -> None:
        if self.method is not None:
            circuit.settings["prescreen"] = self.method
        if self.attribution is not None:
            circuit.attribution = self.attribution


@dataclass(frozen=True)
class HeadScanRecord(Record):
    """The head scan (``scan.accuracy`` ``[layer, head]``; a remote scan's spread search may
    still be in flight: the entry stage finishes it on its own copy), the candidates, their
    evidence and the harmful ones (at least ``min_effect`` alone)."""

    stage: ClassVar[str] = "head_scan"
    scan: head_scans.HeadScan
    candidates: list[Head]
    evidence: dict[Head, HeadEvidence]
    harmful: list[Head]

    def apply(self, circuit: GnaCircuit) -> None:
        circuit.head_scan = [[None if v != v else float(v) for v in row] for row in self.scan.accuracy.tolist()]


@dataclass
class LabelInputs:
    """What the role labels read besides the entry scan: the pattern scores (measured
    before it), the thresholds and the clean accuracy."""

    scores: dict[Head, RoleScores]
    thresholds: RoleThresholds
    clean: float

    def needs_final(self, item: HeadEvidence) -> bool:
        """Whether ``item``'s label (`roles.label`) reads its accuracy ablated at the final
        position: it reads the options (it may be an Aggregate head), or its segments
        share reaches ``entry_share`` (a Gather head unless the final share is larger).
        Otherwise the label is ``None`` whatever that accuracy is."""
        scores = self.scores.get(item.head)
        reads = scores is not None and scores.aggregate_mass >= self.thresholds.aggregate_mass
        shares = None if item.entry is None else entry_shares(self.clean, item.ablated_accuracy or 0.0, item.entry)
        return shares is not None and (reads or shares[1] >= self.thresholds.entry_share)


@dataclass(frozen=True)
class PatternRecord(Record):
    """A local run's pattern scores measured before the entry scan (`stages.LabelInputs`), else ``None``."""

    stage: ClassVar[str] = "patterns"
    labels: LabelInputs | None = None


@dataclass(frozen=True)
class EntryRecord(Record):
    """The evidence with where each harmful head's effect enters, the head scan with its
    search finished, its group forwards per layer (``group_testing``), and a remote run's
    joint pool heads to score with the candidates (``ahead``)."""

    stage: ClassVar[str] = "entry"
    evidence: dict[Head, HeadEvidence]
    scan: head_scans.HeadScan
    group_testing: dict[str, int] | None = None
    ahead: list[Head] = field(default_factory=list)

    def apply(self, circuit: GnaCircuit) -> None:
        if self.group_testing is not None:
            circuit.settings["group_testing"] = self.group_testing


@dataclass(frozen=True)
class RoleRecord(Record):
    """The pattern scores measured (of the candidates and ``ahead``), the labelled evidence
    and each role's heads, most harmful first."""

    stage: ClassVar[str] = "roles"
    measured: dict[Head, RoleScores]
    evidence: dict[Head, HeadEvidence]
    gather: list[Head]
    aggregate: list[Head]

    def apply(self, circuit: GnaCircuit) -> None:
        circuit.gather, circuit.aggregate = list(self.gather), list(self.aggregate)


@dataclass(frozen=True)
class JointRecord(Record):
    """Each role's set after the joint search (its backup heads added), the needs it found,
    and the evidence of every examined head with its kind (the circuit's ``heads``)."""

    stage: ClassVar[str] = "joint"
    evidence: dict[Head, HeadEvidence]
    gather: list[Head]
    aggregate: list[Head]
    needs: dict[str, RoleNeed] = field(default_factory=dict)

    def apply(self, circuit: GnaCircuit) -> None:
        circuit.gather, circuit.aggregate = list(self.gather), list(self.aggregate)
        circuit.needs.update(self.needs)
        circuit.heads = sorted(self.evidence.values(), key=lambda e: e.head)


@dataclass(frozen=True)
class ConfirmRecord(Record):
    """The confirmation's accuracies (``-gather``, ``-aggregate``, ``-both``, ``only_gna``),
    the fallback needs, the spread roles and their sets in the circuit (``gather``,
    ``aggregate`` and the evidence ``heads`` as they end), the path-patching check and MIB's
    score on those sets, the settings they add (``group_testing``, ``size_curve``), what the
    size curves and the confirmation's parts cost, the tested verdicts, and a remote run's position scan (measured in the
    confirmation's request)."""

    stage: ClassVar[str] = "confirm"
    accuracy: dict[str, float] = field(default_factory=dict)
    needs: dict[str, RoleNeed] = field(default_factory=dict)
    path_patching: dict[str, float] | None = None
    score: dict[str, Any] | None = None
    spread: dict[str, SpreadRole] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    size_curves: dict[str, Any] | None = None
    parts: dict[str, Any] | None = None
    """What each part of the confirmation ran (`cost.tally`; ``circuit.cost["confirm"]``)."""
    gather: list[Head] | None = None
    aggregate: list[Head] | None = None
    heads: list[HeadEvidence] | None = None
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    positions: PositionScan | None = None

    def apply(self, circuit: GnaCircuit) -> None:
        circuit.accuracy.update(self.accuracy)
        circuit.needs.update(self.needs)
        circuit.path_patching, circuit.score = self.path_patching, self.score
        circuit.spread.update(self.spread)
        circuit.settings.update(self.settings)
        if self.size_curves is not None:
            circuit.cost = {**(circuit.cost or {}), "size_curves": self.size_curves}
        if self.parts is not None:
            circuit.cost = {**(circuit.cost or {}), "confirm": self.parts}
        if self.gather is not None and self.aggregate is not None and self.heads is not None:
            circuit.gather, circuit.aggregate, circuit.heads = list(self.gather), list(self.aggregate), list(self.heads)
        circuit.verdicts.update(self.verdicts)
        if self.positions is not None:
            circuit.positions = self.positions


@dataclass(frozen=True)
class PositionRecord(Record):
    """Where each costly layer acts (`positions.PositionScan`; ``None``: not measured, or, on
    a remote run, measured with the confirmation: ``pending`` holds its layers)."""

    stage: ClassVar[str] = "positions"
    position_scan: PositionScan | None = None
    pending: list[int] | None = None

    def apply(self, circuit: GnaCircuit) -> None:
        if self.position_scan is not None:
            circuit.positions = self.position_scan


@dataclass(frozen=True)
class KindsRecord(Record):
    """The kinds check (`kinds.kinds_check`): each role's set and both together ablated by the
    other kinds (``accuracy``, keys `ablation_kinds.key`: ``"-gather@mean"``,
    ``"-gather@mean:ends"``, ``"-gather@zero:ends"``...), their collapse verdicts
    (``"collapses:-gather@mean"``), what it checked (``settings``: ``{"kinds", "where"}``, kept
    as ``circuit.settings["kinds_checked"]``) and a ``note`` (resample skipped); empty: not run."""

    stage: ClassVar[str] = "kinds"
    accuracy: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    settings: dict[str, Any] | None = None
    note: str | None = None

    def apply(self, circuit: GnaCircuit) -> None:
        circuit.accuracy.update(self.accuracy)
        circuit.verdicts.update(self.verdicts)
        if self.settings is not None:
            circuit.settings["kinds_checked"] = self.settings
        if self.note is not None:
            circuit.warnings.append(self.note)


RECORDS: tuple[type[Record], ...] = (
    BaselineRecord,
    LabelCheckRecord,
    LayerScanRecord,
    PositionRecord,
    PrescreenRecord,
    HeadScanRecord,
    PatternRecord,
    EntryRecord,
    RoleRecord,
    JointRecord,
    ConfirmRecord,
    KindsRecord,
)
"""Every kind of record, by its stage's name (`records.record_from_dict` reads them)."""


class Records(Sequence[Record]):
    """The records of the stages run so far, in order: read-only. ``records.of(HeadScanRecord)``
    (or a property: ``records.baseline``...) is a stage's record; one whose stage has not run
    is a `GnaValueError` naming both (a stage of `plan.PLAN` placed too early)."""

    def __init__(self, items: Sequence[Record] = ()) -> None:
        self._items = tuple(items)

    def __getitem__(self, index: Any) -> Any:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Record]:
        return iter(self._items)

    def __repr__(self) -> str:
        return f"Records({[r.stage for r in self._items]})"

    def added(self, record: Record) -> Records:
        """These records and ``record`` after them (a new view; this one is unchanged)."""
        return Records((*self._items, record))

    def names(self) -> list[str]:
        return [r.stage for r in self._items]

    def find(self, kind: type[R]) -> R | None:
        """The record of ``kind``'s stage, or ``None`` if it has not run."""
        return next((r for r in self._items if isinstance(r, kind)), None)

    def of(self, kind: type[R]) -> R:
        """The record of ``kind``'s stage; a `GnaValueError` if it has not run."""
        found = self.find(kind)
        if found is None:
            ran = ", ".join(self.names()) or "none"
            raise GnaValueError(
                f"the {kind.stage!r} record was read before its stage ran (stages run: {ran}): a stage of PLAN runs too early"
            )
        return found

    @property
    def stopped(self) -> bool:
        """Whether the last stage ended the run."""
        return bool(self._items) and self._items[-1].ends_run()

    @property
    def baseline(self) -> BaselineRecord:
        return self.of(BaselineRecord)

    @property
    def head_scan(self) -> HeadScanRecord:
        return self.of(HeadScanRecord)

    @property
    def scan(self) -> head_scans.HeadScan:
        """The head scan as the latest stage left it (the entry stage finishes its search)."""
        return self._latest("scan", (EntryRecord, HeadScanRecord))

    @property
    def evidence(self) -> dict[Head, HeadEvidence]:
        """The examined heads' evidence as the latest stage left it (read-only: copy it to change it, `owned`)."""
        return self._latest("evidence", (JointRecord, RoleRecord, EntryRecord, HeadScanRecord))

    def _latest(self, name: str, kinds: tuple[type[Record], ...]) -> Any:
        for kind in kinds:
            found = self.find(kind)
            if found is not None:
                return getattr(found, name)
        return getattr(self.of(kinds[-1]), name)


def owned(ctx: Context, value: T) -> T:
    """A deep copy of ``value`` for a stage to change (an earlier record's evidence, head
    scan or circuit), sharing the model and the task (a scan's group measure reads them)."""
    return copy.deepcopy(value, {id(ctx.model): ctx.model, id(ctx.task): ctx.task})


def assemble(ctx: Context, records: Records) -> GnaCircuit:
    """The circuit of ``records``: the baseline's (`BaselineRecord.circuit`), each later
    record applied in order (`Record.apply`). A new circuit each call, sharing nothing with
    the records: a stage may change it (the joint and confirmation stages measure on it)."""
    circuit = records.baseline.circuit(ctx)
    for record in records[1:]:
        record.apply(circuit)
    return owned(ctx, circuit)
