"""Softmax attention patterns: the probabilities the model computes.

- ``tlens``: the bridge's ``blocks.{l}.attn.hook_pattern`` (an attention the bridge does
  not wrap: item 1 of its output, as on nnsight);
- ``nnsight``: the attention weights HF returns from eager attention (both backends switch
  the model to eager attention for that one forward and restore it).

Both are ``[batch, head, query, key]``; only the requested heads and the query rows
any prompt asks for are kept where they are read. Padding queries (whose rows HF fills
with a uniform distribution) and padding keys are set to zero here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.plan import Read, ReadKind
from .implicit import allowed_keys


def softmax_read(layer: int, heads: Tensor, rows: Tensor, mixer: int = 0) -> tuple[Read, Tensor]:
    """A `Read` of the heads' probabilities (indices in the layer's attention mixer
    ``mixer``) on the union of the query rows, and that union."""
    union = torch.unique(rows)
    return Read(ReadKind.PATTERN, layer, selects=((1, heads), (2, union)), mixer=mixer), union


def softmax_rows(value: Tensor, rows: Tensor, union: Tensor, mask: Tensor) -> Tensor:
    """``value [batch, head, union, key]`` -> ``[batch, head, query, key]`` float32 at ``rows``."""
    value = value.float()
    rows, mask = rows.to(value.device), mask.to(value.device)
    where = torch.searchsorted(union.to(value.device), rows.contiguous())  # [batch, query]: index into the union
    index = where[:, None, :, None].expand(value.shape[0], value.shape[1], rows.shape[1], value.shape[3])
    return value.gather(2, index) * allowed_keys(rows, mask)
