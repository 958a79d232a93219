"""Edge attribution's exact methods (`gna_interp.patching.edges` has the first-order score
and the definitions).

**Exact upstream** (``method="exact_upstream"``). On the trained toys first-order scores go
wrong downstream of the receiver and upstream of it, not in the receiver's own nonlinearity
(docs/records/patching.md, "Where the first-order error sits"). This method scores

    ``score(s -> r, stream) = (K_r^T g_ig) . (stream_r[D_s] - stream_r[clean])``

on ``r``'s unit of ``stream``, where

- ``stream_r[D_s]`` is ``r``'s stream in path patching's D run with ``s`` alone corrupt (every
  other head frozen, MLPs and norms recomputed): the sender's change upstream, exactly. One
  stacked forward, one copy per sender (plus one with every sender and one with none), gives
  it for every receiver at a position at once;
- ``K_r`` is the receiver linear at the clean run (its other streams, held streams and the
  other heads' inputs to a group norm clean, as in the first-order score);
- ``g_ig`` is the metric's gradient at ``r``'s output averaged over ``steps`` midpoints
  ``(i + 1/2) / steps`` of the straight path from ``r``'s clean output to its output with
  ``stream`` taken from the every-sender D run (``r``'s output recomputed as path patching
  recomputes it): integrated gradients downstream, one path per receiver stream.

Cost: the stacked D forward (``senders + 2`` copies, per receiver position), a D and a
recompute forward per stream name for the paths' ends, ``steps`` stacked forwards and
backwards with one copy per ``(receiver, stream)``, and one more for ``K_r^T``. It is exact
where the path is linear downstream of the receiver stream's change; measured against path
patching on the toys in docs/attribution.md.

``method="exact_receiver"`` replaces ``K_r`` by the receiver itself:
``score = g_ig . (out_r(stream_r[D_s]) - out_r)``, ``r``'s output recomputed with its unit of
``stream`` from ``D_s`` and its other inputs clean (as path patching recomputes it), one
stacked forward per stream name with one copy per ``(sender, receiver)``; no ``K_r^T``
backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.compile import head_mask
from ..core.heads import Head
from ..core.interventions import Intervention
from ..core.plan import Edit, Plan, Site, SiteKind
from ..cost import charge
from ..progress import progress_bar
from .attribution import _gradients, _scalar
from .edge_sets import _EdgeSets
from .metrics import Metric, logits_read
from .path_chain import _Chunk, _stack, held_sites, norm_inputs, receiver_positions, unit_mask
from .paths import ANY, Receivers, prepare
from .results import EdgeResult, _table

if TYPE_CHECKING:
    from ..models.handle import GnaModel


def _unit(model: GnaModel, site: Site, index: int) -> Tensor:
    """``[1, 1, unit, 1]`` bool: the unit of stream ``site`` that feeds head ``index``."""
    mixer = model.mixer(site)
    _, units, _ = mixer.stream(site.stream).layout(mixer.dims)
    mask = torch.zeros(1, 1, units, 1, dtype=torch.bool)
    mask[0, 0, index * units // mixer.n_heads, 0] = True
    return mask


def _exact_upstream(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    steps: int,
    receivers: Receivers,
    receiver_list: list[Head],
    sender_list: list[Head],
    streams: tuple[str, ...],
    whole: bool,
    interventions: Sequence[Intervention],
    exact_receiver: bool = False,
    progress: bool = False,
) -> EdgeResult:
    """``method="exact_upstream"``: ``score(s -> r, st) = (K_r^T g_ig) . (st_r[D_s] - st_r[clean])``
    on ``r``'s unit of ``st``; ``exact_receiver``: ``g_ig . (out_r(st_r[D_s]) - out_r)`` (see the
    module docs)."""
    # The explicit stream names even for "any" (summed at the end): prepare's whole-output mode
    # does not capture the held streams (Mamba-1's x holds x_read) that each stream's patch needs.
    setup, baseline, reference = prepare(model, clean, corrupt, sender_list, receivers, metric, list(streams), interventions)
    scored: dict[tuple[Head, Head, str], float] = {}
    positions = receiver_positions(model, setup.receivers)
    for position, heads in progress_bar(positions.items(), show=progress, desc="edge attribution", total=len(positions)):
        live = [s for s in sender_list if model.head_position(s) < position]
        scored.update(_score_position(model, setup, position, heads, live, streams, steps, exact_receiver))
    copies = [(r, name) for r in receiver_list for name in model.mixer_of(r)[0].receiver_inputs if name in streams]
    flat = torch.full((len(sender_list), len(copies)), float("nan"))
    for i, s in enumerate(sender_list):
        for j, (r, st) in enumerate(copies):
            if model.head_position(s) < model.head_position(r):
                flat[i, j] = scored.get((s, r, st), 0.0)
    scores = _table(flat, copies, receiver_list, streams, whole, len(sender_list))
    names = (ANY,) if whole else streams
    meta = {
        "method": "exact_receiver" if exact_receiver else "exact_upstream",
        "steps": steps,
        "n_prompts": setup.batch.n_rows,
        "receiver_input": list(names),
    }
    sender_nodes: list[Head | str] = [*sender_list]
    receiver_nodes: list[Head | str] = [*receiver_list]
    return EdgeResult(scores, sender_nodes, receiver_nodes, names, baseline, reference, meta=meta)


def _score_position(
    model: GnaModel,
    setup: Any,
    position: tuple[int, int],
    heads: Sequence[int],
    live: list[Head],
    streams: tuple[str, ...],
    steps: int,
    exact_receiver: bool,
) -> dict[tuple[Head, Head, str], float]:
    """``(sender, receiver, stream) -> score`` for the receivers ``heads`` at ``position``
    and the senders before it (``live``)."""
    layer, n = position[0], setup.batch.n_rows
    pairs = [(r, st) for r in (Head(layer, h) for h in heads) for st in streams if st in model.mixer_of(r)[0].receiver_inputs]
    if not pairs or not live:
        return {}
    site_of = {(r, st): Site(SiteKind.STREAM, layer, st, model.mixer_of(r)[0].index) for r, st in pairs}
    # Exact upstream: D with each sender alone (every other head frozen), every sender, none.
    chunk = _Chunk(setup, [[s] for s in live] + [live, []])
    _, d_acts = chunk.d_run(position, set(site_of.values()))
    ends = _path_ends(setup, position, pairs, live, streams)
    if exact_receiver:
        return _receiver_scores(model, setup, pairs, ends, site_of, live, d_acts, streams, steps, layer)

    def copy_of(site: Site, c: int) -> Tensor:
        return d_acts[site][c * n : (c + 1) * n]

    none = len(live) + 1
    scored: dict[tuple[Head, Head, str], float] = {}
    u = _integrated_pullback(model, setup, pairs, ends, site_of, {p: copy_of(site_of[p], none) for p in pairs}, steps, layer)
    for (r, st), grad in u.items():
        site, index = site_of[(r, st)], model.head_site(r)[1]
        unit = index * model.mixer(site).stream(st).layout(model.mixer(site).dims)[1] // model.mixer(site).n_heads
        for c, s in enumerate(live):
            change = (copy_of(site, c) - copy_of(site, none))[:, :, unit].float()
            scored[(s, r, st)] = float((grad[:, :, unit].float() * change).sum().cpu())
    return scored


def _path_ends(
    setup: Any, position: tuple[int, int], pairs: list[tuple[Head, str]], live: list[Head], streams: tuple[str, ...]
) -> dict[tuple[Head, str], Tensor]:
    """The paths' ends: each receiver's output ``[batch, pos, d_head]`` with its stream taken
    from the D run of every sender in ``live`` (recomputed as path patching recomputes it)."""
    before = dict(setup.clean)
    ends: dict[tuple[Head, str], Tensor] = {}
    for st in streams:
        group = {pair: live for pair in pairs if pair[1] == st}
        if group:
            edits = _EdgeSets(setup, group).receiver_patches(position[0], position, [r.head for r, _ in group], before, [])
            ends.update({pair: edit.value for pair, (_, edit) in zip(group, edits, strict=True)})
    return ends


def _receiver_scores(
    model: GnaModel,
    setup: Any,
    pairs: list[tuple[Head, str]],
    ends: dict[tuple[Head, str], Tensor],
    site_of: dict[tuple[Head, str], Site],
    live: list[Head],
    d_acts: dict[Site, Tensor],
    streams: tuple[str, ...],
    steps: int,
    layer: int,
) -> dict[tuple[Head, Head, str], float]:
    """``method="exact_receiver"``: ``g_ig . (out_r(st_r[D_s]) - out_r)`` per edge."""
    g_ig = _integrated_pullback(model, setup, pairs, ends, site_of, None, steps, layer)
    scored: dict[tuple[Head, Head, str], float] = {}
    for st in streams:
        here_st = [r for r, name in pairs if name == st]
        if here_st:
            outs = _receiver_outputs(model, setup, live, here_st, st, site_of, d_acts, layer)
            for (s, r), out in outs.items():
                site, index = model.head_site(r)
                change = (out - setup.clean[site][:, :, index]).float()
                scored[(s, r, st)] = float((g_ig[(r, st)].float() * change).sum().cpu())
    return scored


def _integrated_pullback(
    model: GnaModel,
    setup: Any,
    pairs: list[tuple[Head, str]],
    ends: dict[tuple[Head, str], Tensor],
    site_of: dict[tuple[Head, str], Site],
    clean_streams: dict[tuple[Head, str], Tensor] | None,
    steps: int,
    layer: int,
) -> dict[tuple[Head, str], Tensor]:
    """``K_r^T g_ig`` per ``(r, st)``: ``[batch, pos, unit, d]`` at the stream site, where
    ``g_ig`` averages the metric's gradient at ``r``'s output over the midpoints from its clean
    output to ``ends[(r, st)]``. Stacked: one copy of the batch per pair. With
    ``clean_streams=None``: ``g_ig`` itself, ``[batch, pos, d_head]`` at ``r``'s output."""
    n, k = setup.batch.n_rows, len(pairs)
    head_of = {r: model.head_site(r) for r, _ in pairs}
    sites = sorted({site for site, _ in head_of.values()})
    metric = setup.metric

    def rows_of(c: int) -> Tensor:
        mask = torch.zeros(k, dtype=torch.bool)
        mask[c] = True
        return mask.repeat_interleave(n)[:, None, None, None]

    def plan() -> Plan:
        p = Plan()
        p.extend(setup.base.tiled(n, k))
        if layer > 0:
            p.start = (layer, _stack(setup.clean[Site(SiteKind.RESID, layer)], n, k))
        return p

    def rows(tensor: Tensor, c: int) -> Tensor:
        return tensor[c * n : (c + 1) * n]

    g_ig: dict[tuple[Head, str], Tensor] = {}
    for i in range(steps):
        alpha = (i + 0.5) / steps
        p = plan()
        for c, pair in enumerate(pairs):
            site, index = head_of[pair[0]]
            out0 = setup.clean[site]
            p.add(site, Edit(rows_of(c) & head_mask(model.layout, site, [index]), _stack(out0 + alpha * (ends[pair] - out0), n, k)))
        out = model.run_plan(setup.batch.repeat(k), p, capture=set(sites), grad=True, logits_to_keep=logits_read(metric), prefix=False)
        total = sum(_scalar(metric(part), metric) for part in out.logits.split(n))
        grads = dict(zip(sites, _gradients(total, [out.acts[site] for site in sites]), strict=True))  # type: ignore[arg-type]
        charge(model.backend, backwards=1, backward_block_rows=n * k * (model.n_layers - layer))
        for c, pair in enumerate(pairs):
            site, index = head_of[pair[0]]
            g = rows(grads[site], c)[:, :, index].detach() / steps
            g_ig[pair] = g if pair not in g_ig else g_ig[pair] + g
    if clean_streams is None:
        return g_ig
    # K_r^T g_ig: r's copy of the stream is a leaf at its clean value; r's other inputs clean.
    p = plan()
    leaves: dict[tuple[Head, str], Tensor] = {}
    for c, pair in enumerate(pairs):
        r, _ = pair
        site, (head_site, index) = site_of[pair], head_of[r]
        leaves[pair] = _stack(clean_streams[pair], n, k).requires_grad_(True)
        p.add(site, Edit(rows_of(c) & unit_mask(model, site, [index]), leaves[pair]))
        for held, idx in held_sites(model, {site: [index]}).items():
            p.add(held, Edit(rows_of(c) & unit_mask(model, held, idx), _stack(setup.clean[held], n, k)))
        for norm in norm_inputs(model, {head_site: [index]}):
            others = ~(head_mask(model.layout, norm, [index]) if norm.kind is SiteKind.PRE_NORM else _unit(model, norm, index))
            p.add(norm, Edit(rows_of(c) & others, _stack(setup.clean[norm], n, k)))
    out = model.run_plan(setup.batch.repeat(k), p, capture=set(sites), grad=True, logits_to_keep=1, prefix=False)  # logits unread
    total = torch.zeros(())
    for c, pair in enumerate(pairs):
        site, index = head_of[pair[0]]
        total = total + (rows(out.acts[site], c)[:, :, index].float() * g_ig[pair].float()).sum().cpu()
    pulled = _gradients(total, [leaves[pair] for pair in pairs])
    charge(model.backend, backwards=1, backward_block_rows=n * k)
    return {pair: rows(grad, c) for c, (pair, grad) in enumerate(zip(pairs, pulled, strict=True))}


