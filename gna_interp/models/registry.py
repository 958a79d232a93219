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
| Llamba (Cartesia; ``backbone`` or HF-style ``model`` trunk) | SSM, Discrete Mamba-2 | SSM (``mixer``) |
| hybrid student (`hybridize`) | ``kept``: layers keeping heads are hybrid | attention (``self_attn``), Discrete Mamba-2 (``mixer``) |

A family the table lacks is described the same way, as data, without editing the
package: `register_architecture` adds a row for its ``model_type`` (or pass the row to
``gna.load(model, arch=...)``, a module, folder or hub id); see docs/describe.md.

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
| Discrete Mamba-2 (Llamba) | ``x``, ``z``, ``decay`` (``A_log``) | ``in_proj`` output columns | per value head |
| | ``B``, ``C`` | ``in_proj`` output columns | per qk head (shared by its value heads, like grouped-query keys) |

Llamba's forward takes no attention mask: its mixer has a pad guard (see
`discrete_mamba2_pad_guard`) that keeps left padding out of every real token's numbers.

Zamba2 with ``use_shared_attention_adapter`` adds a per-application low-rank adapter to
``q``, ``k`` and ``v`` (``q = q_proj(h) + adapter_l(h)``): no module outputs the whole
query there, so those attention heads list no input streams (path patching refuses them
as receivers; everything else works).
"""

from __future__ import annotations

from typing import Any

from ..core.arch import ArchSpec, LayerKind, MixerSpec, MixerTable, uniform
from ..core.dims import AttentionDims, Mamba2Dims, _config_int, attention_head_dim, attention_heads
from ..core.errors import GnaTypeError, GnaValueError
from ..core.keywords import suggest_keywords
from .mixers import (
    ATTENTION_STREAMS,
    attention,
    bamba_mamba_dims,
    by_layer_type,
    discrete_mamba2,
    jamba_mamba_dims,
    mamba1,
    mamba2,
    mamba2_dims,
    mamba_dims,
    nemotron_h_mamba_dims,
    qwen3_next_deltanet_dims,
    zamba2_mixers,
)


def _llamba(family: str, trunk: str, block_output: int | str) -> ArchSpec:
    """Cartesia's first release (``backbone``, blocks return ``{"hidden_states": ...}``,
    forward takes no mask) or the HF-style version (``model``, blocks return a 1-tuple)."""
    return ArchSpec(
        family,
        ("llamba",),
        LayerKind.SSM,
        f"{trunk}.layers",
        f"{trunk}.final_layernorm",
        uniform(discrete_mamba2()),
        tlens=False,
        block_output=block_output,
        n_layers_field="n_layer",
        d_model_field="d_model",
        takes_mask=False,
        pre_norm_residual=True,
    )


LLAMBA = _llamba("llamba", "backbone", "hidden_states")
LLAMBA_HF = _llamba("llamba_hf", "model", 1)


def llamba_variant(model: Any) -> ArchSpec:
    """The Llamba row that fits ``model``'s module tree (``backbone`` or ``model`` trunk)."""
    return LLAMBA if hasattr(model, "backbone") else LLAMBA_HF


# ----- hybrid students (`gna_interp.models.hybrid_student`) ----------------------------------
# A student's config is its Llama teacher's plus ``kept`` (per layer, the teacher heads kept
# as attention) and ``d_state``. Every layer: the kept heads' attention (``self_attn``, absent
# when none is kept) and a Discrete Mamba-2 mixer (``mixer``) of one value head and one qk
# head per teacher head, both reading the block's normed input (one stage); the mixer runs
# first. Its input streams and pad guard are Llamba's.

HYBRID_STUDENT_MODEL_TYPE = "gna_hybrid_student"


def hybrid_student_ssm_dims(config: Any) -> Mamba2Dims:
    """The student mixer's sizes: ``num_attention_heads`` value and qk heads of
    ``head_dim``, state ``d_state``, identity activation, conv bias, no norm."""
    heads = attention_heads(config)
    return Mamba2Dims(
        heads=heads,
        head_dim=attention_head_dim(config),
        groups=heads,
        state=_config_int(config, "d_state"),
        act="identity",
        gated_norm=False,
    )


def hybrid_student_mixers(config: Any, layer: int) -> tuple[MixerSpec, ...]:
    ssm = discrete_mamba2("mixer", hybrid_student_ssm_dims, runs=0)
    n_kept = len(config.kept[layer])
    if not n_kept:
        return (ssm,)
    dims = AttentionDims(n_kept, n_kept, attention_head_dim(config))  # one key/value head per kept head
    return (MixerSpec(LayerKind.ATTENTION, "self_attn", "o_proj", lambda _config: dims, ATTENTION_STREAMS, runs=1), ssm)


HYBRID_STUDENT = ArchSpec(
    HYBRID_STUDENT_MODEL_TYPE,
    (HYBRID_STUDENT_MODEL_TYPE,),
    LayerKind.HYBRID,
    "model.layers",
    "model.norm",
    hybrid_student_mixers,
    tlens=False,
    pre_norm_residual=True,
)


def _llama_like(family: str) -> ArchSpec:
    mixers = uniform(attention())
    return ArchSpec(
        family,
        (family,),
        LayerKind.ATTENTION,
        "model.layers",
        "model.norm",
        mixers,
        tlens=True,
        default_backend="tlens",
        pre_norm_residual=True,
        mlp=("post_attention_layernorm", "mlp"),
    )


def _mamba_like(family: str, mixer: MixerSpec) -> ArchSpec:
    return ArchSpec(
        family, (family,), LayerKind.SSM, "backbone.layers", "backbone.norm_f", uniform(mixer), tlens=True, pre_norm_residual=True
    )


