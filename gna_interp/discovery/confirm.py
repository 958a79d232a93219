"""The last stages of discovery: the confirmation (`confirm`: each role's heads ablated, the
fallback needs, the Gather -> Aggregate path-patching check, `gather_to_aggregate`) and the
spread check of the roles left open (`spread`, `spread_runs`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import Ablate, Intervention
from ..core.plan import Site
from ..cost import cost_meter, tally
from ..patching.metrics import Metric, logit_diff
from ..patching.paths import ANY, check_senders, path_scores, prepare
from ..scoring.circuit_scores import circuit_score, circuit_score_from
from ..tasks.base import Task
from . import memo, remote, sizes
from .circuit import GnaCircuit
from .entry import segment_positions
from .evidence import ROLES, HeadEvidence, RoleNeed, SpreadRole
from .head_scans import HeadScan
from .joint import collapsing_set
from .positions import layer_heads
from .report_inputs import circuit_heads, circuit_ranking
from .roles import pattern_agrees
from .runner import runner_for

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask


SPREAD_FRACTION = 0.9
"""A spread role's set in the circuit carries at least this share of its layer's effect at
the role's positions (`spread_set`), where no set of up to ``max_heads_per_role`` heads takes
accuracy to chance."""

COVER_TOLERANCE = 0.05
"""A role's set covers a collapse when its accuracy there is at most the layer's floor plus this."""

SIZED = "the role's size curve orders the layer's heads instead"
"""Why a local run leaves a spread role's groups unsearched (`group_testing.SpreadGroup.skipped`)."""

SpreadRuns = tuple[list[tuple[str, int]], list[tuple[Task, list[Intervention]]]]


def roles_left_open(circuit: GnaCircuit) -> list[str]:
    """Roles without a set found to reach chance (so far)."""
    return [role for role in ROLES if role not in circuit.needs or not circuit.needs[role].reached_chance]


def spread_check_runs(model: GnaModel, task: Task, encoded: EncodedTask, circuit: GnaCircuit, roles: Sequence[str]) -> SpreadRuns:
    """The spread check's measurements: for each role and each costly layer (layer scan;
    every scanned layer without it), the layer's heads ablated only at the role's positions
    (Aggregate: the final position; Gather: the segment ends). Returns the ``(role, layer)``
    keys and the runs, in the same order."""
    clean, min_effect = circuit.accuracy["clean"], circuit.thresholds.min_effect
    if circuit.layer_scan is not None:
        layers = [layer for layer in circuit.settings["layers"] if clean - circuit.layer_scan[layer] >= min_effect]
    else:
        layers = list(circuit.settings["layers"])
    where = {role: positions for role, (_, positions) in role_positions(circuit, encoded).items()}
    keys: list[tuple[str, int]] = [(role, int(layer)) for role in roles for layer in layers]
    runs: list[tuple[Task, list[Intervention]]] = [
        (task, [Ablate([Head(layer, h) for h in range(model.heads_per_layer[layer])], positions=where[role])]) for role, layer in keys
    ]
    return keys, runs


def role_positions(circuit: GnaCircuit, encoded: EncodedTask) -> dict[str, tuple[str, torch.Tensor]]:
    """Where the spread check ablates each role: the Aggregate role at the final position; the
    Gather role at the segment ends, or on every segment token where the position scan
    (`GnaCircuit.positions`) finds no scanned layer acting at the ends but one acting at the
    labels or the option tokens (a model that gathers through the options themselves)."""
    gather: tuple[str, torch.Tensor] = ("ends", encoded.segment_ends)
    scan = circuit.positions
    if scan is not None and not scan.acts_at(["ends"]) and scan.acts_at(["labels", "options"]):
        gather = ("segments", segment_positions(encoded))
    return {"aggregate": ("final", encoded.final), "gather": gather}


SEGMENTS_KEY = "gather@segments"
"""`speculate_segments`' key for the Gather role's layers ablated on the segments."""


def speculate_segments(model: GnaModel, task: Task, encoded: EncodedTask, runs: SpreadRuns) -> SpreadRuns:
    """``runs`` (`spread_check_runs`) with each Gather layer also ablated on every segment
    token: a remote run measures them in the confirmation's request before its position scan
    says where the Gather role is searched (`settle_segments` keeps one of the two)."""
    on_segments = segment_positions(encoded)
    layers = [layer for role, layer in runs[0] if role == "gather"]
    more = [(task, [Ablate([Head(layer, h) for h in range(model.heads_per_layer[layer])], positions=on_segments)]) for layer in layers]
    return [*runs[0], *((SEGMENTS_KEY, layer) for layer in layers)], [*runs[1], *more]  # type: ignore[list-item]


