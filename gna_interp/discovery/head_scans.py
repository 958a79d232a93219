"""The head scan of G&A discovery and its prescreen, measured as task accuracy.

`head_scan`: zero-ablate heads one at a time (batched sweep). Layers with more heads than
``screen_above`` (Mamba-1: every channel is a head) are scanned by adaptive group testing
(`group_testing.group_testing`, or `group_testing.StagedGroupTesting` on a remote model), their
heads split largest write first (`head_order`: one clean forward).
`prescreen`: which heads to ablate one by one when there are too many.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.heads import Head
from ..core.inputs import Batch
from ..core.interventions import Ablate
from ..models.jobs import is_batched_remote
from ..patching.metrics import candidate_accuracy
from ..patching.sweeps import ablation_sweep
from ..progress import progress_bar
from ..scoring.evaluation import evaluate_many
from .group_testing import Measure, SpreadGroup, StagedGroupTesting, group_testing, search_needed
from .head_order import ordered_layers
from .memo import accuracy as _accuracy
from .memo import remember

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import Task


@dataclass
class HeadScan:
    accuracy: Tensor
    """``[layer, head]`` accuracy with that head zero-ablated; NaN where not scanned."""
    verified: Tensor
    """``[layer, head]`` bool: measured alone (not only through its group)."""
    spread: list[SpreadGroup] = field(default_factory=list)
    """Groups of the adaptively scanned layers whose effect no half explains (`group_testing`)."""
    tests: dict[int, int] = field(default_factory=dict)
    """Per adaptively scanned layer, its group forwards."""
    search: StagedGroupTesting | None = None
    """A remote scan's spread-group search still to finish (``head_scan(defer_search=True)``):
    `StagedGroupTesting.finish`, then `record_search`."""
    unsearched: list[SpreadGroup] = field(default_factory=list)
    """A local scan's spread groups whose needed heads are not searched yet
    (``head_scan(search_spread=False)``): `search_spread`."""
    measure: Measure | None = None
    """What measured the groups (for `search_spread`)."""
    cleared: list[Head] = field(default_factory=list)
    """``quiet`` heads cleared together (`head_scan`): each holds its group's accuracy, unverified."""
    clean: float | None = None
    min_effect: float = 0.02

    def search_spread(self, groups: Sequence[SpreadGroup]) -> None:
        """Search the needed heads of those of ``groups`` left unsearched (`search_needed`),
        adding their tests to `tests`; the others are left as they are."""
        for group in groups:
            if not any(group is item for item in self.unsearched) or self.measure is None or self.clean is None:
                continue
            layer = group.heads[0].layer
            self.tests[layer] = self.tests.get(layer, 0) + search_needed(self.measure, group, self.clean, self.min_effect)
            self.unsearched = [item for item in self.unsearched if item is not group]

    def record_search(self) -> None:
        """Finish `search` (measuring what is left) and count its tests."""
        if self.search is not None:
            results = self.search.finish()
            self.tests = {heads[0].layer: found.tests for heads, found in zip(self.search.layers, results, strict=True) if heads}
            self.search = None


PRESCREEN_STEPS = 4
"""Integration points of the prescreen's integrated-gradients ranking (`prescreen`)."""


def prescreen_method(model: GnaModel, steps: int = PRESCREEN_STEPS) -> str:
    """How `prescreen` ranks heads on ``model``, in words (recorded in the circuit's settings
    when `prescreen` does not say more: it returns what it ran)."""
    if model.is_remote:
        return "forward-only: the layer scan's costly layers (remote model: no local backward for attribution)"
    if steps == 1:
        return "first-order attribution of zero ablation on the candidate logit difference"
    return f"integrated gradients, {steps} steps, of zero ablation on the candidate logit difference"


@dataclass
class Prescreen:
    """What `prescreen` chose.

    Attributes:
        heads: the heads to ablate one by one, layer-major.
        estimates: ``[layer, head]`` estimates of the ranked heads' zero-ablation effect
            (0 elsewhere), or ``None`` where nothing was estimated.
        method: how the heads were chosen, in words (`prescreen_method`'s, or why the
            ranking stopped at first order or did not run).
    """

    heads: list[Head]
    estimates: Tensor | None
    method: str


