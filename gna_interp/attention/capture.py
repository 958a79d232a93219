"""What implicit attention needs, read from a real forward: each SSM layer's ``dt``,
``A``, ``B``, ``C`` and ``D`` for the requested heads.

One recipe per SSM flavour says which mixer outputs and parameters to read (a `Read` each,
in execution order) and how to finish them into `SSMInputs`. Only the columns the
requested heads need are read, so little travels (this also runs on NDIF):

- Mamba-2 (also the Mamba-2 mixers of Zamba2, Bamba, GraniteMoeHybrid, NemotronH and
  FalconH1): the ``in_proj`` output's ``B`` / ``C`` columns of the heads' groups and the
  heads' ``dt`` columns (FalconH1: times the same columns of its ``mup_vector``). ``B``
  and ``C`` pass through the mixer's depthwise causal conv and activation inside HF's
  forward as plain functions (no module to hook), so the conv is applied here to the
  read columns with the read conv weights; then padding positions are zeroed exactly as
  HF does (``apply_mask_to_padding_states`` after the conv).
- Mamba-1: the ``x_proj`` output (low-rank ``dt``, ``B``, ``C``; its input is already
  masked on padding); FalconMamba and Jamba: the outputs of their ``dt`` / ``B`` / ``C``
  RMS norms.
  ``dt = softplus(dt_proj.weight @ dt_low + dt_proj.bias)`` for the requested channels.
- Discrete Mamba-2 (Llamba): the ``B`` / ``C`` columns of the heads' qk heads and the
  heads' ``A_log`` columns of the ``in_proj`` output, the conv applied here as for Mamba-2;
  decay ``softplus(A_log)``, ``A = -1``, no step-size factor on the input.
- Gated DeltaNet (Qwen3-Next): the ``in_proj_qkvz`` columns of the query / key heads
  the value heads use, their conv, the ``b`` / ``a`` columns of ``in_proj_ba``, and
  ``A_log``, ``dt_bias`` (`DeltaInputs`).

Tests check every field against the arguments of HF's own scan call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.dims import DeltaNetDims, Mamba1Dims, Mamba2Dims
from ..core.errors import GnaValueError
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
        weight: ``[batch, pos, head]``, what key ``s``'s input is scaled by (Mamba-2:
            ``dt_s``, the default when ``None``); a Discrete Mamba-2 (Llamba) has none
            (ones): its kernel's ``x / a`` cancels the step size.
    """

    dt: Tensor
    A: Tensor
    B: Tensor
    C: Tensor
    D: Tensor
    mask: Tensor
    weight: Tensor | None = None

    @property
    def scalar_decay(self) -> bool:
        """Mamba-2 (one decay rate per head) rather than Mamba-1 (one per channel and state)."""
        return self.A.dim() == 1


