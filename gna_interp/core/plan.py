"""Compiled interventions: plain tensor edits at layer-level sites.

A `Plan` is what a backend applies during one forward. It holds only tensors and
ints, so the nnsight backend can ship it to a remote server unchanged.

At a site, every `Edit` applies ``act = torch.where(mask, value, act)`` in order (an edit
whose ``mask`` is floating point is a *gate*: ``act = act + mask * (value - act)``, a
mixing weight per element that may require grad; integrated gradients differentiate
the metric with respect to it, `gna_interp.patching.attribution`; a *straight-through*
edit writes the same value but passes the gradient on to ``act`` unchanged,
`gna_interp.patching.edges`):

- `SiteKind.HEADS` at layer ``l``, mixer ``m``: ``act`` is ``[batch, pos, head, d_head]``,
  the input of that mixer's out-projection viewed per head (``head`` indexes the mixer's
  own heads; a layer with an attention and an SSM mixer has two head sites, see
  `gna_interp.core.arch.LayerSpec`).
- `SiteKind.RESID` at layer ``l``: ``act`` is ``[batch, pos, d_model]``, the residual
  stream entering block ``l`` (``l == n_layers``: entering the final norm).
- `SiteKind.STREAM` at layer ``l`` with ``stream`` a name from the architecture's
  `gna_interp.core.arch.Stream` table (``"q"``, ``"x"``, ``"B"``, ...) of mixer ``m``:
  ``act`` is ``[batch, pos, unit, width]``, that stream's columns of its module's output
  (or input).
- `SiteKind.PRE_NORM` at layer ``l``, mixer ``m``: ``act`` is ``[batch, pos, head, d_head]``,
  the first input of the mixer's group norm (`gna_interp.core.arch.LayerMixer.norm_path`:
  Mamba-2's scan output ``y`` per head, before the gate and the normalisation, which
  couples the heads of a group). Only mixers with such a norm have this site.
- `SiteKind.MLP_IN` / `SiteKind.MLP_OUT` at layer ``l``: ``act`` is ``[batch, pos, d_model]``,
  the input of block ``l``'s MLP norm (the residual stream the MLP reads; editing it changes
  what the MLP sees and nothing else) / the MLP's output (what it adds to the residual
  stream). Only families whose table row names the MLP (`gna_interp.core.arch.ArchSpec.mlp`).

A skip at layer ``l`` makes block ``l`` output its own input on the rows given.

``Plan.start = (l, resid)`` begins the forward at block ``l`` from the residual stream
``resid`` ``[batch, pos, d_model]`` (blocks before ``l`` are not computed): sweeps use it
to reuse the clean prefix that every variant of a chunk shares.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum

import torch
from torch import Tensor

from .errors import GnaValueError


class SiteKind(str, Enum):
    RESID = "resid"
    HEADS = "heads"
    STREAM = "stream"
    PRE_NORM = "pre_norm"
    MLP_IN = "mlp_in"
    MLP_OUT = "mlp_out"


@dataclass(frozen=True, order=True)
class Site:
    """A layer-level activation: all heads of one mixer of a layer (their outputs, or
    their outputs before the mixer's group norm), the residual stream, or one input
    stream of all heads of one mixer (``stream`` names it; empty for the other kinds).
    ``mixer`` indexes the layer's mixers in head-numbering order (0 in every layer of a
    pure family)."""

    kind: SiteKind
    layer: int
    stream: str = ""
    mixer: int = 0

    def describe(self) -> str:
        """``"heads site at layer 1, mixer 0"``, ``"stream 'x' site at layer 2, mixer 0"``,
        ``"resid site at layer 3"``: the site in an error message."""
        name = f"stream {self.stream!r}" if self.kind is SiteKind.STREAM else self.kind.value
        within = f", mixer {self.mixer}" if self.kind in (SiteKind.HEADS, SiteKind.STREAM, SiteKind.PRE_NORM) else ""
        return f"{name} site at layer {self.layer}{within}"


class ReadKind(str, Enum):
    PATTERN = "pattern"
    """Softmax attention probabilities of an attention layer, ``[batch, head, query, key]``."""
    OUTPUT = "output"
    """The output of a submodule of a layer's mixer (e.g. ``in_proj``), as the model computes it."""
    PARAM = "param"
    """A parameter of a layer's mixer (e.g. ``A_log`` or ``dt_proj.weight``)."""


@dataclass(frozen=True, eq=False)
class Read:
    """A value read during a forward besides the sites: what attention analysis needs.

    ``name`` is a dotted path relative to the layer's mixer number ``mixer`` (``OUTPUT``:
    a submodule; ``PARAM``: ``submodule.parameter`` or a parameter or buffer of the mixer
    itself); unused for ``PATTERN``. ``selects`` are ``index_select(dim, index)`` calls applied in order
    where the value is read (so only the selected part travels, e.g. from NDIF).
    """

    kind: ReadKind
    layer: int
    name: str = ""
    selects: tuple[tuple[int, Tensor], ...] = ()
    mixer: int = 0


@dataclass(frozen=True)
class Ref:
    """A tensor another forward of the same batch of jobs captures
    (`gna_interp.backends.jobs`): job ``job``'s activation at ``site``, repeated ``copies``
    times along the batch. On a remote model it never travels: the server captures it and
    uses it in the same request."""

    job: int
    site: Site
    copies: int = 1


