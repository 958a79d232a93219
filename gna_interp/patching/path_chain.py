"""The forwards behind path patching, for many sender sets at once.

Two copies of the clean run take part (see `gna_interp.patching.paths` for why):

- **C** (the run whose logits are scored): clean, except for the receivers' outputs.
  With ``receiver_input="any"`` each receiver's output (its slice of the out-projection
  input) is replaced by its value in D. With chosen streams, the receivers' streams are
  replaced by their values in D (a shared unit for the whole unit), and every other head
  of a receiver's mixer is put back to its value in C before this patch (its out-projection
  slice and, where a group norm couples the heads, its input to that norm), so only the
  receivers' outputs change. Blocks before the first receiver layer compute exactly the
  clean run.
- **D**: clean, with the senders set to their corrupt outputs and *every other head of
  every layer frozen to its output in C*; MLPs and norms are recomputed; the receivers
  run free (for ``"any"``, the other heads of a receiver's group norm are frozen before
  the norm too). With ``"logits"`` among the receivers, D's logits are scored instead of C's.

C at receiver layer ``l`` needs D's values at ``l``, and D below ``l`` needs C's head
outputs below ``l``, so the runs alternate, one receiver layer at a time. (Precisely:
one receiver *position* ``(layer, stage)`` at a time. A Zamba2 hybrid layer runs the
shared attention block and then its Mamba-2, which reads the attention's output: its
Mamba-2 heads come after its attention heads, in the same layer. FalconH1's two mixers
read the same input: one position.)

1. ``D_1``: heads frozen to clean (C is clean below the first receiver layer), senders
   corrupt; read the receivers' outputs (or chosen streams) at receiver layer ``l_1``.
2. ``C_2``: clean with the receivers of ``l_1`` patched; read every head output below
   ``l_2``, and at ``l_2`` what the patch there holds (`unpatched_sites`). ``D_2`` as
   ``D_1`` with those frozen values; read the receivers at ``l_2``. And so on.
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

from ..core.arch import LayerKind
from ..core.compile import head_mask, heads_by_site
from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.inputs import Batch
from ..core.plan import Edit, Plan, Site, SiteKind
from .direct import MLP_STAGE, sender_position, stacked_writes
from .metrics import Metric, logits_read, reduce_metric

if TYPE_CHECKING:
    from ..models.handle import GnaModel


@dataclass
class PathSetup:
    """What every chunk of sender sets shares (all tensors have the clean batch's rows, or one row)."""

    model: GnaModel
    batch: Batch
    base: Plan
    """The ambient interventions, compiled for the clean batch."""
    receivers: dict[int, tuple[int, ...]]
    """Receiver layer -> head numbers (layer-level, as in `gna_interp.Head`)."""
    to_logits: bool
    streams: tuple[str, ...]
    """Chosen input streams of the receivers (each receiver uses those its mixer has)."""
    whole_output: bool
    """``receiver_input="any"``: the receivers' outputs come from D (no stream is patched)."""
    clean: dict[Site, Tensor]
    """Clean run: head outputs of every layer, residual stream at the start layers, and at
    the receiver layers the held streams and the receiver mixers' pre-norm outputs."""
    corrupt_heads: dict[Site, Tensor]
    """Corrupt run: head outputs ``[batch, pos, head, d_head]`` of every sender site."""
    metric: Metric
    direct: bool = False
    """``path="direct"``: D is the clean run from the receiver's layer on, its residual
    stream there plus the senders' own writes (`sender_write`); see `gna_interp.patching.paths`."""
    mlps: tuple[int, ...] = ()
    """path="direct": the layers of the MLP receivers (their norm's input: clean plus the writes)."""


def receiver_streams(model: GnaModel, layer: int, heads: Sequence[int], streams: Sequence[str]) -> dict[Site, list[int]]:
    """The stream sites that carry the change into the receivers ``heads`` of ``layer``:
    for each receiver's mixer, the chosen streams it has, with the receivers' indices in
    that mixer. A receiver whose mixer has none of ``streams`` is an error."""
    chosen: dict[Site, list[int]] = {}
    for head in heads:
        mixer, index = model.mixer_of(Head(layer, head))
        names = [name for name in streams if name in mixer.receiver_inputs]
        if not names:
            have = mixer.receiver_inputs or "none (see the architecture table)"
            kind = "an attention" if mixer.kind is LayerKind.ATTENTION else "an SSM"
            raise GnaValueError(
                f"receiver {Head(layer, head)} is {kind} head whose input streams are {have}: "
                f"receiver_input={list(streams)} names none of them (receiver_input='any' takes any head's output whole)"
            )
        for name in names:
            chosen.setdefault(Site(SiteKind.STREAM, layer, name, mixer.index), []).append(index)
    return chosen


def held_sites(model: GnaModel, chosen: dict[Site, list[int]]) -> dict[Site, list[int]]:
    """Streams that keep their unpatched value when the ``chosen`` ones are patched
    (`gna_interp.core.arch.Stream.holds`), for the same receivers."""
    held: dict[Site, list[int]] = {}
    for site, heads in chosen.items():
        for name in model.mixer(site).stream(site.stream).holds:
            target = held.setdefault(Site(SiteKind.STREAM, site.layer, name, site.mixer), [])
            target += [h for h in heads if h not in target]
    return held


Position = tuple[int, int]
"""``(layer, stage)`` of a head (`gna_interp.GnaModel.head_position`): heads at later
positions can read its output."""


def receiver_positions(model: GnaModel, receivers: dict[int, tuple[int, ...]]) -> dict[Position, list[int]]:
    """Receivers grouped by position, in order: ``(layer, stage) -> head numbers``."""
    grouped: dict[Position, list[int]] = {}
    for layer, heads in receivers.items():
        for head in heads:
            grouped.setdefault(model.head_position(Head(layer, head)), []).append(head)
    return dict(sorted(grouped.items()))


def receiver_mixers(model: GnaModel, layer: int, heads: Sequence[int]) -> dict[Site, list[int]]:
    """The head sites of the receivers ``heads`` of ``layer``, with their indices there."""
    return heads_by_site(model.layout, [Head(layer, head) for head in heads])


def norm_inputs(model: GnaModel, mixers: dict[Site, list[int]]) -> dict[Site, list[int]]:
    """For the receiver mixers whose heads share a group norm (Mamba-2), the sites through
    which every head feeds that norm: its pre-norm output (`SiteKind.PRE_NORM`) and the
    stream that gates it there (`gna_interp.core.arch.MixerSpec.norm_gate`), with the
    receivers' indices."""
    sites: dict[Site, list[int]] = {}
    for site, heads in mixers.items():
        mixer = model.mixer(site)
        if mixer.norm_path:
            sites[Site(SiteKind.PRE_NORM, site.layer, mixer=site.mixer)] = heads
            if mixer.spec.norm_gate:
                sites[Site(SiteKind.STREAM, site.layer, mixer.spec.norm_gate, site.mixer)] = heads
    return sites


def others_mask(model: GnaModel, site: Site, heads: Sequence[int]) -> Tensor:
    """``[1, 1, head | unit, 1]`` bool: True except on ``heads`` (a stream site's units
    must be one per head)."""
    return ~(unit_mask(model, site, heads) if site.kind is SiteKind.STREAM else head_mask(model.layout, site, heads))


def unpatched_sites(model: GnaModel, layer: int, heads: Sequence[int], streams: Sequence[str], whole_output: bool) -> set[Site]:
    """Sites at a receiver layer whose values in C *before* that layer's patch the patch
    needs: the receiver mixers' outputs and pre-norm outputs (what the other heads keep)
    and the held streams."""
    mixers = receiver_mixers(model, layer, heads)
    sites = set(mixers) | set(norm_inputs(model, mixers))
    if not whole_output:
        sites |= set(held_sites(model, receiver_streams(model, layer, heads, streams)))
    return sites


def setup_sites(
    model: GnaModel,
    receivers: dict[int, tuple[int, ...]],
    streams: Sequence[str],
    sender_layers: set[int],
    whole_output: bool,
    direct: bool = False,
    to_logits: bool = False,
) -> set[Site]:
    """The sites the clean run must capture for `PathSetup.clean` (path="direct": also the
    residual stream entering every receiver layer, and the final norm for ``"logits"``)."""
    sites = {site for layer in range(min(sender_layers), model.n_layers) for site in model.head_sites(layer)}
    if direct:
        sites |= {Site(SiteKind.RESID, layer) for layer in [*receivers, *([model.n_layers] if to_logits else [])]}
    sites |= {Site(SiteKind.RESID, layer) for layer in sender_layers | set(receivers) if 0 < layer < model.n_layers}
    for layer, heads in receivers.items():
        sites |= unpatched_sites(model, layer, heads, streams, whole_output)
    return sites


def unit_mask(model: GnaModel, site: Site, heads: Sequence[int]) -> Tensor:
    """``[1, 1, unit, 1]`` bool: the units of stream ``site`` that feed ``heads`` (indices
    in the site's mixer; a shared unit feeds every head of its group)."""
    mixer = model.mixer(site)
    _, units, _ = mixer.stream(site.stream).layout(mixer.dims)
    mask = torch.zeros(1, 1, units, 1, dtype=torch.bool)
    mask[0, 0, [head * units // mixer.n_heads for head in heads], 0] = True
    return mask


def _stack(tensor: Tensor, n_rows: int, copies: int) -> Tensor:
    """``[batch | 1, ...]`` -> ``[copies * batch, ...]``."""
    tensor = tensor.expand(n_rows, *tensor.shape[1:])
    return tensor.repeat(copies, *([1] * (tensor.dim() - 1)))


class _Chunk:
    """One stacked chain of forwards for ``sender_sets`` (one copy of the batch each)."""

    def __init__(self, setup: PathSetup, sender_sets: Sequence[Sequence[Head | str]]) -> None:
        self.s = setup
        model = setup.model
        self.n_rows, self.copies = setup.batch.n_rows, len(sender_sets)
        self.batch = setup.batch.repeat(self.copies)
        self.base = setup.base.tiled(self.n_rows, self.copies)
        self.first = min(sender_position(model, sender) for senders in sender_sets for sender in senders)
        by_site: dict[Site, Tensor] = {}
        for copy, senders in enumerate(sender_sets):
            for head in (s for s in senders if isinstance(s, Head)):  # "embed" (direct) only writes
                site, index = model.head_site(head)
                by_site.setdefault(site, torch.zeros(self.copies, model.site_shape(site)[0], dtype=torch.bool))[copy, index] = True
        # head site -> ([rows, 1, head, 1] bool: sender heads of each copy, [rows, pos, head, d_head] corrupt outputs)
        self.swap: dict[Site, tuple[Tensor, Tensor]] = {}
        for site, mask in by_site.items():
            corrupt = self.stack(setup.corrupt_heads[site])
            self.swap[site] = (mask.repeat_interleave(self.n_rows, 0)[:, None, :, None].to(corrupt.device), corrupt)
        self.c_heads: dict[Site, Tensor] = {}  # head outputs in C, where they differ from clean
        # path="direct": (position, [copies * rows, pos, d_model]) the senders' own writes
        self.writes = stacked_writes(model, setup.clean, setup.corrupt_heads, sender_sets, self.n_rows) if setup.direct else []

    def stack(self, tensor: Tensor) -> Tensor:
        return _stack(tensor, self.n_rows, self.copies)

    def c_head(self, site: Site) -> Tensor:
        if site not in self.c_heads:
            self.c_heads[site] = self.stack(self.s.clean[site])
        return self.c_heads[site]

    def plan(self, start: int) -> Plan:
        plan = Plan()
        plan.extend(self.base)
        if start > 0:
            plan.start = (start, self.stack(self.s.clean[Site(SiteKind.RESID, start)]))
        return plan

    def head_sites(self, start: Position, stop: Position) -> set[Site]:
        """Head sites of every mixer at a position in ``[start, stop)``."""
        specs = self.s.model.layer_specs
        return {Site(SiteKind.HEADS, m.layer, mixer=m.index) for spec in specs for m in spec.mixers if start <= m.position < stop}

    def delta(self, upto: Position) -> Tensor | int:
        """path="direct": the senders' writes before ``upto``, summed (0 without any)."""
        return sum((write for position, write in self.writes if position < upto), 0)

    def direct_run(self, layer: int, resid: Tensor, upto: Position, capture: set[Site], extra: Sequence[tuple[Site, Edit]], keep: int):
        """From block ``layer`` on, with the residual stream there ``resid`` plus the senders'
        own writes before ``upto`` (``layer == n_layers``: straight into the final norm)."""
        plan = Plan()
        plan.extend(self.base)
        if layer > 0:
            plan.start = (layer, resid + self.delta(upto))
        else:  # a start at block 0 is no start (the nnsight backend ignores it): edit the embedding's output
            plan.add(Site(SiteKind.RESID, 0), Edit(torch.ones((), dtype=torch.bool), resid + self.delta(upto)))
        for site, edit in extra:
            plan.add(site, edit)
        out = self.s.model.run_plan(self.batch, plan, capture=capture, logits_to_keep=keep, prefix=False)
        return out.logits, out.acts

    def d_run(
        self, upto: Position, capture: set[Site], extra: Sequence[tuple[Site, Edit]] = (), keep: int = 1
    ) -> tuple[Tensor, dict[Site, Tensor]]:
        """D: every head from the first sender's layer up to position ``upto`` frozen to C,
        the senders swapped in, plus the ``extra`` edits. path="direct": the clean run from
        ``upto``'s layer, its residual stream there plus the senders' writes."""
        if self.s.direct:
            if upto[1] > 0:
                raise GnaValueError(
                    f"path='direct' has no receiver at stage {upto[1]} of block {upto[0]} "
                    "(a head reading another mixer of its block): use path='all'"
                )
            return self.direct_run(upto[0], self.stack(self.s.clean[Site(SiteKind.RESID, upto[0])]), upto, capture, extra, keep)
        plan = self.plan(self.first[0])
        every = torch.ones((), dtype=torch.bool)
        for site in sorted(self.head_sites((self.first[0], 0), upto)):
            value = self.c_head(site)
            if site in self.swap:
                rows, corrupt = self.swap[site]
                value = torch.where(rows, corrupt, value)
            plan.add(site, Edit(every, value))
        for site, edit in extra:
            plan.add(site, edit)
        out = self.s.model.run_plan(self.batch, plan, capture=capture, logits_to_keep=keep, prefix=False)
        return out.logits, out.acts

    def c_run(self, start: int, patches: list[tuple[Site, Edit]], capture: set[Site], keep: int = 1) -> tuple[Tensor, dict[Site, Tensor]]:
        """``keep``: ``logits_to_keep`` (1 where the logits are not read: the final position's alone)."""
        plan = self.plan(start)
        for site, edit in patches:
            plan.add(site, edit)
        out = self.s.model.run_plan(self.batch, plan, capture=capture, logits_to_keep=keep, prefix=False)
        return out.logits, out.acts

    def scores(self) -> list[float]:
        s, model = self.s, self.s.model
        grouped = dict(sorted({**receiver_positions(model, s.receivers), **{(layer, MLP_STAGE): [] for layer in s.mlps}}.items()))
        positions = [p for p in grouped if p > self.first]  # earlier ones receive nothing
        patches: list[tuple[Site, Edit]] = []
        for j, position in enumerate(positions):
            layer, heads = position[0], grouped[position]
            if position[1] == MLP_STAGE:  # an MLP receiver: its norm reads the clean input plus the writes before it
                clean_in = self.stack(s.clean[Site(SiteKind.MLP_IN, layer)])
                patches.append((Site(SiteKind.MLP_IN, layer), Edit(torch.ones((), dtype=torch.bool), clean_in + self.delta(position))))
                continue
            unpatched = unpatched_sites(model, layer, heads, s.streams, s.whole_output)
            if j == 0:  # C is the clean run up to here
                before = {site: self.stack(s.clean[site]) for site in unpatched}
            else:
                below = self.head_sites(positions[0], position)
                _, acts = self.c_run(positions[0][0], patches, below | unpatched)
                self.c_heads.update({site: acts[site] for site in below})
                before = {site: acts[site] for site in unpatched}
            patches += self.layer_patches(position, heads, before)
        end = (model.n_layers, 0)
        if s.to_logits and s.direct:  # the final norm reads C's residual plus the senders' writes
            final = Site(SiteKind.RESID, model.n_layers)
            resid = self.c_run(positions[0][0], patches, {final})[1][final] if positions else self.stack(s.clean[final])
            logits, _ = self.direct_run(model.n_layers, resid, end, set(), (), logits_read(s.metric))
        elif s.to_logits:
            if positions:
                every = self.head_sites(positions[0], end)
                _, acts = self.c_run(positions[0][0], patches, every)
                self.c_heads.update({site: acts[site] for site in every})
            logits, _ = self.d_run(end, set(), keep=logits_read(s.metric))
        else:
            logits, _ = self.c_run(positions[0][0], patches, set(), keep=logits_read(s.metric))
        return [reduce_metric(s.metric(rows), s.metric, self.n_rows) for rows in logits.split(self.n_rows)]

    def layer_patches(self, position: Position, heads: Sequence[int], before: dict[Site, Tensor]) -> list[tuple[Site, Edit]]:
        """The edits of C for the receivers ``heads`` at ``position``, from one D run.
        ``before``: the values in C without them (`unpatched_sites`)."""
        s, model = self.s, self.s.model
        layer = position[0]
        mixers = receiver_mixers(model, layer, heads)
        # The other heads of a receiver's group norm keep their input to it, so that each
        # receiver is normalised with their unpatched outputs.
        others_norm = [
            (site, Edit(others_mask(model, site, idx), before[site])) for site, idx in sorted(norm_inputs(model, mixers).items())
        ]
        if s.whole_output:
            _, d_acts = self.d_run(position, set(mixers), others_norm)
            return [(site, Edit(head_mask(model.layout, site, idx), d_acts[site])) for site, idx in sorted(mixers.items())]
        chosen = receiver_streams(model, layer, heads, s.streams)
        _, d_acts = self.d_run(position, set(chosen))
        edits = [(site, Edit(unit_mask(model, site, idx), d_acts[site])) for site, idx in sorted(chosen.items())]
        edits += [(site, Edit(unit_mask(model, site, idx), before[site])) for site, idx in sorted(held_sites(model, chosen).items())]
        # A shared unit (key/value head, B / C group, Mamba-1's dt / B / C) is patched whole:
        # the other heads that read it get their unpatched outputs back.
        edits += others_norm
        edits += [(site, Edit(~head_mask(model.layout, site, idx), before[site])) for site, idx in sorted(mixers.items())]
        return edits


def path_scores(setup: PathSetup, sender_sets: Sequence[Sequence[Head | str]]) -> list[float]:
    """The metric of the final path-patched run for each sender set, from one stacked chain
    of forwards (``len(sender_sets)`` copies of the batch per forward)."""
    return _Chunk(setup, sender_sets).scores()
