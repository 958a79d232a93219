"""Turning user position specs (query rows, sets of key positions) into index tensors.

Positions index the padded batch (left padding): ``-1`` is every prompt's final token,
``0`` the first column (padding in the shorter prompts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..core.errors import GnaTypeError, GnaValueError

QueryPositions = int | Sequence[int] | Tensor | None
"""Which query rows to compute: ``None`` (all), an int or a list of ints (the same rows
in every prompt; negative counts from the end), a ``[batch]`` integer tensor (one row per
prompt, e.g. each prompt's final position) or a ``[batch, query]`` integer tensor."""

KeyPositions = Sequence[int] | Sequence[Sequence[int]] | Tensor
"""A set of key positions: a list of ints (the same in every prompt), a list of int lists
(one per prompt), an integer tensor ``[batch, k]`` of ``k`` positions per prompt (e.g. an
encoded task's ``segment_ends``; ``final[:, None]`` for one), or a bool mask ``[key]``,
``[batch, key]`` or ``[batch, query, key]``."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(index: Tensor, n_pos: int, what: str) -> Tensor:
    bad = (index < -n_pos) | (index >= n_pos)
    if bool(bad.any()):
        value = int(index[bad][0])
        raise GnaValueError(f"{what} {value} out of range: the batch has {n_pos} positions (valid: {-n_pos}..{n_pos - 1})")
    return torch.where(index < 0, index + n_pos, index)


def query_rows(query_positions: QueryPositions, n_rows: int, n_pos: int) -> Tensor:
    """``[batch, query]`` long tensor of absolute query positions (see `QueryPositions`)."""
    if query_positions is None:
        return torch.arange(n_pos).expand(n_rows, n_pos)
    if _is_int(query_positions):
        query_positions = [query_positions]  # type: ignore[list-item]
    if isinstance(query_positions, Tensor):
        rows = query_positions.detach().cpu()
        if rows.dtype.is_floating_point or rows.dtype == torch.bool or rows.dim() not in (1, 2) or rows.shape[0] != n_rows:
            raise GnaValueError(
                f"query_positions tensor must be integer [batch] or [batch, query] with batch={n_rows}, "
                f"got {tuple(rows.shape)} {rows.dtype}"
            )
        rows = rows.long().view(n_rows, -1)
    elif isinstance(query_positions, Sequence) and not isinstance(query_positions, str):
        items = list(query_positions)
        if not all(_is_int(p) for p in items):
            raise GnaTypeError(f"query_positions must be ints, got {query_positions!r}")
        rows = torch.tensor(items, dtype=torch.long).expand(n_rows, len(items))
    else:
        raise GnaTypeError(f"query_positions must be None, an int, a list of ints or an integer tensor, got {query_positions!r}")
    if rows.shape[1] == 0:
        raise GnaValueError("query_positions is empty: give at least one position, or None for every row")
    return _check_range(rows, n_pos, "query position")


def key_mask(keys: KeyPositions, n_rows: int, n_query: int, n_key: int) -> Tensor:
    """``[batch, query, key]`` bool mask of the key set (see `KeyPositions`)."""
    if isinstance(keys, Tensor) and keys.dtype != torch.bool:
        if keys.is_floating_point() or keys.is_complex() or keys.dim() != 2:
            raise GnaValueError(
                f"a key-position tensor must be integer positions [batch, k] (one position per prompt: t[:, None]) or a "
                f"bool mask; got {keys.dtype} of shape {tuple(keys.shape)} (a list of ints gives positions shared by every prompt)"
            )
        keys = keys.tolist()
    if isinstance(keys, Tensor):
        shaped = keys[None, None, :] if keys.dim() == 1 else keys[:, None, :] if keys.dim() == 2 else keys
        if shaped.dim() != 3 or shaped.shape[0] not in (1, n_rows) or shaped.shape[1] not in (1, n_query) or shaped.shape[2] != n_key:
            raise GnaValueError(
                f"key mask of shape {tuple(keys.shape)} does not fit patterns of {n_rows} prompts x {n_query} queries x {n_key} keys"
            )
        return shaped.expand(n_rows, n_query, n_key)
    if not isinstance(keys, Sequence) or isinstance(keys, str):
        raise GnaTypeError(
            f"key positions must be a list of ints, a list of int lists, an integer [batch, k] tensor or a bool mask, got {keys!r}"
        )
    shared = all(_is_int(k) for k in keys)
    per_row: list[list[Any]] = [list(keys)] * n_rows if shared else [list(row) for row in keys]  # type: ignore[arg-type]
    if len(per_row) != n_rows:
        raise GnaValueError(f"key positions give {len(per_row)} lists, expected one per prompt ({n_rows})")
    mask = torch.zeros(n_rows, n_key, dtype=torch.bool)
    for row, items in enumerate(per_row):
        if not all(_is_int(k) for k in items):
            raise GnaTypeError(f"key positions must be ints, got {items!r}")
        if items:
            mask[row, _check_range(torch.tensor(items, dtype=torch.long), n_key, "key position")] = True
    return mask[:, None, :].expand(n_rows, n_query, n_key)
