"""The architecture table: one row per family. A new family is a new row plus a test.

Each row says which mixers every layer has (`gna_interp.core.arch.MixerSpec`): their
kind, their path in the block, their out-projection and their sizes, read from the
family's own config fields. Heads are numbered per layer, attention first, then SSM.

| family | layer kinds (config field) | mixers of a layer, in head order (path in the block) |
|---|---|---|
| Llama, Mistral, Qwen2 | attention | attention (``self_attn``) |
| Mamba, FalconMamba | SSM, Mamba-1 | SSM: a head per channel, head_dim 1 (``mixer``) |
| Mamba-2 | SSM, Mamba-2 | SSM (``mixer``) |
| Jamba | ``layers_block_type``: ``attention``, ``mamba`` | attention (``self_attn``) or Mamba-1 (``mamba``) |
| Bamba, GraniteMoeHybrid | ``layers_block_type``: ``full_attention``, ``linear_attention`` | attention (``self_attn``) or Mamba-2 |
| NemotronH | ``layers_block_type``: ``full_attention``, ``linear_attention``, ``moe``, ``mlp`` | attention or Mamba-2 (``mixer``); none |
| Zamba2 | ``layers_block_type``: ``linear_attention``, ``hybrid`` | Mamba-2 (``mamba``); hybrid: see below |
| FalconH1 | every layer | attention (``self_attn``), then Mamba-2 (``mamba``) |
| Qwen3-Next | ``layer_types``: ``full_attention``, ``linear_attention`` | attention (``self_attn``) or gated DeltaNet (``linear_attn``) |

A Zamba2 ``hybrid`` layer runs the shared attention block (``shared_transformer``, one set
of weights for every hybrid layer) and then its own Mamba-2 layer (``mamba_decoder``): its
heads are that application's attention heads (``shared_transformer.self_attn``), then its
Mamba-2 heads (``mamba_decoder.mamba``). A head names one application, not the weights.

Each mixer lists its heads' input streams (what path patching patches on a receiver),
in the order the mixer computes them:

| mixer | stream | module (in the mixer) | unit |
|---|---|---|---|
| attention | ``q`` | ``q_proj`` output | per query head |
| | ``k``, ``v`` | ``k_proj`` / ``v_proj`` output | per key/value head (shared by its query group) |
| Mamba-2 | ``gate``, ``x``, ``dt`` | ``in_proj`` output columns | per head |
| | ``B``, ``C`` | ``in_proj`` output columns | per group (shared by its heads) |
| Mamba-1 | ``x``, ``gate`` | ``in_proj`` output columns | per channel |
| | ``dt``, ``B``, ``C`` | ``x_proj`` output columns | shared by every channel of the layer |

Zamba2 with ``use_shared_attention_adapter`` adds a per-application low-rank adapter to
``q``, ``k`` and ``v`` (``q = q_proj(h) + adapter_l(h)``): no module outputs the whole
query there, so those attention heads list no input streams (path patching refuses them
as receivers; everything else works).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.arch import (
    ArchSpec,
    AttentionDims,
    DeltaNetDims,
    LayerKind,
    Mamba1Dims,
    Mamba2Dims,
    MixerSpec,
    MixerTable,
    Stream,
    _config_int,
    attention_head_dim,
    attention_heads,
    attention_kv_heads,
    kv_columns,
    mamba1_b,
    mamba1_c,
    mamba1_dt,
    mamba1_gate,
    mamba1_x,
    mamba2_b,
    mamba2_c,
    mamba2_dt,
    mamba2_gate,
    mamba2_x,
    q_columns,
    uniform,
)

# Query, key and value before RoPE (patching them there or after RoPE is the same: RoPE
# depends only on the position).
ATTENTION_STREAMS = (Stream("q", "q_proj", q_columns), Stream("k", "k_proj", kv_columns), Stream("v", "v_proj", kv_columns))

# ``in_proj`` output = ``[gate z | x | B | C | dt]``. The depthwise causal conv acts on
# ``x``, ``B``, ``C`` channel by channel, so replacing those columns at every position
# equals replacing them after the conv. (FalconH1 scales the columns by a fixed vector
# after ``in_proj``: column by column too.)
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


# ----- sizes, from each family's config fields --------------------------------------------


def attention_dims(config: Any) -> AttentionDims:
    return AttentionDims(attention_heads(config), attention_kv_heads(config), attention_head_dim(config))


def mamba_dims(config: Any) -> Mamba1Dims:
    """Mamba / FalconMamba: every inner channel is a head."""
    return Mamba1Dims(_config_int(config, "intermediate_size"), _config_int(config, "time_step_rank"), _config_int(config, "state_size"))


def jamba_mamba_dims(config: Any) -> Mamba1Dims:
    inner = _config_int(config, "mamba_expand") * _config_int(config, "hidden_size")
    return Mamba1Dims(inner, _config_int(config, "mamba_dt_rank"), _config_int(config, "mamba_d_state"))


def _limit(value: Any) -> tuple[float, float]:
    low, high = value
    return float(low), float(high)


def _mamba2_sizes(config: Any, heads: str, head_dim: str, groups: str, state: str, **details: Any) -> Mamba2Dims:
    """A Mamba-2 mixer's sizes, read from the family's own names for the four fields."""
    read = _config_int
    return Mamba2Dims(
        heads=read(config, heads), head_dim=read(config, head_dim), groups=read(config, groups), state=read(config, state), **details
    )


def mamba2_dims(config: Any) -> Mamba2Dims:
    details = dict(conv_bias=bool(config.use_conv_bias), act=str(config.hidden_act), dt_limit=_limit(config.time_step_limit))
    return _mamba2_sizes(config, "num_heads", "head_dim", "n_groups", "state_size", **details)


def bamba_mamba_dims(config: Any) -> Mamba2Dims:
    """Bamba, GraniteMoeHybrid and FalconH1 share the ``mamba_*`` field names. FalconH1
    multiplies ``in_proj``'s output by its ``mup_vector`` buffer (``in_scale``) and runs
    its gated norm only with ``mamba_rms_norm``."""
    falcon = config.model_type == "falcon_h1"
    details = dict(
        conv_bias=bool(config.mamba_conv_bias),
        act=str(config.hidden_act),
        dt_limit=_limit(config.time_step_limit),
        in_scale=falcon,
        gated_norm=bool(config.mamba_rms_norm) if falcon else True,
    )
    return _mamba2_sizes(config, "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", **details)


def zamba2_mamba_dims(config: Any) -> Mamba2Dims:
    """Zamba2's mixer: conv bias always on, SiLU, ``dt`` clamped below at ``time_step_min``."""
    details = dict(conv_bias=True, act="silu", dt_limit=(float(config.time_step_min), float("inf")))
    return _mamba2_sizes(config, "n_mamba_heads", "mamba_headdim", "mamba_ngroups", "mamba_d_state", **details)


