"""``path="direct"``: what one head writes into the residual stream.

The edge of TransformerLens (``patching.get_act_patch_direct_path``), EAP and MIB: a
receiver reads the residual stream of the run it belongs to *plus the senders' own writes*
(their clean-to-corrupt change, through their out-projection), with nothing downstream of
the senders recomputed on the way (`gna_interp.patching.paths` teaches both definitions).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..core.arch import LayerKind
from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.plan import Site, SiteKind

if TYPE_CHECKING:
    from ..models.handle import GnaModel


def write_scale(model: GnaModel, site: Site) -> float:
    """The factor between a mixer's out-projection output and what it adds to the residual
    stream (FalconH1's ``attention_out_multiplier`` / ``ssm_out_multiplier``; 1 elsewhere).
    A family with anything else after the out-projection (``pre_norm_residual`` unset, or
    a ``residual_multiplier``) has no direct path here."""
    config = model.hf_model.config
    if not model.arch.pre_norm_residual or getattr(config, "residual_multiplier", 1.0) != 1.0:
        raise GnaValueError(
            f"path='direct' needs blocks that add each mixer's out-projection to the residual stream unchanged; "
            f"{model.arch.family} does not (pre_norm_residual unset or a residual_multiplier): use path='all'"
        )
    if config.model_type == "falcon_h1":
        attention = model.mixer(site).kind is LayerKind.ATTENTION
        return float(getattr(config, "attention_out_multiplier" if attention else "ssm_out_multiplier"))
    return 1.0


def sender_write(model: GnaModel, head: Head, clean: Tensor, corrupt: Tensor) -> Tensor:
    """What changes in the residual stream when ``head``'s output (its slice of the
    out-projection input, ``clean`` / ``corrupt`` ``[batch, pos, head, d_head]`` of its whole
    site) goes from clean to corrupt and nothing else changes: ``[batch, pos, d_model]``.
    The out-projection is linear, so its bias cancels."""
    site, index = model.head_site(head)
    mixer = model.mixer(site)
    weight = model.hf_model.get_submodule(mixer.out_proj_path).weight.detach()  # [d_model, n_heads * d_head]
    width = mixer.head_dim
    delta = (corrupt[:, :, index] - clean[:, :, index]).to(weight.device, weight.dtype)
    columns = weight[:, index * width : (index + 1) * width]
    return (delta @ columns.T) * write_scale(model, site)


EMBED = "embed"
"""The embedding as a sender (path="direct" only): its write is the corrupt-minus-clean
residual stream entering block 0."""


def sender_position(model: GnaModel, sender: Head | str) -> tuple[int, int]:
    """``GnaModel.head_position``, with the embedding before every block."""
    return (-1, 0) if sender == EMBED else model.head_position(sender)  # type: ignore[arg-type]


def stacked_writes(
    model: GnaModel, clean: dict[Site, Tensor], corrupt: dict[Site, Tensor], sender_sets: Sequence[Sequence[Head | str]], n_rows: int
) -> list[tuple[tuple[int, int], Tensor]]:
    """``(position, [copies * rows, pos, d_model])``: each sender's write, in its own copy's
    rows of a stack of ``len(sender_sets)`` copies of the batch (zero elsewhere)."""
    copies = len(sender_sets)
    writes = []
    for copy, senders in enumerate(sender_sets):
        for sender in senders:
            if sender == EMBED:
                site = Site(SiteKind.RESID, 0)
                write = (corrupt[site] - clean[site]).expand(n_rows, -1, -1)
            else:
                assert isinstance(sender, Head)
                site = model.head_site(sender)[0]
                write = sender_write(model, sender, *torch.broadcast_tensors(clean[site], corrupt[site])).expand(n_rows, -1, -1)
            mask = (torch.arange(copies) == copy).repeat_interleave(n_rows)[:, None, None].to(write.device)
            writes.append((sender_position(model, sender), torch.where(mask, write.repeat(copies, 1, 1), 0.0)))
    return writes