class Mamba2Recipe:
    """``in_proj`` output = ``[gate | x | B (groups x state) | C (groups x state) | dt (heads)]``."""

    def _layout(self, d: Mamba2Dims, heads: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        groups = torch.unique(heads // (d.heads // d.groups))
        state = torch.arange(d.state)
        b_cols = (2 * d.inner + groups[:, None] * d.state + state).flatten()
        columns = torch.cat([b_cols, b_cols + d.groups * d.state, 2 * d.inner + 2 * d.groups * d.state + heads])
        return groups, columns, columns[: 2 * len(b_cols)] - d.inner  # conv channels of the B / C columns

    def reads(self, d: Mamba2Dims, layer: int, mixer: int, heads: Tensor) -> list[Read]:
        _, columns, channels = self._layout(d, heads)
        reads = [
            Read(ReadKind.OUTPUT, layer, "in_proj", ((-1, columns),), mixer),
            Read(ReadKind.PARAM, layer, "conv1d.weight", ((0, channels),), mixer),
        ]
        if d.conv_bias:
            reads.append(Read(ReadKind.PARAM, layer, "conv1d.bias", ((0, channels),), mixer))
        if d.in_scale:
            reads.append(Read(ReadKind.PARAM, layer, "mup_vector", ((2, columns),), mixer))
        return reads + [Read(ReadKind.PARAM, layer, name, ((0, heads),), mixer) for name in ("dt_bias", "A_log", "D")]

    def build(self, d: Mamba2Dims, values: list[Tensor], heads: Tensor, mask: Tensor) -> SSMInputs:
        from transformers.activations import ACT2FN

        projected, weight, *rest = (value.float() for value in values)
        bias = rest.pop(0) if d.conv_bias else None
        if d.in_scale:
            projected = projected * rest.pop(0)
        dt_bias, a_log, skip = rest
        groups, _, channels = self._layout(d, heads)
        n_pos, n_bc = projected.shape[1], len(channels)
        conv = F.conv1d(projected[..., :n_bc].transpose(1, 2), weight, bias, padding=weight.shape[-1] - 1, groups=n_bc)
        bc = ACT2FN[d.act](conv[..., :n_pos]).transpose(1, 2) * mask[..., None]
        b_state, c_state = bc.unflatten(-1, (2, len(groups), d.state)).unbind(2)
        which = torch.searchsorted(groups, heads // (d.heads // d.groups))
        low, high = d.dt_limit
        dt = F.softplus(projected[..., n_bc:] + dt_bias).clamp(low, high)
        return SSMInputs(dt, -torch.exp(a_log), b_state[:, :, which], c_state[:, :, which], skip, mask)


class Mamba1Recipe:
    """Mamba-1 reads ``x_proj``'s output; FalconMamba and Jamba (``norms=True``) the outputs
    of their ``dt`` / ``B`` / ``C`` RMS norms."""

    def __init__(self, norms: bool) -> None:
        self.norms = norms

    def reads(self, d: Mamba1Dims, layer: int, mixer: int, heads: Tensor) -> list[Read]:
        names = ("dt_layernorm", "b_layernorm", "c_layernorm") if self.norms else ("x_proj",)
        outputs = [Read(ReadKind.OUTPUT, layer, name, mixer=mixer) for name in names]
        params = ("dt_proj.weight", "dt_proj.bias", "A_log", "D")
        return outputs + [Read(ReadKind.PARAM, layer, name, ((0, heads),), mixer) for name in params]

    def build(self, d: Mamba1Dims, values: list[Tensor], heads: Tensor, mask: Tensor) -> SSMInputs:
        floats = [value.float() for value in values]
        if self.norms:
            dt_low, b_state, c_state = floats[:3]
        else:
            dt_low, b_state, c_state = floats[0].split([d.rank, d.state, d.state], dim=-1)
        weight, bias, a_log, skip = floats[-4:]
        dt = F.softplus(dt_low @ weight.T + bias)
        return SSMInputs(dt, -torch.exp(a_log), b_state, c_state, skip, mask)


class DiscreteMamba2Recipe:
    """Llamba's mixer: ``in_proj`` output = ``[x | B (qk heads x state) | C | z | A_log
    (heads)]``. ``B`` / ``C`` pass through the depthwise causal conv inside the forward
    (on a GPU as a fused kernel), so the conv is applied here to the read columns with the
    read conv weights, after zeroing padding (what the family's pad guard does: see
    `gna_interp.models.mixers.discrete_mamba2_pad_guard`). The decay is
    ``a = softplus(A_log)`` with ``A = -1`` and no input scaling (``weight`` = 1):
    ``M[t, s] = (C_t . B_s) exp(-sum_{k=s+1..t} a_k)``."""

    def _layout(self, d: Mamba2Dims, heads: Tensor) -> tuple[Tensor, Tensor]:
        groups = torch.unique(heads // (d.heads // d.groups))
        b_cols = (d.inner + groups[:, None] * d.state + torch.arange(d.state)).flatten()
        return groups, torch.cat([b_cols, b_cols + d.groups * d.state])  # B, C columns = their conv channels

    def reads(self, d: Mamba2Dims, layer: int, mixer: int, heads: Tensor) -> list[Read]:
        _, channels = self._layout(d, heads)
        decay = 2 * d.inner + 2 * d.groups * d.state + heads
        reads = [
            Read(ReadKind.OUTPUT, layer, "in_proj", ((-1, torch.cat([channels, decay])),), mixer),
            Read(ReadKind.PARAM, layer, "conv1d.weight", ((0, channels),), mixer),
        ]
        if d.conv_bias:
            reads.append(Read(ReadKind.PARAM, layer, "conv1d.bias", ((0, channels),), mixer))
        return [*reads, Read(ReadKind.PARAM, layer, "D", ((0, heads),), mixer)]

    def build(self, d: Mamba2Dims, values: list[Tensor], heads: Tensor, mask: Tensor) -> SSMInputs:
        projected, weight, *rest = (value.float() for value in values)
        bias = rest.pop(0) if d.conv_bias else None
        (skip,) = rest
        groups, channels = self._layout(d, heads)
        n_pos, n_bc = projected.shape[1], len(channels)
        bc_in = projected[..., :n_bc] * mask[..., None]
        conv = F.conv1d(bc_in.transpose(1, 2), weight, bias, padding=weight.shape[-1] - 1, groups=n_bc)
        bc = conv[..., :n_pos].transpose(1, 2)
        if d.act != "identity":
            bc = F.silu(bc)
        b_state, c_state = bc.unflatten(-1, (2, len(groups), d.state)).unbind(2)
        which = torch.searchsorted(groups, heads // (d.heads // d.groups))
        a = F.softplus(projected[..., n_bc:])
        ones = torch.ones(len(heads), device=a.device)
        return SSMInputs(a, -ones, b_state[:, :, which], c_state[:, :, which], skip, mask, weight=torch.ones_like(a))


@dataclass
class DeltaInputs:
    """A gated DeltaNet layer (Qwen3-Next's linear attention) for ``head`` = the requested
    value heads, in float32. Its state ``S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} +
    beta_t k_t v_t^T`` is linear in the values, so ``o_t = sum_s M[t, s] v_s`` with
    ``M[t, s] = beta_s k_s^T A_{s+1} ... A_t q_t``, ``A_r = alpha_r (I - beta_r k_r k_r^T)``.

    Attributes:
        q, k: ``[batch, pos, head, k_dim]``, after the conv, the L2 norm and (``q``) the
            ``1 / sqrt(k_dim)`` scale, each value head's key head.
        beta: ``[batch, pos, head]`` write strengths (``sigmoid(b)``).
        log_alpha: ``[batch, pos, head]`` decays, ``-exp(A_log) softplus(a + dt_bias)``.
        mask: ``[batch, pos]`` bool, True on real tokens.
    """

    q: Tensor
    k: Tensor
    beta: Tensor
    log_alpha: Tensor
    mask: Tensor


class DeltaNetRecipe:
    """``in_proj_qkvz`` output, per key head ``j``: ``[q | k | v (group) | z (group)]``;
    ``in_proj_ba`` output, per key head: ``[b (group) | a (group)]``. The depthwise conv
    runs on ``[q (all key heads) | k | v]`` inside HF's forward as a plain function, so it
    is applied here to the read ``q`` / ``k`` columns with the read conv weights."""

    def _layout(self, d: DeltaNetDims, heads: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        keys = torch.unique(heads // d.group)  # the key heads the value heads use
        span = 2 * d.k_dim + 2 * d.group * d.v_dim  # in_proj_qkvz columns per key head
        dims = torch.arange(d.k_dim)
        q_cols = (keys[:, None] * span + dims).flatten()
        qk_cols = torch.cat([q_cols, q_cols + d.k_dim])
        q_chan = (keys[:, None] * d.k_dim + dims).flatten()
        channels = torch.cat([q_chan, q_chan + d.k_heads * d.k_dim])  # conv channels of those columns
        b_cols = (heads // d.group) * 2 * d.group + heads % d.group
        return keys, qk_cols, channels, torch.cat([b_cols, b_cols + d.group])

    def reads(self, d: DeltaNetDims, layer: int, mixer: int, heads: Tensor) -> list[Read]:
        _, qk_cols, channels, ba_cols = self._layout(d, heads)
        return [
            Read(ReadKind.OUTPUT, layer, "in_proj_qkvz", ((-1, qk_cols),), mixer),
            Read(ReadKind.OUTPUT, layer, "in_proj_ba", ((-1, ba_cols),), mixer),
            Read(ReadKind.PARAM, layer, "conv1d.weight", ((0, channels),), mixer),
            *(Read(ReadKind.PARAM, layer, name, ((0, heads),), mixer) for name in ("A_log", "dt_bias")),
        ]

    def build(self, d: DeltaNetDims, values: list[Tensor], heads: Tensor, mask: Tensor) -> DeltaInputs:
        from transformers.activations import ACT2FN

        projected, ba, weight, a_log, dt_bias = (value.float() for value in values)
        keys = self._layout(d, heads)[0]
        n_pos, n_keys = projected.shape[1], len(keys)
        conv = F.conv1d(projected.transpose(1, 2), weight, None, padding=weight.shape[-1] - 1, groups=projected.shape[-1])
        qk = ACT2FN[d.act](conv[..., :n_pos]).transpose(1, 2) * mask[..., None]
        q, k = qk.unflatten(-1, (2, n_keys, d.k_dim)).unbind(2)  # [batch, pos, key head, k_dim]
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))  # HF's l2norm
        which = torch.searchsorted(keys, heads // d.group)
        b, a = ba.split(len(heads), dim=-1)
        log_alpha = -torch.exp(a_log) * F.softplus(a + dt_bias)
        return DeltaInputs(q[:, :, which] * d.k_dim**-0.5, k[:, :, which], torch.sigmoid(b), log_alpha, mask)


Recipe = Mamba2Recipe | Mamba1Recipe | DeltaNetRecipe | DiscreteMamba2Recipe

SSM_RECIPES: dict[str, Recipe] = {
    "mamba2": Mamba2Recipe(),
    "mamba": Mamba1Recipe(norms=False),
    "falcon_mamba": Mamba1Recipe(norms=True),
    "jamba": Mamba1Recipe(norms=True),
    "gated_deltanet": DeltaNetRecipe(),
    "discrete_mamba2": DiscreteMamba2Recipe(),
}
"""Recipe name (`gna_interp.core.arch.MixerSpec.recipe`) -> how to read that SSM. Every
Mamba-2 flavour (Mamba-2, Zamba2, Bamba, GraniteMoeHybrid, NemotronH, FalconH1) shares
one recipe; their config fields differ, and `Mamba2Dims` carries the sizes."""


def recipe_for(name: str) -> Recipe:
    recipe = SSM_RECIPES.get(name)
    if recipe is None:
        raise GnaValueError(f"implicit attention is not implemented for the {name!r} SSM: supported are {sorted(SSM_RECIPES)}")
    return recipe
