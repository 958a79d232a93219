"""Turning intervention descriptions into a `Plan` of tensor edits for one batch.

Activations that an intervention needs (means, resample values, patch sources) come
from one plain forward over its reference / source inputs, with no interventions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.heads import Head, Resid
from ..core.interventions import Ablate, Intervention, Patch, Positions, SkipLayers, Truncate
from ..core.plan import Edit, Plan, Site, SiteKind
from ..models.inputs import Batch

if TYPE_CHECKING:
    from ..models.handle import GnaModel


def compile_plan(model: GnaModel, batch: Batch, interventions: Sequence[Intervention]) -> Plan:
    plan = Plan()
    for item in interventions:
        if isinstance(item, Ablate):
            _compile_ablate(model, batch, item, plan)
        elif isinstance(item, Patch):
            _compile_patch(model, batch, item, plan)
        elif isinstance(item, SkipLayers):
            for layer in item.layers:
                model.check_layer(layer)
                plan.add_skip(layer, torch.ones(1, dtype=torch.bool))
        elif isinstance(item, Truncate):
            if item.n_layers > model.n_layers:
                raise ValueError(f"Truncate({item.n_layers}) exceeds the model's {model.n_layers} layers")
            for layer in range(item.n_layers, model.n_layers):
                plan.add_skip(layer, torch.ones(1, dtype=torch.bool))
        else:
            raise TypeError(f"expected an intervention (Ablate, Patch, SkipLayers, Truncate), got {item!r}")
    return plan


def heads_by_layer(model: GnaModel, heads: Sequence[Head]) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = defaultdict(list)
    for head in heads:
        model.check_head(head)
        grouped[head.layer].append(head.head)
    return dict(grouped)


def head_mask(model: GnaModel, head_indices: Sequence[int]) -> Tensor:
    """``[1, 1, head, 1]`` bool, True on the given heads."""
    mask = torch.zeros(1, 1, model.n_heads, 1, dtype=torch.bool)
    mask[0, 0, list(head_indices), 0] = True
    return mask


def capture_sites(model: GnaModel, inputs: Any, sites: set[Site]) -> tuple[Batch, dict[Site, Tensor]]:
    """One forward with no interventions, returning the activations at ``sites``."""
    batch = model.to_batch(inputs)
    out = model.backend.run(batch, Plan(), capture=sites)
    return batch, out.acts


def token_mean(act: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over every non-padding token: ``[batch, pos, ...] -> [...]``."""
    weights = attention_mask.to(act.dtype).view(*attention_mask.shape, *([1] * (act.dim() - 2)))
    return (act * weights).sum(dim=(0, 1)) / weights.sum()


def check_aligned(batch: Batch, other: Batch, what: str) -> None:
    if other.n_pos != batch.n_pos:
        raise ValueError(
            f"{what} tokenizes to {other.n_pos} positions but the inputs to {batch.n_pos}: "
            "activations are replaced position by position, so both must have the same length"
        )
    if other.n_rows not in (1, batch.n_rows):
        raise ValueError(f"{what} has {other.n_rows} rows but the inputs have {batch.n_rows}: expected {batch.n_rows} or 1")


def clean_corrupt_batches(model: GnaModel, clean: Any, corrupt: Any, what: str, detail: str = "") -> tuple[Batch, Batch]:
    """Tokenize a clean / corrupt pair and check they can be patched into each other.

    Args:
        what: the method, for the error (``"patching"``, ``"path patching"``...).
        detail: appended to the error's first clause (e.g. the option that matters).
    """
    clean_batch, corrupt_batch = model.to_batch(clean), model.to_batch(corrupt)
    if clean_batch.n_pos != corrupt_batch.n_pos:
        raise ValueError(
            f"clean has {clean_batch.n_pos} token positions and corrupt has {corrupt_batch.n_pos}{detail}: {what} "
            "replaces activations position by position, so both must tokenize to the same length"
        )
    check_aligned(clean_batch, corrupt_batch, "corrupt")
    return clean_batch, corrupt_batch


def ablation_values(model: GnaModel, batch: Batch, layers: Sequence[int], how: str, reference: Any) -> dict[int, Tensor]:
    """Per layer, the replacement for its heads: ``[]`` zero, ``[1, 1, head, d_head]``
    mean, or ``[batch | 1, pos, head, d_head]`` resample."""
    if how == "zero":
        return {layer: torch.zeros(()) for layer in layers}
    ref_batch, acts = capture_sites(model, reference, {Site(SiteKind.HEADS, layer) for layer in layers})
    if how == "mean":
        return {layer: token_mean(acts[Site(SiteKind.HEADS, layer)], ref_batch.attention_mask)[None, None] for layer in layers}
    check_aligned(batch, ref_batch, "resample reference")
    return {layer: acts[Site(SiteKind.HEADS, layer)] for layer in layers}


def _compile_ablate(model: GnaModel, batch: Batch, item: Ablate, plan: Plan) -> None:
    grouped = heads_by_layer(model, item.heads)
    values = ablation_values(model, batch, sorted(grouped), item.how, item.reference)
    for layer, indices in grouped.items():
        plan.add(Site(SiteKind.HEADS, layer), Edit(head_mask(model, indices), values[layer]))


def position_mask(positions: Positions, batch: Batch) -> Tensor:
    """``[batch | 1, pos]`` bool mask from a `Positions` value."""
    n_pos = batch.n_pos
    if positions is None:
        return torch.ones(1, n_pos, dtype=torch.bool)
    if isinstance(positions, Tensor) and positions.dtype == torch.bool:
        if tuple(positions.shape) != (batch.n_rows, n_pos):
            raise ValueError(f"positions mask has shape {tuple(positions.shape)}, expected {(batch.n_rows, n_pos)}")
        return positions
    if isinstance(positions, Tensor) and positions.dim() == 1:
        if positions.numel() != batch.n_rows:
            raise ValueError(f"positions is a 1-D tensor of {positions.numel()} entries: expected one position per row ({batch.n_rows})")
        _check_positions(positions.tolist(), n_pos)
        mask = torch.zeros(batch.n_rows, n_pos, dtype=torch.bool)
        mask[torch.arange(batch.n_rows), positions.long() % n_pos] = True
        return mask
    items = [positions] if isinstance(positions, int) else [int(p) for p in torch.as_tensor(positions).flatten().tolist()]
    _check_positions(items, n_pos)
    mask = torch.zeros(1, n_pos, dtype=torch.bool)
    mask[0, [p % n_pos for p in items]] = True
    return mask


def _check_positions(items: list[int], n_pos: int) -> None:
    for p in items:
        if not -n_pos <= p < n_pos:
            raise ValueError(f"position {p} out of range for {n_pos} positions: expected {-n_pos}..{n_pos - 1}")


def site_mask(model: GnaModel, target: Head | Resid, positions: Tensor) -> Tensor:
    """Mask for one target at ``positions`` (``[batch | 1, pos]``), shaped for its site."""
    if isinstance(target, Head):
        return positions[:, :, None, None] & head_mask(model, [target.head])
    return positions[:, :, None]


def _compile_patch(model: GnaModel, batch: Batch, item: Patch, plan: Plan) -> None:
    sites = {model.site_of(t) for t in item.targets}
    source_batch, acts = capture_sites(model, item.source, sites)
    check_aligned(batch, source_batch, "patch source")
    positions = position_mask(item.positions, batch)
    for target in item.targets:
        site = model.site_of(target)
        plan.add(site, Edit(site_mask(model, target, positions), acts[site]))
