"""nnsight backend: one trace per forward, local or remote (NDIF).

Sites map to module paths in exactly one place, `NNsightBackend.steps`:

- heads of layer ``l``: the input of ``<layers>.l.<mixer>.<out_proj>``, viewed
  ``[batch, pos, head, d_head]``;
- residual stream entering block ``l``: the input of ``<layers>.l`` (``l == n_layers``:
  the input of the final norm);
- a skipped block ``l``: its output is replaced by its input;
- a plan that starts at block ``l``: blocks ``0 .. l-1`` are skipped (not computed) and
  output the given residual stream;
- a `Read` at layer ``l``: ``PATTERN`` is item 1 of ``<layers>.l.<mixer>``'s output (the
  attention weights; HF computes them only with eager attention, so the model's
  ``config._attn_implementation`` is set to ``"eager"`` for that one trace and restored
  after it, exceptions included); ``OUTPUT`` is the output of ``<layers>.l.<mixer>.<name>``;
  ``PARAM`` is the parameter ``<layers>.l.<mixer>.<name>``.

The trace body uses nothing but torch and builtins on plain tensors and ints, so the
same code runs locally, under nnsight's ``remote="local"`` simulation, and on NDIF.
Modules are visited in execution order, as nnsight requires.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import nnsight
import torch

from ..core.arch import ArchSpec
from ..core.plan import Plan, Read, ReadKind, Site, SiteKind
from ..models.inputs import Batch
from .base import RunOutput

# Step opcodes, in the order a block executes them.
_READ_INPUT = 0  # a block's (or the final norm's) input: the residual stream
_READ_HEADS = 1  # the out-projection's input, per head
_SKIP_BLOCK = 2  # write a block's input over its output
_NOT_RUN = 3  # do not run a block; it outputs a given value
_READ_OUTPUT = 4  # a module's output (one item of a tuple output), index-selected
_READ_PARAM = 5  # a module's parameter, index-selected


class NNsightBackend:
    name = "nnsight"

    def __init__(self, envoy: Any, spec: ArchSpec, n_layers: int, n_heads: int, head_dim: int, remote: bool | str = False) -> None:
        self.envoy = envoy
        self.spec = spec
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.remote = remote

    def steps(self, plan: Plan, capture: Collection[Site], reads: Sequence[Read] = ()) -> list[tuple]:
        """The plan as a list of plain tuples ``(op, path, edits, slot, tensor, spec)``,
        sorted in execution order. ``edits`` is a list of ``(mask, value)`` pairs;
        ``slot`` indexes the saved list (or -1); ``tensor`` is the skip's row mask
        (``_SKIP_BLOCK``) or the output of a block that is not run (``_NOT_RUN``);
        ``spec`` is ``(item, attribute, selects)`` for reads (``None`` otherwise)."""
        sites = sorted(set(plan.edits) | set(capture), key=lambda s: (s.layer, s.kind is SiteKind.HEADS))
        order = {site: i for i, site in enumerate(sorted(capture))}
        steps: list[tuple] = []
        for site in sites:
            edits = [(e.mask, e.value) for e in plan.edits.get(site, [])]
            slot = order.get(site, -1)
            if site.kind is SiteKind.HEADS:
                steps.append((site.layer, 1, _READ_HEADS, self.spec.out_proj_path(site.layer), edits, slot, None, None))
            else:
                steps.append((site.layer, 0, _READ_INPUT, self._resid_path(site.layer), edits, slot, None, None))
        for layer, rows in plan.skips.items():
            path = f"{self.spec.layers_path}.{layer}"
            if not any(s[0] == layer and s[2] == _READ_INPUT for s in steps):
                steps.append((layer, 0, _READ_INPUT, path, [], -1, None, None))
            steps.append((layer, 2, _SKIP_BLOCK, path, [], -1, rows, None))
        for i, read in enumerate(reads):
            steps.append(self._read_step(read, len(capture) + i))
        if plan.start is not None:
            start_layer, resid = plan.start
            steps = [s for s in steps if s[0] >= start_layer]
            steps += [(layer, -1, _NOT_RUN, f"{self.spec.layers_path}.{layer}", [], -1, resid, None) for layer in range(start_layer)]
        steps.sort(key=lambda s: (s[0], s[1]))  # stable: reads of one layer keep their order
        return [s[2:] for s in steps]

    def _read_step(self, read: Read, slot: int) -> tuple:
        """Mixer internals run after the block's input and before the out-projection
        (order key 0.5); attention weights come out of the mixer after it (1.5)."""
        mixer = f"{self.spec.layers_path}.{read.layer}.{self.spec.mixer_attr}"
        if read.kind is ReadKind.PATTERN:
            return (read.layer, 1.5, _READ_OUTPUT, mixer, [], slot, None, (1, "", read.selects))
        if read.kind is ReadKind.OUTPUT:
            return (read.layer, 0.5, _READ_OUTPUT, f"{mixer}.{read.name}", [], slot, None, (-1, "", read.selects))
        owner, _, attr = f"{mixer}.{read.name}".rpartition(".")
        return (read.layer, 0.5, _READ_PARAM, owner, [], slot, None, (-1, attr, read.selects))

    def _resid_path(self, layer: int) -> str:
        if layer == self.n_layers:
            return self.spec.final_norm_path
        return f"{self.spec.layers_path}.{layer}"

    @contextmanager
    def _eager_attention(self, needed: bool) -> Iterator[None]:
        """HF returns attention weights only from eager attention: switch to it for one
        trace and restore the previous setting afterwards, exceptions included."""
        config = getattr(self.envoy._module, "config", None)
        if not needed or config is None:
            yield
            return
        previous = config._attn_implementation
        config._attn_implementation = "eager"
        try:
            yield
        finally:
            config._attn_implementation = previous

    def run(self, batch: Batch, plan: Plan, capture: Collection[Site] = (), reads: Sequence[Read] = (), grad: bool = False) -> RunOutput:
        steps = self.steps(plan, capture, reads)
        n_saved = len(capture) + len(reads)
        model = self.envoy
        heads_shape = (self.n_heads, self.head_dim)
        # Two statements on purpose: nnsight captures the source of the trace block itself.
        patterns = any(read.kind is ReadKind.PATTERN for read in reads)
        with torch.set_grad_enabled(grad), self._eager_attention(patterns):  # noqa: SIM117
            with model.trace(input_ids=batch.input_ids, attention_mask=batch.attention_mask, remote=self.remote):
                saved = nnsight.save([None] * n_saved)
                stash = batch.input_ids  # replaced by a block's input before any skip reads it
                for op, path, edits, slot, rows, spec in steps:
                    envoy = model
                    for part in path.split("."):
                        envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
                    if op >= 4:
                        value = envoy.output if op == 4 else getattr(envoy, spec[1]).detach()
                        if spec[0] >= 0:
                            value = value[spec[0]]
                        if value is not None:
                            for dim, index in spec[2]:
                                value = value.index_select(dim, index.to(value.device))
                        saved[slot] = value
                        continue
                    if op == 3:
                        envoy.skip(rows)  # a captured residual, already on the model's device
                        continue
                    if op == 2:
                        output = envoy.output
                        envoy.output = torch.where(rows.to(output.device).view(-1, 1, 1), stash, output)
                        continue
                    act = envoy.input
                    flat_shape = act.shape
                    if op == 1:
                        act = act.reshape(flat_shape[0], flat_shape[1], heads_shape[0], heads_shape[1])
                    for mask, value in edits:
                        act = torch.where(mask.to(act.device), value.to(act.device, act.dtype), act)
                    if edits:
                        envoy.input = act.reshape(flat_shape)
                    if slot >= 0:
                        saved[slot] = act
                    if op == 0:
                        stash = act
                logits = model.output.logits.save()
        acts = {site: saved[i] for i, site in enumerate(sorted(capture))}
        values = [saved[len(capture) + i] for i in range(len(reads))]
        for read, value in zip(reads, values, strict=True):
            if value is None:
                raise RuntimeError(
                    f"layer {read.layer} returned no attention weights: the model (remote={self.remote!r}) runs attention "
                    "without computing them; load it with attn_implementation='eager'"
                )
        if not grad:
            acts = {site: value.detach() for site, value in acts.items()}
            values = [value.detach() for value in values]
            logits = logits.detach()
        return RunOutput(logits=logits, acts=acts, reads=values)
