"""Per-architecture facts, as data: where the blocks, mixers and out-projections are,
how many heads of what width each layer has, and where each head's input streams are.

A block holds zero, one or two **mixers** (`MixerSpec`): the modules that mix tokens
(attention, a Mamba-1 / Mamba-2 SSM). Pure families have one mixer of one kind in every
block; hybrids mix them per layer (Jamba, Bamba, GraniteMoeHybrid, NemotronH, Zamba2),
run two side by side in one block (FalconH1), or have blocks with no mixer at all
(NemotronH's MLP / MoE layers: 0 heads). `ArchSpec.resolve` turns a family row and a
HF config into one `LayerSpec` per layer.

Heads are numbered per layer across its mixers, **attention first, then SSM**: in a
FalconH1 layer with 8 attention heads and 24 Mamba-2 heads, heads 0..7 are attention
heads and 8..31 SSM heads, whatever order the block runs them in.

Input streams (`Stream`) are what path patching patches on a receiver head: blocks of
columns of a mixer submodule's output (or input), viewed ``[batch, pos, unit, width]``.
A unit belongs to one head (``units == n_heads``), to a group of heads (grouped-query
``k`` / ``v``, Mamba-2 ``B`` / ``C``), or to every head of the mixer (Mamba-1 ``B`` /
``C`` / ``dt``): unit ``u`` serves heads ``h`` with ``h * units // n_heads == u``.
Layouts are functions of the mixer's sizes (`AttentionDims`, `Mamba2Dims`,
`Mamba1Dims`), which each family reads from its own config fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .dims import (
    Dims,
    Layout,
    _config_int,
)
from .errors import GnaTypeError, GnaValueError
from .heads import Head


class LayerKind(str, Enum):
    """What mixes tokens in a block (`MixerSpec.kind` is ``ATTENTION`` or ``SSM``; ``SSM``
    covers every recurrent mixer with an implicit attention: Mamba-1, Mamba-2, gated
    DeltaNet)."""

    ATTENTION = "attention"
    SSM = "ssm"
    HYBRID = "hybrid"
    """A block with an attention mixer and an SSM mixer (FalconH1, Zamba2's hybrid layers)."""
    MLP = "mlp"
    """A block with no token mixer, so no heads (NemotronH's MLP and MoE layers)."""


@dataclass(frozen=True)
class Stream:
    """One input stream of a mixer's heads: columns of a mixer submodule's output or input.

    Attributes:
        name: what users pass as ``receiver_input`` (``"q"``, ``"x"``, ``"B"``, ...).
        module: the submodule, relative to the mixer (``"q_proj"``, ``"in_proj"``).
        layout: the mixer's dims -> ``(first column, units, columns per unit)``.
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
            raise GnaValueError(f"Stream {self.name!r}: io={self.io!r}, expected 'output' or 'input'")


@dataclass(frozen=True)
class MixerSpec:
    """One token mixer of a block, as a table entry.

    Attributes:
        kind: ``LayerKind.ATTENTION`` or ``LayerKind.SSM``.
        path: attribute path from the block (``"self_attn"``, ``"mamba"``,
            ``"shared_transformer.self_attn"``).
        out_proj: the out-projection, relative to the mixer; its input, viewed
            ``[batch, pos, head, d_head]``, holds the heads' outputs.
        dims: HF config -> the mixer's sizes (`AttentionDims`, `Mamba2Dims`, `Mamba1Dims`,
            `DeltaNetDims`).
        streams: the heads' input streams, in the order the mixer computes them.
        recipe: SSM mixers: the implicit-attention recipe
            (`gna_interp.attention.capture.SSM_RECIPES`: ``"mamba2"``, ``"mamba"``,
            ``"falcon_mamba"``, ``"jamba"``, ``"gated_deltanet"``); empty for attention.
        runs: position in the block's execution order (FalconH1 runs its SSM before its
            attention, Zamba2's shared attention runs before the layer's Mamba-2).
        stage: dataflow inside the block: mixers of one stage read the same input
            (FalconH1's two mixers, side by side); a later stage reads what the earlier
            ones wrote (a Zamba2 hybrid layer's Mamba-2, stage 1, reads the output of the
            shared attention block, stage 0). Path patching orders heads by
            ``(layer, stage)``.
        shared: the mixer's weights are shared with other layers (Zamba2's shared
            attention block): a head still names one application, its layer.
        norm: the submodule, relative to the mixer, that normalises its heads' outputs
            *together* before the out-projection (Mamba-2's gated RMSNorm, ``"norm"``,
            whose first input is the per-head scan output ``y``); empty if each head's
            output depends on its own inputs only. Used where the dims say the mixer
            runs it (`LayerMixer.norm_path`).
        norm_gate: the input stream (one unit per head) that gates the heads' outputs
            inside that norm (Mamba-2's ``gate`` z): holding a head's input to the norm
            means holding its pre-norm output and this stream.
        pad_guard: for families whose forward ignores the attention mask
            (`ArchSpec.takes_mask` false, or a mask that does not keep padding out of
            the state): ``(module output [batch, pos, cols], dims, mask [batch, pos])
            -> output`` applied to the output of ``pad_guard_module`` (relative to the
            mixer) so that left padding leaves every real token's numbers unchanged
            (Llamba: `gna_interp.models.mixers.discrete_mamba2_pad_guard`); ``None``:
            the mixer needs none (or padded batches are refused, see `ArchSpec.takes_mask`).
        pad_guard_module: see ``pad_guard``.
    """

    kind: LayerKind
    path: str
    out_proj: str
    dims: Callable[[Any], Dims]
    streams: tuple[Stream, ...] = ()
    recipe: str = ""
    runs: int = 0
    stage: int = 0
    shared: bool = False
    norm: str = ""
    norm_gate: str = ""
    pad_guard: Callable[[Any, Any, Any], Any] | None = None
    pad_guard_module: str = ""

    def __post_init__(self) -> None:
        if self.kind not in (LayerKind.ATTENTION, LayerKind.SSM):
            raise GnaValueError(f"MixerSpec kind must be ATTENTION or SSM, got {self.kind}")
        if self.kind is LayerKind.SSM and not self.recipe:
            raise GnaValueError(f"SSM mixer {self.path!r} needs an implicit-attention recipe")


@dataclass(frozen=True)
class LayerMixer:
    """One mixer of one layer, resolved against a config (`ArchSpec.resolve`).

    Attributes:
        layer: the block index.
        index: the mixer's position in the layer's head numbering (`Site.mixer`).
        spec: the table entry.
        path: attribute path of the mixer from the ``*ForCausalLM`` object.
        dims: its sizes.
        offset: the layer-level number of its first head.
    """

    layer: int
    index: int
    spec: MixerSpec
    path: str
    dims: Dims
    offset: int

    @property
    def kind(self) -> LayerKind:
        return self.spec.kind

    @property
    def n_heads(self) -> int:
        return self.dims.n_heads

    @property
    def head_dim(self) -> int:
        return self.dims.width

    @property
    def out_proj_path(self) -> str:
        return f"{self.path}.{self.spec.out_proj}"

    @property
    def norm_path(self) -> str:
        """Path of the norm that couples the mixer's heads (`MixerSpec.norm`), or ``""``
        when the mixer has none or does not run it (FalconH1 without ``mamba_rms_norm``)."""
        if not self.spec.norm or not getattr(self.dims, "gated_norm", False):
            return ""
        return f"{self.path}.{self.spec.norm}"

    @property
    def position(self) -> tuple[int, int]:
        """``(layer, stage)``: where the mixer's heads sit in the model's dataflow."""
        return self.layer, self.spec.stage

    @property
    def receiver_inputs(self) -> tuple[str, ...]:
        """Names of the public input streams (what ``receiver_input`` accepts, besides ``"any"``)."""
        return tuple(s.name for s in self.spec.streams if s.public)

    def stream(self, name: str) -> Stream:
        for item in self.spec.streams:
            if item.name == name:
                return item
        raise GnaValueError(
            f"{name!r} is not an input stream of the {self.kind.value} heads of layer {self.layer}: expected one of {self.receiver_inputs}"
        )

    def stream_rank(self, stream: Stream) -> int:
        """Execution order of ``stream``'s ``(module, io)`` among this mixer's streams."""
        seen: list[tuple[str, str]] = []
        for item in self.spec.streams:
            if (item.module, item.io) not in seen:
                seen.append((item.module, item.io))
        return seen.index((stream.module, stream.io))


@dataclass(frozen=True)
class LayerSpec:
    """One layer: its mixers in head-numbering order (attention first, then SSM)."""

    layer: int
    mixers: tuple[LayerMixer, ...]

    @property
    def n_heads(self) -> int:
        return sum(mixer.n_heads for mixer in self.mixers)

    @property
    def kind(self) -> LayerKind:
        kinds = {mixer.kind for mixer in self.mixers}
        if not kinds:
            return LayerKind.MLP
        return kinds.pop() if len(kinds) == 1 else LayerKind.HYBRID

    def locate(self, head: int) -> tuple[LayerMixer, int]:
        """The mixer holding layer-level head ``head`` and the head's index in it."""
        for mixer in self.mixers:
            if mixer.offset <= head < mixer.offset + mixer.n_heads:
                return mixer, head - mixer.offset
        raise GnaValueError(f"layer {self.layer} has no head {head} (it has {self.n_heads})")

    def describe(self) -> str:
        """``"heads 0..7 (attention 0..3, ssm 4..7)"``, ``"0 heads (no token mixer)"``."""
        if not self.mixers:
            return "0 heads (no attention or SSM mixer: an MLP / MoE-only layer)"
        text = f"heads 0..{self.n_heads - 1}"
        if len(self.mixers) > 1:
            parts = [f"{m.kind.value} {m.offset}..{m.offset + m.n_heads - 1}" for m in self.mixers]
            text += f" ({', '.join(parts)})"
        return text


MixerTable = Callable[[Any, int], tuple[MixerSpec, ...]]
"""``(config, layer) -> the layer's mixers``."""


def uniform(mixer: MixerSpec) -> MixerTable:
    """Every layer has the same one mixer (pure families)."""

    def table(config: Any, layer: int) -> tuple[MixerSpec, ...]:
        return (mixer,)

    return table


_KIND_ORDER = {LayerKind.ATTENTION: 0, LayerKind.SSM: 1}


@dataclass(frozen=True)
class ArchSpec:
    """One architecture family: a row of `gna_interp.models.registry.ARCHITECTURES`.

    Paths are attribute paths from the HF ``*ForCausalLM`` object.

    Attributes:
        family: the row's name.
        model_types: HF ``config.model_type`` values it covers.
        layer_kind: the family's kind: ``ATTENTION``, ``SSM`` or ``HYBRID`` (per-layer
            kinds: `GnaModel.layer_kinds`).
        layers_path: the ``ModuleList`` of blocks.
        final_norm_path: the norm after the last block.
        mixers: ``(config, layer) -> the layer's mixers``.
        tlens: whether TransformerLens's TransformerBridge supports this family.
        block_output: ``0`` if a block returns its hidden state as a tensor, the
            length of the tuple it returns (hidden state first; the rest ``None`` when a
            block is not run), or the key of the dict it returns (Llamba's first release:
            ``"hidden_states"``; nnsight backend only).
        default_backend: what `gna_interp.load` picks when no backend is given
            (``"nnsight"`` for SSMs and hybrids even where ``tlens`` works: see
            docs/backends.md for the measured reason).
        n_layers_field, d_model_field: the config fields holding the number of blocks
            and the residual width (Llamba: ``n_layer``, ``d_model``).
        takes_mask: the model's ``forward`` takes ``attention_mask=``; ``False`` calls
            it with ``input_ids`` alone. Then a left-padded batch runs only if every
            mixer has a `MixerSpec.pad_guard` (padding provably leaves the real tokens'
            numbers unchanged); otherwise it is refused with an error naming the fix.
        pre_norm_residual: every block computes ``x + sum(mixers(norm(x)))`` (plus its MLP),
            with nothing after the mixers' out-projections but the residual add. Discovery
            then treats skipping a one-mixer block (the layer scan) as removing its heads and
            nothing else, and reuses that value (`gna_interp.models.structure.mixer_is_the_block`).
            Every built-in row sets it; a registered row is taken as not pre-norm unless it says
            so (a post-norm block, or a norm with a bias after the mixer, breaks that equality).
        mlp: ``(norm, mlp)``, the paths inside a block of the norm before its MLP and of the
            MLP (Llama: ``("post_attention_layernorm", "mlp")``), where the block adds
            ``mlp(norm(x))`` to its residual stream ``x``: the MLP nodes of the direct graph
            (`SiteKind.MLP_IN` / `SiteKind.MLP_OUT`). Empty: no MLP node (pure SSMs have no MLP).
    """

    family: str
    model_types: tuple[str, ...]
    layer_kind: LayerKind
    layers_path: str
    final_norm_path: str
    mixers: MixerTable
    tlens: bool
    block_output: int | str = 0
    default_backend: str = "nnsight"
    n_layers_field: str = "num_hidden_layers"
    d_model_field: str = "hidden_size"
    takes_mask: bool = True
    pre_norm_residual: bool = False
    mlp: tuple[str, str] | tuple[()] = ()

    def __post_init__(self) -> None:
        if self.default_backend not in ("tlens", "nnsight") or (self.default_backend == "tlens" and not self.tlens):
            raise GnaValueError(f"ArchSpec {self.family!r}: default_backend={self.default_backend!r} is not a backend it supports")
        if self.tlens and isinstance(self.block_output, str):
            raise GnaValueError(
                f"ArchSpec {self.family!r}: block_output={self.block_output!r} (a dict key) works on nnsight only: tlens=False"
            )

    def n_layers(self, config: Any) -> int:
        """The number of blocks, from ``config.<n_layers_field>``."""
        return _config_int(config, self.n_layers_field)

    def d_model(self, config: Any) -> int:
        """The residual width, from ``config.<d_model_field>``."""
        return _config_int(config, self.d_model_field)

    def layers_of(self, config: Any) -> tuple[LayerSpec, ...]:
        """`resolve` over every block the config declares."""
        return self.resolve(config, self.n_layers(config))

    def block_path(self, layer: int) -> str:
        return f"{self.layers_path}.{layer}"

    def mlp_path(self, layer: int, part: int) -> str:
        """The path of block ``layer``'s MLP norm (``part=0``) or MLP (``part=1``), `mlp`."""
        if not self.mlp:
            raise GnaValueError(f"the {self.family!r} family has no MLP node (its architecture row names no MLP)")
        return f"{self.block_path(layer)}.{self.mlp[part]}"

    def resolve(self, config: Any, n_layers: int) -> tuple[LayerSpec, ...]:
        """One `LayerSpec` per layer, sizes read from ``config``."""
        layers = []
        for layer in range(n_layers):
            specs = sorted(self.mixers(config, layer), key=lambda m: _KIND_ORDER[m.kind])  # attention first (stable)
            mixers, offset = [], 0
            for index, spec in enumerate(specs):
                dims = spec.dims(config)
                path = f"{self.block_path(layer)}.{spec.path}"
                mixers.append(LayerMixer(layer, index, spec, path, dims, offset))
                offset += dims.n_heads
            layers.append(LayerSpec(layer, tuple(mixers)))
        return tuple(layers)


def check_head_in(layer_specs: Sequence[LayerSpec], head: Head, name: str) -> None:
    """A clear error when ``head`` is not a head of the layers ``layer_specs`` describe
    (one `LayerSpec` per layer; from a model, or from its config alone before any weights load)."""
    if not isinstance(head, Head):
        raise GnaTypeError(f"expected a gna_interp.Head, got {head!r} ({type(head).__name__})")
    if head.layer >= len(layer_specs):
        raise GnaValueError(f"head {head}: layer {head.layer} out of range: {name} has layers 0..{len(layer_specs) - 1}")
    spec = layer_specs[head.layer]
    if not spec.mixers or head.head >= spec.n_heads:
        raise GnaValueError(f"head {head} out of range: layer {head.layer} of {name} has {spec.describe()}")
