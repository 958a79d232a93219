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
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..cost import cost_meter
from ..progress import progress_bar
from ..scoring.evaluation import evaluate
from ..tasks.base import Task
from . import head_scans, memo, remote
from . import stages as stage
from .circuit import GnaCircuit
from .estimate import StageBar, estimate_passes
from .evidence import ROLES, HeadEvidence, Stability
from .joint import JointSearch, check_joint_search
from .roles import RoleThresholds, role_scores
from .stages import SEARCH_STAGES, STAGES

if TYPE_CHECKING:
    from ..cost import Cost
    from ..models.handle import GnaModel


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
    search_at_chance: bool = False,
    joint_search: str = "ordered",
    progress: bool = True,
    stability: int | Sequence[Task] | None = None,
) -> GnaCircuit:
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
        search_at_chance: search even when there is no retrieval to explain (to exercise the
            stages on a random model). By default, a clean accuracy below
            `stages.retrieval_floor` (chance + ``max(chance_margin, 2 sqrt(chance (1 - chance)
            / n_prompts))``: two binomial standard errors, stated in prompts in the circuit's
            note) stops discovery after the baseline: the circuit's ``mechanism`` is
            ``"none"``, it names no role heads, and its summary, JSON and report say "no
            retrieval to explain" with the numbers.
        joint_search: how the joint stage grows each role's set (`joint.JOINT_SEARCHES`):
            ``"ordered"`` tries the pool's heads that cost accuracy alone, in the order of
            their own effect at the role's positions (the entry scan's), one forward per head
            tried, and where they fall short of chance runs the greedy search over the whole
            pool; ``"greedy"`` runs only that search, which re-ranks the rest after each head,
            one forward per pool head at each step.
        progress: progress bars: one per scan, and `evaluate`'s per-batch bars (its
            default: tasks of more than 4 batches) for the single evaluations of the
            baseline, the label check and the confirmation. ``False``: no bar at all.
        stability: also re-run the search on other prompt samples (`stability`, with
            these settings) and record how often each head is chosen as
            ``circuit.stability``: a number of bootstrap samples of ``task`` (at least
            2), or the sample tasks themselves. ``None`` (default): not measured.

    Returns:
        a `GnaCircuit`; its ``cost`` holds what discovery ran (`gna_interp.cost`): forwards,
        rows, block evaluations, passes over the task, remote requests, seconds, and the passes
        estimated before it started (``estimate``: ``low``, ``mid``, ``high``;
        `estimate.estimate_passes`, also in the stage bar's description). Forwards
        over a batch seen before start from its cached clean prefix (`GnaModel.prefix_cache`).
    """
    if stability is not None:
        _check_samples(stability, "stability")
    check_joint_search(joint_search)
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
        "search_at_chance": search_at_chance,
        "joint_search": joint_search,
    }
    with model.prefix_cache(), memo.accuracy_memo(model), cost_meter(model) as cost:
        started = time.perf_counter()
        circuit = _discover(model, task, progress=progress, meter=cost, **options)
    circuit.cost = {**cost.to_dict(len(task)), "seconds": time.perf_counter() - started, **(circuit.cost or {})}  # + size curves
    circuit.cost["estimate"] = {k: circuit.settings["estimate"][k] for k in ("low", "mid", "high")}
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
            raise GnaValueError(f"k={k!r} with {len(task)} sample tasks given: leave k out, or give k tasks")
    defaults = _discover_settings()
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise GnaTypeError(f"stability got unknown discover settings {unknown}: expected some of {sorted(defaults)}")
    merged = {**defaults, **options}
    if merged["prescreen_keep"] is None:
        merged["prescreen_keep"] = 2 * merged["max_candidates"]
    check_joint_search(merged["joint_search"])
    return _stability(model, _sample_tasks(task, samples, seed) if isinstance(task, Task) else (list(task), None), merged, progress)


def _discover_settings() -> dict[str, Any]:
    """`discover`'s settings (its keyword-only parameters but ``progress`` and
    ``stability``) and their defaults, as `stability` takes them."""
    parameters = inspect.signature(discover).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY and p.name not in ("progress", "stability")}


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


def _discover(model: GnaModel, task: Task, *, progress: bool, meter: Cost | None = None, **options: Any) -> GnaCircuit:
    """`discover`'s stages (`_stages`) under a `StageBar` (shown with ``progress`` and the
    run's ``meter``), closed when they end, exceptions included."""
    bar = StageBar(meter, len(task), show=progress and meter is not None)
    try:
        return _stages(model, task, progress=progress, bar=bar, **options)
    finally:
        bar.close()


