"""The architecture table: one row per family. A new family is a new row plus a test.

Each row lists its heads' input streams (what path patching patches on a receiver), in
the order the mixer computes them:

| family | stream | module (in the mixer) | unit |
|---|---|---|---|
| Llama, Mistral, Qwen2 | ``q`` | ``q_proj`` output | per query head |
| | ``k``, ``v`` | ``k_proj`` / ``v_proj`` output | per key/value head (shared by its query group) |
| Mamba-2 | ``gate``, ``x``, ``dt`` | ``in_proj`` output columns | per head |
| | ``B``, ``C`` | ``in_proj`` output columns | per group (shared by its heads) |
| Mamba, FalconMamba | ``x``, ``gate`` | ``in_proj`` output columns | per channel |
| | ``dt``, ``B``, ``C`` | ``x_proj`` output columns | shared by every channel of the layer |
"""

from __future__ import annotations

from typing import Any

from ..core.arch import (
    ArchSpec,
    LayerKind,
    Stream,
    attention_head_dim,
    attention_heads,
    kv_columns,
    mamba1_b,
    mamba1_c,
    mamba1_channels,
    mamba1_dt,
    mamba1_gate,
    mamba1_x,
    mamba2_b,
    mamba2_c,
    mamba2_dt,
    mamba2_gate,
    mamba2_head_dim,
    mamba2_heads,
    mamba2_x,
    one,
    q_columns,
)

# Query, key and value before RoPE (patching them there or after RoPE is the same: RoPE
# depends only on the position).
ATTENTION_STREAMS = (Stream("q", "q_proj", q_columns), Stream("k", "k_proj", kv_columns), Stream("v", "v_proj", kv_columns))

# ``in_proj`` output = ``[gate z | x | B | C | dt]``. The depthwise causal conv acts on
# ``x``, ``B``, ``C`` channel by channel, so replacing those columns at every position
# equals replacing them after the conv.
MAMBA2_STREAMS = (
    Stream("gate", "in_proj", mamba2_gate),
    Stream("x", "in_proj", mamba2_x),
    Stream("B", "in_proj", mamba2_b),
    Stream("C", "in_proj", mamba2_c),
    Stream("dt", "in_proj", mamba2_dt),
)

# ``in_proj`` output = ``[x | gate z]``; ``x_proj`` reads every channel's (convolved) ``x``
# and outputs the layer's shared ``[dt (low rank) | B | C]``. HF applies ``dt_proj`` as a
# plain matmul (no module call), so ``dt`` is the shared low-rank ``dt``. Patching a
# channel's ``x`` holds that channel's column of ``x_proj``'s input ("x_read") at its
# unpatched value, so ``x`` reaches the channel's own scan only.
MAMBA1_STREAMS = (
    Stream("x", "in_proj", mamba1_x, holds=("x_read",)),
    Stream("gate", "in_proj", mamba1_gate),
    Stream("x_read", "x_proj", mamba1_x, io="input", public=False),
    Stream("dt", "x_proj", mamba1_dt),
    Stream("B", "x_proj", mamba1_b),
    Stream("C", "x_proj", mamba1_c),
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
        streams=ATTENTION_STREAMS,
    )


def _mamba_like(family: str, model_types: tuple[str, ...], n_heads: Any, head_dim: Any, streams: tuple[Stream, ...]) -> ArchSpec:
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
        streams=streams,
    )


ARCHITECTURES: tuple[ArchSpec, ...] = (
    _llama_like("llama"),
    _llama_like("mistral"),
    _llama_like("qwen2"),
    _mamba_like("mamba", ("mamba",), mamba1_channels, one, MAMBA1_STREAMS),
    _mamba_like("falcon_mamba", ("falcon_mamba",), mamba1_channels, one, MAMBA1_STREAMS),
    _mamba_like("mamba2", ("mamba2",), mamba2_heads, mamba2_head_dim, MAMBA2_STREAMS),
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
