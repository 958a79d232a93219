"""Attribution patching: every head's activation-patching effect, to first order, from
one forward and one backward.

Activation patching replaces one activation ``a`` (on the run's input) by its value
``a'`` on the other input and measures the metric ``m``; a sweep costs one forward per
head. To first order in ``a' - a`` that effect is

    ``m(a') - m(a) ~= (a' - a) . dm/da``

and one backward gives ``dm/da`` for every head at once (Nanda 2023; Syed et al. 2023).
The estimate is exact where the metric is linear in the patched activation (the tests
construct such a model) and can be far off where it is not (a saturated softmax, an SSM
gate); use it to screen many heads, then confirm the top ones with `patching_sweep`.

Integrated gradients (``steps=k``, Sundararajan et al. 2017; on nodes as EAP-IG does on
edges, Hanna et al. 2024). A *gate* mixes each scored head's output towards its target
value ``t`` (the source run's output for patching, 0 for zero ablation):
``a_h = n_h + w_h (t_h - n_h)``, ``n_h`` the head's natural output in that same run
(`gna_interp.core.plan.Edit` with a floating mask). Every scored head is gated at once
along ``w = alpha``: ``alpha = 0`` is the run itself, ``alpha = 1`` the run with all of
them patched (ablated) together. One backward per point gives every head's
``dm/dw_h = (t_h - n_h) . dm/da_h``, and a head's score is their average over ``k``
points: ``alpha_j = j / k`` (``rule="left"``; ``k = 1`` is the first-order estimate
above) or ``(j + 1/2) / k`` (``rule="midpoint"``, error ``O(1/k^2)`` instead of
``O(1/k)``). Completeness: the scores' effects sum to the path's Riemann sum of
``m(all patched) - m(none)``, which they approach as ``k`` grows. Cost: ``k`` forwards
and ``k`` backwards (plus the source forward; ``"midpoint"`` adds a plain forward for
the baseline), the memory of one forward-and-backward at a time.

Directions follow `patching_sweep`: ``"denoise"`` (default) runs ``corrupt`` and
estimates patching in ``clean`` values; ``"noise"`` runs ``clean`` and estimates patching
in ``corrupt`` values. The result is a `SweepResult` whose ``scores`` are the baseline
plus the estimated effect, so ``effects()``, ``top()``, ``normalized()`` and
``to_frame()`` read the same as for activation patching.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from ..core.compile import heads_by_site
from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..core.interventions import Intervention
from ..core.keywords import renamed, suggest_keywords
from ..core.plan import Edit, Plan, Site, SiteKind
from ..cost import charge
from ..models.handle import check_model
from ..progress import progress_bar
from .checks import check_local, check_sites, head_list, target_and_source
from .metrics import Metric, check_metric, logits_read, metric_name, reduce_metric
from .results import SweepResult
from .variants import rows_per_forward

if TYPE_CHECKING:
    from ..models.handle import GnaModel


IG_RULES = ("left", "midpoint")
"""Where integrated gradients evaluate the gradient in each of the ``steps`` intervals."""


@renamed(max_rows="batch_size")
@suggest_keywords
def attribution_patching(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    *,
    sites: Literal["heads", "resid"] = "heads",
    by_position: bool = False,
    direction: Literal["denoise", "noise"] = "denoise",
    heads: Sequence[Head] | None = None,
    interventions: Sequence[Intervention] = (),
    steps: int = 1,
    rule: Literal["left", "midpoint"] = "left",
    batch_size: int | None = None,
    memory_budget_mb: float | None = None,
    progress: bool = True,
) -> SweepResult:
    """First-order (``steps=1``) or integrated-gradients estimate of `patching_sweep` for
    every head (or residual site).

    Args:
        model: a `GnaModel` (local weights: the backward runs here).
        clean: inputs of the clean run.
        corrupt: inputs of the corrupted run: the same token length as ``clean`` (and rows, or one row).
        metric: logits ``[batch, pos, vocab]`` -> scalar or ``[batch]`` tensor (averaged),
            differentiable in the logits (``logit_diff``, ``target_logprob``; not
            ``candidate_accuracy``).
        sites: ``"heads"`` (head outputs) or ``"resid"`` (residual stream entering each block).
        by_position: one estimate per position.
        direction: ``"denoise"`` or ``"noise"``, as in `patching_sweep`.
        heads: heads to score (default every head; ``sites="heads"`` only).
        interventions: applied to both runs, on top of active contexts.
        steps: integration points between the run's activations and the source's (see
            the module docs); ``1`` is first-order attribution patching. ``sites="heads"``
            only above 1 (every layer's residual stream on one path would patch the
            whole input at once).
        rule: ``"left"`` (``alpha = j / steps``) or ``"midpoint"`` (``(j + 1/2) / steps``).
        batch_size: rows per forward-and-backward (default: estimated from ``memory_budget_mb``).
            A batch of more rows runs in chunks, with the same result: each chunk's
            gradient is taken with the other rows' logits held (one more forward, without
            gradients, per point and chunk).
        memory_budget_mb: the memory a forward may use, to estimate ``batch_size``.
        progress: show a progress bar (over points and chunks).

    Returns:
        `SweepResult` of kind ``"attribution"``: ``scores`` = baseline + estimated effect,
        ``[layer, head]``, ``[layer, head, pos]``, ``[layer]`` or ``[layer, pos]``;
        ``baseline`` the metric of the run, ``reference`` that of the value source;
        ``meta["steps"]``, ``meta["rule"]``.
    """
    check_model(model, "attribution_patching")
    check_metric(metric, "attribution_patching", clean=clean, corrupt=corrupt)
    check_sites(sites, heads, "score")
    check_local(model, "attribution_patching")
    check_steps(steps, rule)
    if steps > 1 and sites != "heads":
        raise GnaValueError(f"steps={steps} with sites={sites!r}: integrated gradients score heads; use sites='heads' or steps=1")
    target, source = target_and_source(model, clean, corrupt, direction, "attribution patching (an estimate of patching)")
    chosen = head_list(model, heads) if sites == "heads" else []
    if sites == "heads":
        site_list = sorted(heads_by_site(model.layout, chosen))
    else:
        site_list = [Site(SiteKind.RESID, layer) for layer in range(model.n_layers)]
    ambient = [*model.active_interventions, *interventions]
    source_out = model.run_plan(
        source, model.compile_plan(source, ambient), capture=set(site_list), logits_to_keep=logits_read(metric), prefix=False
    )
    reference = reduce_metric(metric(source_out.logits), metric, source.n_rows)
    targets = {site: source_out.acts[site] for site in site_list}
    del source_out  # its logits are read: not held through the forwards and backwards
    rows = rows_per_forward(model, target.n_pos, batch_size, memory_budget_mb)
    effects, baseline = integrated_effects(model, target, ambient, targets, metric, steps, rule, batch_size=rows, progress=progress)
    if not by_position:
        effects = {site: effect.sum(0) for site, effect in effects.items()}
    result = _result(model, sites, chosen, effects, baseline, reference, target.n_pos, by_position, direction)
    result.meta.update(_method(steps, rule))
    return result


def ablation_attribution(
    model: GnaModel,
    clean: Any,
    metric: Metric,
    *,
    heads: Sequence[Head] | None = None,
    interventions: Sequence[Intervention] = (),
    steps: int = 1,
    rule: Literal["left", "midpoint"] = "left",
) -> SweepResult:
    """First-order (``steps=1``) or integrated-gradients estimate of `ablation_sweep` (zero
    ablation) for every head at once.

    Zero-ablating a head replaces its output ``a`` by 0, so to first order the metric
    moves by ``(0 - a) . dm/da``: one forward and one backward give every head's estimate.
    Exact where the metric is linear in the head's output (a test builds such a model);
    elsewhere an estimate, used by `discover` to choose which heads to ablate one by one.
    With ``steps=k``, integrated gradients along the path that scales every scored head's
    output from ``a`` to 0 at once (the module docs): ``k`` forwards and backwards.

    Args:
        model: a `GnaModel` with local weights.
        clean: the inputs measured (prompts, token ids or a task).
        metric: logits -> scalar or ``[batch]`` tensor, differentiable (``candidate_logprob``,
            ``logit_diff``; not ``candidate_accuracy``). Averaged over the rows.
        heads: heads to score (default every head).
        interventions: applied to every row, on top of active contexts.
        steps: integration points (``1``: first order).
        rule: ``"left"`` or ``"midpoint"`` (see `attribution_patching`).

    Returns:
        `SweepResult` of kind ``"attribution"``: ``scores`` ``[layer, head]`` = baseline +
        estimated effect (NaN for heads not scored), ``baseline`` the metric.
    """
    check_local(model, "ablation_attribution")
    check_steps(steps, rule)
    chosen = head_list(model, heads)
    batch = model.to_batch(clean)
    site_list = sorted(heads_by_site(model.layout, chosen))
    ambient = [*model.active_interventions, *interventions]
    effects, total = integrated_effects(model, batch, ambient, {site: torch.zeros(()) for site in site_list}, metric, steps, rule)
    scores = torch.full((model.n_layers, model.n_heads), float("nan"))
    for head in chosen:
        site, index = model.head_site(head)
        scores[head.layer, head.head] = total + effects[site][:, index].sum()  # effects: [pos, head] of the site
    meta = {"how": "zero", "n_prompts": batch.n_rows, **_method(steps, rule)}
    return SweepResult(scores, ("layer", "head"), total, kind="attribution", meta=meta)


def check_steps(steps: int, rule: str) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise GnaValueError(f"steps={steps!r}: expected an int >= 1 (integration points; 1 is first-order attribution)")
    if rule not in IG_RULES:
        raise GnaValueError(f"rule={rule!r}: expected one of {IG_RULES}")


def _method(steps: int, rule: str) -> dict[str, Any]:
    name = "attribution" if steps == 1 and rule == "left" else "integrated_gradients"
    return {"method": name, "steps": steps, "rule": rule}


def integrated_effects(
    model: GnaModel,
    batch: Any,
    ambient: Sequence[Intervention],
    targets: dict[Site, Tensor],
    metric: Metric,
    steps: int,
    rule: str,
    *,
    points: Sequence[int] | None = None,
    baseline: float | None = None,
    batch_size: int | None = None,
    progress: bool = False,
    clean_capture: Collection[Site] = (),
    on_clean: Callable[[dict[Site, Tensor]], None] | None = None,
) -> tuple[dict[Site, Tensor], float]:
    """Integrated gradients of ``metric`` on ``batch`` along the gate path that moves every
    site of ``targets`` towards its target value at once (module docs).

    Args:
        batch: the run's inputs (a `Batch`).
        ambient: interventions applied under the gates.
        targets: site -> target value, broadcastable to the site's activation (a head site
            ``[batch | 1, pos, head, d_head]`` or ``[]``; a residual ``[batch | 1, pos, d_model]``).
        steps, rule: the points ``alpha_j`` (``"left"``: ``j / steps``; ``"midpoint"``: ``(j + 1/2) / steps``).
        points: the ``j`` to evaluate (default ``range(steps)``): part of the integral, so
            that a caller can stop after the first points (the parts add up to the whole).
        baseline: the metric of the ungated run, if known (else measured: at ``alpha = 0``
            when ``points`` holds it under ``"left"``, else by a plain forward).
        batch_size: rows per forward-and-backward (default: the whole batch at once); a
            larger batch runs in row chunks, each chunk's backward taken through the
            metric of the whole batch with the other rows' logits held (exact: a row's
            logits depend on that row alone).
        progress: show a bar over the points (and chunks).
        clean_capture, on_clean: at ``alpha = 0`` (``"left"``, point 0, one chunk) the gated
            forward is the clean forward (gates at 0 change nothing): it also captures
            ``clean_capture`` and passes them, detached, to ``on_clean`` (e.g.
            `GnaModel.remember_prefix`, so that a later clean forward need not run).

    Returns:
        site -> ``[pos, head]`` (head sites) or ``[pos]`` (residual) effects, float32 on
        the CPU: ``(1/steps) sum_{j in points} dm/dw(alpha_j)``, each gate one weight per
        position and head; and the metric of the ungated run.
    """
    base = model.compile_plan(batch, ambient)
    points = range(steps) if points is None else points
    n = batch.n_rows
    per_chunk = n if batch_size is None else max(1, batch_size)
    cuts = [slice(a, min(a + per_chunk, n)) for a in range(0, n, per_chunk)]
    path = _GatePath(model, batch, base, targets, sorted(targets), cuts, logits_read(metric), on_clean)
    if baseline is None and (rule == "midpoint" or 0 not in points):
        baseline = path.ungated(metric)
    effects = {site: torch.zeros(_gate_shape(model, site, batch.n_pos)[1:-1]) for site in path.sites}
    offset = 0.5 if rule == "midpoint" else 0.0
    with progress_bar(total=len(points) * len(cuts), show=progress, desc="attribution") as bar:
        for j in points:
            measured = _add_point(path, metric, (j + offset) / steps, steps, effects, clean_capture, j == 0 and baseline is None, bar)
            if measured is not None:
                baseline = measured  # alpha = 0: the gates change nothing
    assert baseline is not None
    return effects, float(baseline)


@dataclass(frozen=True)
class _GatePath:
    """`integrated_effects`'s runs: ``batch`` under ``base`` in row chunks ``cuts``, every
    site of ``targets`` (``sites``, sorted) gated towards its target value."""

    model: GnaModel
    batch: Any
    base: Plan
    targets: dict[Site, Tensor]
    sites: list[Site]
    cuts: list[slice]
    keep: Any  # the positions the metric reads
    on_clean: Callable[[dict[Site, Tensor]], None] | None

    def ungated(self, metric: Metric) -> float:
        """The metric of the ungated run (a plain forward, chunked as the gated ones)."""
        batch, base, n = self.batch, self.base, self.batch.n_rows
        if len(self.cuts) == 1:
            logits = self.model.run_plan(batch, base, logits_to_keep=self.keep, prefix=False).logits
        else:
            logits = torch.cat(
                [self.model.run_plan(batch.rows(c), base.rows(n, c), logits_to_keep=self.keep, prefix=False).logits for c in self.cuts]
            )
        return reduce_metric(metric(logits), metric, n)

    def run(self, c: slice, alpha: float, grad: bool, capture: Collection[Site] = ()) -> tuple[Tensor, dict[Site, Tensor]]:
        """Chunk ``c``'s logits at ``alpha`` and its gates (leaves when ``grad``); ``capture``
        handed to ``on_clean``, detached."""
        batch, base, n = self.batch, self.base, self.batch.n_rows
        gates = {site: torch.full(_gate_shape(self.model, site, batch.n_pos), alpha, requires_grad=grad) for site in self.sites}
        whole = len(self.cuts) == 1
        if whole:
            plan = Plan(start=base.start)
            plan.extend(base)
        else:
            plan = base.rows(n, c)
        for site in self.sites:
            target = self.targets[site]
            if not whole and target.dim() > 0 and target.shape[0] == n:
                target = target[c]
            plan.add(site, Edit(gates[site], target))
        out = self.model.run_plan(batch if whole else batch.rows(c), plan, grad=grad, logits_to_keep=self.keep, capture=capture)
        if capture and self.on_clean is not None:
            self.on_clean({site: act.detach() for site, act in out.acts.items()})
        return out.logits, gates


def _add_point(
    path: _GatePath,
    metric: Metric,
    alpha: float,
    steps: int,
    effects: dict[Site, Tensor],
    clean_capture: Collection[Site],
    measure: bool,
    bar: Any,
) -> float | None:
    """One point of the sum: ``dm/dw(alpha) / steps`` added to ``effects``, chunk by chunk
    (every row's logits at ``alpha`` held while one chunk's backward runs). Returns the
    metric at ``alpha`` where ``measure``, else None."""
    model, cuts = path.model, path.cuts
    measured: float | None = None
    held: Tensor | None = None
    if len(cuts) > 1:
        with torch.no_grad():
            held = torch.cat([path.run(c, alpha, False)[0] for c in cuts])
        if measure:
            measured = float(_scalar(metric(held), metric, need_grad=False))
    for c in cuts:
        clean_run = alpha == 0 and len(cuts) == 1 and path.on_clean is not None
        logits, gates = path.run(c, alpha, True, clean_capture if clean_run else ())
        if held is not None:
            logits = torch.cat([held[: c.start], logits, held[c.stop :]])
        value = _scalar(metric(logits), metric)
        if measure and measured is None:
            measured = float(value.detach())
        grads = _gradients(value, [gates[site] for site in path.sites])
        charge(model.backend, backwards=1, backward_block_rows=(c.stop - c.start) * (model.n_layers - path.base.start_layer))
        for site, grad in zip(path.sites, grads, strict=True):
            effects[site] += grad.detach()[0, ..., 0].float().cpu() / steps
        del logits, value  # free this chunk's graph before the next forward: one graph at a time
        bar.update(1)
    return measured


def _gate_shape(model: GnaModel, site: Site, n_pos: int) -> tuple[int, ...]:
    """One gate weight per position and head: ``[1, pos, head, 1]`` (head site) or ``[1, pos, 1]`` (residual)."""
    if site.kind is SiteKind.RESID:
        return (1, n_pos, 1)
    return (1, n_pos, model.layout.site_shape(site)[0], 1)


def _scalar(value: Tensor | float, metric: Metric, need_grad: bool = True) -> Tensor:
    """The metric's value averaged to a scalar tensor that gradients flow from."""
    name = metric_name(metric)
    if not isinstance(value, Tensor):
        raise GnaTypeError(
            f"metric {name} returned {value!r}: attribution patching needs a metric that returns a tensor computed "
            f"from the logits (a scalar, or one value per row), got {type(value).__name__}"
        )
    if value.numel() == 0:
        raise GnaValueError(f"metric {name} returned an empty tensor: expected a scalar, or one value per row")
    if need_grad and not value.requires_grad:
        raise GnaValueError(
            f"metric {name}'s value does not depend differentiably on the logits (e.g. an argmax or a comparison): "
            "attribution patching needs a differentiable metric such as logit_diff or target_logprob"
        )
    return value.float().mean()


