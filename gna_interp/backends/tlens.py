"""TransformerLens backend: a `TransformerBridge` with hooks scoped to one forward.

Sites map to hook names in exactly one place, `hook_name`:

- heads of layer ``l``: ``blocks.{l}.attn.hook_z`` (``[batch, pos, head, d_head]``, the
  input of ``o_proj`` per head);
- residual stream entering block ``l``: ``blocks.{l}.hook_resid_pre``, or
  ``ln_final.hook_in`` for ``l == n_layers``;
- input stream ``q`` / ``k`` / ``v`` of layer ``l``: ``blocks.{l}.attn.hook_q`` /
  ``hook_k`` / ``hook_v`` (``[batch, pos, head | kv_head, d_head]``, before RoPE: the
  ``q_proj`` / ``k_proj`` / ``v_proj`` outputs per head, as the architecture table lays
  them out);
- a skipped block ``l`` stashes ``blocks.{l}.hook_resid_pre`` and writes it over
  ``blocks.{l}.hook_resid_post``;
- a plan that starts at block ``l > 0`` does not run blocks ``0 .. l-1``: for that one
  forward each of them returns the given residual stream instead of computing (its
  ``forward`` is shadowed on the instance and restored afterwards, exceptions included;
  the bridge's own ``start_at_layer`` still computes the earlier blocks). Generic over
  block types: only the block's return structure (``block_output``) is needed. ``l ==
  n_layers`` runs no block at all: the final norm and unembedding of the given stream;
- a `Read` of attention probabilities at layer ``l``: ``blocks.{l}.attn.hook_pattern``
  (``[batch, head, query, key]``); other reads (SSM internals) need the nnsight backend.

Note: booting a bridge wraps the HF model's modules in place; the HF model still
computes the same function.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ..core.plan import Plan, Read, ReadKind, Site, SiteKind, apply_edits
from ..cost import charge_forward
from ..models.inputs import Batch
from .base import RunOutput

HookFn = Callable[..., Tensor]

# Input streams (`SiteKind.STREAM`) TransformerLens exposes, by table name.
_STREAM_HOOKS = {"q": "hook_q", "k": "hook_k", "v": "hook_v"}


class TLensBackend:
    name = "tlens"

    def __init__(self, bridge: Any, n_layers: int, block_output: int = 0) -> None:
        self.bridge = bridge
        self.n_layers = n_layers
        self.block_output = block_output
        """``0``: a block returns its hidden state as a tensor; ``n``: a tuple of ``n`` items."""

    def hook_name(self, site: Site) -> str:
        if site.kind is SiteKind.HEADS:
            return f"blocks.{site.layer}.attn.hook_z"
        if site.kind is SiteKind.STREAM:
            if site.stream not in _STREAM_HOOKS:
                raise ValueError(f"backend 'tlens' has no input stream {site.stream!r}: expected one of {sorted(_STREAM_HOOKS)}")
            return f"blocks.{site.layer}.attn.{_STREAM_HOOKS[site.stream]}"
        if site.layer == self.n_layers:
            return "ln_final.hook_in"
        return f"blocks.{site.layer}.hook_resid_pre"

    def read_hook_name(self, read: Read) -> str:
        if read.kind is not ReadKind.PATTERN:
            raise ValueError(f"backend 'tlens' cannot read {read.kind.value} {read.name!r} of layer {read.layer}: use backend='nnsight'")
        return f"blocks.{read.layer}.attn.hook_pattern"

    def run(self, batch: Batch, plan: Plan, capture: Collection[Site] = (), reads: Sequence[Read] = (), grad: bool = False) -> RunOutput:
        captured: dict[Site, Tensor] = {}
        values: list[Tensor] = [torch.empty(0)] * len(reads)
        stash: dict[int, Tensor] = {}
        hooks: dict[str, list[HookFn]] = {}

        for site in sorted(set(plan.edits) | set(capture)):
            hooks.setdefault(self.hook_name(site), []).append(_site_hook(site, plan.edits.get(site, []), site in capture, captured, grad))
        for layer, rows in plan.skips.items():
            hooks.setdefault(f"blocks.{layer}.hook_resid_pre", []).append(_stash_hook(layer, stash))
            hooks.setdefault(f"blocks.{layer}.hook_resid_post", []).append(_skip_hook(layer, rows, stash))
        for slot, read in enumerate(reads):
            hooks.setdefault(self.read_hook_name(read), []).append(_read_hook(read, slot, values, grad))

        fwd_hooks = [(name, fn) for name, fns in hooks.items() for fn in fns]
        charge_forward(self, batch.n_rows, plan.start_layer, self.n_layers)
        start_layer, start_input = (None, batch.input_ids) if plan.start is None or plan.start[0] > 0 else plan.start
        with torch.set_grad_enabled(grad), self.bridge.hooks(fwd_hooks=fwd_hooks), self._not_run(plan):
            logits = self.bridge(start_input, start_at_layer=start_layer, attention_mask=batch.attention_mask)
        return RunOutput(logits=logits, acts=captured, reads=values)

    @contextmanager
    def _not_run(self, plan: Plan) -> Iterator[None]:
        """Blocks before ``plan.start``'s layer return its residual without computing, for
        the forward inside the block; each block's own ``forward`` is restored on exit."""
        if plan.start is None or plan.start[0] == 0:
            yield
            return
        layer, resid = plan.start
        output = resid if self.block_output == 0 else (resid, *([None] * (self.block_output - 1)))
        blocks = [self.bridge.blocks[index] for index in range(layer)]
        saved = [block.__dict__.get("forward", _UNSET) for block in blocks]  # e.g. accelerate's wrapper

        def passes_resid(*args: Any, **kwargs: Any) -> Any:
            return output

        try:
            for block in blocks:
                object.__setattr__(block, "forward", passes_resid)  # the bridge's __setattr__ forwards to the HF module
            yield
        finally:
            for block, previous in zip(blocks, saved, strict=True):
                if previous is _UNSET:
                    block.__dict__.pop("forward", None)
                else:
                    object.__setattr__(block, "forward", previous)


_UNSET = object()


def _site_hook(site: Site, edits: list, keep: bool, captured: dict[Site, Tensor], grad: bool) -> HookFn:
    def hook(act: Tensor, hook: Any = None) -> Tensor:
        act = apply_edits(act, edits)
        if keep:
            captured[site] = act if grad else act.detach()
        return act

    return hook


def _stash_hook(layer: int, stash: dict[int, Tensor]) -> HookFn:
    def hook(act: Tensor, hook: Any = None) -> Tensor:
        stash[layer] = act
        return act

    return hook


def _skip_hook(layer: int, rows: Tensor, stash: dict[int, Tensor]) -> HookFn:
    def hook(act: Tensor, hook: Any = None) -> Tensor:
        return torch.where(rows.to(act.device).view(-1, 1, 1), stash.pop(layer), act)

    return hook


def _read_hook(read: Read, slot: int, values: list[Tensor], grad: bool) -> HookFn:
    def hook(act: Tensor, hook: Any = None) -> Tensor:
        value = act
        for dim, index in read.selects:
            value = value.index_select(dim, index.to(value.device))
        values[slot] = value if grad else value.detach()
        return act

    return hook
