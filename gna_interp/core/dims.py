"""Mixer sizes, as each family reads them from its config (`AttentionDims`, `Mamba2Dims`,
`Mamba1Dims`, `DeltaNetDims`), and the layouts of the heads' input streams as functions of
those sizes (`Layout`: ``dims -> (first column, units, columns per unit)``), used by the
`Stream` rows of `core.arch`. Plain Python: reading a config's sizes needs no torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import GnaValueError


def _config_int(config: Any, name: str) -> int:
    value = getattr(config, name, None)
    if value is None:
        raise GnaValueError(f"config of model_type {getattr(config, 'model_type', '?')!r} has no field {name!r}")
    return int(value)


def attention_heads(config: Any) -> int:
    return _config_int(config, "num_attention_heads")


def attention_head_dim(config: Any) -> int:
    head_dim = getattr(config, "head_dim", None)
    return int(head_dim) if head_dim else _config_int(config, "hidden_size") // attention_heads(config)


def attention_kv_heads(config: Any) -> int:
    value = getattr(config, "num_key_value_heads", None)
    return int(value) if value else attention_heads(config)


# ----- mixer sizes ---------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionDims:
    """Softmax attention: ``heads`` query heads of ``head_dim``, ``kv_heads`` key/value heads."""

    heads: int
    kv_heads: int
    head_dim: int

    @property
    def n_heads(self) -> int:
        return self.heads

    @property
    def width(self) -> int:
        return self.head_dim


@dataclass(frozen=True)
class Mamba2Dims:
    """A Mamba-2 mixer: ``in_proj`` output = ``[gate z | x | B | C | dt]``.

    Attributes:
        heads, head_dim: SSM heads and their width (``inner = heads * head_dim``).
        groups, state: ``B`` / ``C`` groups and state size.
        conv_bias: whether the depthwise conv has a bias.
        act: the activation after the conv (a ``transformers.activations`` name).
        dt_limit: ``(low, high)`` clamp of ``dt`` after the softplus.
        in_scale: FalconH1: ``in_proj``'s output is multiplied by the mixer's
            ``mup_vector`` buffer before use.
        gated_norm: the mixer normalises its heads' (gated) outputs with a gated RMSNorm
            over groups of ``inner // groups`` channels (the heads of one ``B`` / ``C``
            group) before ``out_proj``; FalconH1 only with ``config.mamba_rms_norm`` (it
            otherwise gates without normalising).
    """

    heads: int
    head_dim: int
    groups: int
    state: int
    conv_bias: bool = True
    act: str = "silu"
    dt_limit: tuple[float, float] = (0.0, float("inf"))
    in_scale: bool = False
    gated_norm: bool = True

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def n_heads(self) -> int:
        return self.heads

    @property
    def width(self) -> int:
        return self.head_dim


@dataclass(frozen=True)
class Mamba1Dims:
    """A Mamba-1 mixer: every inner channel is a head (head_dim 1), as the paper treats
    Falcon-Mamba; ``x_proj`` outputs the low-rank ``dt`` (``rank``), ``B`` and ``C`` (``state``)."""

    channels: int
    rank: int
    state: int

    @property
    def n_heads(self) -> int:
        return self.channels

    @property
    def width(self) -> int:
        return 1


@dataclass(frozen=True)
class DeltaNetDims:
    """A gated DeltaNet mixer (Qwen3-Next's linear attention): ``k_heads`` query/key heads
    of ``k_dim``, each serving ``v_heads // k_heads`` value heads of ``v_dim``; a head is
    a value head. ``in_proj_qkvz`` outputs, per key head, ``[q | k | v (group) | z (group)]``
    and ``in_proj_ba``, per key head, ``[b (group) | a (group)]``."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    act: str = "silu"

    @property
    def group(self) -> int:
        return self.v_heads // self.k_heads

    @property
    def n_heads(self) -> int:
        return self.v_heads

    @property
    def width(self) -> int:
        return self.v_dim


Dims = AttentionDims | Mamba2Dims | Mamba1Dims | DeltaNetDims


# ----- input-stream layouts: dims -> (first column, units, columns per unit) -------------
Layout = Callable[[Any], tuple[int, int, int]]


def q_columns(d: AttentionDims) -> tuple[int, int, int]:
    """``q_proj`` output: one unit per query head."""
    return 0, d.heads, d.head_dim


def kv_columns(d: AttentionDims) -> tuple[int, int, int]:
    """``k_proj`` / ``v_proj`` output: one unit per key/value head (shared by its query group)."""
    return 0, d.kv_heads, d.head_dim


def mamba2_gate(d: Mamba2Dims) -> tuple[int, int, int]:
    """``in_proj`` output = ``[gate z | x | B | C | dt]``; ``z`` per head."""
    return 0, d.heads, d.head_dim


def mamba2_x(d: Mamba2Dims) -> tuple[int, int, int]:
    return d.inner, d.heads, d.head_dim


def mamba2_b(d: Mamba2Dims) -> tuple[int, int, int]:
    """``B`` per group of heads."""
    return 2 * d.inner, d.groups, d.state


def mamba2_c(d: Mamba2Dims) -> tuple[int, int, int]:
    return 2 * d.inner + d.groups * d.state, d.groups, d.state


def mamba2_dt(d: Mamba2Dims) -> tuple[int, int, int]:
    return 2 * d.inner + 2 * d.groups * d.state, d.heads, 1


def mamba1_x(d: Mamba1Dims) -> tuple[int, int, int]:
    """``in_proj`` output = ``[x | gate z]``, one column per channel."""
    return 0, d.channels, 1


def mamba1_gate(d: Mamba1Dims) -> tuple[int, int, int]:
    return d.channels, d.channels, 1


def mamba1_dt(d: Mamba1Dims) -> tuple[int, int, int]:
    """``x_proj`` output = ``[dt (rank) | B (state) | C (state)]``, shared by every channel."""
    return 0, 1, d.rank


def mamba1_b(d: Mamba1Dims) -> tuple[int, int, int]:
    return d.rank, 1, d.state


def mamba1_c(d: Mamba1Dims) -> tuple[int, int, int]:
    return d.rank + d.state, 1, d.state
