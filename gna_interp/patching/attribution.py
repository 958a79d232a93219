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

Directions follow `patching_sweep`: ``"denoise"`` (default) runs ``corrupt`` and
estimates patching in ``clean`` values; ``"noise"`` runs ``clean`` and estimates patching
in ``corrupt`` values. The result is a `SweepResult` whose ``scores`` are the baseline
plus the estimated effect, so ``effects()``, ``top()``, ``normalized()`` and
``to_frame()`` read the same as for activation patching.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from ..core.compile import heads_by_site
from ..core.heads import Head
from ..core.interventions import Intervention
from ..core.plan import Site, SiteKind
from ..cost import charge
from .checks import check_local, check_sites, head_list, target_and_source
from .metrics import Metric, check_metric, metric_name, reduce_metric
from .results import SweepResult

if TYPE_CHECKING:
    from ..models.handle import GnaModel


def attribution_patching(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    sites: Literal["heads", "resid"] = "heads",
    by_position: bool = False,
    *,
    direction: Literal["denoise", "noise"] = "denoise",
    heads: Sequence[Head] | None = None,
    interventions: Sequence[Intervention] = (),
) -> SweepResult:
    """First-order estimate of `patching_sweep` for every head (or residual site).

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

    Returns:
        `SweepResult` of kind ``"attribution"``: ``scores`` = baseline + estimated effect,
        ``[layer, head]``, ``[layer, head, pos]``, ``[layer]`` or ``[layer, pos]``;
        ``baseline`` the metric of the run, ``reference`` that of the value source.
    """
    check_metric(metric)
    check_sites(sites, heads, "score")
    check_local(model, "attribution_patching")
    target, source = target_and_source(model, clean, corrupt, direction, "attribution patching (an estimate of patching)")
    chosen = head_list(model, heads) if sites == "heads" else []
    if sites == "heads":
        site_list = sorted(heads_by_site(model.layout, chosen))
    else:
        site_list = [Site(SiteKind.RESID, layer) for layer in range(model.n_layers)]
    ambient = [*model.active_interventions, *interventions]
    source_out = model.backend.run(source, model.compile_plan(source, ambient), capture=set(site_list))
    reference = reduce_metric(metric(source_out.logits), metric)
    target_out = model.backend.run(target, model.compile_plan(target, ambient), capture=set(site_list), grad=True)
    value = _scalar(metric(target_out.logits), metric)
    grads = _gradients(value, [target_out.acts[site] for site in site_list])
    baseline = float(value.detach())
    effects = {}
    for site, grad in zip(site_list, grads, strict=True):
        delta = source_out.acts[site].to(grad.dtype) - target_out.acts[site].detach()
        per_token = (delta * grad).sum(-1)  # heads: [batch, pos, head]; resid: [batch, pos]
        effects[site] = per_token.sum(0) if by_position else per_token.sum((0, 1))
    return _result(model, sites, chosen, effects, baseline, reference, target.n_pos, by_position, direction)


def ablation_attribution(
    model: GnaModel,
    inputs: Any,
    metric: Metric,
    heads: Sequence[Head] | None = None,
    *,
    interventions: Sequence[Intervention] = (),
) -> SweepResult:
    """First-order estimate of `ablation_sweep` (zero ablation) for every head at once.

    Zero-ablating a head replaces its output ``a`` by 0, so to first order the metric
    moves by ``(0 - a) . dm/da``: one forward and one backward give every head's estimate.
    Exact where the metric is linear in the head's output (a test builds such a model);
    elsewhere an estimate, used by `discover` to choose which heads to ablate one by one.

    Args:
        model: a `GnaModel` with local weights.
        inputs: prompts or token ids.
        metric: logits -> scalar or ``[batch]`` tensor, differentiable (``candidate_logprob``,
            ``logit_diff``; not ``candidate_accuracy``). Averaged over the rows.
        heads: heads to score (default every head).
        interventions: applied to every row, on top of active contexts.

    Returns:
        `SweepResult` of kind ``"attribution"``: ``scores`` ``[layer, head]`` = baseline +
        estimated effect (NaN for heads not scored), ``baseline`` the metric.
    """
    check_local(model, "ablation_attribution")
    chosen = head_list(model, heads)
    batch = model.to_batch(inputs)
    site_list = sorted(heads_by_site(model.layout, chosen))
    ambient = [*model.active_interventions, *interventions]
    out = model.backend.run(batch, model.compile_plan(batch, ambient), capture=set(site_list), grad=True)
    value = _scalar(metric(out.logits), metric)
    grads = _gradients(value, [out.acts[site] for site in site_list])
    charge(model.backend, backwards=1, backward_block_rows=batch.n_rows * model.n_layers)
    total = float(value.detach())
    effects = {site: (-out.acts[site].detach() * grad).sum((0, 1, 3)).float().cpu() for site, grad in zip(site_list, grads, strict=True)}
    scores = torch.full((model.n_layers, model.n_heads), float("nan"))
    for head in chosen:
        site, index = model.head_site(head)
        scores[head.layer, head.head] = total + effects[site][index]  # effects: [head] of the site
    meta = {"how": "zero", "method": "attribution", "n_prompts": batch.n_rows}
    return SweepResult(scores, ("layer", "head"), total, kind="attribution", meta=meta)


def _scalar(value: Tensor | float, metric: Metric) -> Tensor:
    """The metric's value averaged to a scalar tensor that gradients flow from."""
    name = metric_name(metric)
    if not isinstance(value, Tensor):
        raise TypeError(
            f"metric {name} returned {value!r}: attribution patching needs a metric that returns a tensor computed "
            f"from the logits (a scalar, or one value per row), got {type(value).__name__}"
        )
    if value.numel() == 0:
        raise ValueError(f"metric {name} returned an empty tensor: expected a scalar, or one value per row")
    if not value.requires_grad:
        raise ValueError(
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
