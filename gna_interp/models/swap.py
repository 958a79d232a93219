"""Layer swap: run a model with some of its blocks replaced by copies of another model's.

The paper's experiment: Llamba-8B (a Llama-shaped SSM) with Llama-3.1-8B-Instruct's layer
17, its Aggregate layer, swapped in whole and untrained, goes from 33% to 50% on MMLU.
`swap_layers` is a context manager; leaving it (normally or by an exception) restores
the original modules and weights exactly::

    import gna_interp as gna

    with gna.swap_layers(ssm, llama, [17]) as swapped:   # HF models or GnaModels
        hybrid = gna.load(swapped, tokenizer=tok, backend="nnsight")
        logits = hybrid.logits(prompts)
    # ssm is back: same modules, same parameter objects, bit-identical logits

A block goes in one of two ways, chosen by the pair of families (`FAMILIES`):

**Same family** (Llama into Llama, Mamba-2 into Mamba-2): *weights*. Each parameter and
buffer of the target's block is pointed (``.data``) at a copy of the donor block's
tensor; the module objects stay where they are. This works on every backend, the
TransformerLens bridge included (it wraps the HF modules in place and keeps using their
parameters). The block keeps the target's configuration, so every config field the block
reads (``block_fields``: widths, head counts, norms, the rotary parameters of the
embedding the model hands it) must match; a mismatch raises naming the fields.
Vocabulary, depth and token ids may differ.

**Different families** (Llama into Mamba-2 or into a hybrid, Mamba into Llama):
*module*. The target's block is replaced by a `SwappedBlock` (see `swap_block`): a fresh
copy of the donor block with what the donor model would hand it (its rotary embedding,
a mask in its format), called the donor's way and answering the target's way. Only
``hidden_size`` must match. Incremental decoding through such a block is refused; single
forward passes (logits, ablations, patching) and ``generate(..., use_cache=False)`` work.

A `GnaModel` target works with the nnsight backend (its envoy is rebuilt over the
swapped modules for the duration of the context) and, for same-family swaps, with
TransformerLens; a model loaded inside the context gets nnsight by default. A layer
holding a block of another family is in the model's ``foreign_layers`` (set for the
context on a `GnaModel` target, found by `load` inside it): it reports 0 heads and the
kind ``MLP``, so ``model.heads``, sweeps and `MaskAttentionRows` pass over it. Head-level
interventions there are not supported (the layer has the donor's heads, not the
target's) and raise; residual-stream sites and `SkipLayers` there work.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from torch import nn

from ..core.errors import GnaTypeError, GnaValueError
from ..core.keywords import suggest_keywords
from .handle import GnaModel
from .swap_block import BackboneInputs, Calls, SwappedBlock, backbone_inputs, named_tensors, unwrapped_class

LayerMap = int | Iterable[int] | Mapping[int, int]


@dataclass(frozen=True)
class SwapFamily:
    """One row of `FAMILIES`.

    Attributes:
        model_types: HF ``model_type`` values of the family.
        layers_path: the block list, from the ``*ForCausalLM`` object.
        calls: how one of its blocks is called as a donor (``None``: target only).
        returns_pair: its layer loop unpacks ``(hidden, extra)`` from each block.
        block_fields: config fields a block depends on; same-family swaps need them equal.
    """

    model_types: tuple[str, ...]
    layers_path: str
    calls: Calls | None
    returns_pair: bool = False
    block_fields: tuple[str, ...] | None = None

    @property
    def backbone_path(self) -> str:
        return self.layers_path.rpartition(".")[0]


_ATTENTION_FIELDS = (
    *("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act"),
    *("rms_norm_eps", "attention_bias", "mlp_bias", "rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor"),
)
_MAMBA_FIELDS = (
    *("hidden_size", "intermediate_size", "state_size", "conv_kernel", "expand", "time_step_rank", "use_bias", "use_conv_bias"),
    *("hidden_act", "layer_norm_epsilon", "residual_in_fp32"),
)
_MAMBA2_FIELDS = (
    *("hidden_size", "num_heads", "head_dim", "n_groups", "state_size", "conv_kernel", "expand", "use_bias", "use_conv_bias"),
    *("hidden_act", "layer_norm_epsilon", "residual_in_fp32", "time_step_limit"),
)
# Compared at the swapped index only (a per-layer list).
_PER_LAYER_FIELDS = ("layer_types",)

FAMILIES: tuple[SwapFamily, ...] = (
    SwapFamily(("llama",), "model.layers", Calls.ATTENTION, block_fields=_ATTENTION_FIELDS),
    SwapFamily(("mistral",), "model.layers", Calls.ATTENTION, block_fields=(*_ATTENTION_FIELDS, "sliding_window")),
    SwapFamily(("qwen2",), "model.layers", Calls.ATTENTION, block_fields=(*_ATTENTION_FIELDS, "sliding_window", "layer_types")),
    SwapFamily(("mamba",), "backbone.layers", Calls.RECURRENT, block_fields=_MAMBA_FIELDS),
    SwapFamily(("falcon_mamba",), "backbone.layers", Calls.RECURRENT, block_fields=(*_MAMBA_FIELDS, "mixer_rms_eps")),
    SwapFamily(("mamba2",), "backbone.layers", Calls.RECURRENT, block_fields=_MAMBA2_FIELDS),
    SwapFamily(("granitemoehybrid",), "model.layers", None),
    SwapFamily(("bamba",), "model.layers", None, returns_pair=True),
)
_BY_MODEL_TYPE = {model_type: row for row in FAMILIES for model_type in row.model_types}


@suggest_keywords
@contextmanager
def swap_layers(target: Any, donor: Any, layers: LayerMap) -> Iterator[Any]:
    """Run ``target`` with its blocks at ``layers`` replaced by copies of ``donor``'s.

    Args:
        target: a ``transformers`` causal LM or a `GnaModel`; edited for the duration of
            the context, restored exactly when it exits (also on an exception).
        donor: a ``transformers`` causal LM or a `GnaModel`; never edited.
        layers: a layer index, a list of them (the same index in both models), or a
            mapping ``{target layer: donor layer}``.

    Yields:
        ``target`` itself, swapped.

    Raises:
        ValueError: bad layer indices (naming the valid range), a family pair that
            cannot be swapped, or a mismatch the blocks depend on (naming the fields).

    Example::

        # ssm: a Llama-width Mamba-2 model; llama: a Llama with the same hidden size
        with gna.swap_layers(ssm, llama, {17: 17}) as swapped:
            hybrid = gna.load(swapped, tokenizer=tok, backend="nnsight")
            logits = hybrid.logits(prompts)
    """
    t_hf, d_hf = _hf_model(target, "target"), _hf_model(donor, "donor")
    t_family, d_family = _family(t_hf, "target"), _family(d_hf, "donor")
    pairs = _layer_pairs(layers, _layers(t_hf, t_family), _layers(d_hf, d_family))
    with ExitStack() as undo:
        if t_family is d_family:
            _check_same_family(t_family, t_hf.config, d_hf.config, pairs)
            for t_layer, d_layer in pairs.items():
                undo.enter_context(_swap_weights(_layers(t_hf, t_family)[t_layer], _layers(d_hf, d_family)[d_layer], t_layer))
        else:
            _check_cross_family(target, t_family, d_family, t_hf.config, d_hf.config)
            inputs = undo.enter_context(backbone_inputs(attrgetter(t_family.backbone_path)(t_hf)))
            for t_layer, d_layer in pairs.items():
                block = _adapter(d_hf, d_family, d_layer, t_family, inputs, like=_layers(t_hf, t_family)[t_layer])
                undo.enter_context(_swap_module(_layers(t_hf, t_family), t_layer, block))
            if isinstance(target, GnaModel):
                undo.enter_context(_fresh_trace(target, {t_layer: d_hf.config.model_type for t_layer in pairs}))
        yield target


# ----- what is swapped -------------------------------------------------------------------


def _hf_model(model: Any, role: str) -> Any:
    if isinstance(model, GnaModel):
        if model.is_remote:
            raise GnaValueError(f"swap_layers: the {role} runs remotely (NDIF); swap the blocks of a local model")
        return model.hf_model
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise GnaTypeError(f"swap_layers: the {role} must be a transformers causal LM or a GnaModel, got {type(model).__name__}")
    return model


def _family(hf_model: Any, role: str) -> SwapFamily:
    model_type = getattr(hf_model.config, "model_type", None)
    row = _BY_MODEL_TYPE.get(model_type)  # type: ignore[arg-type]
    if row is None:
        raise GnaValueError(f"swap_layers: the {role}'s family {model_type!r} is not supported; supported are {sorted(_BY_MODEL_TYPE)}")
    return row


def _layers(hf_model: Any, family: SwapFamily) -> nn.ModuleList:
    return attrgetter(family.layers_path)(hf_model)


def _layer_pairs(layers: LayerMap, target_layers: nn.ModuleList, donor_layers: nn.ModuleList) -> dict[int, int]:
    """``{target layer: donor layer}``, validated."""
    if isinstance(layers, Mapping):
        pairs = list(layers.items())
    elif isinstance(layers, int):
        pairs = [(layers, layers)]
    else:
        pairs = [(layer, layer) for layer in layers]
    if not pairs:
        raise GnaValueError("swap_layers: no layers given")
    for t_layer, d_layer in pairs:
        _check_index(t_layer, len(target_layers), "target")
        _check_index(d_layer, len(donor_layers), "donor")
    if len({t for t, _ in pairs}) != len(pairs):
        raise GnaValueError(f"swap_layers: a target layer is given twice in {layers!r}")
    return dict(pairs)


def _check_index(layer: Any, n_layers: int, role: str) -> None:
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise GnaTypeError(f"swap_layers: layer indices must be ints, got {layer!r}")
    if not 0 <= layer < n_layers:
        hint = " (map target to donor layers with layers={target: donor})" if role == "donor" else ""
        raise GnaValueError(f"swap_layers: {role} layer {layer} out of range: the {role} has layers 0..{n_layers - 1}{hint}")


# ----- compatibility ---------------------------------------------------------------------


def _check_same_family(family: SwapFamily, t_config: Any, d_config: Any, pairs: dict[int, int]) -> None:
    if family.block_fields is None:
        raise GnaValueError(f"swap_layers: swaps between two {family.model_types[0]} models are not supported")
    missing = object()
    mismatches = []
    for name in family.block_fields:
        t_value, d_value = getattr(t_config, name, missing), getattr(d_config, name, missing)
        if name in _PER_LAYER_FIELDS:
            for t_layer, d_layer in pairs.items():
                t_item, d_item = t_value[t_layer], d_value[d_layer]  # type: ignore[index]
                if t_item != d_item:
                    mismatches.append(f"{name}[{t_layer}] {t_item!r} vs donor {name}[{d_layer}] {d_item!r}")
        elif t_value != d_value:
            mismatches.append(f"{name} {_show(t_value, missing)} vs {_show(d_value, missing)}")
    if mismatches:
        raise GnaValueError(
            f"swap_layers: the donor's {family.model_types[0]} blocks do not fit the target's (target vs donor): "
            + "; ".join(mismatches)
            + ". Vocabulary size, depth and token ids may differ; these fields must not."
        )


def _show(value: Any, missing: object) -> str:
    return "(unset)" if value is missing else repr(value)


def _check_cross_family(target: Any, t_family: SwapFamily, d_family: SwapFamily, t_config: Any, d_config: Any) -> None:
    t_name, d_name = t_config.model_type, d_config.model_type
    if d_family.calls is None:
        donors = sorted(t for row in FAMILIES if row.calls is not None for t in row.model_types)
        raise GnaValueError(f"swap_layers: {d_name} blocks cannot be swapped into another family; donors of other families are {donors}")
    if isinstance(target, GnaModel) and target.backend_name != "nnsight":
        raise GnaValueError(
            f"swap_layers: swapping {d_name} blocks into a {t_name} model replaces modules, which the {target.backend_name!r} "
            "backend wraps in place; load the target with backend='nnsight' (or swap the HF model and load it inside the context)"
        )
    if t_config.hidden_size != d_config.hidden_size:
        raise GnaValueError(
            f"swap_layers: hidden_size differs: target {t_name} has {t_config.hidden_size}, donor {d_name} has {d_config.hidden_size}"
        )


# ----- same family: point the target block's tensors at copies of the donor's ------------


@contextmanager
def _swap_weights(target_block: nn.Module, donor_block: nn.Module, layer: int) -> Iterator[None]:
    if unwrapped_class(target_block) is not unwrapped_class(donor_block):
        classes = f"{unwrapped_class(target_block).__name__} vs {unwrapped_class(donor_block).__name__}"
        raise GnaValueError(f"swap_layers: layer {layer}: the blocks are of different classes ({classes})")
    targets, donors = named_tensors(target_block), named_tensors(donor_block)
    if set(targets) != set(donors):
        raise GnaValueError(f"swap_layers: layer {layer}: the blocks' tensors differ: {sorted(set(targets) ^ set(donors))}")
    for name, tensor in targets.items():
        if tensor.shape != donors[name].shape:
            raise GnaValueError(
                f"swap_layers: layer {layer}: {name} has shape {tuple(tensor.shape)}, the donor's {tuple(donors[name].shape)}"
            )
    replacements = {name: donors[name].detach().to(tensor.device, tensor.dtype, copy=True) for name, tensor in targets.items()}
    originals = {name: tensor.data for name, tensor in targets.items()}
    try:
        for name, tensor in targets.items():
            tensor.data = replacements[name]
        yield
    finally:
        for name, tensor in targets.items():
            tensor.data = originals[name]


# ----- different families: an adapter module (`SwappedBlock`) ------------------------


def _adapter(
    donor: Any, family: SwapFamily, donor_layer: int, target_family: SwapFamily, inputs: BackboneInputs, like: nn.Module
) -> SwappedBlock:
    assert family.calls is not None
    return SwappedBlock.build(
        donor, family.layers_path, family.calls, donor_layer, like=like, returns_pair=target_family.returns_pair, inputs=inputs
    )


@contextmanager
def _swap_module(layers: nn.ModuleList, layer: int, block: nn.Module) -> Iterator[None]:
    original = layers[layer]
    layers[layer] = block
    try:
        yield
    finally:
        layers[layer] = original


@contextmanager
def _fresh_trace(model: GnaModel, foreign: dict[int, str]) -> Iterator[None]:
    """nnsight instruments modules when its envoy is built: build one over the swapped
    modules for the context and put the original envoy back after. The swapped layers
    are marked foreign for the context (`GnaModel.layer_specs` follows: no heads there),
    so head-level requests there get a clear error."""
    from nnsight.modeling.transformers import TransformersModel

    backend = model.backend
    previous, previous_foreign = backend.envoy, dict(model.foreign_layers)
    backend.envoy = TransformersModel(model.hf_model, tokenizer=model.tokenizer)
    model.foreign_layers.update(foreign)
    try:
        yield
    finally:
        backend.envoy = previous
        model.foreign_layers.clear()
        model.foreign_layers.update(previous_foreign)
