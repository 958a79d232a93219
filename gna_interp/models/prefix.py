"""Prefix reuse across calls: the clean residual streams of the batches a model has run.

A forward whose edits (and skips, and captures) all sit at layer ``>= k`` computes
blocks ``0 .. k-1`` exactly as the clean run does. Inside ``with model.prefix_cache():``
the first forward over a batch also captures its clean residual stream entering every
block (one clean forward, the same that ``evaluate`` runs for its baseline); every
later forward over the same batch (same token ids and mask, compared by content) starts
at its first touched block from the cached stream (`gna_interp.core.plan.Plan.start`):
the earlier blocks are not run again, on either backend. A plain (unedited) forward
then costs the final norm and unembedding alone.

The numbers do not change: the cached stream is the one the full forward would compute
on that batch, and everything after it runs as before (tests compare to 1e-5).

Rows: a batch whose rows are all held by cached entries, whatever chunking filled them
(`evaluate`'s 64-prompt chunks, then a sweep over all the prompts; or the reverse), is
served too: each row is matched by content (its ids and mask, with the batch's width) and
its stream is gathered from an entry that holds it, at the layers every contributing entry
kept. The gathered streams are not stored (they would duplicate the entries): each lookup
gathers the layer its forward starts from (and those it captures), a transient copy. A batch with a
row no entry holds runs in full and is stored, as before.

Forwards that record gradients or read values where the model makes them (attention weights)
are served too, where the cache already holds their batch (`PrefixCache.run_held`): they never
fill it.

Memory: one entry holds ``rows x pos x d_model`` floats per cached layer. Entries keep
the embeddings (the stream entering block 0: a forward that skips blocks ``0 .. k-1``
starts at block ``k`` from them) and every ``stride``-th layer, the smallest stride that
keeps one entry under an eighth of ``max_mb`` (a forward then starts at the latest cached
layer at or before its first touched one); the least recently used entry is dropped beyond ``max_mb``. Remote models
(NDIF) get no cache: their residuals would travel both ways; sessions reuse the prefix
on the server instead. The model must not change inside the block.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence

import torch
from torch import Tensor

from ..backends.base import Backend, RunOutput
from ..core.errors import GnaValueError
from ..core.inputs import Batch
from ..core.plan import Plan, Read, Site, SiteKind

DEFAULT_PREFIX_MB = 1024.0


class PrefixCache:
    """Clean residual streams by batch (see the module docs)."""

    def __init__(self, backend: Backend, n_layers: int, d_model: int, max_mb: float = DEFAULT_PREFIX_MB) -> None:
        """``backend``: what runs the forwards (a `GnaModel`'s); ``n_layers``, ``d_model``: its model's."""
        if not max_mb > 0:
            raise GnaValueError(f"max_mb={max_mb!r} must be > 0")
        self.backend, self.n_layers, self.d_model = backend, n_layers, d_model
        self.max_bytes = int(max_mb * 2**20)
        self.entries: OrderedDict[bytes, dict[int, Tensor]] = OrderedDict()
        self.used = 0
        self.rows_of: dict[bytes, list[bytes]] = {}  # entry key -> its rows' keys (`row_keys`)
        self.holders: dict[bytes, dict[bytes, int]] = {}  # row key -> {entry key: its index there}

    @staticmethod
    def key(batch: Batch) -> bytes:
        digest = hashlib.sha1()
        for tensor in (batch.input_ids, batch.attention_mask):
            digest.update(str(tuple(tensor.shape)).encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.digest()

    @staticmethod
    def row_keys(batch: Batch) -> list[bytes]:
        """One key per row: its token ids and mask, with the batch's width (a row padded to
        another width is another row: its positions differ)."""
        ids = batch.input_ids.detach().cpu().contiguous().numpy()
        mask = batch.attention_mask.detach().cpu().contiguous().numpy()
        head = f"{batch.n_pos} {ids.dtype} {mask.dtype}".encode()
        return [hashlib.sha1(head + ids[row].tobytes() + mask[row].tobytes()).digest() for row in range(batch.n_rows)]

    def lookup(self, batch: Batch) -> Mapping[int, Tensor] | None:
        """The cached stream of ``batch`` by layer: its own entry, else one assembled row by
        row from the entries that hold its rows (`AssembledRows`), else ``None``."""
        key = self.key(batch)
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            return entry
        if not self.entries:
            return None
        held: list[dict[bytes, int]] = []
        for row_key in self.row_keys(batch):
            holders = self.holders.get(row_key)
            if not holders:
                return None  # a row no entry holds
            held.append(holders)
        counts = Counter(key for holders in held for key in holders)
        parts: dict[bytes, tuple[list[int], list[int]]] = {}
        for row, holders in enumerate(held):
            source = max(holders, key=lambda key: counts[key])  # the entry holding most of the batch's rows
            into, taken = parts.setdefault(source, ([], []))
            into.append(row)
            taken.append(holders[source])
        for source in parts:
            self.entries.move_to_end(source)
        return AssembledRows([(self.entries[source], into, taken) for source, (into, taken) in parts.items()], batch.n_rows)

    def layers_to_keep(self, batch: Batch) -> list[int]:
        """Layer 0 (the embeddings: a forward that skips blocks ``0 .. k-1`` with nothing else
        before block ``k`` starts there, as the layer scan's groups do) and layers ``1 .. L``
        at the smallest stride that keeps one entry within budget / 8."""
        n_layers = self.n_layers
        per_layer = batch.n_rows * batch.n_pos * self.d_model * 4
        stride = 1
        while stride < n_layers and per_layer * (1 + len(range(stride, n_layers + 1, stride))) > self.max_bytes // 8:
            stride += 1
        return sorted({0, *range(stride, n_layers + 1, stride), n_layers})

    def run(self, batch: Batch, plan: Plan, capture: Collection[Site] = (), logits_to_keep: int = 0) -> RunOutput:
        """``backend.run(batch, plan, capture, logits_to_keep=...)``, from the cached clean
        prefix where it can. The clean forward that fills the cache for an edited plan
        returns nothing of its logits: it computes the final position's alone."""
        keep = logits_to_keep
        backend, n_layers = self.backend, self.n_layers
        if plan.start is not None:
            return backend.run(batch, plan, capture=capture, logits_to_keep=keep)
        first, resume = plan.reusable_start(n_layers, capture)
        if resume == 0:
            return backend.run(batch, plan, capture=capture, logits_to_keep=keep)
        entry = self.lookup(batch)
        if entry is None:
            layers = self.layers_to_keep(batch)
            sites = {Site(SiteKind.RESID, layer) for layer in layers}
            clean = backend.run(batch, Plan(), capture=sites | set(capture) if not plan else sites, logits_to_keep=keep if not plan else 1)
            entry = self._store(batch, {layer: clean.acts[Site(SiteKind.RESID, layer)] for layer in layers})
            if not plan:
                return RunOutput(logits=clean.logits, acts={site: clean.acts[site] for site in capture})
        if not plan and all(site.kind is SiteKind.RESID and site.layer in entry for site in capture):
            out = backend.run(batch, Plan(start=(n_layers, entry[n_layers])), logits_to_keep=keep)
            return RunOutput(logits=out.logits, acts={site: entry[site.layer] for site in capture})
        resumed = self._resume(batch, plan, entry, (first, resume), capture, keep)
        return resumed or backend.run(batch, plan, capture=capture, logits_to_keep=keep)

    def run_held(
        self,
        batch: Batch,
        plan: Plan,
        capture: Collection[Site] = (),
        logits_to_keep: int = 0,
        *,
        grad: bool = False,
        reads: Sequence[Read] = (),
    ) -> RunOutput | None:
        """A forward with autograd recording (``grad``) or ``reads`` (values read where the
        model makes them) from the cached clean prefix of ``batch``, where the cache already
        holds it and the plan, its captures and its reads leave blocks to skip; else ``None``
        (the caller runs it in full: such a forward never fills the cache). With ``grad`` it
        starts from its own copy of the cached stream, a leaf that records gradients (a
        residual captured at the start is that copy, never the entry): gradients reach every
        edit and capture, all at or after the start (none reaches a skipped block's
        parameters), and every read is made at or after it."""
        if plan.start is not None:
            return None
        where = plan.reusable_start(self.n_layers, capture, reads)
        entry = None if where[1] == 0 else self.lookup(batch)
        return None if entry is None else self._resume(batch, plan, entry, where, capture, logits_to_keep, grad=grad, reads=reads)

    def _resume(
        self,
        batch: Batch,
        plan: Plan,
        entry: Mapping[int, Tensor],
        where: tuple[int, int],
        capture: Collection[Site],
        keep: int,
        grad: bool = False,
        reads: Sequence[Read] = (),
    ) -> RunOutput | None:
        """``plan`` run from ``entry``'s latest cached layer at or before its first touched
        one (``where``: `Plan.reusable_start`'s ``(first, resume)`` for its captures and reads);
        ``None`` where no cached layer serves (the caller runs it in full)."""
        first, resume = where
        source = max((layer for layer in entry if layer <= first), default=None)
        if source is None or (source == 0 and first > 0):  # the embeddings serve only a forward that skips block 0 on
            return None
        start = resume if source == first else source  # past fully skipped blocks only from `first` itself
        stream = entry[source].detach().clone().requires_grad_(True) if grad else entry[source]  # never the entry itself
        resumed = Plan(edits=plan.edits, skips=plan.skips, start=(start, stream))
        return self.backend.run(batch, resumed, capture=capture, reads=reads, logits_to_keep=keep, grad=grad)

    def remember(self, batch: Batch, streams: Mapping[int, Tensor]) -> None:
        """Store ``batch``'s clean residual streams, ``layer -> [rows, pos, d_model]`` at every
        layer of `layers_to_keep`, measured by a forward of the caller's that computed the clean
        run (e.g. attribution's gated forward at ``alpha = 0``: its gates change nothing), as
        if a forward here had filled the cache. Detached; a batch already held is left alone."""
        layers = self.layers_to_keep(batch)
        if self.key(batch) in self.entries or any(layer not in streams for layer in layers):
            return
        self._store(batch, {layer: streams[layer].detach() for layer in layers})

    def _store(self, batch: Batch, entry: dict[int, Tensor]) -> dict[int, Tensor]:
        size = sum(t.numel() * t.element_size() for t in entry.values())
        while self.entries and self.used + size > self.max_bytes:
            dropped_key, dropped = self.entries.popitem(last=False)
            self.used -= sum(t.numel() * t.element_size() for t in dropped.values())
            for row in self.rows_of.pop(dropped_key):
                holders = self.holders[row]
                del holders[dropped_key]
                if not holders:
                    del self.holders[row]
        if size <= self.max_bytes:
            key = self.key(batch)
            self.entries[key] = entry
            self.used += size
            self.rows_of[key] = rows = self.row_keys(batch)
            for index, row in enumerate(rows):
                self.holders.setdefault(row, {}).setdefault(key, index)  # a repeated row: its first index
        return entry


class AssembledRows(Mapping[int, Tensor]):
    """A batch's cached stream gathered row by row from entries that hold its rows: the
    layers every one of them kept; ``self[layer]`` is ``[rows, pos, d_model]``, a view where
    the rows are one contiguous run of one entry, else a copy (made on each access)."""

    def __init__(self, parts: list[tuple[dict[int, Tensor], list[int], list[int]]], n_rows: int) -> None:
        """``parts``: ``(entry, rows of the batch, their indices in the entry)``."""
        self.parts, self.n_rows = parts, n_rows
        self.layers = sorted(set.intersection(*(set(entry) for entry, _, _ in parts)))

    def __contains__(self, layer: object) -> bool:
        return layer in self.layers

    def __iter__(self) -> Iterator[int]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> Tensor:
        if layer not in self.layers:
            raise KeyError(layer)
        if len(self.parts) == 1:
            entry, _, taken = self.parts[0]
            if taken == list(range(taken[0], taken[0] + self.n_rows)):
                return entry[layer][taken[0] : taken[0] + self.n_rows]
        first = self.parts[0][0][layer]
        out = first.new_empty((self.n_rows, *first.shape[1:]))
        for entry, into, taken in self.parts:
            stream = entry[layer]
            out[torch.tensor(into, device=out.device)] = stream[torch.tensor(taken, device=stream.device)]
        return out