def _hybrid(family: str, final_norm: str, mixers: MixerTable, block_output: int = 0, mlp: tuple[str, str] | tuple[()] = ()) -> ArchSpec:
    return ArchSpec(
        family,
        (family,),
        LayerKind.HYBRID,
        "model.layers",
        final_norm,
        mixers,
        tlens=True,
        block_output=block_output,
        pre_norm_residual=True,
        mlp=mlp,
    )


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
    _hybrid(
        "falcon_h1",
        "model.final_layernorm",
        by_layer_type("layers_block_type", {"hybrid": _FALCON_H1}),
        block_output=1,
        mlp=("pre_ff_layernorm", "feed_forward"),
    ),
    _hybrid("qwen3_next", "model.norm", by_layer_type("layer_types", _QWEN3_NEXT)),
    LLAMBA,
    HYBRID_STUDENT,
)

# One row per model_type; Llamba's HF-style naming is picked by the module tree
# (`spec_for_model`), so only the first-release row is keyed here.
_BY_MODEL_TYPE = {model_type: spec for spec in ARCHITECTURES for model_type in spec.model_types}
_REGISTERED: dict[str, ArchSpec] = {}

DESCRIBE_HELP = (
    "to analyse a family the table lacks, describe it as data: gna.register_architecture(gna.ArchSpec(...)) "
    "or gna.load(model, arch=gna.ArchSpec(...)) for one load (a module, a folder or a hub id; on the command line: "
    "--arch module:NAME) (docs/describe.md)"
)


def known_model_types() -> list[str]:
    return sorted({**_BY_MODEL_TYPE, **_REGISTERED})


class UnknownArchitectureError(GnaValueError):
    """A ``model_type`` the table lacks: ``what`` names it and the supported ones, then
    how to describe the family (`DESCRIBE_HELP`)."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"{what}; {DESCRIBE_HELP}")


@suggest_keywords
def register_architecture(spec: ArchSpec, replace: bool = False) -> ArchSpec:
    """Add a row to the architecture table for ``spec.model_types``, without editing the
    package: `gna_interp.load` then handles models whose ``config.model_type`` is one of
    them. Returns ``spec``.

    Args:
        spec: the family as data (`gna_interp.core.arch.ArchSpec`): block list, final
            norm, mixers (path, out-projection, head sizes, input streams, implicit-
            attention recipe), the config fields of its sizes, whether its forward takes
            ``attention_mask``.
        replace: allow replacing a row for a ``model_type`` the table already has.

    Raises:
        TypeError: ``spec`` is not an ``ArchSpec``.
        ValueError: a ``model_type`` is already in the table and ``replace`` is false.
    """
    if not isinstance(spec, ArchSpec):
        raise GnaTypeError(f"register_architecture(spec=...) expects a gna_interp.ArchSpec, got {type(spec).__name__}")
    taken = [t for t in spec.model_types if t in _BY_MODEL_TYPE or t in _REGISTERED]
    if taken and not replace:
        raise GnaValueError(
            f"register_architecture: model_type(s) {taken} are already in the architecture table: pass replace=True to replace"
        )
    for model_type in spec.model_types:
        _REGISTERED[model_type] = spec
    return spec


def unregister_architecture(model_type: str) -> None:
    """Remove a row `register_architecture` added (built-in rows stay)."""
    if model_type not in _REGISTERED:
        raise KeyError(f"unregister_architecture: model_type {model_type!r} was not registered (registered: {sorted(_REGISTERED)})")
    del _REGISTERED[model_type]


def spec_for(config: Any) -> ArchSpec:
    """The table row for a config (a registered row first); a clear error, saying how to
    describe the family, for an unknown ``model_type``."""
    model_type = getattr(config, "model_type", None)
    spec = _REGISTERED.get(model_type) or _BY_MODEL_TYPE.get(model_type)  # type: ignore[arg-type]
    if spec is None:
        raise UnknownArchitectureError(f"unknown architecture model_type={model_type!r}: supported are {known_model_types()}")
    return spec


def spec_for_model(model: Any) -> ArchSpec:
    """`spec_for` of ``model.config``, with the Llamba row that fits the module tree."""
    spec = spec_for(model.config)
    if spec is LLAMBA:
        return llamba_variant(model)
    return spec


def import_arch(text: str, what: str = "arch") -> ArchSpec:
    """The `ArchSpec` named by ``MODULE:NAME`` (a module, imported with the current folder on
    the path) or ``FILE.py:NAME``: what ``--arch`` takes. ``what`` names the value in errors."""
    where, _, name = text.rpartition(":")
    if not where or not name.isidentifier():
        raise GnaValueError(f"{what} {text!r}: expected MODULE:NAME (my_arch:QWEN3) or FILE.py:NAME, NAME an ArchSpec (docs/describe.md)")
    try:
        module = _import_module_or_file(where, f"{what} {text!r}")
    except ImportError as error:
        raise GnaValueError(f"{what} {text!r}: cannot import {where!r} ({type(error).__name__}: {error})") from None
    value = getattr(module, name, None)
    if not isinstance(value, ArchSpec):
        specs = [key for key, item in vars(module).items() if isinstance(item, ArchSpec)]
        found = "no such name" if value is None else f"a {type(value).__name__}"
        raise GnaValueError(f"{what} {text!r}: {where}.{name} is {found}: expected a gna_interp.ArchSpec (the module's: {specs or 'none'})")
    return value


def _import_module_or_file(where: str, named: str) -> Any:
    """A ``.py`` file run as a module, or a module imported with the current folder first on the path."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    if where.endswith(".py"):
        if not Path(where).is_file():
            raise GnaValueError(f"{named}: no file {where!r}")
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module
    here = str(Path.cwd())
    sys.path.insert(0, here)
    try:
        return importlib.import_module(where)
    finally:
        sys.path.remove(here)