def nemotron_h_mamba_dims(config: Any) -> Mamba2Dims:
    details = dict(
        conv_bias=bool(config.use_conv_bias), act=str(config.mamba_hidden_act), dt_limit=(float(config.time_step_min), float("inf"))
    )
    return _mamba2_sizes(config, "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", **details)


def qwen3_next_deltanet_dims(config: Any) -> DeltaNetDims:
    return DeltaNetDims(
        k_heads=_config_int(config, "linear_num_key_heads"),
        v_heads=_config_int(config, "linear_num_value_heads"),
        k_dim=_config_int(config, "linear_key_head_dim"),
        v_dim=_config_int(config, "linear_value_head_dim"),
        act=str(config.hidden_act),
    )


# ----- mixers ---------------------------------------------------------------------------------


def attention(path: str = "self_attn", runs: int = 0, streams: tuple[Stream, ...] = ATTENTION_STREAMS, shared: bool = False) -> MixerSpec:
    return MixerSpec(LayerKind.ATTENTION, path, "o_proj", attention_dims, streams, runs=runs, shared=shared)


def mamba2(path: str, dims: Any, runs: int = 0, stage: int = 0) -> MixerSpec:
    """Every family's Mamba-2 mixer ends in a gated RMSNorm (``norm``, called as
    ``norm(y, gate)``) over groups of ``intermediate_size // n_groups`` channels: the
    heads of one ``B`` / ``C`` group."""
    return MixerSpec(
        LayerKind.SSM, path, "out_proj", dims, MAMBA2_STREAMS, recipe="mamba2", runs=runs, stage=stage, norm="norm", norm_gate="gate"
    )


def mamba1(path: str, dims: Any, recipe: str) -> MixerSpec:
    return MixerSpec(LayerKind.SSM, path, "out_proj", dims, MAMBA1_STREAMS, recipe=recipe)


