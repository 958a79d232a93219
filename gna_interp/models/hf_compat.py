"""Calls into transformers helpers whose parameter names change between releases.

The package allows a range of transformers releases (``pyproject.toml``). Where a helper's
keywords were renamed inside that range, the right name is read from the helper's own
signature here, once, rather than from version strings at each call site. Every entry is
listed in ``docs/dependencies.md`` ("Upstream surface") with the test that catches a change.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
from torch import Tensor

from ..core.errors import GnaTypeError


@cache
def _parameters(function: Callable[..., Any]) -> frozenset[str]:
    """The keyword names ``function`` accepts (decorators that keep ``__wrapped__`` are seen through)."""
    return frozenset(inspect.signature(function).parameters)


def _pick(function: Callable[..., Any], *candidates: str) -> str:
    names = _parameters(function)
    for name in candidates:
        if name in names:
            return name
    raise GnaTypeError(
        f"{getattr(function, '__qualname__', function)!r} takes none of the parameters {list(candidates)} "
        f"(it takes {sorted(names)}): this transformers release is outside the range gna_interp supports"
    )


# What a model's forward calls its cache: ``cache`` from transformers 5.24 on; before that
# ``past_key_values`` (attention models) or ``cache_params`` (Mamba, Mamba-2, hybrids).
CACHE_KEYWORDS = ("cache", "past_key_values", "cache_params")


def passed_cache(kwargs: dict[str, Any]) -> Any:
    """The cache a caller handed a block or model in ``kwargs``, under whichever name, or None."""
    return next((kwargs[name] for name in CACHE_KEYWORDS if kwargs.get(name) is not None), None)


def cache_keyword(forward: Callable[..., Any]) -> str:
    """The name under which ``forward`` (a model's or a block's) takes its cache."""
    return _pick(forward, *CACHE_KEYWORDS)


def returned_cache(output: Any) -> Any:
    """The cache a model's forward returned (``output.cache`` from 5.24 on; ``past_key_values``
    or ``cache_params`` before), or None."""
    return next((getattr(output, name) for name in CACHE_KEYWORDS if getattr(output, name, None) is not None), None)


def build_causal_mask(
    make_mask: Callable[..., Any],
    config: Any,
    hidden_states: Tensor,
    attention_mask: Tensor | None,
    position_ids: Tensor,
) -> Any:
    """A causal mask from ``make_mask`` (``create_causal_mask`` or
    ``create_sliding_window_causal_mask`` of ``transformers.masking_utils``) for a forward
    with no cache.

    hidden_states: [batch, pos, d_model]; attention_mask: [batch, pos] padding mask or None;
    position_ids: [batch or 1, pos]. Returns whatever the helper returns for the config's
    attention kernel (a [batch, 1, pos, pos] mask, or None where the kernel needs none).

    transformers 5.24 renamed the cache parameter ``past_key_values`` to ``cache`` (the old
    name warns, and goes in 5.40); earlier releases name the embeddings ``input_embeds`` and
    ask for ``cache_position``. Each name is taken from the helper's signature.
    """
    kwargs: dict[str, Any] = {
        "config": config,
        _pick(make_mask, "inputs_embeds", "input_embeds"): hidden_states,
        "attention_mask": attention_mask,
        _pick(make_mask, "cache", "past_key_values"): None,
        "position_ids": position_ids,
    }
    if "cache_position" in _parameters(make_mask):
        kwargs["cache_position"] = torch.arange(hidden_states.shape[1], device=hidden_states.device)  # no cache: 0..T-1
    return make_mask(**kwargs)
