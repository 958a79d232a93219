"""The one generic algorithm behind every sweep: many variants of a forward, stacked
on the batch axis and chunked by a memory budget.

A `Variant` is a small set of edits for one copy of the batch. ``run_variants`` puts
``k`` copies of the batch side by side, builds each site's mask and value for the
whole stack (variant ``i`` owns rows ``i * n_rows .. (i + 1) * n_rows``), runs one
forward per chunk, and scores each copy with the metric.

Prefix reuse: every block before the first one a variant touches computes exactly what
the baseline run computed. So variants are sorted by that first layer, and each chunk
starts at its earliest one from the baseline's residual stream there
(``Plan.start``); earlier blocks are not run again. The baseline run is the one
forward every sweep needs anyway. Variants that also edit their early blocks alike
branch where they part (`shared_prefix`): one runs from its first block and captures
the stream there, the others start from it. On a remote nnsight model the baseline and every chunk
go in one session request, the prefix captured and used on the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..backends.jobs import Job
from ..core.dims import AttentionDims, Mamba1Dims, Mamba2Dims
from ..core.errors import GnaValueError
from ..core.inputs import Batch
from ..core.plan import Edit, Plan, Ref, Site, SiteKind
from ..models.jobs import is_batched_remote, run_jobs
from ..progress import progress_bar
from .metrics import Metric, logits_read, reduce_metric
from .shared_prefix import shared_prefix_groups

if TYPE_CHECKING:
    from ..models.handle import GnaModel

DEFAULT_MEMORY_BUDGET_MB = 256.0  # CPU runs were slower per row at 2,048-row chunks than at ~512


@dataclass
class Variant:
    edits: list[tuple[Site, Edit]] = field(default_factory=list)
    """Masks and values broadcastable to ``[n_rows, pos, *site_shape]``."""
    skip_layers: tuple[int, ...] = ()

    @property
    def first_layer(self) -> int:
        """The earliest block whose computation this variant changes."""
        return min([site.layer for site, _ in self.edits] + list(self.skip_layers))


def rows_per_forward(model: GnaModel, n_pos: int, batch_size: int | None, memory_budget_mb: float | None) -> int:
    """How many rows one forward may hold. The estimate counts the logits and a few
    residual-width activations per layer for every position (float32); a budget the caller
    gives also counts the largest mixer's per-position intermediates (`_mixer_floats`: a
    PyTorch scan's discretized states, eager attention's scores), so that it is honoured on
    SSMs too (measured: benchmarks/real_shape.py). The default budget's estimate leaves them
    out: it sets throughput (chunk sizes), not a limit. One copy of the batch runs however
    small the budget."""
    if batch_size is not None:
        if batch_size < 1:
            raise GnaValueError(f"batch_size={batch_size} must be >= 1")
        return batch_size
    budget = DEFAULT_MEMORY_BUDGET_MB if memory_budget_mb is None else memory_budget_mb
    if budget <= 0:
        raise GnaValueError(f"memory_budget_mb={budget} must be > 0")
    per_position = model.vocab_size + 8 * model.d_model * (model.n_layers + 1)
    if memory_budget_mb is not None:
        per_position += max((_mixer_floats(mixer.dims, n_pos) for spec in model.layer_specs for mixer in spec.mixers), default=0)
    return max(1, int(budget * 2**20 // (4 * n_pos * per_position)))


def _mixer_floats(dims: Any, n_pos: int) -> int:
    """Float32 intermediates per row and position of one mixer's forward on the PyTorch
    path: Mamba-1's discretized ``A`` and ``B u`` and their scan (``[channels, state]`` each,
    about 4), Mamba-2's states (``[inner, state]``), attention's scores and pattern
    (``[heads, key]`` each); 0 for others."""
    if isinstance(dims, Mamba1Dims):
        return 4 * dims.channels * dims.state
    if isinstance(dims, Mamba2Dims):
        return dims.inner * dims.state
    if isinstance(dims, AttentionDims):
        return 2 * dims.heads * n_pos
    return 0


def run_variants(
    model: GnaModel,
    batch: Batch,
    base: Plan,
    variants: Sequence[Variant],
    metric: Metric,
    *,
    batch_size: int | None = None,
    memory_budget_mb: float | None = None,
    progress: bool = True,
    desc: str = "variants",
    reuse_prefix: bool = True,
) -> tuple[float, Tensor]:
    """The baseline metric (``base`` alone) and ``[n_variants]`` metric of each variant
    (both averaged over the rows)."""
    per_chunk = max(1, rows_per_forward(model, batch.n_pos, batch_size, memory_budget_mb) // batch.n_rows)
    order = sorted(range(len(variants)), key=lambda i: variants[i].first_layer) if reuse_prefix else list(range(len(variants)))
    starts = {variants[i].first_layer for i in order} if reuse_prefix and base.start is None else set()
    prefix_sites = {Site(SiteKind.RESID, layer) for layer in starts if 0 < layer < model.n_layers}
    if is_batched_remote(model):
        chunks = [order[offset : offset + per_chunk] for offset in range(0, len(order), per_chunk)]
        return _run_remote(model, batch, base, variants, chunks, prefix_sites, metric)
    keep = logits_read(metric)  # the positions the metric reads: logits computed there alone
    groups = shared_prefix_groups(variants, model.n_layers) if reuse_prefix and base.start is None else []
    led = {group.leader: group for group in groups}
    members = {i for group in groups for i in group.members}
    order = [i for i in order if i not in members]  # they run after their leader, from its residual
    chunks = [order[offset : offset + per_chunk] for offset in range(0, len(order), per_chunk)]
    base_out = model.run_plan(batch, base, capture=prefix_sites, logits_to_keep=keep)  # from an open prefix cache, if any
    baseline = reduce_metric(metric(base_out.logits), metric, batch.n_rows)
    prefix = base_out.acts
    del base_out  # its logits are read: not held through the chunks' forwards
    scores = torch.empty(len(variants))

    def run(indices: list[int], plan: Plan, start: tuple[int, Tensor] | None, capture: set[Site]) -> dict[Site, Tensor]:
        if start is not None:
            plan.start = (start[0], start[1].repeat(len(indices), 1, 1))
        out = model.run_plan(batch.repeat(len(indices)), plan, capture=capture, logits_to_keep=keep, prefix=False)
        for i, rows in zip(indices, out.logits.split(batch.n_rows), strict=True):
            scores[i] = reduce_metric(metric(rows), metric, batch.n_rows)
        return out.acts

    with progress_bar(total=len(variants), show=progress, desc=desc) as bar:
        for indices in chunks:
            chunk = [variants[i] for i in indices]
            start = Site(SiteKind.RESID, chunk[0].first_layer)
            branches = {Site(SiteKind.RESID, led[i].layer) for i in indices if i in led}
            acts = run(
                indices, stacked_plan(model, batch, base, chunk), (start.layer, prefix[start]) if start in prefix else None, branches
            )
            bar.update(len(chunk))
            for copy, i in enumerate(indices):  # members start where they part from their leader
                if i in led:
                    group = led[i]
                    resid = acts[Site(SiteKind.RESID, group.layer)][copy * batch.n_rows : (copy + 1) * batch.n_rows]
                    for offset in range(0, len(group.members), per_chunk):
                        part = group.members[offset : offset + per_chunk]
                        trimmed = [_from_layer(variants[m], group.layer) for m in part]
                        run(part, stacked_plan(model, batch, base, trimmed), (group.layer, resid), set())
                        bar.update(len(part))
            del acts  # freed before the next chunk's forward, not after it
    return baseline, scores


def _from_layer(variant: Variant, layer: int) -> Variant:
    """``variant``'s edits and skips at block ``layer`` and after (a run starting there)."""
    return Variant(
        [(site, edit) for site, edit in variant.edits if site.layer >= layer], tuple(s for s in variant.skip_layers if s >= layer)
    )