def prescreen(
    model: GnaModel,
    task: Task,
    layers: Sequence[int],
    harmful_layers: Sequence[int],
    keep: int,
    rows: int = 64,
    steps: int = PRESCREEN_STEPS,
    grouped: Sequence[int] = (),
    first: FirstOrder | None = None,
) -> Prescreen:
    """Which heads of ``layers`` to ablate one by one when there are too many: every head of
    ``harmful_layers`` (from the layer scan: removing the layer costs accuracy), and the
    ``keep`` heads with the largest estimate of their zero-ablation effect on the candidate
    logit difference: integrated gradients over ``steps`` points (`ablation_attribution`'s,
    ``rule="left"``; ``steps`` forwards and backwards per ``rows`` prompts; first-order attribution misranks the hybrid toy's heads,
    docs/records/patching.md, "Integrated gradients against full patching"). A head whose
    estimate is exactly 0 (its output reaches nothing the metric depends on, e.g. its
    out-projection columns are zero) is kept only through its layer. The heads of
    ``grouped`` layers (scanned by group testing) are neither gated nor ranked. Remote
    models get no attribution (no local backward): the layers alone, the forward-only screen.

    **Only where the ranking decides.** The first point (``alpha = 0``) is first-order
    attribution. When at most ``keep`` heads have a non-zero first-order estimate, every
    one of them is kept whatever their order, so the other ``steps - 1`` points are not
    run (the estimates stay first order; a gradient exactly 0 at ``alpha = 0`` is taken to
    be structural, 0 along the whole path, as for zeroed out-projection columns). With
    nothing to rank (no gated head outside ``harmful_layers``), no attribution runs.
    Otherwise the remaining points complete the integral: the same estimates as
    `ablation_attribution` with ``steps`` points. ``first``: that first point, measured
    already (`first_order`, before the baseline), used where it covers every ranked head.

    Returns:
        `Prescreen`.
    """
    harmful, skipped = set(harmful_layers), set(grouped)
    scanned = [Head(layer, h) for layer in layers if layer not in skipped for h in range(model.heads_per_layer[layer])]
    chosen = {head for head in scanned if head.layer in harmful}
    if model.is_remote:
        return Prescreen(sorted(chosen), None, prescreen_method(model, steps))
    if all(head.layer in harmful for head in scanned):
        return Prescreen(sorted(chosen), None, "every head of the costly layers (nothing else to rank: no attribution)")
    chunks = _chunks(model, task, rows)

    def integrate(points: Sequence[int], baselines: list[float | None]) -> tuple[Tensor, list[float | None]]:
        return _integrate(model, chunks, scanned, points, baselines, steps)

    if first is not None and first.rows == rows and first.steps == steps and set(scanned) <= first.heads:
        estimates = torch.zeros(model.n_layers, model.n_heads)  # measured before the baseline (`first_order`)
        for head in scanned:
            estimates[head.layer, head.head] = first.estimates[head.layer, head.head]
        baselines = first.baselines
    else:
        estimates, baselines = integrate([0], [None] * len(chunks))  # alpha = 0: first order, divided by `steps`
    live = [head for head in scanned if float(estimates[head.layer, head.head]) != 0.0]
    if len(live) <= keep or steps == 1:
        method = prescreen_method(model, 1)
        if steps > 1:
            method += f": {len(live)} heads reach the metric, at most the {keep} kept, so integrated gradients would decide nothing"
        return Prescreen(sorted(chosen | set(live)), estimates * steps, method)
    rest, _ = integrate(range(1, steps), baselines)
    estimates += rest
    order = sorted(scanned, key=lambda h: (-abs(float(estimates[h.layer, h.head])), h))
    chosen |= {h for h in order[:keep] if float(estimates[h.layer, h.head]) != 0.0}
    return Prescreen(sorted(chosen), estimates, prescreen_method(model, steps))