def settle_segments(circuit: GnaCircuit, encoded: EncodedTask, runs: SpreadRuns, values: Sequence[float]) -> tuple[SpreadRuns, list[float]]:
    """The spread runs (and their values) at the Gather role's positions as the position scan
    now says (`role_positions`): those of `speculate_segments` under the Gather role's key, or
    the segment ends'."""
    on_segments = role_positions(circuit, encoded)["gather"][0] == "segments"
    kept: list[tuple[tuple[str, int], int]] = []
    for index, (role, layer) in enumerate(runs[0]):
        if role == SEGMENTS_KEY:
            if on_segments:
                kept.append((("gather", layer), index))
        elif not (role == "gather" and on_segments):
            kept.append(((role, layer), index))
    return ([key for key, _ in kept], [runs[1][i] for _, i in kept]), [values[i] for _, i in kept]


def spread_check(
    model: GnaModel,
    task: Task,
    encoded: EncodedTask,
    circuit: GnaCircuit,
    scan: HeadScan,
    threshold: float,
    max_heads: int,
    premeasured: SpreadRuns | None = None,
    values: Sequence[float] | None = None,
    *,
    fraction: float = SPREAD_FRACTION,
) -> None:
    """`GnaCircuit.spread`: for each role without a set of up to ``max_heads`` heads that
    reaches chance (an empty role included), where it enters and the best set found.

    Where: every head of each costly layer (layer scan; every scanned layer without it)
    ablated only at the role's positions (Aggregate: the final position; Gather: the
    segment ends); the layer that costs most there (at least ``min_effect``). Best set: the
    role's need (joint or confirmation set, with its curve); for an empty role, the entry
    layer's heads by importance (`sizes.importance_order`; on a remote model, the heads the
    scan measured alone, by their accuracy: none, no best set), added one by one at the role's positions up to ``max_heads``
    or chance. Size: for a role whose best set does not reach chance, on a local model, the
    entry layer's size curve (`sizes.size_curve`: ``SpreadRole.sizes``, with its cost). The layer measurements
    run together (`evaluate_many`: one request on a remote model), or come measured:
    ``premeasured`` keys and runs (`spread_check_runs`, a superset of the open roles) with their
    accuracies ``values``."""
    clean, min_effect = circuit.accuracy["clean"], circuit.thresholds.min_effect
    open_roles = roles_left_open(circuit)
    if not open_roles or clean < threshold:
        return
    runner = runner_for(model)
    if premeasured is None or values is None:
        premeasured = spread_check_runs(model, task, encoded, circuit, open_roles)
        values = runner.accuracies(premeasured[1])  # one request on a remote model
    by_key = dict(zip(premeasured[0], values, strict=True))
    where = role_positions(circuit, encoded)
    local = runner.has_backward  # the ordering's attribution needs a local backward
    for role in open_roles:
        name, positions = where[role]
        measured = {layer: value for (of, layer), value in by_key.items() if of == role}
        costly = [layer for layer, value in measured.items() if clean - value >= min_effect]
        entry = min(costly, key=lambda layer: (measured[layer], layer)) if costly else None
        best = circuit.needs.get(role)
        order: list[int] = []
        with cost_meter(model) as cost:
            if entry is not None and local and (best is None or not best.reached_chance):
                order = sizes.importance_order(model, task, encoded, entry, positions, scan, clean, min_effect, start=_first(circuit))
            if best is None and entry is not None:
                # remotely (no ordering): only the heads the scan measured alone, never padded by index
                measured_alone = [h for h in range(model.heads_per_layer[entry]) if bool(scan.verified[entry, h])]
                ranked = order or sorted(measured_alone, key=lambda h: (_nan_last(scan.accuracy[entry, h]), h))
                best = _best_set(model, task, entry, ranked, positions, name, threshold, max_heads) if ranked else None
            curve: list[tuple[int, float]] = []
            if order and entry is not None:  # every spread role sized (`spread_set` reads its curve)
                width = model.heads_per_layer[entry]
                fractions = tuple(dict.fromkeys([*sizes.SIZE_FRACTIONS, fraction]))
                curve = sizes.size_curve(
                    sizes.measure(model, task, entry, order, positions), width, clean, measured[entry], fractions=fractions
                )
        groups = [g for g in scan.spread if entry is not None and g.heads[0].layer == entry]
        if curve:  # the size curve orders the layer's heads: a search of the groups' needed heads would add nothing the set uses
            for group in groups:
                group.skipped = SIZED if any(group is item for item in scan.unsearched) else ""
        else:
            scan.search_spread(groups)  # a local scan searches the needed heads of the groups shown, and only those
        if scan.tests:
            circuit.settings["group_testing"] = {str(layer): tests for layer, tests in scan.tests.items()}
        item = SpreadRole(role, name, measured, entry, best, max_heads, groups)
        if curve:
            item.sizes, item.order = curve, order
            spent = (circuit.cost or {}).get("size_curves", {}) | {role: sizes.spent(cost, len(task), len(curve) - 2)}
            circuit.cost = {**(circuit.cost or {}), "size_curves": spent}  # `discover` adds its meter's counts
            pinned = list(dict.fromkeys([*sizes.SIZE_FRACTIONS, fraction]))
            circuit.settings["size_curve"] = {"ranked_by": sizes.RANKED_BY, "fractions": pinned, "spread_fraction": fraction}
        circuit.spread[role] = item