def _stages(
    model: GnaModel,
    task: Task,
    *,
    bar: StageBar,
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
    search_at_chance: bool,
    joint_search: str,
    progress: bool,
) -> GnaCircuit:
    """`discover`'s stages in order (module docs), each a function of its own below, each
    announced on ``bar``; the pass estimate (`estimate_passes`) in ``settings["estimate"]``."""
    thresholds, scan_layers = stage.check_arguments(model, task, stages, thresholds, layers)
    knobs = (max_candidates, pattern_prompts, check_labels, screen_above, prescreen_above, prescreen_keep)
    estimate = estimate_passes(model, len(task), stages, scan_layers, *knobs)
    bar.start(estimate)
    bar.stage("baseline")
    evaluate_bars = None if progress else False  # evaluate's own default for single evaluations, or none
    batched = remote.batched(model)  # a remote model: each stage in one request (`remote`)
    wide = [layer for layer in scan_layers if model.heads_per_layer[layer] > screen_above] if "heads" in stages else []
    first = stage.first_request(model, task, stages, check_labels, wide) if batched else None
    # the prescreen's first-order forward is the clean one: run first, it fills the prefix cache for the baseline
    early = None if batched else stage.early_first_order(model, task, stages, scan_layers, screen_above, prescreen_above)
    clean = first.clean if first is not None else evaluate(model, task, progress=evaluate_bars)
    settings = {
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
        "search_at_chance": search_at_chance,
        "joint_search": joint_search,
        "estimate": estimate,
    }
    circuit = stage.baseline(model, task, clean, chance_margin, settings)
    chance = clean.chance
    if circuit.mechanism == "none" and not search_at_chance:
        return circuit  # no retrieval to explain: no head search
    if check_labels and circuit.mechanism != "none":
        bar.stage("label check")
        stage.label_check(model, task, circuit, chance + chance_margin, evaluate_bars, None if first is None else first.shuffled)
    bar.stage("layer scans")
    stage.layer_stages(model, task, circuit, stages, first, thresholds.min_effect, progress)
    if "heads" not in stages:
        return circuit
    only: list[Head] | None = None
    adaptive: list[int] = []
    quiet: list[Head] = []
    if sum(model.heads_per_layer[layer] for layer in scan_layers) > prescreen_above:
        bar.stage("prescreen")
        only, adaptive, quiet = stage.prescreen_stage(
            model, task, circuit, scan_layers, wide, thresholds, screen_above, prescreen_keep, batched, early
        )
    bar.stage("head scan")
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
        search_spread=batched,  # locally, only the groups the spread report shows are searched (`spread_check`)
        quiet=quiet,
    )
    circuit.head_scan = [[None if v != v else float(v) for v in row] for row in scan.accuracy.tolist()]
    candidates = stage.candidates(scan.accuracy, scan.verified, max_candidates, scan.cleared)
    evidence = {h: HeadEvidence(h, None, float(scan.accuracy[h.layer, h.head]), bool(scan.verified[h.layer, h.head])) for h in candidates}
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    harmful = [
        h for h, e in evidence.items() if e.ablated_accuracy is not None and clean.accuracy - e.ablated_accuracy >= thresholds.min_effect
    ]
    # locally the patterns come first: the entry scan then measures only what the labels read
    labels = None
    if not batched and "roles" in stages and candidates:
        bar.stage("roles")
        labels = stage.LabelInputs(role_scores(model, encoded, candidates, pattern_prompts), thresholds, clean.accuracy)
    if "entry" in stages:
        bar.stage("entry")
        stage.entry_stage(model, task, encoded, evidence, harmful, scan, progress, labels)
    scan.record_search()
    if scan.tests:
        circuit.settings["group_testing"] = {str(layer): tests for layer, tests in scan.tests.items()}
    ahead = remote.pool_heads(model, harmful, evidence, screen_above) if batched and "joint" in stages else []
    if labels is not None:
        measured = labels.scores
    else:
        bar.stage("roles")
        measured = role_scores(model, encoded, [*candidates, *ahead], pattern_prompts) if "roles" in stages and candidates else {}
    if "roles" in stages and candidates:
        stage.role_stage(model, task, evidence, candidates, harmful, measured, thresholds, clean.accuracy)
        if labels is not None and "entry" in stages:
            stage.entry_ends(model, task, encoded, evidence, progress)
    by_harm = sorted(evidence.values(), key=lambda e: (e.ablated_accuracy if e.ablated_accuracy is not None else 1.0, e.head))
    circuit.gather = [e.head for e in by_harm if e.role == "gather"]
    circuit.aggregate = [e.head for e in by_harm if e.role == "aggregate"]
    if "joint" in stages and "roles" in stages and encoded.single_token:  # positions need single-token scoring
        bar.stage("joint")
        search = JointSearch(model, task, encoded, evidence, scan, thresholds, pattern_prompts, screen_above, progress, joint_search)
        search.scored = {h: measured[h] for h in ahead}
        stage.joint_stage(search, circuit, chance + chance_margin, max_heads_per_role, batched)
    for item in evidence.values():
        item.kind = model.head_kind(item.head).value
    circuit.heads = sorted(evidence.values(), key=lambda e: e.head)
    if "confirm" in stages:
        bar.stage("confirm")
        stage.confirm_stage(model, task, encoded, circuit, scan, chance + chance_margin, max_heads_per_role, evaluate_bars, batched)
    return circuit