@dataclass
class FirstOrder:
    """`prescreen`'s first point, ``alpha = 0``, measured early by `first_order`.

    Attributes:
        heads: the heads it gated.
        estimates: ``[layer, head]``, each gated head's first-order estimate divided by ``steps``.
        baselines: the candidate logit difference of each chunk of ``rows`` prompts (clean).
        rows, steps: `prescreen`'s, for which it holds.
    """

    heads: frozenset[Head]
    estimates: Tensor
    baselines: list[float | None]
    rows: int
    steps: int


def first_order(model: GnaModel, task: Task, heads: Sequence[Head], rows: int = 64, steps: int = PRESCREEN_STEPS) -> FirstOrder:
    """`prescreen`'s first point for ``heads``, run before discovery's baseline: its gated
    forward at ``alpha = 0`` is the clean forward of each chunk (gates at 0 change nothing),
    so it also gives an open prefix cache the chunks' clean streams (`GnaModel.remember_prefix`)
    and `evaluate`'s baseline over the same chunks then runs no block: the prescreen's forward
    and the baseline's are one. Gating more heads than the prescreen ranks changes no
    estimate (each gate's gradient at 0 is its own), so `prescreen` reads those it ranks."""
    chunks = _chunks(model, task, rows)
    estimates, baselines = _integrate(model, chunks, list(heads), [0], [None] * len(chunks), steps, prime=True)
    return FirstOrder(frozenset(heads), estimates, baselines, rows, steps)


def _chunks(model: GnaModel, task: Task, rows: int) -> list[tuple[Batch, Any, float]]:
    """The task in chunks of ``rows`` prompts: ``(batch, candidate logit difference, share of the task)``."""
    from ..patching.metrics import candidate_logit_diff

    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    chunks = []
    for start in range(0, encoded.batch.n_rows, rows):  # gradients of `rows` prompts at a time
        stop = min(start + rows, encoded.batch.n_rows)
        chunk = Batch(encoded.batch.input_ids[start:stop], encoded.batch.attention_mask[start:stop])
        metric = candidate_logit_diff(encoded.candidate_ids[start:stop], encoded.correct[start:stop])
        chunks.append((chunk, metric, (stop - start) / encoded.batch.n_rows))
    return chunks


def _integrate(
    model: GnaModel,
    chunks: list[tuple[Batch, Any, float]],
    heads: list[Head],
    points: Sequence[int],
    baselines: list[float | None],
    steps: int,
    prime: bool = False,
) -> tuple[Tensor, list[float | None]]:
    """``[layer, head]`` zero-ablation estimates of ``heads`` at ``points`` (of ``steps``),
    weighted over the chunks, and each chunk's clean metric; ``prime``: hand each chunk's
    clean streams to an open prefix cache (point 0 only)."""
    from ..core.compile import heads_by_site
    from ..patching.attribution import integrated_effects

    sites = sorted(heads_by_site(model.layout, heads))
    ambient = list(model.active_interventions)
    estimates = torch.zeros(model.n_layers, model.n_heads)
    measured: list[float | None] = []
    for (chunk, metric, weight), baseline in zip(chunks, baselines, strict=True):
        targets = {site: torch.zeros(()) for site in sites}
        capture, remember = (model.prefix_sites(chunk), partial(model.remember_prefix, chunk)) if prime else (set(), None)
        effects, value = integrated_effects(
            model,
            chunk,
            ambient,
            targets,
            metric,
            steps,
            "left",
            points=points,
            baseline=baseline,
            clean_capture=capture,
            on_clean=remember,
        )
        measured.append(value)
        for head in heads:
            site, index = model.head_site(head)
            estimates[head.layer, head.head] += float(effects[site][:, index].sum()) * weight
    return estimates, measured


