"""Turning intervention descriptions into a `Plan` of tensor edits for one batch.

The compiler needs the model's layout (`ModelLayout`: layers, heads, sites), never the
layout. Activations an intervention needs from other inputs (means, resample values,
patch sources) are asked of ``sources``: whoever owns the backend runs one plain forward
over those inputs (`GnaModel.capture_sites`) and hands back the batch and the activations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch import Tensor

from .arch import LayerKind
from .errors import GnaTypeError, GnaValueError
from .heads import Head, Resid
from .inputs import Batch
from .interventions import Ablate, Intervention, KeepOnly, MaskAttentionRows, Patch, Positions, SkipLayers, Truncate
from .layout import ModelLayout
from .plan import Edit, Plan, Site

Sources = Callable[[Any, Collection[Site]], tuple[Batch, dict[Site, Tensor]]]
"""``sources(inputs, sites) -> (batch, {site: [batch, pos, ...]})``: one forward over
``inputs`` with no interventions, run by whoever owns the backend."""


def compile_plan(layout: ModelLayout, batch: Batch, interventions: Sequence[Intervention], sources: Sources) -> Plan:
    """The edits ``interventions`` make on ``batch`` (``[batch, pos]`` ids), for a model of layout ``layout``."""
    plan = Plan()
    for item in interventions:
        if isinstance(item, Ablate):
            _compile_ablate(layout, batch, item, plan, sources)
        elif isinstance(item, KeepOnly):
            others = ablated_by_keep_only(layout, item)
            if others:  # mean over the run's own inputs unless told otherwise (KeepOnly's default)
                corrupt = batch if item.corrupt is None else item.corrupt
                _compile_ablate(layout, batch, Ablate(others, how=item.how, corrupt=corrupt), plan, sources)
        elif isinstance(item, Patch):
            _compile_patch(layout, batch, item, plan, sources)
        elif isinstance(item, SkipLayers):
            for layer in item.layers:
                layout.check_layer(layer)
                plan.add_skip(layer, torch.ones(1, dtype=torch.bool))
        elif isinstance(item, Truncate):
            if item.n_layers > layout.n_layers:
                raise GnaValueError(f"Truncate({item.n_layers}) exceeds the model's {layout.n_layers} layers")
            for layer in range(item.n_layers, layout.n_layers):
                plan.add_skip(layer, torch.ones(1, dtype=torch.bool))
        elif isinstance(item, MaskAttentionRows):
            _compile_row_mask(layout, batch, item, plan)
        else:
            raise GnaTypeError(f"expected an intervention (Ablate, KeepOnly, Patch, SkipLayers, Truncate, MaskAttentionRows), got {item!r}")
    return plan


def heads_of_kind(layout: ModelLayout, kind: str) -> list[Head]:
    """Every head of ``kind`` (``"attention"``, ``"ssm"`` or ``"all"``), layer-major."""
    if kind == "all":
        return list(layout.heads)
    wanted = LayerKind(kind)
    return [head for head in layout.heads if layout.head_kind(head) is wanted]


def ablated_by_keep_only(layout: ModelLayout, item: KeepOnly) -> list[Head]:
    """The heads `KeepOnly` ablates: every head of its kind that it does not keep.
    A kept head of another kind (or one the model does not have) is an error."""
    of_kind = heads_of_kind(layout, item.kind)
    if not of_kind:
        raise GnaValueError(f"KeepOnly kind={item.kind!r}: {layout.name} has no {item.kind} heads")
    allowed = set(of_kind)
    for head in item.heads:
        layout.check_head(head)
        if head not in allowed:
            actual = layout.head_kind(head).value
            raise GnaValueError(f"KeepOnly heads: {head} is an {actual} head of {layout.name}, not of kind={item.kind!r}")
    kept = set(item.heads)
    return [head for head in of_kind if head not in kept]


def heads_by_site(layout: ModelLayout, heads: Sequence[Head]) -> dict[Site, list[int]]:
    """Heads grouped by their site (one per mixer of a layer), as indices into that
    site's ``head`` axis. Attention and SSM heads may be mixed freely."""
    grouped: dict[Site, list[int]] = defaultdict(list)
    for head in heads:
        site, index = layout.head_site(head)
        grouped[site].append(index)
    return dict(grouped)