def _best_set(
    model: GnaModel, task: Task, layer: int, ranked: Sequence[int], positions: torch.Tensor, name: str, threshold: float, max_heads: int
) -> RoleNeed:
    """An empty role's best set: ``ranked``'s heads of ``layer`` added one by one, ablated at
    ``positions``, up to ``max_heads`` or chance; its accuracy ablated at every position."""
    curve: list[tuple[Head, float]] = []
    chosen: list[Head] = []
    for h in ranked[:max_heads]:
        chosen.append(Head(layer, h))
        curve.append((chosen[-1], memo.accuracy(model, task, [Ablate(chosen, positions=positions)])))
        if curve[-1][1] <= threshold:
            break
    everywhere = memo.accuracy(model, task, [Ablate(chosen)])
    return RoleNeed(chosen, everywhere, everywhere <= threshold, curve, name)


def _first(circuit: GnaCircuit) -> int | None:
    """The earliest layer the spread check or the coverage may order (`sizes.importance_order`'s
    ``start``): the first costly layer of the layer scan, or of the position scan."""
    clean, min_effect = circuit.accuracy["clean"], circuit.thresholds.min_effect
    layers = [] if circuit.layer_scan is None else [q for q, value in enumerate(circuit.layer_scan) if clean - value >= min_effect]
    layers += list(circuit.positions.accuracy) if circuit.positions is not None else []
    return min(layers, default=None)


def _nan_last(value: torch.Tensor) -> float:
    number = float(value)
    return 2.0 if number != number else number


def confirm(
    model: GnaModel,
    task: Task,
    circuit: GnaCircuit,
    threshold: float,
    max_heads: int,
    evaluate_bars: bool | None,
    spread_runs: SpreadRuns | None = None,
    paths: bool = True,
) -> list[float] | None:
    """The confirmation: the fallback needs and the path-patching check; on a remote model,
    in its one request, the accuracy with each role's heads ablated too (a local run measures
    those once the sets are final: `confirm_table`). Returns the accuracies of ``spread_runs``
    when they were measured in a remote run's confirmation request (None otherwise)."""
    clean = circuit.accuracy["clean"]
    sets = confirmation_sets(model, circuit)
    fallback = {
        role: heads for role, heads in (("gather", circuit.gather), ("aggregate", circuit.aggregate)) if heads and role not in circuit.needs
    }
    batched = runner_for(model).batched
    spread_values: list[float] = []
    measured: dict[str, float] = {}
    prefixes: dict[str, list[float]] = {}
    if batched:  # one request: every accuracy below
        extra = spread_runs[1] if spread_runs is not None else ()
        measured, prefixes, spread_values = remote.confirm(model, task, {k: v for k, v in sets.items() if v}, fallback, max_heads, extra)
    for name, heads in sets.items() if batched else ():
        circuit.accuracy[name] = measured[name] if heads else clean
    for role, heads in fallback.items():
        curve: list[tuple[Head, float]] = []
        if batched:  # the cumulative sets were all measured: stop where the sequential search stops
            for head, accuracy in zip(heads, prefixes[role], strict=False):
                curve.append((head, accuracy))
                if accuracy <= threshold:
                    break
            chosen, accuracy = [head for head, _ in curve], curve[-1][1]
            circuit.needs[role] = RoleNeed(chosen, accuracy, accuracy <= threshold, curve, "all")
            continue
        chosen, accuracy, reached = collapsing_set(
            model, task, heads, threshold, max_heads, clean, evaluate_progress=evaluate_bars, curve=curve
        )
        circuit.needs[role] = RoleNeed(chosen, accuracy, reached, curve, "all")
    if paths:
        confirm_paths(model, task, circuit)
    return spread_values if batched else None


