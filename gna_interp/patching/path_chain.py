"""The forwards behind path patching, for many sender sets at once.

Two copies of the clean run take part (see `gna_interp.patching.paths` for why):

- **C** (the run whose logits are scored): clean, except that each receiver's chosen
  input streams are replaced by their values in D. Blocks before the first receiver
  layer compute exactly the clean run.
- **D**: clean, with the senders set to their corrupt outputs and *every other head of
  every layer frozen to its output in C*; MLPs and norms are recomputed. With
  ``"logits"`` among the receivers, D's logits are scored instead of C's.

C at receiver layer ``l`` needs D's streams at ``l``, and D below ``l`` needs C's head
outputs below ``l``, so the runs alternate, one receiver layer at a time:

1. ``D_1``: heads frozen to clean (C is clean below the first receiver layer), senders
   corrupt; read the chosen streams at receiver layer ``l_1``.
2. ``C_2``: clean with the receivers of ``l_1`` patched; read every head output below
   ``l_2`` (and the streams `Stream.holds` keeps, at ``l_2``). ``D_2`` as ``D_1`` with
   those frozen values; read the streams at ``l_2``. And so on.
3. The last C run patches every receiver layer; with ``"logits"`` a last D run freezes
   every head to that run's outputs.

With one receiver layer (the usual case) that is exactly the IOI recipe: two forwards
per sender set, beside the clean and corrupt runs every call shares.

Every forward stacks ``copies`` copies of the clean batch (one per sender set) on the
batch axis, like the sweeps of `gna_interp.patching.variants`; D runs start at the first
sender layer and C runs at the first receiver layer, from the clean residual stream
there (`Plan.start`), since nothing differs from the clean run before them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..core.heads import Head
from ..core.plan import Edit, Plan, Site, SiteKind
from ..models.inputs import Batch
from .metrics import Metric, reduce_metric

if TYPE_CHECKING:
    from ..models.handle import GnaModel


@dataclass
class PathSetup:
    """What every chunk of sender sets shares (all tensors have the clean batch's rows,
    or one row)."""

    model: GnaModel
    batch: Batch
    base: Plan
    """The ambient interventions, compiled for the clean batch."""
    receivers: dict[int, tuple[int, ...]]
    """Receiver layer -> head indices."""
    to_logits: bool
    streams: tuple[str, ...]
    """Chosen input streams of the receivers."""
    clean: dict[Site, Tensor]
    """Clean run: head outputs of every layer, residual stream at the start layers, and the
    held streams at the receiver layers."""
    corrupt_heads: dict[int, Tensor]
    """Corrupt run: head outputs ``[batch, pos, head, d_head]`` of every sender layer."""
    metric: Metric


def setup_sites(model: GnaModel, receivers: dict[int, tuple[int, ...]], streams: Sequence[str], sender_layers: set[int]) -> set[Site]:
    """The sites the clean run must capture for `PathSetup.clean`."""
    sites = {Site(SiteKind.HEADS, layer) for layer in range(min(sender_layers), model.n_layers)}
    sites |= {Site(SiteKind.RESID, layer) for layer in sender_layers | set(receivers) if 0 < layer < model.n_layers}
    sites |= {Site(SiteKind.STREAM, layer, held) for layer in receivers for held in held_streams(model, streams)}
    return sites


def held_streams(model: GnaModel, streams: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(held for name in streams for held in model.arch.stream(name).holds))


def unit_mask(model: GnaModel, stream: str, heads: Sequence[int]) -> Tensor:
    """``[1, 1, unit, 1]`` bool: the units of ``stream`` that feed ``heads`` (a shared unit
    feeds every head of its group)."""
    _, units, _ = model.arch.stream(stream).layout(model.hf_model.config)
    mask = torch.zeros(1, 1, units, 1, dtype=torch.bool)
    mask[0, 0, [head * units // model.n_heads for head in heads], 0] = True
    return mask


def _stack(tensor: Tensor, n_rows: int, copies: int) -> Tensor:
    """``[batch | 1, ...]`` -> ``[copies * batch, ...]``."""
    tensor = tensor.expand(n_rows, *tensor.shape[1:])
    return tensor.repeat(copies, *([1] * (tensor.dim() - 1)))


class _Chunk:
    """One stacked chain of forwards for ``sender_sets`` (one copy of the batch each)."""

    def __init__(self, setup: PathSetup, sender_sets: Sequence[Sequence[Head]]) -> None:
        self.s = setup
        self.n_rows, self.copies = setup.batch.n_rows, len(sender_sets)
        self.batch = setup.batch.repeat(self.copies)
        self.base = setup.base.tiled(self.n_rows, self.copies)
        self.first = min(head.layer for senders in sender_sets for head in senders)
        n_heads = setup.model.n_heads
        by_layer: dict[int, Tensor] = {}
        for copy, senders in enumerate(sender_sets):
            for head in senders:
                by_layer.setdefault(head.layer, torch.zeros(self.copies, n_heads, dtype=torch.bool))[copy, head.head] = True
        # layer -> ([rows, 1, head, 1] bool: sender heads of each copy, [rows, pos, head, d_head] corrupt outputs)
        self.swap = {
            layer: (mask.repeat_interleave(self.n_rows, 0)[:, None, :, None], self.stack(setup.corrupt_heads[layer]))
            for layer, mask in by_layer.items()
        }
        self.c_heads: dict[int, Tensor] = {}  # head outputs in C, where they differ from clean

    def stack(self, tensor: Tensor) -> Tensor:
        return _stack(tensor, self.n_rows, self.copies)

    def c_head(self, layer: int) -> Tensor:
        if layer not in self.c_heads:
            self.c_heads[layer] = self.stack(self.s.clean[Site(SiteKind.HEADS, layer)])
        return self.c_heads[layer]

    def plan(self, start: int) -> Plan:
        plan = Plan()
        plan.extend(self.base)
        if start > 0:
            plan.start = (start, self.stack(self.s.clean[Site(SiteKind.RESID, start)]))
        return plan

    def d_run(self, upto: int, capture: set[Site]) -> tuple[Tensor, dict[Site, Tensor]]:
        """D: every head of layers ``first .. upto - 1`` frozen to C, the senders swapped in."""
        plan = self.plan(self.first)
        every = torch.ones((), dtype=torch.bool)
        for layer in range(self.first, upto):
            value = self.c_head(layer)
            if layer in self.swap:
                rows, corrupt = self.swap[layer]
                value = torch.where(rows, corrupt, value)
            plan.add(Site(SiteKind.HEADS, layer), Edit(every, value))
        out = self.s.model.backend.run(self.batch, plan, capture=capture)
        return out.logits, out.acts

    def c_run(self, start: int, patches: list[tuple[Site, Edit]], capture: set[Site]) -> tuple[Tensor, dict[Site, Tensor]]:
        plan = self.plan(start)
        for site, edit in patches:
            plan.add(site, edit)
        out = self.s.model.backend.run(self.batch, plan, capture=capture)
        return out.logits, out.acts

    def scores(self) -> list[float]:
        s, model = self.s, self.s.model
        layers = [layer for layer in sorted(s.receivers) if layer > self.first]  # earlier ones receive nothing
        held = held_streams(model, s.streams)
        patches: list[tuple[Site, Edit]] = []
        for j, layer in enumerate(layers):
            held_sites = {Site(SiteKind.STREAM, layer, name) for name in held}
            if j == 0:  # C is the clean run up to here
                held_values = {site: self.stack(s.clean[site]) for site in held_sites}
            else:
                below = {Site(SiteKind.HEADS, lower) for lower in range(layers[0], layer)}
                _, acts = self.c_run(layers[0], patches, below | held_sites)
                self.c_heads.update({site.layer: acts[site] for site in below})
                held_values = {site: acts[site] for site in held_sites}
            chosen = {Site(SiteKind.STREAM, layer, name) for name in s.streams}
            _, d_acts = self.d_run(layer, chosen)
            heads = s.receivers[layer]
            patches += [(site, Edit(unit_mask(model, site.stream, heads), d_acts[site])) for site in sorted(chosen)]
            patches += [(site, Edit(unit_mask(model, site.stream, heads), held_values[site])) for site in sorted(held_sites)]
        if s.to_logits:
            if layers:
                every = {Site(SiteKind.HEADS, layer) for layer in range(layers[0], model.n_layers)}
                _, acts = self.c_run(layers[0], patches, every)
                self.c_heads.update({site.layer: acts[site] for site in every})
            logits, _ = self.d_run(model.n_layers, set())
        else:
            logits, _ = self.c_run(layers[0], patches, set())
        return [reduce_metric(s.metric(rows)) for rows in logits.split(self.n_rows)]


def path_scores(setup: PathSetup, sender_sets: Sequence[Sequence[Head]]) -> list[float]:
    """The metric of the final path-patched run for each sender set, from one stacked chain
    of forwards (``len(sender_sets)`` copies of the batch per forward)."""
    return _Chunk(setup, sender_sets).scores()