def head_scan(
    model: GnaModel,
    task: Task,
    layers: Sequence[int],
    *,
    screen_above: int = 64,
    only: Collection[Head] | None = None,
    adaptive: Sequence[int] = (),
    clean: float | None = None,
    min_effect: float = 0.02,
    progress: bool = True,
    known: dict[tuple[Head, ...], float] | None = None,
    defer_search: bool = False,
    search_spread: bool = True,
    quiet: Collection[Head] = (),
    order: Mapping[int, Sequence[Head]] | None = None,
) -> HeadScan:
    """Single-head zero-ablation accuracy for every head of ``layers`` (see module docs):
    layers of more than ``screen_above`` heads by adaptive group testing (`group_testing`,
    heads whose single ablation costs at least ``min_effect`` below ``clean``). With
    ``only``, for those heads alone (a `prescreen`), and the layers ``adaptive`` by group
    testing whatever their width. On a remote model (one request per round) every such
    layer together by `staged_group_testing` (2 or 3 rounds, not one per bisection step).
    Group testing splits each layer's heads in `head_order.by_size`'s order (the largest
    writes into the residual stream first: the few costly heads gather in few groups, and
    the rest is cleared in few tests), measured by one clean forward (`head_order.write_sizes`)
    unless ``known`` holds the whole layer in that order, or ``order`` the layer's heads in it
    (measured ahead: `stages.early_head_order`).

    Args:
        clean: accuracy with nothing ablated (measured if needed and not given).
        known: group accuracies already measured (`staged_group_testing`'s ``known``).
        defer_search: on a remote model, leave the spread groups' search to the caller
            (`HeadScan.search`: its first round can travel with other work).
        search_spread: locally, search the spread groups' needed heads in the scan;
            ``False``: only when asked (`HeadScan.search_spread`: ``discover`` searches
            those of the groups its spread report shows). A remote scan searches them all.
        quiet: heads to be ablated alone whose prescreen estimate is exactly 0 (nothing the
            metric reads depends on their output: `prescreen`). Those of a layer (two or more)
            are first ablated together: a group costing less than ``min_effect`` clears them
            (each holds the group's accuracy, not verified: `HeadScan.cleared`); otherwise
            each is ablated alone, as without it.
    """
    accuracy = torch.full((model.n_layers, model.n_heads), float("nan"))
    verified = torch.zeros(model.n_layers, model.n_heads, dtype=torch.bool)
    direct, wide = _direct_and_wide(model, layers, screen_above, only, adaptive)
    spread: list[SpreadGroup] = []
    tests: dict[int, int] = {}
    if wide and clean is None:
        clean = _accuracy(model, task)
    heads_of = _split_order(model, task, wide, known, order)
    search = None
    if wide and is_batched_remote(model) and not model.active_interventions:  # few rounds: each is a request
        search = StagedGroupTesting(group_measure(model, task), [heads_of[layer] for layer in wide], float(clean), min_effect, known)  # type: ignore[arg-type]
        results = search.results if defer_search else search.finish()
    else:
        layers_shown = progress_bar(wide, show=progress, desc="group testing")
        measure = group_measure(model, task)
        results = [group_testing(measure, heads_of[layer], float(clean), min_effect, search_spread) for layer in layers_shown]  # type: ignore[arg-type]
    for layer, found in zip(wide, results, strict=True):
        for values, measured in ((found.screened, False), (found.singles, True)):
            for head, value in values.items():
                accuracy[head.layer, head.head] = value
                verified[head.layer, head.head] = measured
        spread += found.spread
        tests[layer] = found.tests
    cleared, clean = _clear_quiet(model, task, quiet, direct, clean, min_effect, accuracy)
    done = set(cleared)
    direct = [h for h in direct if h not in done]
    for head, value in _single_ablations(model, task, direct, progress).items():
        accuracy[head.layer, head.head] = value
        verified[head.layer, head.head] = True
    scan = HeadScan(accuracy, verified, spread, tests, search if defer_search else None, cleared=cleared)
    if search is None and not search_spread:
        scan.unsearched = [group for group in spread if group.searched]
        scan.measure, scan.clean, scan.min_effect = measure, float(clean) if clean is not None else None, min_effect
    return scan