def _gradients(value: Tensor, acts: list[Tensor]) -> list[Tensor]:
    """``d value / d act`` for each act; zero where the metric does not depend on it (a
    skipped or truncated layer)."""
    grads = torch.autograd.grad(value, acts, allow_unused=True)
    return [torch.zeros_like(act) if grad is None else grad for act, grad in zip(acts, grads, strict=True)]


def _result(
    model: GnaModel,
    sites: str,
    heads: Sequence[Head],
    effects: dict[Site, Tensor],
    baseline: float,
    reference: float,
    n_pos: int,
    by_position: bool,
    direction: str,
) -> SweepResult:
    """Scatter the per-site effects into a NaN table of scores (baseline + effect)."""
    pos_axis: tuple[int, ...] = (n_pos,) if by_position else ()
    dims: tuple[str, ...]
    if sites == "heads":
        scores = torch.full((model.n_layers, model.n_heads, *pos_axis), float("nan"))
        for head in heads:
            site, index = model.head_site(head)
            effect = effects[site].detach().float().cpu()
            scores[head.layer, head.head] = baseline + (effect[:, index] if by_position else effect[index])
        dims = ("layer", "head")
    else:
        scores = torch.stack([baseline + effects[Site(SiteKind.RESID, layer)].detach().float().cpu() for layer in range(model.n_layers)])
        dims = ("layer",)
    dims = (*dims, "pos") if by_position else dims
    meta = {"direction": direction, "sites": sites, "by_position": by_position, "method": "attribution"}
    return SweepResult(scores, dims, baseline, reference=reference, kind="attribution", meta=meta)
