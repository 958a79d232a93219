"""The measurements of `discover`'s stages (`plan.PLAN` calls them), in the order it runs them:
`check_arguments`, `early_first_order`, `baseline` and
`label_check`, `layer_stages` (truncation and layer scans), `prescreen_stage`, the head scan
(`head_scans.head_scan`), `entry_stage` (`LabelInputs`), `role_stage`, `entry_ends`,
and `confirm_stage` (the joint stage asks the runner: `runner.Runner.joint_search`).

Each returns what it measured (a value, or its stage's record, `stage_records`); none
changes an earlier stage's record. `confirm_stage` measures on the stage's own draft of the
circuit (`stage_records.owned`), whose changes its stage keeps."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import Ablate
from ..cost import tally
from ..models.structure import ablating_every_head_skips, acts_where_it_writes, mixer_is_the_block
from ..scoring.evaluation import Evaluation, check_task, evaluate
from ..scoring.verdicts import MECHANISMS, label_verdict
from ..tasks.base import Task
from ..tasks.mcq import shuffle_labels
from . import head_order, head_scans, layer_scans, memo, remote
from .circuit import GnaCircuit, alone_verdicts, collapse_verdicts
from .confirm import (
    SPREAD_FRACTION,
    confirm,
    confirm_paths,
    confirm_table,
    cover_collapses,
    enter_spread,
    roles_left_open,
    settle_segments,
    speculate_segments,
    spread_check,
    spread_check_runs,
)
from .entry import ENTRY_POSITIONS, entry_scan
from .evidence import HeadEvidence
from .joint import head_float
from .roles import RoleScores, RoleThresholds, entry_shares, label, pattern_agrees
from .settings import SEARCH_STAGES, STAGES
from .stage_records import LabelCheckRecord, LabelInputs, LayerScanRecord, PrescreenRecord

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from .context import Context
    from .positions import ScanRuns
    from .settings import DiscoverySettings

__all__ = ["SEARCH_STAGES", "STAGES", "LabelInputs"]  # their homes: `settings`, `stage_records`


class NoRetrievalWarning(UserWarning):
    """The model answers the task at about chance: there is no retrieval to explain."""


class PositionalAnswerWarning(UserWarning):
    """The model answers multiple-choice prompts by the option's place (counting lines),
    not by reading its label: with the labels shuffled it falls to chance. Its heads may
    then count options rather than gather and aggregate them."""


def check_arguments(model: GnaModel, task: Task, settings: DiscoverySettings) -> tuple[RoleThresholds, list[int]]:
    """`discover`'s arguments checked: the thresholds (default `RoleThresholds()`) and the
    layers to scan (default every layer)."""
    stages, thresholds, layers = settings.stages, settings.thresholds, settings.layers
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


def retrieval_floor(chance: float, chance_margin: float, n_prompts: int) -> dict[str, float]:
    """What clean accuracy must reach for a retrieval to explain: ``chance + margin``, where
    ``margin = max(chance_margin, 2 * sqrt(chance * (1 - chance) / n_prompts))`` (two binomial
    standard errors of an at-chance accuracy over ``n_prompts``: about a one-sided test at
    the 2.5% level), i.e. at least ``prompts`` correct answers of ``n_prompts``."""
    margin = max(chance_margin, 2 * math.sqrt(chance * (1 - chance) / max(n_prompts, 1)))
    accuracy = chance + margin
    return {"accuracy": accuracy, "margin": margin, "prompts": math.ceil(accuracy * n_prompts - 1e-9), "n_prompts": n_prompts}


def baseline(task: Task, clean: Evaluation, chance_margin: float) -> tuple[str, list[str], dict[str, float]]:
    """The baseline's ``mechanism``, its warnings and the `retrieval_floor`: ``"none"`` (with
    a `NoRetrievalWarning`) when clean accuracy is below the floor, there is no retrieval to
    explain; else ``"g&a"`` (until the label check says ``"counting"``)."""
    chance = clean.chance
    floor = retrieval_floor(chance, chance_margin, len(task))
    notes: list[str] = []
    mechanism = "g&a"
    if clean.accuracy < floor["accuracy"]:
        mechanism = "none"
        notes.append(
            f"clean accuracy {clean.accuracy:.3f} is near chance ({chance:.3f}): there is no retrieval to explain "
            f"(needs at least {floor['accuracy']:.3f}, {floor['prompts']} of {len(task)} prompts)"
        )
        warnings.warn(notes[-1], NoRetrievalWarning, stacklevel=4)
    return mechanism, notes, floor


def layer_stages(ctx: Context, clean: float, chance: float, *, first: remote.FirstScans | None) -> LayerScanRecord:
    """The truncation scan with its critical layer, and the layer scan, screened in groups
    (`layer_scans.screen_layers`; a remote run's ``first`` request measured every group it
    may ask for). The record's ``screen``: per layer, the layers skipped in the forward
    that gave its ``layer_scan`` value, and the forwards the screen asked for. The run
    ends after it without ``"heads"``."""
    model, task, stages, progress = ctx.model, ctx.task, ctx.settings.stages, ctx.progress
    truncation = critical = accuracy = screen = None
    if "truncation" in stages:
        truncation = layer_scans.truncation_scan(model, task, progress=progress) if first is None else first.truncation
        critical = layer_scans.critical_layer(truncation, clean, chance)  # type: ignore[arg-type]
    if "layers" in stages:
        min_effect = ctx.thresholds.min_effect
        if first is None:
            scan = layer_scans.screened_layer_scan(model, task, clean, min_effect, progress=progress)
            remember_layers(model, task, scan.accuracy, scan.skipped)
        else:
            scan = layer_scans.screen_layers(model.n_layers, clean, min_effect, lambda a, b: first.layer_ranges[a, b])
        accuracy = scan.accuracy
        screen = {"skipped": [list(pair) for pair in scan.skipped], "tests": scan.tests}
    return LayerScanRecord("heads" not in stages, truncation, critical, accuracy, screen)


def remember_layers(model: GnaModel, task: Task, accuracy: Sequence[float], skipped: Sequence[tuple[int, int]]) -> list[int]:
    """Each layer the layer scan skipped alone (``skipped[layer] == (layer, layer)``) whose every
    head ablated (zero, at every position) is the same forward (`ablating_every_head_skips`):
    its ``accuracy`` recorded in the accuracy memo as that ablation's, so a later set of
    exactly its heads (a joint pool, a role's set) is answered, not run. Returns those layers."""
    kept = []
    for layer, (first, last) in enumerate(skipped):
        if first == last == layer and ablating_every_head_skips(model, layer):
            every = [Head(layer, h) for h in range(model.heads_per_layer[layer])]
            if memo.remember(model, task, [Ablate(every)], accuracy[layer]):
                kept.append(layer)
    return kept


def prescreen_stage(
    ctx: Context, clean: float, layer_scan: list[float] | None, *, early: head_scans.FirstOrder | None = None
) -> PrescreenRecord:
    """Too many heads to ablate one by one: the heads the head scan ablates alone
    (`head_scans.prescreen`), the costly wide layers (of the layer scan ``layer_scan``) it
    scans by group testing, and the quiet heads among the first: those of the costly narrow
    layers whose estimate is exactly 0 (`head_scans.head_scan`'s ``quiet``: ablated together
    first); how they were chosen and the estimates (``[layer][head]``)."""
    model, task, s, scan_layers = ctx.model, ctx.task, ctx.settings, ctx.scan_layers
    costly = [layer for layer, accuracy in enumerate(layer_scan or []) if clean - accuracy >= ctx.thresholds.min_effect]
    costly = [layer for layer in costly if layer in scan_layers]
    adaptive = [layer for layer in costly if model.heads_per_layer[layer] > s.screen_above]  # wide: group testing
    narrow = [layer for layer in costly if layer not in adaptive]
    # A wide layer the layer scan clears is group testing's first group costing nothing, where
    # the layer scan removed its heads alone (its one mixer is the whole block): none of its
    # heads is ranked or ablated (monotone effects, as group testing assumes). Elsewhere the
    # scan also removed an MLP or another mixer, and the prescreen ranks its heads.
    scanned = layer_scan is not None
    cleared = [layer for layer in ctx.wide if scanned and layer not in costly and mixer_is_the_block(model, layer)]
    # group testing's first group (every head of an adaptive layer) is answered by the layer scan's value (`remember_layers`)
    screened = head_scans.prescreen(model, task, scan_layers, narrow, s.keep, grouped=[*adaptive, *cleared], first=early)
    estimates = screened.estimates
    attribution = None if estimates is None else [[head_float(v) for v in row] for row in estimates]
    quiet = [] if estimates is None else [h for h in screened.heads if h.layer in narrow and float(estimates[h.layer, h.head]) == 0.0]
    return PrescreenRecord(screened.heads, adaptive, quiet, screened.method, attribution)


def early_first_order(ctx: Context) -> head_scans.FirstOrder | None:
    """`head_scans.first_order` of every head of the narrow scan layers, before the baseline,
    where the prescreen will run (more heads than ``prescreen_above``) and can read it: a
    local model without active interventions (its forward must be the clean one; the runner
    has a backward) and a task of one-token answers. Its forward is the baseline's
    (`first_order`): one pass fewer. A discovery that stops at the baseline (no retrieval)
    has spent its backwards for nothing."""
    model, s, scan_layers = ctx.model, ctx.settings, ctx.scan_layers
    narrow = [
        Head(layer, h)
        for layer in scan_layers
        if model.heads_per_layer[layer] <= s.screen_above
        for h in range(model.heads_per_layer[layer])
    ]
    if "heads" not in s.stages or sum(model.heads_per_layer[layer] for layer in scan_layers) <= s.prescreen_above or not narrow:
        return None
    if model.active_interventions or not ctx.runner.has_backward:
        return None
    if not ctx.encoded.single_token:
        return None
    return head_scans.first_order(model, ctx.task, narrow)


def early_head_order(ctx: Context) -> dict[int, list[Head]] | None:
    """Group testing's order of every wide scan layer (more than ``screen_above`` heads:
    `head_order.ordered_layers`), before the baseline, where its forward can be the clean one
    (a local model without active interventions, a run with a head scan, no early first-order
    forward): it fills the prefix cache, so `evaluate`'s baseline after it runs no block, and
    the head scan reads the order here (one pass fewer; the layers the layer scan clears
    after it were captured in the same forward)."""
    model, wide = ctx.model, ctx.wide
    if not wide or ctx.batched or model.active_interventions:
        return None
    if head_order.bytes_per_prompt(model, wide, ctx.encoded.batch.n_pos) > head_order.CAPTURE_BYTES:
        return None  # one prompt's head outputs alone are too big: the head scan orders only the layers it tests
    return head_order.ordered_layers(model, ctx.task, wide, prime=True)


def entry_stage(
    ctx: Context,
    evidence: dict[Head, HeadEvidence],
    scan: head_scans.HeadScan,
    *,
    harmful: list[Head],
    labels: LabelInputs | None = None,
    cleared: dict[int, float] | None = None,
) -> dict[Head, dict[str, float]]:
    """Where each harmful head's effect enters (`entry_scan`): per head measured, its entry
    accuracies. A remote scan's spread-group search travels in the same request (finished
    on ``scan``: the stage's own copy). With ``labels`` (a local search whose pattern scores
    are measured first), only what the role labels read: every head on the segments, then
    at the final position only the heads whose label depends on it (`needs_final`); the
    segment ends of the heads labelled Gather come after the labels (`entry_ends`).
    Without, all three for every head (one request remotely). ``cleared``: the position
    scan's layers cleared at every position but the final one (`entry_scan`'s)."""
    model, task, encoded, progress = ctx.model, ctx.task, ctx.encoded, ctx.progress
    local = [h for h in harmful if acts_where_it_writes(model, h)]
    pending = scan.search.pending if scan.search is not None else []
    searched: list[float] = []
    where = ("segments",) if labels is not None else ENTRY_POSITIONS
    found = entry_scan(model, task, encoded, local, progress=progress, extra=pending, extra_values=searched, where=where, cleared=cleared)
    entries = dict(found)
    if scan.search is not None and searched:
        scan.search.finish(searched)
    if labels is not None:
        finals = [h for h in local if h in evidence and h in entries and labels.needs_final(replace(evidence[h], entry=entries[h]))]
        for head, entry in entry_scan(model, task, encoded, finals, progress=progress, where=("final",)).items():
            entries[head] = {"final": entry["final"], **entries[head]}
    return entries


def entry_ends(ctx: Context, evidence: dict[Head, HeadEvidence]) -> dict[Head, dict[str, float]]:
    """The segment-ends accuracy (`entry_scan`'s ``"ends"``: where the paper's Gather
    writes its summary) of the heads labelled Gather that the entry scan measured without
    it: per such head, its entry with ``"ends"`` added."""
    heads = [h for h, item in evidence.items() if item.role == "gather" and item.entry is not None and "ends" not in item.entry]
    found = entry_scan(ctx.model, ctx.task, ctx.encoded, heads, progress=ctx.progress, where=("ends",))
    return {head: {**(evidence[head].entry or {}), "ends": entry["ends"]} for head, entry in found.items()}


def role_stage(
    ctx: Context, evidence: dict[Head, HeadEvidence], *, harmful: list[Head], measured: dict[Head, RoleScores], clean: float
) -> dict[Head, HeadEvidence]:
    """The evidence with the pattern scores ``measured`` (of the candidates: the heads of
    ``evidence``), and the harmful heads' role labels (from the entry shares, or the
    patterns alone), in the order of the heads' positions: new items, ``evidence`` unchanged."""
    thresholds = ctx.thresholds
    labelled = {h: replace(item) for h, item in evidence.items()}
    for head, item in labelled.items():
        if head not in measured:
            continue
        item.scores = scores = measured[head]
        if head in harmful:
            shares = None if item.entry is None else entry_shares(clean, item.ablated_accuracy or 0.0, item.entry)
            item.role = label(scores, thresholds, shares)
    for item in labelled.values():
        item.pattern_agrees = None if item.scores is None else pattern_agrees(item.role, item.scores, thresholds, ctx.task.n_segments)
    return labelled


NOT_COVERED = (
    "the spread roles' sets and the collapses the position scan found were not added to the circuit: ordering a "
    "layer's heads needs a local backward, which a remote model has not (stage 'cover'; the circuit holds the sets "
    "the search found)"
)
"""The note of a run asked to cover its collapses on a runner without a backward."""


def confirm_stage(
    ctx: Context, circuit: GnaCircuit, scan: head_scans.HeadScan, *, threshold: float, positions_pending: ScanRuns | None = None
) -> None:
    """Into ``circuit`` and ``scan`` (the stage's own copies): the confirmation
    (`confirm.confirm`), the spread check of the roles left open (`confirm.spread_check`), the
    spread roles' sets into the circuit (`confirm.enter_spread`), then path patching and MIB's
    score on the sets as they stand (`confirm.confirm_paths`) and the tested verdicts.
    ``positions_pending``: a remote run's position scan, measured in the confirmation's
    request (``circuit.positions``)."""
    model, task, encoded, max_heads = ctx.model, ctx.task, ctx.encoded, ctx.settings.max_heads_per_role
    # A remote run measures the spread check's layers speculatively in the confirmation's
    # request (every role that may stay open), so the check costs no request of its own.
    check_spread = encoded.single_token and circuit.accuracy["clean"] >= threshold
    spread_runs = spread_check_runs(model, task, encoded, circuit, roles_left_open(circuit)) if check_spread and ctx.batched else None
    if spread_runs is not None and positions_pending is not None:  # where the Gather role is searched is not known yet
        spread_runs = speculate_segments(model, task, encoded, spread_runs)
    extra = spread_runs or ([], [])
    if positions_pending is not None:
        extra = (extra[0], [*extra[1], *positions_pending.runs])
    # locally the table is measured once, on the sets as they end (the spread sets and the coverage may grow them)
    batched = ctx.batched
    parts: dict[str, dict[str, float]] = {}  # what each part of the confirmation ran (`circuit.cost["confirm"]`)
    with tally(model, parts, "needs", len(task)):
        values = confirm(model, task, circuit, threshold, max_heads, ctx.evaluate_bars, extra if extra[1] else None, paths=False)
    spread_values = values
    if positions_pending is not None and values is not None:
        spread_values, scanned = values[: len(extra[0])], values[len(extra[0]) :]
        circuit.positions = positions_pending.scan(scanned, circuit.accuracy["clean"], circuit.thresholds.min_effect)
        if spread_runs is not None:
            spread_runs, spread_values = settle_segments(circuit, encoded, spread_runs, spread_values)
    grown: list[str] = []
    if check_spread:
        with tally(model, parts, "spread check", len(task)):
            spread_check(model, task, encoded, circuit, scan, threshold, max_heads, spread_runs, spread_values)
        if "cover" in ctx.settings.stages and ctx.runner.has_backward:
            with tally(model, parts, "coverage", len(task)):
                grown = enter_spread(model, circuit, SPREAD_FRACTION) + cover_collapses(model, task, encoded, circuit, scan, threshold)
        elif "cover" in ctx.settings.stages:
            circuit.warnings.append(NOT_COVERED)
    if grown or not batched:  # the confirmation's table on the sets as they end (remotely: again, where they grew)
        with tally(model, parts, "table", len(task)):
            confirm_table(model, task, circuit, ctx.evaluate_bars)
    confirm_paths(model, task, circuit, parts)
    circuit.cost = {**(circuit.cost or {}), "confirm": parts}
    circuit.verdicts.update(collapse_verdicts(circuit) | alone_verdicts(circuit))  # from the counts measured: no forward


def label_check(ctx: Context, *, clean: Evaluation, measured: Evaluation | None = None) -> LabelCheckRecord:
    """Accuracy with the labels shuffled (nothing for tasks that are not multiple choice) and
    the mechanism it shows, tested (`verdicts.label_verdict`, from both evaluations' per-prompt
    results: no forward of its own): ``"labels"`` (with its two tests, ``"labels_vs_chance"``
    and ``"labels_vs_clean"``) and the mechanism (``"g&a"``, ``"partly"``, ``"counting"`` or
    ``"undetermined"``). ``measured``: the shuffled prompts' evaluation, already measured (a
    remote run measures it with the first scans)."""
    try:
        relabelled = shuffle_labels(ctx.task)
    except ValueError:
        return LabelCheckRecord()
    shuffled = evaluate(ctx.model, relabelled, progress=ctx.evaluate_bars) if measured is None else measured
    verdict, floor, drop = label_verdict(clean.is_correct, shuffled.is_correct, clean.chance, ctx.settings.chance_margin)
    tested = {"labels": verdict, "labels_vs_chance": floor, "labels_vs_clean": drop}
    note = None
    if verdict.word == "by place":
        note = (
            f"with the labels shuffled, accuracy falls from {clean.accuracy:.3f} to {shuffled.accuracy:.3f}: the model "
            "answers by the option's place, not by its label, so its heads may count options rather than gather and aggregate them "
            f"({verdict.text})"
        )
        warnings.warn(note, PositionalAnswerWarning, stacklevel=4)
    elif verdict.word != "by label":
        note = f"the label check: {verdict.text}"
    return LabelCheckRecord(shuffled.accuracy, note, MECHANISMS[verdict.word], tested)


def candidates(accuracy: torch.Tensor, verified: torch.Tensor, limit: int, cleared: Sequence[Head] = ()) -> list[Head]:
    """Verified heads and the narrow head scan's ``cleared`` ones (`head_scans.HeadScan.cleared`:
    each measured in its group), most harmful first, at most ``limit``."""
    found = [(float(accuracy[layer, head]), Head(layer, head)) for layer, head in verified.nonzero().tolist()]
    found += [(float(accuracy[h.layer, h.head]), h) for h in cleared]
    return sorted(head for _, head in sorted(found)[:limit])
