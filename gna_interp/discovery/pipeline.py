"""`discover`: find, label and confirm the Gather and Aggregate heads of a model.

The stages follow the paper's procedure (causal, not by attention scores), then label
roles from the patterns and confirm them:

1. **baseline**: task accuracy; near chance there is no retrieval to explain (warning).
   On multiple-choice tasks, also the accuracy with each prompt's labels shuffled: near
   chance there, the model answers by the option's place, not by its label (warning).
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
   collapses (an empty one included) is reported with where it enters (`_spread`).

`stability` re-runs the search on other prompt samples and counts how often each head
is chosen (``discover(..., stability=k)`` records it in the circuit).
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..core.heads import Head
from ..core.interventions import Ablate, Intervention
from ..cost import cost_meter
from ..evaluation import evaluate, evaluate_many
from ..models.jobs import is_batched_remote
from ..patching.metrics import logit_diff, reduce_metric
from ..patching.paths import ANY, check_senders, path_patching, path_scores, prepare
from ..progress import progress_bar
from ..tasks.base import Task
from ..tasks.mcq import shuffle_labels
from . import head_scans, layer_scans, memo, remote
from .circuit import ROLES, GnACircuit, HeadEvidence, RoleNeed, SpreadRole, Stability
from .entry import entry_scan
from .group_testing import stage_one
from .joint import JointSearch, collapsing_set, head_float
from .roles import RoleThresholds, entry_shares, label, pattern_agrees, role_scores

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask


class NoRetrievalWarning(UserWarning):
    """The model answers the task at about chance: there is no retrieval to explain."""


class PositionalAnswerWarning(UserWarning):
    """The model answers multiple-choice prompts by the option's place (counting lines),
    not by reading its label: with the labels shuffled it falls to chance. Its heads may
    then count options rather than gather and aggregate them."""


STAGES = ("truncation", "layers", "heads", "entry", "roles", "joint", "confirm")
SEARCH_STAGES = ("layers", "heads", "entry", "roles", "joint")
"""The stages that decide which heads a role's set holds: `stability` re-runs only these
(the truncation scan and the confirmation measure, they do not choose)."""


def discover(
    model: GnaModel,
    task: Task,
    *,
    stages: Sequence[str] = STAGES,
    layers: Sequence[int] | None = None,
    max_candidates: int = 16,
    max_heads_per_role: int = 8,
    chance_margin: float = 0.10,
    thresholds: RoleThresholds | None = None,
    pattern_prompts: int = 64,
    screen_above: int = 64,
    check_labels: bool = True,
    prescreen_above: int = 64,
    prescreen_keep: int | None = None,
    progress: bool = True,
    stability: int | Sequence[Task] | None = None,
) -> GnACircuit:
    """Find the G&A heads of ``model`` on ``task``.

    Args:
        model: any `GnaModel` (attention or SSM heads, any backend).
        task: a `Task` with segments (options / dictionary lines).
        stages: which optional stages to run (``"heads"`` and ``"roles"`` are needed
            for any head to be found).
        layers: layers to head-scan; default every layer.
        max_candidates: heads examined for roles: the most harmful ones when ablated
            (every head of the scanned layers, if there are at most this many).
        max_heads_per_role: largest head set tried when measuring what a role needs: a
            role whose heads together do not collapse accuracy keeps growing up to it (the
            curve of accuracy against heads ablated is in ``circuit.needs[role].curve``).
        chance_margin: "collapsed" means accuracy at most chance + this.
        thresholds: role-label thresholds (`RoleThresholds`).
        pattern_prompts: prompts used for the pattern scores.
        screen_above: layers with more heads are scanned by adaptive group testing
            (`group_testing.group_testing`: about ``2 k log2 N`` group forwards for ``k`` costly
            heads among ``N``), not head by head.
        prescreen_above: when the scanned layers hold more heads than this, only some are
            ablated one by one (`head_scans.prescreen`): every head of the layers whose removal
            costs at least ``thresholds.min_effect`` (layer scan; such a layer of more than
            ``screen_above`` heads by group testing instead), and the
            ``prescreen_keep`` heads with the largest attribution estimate (default
            ``2 * max_candidates``). The others are not measured (NaN in ``head_scan``).
        check_labels: on multiple-choice tasks, measure the accuracy with the labels
            shuffled (`tasks.shuffle_labels`), as ``accuracy["shuffled_labels"]``.
        progress: progress bars: one per scan, and `evaluate`'s per-batch bars (its
            default: tasks of more than 4 batches) for the single evaluations of the
            baseline, the label check and the confirmation. ``False``: no bar at all.
        stability: also re-run the search on other prompt samples (`stability`, with
            these settings) and record how often each head is chosen as
            ``circuit.stability``: a number of bootstrap samples of ``task`` (at least
            2), or the sample tasks themselves. ``None`` (default): not measured.

    Returns:
        a `GnACircuit`; its ``cost`` holds what discovery ran (`gna_interp.cost`): forwards,
        rows, block evaluations, passes over the task, remote requests, seconds. Forwards
        over a batch seen before start from its cached clean prefix (`GnaModel.prefix_cache`).
    """
    if stability is not None:
        _check_samples(stability, "stability")
    options: dict[str, Any] = {
        "stages": stages,
        "layers": layers,
        "max_candidates": max_candidates,
        "max_heads_per_role": max_heads_per_role,
        "chance_margin": chance_margin,
        "thresholds": thresholds,
        "pattern_prompts": pattern_prompts,
        "screen_above": screen_above,
        "check_labels": check_labels,
        "prescreen_above": prescreen_above,
        "prescreen_keep": 2 * max_candidates if prescreen_keep is None else prescreen_keep,
    }
    with model.prefix_cache(), memo.accuracy_memo(model), cost_meter(model) as cost:
        started = time.perf_counter()
        circuit = _discover(model, task, progress=progress, **options)
    circuit.cost = {**cost.to_dict(len(task)), "seconds": time.perf_counter() - started}
    if stability is not None:
        circuit.stability = _stability(model, _sample_tasks(task, stability, 0), options, progress)
    return circuit


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
    if isinstance(task, Task):
        samples: int | Sequence[Task] = 5 if k is None else k
        _check_samples(samples, "k")
    else:
        _check_samples(task, "task")
        samples = task
        if k is not None and k != len(task):
            raise ValueError(f"k={k!r} with {len(task)} sample tasks given: leave k out, or give k tasks")
    defaults = _discover_settings()
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(f"stability got unknown discover settings {unknown}: expected some of {sorted(defaults)}")
    merged = {**defaults, **options}
    if merged["prescreen_keep"] is None:
        merged["prescreen_keep"] = 2 * merged["max_candidates"]
    return _stability(model, _sample_tasks(task, samples, seed) if isinstance(task, Task) else (list(task), None), merged, progress)


def _discover_settings() -> dict[str, Any]:
    """`discover`'s settings (its keyword-only parameters but ``progress`` and
    ``stability``) and their defaults, as `stability` takes them."""
    parameters = inspect.signature(discover).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY and p.name not in ("progress", "stability")}


def _check_k(k: Any, name: str) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"{name}={k!r}: expected an int of at least 2 prompt samples")


def _check_samples(samples: Any, name: str) -> None:
    """``samples``: a number of bootstrap samples (at least 2), or at least 2 tasks."""
    if isinstance(samples, int):
        _check_k(samples, name)
        return
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
        raise TypeError(f"{name}={samples!r}: expected a number of prompt samples or a sequence of Task")
    bad = [i for i, t in enumerate(samples) if not isinstance(t, Task)]
    if bad:
        raise TypeError(f"{name}[{bad[0]}] is a {type(samples[bad[0]]).__name__}: expected a gna_interp Task per sample")
    _check_k(len(samples), f"len({name})")


def _sample_tasks(task: Task, samples: int | Sequence[Task], seed: int) -> tuple[list[Task], int | None]:
    """``(sample tasks, bootstrap seed)``: ``samples`` bootstrap samples of ``task`` from
    ``seed``, or the tasks given (seed ``None``)."""
    if isinstance(samples, int):
        return prompt_samples(task, samples, seed), seed
    return list(samples), None


def _stability(model: GnaModel, sampled: tuple[list[Task], int | None], options: dict[str, Any], progress: bool) -> Stability:
    """`Stability` of the search, run with ``options`` (`discover`'s) on each of the sampled
    tasks (`_sample_tasks`)."""
    tasks, seed = sampled
    chosen = {**options, "stages": [s for s in options["stages"] if s in SEARCH_STAGES], "check_labels": False}
    started = time.perf_counter()
    sets = []
    for sample in progress_bar(tasks, show=progress, desc="stability"):
        with model.prefix_cache(), memo.accuracy_memo(model):
            circuit = _discover(model, sample, progress=False, **chosen)
        sets.append({role: list(getattr(circuit, role)) for role in ROLES})
    shape = (model.n_layers, max(model.heads_per_layer))
    seconds = time.perf_counter() - started
    return Stability("tasks" if seed is None else "bootstrap", [len(t) for t in tasks], sets, shape, seed, seconds)


def _discover(
    model: GnaModel,
    task: Task,
    *,
    stages: Sequence[str],
    layers: Sequence[int] | None,
    max_candidates: int,
    max_heads_per_role: int,
    chance_margin: float,
    thresholds: RoleThresholds | None,
    pattern_prompts: int,
    screen_above: int,
    check_labels: bool,
    prescreen_above: int,
    prescreen_keep: int,
    progress: bool,
) -> GnACircuit:
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stages {unknown}: expected a subset of {STAGES}")
    if not isinstance(task, Task):
        raise TypeError(f"discover needs a gna_interp Task (prompts with annotated segments), got {type(task).__name__}")
    if task.n_segments < 2:
        raise ValueError(f"task {task.name!r} has {task.n_segments} segment(s): G&A discovery needs at least 2 options to retrieve from")
    thresholds = thresholds or RoleThresholds()
    scan_layers = list(range(model.n_layers)) if layers is None else list(layers)
    for layer in scan_layers:
        model.check_layer(layer)

    evaluate_bars = None if progress else False  # evaluate's own default for single evaluations, or none
    batched = remote.batched(model)  # a remote model: each stage in one request (`remote`)
    wide = [layer for layer in scan_layers if model.heads_per_layer[layer] > screen_above] if "heads" in stages else []
    speculated = []  # a remote run's first stage of group testing, sent with the first scans (`remote.SPECULATE_LAYERS`)
    if len(wide) <= remote.SPECULATE_LAYERS:
        speculated = [g for layer in wide for g in stage_one([Head(layer, h) for h in range(model.heads_per_layer[layer])])]
    first = remote.first_scans(model, task, stages, check_labels, speculated) if batched else None
    clean = first.clean if first is not None else evaluate(model, task, progress=evaluate_bars)
    chance = clean.chance
    notes = []
    if clean.accuracy < chance + chance_margin:
        notes.append(f"clean accuracy {clean.accuracy:.3f} is near chance ({chance:.3f}): there is no retrieval to explain")
        warnings.warn(notes[-1], NoRetrievalWarning, stacklevel=3)
    circuit = GnACircuit(
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
        settings={
            "stages": list(stages),
            "layers": scan_layers,
            "max_candidates": max_candidates,
            "max_heads_per_role": max_heads_per_role,
            "chance_margin": chance_margin,
            "thresholds": thresholds.to_dict(),
            "pattern_prompts": pattern_prompts,
            "check_labels": check_labels,
            "prescreen_above": prescreen_above,
            "prescreen_keep": prescreen_keep,
        },
    )
    if check_labels and clean.accuracy >= chance + chance_margin:
        _check_labels(model, task, circuit, chance + chance_margin, evaluate_bars, None if first is None else first.shuffled)
    if "truncation" in stages:
        circuit.truncation = layer_scans.truncation_scan(model, task, progress=progress) if first is None else first.truncation
        circuit.critical_layer = layer_scans.critical_layer(circuit.truncation, clean.accuracy, chance)  # type: ignore[arg-type]
    if "layers" in stages:
        circuit.layer_scan = layer_scans.layer_scan(model, task, progress=progress) if first is None else first.layer_scan
    if "heads" not in stages:
        return circuit
    only, adaptive = None, []
    if sum(model.heads_per_layer[layer] for layer in scan_layers) > prescreen_above:
        costly = [layer for layer, accuracy in enumerate(circuit.layer_scan or []) if clean.accuracy - accuracy >= thresholds.min_effect]
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
        screened = head_scans.prescreen(model, task, scan_layers, narrow, prescreen_keep, grouped=[*adaptive, *cleared])
        only, circuit.settings["prescreen"] = screened.heads, screened.method
        if screened.estimates is not None:
            circuit.attribution = [[head_float(v) for v in row] for row in screened.estimates]
    scan = head_scans.head_scan(
        model,
        task,
        scan_layers,
        screen_above=screen_above,
        only=only,
        adaptive=adaptive,
        clean=clean.accuracy,
        min_effect=thresholds.min_effect,
        progress=progress,
        known=None if first is None else first.groups,
        defer_search=batched and "entry" in stages,  # the spread groups' search travels with the entry scan
        search_spread=batched,  # locally, only the groups the spread report shows are searched (`_spread`)
    )
    circuit.head_scan = [[None if v != v else float(v) for v in row] for row in scan.accuracy.tolist()]
    candidates = _candidates(scan.accuracy, scan.verified, max_candidates)
    evidence = {h: HeadEvidence(h, None, float(scan.accuracy[h.layer, h.head]), bool(scan.verified[h.layer, h.head])) for h in candidates}
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    harmful = [
        h for h, e in evidence.items() if e.ablated_accuracy is not None and clean.accuracy - e.ablated_accuracy >= thresholds.min_effect
    ]
    if "entry" in stages:
        local = [h for h in harmful if _acts_where_it_writes(model, h)]
        pending = scan.search.pending if scan.search is not None else []
        searched: list[float] = []
        for head, entry in entry_scan(model, task, encoded, local, progress=progress, extra=pending, extra_values=searched).items():
            evidence[head].entry = entry
        if scan.search is not None and searched:
            scan.search.finish(searched)
    scan.record_search()
    if scan.tests:
        circuit.settings["group_testing"] = {str(layer): tests for layer, tests in scan.tests.items()}
    ahead = remote.pool_heads(model, harmful, evidence, screen_above) if batched and "joint" in stages else []
    measured = role_scores(model, encoded, [*candidates, *ahead], pattern_prompts) if "roles" in stages and candidates else {}
    if "roles" in stages and candidates:
        for head, scores in ((h, measured[h]) for h in candidates):
            item = evidence[head]
            item.scores = scores
            if head in harmful:
                shares = None if item.entry is None else entry_shares(clean.accuracy, item.ablated_accuracy or 0.0, item.entry)
                item.role = label(scores, thresholds, shares)
        _gather_before_aggregate(evidence, model.head_position)
        for item in evidence.values():
            item.pattern_agrees = None if item.scores is None else pattern_agrees(item.role, item.scores, thresholds, task.n_segments)
    by_harm = sorted(evidence.values(), key=lambda e: (e.ablated_accuracy if e.ablated_accuracy is not None else 1.0, e.head))
    circuit.gather = [e.head for e in by_harm if e.role == "gather"]
    circuit.aggregate = [e.head for e in by_harm if e.role == "aggregate"]
    if "joint" in stages and "roles" in stages and encoded.single_token:  # positions need single-token scoring
        search = JointSearch(model, task, encoded, evidence, scan, thresholds, pattern_prompts, screen_above, progress)
        search.scored = {h: measured[h] for h in ahead}
        if batched:
            circuit.needs |= remote.joint_search(search, circuit, chance + chance_margin, max_heads_per_role)
        for role in ("aggregate", "gather") if not batched else ():
            if getattr(circuit, role):
                need = search.run(circuit, role, chance + chance_margin, max_heads_per_role)
                if need is not None:
                    circuit.needs[role] = need
    for item in evidence.values():
        item.kind = model.head_kind(item.head).value
    circuit.heads = sorted(evidence.values(), key=lambda e: e.head)
    if "confirm" in stages:
        threshold = chance + chance_margin
        # A remote run measures the spread check's layers speculatively in the confirmation's
        # request (every role that may stay open), so the check costs no request of its own.
        check_spread = encoded.single_token and circuit.accuracy["clean"] >= threshold
        spread_runs = _spread_runs(model, task, encoded, circuit, _open_roles(circuit)) if check_spread and batched else None
        spread_values = _confirm(model, task, circuit, threshold, max_heads_per_role, evaluate_bars, spread_runs)
        if check_spread:
            _spread(model, task, encoded, circuit, scan, threshold, max_heads_per_role, spread_runs, spread_values)
    return circuit


SpreadRuns = tuple[list[tuple[str, int]], list[tuple[Task, list[Intervention]]]]


def _open_roles(circuit: GnACircuit) -> list[str]:
    """Roles without a set found to reach chance (so far)."""
    return [role for role in ROLES if role not in circuit.needs or not circuit.needs[role].reached_chance]


def _spread_runs(model: GnaModel, task: Task, encoded: EncodedTask, circuit: GnACircuit, roles: Sequence[str]) -> SpreadRuns:
    """The spread check's measurements: for each role and each costly layer (layer scan;
    every scanned layer without it), the layer's heads ablated only at the role's positions
    (Aggregate: the final position; Gather: the segment ends). Returns the ``(role, layer)``
    keys and the runs, in the same order."""
    clean, min_effect = circuit.accuracy["clean"], circuit.thresholds.min_effect
    if circuit.layer_scan is not None:
        layers = [layer for layer in circuit.settings["layers"] if clean - circuit.layer_scan[layer] >= min_effect]
    else:
        layers = list(circuit.settings["layers"])
    where = {"aggregate": encoded.final, "gather": encoded.segment_ends}
    keys: list[tuple[str, int]] = [(role, int(layer)) for role in roles for layer in layers]
    runs: list[tuple[Task, list[Intervention]]] = [
        (task, [Ablate([Head(layer, h) for h in range(model.heads_per_layer[layer])], positions=where[role])]) for role, layer in keys
    ]
    return keys, runs


def _spread(
    model: GnaModel,
    task: Task,
    encoded: EncodedTask,
    circuit: GnACircuit,
    scan: head_scans.HeadScan,
    threshold: float,
    max_heads: int,
    premeasured: SpreadRuns | None = None,
    values: Sequence[float] | None = None,
) -> None:
    """`GnACircuit.spread`: for each role without a set of up to ``max_heads`` heads that
    reaches chance (an empty role included), where it enters and the best set found.

    Where: every head of each costly layer (layer scan; every scanned layer without it)
    ablated only at the role's positions (Aggregate: the final position; Gather: the
    segment ends); the layer that costs most there (at least ``min_effect``). Best set: the
    role's need (joint or confirmation set, with its curve); for an empty role, the entry
    layer's heads by their scan accuracy (most harmful first, unmeasured last), added one
    by one at the role's positions up to ``max_heads`` or chance. The layer measurements
    run together (`evaluate_many`: one request on a remote model), or come measured:
    ``premeasured`` keys and runs (`_spread_runs`, a superset of the open roles) with their
    accuracies ``values``."""
    clean, min_effect = circuit.accuracy["clean"], circuit.thresholds.min_effect
    open_roles = _open_roles(circuit)
    if not open_roles or clean < threshold:
        return
    if premeasured is None or values is None:
        premeasured = _spread_runs(model, task, encoded, circuit, open_roles)
        if is_batched_remote(model):  # one request
            values = [result.accuracy for result in evaluate_many(model, premeasured[1])]
        else:
            values = [memo.accuracy(model, run_task, interventions) for run_task, interventions in premeasured[1]]
    by_key = dict(zip(premeasured[0], values, strict=True))
    where = {"aggregate": ("final", encoded.final), "gather": ("ends", encoded.segment_ends)}
    for role in open_roles:
        name, positions = where[role]
        measured = {layer: value for (of, layer), value in by_key.items() if of == role}
        costly = [layer for layer, value in measured.items() if clean - value >= min_effect]
        entry = min(costly, key=lambda layer: (measured[layer], layer)) if costly else None
        best = circuit.needs.get(role)
        if best is None and entry is not None:
            ranked = sorted(range(model.heads_per_layer[entry]), key=lambda h: (_nan_last(scan.accuracy[entry, h]), h))
            curve: list[tuple[Head, float]] = []
            chosen: list[Head] = []
            for h in ranked[:max_heads]:
                chosen.append(Head(entry, h))
                curve.append((chosen[-1], memo.accuracy(model, task, [Ablate(chosen, positions=positions)])))
                if curve[-1][1] <= threshold:
                    break
            everywhere = memo.accuracy(model, task, [Ablate(chosen)])
            best = RoleNeed(chosen, everywhere, everywhere <= threshold, curve, name)
        groups = [g for g in scan.spread if entry is not None and g.heads[0].layer == entry]
        scan.search_spread(groups)  # a local scan searches the needed heads of the groups shown, and only those
        if scan.tests:
            circuit.settings["group_testing"] = {str(layer): tests for layer, tests in scan.tests.items()}
        circuit.spread[role] = SpreadRole(role, name, measured, entry, best, max_heads, groups)


def _nan_last(value: torch.Tensor) -> float:
    number = float(value)
    return 2.0 if number != number else number


def _check_labels(
    model: GnaModel, task: Task, circuit: GnACircuit, threshold: float, evaluate_bars: bool | None, measured: float | None = None
) -> None:
    """Accuracy with the labels shuffled (skipped for tasks that are not multiple choice);
    ``measured``: already measured (a remote run measures it with the first scans)."""
    try:
        relabelled = shuffle_labels(task)
    except ValueError:
        return
    shuffled = evaluate(model, relabelled, progress=evaluate_bars).accuracy if measured is None else measured
    circuit.accuracy["shuffled_labels"] = shuffled
    if shuffled < threshold:
        circuit.warnings.append(
            f"with the labels shuffled, accuracy falls from {circuit.accuracy['clean']:.3f} to {shuffled:.3f}: the model answers "
            "by the option's place, not by its label, so its heads may count options rather than gather and aggregate them"
        )
        warnings.warn(circuit.warnings[-1], PositionalAnswerWarning, stacklevel=4)


def mixer_is_the_block(model: GnaModel, layer: int) -> bool:
    """Whether ``layer``'s block is its one token mixer and norms (Mamba-1, Falcon-Mamba,
    pure Mamba-2): no MLP and no second mixer, so removing the block (the layer scan)
    removes its heads and nothing else. Every block parameter outside the mixer must be a
    vector (a norm's weight or bias), and the architecture must be pre-norm
    (`ArchSpec.pre_norm_residual`: nothing but the residual add after the mixer)."""
    mixers = model.layer_specs[layer].mixers
    if len(mixers) != 1 or not model.arch.pre_norm_residual:
        return False
    block = model.hf_model.get_submodule(model.arch.block_path(layer))
    inside = {id(p) for p in block.get_submodule(mixers[0].spec.path).parameters()}
    return all(p.dim() <= 1 for p in block.parameters() if id(p) not in inside)


def ablating_every_head_skips(model: GnaModel, layer: int) -> bool:
    """Whether ablating every head of ``layer`` (zero) is the same forward as skipping the
    layer (`SkipLayers`, the layer scan): its block is its one mixer (`mixer_is_the_block`)
    and the mixer's out-projection has no bias, so zero head outputs write exactly zero and
    the block passes its residual through."""
    if not mixer_is_the_block(model, layer):
        return False
    mixer = model.layer_specs[layer].mixers[0]
    out_proj = model.hf_model.get_submodule(mixer.out_proj_path)
    return getattr(out_proj, "bias", None) is None


def _acts_where_it_writes(model: GnaModel, head: Head) -> bool:
    """Whether the head's output at position ``t`` reaches only the residual stream at
    ``t`` before the next layer: not so when a later mixer of its own block reads it (a
    Zamba2 hybrid layer's Mamba-2 scans its shared attention's output across positions).
    Such heads get no entry measurement; their labels come from the patterns."""
    layer, stage = model.head_position(head)
    return all(mixer.spec.stage <= stage for mixer in model.layer_specs[layer].mixers)


def _candidates(accuracy: torch.Tensor, verified: torch.Tensor, limit: int) -> list[Head]:
    """Verified heads, most harmful first, at most ``limit``."""
    found = [(float(accuracy[layer, head]), Head(layer, head)) for layer, head in verified.nonzero().tolist()]
    return sorted(head for _, head in sorted(found)[:limit])


def _gather_before_aggregate(evidence: dict[Head, HeadEvidence], position: Callable[[Head], tuple[int, int]]) -> None:
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


def _confirm(
    model: GnaModel,
    task: Task,
    circuit: GnACircuit,
    threshold: float,
    max_heads: int,
    evaluate_bars: bool | None,
    spread_runs: SpreadRuns | None = None,
) -> list[float] | None:
    """The confirmation: accuracy with each role's heads ablated, the fallback needs, and
    the path-patching check. Returns the accuracies of ``spread_runs`` when they were
    measured in a remote run's confirmation request (None otherwise)."""
    clean = circuit.accuracy["clean"]
    sets = {"-gather": circuit.gather, "-aggregate": circuit.aggregate, "-both": [*circuit.gather, *circuit.aggregate]}
    kept = {*circuit.gather, *circuit.aggregate}
    if kept:
        layers = {h.layer for h in kept}
        sets["only_gna"] = [
            Head(layer, h) for layer in sorted(layers) for h in range(model.heads_per_layer[layer]) if Head(layer, h) not in kept
        ]
    fallback = {
        role: heads for role, heads in (("gather", circuit.gather), ("aggregate", circuit.aggregate)) if heads and role not in circuit.needs
    }
    logits: list[torch.Tensor] | None = None
    spread_values: list[float] = []
    measured: dict[str, float] = {}
    prefixes: dict[str, list[float]] = {}
    if remote.batched(model):  # one request: every accuracy below, and the path-patching metric's logits
        corrupt = task.corrupted() if circuit.gather and circuit.aggregate else None
        extra = spread_runs[1] if spread_runs is not None else ()
        measured, prefixes, logits, spread_values = remote.confirm(
            model, task, {k: v for k, v in sets.items() if v}, fallback, max_heads, corrupt, extra
        )
    for name, heads in sets.items():
        if not heads:
            circuit.accuracy[name] = clean
        elif logits is not None:
            circuit.accuracy[name] = measured[name]
        else:
            circuit.accuracy[name] = memo.accuracy(model, task, [Ablate(heads)], progress=evaluate_bars)
    for role, heads in fallback.items():
        curve: list[tuple[Head, float]] = []
        if logits is not None:  # the cumulative sets were all measured: stop where the sequential search stops
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
    circuit.path_patching = _gather_to_aggregate(model, task, circuit, logits)
    return spread_values if logits is not None else None


def _gather_to_aggregate(
    model: GnaModel, task: Task, circuit: GnACircuit, logits: list[torch.Tensor] | None = None
) -> dict[str, float] | None:
    """Path patching of the edge: the Gather heads switched to a corrupted prompt (another
    correct option), their change allowed to reach the output only through the Aggregate
    heads of later layers. Metric: logit of the clean answer minus the corrupted one.
    ``logits``: the clean and corrupt final logits, if already measured (a remote run: in the
    confirmation's request); else the clean and corrupt metric are those of path patching's own
    clean and corrupt runs (`patching.paths.prepare`: the same numbers, two forwards fewer)."""
    if not circuit.gather or not circuit.aggregate:
        return None
    last_gather = max(model.head_position(h) for h in circuit.gather)
    receivers = [h for h in circuit.aggregate if model.head_position(h) > last_gather]
    if not receivers:
        return None
    corrupt = task.corrupted()
    tokenizer = task.tokenizer_for(model.tokenizer)
    clean_enc, corrupt_enc = task.encode(tokenizer), corrupt.encode(tokenizer)
    if not (clean_enc.single_token and corrupt_enc.single_token):
        return None
    if clean_enc.batch.n_pos != corrupt_enc.batch.n_pos:
        return None
    rows = torch.arange(len(task))
    right = clean_enc.candidate_ids[rows, clean_enc.correct]
    wrong = corrupt_enc.candidate_ids[rows, corrupt_enc.correct]
    metric = logit_diff(right, wrong)
    if logits is None:  # path patching's own clean and corrupt runs give the clean and corrupt metric
        setup, clean_value, corrupt_value = prepare(model, task, corrupt, check_senders(model, circuit.gather), receivers, metric, ANY, [])
        path = path_scores(setup, [list(circuit.gather)])[0]
    else:
        clean_value, corrupt_value = reduce_metric(metric(logits[0])), reduce_metric(metric(logits[1]))
        path = path_patching(model, task, corrupt, circuit.gather, receivers, metric)
    span = clean_value - corrupt_value
    return {
        "clean": clean_value,
        "corrupt": corrupt_value,
        "gather->aggregate": path,
        "fraction_of_effect": (clean_value - path) / span if abs(span) > 1e-9 else float("nan"),
    }