@dataclass
class Edit:
    """``act = where(mask, value, act)`` for a bool ``mask``; for a floating ``mask`` ``w``
    (a gate), ``act = act + w * (value - act)``: ``w = 0`` keeps the activation, ``w = 1``
    replaces it, and ``w`` may require grad. Both broadcast to the site's activation.

    ``straight_through=True``: the same forward value, but ``d result / d act`` is the
    identity, as if the site were not edited (``value`` and a gate keep their own
    gradients): a run moved to a point of an integration path whose backward still runs
    through every node downstream of the site."""

    mask: Tensor
    value: Tensor
    straight_through: bool = False

    def tiled(self, n_rows: int, copies: int) -> Edit:
        return Edit(_tile_rows(self.mask, n_rows, copies), _tile_rows(self.value, n_rows, copies), self.straight_through)


def _tile_rows(tensor: Tensor, n_rows: int, copies: int) -> Tensor:
    """Repeat a per-row tensor ``copies`` times along batch; leave broadcast ones alone."""
    if tensor.dim() == 0 or tensor.shape[0] == 1:
        return tensor
    if tensor.shape[0] != n_rows:
        raise GnaValueError(f"edit tensor has {tensor.shape[0]} rows, expected {n_rows} or 1")
    return tensor.repeat(copies, *([1] * (tensor.dim() - 1)))


def apply_edits(act: Tensor, edits: list[Edit]) -> Tensor:
    for edit in edits:
        act = apply_edit(act, edit.mask, edit.value, edit.straight_through)
    return act


def apply_edit(act: Tensor, mask: Tensor, value: Tensor, straight_through: bool = False) -> Tensor:
    """One edit (see `Edit`): a bool ``mask`` selects, a floating one mixes."""
    if straight_through:  # the edited value exactly (act - act.detach() is 0), the gradient to act whole
        return apply_edit(act.detach(), mask, value) + (act - act.detach())
    value = value.to(act.device, act.dtype)
    if mask.dtype.is_floating_point:
        return act + mask.to(act.device, act.dtype) * (value - act)
    return torch.where(mask.to(act.device), value, act)


@dataclass
class Plan:
    """Edits and block skips for one forward over a batch of ``n_rows`` rows."""

    edits: dict[Site, list[Edit]] = field(default_factory=dict)
    skips: dict[int, Tensor] = field(default_factory=dict)
    """layer -> ``[batch]`` bool: rows on which the block is skipped."""
    start: tuple[int, Tensor | Ref] | None = None
    """``(layer, resid [batch, pos, d_model])``: begin at that block from that residual
    (a `Ref`: the residual another job of a batch of jobs captures)."""

    def add(self, site: Site, edit: Edit) -> None:
        self.edits.setdefault(site, []).append(edit)

    def add_skip(self, layer: int, rows: Tensor) -> None:
        previous = self.skips.get(layer)
        self.skips[layer] = rows if previous is None else (previous | rows)

    def extend(self, other: Plan) -> None:
        for site, edits in other.edits.items():
            for edit in edits:
                self.add(site, edit)
        for layer, rows in other.skips.items():
            self.add_skip(layer, rows)

    def tiled(self, n_rows: int, copies: int) -> Plan:
        """This plan for a batch made of ``copies`` stacked copies of the original."""
        tiled = Plan()
        for site, edits in self.edits.items():
            tiled.edits[site] = [edit.tiled(n_rows, copies) for edit in edits]
        for layer, rows in self.skips.items():
            tiled.skips[layer] = _tile_rows(rows, n_rows, copies)
        if self.start is not None:
            layer, resid = self.start
            tiled.start = (
                layer,
                Ref(resid.job, resid.site, resid.copies * copies) if isinstance(resid, Ref) else _tile_rows(resid, n_rows, copies),
            )
        return tiled

    def rows(self, n_rows: int, index: slice) -> Plan:
        """This plan for the rows ``index`` of its ``n_rows``-row batch (per-row tensors
        sliced, broadcast ones kept)."""

        def cut(tensor: Tensor) -> Tensor:
            return tensor[index] if tensor.dim() > 0 and tensor.shape[0] == n_rows and n_rows > 1 else tensor

        part = Plan()
        for site, edits in self.edits.items():
            part.edits[site] = [Edit(cut(edit.mask), cut(edit.value), edit.straight_through) for edit in edits]
        part.skips = {layer: cut(rows) for layer, rows in self.skips.items()}
        if self.start is not None:
            layer, resid = self.start
            if isinstance(resid, Ref):
                raise GnaValueError("a plan that starts from another job's residual (a Ref) cannot be cut into rows")
            part.start = (layer, cut(resid))
        return part

    @property
    def start_layer(self) -> int:
        """The first block this plan's forward evaluates (0 without a `start`)."""
        return 0 if self.start is None else self.start[0]

    def reusable_start(self, n_layers: int, capture: Collection[Site] = (), reads: Sequence[Read] = ()) -> tuple[int, int]:
        """Where a forward of this plan can begin from the *unedited* run's residual stream:
        ``(first, resume)``. ``first`` is its first edited, skipped, captured or read layer (a
        parameter's read too: a backend reads it where its layer runs; ``n_layers`` when it
        touches nothing): blocks before it compute what the unedited run computes. ``resume >=
        first`` moves on past blocks skipped on every row with nothing edited or captured in
        them (the residual passes through those unchanged): the forward can begin at block
        ``resume`` from the unedited residual entering block ``first`` (``Truncate(k)``:
        ``(k, n_layers)``, no block runs). Meaningful only without a `start`."""
        touched = {site.layer for site in [*self.edits, *capture]} | {read.layer for read in reads}
        first = min([*touched, *self.skips, n_layers])
        resume = first
        while resume < n_layers and resume not in touched and bool(self.skips.get(resume, torch.zeros(1, dtype=torch.bool)).all()):
            resume += 1
        return first, resume

    def __bool__(self) -> bool:
        return bool(self.edits) or bool(self.skips) or self.start is not None