def _receiver_outputs(
    model: GnaModel,
    setup: Any,
    senders: list[Head],
    receivers: list[Head],
    stream: str,
    site_of: dict[tuple[Head, str], Site],
    d_acts: dict[Site, Tensor],
    layer: int,
) -> dict[tuple[Head, Head], Tensor]:
    """Each receiver's output ``[batch, pos, d_head]`` recomputed with its unit of ``stream``
    from the D run of each sender alone (copy ``c`` of ``d_acts`` for ``senders[c]``), its
    other inputs clean (held streams, the other heads' inputs to a group norm): one stacked
    forward, one copy per ``(sender, receiver)``."""
    n = setup.batch.n_rows
    combos = [(c, r) for c in range(len(senders)) for r in receivers]
    k = len(combos)
    plan = Plan()
    plan.extend(setup.base.tiled(n, k))
    if layer > 0:
        plan.start = (layer, _stack(setup.clean[Site(SiteKind.RESID, layer)], n, k))
    rows = torch.eye(k, dtype=torch.bool).repeat_interleave(n, 1)  # [copy, rows]
    for j, (c, r) in enumerate(combos):
        site, (head_site, index) = site_of[(r, stream)], model.head_site(r)
        mask = rows[j][:, None, None, None]
        plan.add(site, Edit(mask & unit_mask(model, site, [index]), _stack(d_acts[site][c * n : (c + 1) * n], n, k)))
        for held, idx in held_sites(model, {site: [index]}).items():
            plan.add(held, Edit(mask & unit_mask(model, held, idx), _stack(setup.clean[held], n, k)))
        for norm in norm_inputs(model, {head_site: [index]}):
            others = ~(head_mask(model.layout, norm, [index]) if norm.kind is SiteKind.PRE_NORM else _unit(model, norm, index))
            plan.add(norm, Edit(mask & others, _stack(setup.clean[norm], n, k)))
    capture = {model.head_site(r)[0] for r in receivers}
    out = model.run_plan(setup.batch.repeat(k), plan, capture=capture, logits_to_keep=1, prefix=False)  # logits unread
    result = {}
    for j, (c, r) in enumerate(combos):
        site, index = model.head_site(r)
        result[(senders[c], r)] = out.acts[site][j * n : (j + 1) * n, :, index]
    return result
