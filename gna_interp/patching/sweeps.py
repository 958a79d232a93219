"""Ablation and activation-patching sweeps over every head (or residual site).

**Activation patching** runs the model on one input and replaces an activation with
its value on another, measuring how much of the behaviour that one activation
carries. With ``direction="denoise"`` (TransformerLens's convention) the model runs
on ``corrupt`` and each site gets its ``clean`` value: a high score means the site
alone restores the clean behaviour. With ``direction="noise"`` the model runs on
``clean`` and each site gets its ``corrupt`` value: a drop means the site is needed.

**Ablation** replaces a head's output with zero (the paper's method), its mean over
the ``corrupt`` inputs, or its value on them (resampled).

Every variant is one copy of the batch in a stacked forward (see
`gna_interp.patching.variants`), so a sweep costs ``n_variants / k`` forwards for
``k`` copies per forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from ..core.compile import ablation_values, head_mask, heads_by_site
from ..core.heads import Head
from ..core.interventions import Intervention, as_interventions
from ..core.keywords import corrupt_before_metric, renamed, suggest_keywords
from ..core.plan import Edit, Site, SiteKind
from ..models.handle import check_model
from .checks import check_ablation, check_sites, head_list, target_and_source
from .metrics import Metric, check_metric, logits_read, reduce_metric
from .results import SweepResult
from .variants import Variant, score_table

if TYPE_CHECKING:
    from ..models.handle import GnaModel


@corrupt_before_metric
@renamed(max_rows="batch_size")
@suggest_keywords
def ablation_sweep(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    *,
    heads: Head | Sequence[Head] | None = None,
    how: str = "zero",
    interventions: Intervention | Sequence[Intervention] = (),
    batch_size: int | None = None,
    memory_budget_mb: float | None = None,
    progress: bool = True,
) -> SweepResult:
    """The metric with each head ablated alone.

    Args:
        model: a `GnaModel`.
        clean: the inputs measured (prompts, token ids or a task).
        corrupt: the inputs ``how="mean"`` averages over and ``"resample"`` reads (``None``
            for ``"zero"``); positional, as in every sweep.
        metric: logits ``[batch, pos, vocab]`` -> scalar or ``[batch]``.
        heads: heads to sweep: a list of `Head`, or one `Head` (default: every head).
        how: ``"zero"``, ``"mean"`` or ``"resample"`` (see `gna_interp.Ablate`).
        interventions: applied to every run, the baseline included (e.g. ``Truncate``).
        batch_size: rows per stacked forward (default: estimated from ``memory_budget_mb``).
        memory_budget_mb: the memory a stacked forward may use, to estimate ``batch_size``.
        progress: show a progress bar.

    Returns:
        `SweepResult` with ``scores`` ``[layer, head]`` (NaN for heads not swept, and for
        heads a layer does not have: ``head`` runs to ``model.n_heads``, the most heads
        any layer has) and ``baseline`` the metric with no head ablated.
    """
    check_model(model, "ablation_sweep")
    check_metric(metric, "ablation_sweep", clean=clean)
    check_ablation(how, corrupt)
    heads = head_list(model, heads)
    grouped = heads_by_site(model.layout, heads)
    batch = model.to_batch(clean)
    base = model.compile_plan(batch, [*model.active_interventions, *as_interventions(interventions)])
    values = ablation_values(batch, sorted(grouped), how, corrupt, model.capture_sites)
    variants = []
    for head in heads:
        site, index = model.head_site(head)
        variants.append(Variant([(site, Edit(head_mask(model.layout, site, [index]), values[site]))]))
    cells = [(head.layer, head.head) for head in heads]
    chunking = dict(batch_size=batch_size, memory_budget_mb=memory_budget_mb, progress=progress, desc=f"ablation ({how})")
    baseline, scores = score_table(model, batch, base, variants, cells, (model.n_layers, model.n_heads), metric, **chunking)
    return SweepResult(scores, ("layer", "head"), baseline, kind="ablation", meta={"how": how, "n_prompts": batch.n_rows})


@renamed(max_rows="batch_size")
@suggest_keywords
def patching_sweep(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    *,
    sites: Literal["heads", "resid"] = "heads",
    by_position: bool = False,
    direction: Literal["denoise", "noise"] = "denoise",
    heads: Head | Sequence[Head] | None = None,
    interventions: Intervention | Sequence[Intervention] = (),
    batch_size: int | None = None,
    memory_budget_mb: float | None = None,
    progress: bool = True,
) -> SweepResult:
    """Activation patching of every head output or residual-stream site.

    Args:
        model: a `GnaModel`.
        clean: inputs of the clean run.
        corrupt: inputs of the corrupted run: the same token length as ``clean`` (and rows, or one row).
        metric: logits ``[batch, pos, vocab]`` -> scalar or ``[batch]``.
        sites: ``"heads"`` (head outputs) or ``"resid"`` (residual stream entering each block).
        by_position: patch one position at a time.
        direction: ``"denoise"``: run ``corrupt``, patch in ``clean`` values (TransformerLens's
            convention); ``"noise"``: run ``clean``, patch in ``corrupt`` values.
        heads: heads to sweep: a list of `Head`, or one `Head` (default every head; ``sites="heads"`` only).
        interventions: applied to every run (e.g. ``Truncate``), on top of active contexts.
        batch_size: rows per stacked forward (default: estimated from ``memory_budget_mb``).
        memory_budget_mb: the memory a stacked forward may use, to estimate ``batch_size``.
        progress: show a progress bar.

    Returns:
        `SweepResult`: ``scores`` ``[layer, head]``, ``[layer, head, pos]``, ``[layer, pos]`` or
        ``[layer]``; ``baseline`` is the unpatched run, ``reference`` the run on the value source.
    """
    check_model(model, "patching_sweep")
    check_metric(metric, "patching_sweep", clean=clean, corrupt=corrupt)
    check_sites(sites, heads, "patch")
    target, source = target_and_source(model, clean, corrupt, direction, "patching", " (by_position=True)" if by_position else "")
    ambient = [*model.active_interventions, *as_interventions(interventions)]
    base = model.compile_plan(target, ambient)
    source_base = model.compile_plan(source, ambient)
    if sites == "heads":
        chosen = head_list(model, heads)
        layer_sites = set(heads_by_site(model.layout, chosen))
    else:
        layer_sites = {Site(SiteKind.RESID, layer) for layer in range(model.n_layers)}
    source_out = model.run_plan(source, source_base, capture=layer_sites, logits_to_keep=logits_read(metric), prefix=False)
    reference = reduce_metric(metric(source_out.logits), metric, source.n_rows)
    source_acts = source_out.acts
    del source_out  # its logits are read: not held through the sweep's forwards
    n_pos = target.n_pos
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    if sites == "heads":
        variants, cells = _head_variants(model, chosen, source_acts, n_pos, by_position)
        shape, dims = (model.n_layers, model.n_heads), ("layer", "head")
    else:
        variants, cells = _resid_variants(model, source_acts, n_pos, by_position)
        shape, dims = (model.n_layers,), ("layer",)
    if by_position:
        shape, dims = (*shape, n_pos), (*dims, "pos")
    chunking = dict(batch_size=batch_size, memory_budget_mb=memory_budget_mb, progress=progress, desc=f"patching ({sites})")
    baseline, scores = score_table(model, target, base, variants, cells, shape, metric, **chunking)
    meta = {"direction": direction, "sites": sites, "by_position": by_position}
    return SweepResult(scores, dims, baseline, reference=reference, kind="patching", meta=meta)


def _position_masks(n_pos: int, by_position: bool) -> list[tuple[tuple[int, ...], Tensor]]:
    """``(index suffix, [1, pos] mask)`` for each patched position set."""
    if not by_position:
        return [((), torch.ones(1, n_pos, dtype=torch.bool))]
    return [((pos,), torch.arange(n_pos)[None] == pos) for pos in range(n_pos)]


def _head_variants(
    model: GnaModel, heads: Sequence[Head], acts: dict[Site, Tensor], n_pos: int, by_position: bool
) -> tuple[list[Variant], list[tuple[int, ...]]]:
    variants, cells = [], []
    for suffix, pos_mask in _position_masks(n_pos, by_position):
        for head in heads:
            site, index = model.head_site(head)
            mask = pos_mask[:, :, None, None] & head_mask(model.layout, site, [index])
            variants.append(Variant([(site, Edit(mask, acts[site]))]))
            cells.append((head.layer, head.head, *suffix))
    return variants, cells


def _resid_variants(
    model: GnaModel, acts: dict[Site, Tensor], n_pos: int, by_position: bool
) -> tuple[list[Variant], list[tuple[int, ...]]]:
    variants, cells = [], []
    for suffix, pos_mask in _position_masks(n_pos, by_position):
        for layer in range(model.n_layers):
            site = Site(SiteKind.RESID, layer)
            variants.append(Variant([(site, Edit(pos_mask[:, :, None], acts[site]))]))
            cells.append((layer, *suffix))
    return variants, cells
