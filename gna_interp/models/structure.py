"""Structural facts about a loaded model's blocks that decide what a measurement means:
whether a block is its one mixer (`mixer_is_the_block`), whether ablating every head of a
layer is the same forward as skipping it (`ablating_every_head_skips`), and whether a
head's output stays at its own position until the next layer (`acts_where_it_writes`).
Read from the architecture table (``model.arch``, ``model.layer_specs``) and the module's
parameters; nothing runs a forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.heads import Head

if TYPE_CHECKING:
    from .handle import GnaModel


def mixer_is_the_block(model: GnaModel, layer: int) -> bool:
    """Whether ``layer``'s block is its one token mixer and norms (Mamba-1, Falcon-Mamba,
    pure Mamba-2): no MLP and no second mixer, so removing the block (the layer scan)
    removes its heads and nothing else. Every block parameter outside the mixer must be a
    vector (a norm's weight or bias), and the architecture must be pre-norm
    (`ArchSpec.pre_norm_residual`: nothing but the residual add after the mixer)."""
    mixers = model.layer_specs[layer].mixers
    if len(mixers) != 1 or not model.arch.pre_norm_residual:
        return False
    block = model.hf_model.get_submodule(model.arch.block_path(layer))
    inside = {id(p) for p in block.get_submodule(mixers[0].spec.path).parameters()}
    return all(p.dim() <= 1 for p in block.parameters() if id(p) not in inside)


def ablating_every_head_skips(model: GnaModel, layer: int) -> bool:
    """Whether ablating every head of ``layer`` (zero) is the same forward as skipping the
    layer (`SkipLayers`, the layer scan): its block is its one mixer (`mixer_is_the_block`)
    and the mixer's out-projection has no bias, so zero head outputs write exactly zero and
    the block passes its residual through."""
    if not mixer_is_the_block(model, layer):
        return False
    mixer = model.layer_specs[layer].mixers[0]
    out_proj = model.hf_model.get_submodule(mixer.out_proj_path)
    return getattr(out_proj, "bias", None) is None


def acts_where_it_writes(model: GnaModel, head: Head) -> bool:
    """Whether the head's output at position ``t`` reaches only the residual stream at
    ``t`` before the next layer: not so when a later mixer of its own block reads it (a
    Zamba2 hybrid layer's Mamba-2 scans its shared attention's output across positions).
    Such heads get no entry measurement; their labels come from the patterns."""
    layer, stage = model.head_position(head)
    return all(mixer.spec.stage <= stage for mixer in model.layer_specs[layer].mixers)
