"""Head pruning for toy training: a pruned head's output is zero and stays zero.

The weight entries that carry a pruned head's output are zero and stay zero (attention:
q, own k / v, o; Mamba-2: gate and out-projection), so its output is identically zero in
weight space: no hook at inference, and a model fine-tuned with it pruned learns to do
without it. For attention this is zero-ablation of the head; for Mamba-2 it also takes
the head out of the gated norm that its group shares. A pruned Mamba-2 head's other
parameters (x, dt, conv, shared B / C) still run, so its implicit attention is still
defined, though nothing reads its output. HF configs give every layer the same number
of heads, so this is how a toy gets fewer heads in one layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..core.dims import Layout, mamba2_gate, q_columns
from ..core.errors import GnaValueError
from ..core.heads import Head
from ..models.mixers import attention_dims, mamba2_dims

Masks = dict[torch.nn.Parameter, torch.Tensor]
"""Per parameter, a 0/1 tensor of its shape: 0 on the pruned heads' entries."""


Entries = list[tuple[torch.nn.Parameter, tuple[slice, ...]]]
"""Per parameter, the index of a head's entries."""


def _unit(layout: Layout, dims: Any, index: int) -> slice:
    """The columns of unit ``index`` in a projection's output, by the library's layouts."""
    first, _, width = layout(dims)
    return slice(first + index * width, first + (index + 1) * width)


def _check_head(head: Head, n_heads: int) -> None:
    if not 0 <= head.head < n_heads:
        raise GnaValueError(f"head {head}: layer {head.layer} has heads 0..{n_heads - 1}")


def _attention_entries(model: Any, head: Head) -> Entries:
    """Llama-like attention: the head's rows of q (and of k, v without grouped-query
    sharing) and its columns of o."""
    attention, dims = model.model.layers[head.layer].self_attn, attention_dims(model.config)
    _check_head(head, dims.heads)
    rows = _unit(q_columns, dims, head.head)
    own = [attention.q_proj]
    if dims.kv_heads == dims.heads:  # k, v are the head's own (the same rows as q)
        own += [attention.k_proj, attention.v_proj]
    entries: Entries = [(attention.o_proj.weight, (slice(None), rows))]
    for projection in own:
        entries.append((projection.weight, (rows, slice(None))))
        if projection.bias is not None:  # Qwen2
            entries.append((projection.bias, (rows,)))
    return entries


def _mamba2_entries(model: Any, head: Head) -> Entries:
    """Mamba-2: the head's gate rows of the in-projection and its out-projection columns.
    With ``z = 0`` its gated channels are ``y * silu(0) = 0`` before the gated norm, so
    the norm, which spans every head of a group, no longer depends on the pruned head
    (zero-ablation at the library's head site, after the norm, leaves that dependence)."""
    mixer, dims = model.backbone.layers[head.layer].mixer, mamba2_dims(model.config)
    _check_head(head, dims.heads)
    gate = _unit(mamba2_gate, dims, head.head)  # z comes first, so its rows are also the head's channels
    entries: Entries = [(mixer.in_proj.weight, (gate, slice(None))), (mixer.out_proj.weight, (slice(None), gate))]
    if mixer.in_proj.bias is not None:
        entries.append((mixer.in_proj.bias, (gate,)))
    return entries


_ENTRIES = {"llama": _attention_entries, "mistral": _attention_entries, "qwen2": _attention_entries, "mamba2": _mamba2_entries}


def head_masks(model: Any, heads: Iterable[Head | str]) -> Masks:
    """The masks of ``heads`` in an HF ``*ForCausalLM`` (the model is left as it is).

    Args:
        model: a Llama-like (``llama``, ``mistral``, ``qwen2``) or ``mamba2`` model
            (any family when ``heads`` is empty: no masks).
        heads: `Head`s or their names (``"L1H3"``).
    """
    heads = list(heads)
    family = model.config.model_type
    if heads and family not in _ENTRIES:  # nothing to prune: any family trains
        raise GnaValueError(f"pruning heads of a {family!r} model is not supported: expected one of {sorted(_ENTRIES)}")
    masks: Masks = {}
    n_layers = model.config.num_hidden_layers
    for item in heads:
        head = Head.parse(item) if isinstance(item, str) else item
        if not 0 <= head.layer < n_layers:
            raise GnaValueError(f"head {head}: the model has layers 0..{n_layers - 1}")
        for parameter, index in _ENTRIES[family](model, head):
            masks.setdefault(parameter, torch.ones_like(parameter))[index] = 0
    return masks


def prune_heads(model: Any, heads: Iterable[Head | str]) -> Masks:
    """Zero the weight entries of ``heads`` (in place; see `head_masks`).

    Returns:
        the masks, for `frozen_at_zero` during training.
    """
    masks = head_masks(model, heads)
    with torch.no_grad():
        for parameter, mask in masks.items():
            parameter.mul_(mask)
    return masks


@contextmanager
def frozen_at_zero(masks: Masks) -> Iterator[None]:
    """Inside the block, gradients of the pruned entries are zeroed, so that AdamW
    (zero gradient, zero moments, decoupled decay of 0) leaves them at exactly 0. The
    gradient hooks are removed on exit, also when the block raises."""
    handles = [parameter.register_hook(lambda grad, mask=mask: grad * mask) for parameter, mask in masks.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def still_pruned(masks: Masks) -> bool:
    """Whether every pruned entry is still exactly 0."""
    return all(not bool((parameter.detach() * (1 - mask)).any()) for parameter, mask in masks.items())