def _run_remote(
    model: GnaModel, batch: Batch, base: Plan, variants: Sequence[Variant], chunks: list[list[int]], prefix_sites: set[Site], metric: Metric
) -> tuple[float, Tensor]:
    """The same forwards as `run_variants` as jobs of one request (`gna_interp.models.jobs`):
    the baseline captures the prefix on the server, each chunk starts from it there."""
    final_only = logits_read(metric) == 1  # the metric reads the last position alone
    jobs = [Job(batch, base, frozenset(prefix_sites), keep=2 if final_only else 1)]
    for indices in chunks:
        chunk = [variants[i] for i in indices]
        plan = stacked_plan(model, batch, base, chunk)
        start = Site(SiteKind.RESID, chunk[0].first_layer)
        if start in prefix_sites:
            plan.start = (start.layer, Ref(0, start, len(chunk)))
        jobs.append(Job(batch.repeat(len(chunk)), plan, keep=2 if final_only else 1))
    outputs = run_jobs(model, jobs)
    baseline = reduce_metric(metric(outputs[0].logits), metric, batch.n_rows)  # type: ignore[union-attr]
    scores = torch.empty(len(variants))
    for indices, out in zip(chunks, outputs[1:], strict=True):
        for i, rows in zip(indices, out.logits.split(batch.n_rows), strict=True):  # type: ignore[union-attr]
            scores[i] = reduce_metric(metric(rows), metric, batch.n_rows)
    return baseline, scores


