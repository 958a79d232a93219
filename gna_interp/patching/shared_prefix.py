"""Variants that edit the early blocks alike share those blocks' computation.

`run_variants` already starts each variant at the first block it touches, from the
baseline's residual stream there. Variants whose edits *agree* on blocks ``f .. d-1`` (the
same sites, masks and values, the same skipped blocks) also compute the same residual
stream entering block ``d``: one of them, the group's *leader*, runs from ``f`` and captures
it; the others, its *members*, start at ``d`` from that capture. A group of ``m`` members
saves ``m * (d - f)`` blocks per row.

MIB's circuit score is the case that made this worth doing: the circuits of its smaller
sizes keep a few heads of the middle layers and corrupt every head of the early ones, the
same edits in each (a 32-layer deep toy: four of seven variants agree on 15 blocks).

Agreement is exact and conservative: masks compared by content, values by content when
they are scalars and by identity (the same tensor storage) otherwise. A residual-stream
edit at block ``d`` itself rules ``d`` out as the branch point (the capture there would
precede or follow the edit depending on the backend).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..core.plan import Edit, Site, SiteKind


class Variant(Protocol):
    """What grouping reads of a `gna_interp.patching.variants.Variant` (which imports this module)."""

    edits: list[tuple[Site, Edit]]
    skip_layers: tuple[int, ...]

    @property
    def first_layer(self) -> int: ...


@dataclass
class SharedPrefix:
    """A leader and the members that start from its residual stream entering block ``layer``."""

    leader: int
    members: list[int]
    layer: int


def shared_prefix_groups(variants: Sequence[Variant], n_layers: int) -> list[SharedPrefix]:
    """Groups of variants (indices) that agree on every block before their branch layer.

    Greedy over the blocks saved: the (branch layer, agreeing set) that saves the most
    blocks is taken first (its first variant leads), its variants leave every other set,
    and so on while some set of two or more saves a block. Variants in no group run alone
    as before. ``[]`` when nothing is shared (the common case of single-site sweeps:
    each variant edits one block, where they all differ)."""
    # only a variant editing two or more blocks can agree with another on a block and differ later
    multi = [i for i, v in enumerate(variants) if len({site.layer for site, _ in v.edits} | set(v.skip_layers)) > 1]
    resid_edited = {i: {site.layer for site, _ in variants[i].edits if site.kind is SiteKind.RESID} for i in multi}
    # (first layer, branch layer d, digest of blocks first .. d-1) -> the variants agreeing there
    buckets: dict[tuple[int, int, bytes], list[int]] = {}
    for index in multi:
        first, keys = variants[index].first_layer, _layer_keys(variants[index], n_layers)
        digest = b""
        for layer in range(first + 1, n_layers):
            digest = hashlib.blake2b(digest + repr(keys[layer - 1]).encode(), digest_size=16).digest()
            buckets.setdefault((first, layer, digest), []).append(index)
    heap = [(-(len(m) - 1) * (key[1] - key[0]), key) for key, m in buckets.items() if len(m) > 1]
    heapq.heapify(heap)
    taken: set[int] = set()
    groups: list[SharedPrefix] = []
    while heap:
        saving, key = heapq.heappop(heap)
        first, layer = key[0], key[1]
        free = [i for i in buckets[key] if i not in taken and layer not in resid_edited[i]]
        now = -(len(free) - 1) * (layer - first) if len(free) > 1 else 0
        if now == 0:
            continue
        if now != saving:  # some were taken by a better group since: re-rank this set
            buckets[key] = free
            heapq.heappush(heap, (now, key))
            continue
        groups.append(SharedPrefix(free[0], free[1:], layer))
        taken.update(free)
    return groups


def _layer_keys(variant: Variant, n_layers: int) -> list[tuple[Any, ...]]:
    """Per block, a hashable description of what ``variant`` does there (its edits by
    site, and whether it skips the block): equal keys, equal computation."""
    keys: list[list[Any]] = [[] for _ in range(n_layers)]
    for site, edit in variant.edits:
        keys[site.layer].append((site, *_edit_key(edit)))
    for layer in variant.skip_layers:
        keys[layer].append(("skip",))
    return [tuple(sorted(items, key=repr)) for items in keys]


def _edit_key(edit: Edit) -> tuple[Any, ...]:
    mask = edit.mask.detach()
    raw = mask.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()  # any dtype, as bytes
    mask_key = (tuple(mask.shape), str(mask.dtype), hashlib.blake2b(raw, digest_size=16).digest())
    value = edit.value.detach()
    if value.dim() == 0:
        value_key: tuple[Any, ...] = ("scalar", float(value), str(value.dtype))
    else:  # by identity: the same storage, offset, shape and strides hold the same numbers
        value_key = ("tensor", value.data_ptr(), tuple(value.shape), value.stride(), str(value.dtype), str(value.device))
    return (mask_key, value_key, edit.straight_through)
