"""What implicit attention needs, read from a real forward: each SSM layer's ``dt``,
``A``, ``B``, ``C`` and ``D`` for the requested heads.

One recipe per family says which mixer outputs and parameters to read (a `Read` each,
in execution order) and how to finish them into `SSMInputs`. Only the columns the
requested heads need are read, so little travels (this also runs on NDIF):

- Mamba-2: the ``in_proj`` output's ``B`` / ``C`` columns of the heads' groups and the
  heads' ``dt`` columns. ``B`` and ``C`` pass through the mixer's depthwise causal conv
  and activation inside HF's forward as plain functions (no module to hook), so the conv
  is applied here to the read columns with the read conv weights; then padding positions
  are zeroed exactly as HF does (``apply_mask_to_padding_states`` after the conv).
- Mamba-1: the ``x_proj`` output (low-rank ``dt``, ``B``, ``C``; its input is already
  masked on padding); FalconMamba: the outputs of its ``dt`` / ``B`` / ``C`` RMS norms.
  ``dt = softplus(dt_proj.weight @ dt_low + dt_proj.bias)`` for the requested channels.

Tests check every field against the arguments of HF's own scan call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.plan import Read, ReadKind


@dataclass
class SSMInputs:
    """The selective SSM of one layer for ``head`` = the requested heads, in float32.

    Attributes:
        dt: ``[batch, pos, head]`` step sizes (after bias, softplus and clamp).
        A: ``[head]`` (Mamba-2: a scalar per head) or ``[head, state]`` (Mamba-1).
        B, C: ``[batch, pos, head, state]`` (Mamba-2: the head's group) or
            ``[batch, pos, state]`` (Mamba-1: shared by every channel).
        D: ``[head]`` skip weights.
        mask: ``[batch, pos]`` bool, True on real tokens.
    """

    dt: Tensor
    A: Tensor
    B: Tensor
    C: Tensor
    D: Tensor
    mask: Tensor

    @property
    def scalar_decay(self) -> bool:
        """Mamba-2 (one decay rate per head) rather than Mamba-1 (one per channel and state)."""
        return self.A.dim() == 1


class Mamba2Recipe:
    """``in_proj`` output = ``[gate | x | B (groups x state) | C (groups x state) | dt (heads)]``."""

    def _layout(self, config: Any, heads: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        inner = int(config.expand * config.hidden_size)
        n_groups, n_state = int(config.n_groups), int(config.state_size)
        groups = torch.unique(heads // (int(config.num_heads) // n_groups))
        state = torch.arange(n_state)
        b_cols = (2 * inner + groups[:, None] * n_state + state).flatten()
        columns = torch.cat([b_cols, b_cols + n_groups * n_state, 2 * inner + 2 * n_groups * n_state + heads])
        return groups, columns, columns[: 2 * len(b_cols)] - inner  # conv channels of the B / C columns

    def reads(self, config: Any, layer: int, heads: Tensor) -> list[Read]:
        _, columns, channels = self._layout(config, heads)
        reads = [Read(ReadKind.OUTPUT, layer, "in_proj", ((-1, columns),)), Read(ReadKind.PARAM, layer, "conv1d.weight", ((0, channels),))]
        if config.use_conv_bias:
            reads.append(Read(ReadKind.PARAM, layer, "conv1d.bias", ((0, channels),)))
        return reads + [Read(ReadKind.PARAM, layer, name, ((0, heads),)) for name in ("dt_bias", "A_log", "D")]

    def build(self, config: Any, values: list[Tensor], heads: Tensor, mask: Tensor) -> SSMInputs:
        from transformers.activations import ACT2FN

        projected, weight, *rest = (value.float() for value in values)
        bias = rest.pop(0) if config.use_conv_bias else None
        dt_bias, a_log, skip = rest
        groups, _, channels = self._layout(config, heads)
        n_pos, n_bc = projected.shape[1], len(channels)
        conv = F.conv1d(projected[..., :n_bc].transpose(1, 2), weight, bias, padding=weight.shape[-1] - 1, groups=n_bc)
        bc = ACT2FN[config.hidden_act](conv[..., :n_pos]).transpose(1, 2) * mask[..., None]
        b_state, c_state = bc.unflatten(-1, (2, len(groups), int(config.state_size))).unbind(2)
        which = torch.searchsorted(groups, heads // (int(config.num_heads) // int(config.n_groups)))
        low, high = config.time_step_limit
        dt = F.softplus(projected[..., n_bc:] + dt_bias).clamp(low, high)
        return SSMInputs(dt, -torch.exp(a_log), b_state[:, :, which], c_state[:, :, which], skip, mask)


class Mamba1Recipe:
    """Mamba-1 reads ``x_proj``'s output; FalconMamba (``norms=True``) its three RMS norms'."""

    def __init__(self, norms: bool) -> None:
        self.norms = norms

    def reads(self, config: Any, layer: int, heads: Tensor) -> list[Read]:
        names = ("dt_layernorm", "b_layernorm", "c_layernorm") if self.norms else ("x_proj",)
        outputs = [Read(ReadKind.OUTPUT, layer, name) for name in names]
        return outputs + [Read(ReadKind.PARAM, layer, name, ((0, heads),)) for name in ("dt_proj.weight", "dt_proj.bias", "A_log", "D")]

    def build(self, config: Any, values: list[Tensor], heads: Tensor, mask: Tensor) -> SSMInputs:
        floats = [value.float() for value in values]
        if self.norms:
            dt_low, b_state, c_state = floats[:3]
        else:
            n_state = int(config.state_size)
            dt_low, b_state, c_state = floats[0].split([floats[0].shape[-1] - 2 * n_state, n_state, n_state], dim=-1)
        weight, bias, a_log, skip = floats[-4:]
        dt = F.softplus(dt_low @ weight.T + bias)
        return SSMInputs(dt, -torch.exp(a_log), b_state, c_state, skip, mask)


SSM_RECIPES: dict[str, Mamba2Recipe | Mamba1Recipe] = {
    "mamba2": Mamba2Recipe(),
    "mamba": Mamba1Recipe(norms=False),
    "falcon_mamba": Mamba1Recipe(norms=True),
}
"""Family (``ArchSpec.family``) -> how to read its SSM. A new SSM family is a row here."""


def recipe_for(family: str) -> Mamba2Recipe | Mamba1Recipe:
    recipe = SSM_RECIPES.get(family)
    if recipe is None:
        raise ValueError(f"implicit attention is not implemented for the {family!r} family: supported are {sorted(SSM_RECIPES)}")
    return recipe