def confirm_paths(model: GnaModel, task: Task, circuit: GnaCircuit, parts: dict[str, dict[str, float]] | None = None) -> None:
    """The Gather -> Aggregate path-patching check (`gather_to_aggregate`) and MIB's score
    (`mib_score`) of the circuit's sets as they stand; what each ran into ``parts`` where given
    (`cost.tally`: ``"path patching"``, ``"MIB score"``)."""
    parts = {} if parts is None else parts
    corrupt = task.corrupted() if circuit_heads(circuit) else None  # made once, for both (none without a head)
    # the score reads its corrupt head outputs from path patching's corrupt run (one forward, one request, for both)
    shared: dict[Site, torch.Tensor] | None = {} if _can_share(model, circuit) else None
    with tally(model, parts, "path patching", len(task)):
        circuit.path_patching = gather_to_aggregate(model, task, circuit, corrupt=corrupt, captured=shared)
    with tally(model, parts, "MIB score", len(task)):
        circuit.score = mib_score(model, task, circuit, corrupt=corrupt, captured=shared or None)
    del shared  # the score is done: its corrupt captures go


def spread_set(item: SpreadRole, fraction: float) -> list[Head]:
    """A spread role's set in the circuit: its best set where that takes accuracy to chance,
    else the fewest heads of its size curve (most important first) that carry ``fraction`` of
    the whole layer's effect at the role's positions (`SpreadRole.heads_for`); empty without
    either."""
    if item.best is not None and item.best.reached_chance:
        return list(item.best.heads)
    if item.sizes and item.order and item.layer is not None:
        return [Head(item.layer, h) for h in item.order[: item.heads_for(fraction)]]
    return []


def enter_spread(model: GnaModel, circuit: GnaCircuit, fraction: float) -> list[str]:
    """Each spread role's set (`spread_set`) joins the role's list in the circuit (a head new
    to the evidence enters it as a member of the set, ``joint=True``). Returns the roles whose
    sets grew (the caller measures the confirmation's table again once, `confirm_table`)."""
    grown = []
    for role, item in circuit.spread.items():
        members: list[Head] = getattr(circuit, role)
        added = [h for h in spread_set(item, fraction) if h not in members]
        if added:
            grown.append(role)
            members.extend(added)
    if grown:
        _examined(model, circuit)
    return grown


def cover_collapses(model: GnaModel, task: Task, encoded: EncodedTask, circuit: GnaCircuit, scan: HeadScan, threshold: float) -> list[str]:
    """Each collapse the position scan found (a scanned layer whose heads, ablated together
    at a role's positions, take accuracy to ``threshold`` or below: the Aggregate role's final
    position, the Gather role's positions, `role_positions`) is in the circuit: the role's
    heads of that layer, ablated together there, come within `COVER_TOLERANCE` of the layer's
    floor there. Where they do not, the layer's heads by importance (`sizes.importance_order`,
    a local backward) are added, the fewest whose ablation there does (the size curve's,
    bisected). ``circuit.settings["coverage"]``: per ``"role@L<layer>"``, the positions, the
    floor, the set's accuracy there and its heads. Returns the roles whose sets grew (the
    caller measures the confirmation's table again once, `confirm_table`)."""
    if circuit.positions is None:
        return []
    runner = runner_for(model)
    clean, min_effect = circuit.accuracy["clean"], circuit.thresholds.min_effect
    where = role_positions(circuit, encoded)
    coverage: dict[str, dict[str, Any]] = {}
    grown: list[str] = []
    for layer in circuit.positions.accuracy:
        for role, (name, positions) in where.items():
            if role == "gather" and layer in circuit.positions.cleared:
                continue  # the screen cleared every class but the final one: no collapse there
            floor = runner.accuracy(task, [Ablate(layer_heads(runner, layer), positions=positions)])
            if floor > threshold:
                continue  # no collapse there
            members = sorted(h for h in getattr(circuit, role) if h.layer == layer)
            value = runner.accuracy(task, [Ablate(members, positions=positions)]) if members else clean
            if value > floor + COVER_TOLERANCE and runner.has_backward:
                order = sizes.importance_order(model, task, encoded, layer, positions, scan, clean, min_effect, start=_first(circuit))
                item = circuit.spread.get(role)  # its size curve, where measured in this layer at these positions
                same = item is not None and (item.layer, item.positions) == (layer, name)
                known = sizes.points_after(item.sizes, item.order, members, order) if same else {}  # type: ignore[union-attr]
                order = [h for h in order if Head(layer, h) not in members]
                measure = sizes.measure_with(model, task, layer, members, order, positions)
                k = sizes.fewest_reaching(measure, len(order), floor + COVER_TOLERANCE, known)
                added = [Head(layer, h) for h in order[:k]]
                getattr(circuit, role).extend(h for h in added if h not in getattr(circuit, role))
                members, value, grown = sorted([*members, *added]), measure(k), [*grown, role]
            coverage[f"{role}@L{layer}"] = {"positions": name, "floor": floor, "accuracy": value, "heads": [str(h) for h in members]}
    circuit.settings["coverage"] = coverage
    if grown:
        _examined(model, circuit)
    return grown


