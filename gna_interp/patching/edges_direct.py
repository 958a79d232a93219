"""`gna_interp.patching.edges`'s stacked gradient forwards: path="all"'s (`_chunk_gradients`:
frozen head sites as leaves), ``path="direct"``'s pieces, and the receiver forward both share.

The direct graph's nodes (`gna_interp.patching.direct`): every sender writes into the
residual stream (a head through its out-projection, ``"embed"`` the embedding, ``"L0MLP"``
an MLP's output); a receiver reads its own copy of it (a head through one input stream; an
MLP through its norm's input, `SiteKind.MLP_IN`; ``"logits"`` through the final norm's
input). The first-order score of ``s -> r`` is ``write_s . d metric / d (r's copy)`` at the
run: for a head receiver, from a stacked forward with a leaf residual stream per copy
(`_direct_gradients`); for an MLP, the gradient at its output pulled back through it
(`mlp_input_gradients`); for the logits, the gradient at the final norm's input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.compile import head_mask
from ..core.heads import Head
from ..core.plan import Edit, Plan, Site, SiteKind
from ..cost import charge
from .attribution import _gradients
from .direct import LOGITS, mlp_layer
from .edges_exact import _unit
from .path_chain import held_sites, norm_inputs

if TYPE_CHECKING:
    from ..models.handle import GnaModel


def node_site(model: GnaModel, node: str) -> tuple[Site, Site]:
    """``(what the receiver reads, where its metric gradient is taken)`` for an MLP or
    ``"logits"`` receiver: ``"logits"``, the final norm's input twice; an MLP, its norm's
    input and its output (`mlp_input_gradients` carries the gradient back through the MLP)."""
    if node == LOGITS:
        return Site(SiteKind.RESID, model.n_layers), Site(SiteKind.RESID, model.n_layers)
    layer = mlp_layer(node)
    assert layer is not None
    return Site(SiteKind.MLP_IN, layer), Site(SiteKind.MLP_OUT, layer)


def mlp_input_gradients(
    model: GnaModel, batch: Any, base: Plan, layers: Sequence[int], point: dict[Site, Tensor], grads: dict[Site, Tensor]
) -> dict[int, Tensor]:
    """``d metric / d (MLP l's own input)`` ``[batch, pos, d_model]`` for each layer of
    ``layers``: the point run's gradient at the MLP's output (``grads``), pulled back through
    the MLP and its norm at the point run's input (``point``), as `_direct_gradients` does
    for heads (an MLP whose output the point run sets, an interpolated sender, is set
    straight through: ``grads`` already runs through everything downstream). One stacked
    forward, one copy per layer, each copy's MLP input a leaf."""
    n_rows, n_copies = batch.n_rows, len(layers)
    plan = Plan()
    plan.extend(base.tiled(n_rows, n_copies))
    leaves = {}
    for c, layer in enumerate(layers):
        value = point[Site(SiteKind.MLP_IN, layer)]
        leaves[layer] = value.expand(n_rows, *value.shape[1:]).repeat(n_copies, 1, 1).requires_grad_(True)
        rows = (torch.arange(n_copies) == c).repeat_interleave(n_rows)[:, None, None]
        plan.add(Site(SiteKind.MLP_IN, layer), Edit(rows, leaves[layer]))
    outs = {Site(SiteKind.MLP_OUT, layer) for layer in layers}
    out = model.run_plan(batch.repeat(n_copies), plan, capture=outs, grad=True, logits_to_keep=1, prefix=False)  # logits unread
    total = torch.zeros(())
    for c, layer in enumerate(layers):
        site, span = Site(SiteKind.MLP_OUT, layer), slice(c * n_rows, (c + 1) * n_rows)
        total = total + (out.acts[site][span].float() * grads[site].float()).sum().cpu()
    pulled = _gradients(total, [leaves[layer] for layer in layers])
    charge(model.backend, backwards=1, backward_block_rows=n_rows * n_copies * (model.n_layers - min(layers)))
    return {layer: grad[c * n_rows : (c + 1) * n_rows] for c, (layer, grad) in enumerate(zip(layers, pulled, strict=True))}


def interpolated(site: Site, clean: Tensor, corrupt: Tensor, alpha: float) -> tuple[Site, Edit]:
    """The whole ``site`` moved ``alpha`` of the way from clean to corrupt (integrated
    gradients: a non-head sender, ``"embed"`` or an MLP, along with the heads), straight
    through: the backward runs through the writer as if unedited."""
    return site, Edit(torch.ones((), dtype=torch.bool), clean + alpha * (corrupt - clean), straight_through=True)


def _chunk_gradients(
    model: GnaModel,
    batch: Any,
    base: Plan,
    chunk: Sequence[tuple[Head, str]],
    clean: dict[Site, Tensor],
    grads: dict[Site, Tensor],
    first: int,
    frozen_sites: set[Site],
) -> dict[Site, Tensor]:
    """``J_s^T K_r^T g_r`` for every frozen head site and every ``(receiver, stream)`` of
    ``chunk``: ``site -> [copy, batch, pos, head, d_head]``."""
    n_rows, n_copies = batch.n_rows, len(chunk)

    def stack(tensor: Tensor) -> Tensor:
        tensor = tensor.expand(n_rows, *tensor.shape[1:])
        return tensor.repeat(n_copies, *([1] * (tensor.dim() - 1)))

    def rows_of(copies: Sequence[int]) -> Tensor:
        """``[copy * batch, 1, 1, 1]`` bool: the rows of ``copies``."""
        mask = torch.zeros(n_copies, dtype=torch.bool)
        mask[list(copies)] = True
        return mask.repeat_interleave(n_rows)[:, None, None, None]

    plan = Plan()
    plan.extend(base.tiled(n_rows, n_copies))
    if first > 0:
        plan.start = (first, stack(clean[Site(SiteKind.RESID, first)]))
    leaves: dict[Site, Tensor] = {}
    for site in sorted(frozen_sites):
        before = [c for c, (r, _) in enumerate(chunk) if model.mixer(site).position < model.head_position(r)]
        if before:
            leaves[site] = stack(clean[site]).requires_grad_(True)
            plan.add(site, Edit(rows_of(before), leaves[site]))
    _hold_other_inputs(model, plan, chunk, clean, stack, rows_of)
    total = _receiver_contraction(model, batch, plan, chunk, grads, n_rows, n_copies)
    order = sorted(leaves)
    if total.requires_grad:
        pulled = _gradients(total, [leaves[site] for site in order])
    else:  # no receiver reads any frozen site (cannot happen with senders before receivers)
        pulled = [torch.zeros_like(leaves[site]) for site in order]
    charge(model.backend, backwards=1, backward_block_rows=n_rows * n_copies * (model.n_layers - first))
    return {site: grad.reshape(n_copies, n_rows, *grad.shape[1:]) for site, grad in zip(order, pulled, strict=True)}


def _direct_gradients(
    model: GnaModel, batch: Any, base: Plan, chunk: Sequence[tuple[Head, str]], clean: dict[Site, Tensor], grads: dict[Site, Tensor]
) -> Tensor:
    """path="direct": ``d metric / d resid`` through each ``(receiver, stream)`` of ``chunk``
    alone, at the receiver's own copy of the residual stream entering its block:
    ``[copy, batch, pos, d_model]``. As `_chunk_gradients`, with a leaf residual stream at
    each receiver's block in place of the frozen heads."""
    n_rows, n_copies = batch.n_rows, len(chunk)

    def stack(tensor: Tensor) -> Tensor:
        return tensor.expand(n_rows, *tensor.shape[1:]).repeat(n_copies, *([1] * (tensor.dim() - 1)))

    def rows_of(copies: Sequence[int], dims: int = 4) -> Tensor:
        mask = torch.zeros(n_copies, dtype=torch.bool)
        mask[list(copies)] = True
        return mask.repeat_interleave(n_rows).reshape(-1, *([1] * (dims - 1)))

    layers = sorted({r.layer for r, _ in chunk})
    plan = Plan()
    plan.extend(base.tiled(n_rows, n_copies))
    if layers[0] > 0:
        plan.start = (layers[0], stack(clean[Site(SiteKind.RESID, layers[0])]))
    leaves: dict[int, Tensor] = {}
    for layer in layers:
        leaves[layer] = stack(clean[Site(SiteKind.RESID, layer)]).requires_grad_(True)
        plan.add(Site(SiteKind.RESID, layer), Edit(rows_of([c for c, (r, _) in enumerate(chunk) if r.layer == layer], 3), leaves[layer]))
    _hold_other_inputs(model, plan, chunk, clean, stack, rows_of)
    total = _receiver_contraction(model, batch, plan, chunk, grads, n_rows, n_copies)
    pulled = dict(zip(layers, _gradients(total, [leaves[layer] for layer in layers]), strict=True))
    charge(model.backend, backwards=1, backward_block_rows=n_rows * n_copies * (model.n_layers - layers[0]))
    result = torch.stack([pulled[r.layer].reshape(n_copies, n_rows, *pulled[r.layer].shape[1:])[c] for c, (r, _) in enumerate(chunk)])
    return result.float()


def _hold_other_inputs(
    model: GnaModel, plan: Plan, chunk: Sequence[tuple[Head, str]], clean: dict[Site, Tensor], stack: Any, rows_of: Any
) -> None:
    """In each copy, the receiver's other streams, the streams its stream holds and the
    other heads' inputs to its group norm at their clean (detached) values."""
    for c, (receiver, name) in enumerate(chunk):
        mixer, index = model.mixer_of(receiver)
        rows = rows_of([c])
        live = Site(SiteKind.STREAM, receiver.layer, name, mixer.index)
        held = set(held_sites(model, {live: [index]}))
        for stream in mixer.spec.streams:
            site = Site(SiteKind.STREAM, receiver.layer, stream.name, mixer.index)
            if site != live or site in held:
                plan.add(site, Edit(rows, stack(clean[site])))
        head_site = model.head_site(receiver)[0]
        for site in norm_inputs(model, {head_site: [index]}):  # the other heads' inputs to the group norm
            others = ~(head_mask(model.layout, site, [index]) if site.kind is SiteKind.PRE_NORM else _unit(model, site, index))
            plan.add(site, Edit(rows & others, stack(clean[site])))


def _receiver_contraction(model: Any, batch: Any, plan: Any, chunk: Any, grads: dict[Any, Tensor], n_rows: int, n_copies: int) -> Tensor:
    """One stacked forward of ``n_copies`` copies of ``batch`` under ``plan``, and the sum over
    the chunk's receivers of (copy c's receiver input) x (its metric gradient): a scalar whose
    gradient with respect to the plan's leaves gives every edge of the chunk."""
    receivers = {model.head_site(r)[0] for r, _ in chunk}
    out = model.run_plan(batch.repeat(n_copies), plan, capture=receivers, grad=True, logits_to_keep=1, prefix=False)  # logits unread
    total = torch.zeros(())
    for c, (receiver, _) in enumerate(chunk):
        site, index = model.head_site(receiver)
        span = slice(c * n_rows, (c + 1) * n_rows)
        total = total + (out.acts[site][span, :, index].float() * grads[site][:, :, index].float()).sum().cpu()
    return total
