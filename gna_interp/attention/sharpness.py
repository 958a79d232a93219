"""How sharp is a pattern row? Metrics over the key axis, batched over everything else.

Implicit attention is signed and not normalised, so every metric first turns a row into
a distribution over keys: ``p_s = |w_s| / sum_k |w_k|``. For softmax rows this is the row
itself. A row with no mass (a padding query) has no distribution: its metrics are NaN.

- `entropy`: ``-sum_s p_s log p_s`` in nats; 0 for a one-hot row, ``log n`` for uniform
  over ``n`` keys. Lower is sharper.
- `top1_mass`: ``max_s p_s``; 1 for a one-hot row. Higher is sharper.
- `mass_on`: ``sum_{s in S} p_s`` for a set of key positions ``S`` (segment ends, the
  correct option's span...).

Each maps ``[..., key]`` to ``[...]``, e.g. ``[batch, head, query, key] -> [batch, head, query]``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..core.errors import GnaTypeError, GnaValueError
from ..core.keywords import suggest_keywords
from .positions import KeyPositions, key_mask

Normalize = Literal["abs", "row"] | None
NORMALIZE_OPTIONS = (None, "abs", "row")


def _check_pattern(pattern: object, call: str) -> None:
    """A clear `TypeError` for a pattern that is not a tensor (a task, prompts, a list)."""
    if not isinstance(pattern, Tensor):
        text = repr(pattern)
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise GnaTypeError(
            f"{call}: pattern={shown} ({type(pattern).__name__}): expected a tensor [..., key] of attention weights, "
            "e.g. gna.attention_pattern(model, task, heads, query_positions=[-1])"
        )


def _distribution(pattern: Tensor, call: str = "entropy") -> Tensor:
    _check_pattern(pattern, call)
    if pattern.dim() < 1 or pattern.shape[-1] == 0:
        raise GnaValueError(f"expected a pattern [..., key] with at least one key, got shape {tuple(pattern.shape)}")
    weights = pattern.abs().float()
    total = weights.sum(-1, keepdim=True)
    return weights / torch.where(total > 0, total, torch.nan)


@suggest_keywords
def entropy(pattern: Tensor) -> Tensor:
    """Entropy (nats) of each row as a distribution of ``|weights|``: ``[..., key] -> [...]``."""
    p = _distribution(pattern)
    terms = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0)
    return torch.where(p.isnan().any(-1), torch.nan, -terms.sum(-1))


@suggest_keywords
def top1_mass(pattern: Tensor) -> Tensor:
    """Largest share of a row's ``|weights|`` on one key: ``[..., key] -> [...]``."""
    return _distribution(pattern, "top1_mass").max(-1).values


@suggest_keywords
def mass_on(pattern: Tensor, keys: KeyPositions) -> Tensor:
    """Share of each row's ``|weights|`` on the key positions ``keys``.

    Args:
        pattern: ``[batch, head, query, key]``.
        keys: see `KeyPositions`: a list of positions (the same in every prompt; negative
            counts from the end), one list per prompt, an integer tensor ``[batch, k]``
            (e.g. ``segment_ends``), or a bool mask ``[key]``, ``[batch, key]`` or
            ``[batch, query, key]``.

    Returns:
        ``[batch, head, query]``.
    """
    _check_pattern(pattern, "mass_on")
    if pattern.dim() != 4:
        raise GnaValueError(f"mass_on expects a pattern [batch, head, query, key], got shape {tuple(pattern.shape)}")
    n_rows, _, n_query, n_key = pattern.shape
    chosen = key_mask(keys, n_rows, n_query, n_key).to(pattern.device)
    return (_distribution(pattern) * chosen[:, None]).sum(-1)


def normalize_rows(pattern: Tensor, how: Normalize) -> Tensor:
    """For display: ``None`` (unchanged), ``"abs"`` (``|w|``) or ``"row"`` (``|w|`` over its
    row sum; rows with no mass stay zero)."""
    if how is None:
        return pattern
    if how == "abs":
        return pattern.abs()
    if how == "row":
        weights = pattern.abs()
        return weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    raise GnaValueError(f"normalize={how!r}: expected one of {NORMALIZE_OPTIONS}")