def _examined(model: GnaModel, circuit: GnaCircuit) -> None:
    """Every head of the circuit's sets in its evidence (a head new to it as a member of its
    set, ``joint=True``), sorted."""
    examined = {item.head: item for item in circuit.heads}
    for role in ROLES:
        for head in getattr(circuit, role):
            if head not in examined:
                examined[head] = HeadEvidence(head, role, None, False, joint=True, kind=model.head_kind(head).value)
            elif examined[head].role is None:
                item = examined[head]
                item.role, item.joint = role, True
                n_options = circuit.n_segments or round(1 / circuit.accuracy["chance"])
                item.pattern_agrees = None if item.scores is None else pattern_agrees(role, item.scores, circuit.thresholds, n_options)
    circuit.heads = sorted(examined.values(), key=lambda e: e.head)


def confirm_table(model: GnaModel, task: Task, circuit: GnaCircuit, evaluate_bars: bool | None) -> None:
    """The confirmation's accuracies (``-gather``, ``-aggregate``, ``-both``, ``only_gna``) of
    the circuit's sets as they stand, each behind the accuracy memo; one request on a remote
    model."""
    clean = circuit.accuracy["clean"]
    sets = confirmation_sets(model, circuit)
    runs = [(task, [Ablate(heads)]) for heads in sets.values() if heads]
    values = iter(runner_for(model).accuracies(runs)) if runs else iter(())
    for name, heads in sets.items():
        circuit.accuracy[name] = next(values) if heads else clean


def confirmation_sets(model: GnaModel, circuit: GnaCircuit) -> dict[str, list[Head]]:
    """The sets the confirmation ablates: each role's, both, and (``only_gna``) every other
    head of the G&A layers."""
    sets = {"-gather": circuit.gather, "-aggregate": circuit.aggregate, "-both": [*circuit.gather, *circuit.aggregate]}
    kept = {*circuit.gather, *circuit.aggregate}
    if kept:
        layers = {h.layer for h in kept}
        sets["only_gna"] = [
            Head(layer, h) for layer in sorted(layers) for h in range(model.heads_per_layer[layer]) if Head(layer, h) not in kept
        ]
    return sets


def _can_share(model: GnaModel, circuit: GnaCircuit) -> bool:
    """Whether `mib_score` may read path patching's corrupt run: no ambient interventions (the
    score's capture runs without them) and a circuit to score. On a remote model the captures
    come back either way (the score's own capture downloads the same head outputs): shared,
    they cost no request of their own."""
    return not model.active_interventions and bool(circuit_heads(circuit))