def score_table(
    model: GnaModel,
    batch: Batch,
    base: Plan,
    variants: Sequence[Variant],
    cells: Sequence[tuple[int, ...]],
    shape: tuple[int, ...],
    metric: Metric,
    **options: Any,
) -> tuple[float, Tensor]:
    """`run_variants`, with variant ``i``'s score written at ``cells[i]`` of a NaN table
    of ``shape``. ``options`` go to `run_variants`."""
    baseline, flat = run_variants(model, batch, base, variants, metric, **options)
    scores = torch.full(shape, float("nan"))
    for cell, score in zip(cells, flat, strict=True):
        scores[cell] = score
    return baseline, scores


def stacked_plan(model: GnaModel, batch: Batch, base: Plan, chunk: Sequence[Variant]) -> Plan:
    n_rows, n_pos, copies = batch.n_rows, batch.n_pos, len(chunk)
    if any(edit.straight_through for variant in chunk for _, edit in variant.edits):
        # the stacking below merges edits into one plain Edit per site: it would drop the flag
        raise NotImplementedError("stacked variants with a straight-through Edit: not supported (nothing builds one)")
    plan = base.tiled(n_rows, copies)
    sites = sorted({site for variant in chunk for site, _ in variant.edits})
    device = model.device  # edit values are captured on the model's device (a GPU's)
    for site in sites:
        shape = (n_rows, n_pos, *model.site_shape(site))
        compact = _one_scalar_value(model, site, chunk, n_rows)
        if compact is not None:
            plan.add(site, compact)
            continue
        masks, values = [], []
        for variant in chunk:
            mine = [edit for s, edit in variant.edits if s == site]
            mask = torch.zeros((*shape[:-1], 1), dtype=torch.bool, device=device)
            value = torch.zeros(shape, device=device)
            for edit in mine:
                edit_mask = edit.mask.to(device).expand((*shape[:-1], 1))
                value = torch.where(edit_mask, edit.value.to(device, value.dtype).expand(shape), value)
                mask = mask | edit_mask
            masks.append(mask)
            values.append(value)
        plan.add(site, Edit(torch.cat(masks), torch.cat(values)))
    layers = sorted({layer for variant in chunk for layer in variant.skip_layers})
    for layer in layers:
        rows = torch.cat([torch.full((n_rows,), layer in v.skip_layers, dtype=torch.bool) for v in chunk])
        plan.add_skip(layer, rows)
    return plan


def _one_scalar_value(model: GnaModel, site: Site, chunk: Sequence[Variant], n_rows: int) -> Edit | None:
    """The chunk's edits at ``site`` as one `Edit` with a scalar value and masks kept at
    their own broadcast shape (rows, positions: 1 where no variant varies along them), when
    every edit writes the same scalar (zero ablation); ``None`` otherwise. The same forward
    as the full ``[rows, pos, ...]`` tensors, far less to build, hold and send to a server."""
    edits = [[edit for s, edit in variant.edits if s == site] for variant in chunk]
    values = [edit.value for mine in edits for edit in mine]
    if any(value.dim() != 0 for value in values) or len({float(value) for value in values}) != 1:
        return None
    trailing = (*model.site_shape(site)[:-1], 1)
    masks = []
    for mine in edits:
        mask = torch.zeros((1, 1, *trailing), dtype=torch.bool)
        for edit in mine:
            mask = mask | edit.mask
        masks.append(mask)
    common = torch.broadcast_shapes(*(mask.shape for mask in masks))
    if common[0] == 1:  # no variant's mask depends on the row: one row per copy, repeated per row
        stacked = torch.cat([mask.expand(1, *common[1:]) for mask in masks]).repeat_interleave(n_rows, 0)
    else:
        stacked = torch.cat([mask.expand(n_rows, *common[1:]) for mask in masks])
    return Edit(stacked, values[0])