def head_mask(layout: ModelLayout, site: Site, head_indices: Sequence[int]) -> Tensor:
    """``[1, 1, head, 1]`` bool over ``site``'s heads, True on the given ones."""
    mask = torch.zeros(1, 1, layout.site_shape(site)[0], 1, dtype=torch.bool)
    mask[0, 0, list(head_indices), 0] = True
    return mask


def token_mean(act: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over every non-padding token: ``[batch, pos, ...] -> [...]``."""
    weights = attention_mask.to(act.dtype).view(*attention_mask.shape, *([1] * (act.dim() - 2)))
    return (act * weights).sum(dim=(0, 1)) / weights.sum()


def check_aligned(batch: Batch, other: Batch, what: str) -> None:
    if other.n_pos != batch.n_pos:
        raise GnaValueError(
            f"{what} tokenizes to {other.n_pos} positions but the inputs to {batch.n_pos}: "
            "activations are replaced position by position, so both must have the same length"
        )
    if other.n_rows not in (1, batch.n_rows):
        raise GnaValueError(f"{what} has {other.n_rows} rows but the inputs have {batch.n_rows}: expected {batch.n_rows} or 1")


def ablation_values(batch: Batch, sites: Sequence[Site], how: str, corrupt: Any, sources: Sources) -> dict[Site, Tensor]:
    """Per head site, the replacement for its heads: ``[]`` zero, ``[1, 1, head, d_head]``
    mean, or ``[batch | 1, pos, head, d_head]`` resample (``corrupt``'s activations, from ``sources``)."""
    if how == "zero":
        return {site: torch.zeros(()) for site in sites}
    ref_batch, acts = sources(corrupt, set(sites))
    if how == "mean":
        return {site: token_mean(acts[site], ref_batch.attention_mask)[None, None] for site in sites}
    check_aligned(batch, ref_batch, "resample corrupt")
    return {site: acts[site] for site in sites}


def _compile_ablate(layout: ModelLayout, batch: Batch, item: Ablate, plan: Plan, sources: Sources) -> None:
    grouped = heads_by_site(layout, item.heads)
    values = ablation_values(batch, sorted(grouped), item.how, item.corrupt, sources)
    rows = None if item.positions is None else position_mask(item.positions, batch)[:, :, None, None]
    for site, indices in grouped.items():
        mask = head_mask(layout, site, indices) if rows is None else rows & head_mask(layout, site, indices)
        plan.add(site, Edit(mask, values[site]))


POSITION_FORMS = (
    "None, an int or a list of ints (the same positions in every row), a [rows] long tensor (one position per row), "
    "a [rows, k] long tensor (k positions per row) or a [rows, pos] bool mask"
)


def position_mask(positions: Positions, batch: Batch) -> Tensor:
    """``[batch | 1, pos]`` bool mask from a `Positions` value."""
    n_pos = batch.n_pos
    if positions is None:
        return torch.ones(1, n_pos, dtype=torch.bool)
    if isinstance(positions, Tensor) and positions.dtype == torch.bool:
        if tuple(positions.shape) != (batch.n_rows, n_pos):
            raise GnaValueError(f"positions mask has shape {tuple(positions.shape)}, expected {(batch.n_rows, n_pos)}")
        return positions
    if isinstance(positions, Tensor) and positions.dim() == 2 and not positions.dtype.is_floating_point:
        if positions.shape[0] != batch.n_rows:
            rows = positions.shape[0]
            raise GnaValueError(f"positions is a [rows, k] tensor with {rows} rows: expected one row per prompt ({batch.n_rows})")
        _check_positions(positions.flatten().tolist(), n_pos)
        return torch.zeros(batch.n_rows, n_pos, dtype=torch.bool).scatter_(1, positions.long() % n_pos, True)
    if isinstance(positions, Tensor) and (positions.dim() > 2 or positions.dtype.is_floating_point):
        raise GnaValueError(f"positions tensor of shape {tuple(positions.shape)} and dtype {positions.dtype}: expected {POSITION_FORMS}")
    if isinstance(positions, Tensor) and positions.dim() == 1:
        if positions.numel() != batch.n_rows:
            raise GnaValueError(f"positions is a 1-D tensor of {positions.numel()} entries: expected one position per row ({batch.n_rows})")
        _check_positions(positions.tolist(), n_pos)
        mask = torch.zeros(batch.n_rows, n_pos, dtype=torch.bool)
        mask[torch.arange(batch.n_rows), positions.long() % n_pos] = True
        return mask
    if isinstance(positions, bool) or not isinstance(positions, (int, list, tuple, range, Tensor)):
        raise GnaTypeError(f"positions={positions!r}: expected {POSITION_FORMS}")
    if isinstance(positions, Tensor):
        values = positions.flatten().tolist()  # 0-d: one position for every row
    else:
        values = [positions] if isinstance(positions, int) else list(positions)
    for p in values:
        if isinstance(p, bool) or not isinstance(p, int):
            raise GnaTypeError(f"position {p!r} in positions: expected ints ({POSITION_FORMS})")
    items = [int(p) for p in values]
    _check_positions(items, n_pos)
    mask = torch.zeros(1, n_pos, dtype=torch.bool)
    mask[0, [p % n_pos for p in items]] = True
    return mask


def _check_positions(items: list[int], n_pos: int) -> None:
    for p in items:
        if not -n_pos <= p < n_pos:
            raise GnaValueError(f"position {p} out of range for {n_pos} positions: expected {-n_pos}..{n_pos - 1}")


def site_mask(layout: ModelLayout, target: Head | Resid, positions: Tensor) -> Tensor:
    """Mask for one target at ``positions`` (``[batch | 1, pos]``), shaped for its site."""
    if isinstance(target, Head):
        site, index = layout.head_site(target)
        return positions[:, :, None, None] & head_mask(layout, site, [index])
    return positions[:, :, None]


def _compile_patch(layout: ModelLayout, batch: Batch, item: Patch, plan: Plan, sources: Sources) -> None:
    sites = {layout.site_of(t) for t in item.targets}
    source_batch, acts = sources(item.source, sites)
    check_aligned(batch, source_batch, "patch source")
    positions = position_mask(item.positions, batch)
    for target in item.targets:
        site = layout.site_of(target)
        plan.add(site, Edit(site_mask(layout, target, positions), acts[site]))


def attention_heads_of(layout: ModelLayout, layers: Sequence[int] | None = None) -> list[Head]:
    """The attention (softmax) heads of ``layers`` (default: every layer)."""
    chosen = range(layout.n_layers) if layers is None else layers
    return [head for head in layout.heads if head.layer in chosen and layout.head_kind(head) is LayerKind.ATTENTION]


def _compile_row_mask(layout: ModelLayout, batch: Batch, item: MaskAttentionRows, plan: Plan) -> None:
    """Zero rows of the attention weights == zero those heads' outputs at those rows."""
    attention = attention_heads_of(layout)
    if item.heads is not None:
        heads = list(item.heads)
        allowed = set(attention)
        for head in heads:
            layout.check_head(head)
            if head not in allowed:
                kind = layout.head_kind(head).value
                raise GnaValueError(f"MaskAttentionRows: {head} is not an attention head ({layout.name} layer {head.layer}: {kind})")
    else:
        if item.layers is not None and not item.layers:
            raise GnaValueError("MaskAttentionRows layers=[] is empty: give attention layers, or None for every attention layer")
        attention_layers = sorted({h.layer for h in attention})
        for layer in item.layers or ():
            layout.check_layer(layer)
            if layer in layout.foreign_layers:
                raise GnaValueError(
                    f"MaskAttentionRows: layer {layer} of {layout.name} holds a swapped-in {layout.foreign_layers[layer]} block "
                    "(swap_layers), whose attention the architecture table does not describe"
                )
            if layer not in attention_layers:
                kind = layout.layer_kinds[layer].value
                raise GnaValueError(
                    f"MaskAttentionRows: layer {layer} of {layout.name} is an {kind} layer with no attention weights; "
                    f"attention layers are {attention_layers}"
                )
        heads = attention if item.layers is None else [h for h in attention if h.layer in item.layers]
        if not heads:
            raise GnaValueError(f"MaskAttentionRows: {layout.name} has no attention layers (it is an SSM); use Ablate on its heads instead")
    rows = position_mask(item.positions, batch)  # [batch | 1, pos]
    rows = ~rows if item.keep else rows
    zero = torch.zeros(())
    for site, indices in heads_by_site(layout, heads).items():
        plan.add(site, Edit(rows[:, :, None, None] & head_mask(layout, site, indices), zero))