def gather_to_aggregate(
    model: GnaModel,
    task: Task,
    circuit: GnaCircuit,
    *,
    corrupt: Task | None = None,
    captured: dict[Site, torch.Tensor] | None = None,
) -> dict[str, float] | None:
    """Path patching of the edge: the Gather heads switched to a corrupted prompt (another
    correct option), their change allowed to reach the output only through the Aggregate
    heads of later layers. Metric: logit of the clean answer minus the corrupted one.
    The clean and corrupt metric are those of path patching's own clean and corrupt runs
    (`patching.paths.prepare`: one request on a remote model).
    ``corrupt``: ``task.corrupted()``, if already made. ``captured``: a dict that path
    patching's corrupt run fills with every head site's output on
    ``corrupt`` (``[batch, pos, head, d_head]``), for `mib_score`; left empty otherwise."""
    if not circuit.gather or not circuit.aggregate:
        return None
    last_gather = max(model.head_position(h) for h in circuit.gather)
    receivers = [h for h in circuit.aggregate if model.head_position(h) > last_gather]
    if not receivers:
        return None
    corrupt = task.corrupted() if corrupt is None else corrupt
    metric = answer_metric(model, task, corrupt)
    if metric is None:
        return None
    # path patching's own clean and corrupt runs give the clean and corrupt metric (remotely: one request)
    extra = {model.head_site(head)[0] for head in model.heads} if captured is not None else set()
    senders = check_senders(model, circuit.gather)
    setup, clean_value, corrupt_value = prepare(model, task, corrupt, senders, receivers, metric, ANY, [], corrupt_sites_extra=extra)
    path = path_scores(setup, [list(circuit.gather)])[0]
    if captured is not None:
        captured.update({site: setup.corrupt_heads[site] for site in extra})
    del setup  # its clean captures go before the score's forwards
    span = clean_value - corrupt_value
    return {
        "clean": clean_value,
        "corrupt": corrupt_value,
        "gather->aggregate": path,
        "fraction_of_effect": (clean_value - path) / span if abs(span) > 1e-9 else float("nan"),
    }


def answer_metric(model: GnaModel, task: Task, corrupt: Task) -> Metric | None:
    """The logit of the clean prompt's answer minus that of the corrupted prompt's answer, at
    the final position; None when a candidate has several tokens or the two prompt sets
    differ in length (nothing to patch position by position)."""
    tokenizer = task.tokenizer_for(model.tokenizer)
    clean_enc, corrupt_enc = task.encode(tokenizer), corrupt.encode(tokenizer)
    if not (clean_enc.single_token and corrupt_enc.single_token) or clean_enc.batch.n_pos != corrupt_enc.batch.n_pos:
        return None
    rows = torch.arange(len(task))
    return logit_diff(clean_enc.candidate_ids[rows, clean_enc.correct], corrupt_enc.candidate_ids[rows, corrupt_enc.correct])


def mib_score(
    model: GnaModel, task: Task, circuit: GnaCircuit, *, corrupt: Task | None = None, captured: dict[Site, torch.Tensor] | None = None
) -> dict[str, Any] | None:
    """`GnaCircuit.score`: MIB's CPR and CMD (`gna.circuit_score`, MIB's fractions, every head
    outside a circuit on its corrupted prompt) of discovery's ranking: the circuit's heads,
    then every other measured head by its drop (`report_inputs.circuit_ranking`), then the
    unmeasured ones; metric `answer_metric`. None for a circuit without heads, a task without
    one token per answer or with corrupted prompts of another length. ``corrupt``:
    ``task.corrupted()``, if already made; ``captured``: every head site's output on it (no
    interventions; `gather_to_aggregate` fills it), read instead of a corrupt forward. Cost: a
    clean and a corrupt forward (none with ``captured``), and one copy of the batch per size
    below every head (at most 9); on a remote model two requests (the corrupt capture, then
    the rest in one)."""
    heads = circuit_heads(circuit)
    if not heads:
        return None
    corrupt = task.corrupted() if corrupt is None else corrupt
    metric = answer_metric(model, task, corrupt)
    if metric is None:
        return None
    measured = circuit_ranking(circuit, model)
    ranking = [h for h in measured if h in heads] + [h for h in heads if h not in measured]
    ranking += [h for h in measured if h not in heads]
    try:
        if captured:
            ref = model.to_batch(corrupt)  # the batch `GnaModel.capture_sites` would build
            score = circuit_score_from(model, task, corrupt, metric, ranking, lambda _, sites: (ref, {s: captured[s] for s in sites}))
        else:
            score = circuit_score(model, task, corrupt, metric, ranking, progress=False)
    except GnaValueError:  # m(N) == m(∅): undefined
        return None
    data = score.to_dict()
    data["metric_name"] = "logit of the clean answer - the corrupted prompt's answer, final position"
    data["circuit_size"] = len(heads)
    return data
