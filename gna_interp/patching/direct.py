"""``path="direct"``: what one node writes into the residual stream.

The nodes of the direct graph (EAP's, MIB's, TransformerLens's edge granularity): heads
(`Head`, printed ``"L1H0"``), ``"embed"`` (the embedding: a sender), ``"L{l}MLP"`` (block
``l``'s MLP: a sender through its output, a receiver through its norm's input) and
``"logits"`` (the final norm's residual input: a receiver).

The edge of TransformerLens (``patching.get_act_patch_direct_path``), EAP and MIB: a
receiver reads the residual stream of the run it belongs to *plus the senders' own writes*
(their clean-to-corrupt change, through their out-projection), with nothing downstream of
the senders recomputed on the way (`gna_interp.patching.paths` teaches both definitions).
"""

from __future__ import annotations

import re
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
LOGITS = "logits"
"""The logits as a receiver: the final norm's residual input."""
MLP_STAGE = 9
"""A block's MLP runs after every mixer of the block (stages 0, 1): its position is ``(layer, 9)``."""
_MLP_NAME = re.compile(r"^L(\d+)MLP$")


def mlp_name(layer: int) -> str:
    """The node name of block ``layer``'s MLP: ``"L0MLP"`` (as `Head` prints ``"L0H1"``)."""
    return f"L{layer}MLP"


def mlp_layer(node: object) -> int | None:
    """The layer of an MLP node name (``"L3MLP"`` -> 3); ``None`` for anything else."""
    match = _MLP_NAME.match(node) if isinstance(node, str) else None
    return int(match.group(1)) if match else None


def check_mlp(model: GnaModel, node: str) -> int:
    """The layer of the MLP node ``node``, checked against the model."""
    layer = mlp_layer(node)
    assert layer is not None
    if not model.arch.mlp:
        raise GnaValueError(
            f"{node!r}: the {model.arch.family} family has no MLP node (pure SSMs have no MLP; "
            "the architecture row names none): its direct graph has heads, 'embed' and 'logits'"
        )
    if layer >= model.n_layers:
        raise GnaValueError(f"{node!r}: the model has {model.n_layers} layers (MLP nodes 'L0MLP' .. 'L{model.n_layers - 1}MLP')")
    return layer


def node_position(model: GnaModel, node: Head | str) -> tuple[int, int]:
    """``GnaModel.head_position``, with the embedding before every block, a block's MLP
    after its mixers (`MLP_STAGE`) and the logits after the last block."""
    if node == EMBED:
        return (-1, 0)
    if node == LOGITS:
        return (model.n_layers, 0)
    layer = mlp_layer(node)
    return (layer, MLP_STAGE) if layer is not None else model.head_position(node)  # type: ignore[arg-type]


sender_position = node_position


def write_sites(model: GnaModel, node: Head | str) -> set[Site]:
    """The sites whose clean and corrupt values give ``node``'s write (`node_write`)."""
    if node == EMBED:
        return {Site(SiteKind.RESID, 0)}
    layer = mlp_layer(node)
    if layer is not None:
        return {Site(SiteKind.MLP_OUT, layer)}
    return {model.head_site(node)[0]}  # type: ignore[arg-type]


def node_write(model: GnaModel, node: Head | str, clean: dict[Site, Tensor], corrupt: dict[Site, Tensor]) -> Tensor:
    """What ``node`` adds to the residual stream, corrupt minus clean: ``[batch | 1, pos, d_model]``
    (a head: `sender_write`; the embedding: the residual stream entering block 0; an MLP:
    its output)."""
    if isinstance(node, Head):
        site = model.head_site(node)[0]
        return sender_write(model, node, *torch.broadcast_tensors(clean[site], corrupt[site]))
    (site,) = write_sites(model, node)
    return corrupt[site] - clean[site]


def stacked_writes(
    model: GnaModel, clean: dict[Site, Tensor], corrupt: dict[Site, Tensor], sender_sets: Sequence[Sequence[Head | str]], n_rows: int
) -> list[tuple[tuple[int, int], Tensor]]:
    """``(position, [copies * rows, pos, d_model])`` per position of a sender, in position
    order: the writes of the senders there, each in its own copy's rows of a stack of
    ``len(sender_sets)`` copies of the batch (zero elsewhere), summed. One tensor per position,
    not per sender: thousands of senders (channel heads) take no more memory than a few."""
    copies = len(sender_sets)
    by_position: dict[tuple[int, int], Tensor] = {}
    for copy, senders in enumerate(sender_sets):
        for sender in senders:
            write = node_write(model, sender, clean, corrupt).expand(n_rows, -1, -1)
            position = node_position(model, sender)
            if position not in by_position:
                by_position[position] = write.new_zeros((copies * n_rows, *write.shape[1:]))
            by_position[position][copy * n_rows : (copy + 1) * n_rows] += write
    return sorted(by_position.items())