def _split_order(
    model: GnaModel,
    task: Task,
    wide: Sequence[int],
    known: dict[tuple[Head, ...], float] | None,
    ahead: Mapping[int, Sequence[Head]] | None = None,
) -> dict[int, list[Head]]:
    """Each ``wide`` layer's heads in the order group testing splits them (`head_order.by_size`: the
    largest writes first): from ``ahead`` (measured before the baseline), or from ``known`` where it
    holds the whole layer (a remote first stage, measured in that order: `head_order.ordered_layers`
    before the first request), else `head_order.ordered_layers` of the other layers (one forward)."""
    order: dict[int, list[Head]] = {layer: list(ahead[layer]) for layer in wide if ahead is not None and layer in ahead}
    for group in known or {}:
        layer = group[0].layer if group else -1
        if layer in wide and layer not in order and len(group) == model.heads_per_layer[layer] and {h.layer for h in group} == {layer}:
            order[layer] = list(group)
    missing = [layer for layer in wide if layer not in order]
    return order | (ordered_layers(model, task, missing) if missing else {})


def _direct_and_wide(
    model: GnaModel, layers: Sequence[int], screen_above: int, only: Collection[Head] | None, adaptive: Sequence[int]
) -> tuple[list[Head], list[int]]:
    """`head_scan`'s heads to ablate alone and its layers for group testing: ``only``'s
    heads outside the ``adaptive`` layers, or every head of the ``layers`` of at most
    ``screen_above`` heads (the wider layers then join ``adaptive``)."""
    direct: list[Head] = []
    wide = list(adaptive)
    if only is not None:
        return sorted(h for h in only if h.layer not in set(wide)), wide
    for layer in layers:
        heads = [Head(layer, h) for h in range(model.heads_per_layer[layer])]
        if len(heads) > screen_above:
            wide.append(layer)
        else:
            direct += heads
    return direct, wide


def _clear_quiet(
    model: GnaModel, task: Task, quiet: Collection[Head], direct: list[Head], clean: float | None, min_effect: float, accuracy: Tensor
) -> tuple[list[Head], float | None]:
    """`head_scan`'s ``quiet`` heads of each layer (two or more, among ``direct``) ablated
    together: the heads of a group costing less than ``min_effect`` are cleared, each given
    the group's accuracy in ``accuracy``. Returns the cleared heads and ``clean`` (measured
    if needed)."""
    cleared: list[Head] = []
    alone = set(direct)
    for layer in sorted({h.layer for h in quiet}):
        group = sorted(h for h in quiet if h.layer == layer and h in alone)
        if len(group) < 2:
            continue
        if clean is None:
            clean = _accuracy(model, task)
        value = _accuracy(model, task, [Ablate(group)])
        if clean - value < min_effect:  # cleared together (monotone effects, as group testing assumes)
            for head in group:
                accuracy[head.layer, head.head] = value
            cleared += group
    return cleared, clean


def group_measure(model: GnaModel, task: Task) -> Measure:
    """`Measure` on ``model``: a remote model's round in one request (`evaluate_many`)."""

    def measure(groups: list[list[Head]]) -> list[float]:
        if is_batched_remote(model):
            return [result.accuracy for result in evaluate_many(model, [(task, [Ablate(g)]) for g in groups])]
        return [_accuracy(model, task, [Ablate(g)]) for g in groups]

    return measure


def _single_ablations(model: GnaModel, task: Task, heads: list[Head], progress: bool) -> dict[Head, float]:
    if not heads:
        return {}
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    if encoded.single_token:  # one batched sweep, scored by candidate accuracy
        metric = candidate_accuracy(encoded.candidate_ids, encoded.correct)
        sweep = ablation_sweep(model, task, None, metric, heads=heads, progress=progress)
        # the share of prompts right, as `evaluate` states it (k / n): the sweep's float32 mean
        # differs in its last bit between devices (40 / 48: 0.83333331 on a CPU, 0.83333337 on
        # an H100), which reordered tied heads
        n = len(task)
        found = {h: round(float(sweep.scores[h.layer, h.head]) * n) / n for h in heads}
        for head, value in found.items():
            remember(model, task, [Ablate([head])], value)
        return found
    return {h: _accuracy(model, task, [Ablate([h])]) for h in progress_bar(heads, show=progress, desc="head scan")}
