"""The mixers of the architecture table (`models.registry`): each family's sizes read from its
config fields (``*_dims``), the heads' input streams (``*_STREAMS``), and the constructors of
a row's mixers (`attention`, `mamba1`, `mamba2`, `discrete_mamba2`, `by_layer_type`), with
Llamba's Discrete Mamba-2 pad guard (`discrete_mamba2_pad_guard`). A user family is built from
these (they are importable from `models.registry` too, where the rows use them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.arch import LayerKind, MixerSpec, MixerTable, Stream
from ..core.dims import (
    AttentionDims,
    DeltaNetDims,
    Mamba1Dims,
    Mamba2Dims,
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
)
from ..core.errors import GnaValueError

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
            raise GnaValueError(f"{config.model_type} layer {layer} has type {name!r}, not in the architecture table ({sorted(kinds)})")
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


# ----- Llamba: Discrete Mamba-2 -------------------------------------------------------------
# ``in_proj`` output = ``[x (heads x head_dim) | B (qk heads x state) | C | z (heads x
# head_dim) | A_log (heads)]``; the conv (identity activation) acts on ``x``, ``B``, ``C``
# channel by channel, so replacing those columns at every position equals replacing them
# after the conv. Sizes in `Mamba2Dims`: ``groups`` = qk heads; no gated norm.


def llamba_dims(config: Any) -> Mamba2Dims:
    """Llamba's mixer sizes from ``config.ssm_cfg`` and ``config.d_model``."""
    ssm = getattr(config, "ssm_cfg", None)
    if not isinstance(ssm, Mapping):
        raise GnaValueError(f"config of model_type {getattr(config, 'model_type', '?')!r} has no ssm_cfg dict (got {ssm!r})")
    inner = int(ssm.get("expand", 1)) * _config_int(config, "d_model")
    heads = int(ssm["n_v_heads"])
    return Mamba2Dims(
        heads=heads,
        head_dim=inner // heads,
        groups=int(ssm["n_qk_heads"]),
        state=int(ssm["d_state"]),
        conv_bias=bool(ssm.get("conv_bias", True)),
        act=str(ssm.get("activation", "identity")),
        gated_norm=False,
    )


def dm2_x(d: Mamba2Dims) -> tuple[int, int, int]:
    """``x`` per value head."""
    return 0, d.heads, d.head_dim


def dm2_b(d: Mamba2Dims) -> tuple[int, int, int]:
    """``B`` per qk head."""
    return d.inner, d.groups, d.state


def dm2_c(d: Mamba2Dims) -> tuple[int, int, int]:
    return d.inner + d.groups * d.state, d.groups, d.state


def dm2_z(d: Mamba2Dims) -> tuple[int, int, int]:
    return d.inner + 2 * d.groups * d.state, d.heads, d.head_dim


def dm2_decay(d: Mamba2Dims) -> tuple[int, int, int]:
    """``A_log`` (the decay is ``softplus(A_log)``) per value head."""
    return 2 * d.inner + 2 * d.groups * d.state, d.heads, 1


DISCRETE_MAMBA2_STREAMS = (
    Stream("x", "in_proj", dm2_x),
    Stream("B", "in_proj", dm2_b),
    Stream("C", "in_proj", dm2_c),
    Stream("z", "in_proj", dm2_z),
    Stream("decay", "in_proj", dm2_decay),
)

PAD_CLEAR = 200.0
"""``A_log`` written at a padded row's first real token: ``exp(-softplus(200)) == 0`` in
float32, so the state that token starts from is exactly zero, as without padding."""


def discrete_mamba2_pad_guard(projected: Any, d: Mamba2Dims, mask: Any) -> Any:
    """Left padding made harmless for a Discrete Mamba-2 mixer, on its ``in_proj`` output.

    ``projected``: ``[batch, pos, cols]``; ``mask``: ``[batch, pos]``, True on real tokens.
    Zeroing ``xBC`` on padding makes the causal conv at the real tokens see the zeros an
    unpadded row has before its start; setting ``A_log`` at each padded row's first real
    token to `PAD_CLEAR` makes that token's decay ``exp(-a) = 0``, so whatever padding
    wrote into the state is erased there. The token's own input ``x B^T`` does not depend
    on its decay (the kernel's ``x / a`` times ``dt = a``), so every real token's output
    equals the unpadded row's. Rows without padding are returned unchanged.
    """
    import torch

    real = mask.to(device=projected.device, dtype=torch.bool)
    conv = d.inner + 2 * d.groups * d.state
    out = projected.clone()
    out[..., :conv] = out[..., :conv] * real[..., None].to(out.dtype)
    first = real.int().argmax(dim=1)  # [batch]: the first real token (left padding)
    rows = torch.nonzero(first > 0).flatten()
    decay = dm2_decay(d)[0]
    out[rows, first[rows], decay:] = PAD_CLEAR
    return out


def discrete_mamba2(path: str = "mixer", dims: Any = llamba_dims, runs: int = 0) -> MixerSpec:
    """A Discrete Mamba-2 mixer (Llamba's; hybrid students' too, with their own ``dims``):
    heads are value heads; no norm (``out_proj(y * silu(z + z_bias))``); input streams
    `DISCRETE_MAMBA2_STREAMS`, recipe ``"discrete_mamba2"``, pad guard
    `discrete_mamba2_pad_guard` on ``in_proj``."""
    return MixerSpec(
        LayerKind.SSM,
        path,
        "out_proj",
        dims,
        DISCRETE_MAMBA2_STREAMS,
        recipe="discrete_mamba2",
        runs=runs,
        pad_guard=discrete_mamba2_pad_guard,
        pad_guard_module="in_proj",
    )
