"""The architecture table: one row per family. A new family is a new row plus a test."""

from __future__ import annotations

from typing import Any

from ..core.arch import (
    ArchSpec,
    LayerKind,
    attention_head_dim,
    attention_heads,
    mamba1_channels,
    mamba2_head_dim,
    mamba2_heads,
    one,
)


def _llama_like(family: str, *model_types: str) -> ArchSpec:
    return ArchSpec(
        family=family,
        model_types=model_types or (family,),
        layer_kind=LayerKind.ATTENTION,
        layers_path="model.layers",
        mixer_attr="self_attn",
        out_proj_attr="o_proj",
        final_norm_path="model.norm",
        n_heads=attention_heads,
        head_dim=attention_head_dim,
        tlens=True,
    )


def _mamba_like(family: str, model_types: tuple[str, ...], n_heads: Any, head_dim: Any) -> ArchSpec:
    return ArchSpec(
        family=family,
        model_types=model_types,
        layer_kind=LayerKind.SSM,
        layers_path="backbone.layers",
        mixer_attr="mixer",
        out_proj_attr="out_proj",
        final_norm_path="backbone.norm_f",
        n_heads=n_heads,
        head_dim=head_dim,
        tlens=False,
    )


ARCHITECTURES: tuple[ArchSpec, ...] = (
    _llama_like("llama"),
    _llama_like("mistral"),
    _llama_like("qwen2"),
    _mamba_like("mamba", ("mamba",), mamba1_channels, one),
    _mamba_like("falcon_mamba", ("falcon_mamba",), mamba1_channels, one),
    _mamba_like("mamba2", ("mamba2",), mamba2_heads, mamba2_head_dim),
)

_BY_MODEL_TYPE = {model_type: spec for spec in ARCHITECTURES for model_type in spec.model_types}


def known_model_types() -> list[str]:
    return sorted(_BY_MODEL_TYPE)


def spec_for(config: Any) -> ArchSpec:
    """The table row for a HF config; a clear error for an unknown ``model_type``."""
    model_type = getattr(config, "model_type", None)
    spec = _BY_MODEL_TYPE.get(model_type)  # type: ignore[arg-type]
    if spec is None:
        raise ValueError(f"unknown architecture model_type={model_type!r}: supported are {known_model_types()}")
    return spec
