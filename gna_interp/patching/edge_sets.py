"""`edge_set_logits`: the scored run of many path-patched edges at once, each receiver
stream with its own sender set (the edge faithfulness curve and `circuit_score`'s edge
rankings), on path patching's forwards (`gna_interp.patching.path_chain`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..core.compile import head_mask
from ..core.heads import Head
from ..core.plan import Edit, Plan, Site, SiteKind
from .direct import LOGITS, MLP_STAGE, mlp_name
from .path_chain import (
    PathSetup,
    Position,
    _Chunk,
    _stack,
    held_sites,
    norm_inputs,
    others_mask,
    receiver_positions,
    unit_mask,
    unpatched_sites,
)


def edge_set_logits(setup: PathSetup, edges: Mapping[Any, Sequence[Head | str]], keep: int = 1) -> Tensor:
    """Logits ``[batch, keep | pos, vocab]`` of the clean run in which, for every
    ``(receiver, stream)`` of ``edges``, the receiver's ``stream`` takes its value in the D
    run whose senders are ``edges[(receiver, stream)]`` (every other head frozen, as in
    `path_patching`), and only the receivers' outputs change.

    Different ``(receiver, stream)`` may have different senders: each distinct sender set
    is one copy of the batch in a stacked D forward. Each receiver is then recomputed in
    its own copy of the batch (a stacked forward, one copy per receiver at a position),
    with each chosen stream from its own D copy and, as in `path_patching`, the streams it
    holds, the other heads of a shared unit and the other heads' inputs to a group norm at
    their unpatched values; the scored run takes each receiver's output from its copy.
    With one sender set for every pair this is `path_patching` of that set (receivers of
    one Mamba-2 group norm excepted: here each is normalised with the others' unpatched
    outputs, there with their patched ones). An empty sender set leaves that stream clean;
    with none at all the scored run is the clean run.

    Receivers at several positions chain as in `path_scores`: D runs at a later position
    freeze the heads to their values in the scored run patched so far.

    path="direct" also takes the direct graph's other ends (`gna_interp.patching.direct`):
    ``"embed"`` and MLP senders, and ``(MLP, "any")`` / ``("logits", "any")`` keys, whose
    reader (the MLP's norm, the final norm) takes its clean input (the final norm: the
    scored run's) plus the writes of its own sender set.
    """
    return _EdgeSets(setup, edges).logits(keep)


def _order(node: Head | str) -> tuple[int, int, int, str]:
    """Heads by layer and head, then the other nodes by name."""
    return (0, node.layer, node.head, "") if isinstance(node, Head) else (1, 0, 0, node)


class _EdgeSets:
    def __init__(self, setup: PathSetup, edges: Mapping[Any, Sequence[Head | str]]) -> None:
        self.s = setup
        live = {key: tuple(sorted(senders, key=_order)) for key, senders in edges.items() if senders}
        self.sets = list(dict.fromkeys(live.values()))
        self.group = {key: self.sets.index(senders) for key, senders in live.items()}
        self.n_rows = setup.batch.n_rows
        self.d = _Chunk(setup, self.sets) if self.sets else None

    def c_run(self, start: int, patches: list[tuple[Site, Edit]], capture: set[Site], keep: int) -> dict[Site, Tensor] | Tensor:
        """The scored run (one copy of the batch) with ``patches``: its captures, or its logits."""
        s = self.s
        plan = Plan()
        plan.extend(s.base)
        if start > 0:
            plan.start = (start, s.clean[Site(SiteKind.RESID, start)])
        for site, edit in patches:
            plan.add(site, edit)
        out = s.model.run_plan(s.batch, plan, capture=capture, logits_to_keep=keep, prefix=False)
        return out.acts if capture else out.logits

    def logits(self, keep: int) -> Tensor:
        s, model = self.s, self.s.model
        live = {receiver for receiver, _ in self.group}
        grouped = {
            position: [h for h in heads if Head(position[0], h) in live]
            for position, heads in receiver_positions(model, s.receivers).items()
            if any(Head(position[0], h) in live for h in heads)
        }
        grouped.update({(layer, MLP_STAGE): [] for layer in s.mlps if mlp_name(layer) in live})  # path="direct"
        grouped = dict(sorted(grouped.items()))
        positions = list(grouped)
        start = positions[0][0] if positions else 0
        patches: list[tuple[Site, Edit]] = []
        c_heads: dict[Site, Tensor] = {}  # head outputs in the scored run, where they differ from clean
        for j, position in enumerate(positions):
            assert self.d is not None  # a live receiver has a sender set
            layer, heads = position[0], grouped[position]
            if position[1] == MLP_STAGE:  # the MLP's norm reads its clean input plus its senders' writes
                mlp_in = Site(SiteKind.MLP_IN, layer)
                value = s.clean[mlp_in] + self.writes(mlp_name(layer), position)
                patches.append((mlp_in, Edit(torch.ones((), dtype=torch.bool), value)))
                continue
            unpatched = unpatched_sites(model, layer, heads, s.streams, False)
            if j == 0:
                before = {site: s.clean[site] for site in unpatched}
            else:
                below = self.d.head_sites(positions[0], position)
                acts = self.c_run(start, patches, below | unpatched, 1)
                assert isinstance(acts, dict)
                c_heads.update({site: acts[site] for site in below})
                before = {site: acts[site] for site in unpatched}
            self.d.c_heads = {site: self.d.stack(value) for site, value in c_heads.items()}
            patches += self.receiver_patches(start, position, heads, before, patches)
        if LOGITS in live:  # the final norm reads the scored run's residual plus the senders' writes
            final = Site(SiteKind.RESID, model.n_layers)
            resid = self.c_run(start, patches, {final}, 1)[final] if positions else s.clean[final]  # type: ignore[index]
            plan = Plan()
            plan.extend(s.base)
            plan.start = (model.n_layers, resid + self.writes(LOGITS, (model.n_layers, 0)))
            return s.model.run_plan(s.batch, plan, logits_to_keep=keep, prefix=False).logits
        logits = self.c_run(start, patches, set(), keep)
        assert isinstance(logits, Tensor)
        return logits

    def writes(self, receiver: str, upto: Position) -> Tensor | int:
        """The summed writes of the sender set of ``(receiver, "any")`` before ``upto``: ``[batch, pos, d_model]``."""
        assert self.d is not None
        total, group, n = self.d.delta(upto), self.group[(receiver, "any")], self.n_rows  # type: ignore[index]
        return total if isinstance(total, int) else total[group * n : (group + 1) * n]

    def receiver_patches(
        self, start: int, position: Position, heads: Sequence[int], before: dict[Site, Tensor], patches: list[tuple[Site, Edit]]
    ) -> list[tuple[Site, Edit]]:
        """Edits of the scored run for the receivers ``heads`` at ``position``: each one's
        output from its own recomputed copy (one D forward, one stacked forward)."""
        assert self.d is not None
        s, model, n = self.s, self.s.model, self.n_rows
        layer = position[0]
        pairs = [(Head(layer, h), name) for h in heads for name in s.streams if (Head(layer, h), name) in self.group]
        chosen_sites = {(r, name): Site(SiteKind.STREAM, layer, name, model.mixer_of(r)[0].index) for r, name in pairs}
        _, d_acts = self.d.d_run(position, set(chosen_sites.values()))
        copies = len(heads)

        def rows_of(copy: int) -> Tensor:
            mask = torch.zeros(copies, dtype=torch.bool)
            mask[copy] = True
            return mask.repeat_interleave(n)[:, None, None, None]

        plan_edits: list[tuple[Site, Edit]] = []
        for copy, h in enumerate(heads):
            receiver = Head(layer, h)
            head_site, index = model.head_site(receiver)
            rows = rows_of(copy)
            chosen: dict[Site, list[int]] = {}
            for (r, name), site in chosen_sites.items():
                if r == receiver:
                    group = self.group[(r, name)]
                    value = d_acts[site][group * n : (group + 1) * n]
                    plan_edits.append((site, Edit(rows & unit_mask(model, site, [index]), _stack(value, n, copies))))
                    chosen[site] = [index]
            for site, idx in sorted(held_sites(model, chosen).items()):
                plan_edits.append((site, Edit(rows & unit_mask(model, site, idx), _stack(before[site], n, copies))))
            for site, idx in sorted(norm_inputs(model, {head_site: [index]}).items()):
                plan_edits.append((site, Edit(rows & others_mask(model, site, idx), _stack(before[site], n, copies))))
        capture = {model.head_site(Head(layer, h))[0] for h in heads}
        acts = self._recompute(start, patches, plan_edits, capture, copies)
        edits = []
        for copy, h in enumerate(heads):
            site, index = model.head_site(Head(layer, h))
            edits.append((site, Edit(head_mask(model.layout, site, [index]), acts[site][copy * n : (copy + 1) * n])))
        return edits

    def _recompute(
        self, start: int, patches: list[tuple[Site, Edit]], extra: list[tuple[Site, Edit]], capture: set[Site], copies: int
    ) -> dict[Site, Tensor]:
        s = self.s
        plan = Plan()
        plan.extend(s.base.tiled(self.n_rows, copies))
        if start > 0:
            plan.start = (start, _stack(s.clean[Site(SiteKind.RESID, start)], self.n_rows, copies))
        for site, edit in patches:
            plan.add(site, edit.tiled(self.n_rows, copies))
        for site, edit in extra:
            plan.add(site, edit)
        return s.model.run_plan(s.batch.repeat(copies), plan, capture=capture, logits_to_keep=1, prefix=False).acts