def by_layer_type(field: str, kinds: Mapping[str, tuple[MixerSpec, ...]]) -> MixerTable:
    """Mixers chosen by ``config.<field>[layer]`` (a list of layer-type names)."""

    def table(config: Any, layer: int) -> tuple[MixerSpec, ...]:
        name = getattr(config, field)[layer]
        if name not in kinds:
            raise ValueError(f"{config.model_type} layer {layer} has type {name!r}, not in the architecture table ({sorted(kinds)})")
        return kinds[name]

    return table


def zamba2_mixers(config: Any, layer: int) -> tuple[MixerSpec, ...]:
    """A ``hybrid`` layer runs the shared attention block (its own application of the
    shared weights, plus its own adapters if any) and then its own Mamba-2 layer."""
    mamba_only = (mamba2("mamba", zamba2_mamba_dims),)
    if config.layers_block_type[layer] != "hybrid":
        return mamba_only
    streams = () if config.use_shared_attention_adapter else ATTENTION_STREAMS
    shared = attention("shared_transformer.self_attn", runs=0, streams=streams, shared=True)
    return (shared, mamba2("mamba_decoder.mamba", zamba2_mamba_dims, runs=1, stage=1))


def _llama_like(family: str) -> ArchSpec:
    mixers = uniform(attention())
    return ArchSpec(family, (family,), LayerKind.ATTENTION, "model.layers", "model.norm", mixers, tlens=True, default_backend="tlens")


def _mamba_like(family: str, mixer: MixerSpec) -> ArchSpec:
    return ArchSpec(family, (family,), LayerKind.SSM, "backbone.layers", "backbone.norm_f", uniform(mixer), tlens=True)


def _hybrid(family: str, final_norm: str, mixers: MixerTable, block_output: int = 0) -> ArchSpec:
    return ArchSpec(family, (family,), LayerKind.HYBRID, "model.layers", final_norm, mixers, tlens=True, block_output=block_output)


# Qwen3-Next: q_proj outputs each head's query and its output gate side by side, so only
# k and v are offered as streams; the gated DeltaNet's in_proj_qkvz interleaves q, k, v and
# z per key head, which a (first column, units, width) layout cannot describe: no streams.
_QWEN3_NEXT: dict[str, tuple[MixerSpec, ...]] = {
    "full_attention": (attention(streams=ATTENTION_STREAMS[1:]),),
    "linear_attention": (MixerSpec(LayerKind.SSM, "linear_attn", "out_proj", qwen3_next_deltanet_dims, recipe="gated_deltanet"),),
}
_JAMBA: dict[str, tuple[MixerSpec, ...]] = {"attention": (attention(),), "mamba": (mamba1("mamba", jamba_mamba_dims, "jamba"),)}
_FALCON_H1 = (attention(runs=1), mamba2("mamba", bamba_mamba_dims))
_BAMBA_LIKE: dict[str, tuple[MixerSpec, ...]] = {"full_attention": (attention(),), "linear_attention": (mamba2("mamba", bamba_mamba_dims),)}

ARCHITECTURES: tuple[ArchSpec, ...] = (
    _llama_like("llama"),
    _llama_like("mistral"),
    _llama_like("qwen2"),
    _mamba_like("mamba", mamba1("mixer", mamba_dims, "mamba")),
    _mamba_like("falcon_mamba", mamba1("mixer", mamba_dims, "falcon_mamba")),
    _mamba_like("mamba2", mamba2("mixer", mamba2_dims)),
    _hybrid("jamba", "model.final_layernorm", by_layer_type("layers_block_type", _JAMBA)),
    _hybrid("bamba", "model.final_layernorm", by_layer_type("layers_block_type", _BAMBA_LIKE), block_output=2),
    _hybrid("granitemoehybrid", "model.norm", by_layer_type("layers_block_type", _BAMBA_LIKE)),
    _hybrid(
        "nemotron_h",
        "model.norm_f",
        by_layer_type(
            "layers_block_type",
            {"full_attention": (attention("mixer"),), "linear_attention": (mamba2("mixer", nemotron_h_mamba_dims),), "moe": (), "mlp": ()},
        ),
    ),
    _hybrid("zamba2", "model.final_layernorm", zamba2_mixers),
    # FalconH1 runs the Mamba-2 mixer first, then attention, on the same normed input.
    _hybrid("falcon_h1", "model.final_layernorm", by_layer_type("layers_block_type", {"hybrid": _FALCON_H1}), block_output=1),
    _hybrid("qwen3_next", "model.norm", by_layer_type("layer_types", _QWEN3_NEXT)),
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
