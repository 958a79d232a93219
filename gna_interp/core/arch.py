"""Per-architecture facts, as data: where the blocks, mixers and out-projections are,
and how many heads of what width each layer has."""

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

    @property
    def default_backend(self) -> str:
        return "tlens" if self.tlens else "nnsight"

    def out_proj_path(self, layer: int) -> str:
        return f"{self.layers_path}.{layer}.{self.mixer_attr}.{self.out_proj_attr}"
