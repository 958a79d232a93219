"""Per-architecture facts, as data: where the blocks, mixers and out-projections are,
how many heads of what width each layer has, and where each head's input streams are.

Input streams (`Stream`) are what path patching patches on a receiver head: blocks of
columns of a mixer submodule's output (or input), viewed ``[batch, pos, unit, width]``.
A unit belongs to one head (``units == n_heads``), to a group of heads (grouped-query
``k`` / ``v``, Mamba-2 ``B`` / ``C``), or to every head of the layer (Mamba-1 ``B`` /
``C`` / ``dt``): unit ``u`` serves heads ``h`` with ``h * units // n_heads == u``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class LayerKind(str, Enum):
    """What mixes tokens in a block."""

    ATTENTION = "attention"
    SSM = "ssm"


def _config_int(config: Any, name: str) -> int:
    value = getattr(config, name, None)
    if value is None:
        raise ValueError(f"config of model_type {getattr(config, 'model_type', '?')!r} has no field {name!r}")
    return int(value)


def attention_heads(config: Any) -> int:
    return _config_int(config, "num_attention_heads")


def attention_head_dim(config: Any) -> int:
    head_dim = getattr(config, "head_dim", None)
    return int(head_dim) if head_dim else _config_int(config, "hidden_size") // attention_heads(config)


def mamba1_channels(config: Any) -> int:
    """Mamba-1: every inner channel is a head (head_dim 1), as the paper treats Falcon-Mamba."""
    return _config_int(config, "intermediate_size")


def one(config: Any) -> int:
    return 1


def mamba2_heads(config: Any) -> int:
    return _config_int(config, "num_heads")


def mamba2_head_dim(config: Any) -> int:
    return _config_int(config, "head_dim")


def attention_kv_heads(config: Any) -> int:
    value = getattr(config, "num_key_value_heads", None)
    return int(value) if value else attention_heads(config)


# ----- input-stream layouts: config -> (first column, units, columns per unit) ----------
Layout = Callable[[Any], tuple[int, int, int]]


def q_columns(config: Any) -> tuple[int, int, int]:
    """``q_proj`` output: one unit per query head."""
    return 0, attention_heads(config), attention_head_dim(config)


def kv_columns(config: Any) -> tuple[int, int, int]:
    """``k_proj`` / ``v_proj`` output: one unit per key/value head (shared by its query group)."""
    return 0, attention_kv_heads(config), attention_head_dim(config)


def _mamba2_sizes(config: Any) -> tuple[int, int, int, int, int]:
    """``(inner, heads, head_dim, groups, state)`` of a Mamba-2 mixer."""
    heads, head_dim = mamba2_heads(config), mamba2_head_dim(config)
    return heads * head_dim, heads, head_dim, _config_int(config, "n_groups"), _config_int(config, "state_size")


def mamba2_gate(config: Any) -> tuple[int, int, int]:
    """``in_proj`` output = ``[gate z | x | B | C | dt]``; ``z`` per head."""
    _, heads, head_dim, _, _ = _mamba2_sizes(config)
    return 0, heads, head_dim


def mamba2_x(config: Any) -> tuple[int, int, int]:
    inner, heads, head_dim, _, _ = _mamba2_sizes(config)
    return inner, heads, head_dim


def mamba2_b(config: Any) -> tuple[int, int, int]:
    """``B`` per group of heads."""
    inner, _, _, groups, state = _mamba2_sizes(config)
    return 2 * inner, groups, state


def mamba2_c(config: Any) -> tuple[int, int, int]:
    inner, _, _, groups, state = _mamba2_sizes(config)
    return 2 * inner + groups * state, groups, state


def mamba2_dt(config: Any) -> tuple[int, int, int]:
    inner, heads, _, groups, state = _mamba2_sizes(config)
    return 2 * inner + 2 * groups * state, heads, 1


def mamba1_x(config: Any) -> tuple[int, int, int]:
    """``in_proj`` output = ``[x | gate z]``, one column per channel."""
    return 0, mamba1_channels(config), 1


def mamba1_gate(config: Any) -> tuple[int, int, int]:
    channels = mamba1_channels(config)
    return channels, channels, 1


def mamba1_dt(config: Any) -> tuple[int, int, int]:
    """``x_proj`` output = ``[dt (rank) | B (state) | C (state)]``, shared by every channel."""
    return 0, 1, _config_int(config, "time_step_rank")


def mamba1_b(config: Any) -> tuple[int, int, int]:
    return _config_int(config, "time_step_rank"), 1, _config_int(config, "state_size")


def mamba1_c(config: Any) -> tuple[int, int, int]:
    rank, state = _config_int(config, "time_step_rank"), _config_int(config, "state_size")
    return rank + state, 1, state


@dataclass(frozen=True)
class Stream:
    """One input stream of a layer's heads: columns of a mixer submodule's output or input.

    Attributes:
        name: what users pass as ``receiver_input`` (``"q"``, ``"x"``, ``"B"``, ...).
        module: the submodule, relative to the mixer (``"q_proj"``, ``"in_proj"``).
        layout: config -> ``(first column, units, columns per unit)``.
        io: ``"output"`` or ``"input"`` of ``module``.
        public: ``False`` for helper streams that only `holds` names.
        holds: streams that keep their unpatched value when this one is patched. Mamba-1's
            ``x`` also feeds ``x_proj`` (the layer's shared ``B``, ``C``, ``dt``); holding
            ``x_proj``'s input column makes patching ``x`` reach the channel's scan only.
    """

    name: str
    module: str
    layout: Layout
    io: str = "output"
    public: bool = True
    holds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.io not in ("output", "input"):
            raise ValueError(f"Stream {self.name!r}: io={self.io!r}, expected 'output' or 'input'")


@dataclass(frozen=True)
class ArchSpec:
    """One architecture family: a row of `gna_interp.models.registry.ARCHITECTURES`.

    Paths are attribute paths from the HF ``*ForCausalLM`` object.
    """

    family: str
    model_types: tuple[str, ...]
    layer_kind: LayerKind
    layers_path: str
    mixer_attr: str
    out_proj_attr: str
    final_norm_path: str
    n_heads: Callable[[Any], int]
    head_dim: Callable[[Any], int]
    tlens: bool
    """Whether TransformerLens's TransformerBridge supports this family."""
    streams: tuple[Stream, ...] = ()
    """The heads' input streams, in the order the mixer computes them."""

    @property
    def default_backend(self) -> str:
        return "tlens" if self.tlens else "nnsight"

    def out_proj_path(self, layer: int) -> str:
        return f"{self.layers_path}.{layer}.{self.mixer_attr}.{self.out_proj_attr}"

    def mixer_path(self, layer: int) -> str:
        return f"{self.layers_path}.{layer}.{self.mixer_attr}"

    @property
    def receiver_inputs(self) -> tuple[str, ...]:
        """Names of the public input streams (what ``receiver_input`` accepts, besides ``"any"``)."""
        return tuple(s.name for s in self.streams if s.public)

    def stream(self, name: str) -> Stream:
        for item in self.streams:
            if item.name == name:
                return item
        raise ValueError(f"{name!r} is not an input stream of {self.family} heads: expected one of {self.receiver_inputs}")

    def stream_rank(self, stream: Stream) -> int:
        """Execution order of ``stream``'s ``(module, io)`` among this row's streams."""
        seen: list[tuple[str, str]] = []
        for item in self.streams:
            if (item.module, item.io) not in seen:
                seen.append((item.module, item.io))
        return seen.index((stream.module, stream.io))
