"""The measurements of `discover`'s stages (`plan.PLAN` calls them), in the order it runs them:
`check_arguments`, `first_request` (a remote run's first request), `baseline` and
`label_check`, `layer_stages` (truncation and layer scans), `prescreen_stage`, the head scan
(`head_scans.head_scan`), `entry_stage` (`LabelInputs`), `role_stage`, `entry_ends`,
and `confirm_stage` (the joint stage asks the runner: `runner.Runner.joint_search`)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import Ablate
from ..models.structure import ablating_every_head_skips, acts_where_it_writes, mixer_is_the_block
from ..scoring.evaluation import Evaluation, check_task, evaluate
from ..scoring.verdicts import MECHANISMS, label_verdict
from ..tasks.base import Task
from ..tasks.mcq import shuffle_labels
from . import head_scans, layer_scans, memo, remote
from .circuit import GnaCircuit, alone_verdicts, collapse_verdicts
from .confirm import SPREAD_FRACTION, confirm, confirm_paths, enter_spread, roles_left_open, spread_check, spread_check_runs
from .entry import ENTRY_POSITIONS, entry_scan
from .evidence import HeadEvidence
from .group_testing import stage_one
from .joint import head_float
from .roles import RoleScores, RoleThresholds, entry_shares, label, pattern_agrees

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask
    from .positions import ScanRuns


class NoRetrievalWarning(UserWarning):
    """The model answers the task at about chance: there is no retrieval to explain."""


class PositionalAnswerWarning(UserWarning):
    """The model answers multiple-choice prompts by the option's place (counting lines),
    not by reading its label: with the labels shuffled it falls to chance. Its heads may
    then count options rather than gather and aggregate them."""


STAGES = ("truncation", "layers", "positions", "heads", "entry", "roles", "joint", "confirm")
SEARCH_STAGES = ("layers", "heads", "entry", "roles", "joint")
"""The stages that decide which heads a role's set holds: `stability` re-runs only these
(the truncation scan and the confirmation measure, they do not choose)."""


def check_arguments(
    model: GnaModel, task: Task, stages: Sequence[str], thresholds: RoleThresholds | None, layers: Sequence[int] | None
) -> tuple[RoleThresholds, list[int]]:
    """`discover`'s arguments checked: the thresholds (default `RoleThresholds()`) and the
    layers to scan (default every layer)."""
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise GnaValueError(f"unknown stages {unknown}: expected a subset of {STAGES}")
    check_task(task, "discover")
    if task.n_segments < 2:
        raise GnaValueError(f"task {task.name!r} has {task.n_segments} segment(s): G&A discovery needs at least 2 options to retrieve from")
    scan_layers = list(range(model.n_layers)) if layers is None else list(layers)
    for layer in scan_layers:
        model.check_layer(layer)
    return thresholds or RoleThresholds(), scan_layers


def first_request(model: GnaModel, task: Task, stages: Sequence[str], check_labels: bool, wide: Sequence[int]) -> remote.FirstScans:
    """A remote run's first request (`remote.first_scans`): the baseline, the label check, the
    truncation and layer scans, and the first stage of group testing of the ``wide`` layers
    when there are at most `remote.SPECULATE_LAYERS` of them."""
    speculated = []
    if len(wide) <= remote.SPECULATE_LAYERS:
        speculated = [g for layer in wide for g in stage_one([Head(layer, h) for h in range(model.heads_per_layer[layer])])]
    return remote.first_scans(model, task, stages, check_labels, speculated)


def retrieval_floor(chance: float, chance_margin: float, n_prompts: int) -> dict[str, float]:
    """What clean accuracy must reach for a retrieval to explain: ``chance + margin``, where
    ``margin = max(chance_margin, 2 * sqrt(chance * (1 - chance) / n_prompts))`` (two binomial
    standard errors of an at-chance accuracy over ``n_prompts``: about a one-sided test at
    the 2.5% level), i.e. at least ``prompts`` correct answers of ``n_prompts``."""
    margin = max(chance_margin, 2 * math.sqrt(chance * (1 - chance) / max(n_prompts, 1)))
    accuracy = chance + margin
    return {"accuracy": accuracy, "margin": margin, "prompts": math.ceil(accuracy * n_prompts - 1e-9), "n_prompts": n_prompts}


def baseline(model: GnaModel, task: Task, clean: Evaluation, chance_margin: float, settings: dict[str, Any]) -> GnaCircuit:
    """The circuit with the baseline's accuracy and its ``mechanism``: ``"none"`` (with a
    `NoRetrievalWarning`) when clean accuracy is below `retrieval_floor`, there is no
    retrieval to explain; else ``"g&a"`` (until the label check says ``"counting"``).
    Nothing found yet."""
    chance = clean.chance
    floor = retrieval_floor(chance, chance_margin, len(task))
    settings["retrieval_floor"] = floor
    notes = []
    mechanism = "g&a"
    if clean.accuracy < floor["accuracy"]:
        mechanism = "none"
        notes.append(
            f"clean accuracy {clean.accuracy:.3f} is near chance ({chance:.3f}): there is no retrieval to explain "
            f"(needs at least {floor['accuracy']:.3f}, {floor['prompts']} of {len(task)} prompts)"
        )
        warnings.warn(notes[-1], NoRetrievalWarning, stacklevel=4)
    return GnaCircuit(
        model=model.name,
        family=model.arch.family,
        task=task.name,
        n_prompts=len(task),
        gather=[],
        aggregate=[],
        heads=[],
        accuracy={"clean": clean.accuracy, "chance": chance},
        needs={},
        warnings=notes,
        n_segments=task.n_segments,
        settings=settings,
        mechanism=mechanism,
    )


def layer_stages(
    model: GnaModel, task: Task, circuit: GnaCircuit, stages: Sequence[str], first: Any, min_effect: float, progress: bool
) -> None:
    """The truncation scan with its critical layer, and the layer scan, screened in groups
    (`layer_scans.screen_layers`; a remote run's ``first`` request measured every group it
    may ask for). ``circuit.settings["layer_scan"]``: per layer, the layers skipped in the
    forward that gave its ``circuit.layer_scan`` value, and the forwards the screen asked for."""
    clean, chance = circuit.accuracy["clean"], circuit.accuracy["chance"]
    if "truncation" in stages:
        circuit.truncation = layer_scans.truncation_scan(model, task, progress=progress) if first is None else first.truncation
        circuit.critical_layer = layer_scans.critical_layer(circuit.truncation, clean, chance)  # type: ignore[arg-type]
    if "layers" in stages:
        if first is None:
            scan = layer_scans.screened_layer_scan(model, task, clean, min_effect, progress=progress)
        else:
            scan = layer_scans.screen_layers(model.n_layers, clean, min_effect, lambda a, b: first.layer_ranges[a, b])
        circuit.layer_scan = scan.accuracy
        circuit.settings["layer_scan"] = {"skipped": [list(pair) for pair in scan.skipped], "tests": scan.tests}


def prescreen_stage(
    model: GnaModel,
    task: Task,
    circuit: GnaCircuit,
    scan_layers: list[int],
    wide: list[int],
    thresholds: RoleThresholds,
    screen_above: int,
    prescreen_keep: int,
    batched: bool,
    early: head_scans.FirstOrder | None = None,
) -> tuple[list[Head], list[int], list[Head]]:
    """Too many heads to ablate one by one: the heads the head scan ablates alone
    (`head_scans.prescreen`), the costly wide layers it scans by group testing, and the
    quiet heads among the first: those of the costly narrow layers whose estimate is
    exactly 0 (`head_scans.head_scan`'s ``quiet``: ablated together first)."""
    clean = circuit.accuracy["clean"]
    costly = [layer for layer, accuracy in enumerate(circuit.layer_scan or []) if clean - accuracy >= thresholds.min_effect]
    costly = [layer for layer in costly if layer in scan_layers]
    adaptive = [layer for layer in costly if model.heads_per_layer[layer] > screen_above]  # wide: group testing
    narrow = [layer for layer in costly if layer not in adaptive]
    # A wide layer the layer scan clears is group testing's first group costing nothing, where
    # the layer scan removed its heads alone (its one mixer is the whole block): none of its
    # heads is ranked or ablated (monotone effects, as group testing assumes). Elsewhere the
    # scan also removed an MLP or another mixer, and the prescreen ranks its heads.
    scanned = circuit.layer_scan is not None
    cleared = [layer for layer in wide if scanned and layer not in costly and mixer_is_the_block(model, layer)]
    for layer in adaptive if scanned and not batched else ():  # group testing's first group, measured by the layer scan
        if ablating_every_head_skips(model, layer):
            every = [Head(layer, h) for h in range(model.heads_per_layer[layer])]
            memo.remember(model, task, [Ablate(every)], circuit.layer_scan[layer])  # type: ignore[index]
    screened = head_scans.prescreen(model, task, scan_layers, narrow, prescreen_keep, grouped=[*adaptive, *cleared], first=early)
    circuit.settings["prescreen"] = screened.method
    if screened.estimates is not None:
        circuit.attribution = [[head_float(v) for v in row] for row in screened.estimates]
    estimates = screened.estimates
    quiet = [] if estimates is None else [h for h in screened.heads if h.layer in narrow and float(estimates[h.layer, h.head]) == 0.0]
    return screened.heads, adaptive, quiet


def early_first_order(
    model: GnaModel,
    task: Task,
    stages: Sequence[str],
    scan_layers: list[int],
    screen_above: int,
    prescreen_above: int,
    has_backward: bool = True,
) -> head_scans.FirstOrder | None:
    """`head_scans.first_order` of every head of the narrow scan layers, before the baseline,
    where the prescreen will run (more heads than ``prescreen_above``) and can read it: a
    local model without active interventions (its forward must be the clean one) and a task
    of one-token answers. Its forward is the baseline's (`first_order`): one pass fewer. A
    discovery that stops at the baseline (no retrieval) has spent its backwards for nothing."""
    narrow = [
        Head(layer, h) for layer in scan_layers if model.heads_per_layer[layer] <= screen_above for h in range(model.heads_per_layer[layer])
    ]
    if "heads" not in stages or sum(model.heads_per_layer[layer] for layer in scan_layers) <= prescreen_above or not narrow:
        return None
    if model.active_interventions or not has_backward:
        return None
    if not task.encode(task.tokenizer_for(model.tokenizer)).single_token:
        return None
    return head_scans.first_order(model, task, narrow)


def entry_stage(
    model: GnaModel,
    task: Task,
    encoded: EncodedTask,
    evidence: dict[Head, HeadEvidence],
    harmful: list[Head],
    scan: head_scans.HeadScan,
    progress: bool,
    labels: LabelInputs | None = None,
) -> None:
    """Where each harmful head's effect enters (`entry_scan`); a remote scan's spread-group
    search travels in the same request. With ``labels`` (a local search whose pattern
    scores are measured first), only what the role labels read: every head on the
    segments, then at the final position only the heads whose label depends on it
    (`needs_final`); the segment ends of the heads labelled Gather come after the labels
    (`entry_ends`). Without, all three for every head (one request remotely)."""
    local = [h for h in harmful if acts_where_it_writes(model, h)]
    pending = scan.search.pending if scan.search is not None else []
    searched: list[float] = []
    where = ("segments",) if labels is not None else ENTRY_POSITIONS
    found = entry_scan(model, task, encoded, local, progress=progress, extra=pending, extra_values=searched, where=where)
    for head, entry in found.items():
        evidence[head].entry = entry
    if scan.search is not None and searched:
        scan.search.finish(searched)
    if labels is not None:
        finals = [h for h in local if h in evidence and evidence[h].entry is not None and labels.needs_final(evidence[h])]
        for head, entry in entry_scan(model, task, encoded, finals, progress=progress, where=("final",)).items():
            evidence[head].entry = {"final": entry["final"], **(evidence[head].entry or {})}


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


def entry_ends(model: GnaModel, task: Task, encoded: EncodedTask, evidence: dict[Head, HeadEvidence], progress: bool) -> None:
    """The segment-ends accuracy (`entry_scan`'s ``"ends"``: where the paper's Gather
    writes its summary) of the heads labelled Gather that the entry scan measured without it."""
    heads = [h for h, item in evidence.items() if item.role == "gather" and item.entry is not None and "ends" not in item.entry]
    for head, entry in entry_scan(model, task, encoded, heads, progress=progress, where=("ends",)).items():
        evidence[head].entry = {**(evidence[head].entry or {}), "ends": entry["ends"]}


def role_stage(
    model: GnaModel,
    task: Task,
    evidence: dict[Head, HeadEvidence],
    candidates: list[Head],
    harmful: list[Head],
    measured: dict[Head, RoleScores],
    thresholds: RoleThresholds,
    clean: float,
) -> None:
    """Pattern scores of the candidates, and the harmful heads' role labels (from the entry
    shares, or the patterns alone), in the order of the heads' positions."""
    for head, scores in ((h, measured[h]) for h in candidates):
        item = evidence[head]
        item.scores = scores
        if head in harmful:
            shares = None if item.entry is None else entry_shares(clean, item.ablated_accuracy or 0.0, item.entry)
            item.role = label(scores, thresholds, shares)
    gather_before_aggregate(evidence, model.head_position)
    for item in evidence.values():
        item.pattern_agrees = None if item.scores is None else pattern_agrees(item.role, item.scores, thresholds, task.n_segments)


def confirm_stage(
    model: GnaModel,
    task: Task,
    encoded: EncodedTask,
    circuit: GnaCircuit,
    scan: head_scans.HeadScan,
    threshold: float,
    max_heads: int,
    evaluate_bars: bool | None,
    batched: bool,
    positions_pending: ScanRuns | None = None,
) -> None:
    """The confirmation (`confirm.confirm`), then the spread check of the roles left open
    (`confirm.spread_check`). ``positions_pending``: a remote run's position scan, measured in
    the confirmation's request (``circuit.positions``)."""
    # A remote run measures the spread check's layers speculatively in the confirmation's
    # request (every role that may stay open), so the check costs no request of its own.
    check_spread = encoded.single_token and circuit.accuracy["clean"] >= threshold
    spread_runs = spread_check_runs(model, task, encoded, circuit, roles_left_open(circuit)) if check_spread and batched else None
    extra = spread_runs or ([], [])
    if positions_pending is not None:
        extra = (extra[0], [*extra[1], *positions_pending.runs])
    values = confirm(model, task, circuit, threshold, max_heads, evaluate_bars, extra if extra[1] else None, paths=False)
    spread_values = values
    if positions_pending is not None and values is not None:
        spread_values, scanned = values[: len(extra[0])], values[len(extra[0]) :]
        circuit.positions = positions_pending.scan(scanned, circuit.accuracy["clean"], circuit.thresholds.min_effect)
    if check_spread:
        spread_check(model, task, encoded, circuit, scan, threshold, max_heads, spread_runs, spread_values)
        enter_spread(model, task, circuit, SPREAD_FRACTION, evaluate_bars)
    confirm_paths(model, task, circuit)
    circuit.verdicts.update(collapse_verdicts(circuit) | alone_verdicts(circuit))  # from the counts measured: no forward


def label_check(
    model: GnaModel,
    task: Task,
    circuit: GnaCircuit,
    clean: Evaluation,
    margin: float,
    evaluate_bars: bool | None,
    measured: Evaluation | None = None,
) -> None:
    """Accuracy with the labels shuffled (skipped for tasks that are not multiple choice) and
    the mechanism it shows, tested (`verdicts.label_verdict`, from both evaluations' per-prompt
    results: no forward of its own): ``circuit.verdicts["labels"]`` (with its two tests,
    ``"labels_vs_chance"`` and ``"labels_vs_clean"``) and ``circuit.mechanism`` (``"g&a"``,
    ``"partly"``, ``"counting"`` or ``"undetermined"``). ``measured``: the shuffled prompts'
    evaluation, already measured (a remote run measures it with the first scans)."""
    try:
        relabelled = shuffle_labels(task)
    except ValueError:
        return
    shuffled = evaluate(model, relabelled, progress=evaluate_bars) if measured is None else measured
    circuit.accuracy["shuffled_labels"] = shuffled.accuracy
    verdict, floor, drop = label_verdict(clean.is_correct, shuffled.is_correct, clean.chance, margin)
    circuit.verdicts.update({"labels": verdict, "labels_vs_chance": floor, "labels_vs_clean": drop})
    circuit.mechanism = MECHANISMS[verdict.word]
    if verdict.word == "by place":
        circuit.warnings.append(
            f"with the labels shuffled, accuracy falls from {circuit.accuracy['clean']:.3f} to {shuffled.accuracy:.3f}: the model "
            "answers by the option's place, not by its label, so its heads may count options rather than gather and aggregate them "
            f"({verdict.text})"
        )
        warnings.warn(circuit.warnings[-1], PositionalAnswerWarning, stacklevel=4)
    elif verdict.word != "by label":
        circuit.warnings.append(f"the label check: {verdict.text}")


def candidates(accuracy: torch.Tensor, verified: torch.Tensor, limit: int, cleared: Sequence[Head] = ()) -> list[Head]:
    """Verified heads and the narrow head scan's ``cleared`` ones (`head_scans.HeadScan.cleared`:
    each measured in its group), most harmful first, at most ``limit``."""
    found = [(float(accuracy[layer, head]), Head(layer, head)) for layer, head in verified.nonzero().tolist()]
    found += [(float(accuracy[h.layer, h.head]), h) for h in cleared]
    return sorted(head for _, head in sorted(found)[:limit])


def gather_before_aggregate(evidence: dict[Head, HeadEvidence], position: Callable[[Head], tuple[int, int]]) -> None:
    """A Gather head feeds an Aggregate head, so the roles keep the order of the heads'
    positions (``(layer, stage)``: a Zamba2 layer's Mamba-2 reads its shared attention;
    FalconH1's parallel mixers share one): drop Gather labels at or after the last
    Aggregate position (a segment-local head there cannot feed the readout), then, if
    Gather heads remain, Aggregate labels at or before the first of them (a head there
    reads no summaries: in layer 0, only token embeddings)."""
    aggregates = [position(e.head) for e in evidence.values() if e.role == "aggregate"]
    if not aggregates:
        return
    last = max(aggregates)
    for item in evidence.values():
        if item.role == "gather" and position(item.head) >= last:
            item.role = None
    gathers = [position(e.head) for e in evidence.values() if e.role == "gather"]
    if not gathers:
        return
    first = min(gathers)
    for item in evidence.values():
        if item.role == "aggregate" and position(item.head) <= first:
            item.role = None
