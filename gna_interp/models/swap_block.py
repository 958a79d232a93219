"""`SwappedBlock`: a donor block of another family, running inside a target model.

A target's layer loop calls each block with its own signature and expects its own output
format; a donor block expects what its own model hands it. The adapter sits in the
target's block list and translates:

1. **In**: the target's loop passes hidden states plus its own mask, cache and position
   embeddings (the mask in the target's format for that layer: 2D for Mamba layers, 4D
   or ``None`` for attention layers). Only the hidden states (and ``position_ids``, when
   given) are used. The 2D padding mask is taken where the model received it: a forward
   pre-hook on the target's backbone (`backbone_inputs`) records it for the adapters,
   and is removed when the swap ends.
2. **Donor call**: an attention block (Llama, Mistral, Qwen2) gets
   ``position_embeddings=(cos, sin)`` from a copy of the donor model's rotary module,
   positions ``0..T-1`` (HF's default) and a causal mask built from the donor's config
   by the function the donor model would use for that layer (sliding-window or full);
   a Mamba block gets the 2D padding mask. Neither gets a cache.
3. **Out**: the donor block's output is the new residual stream (Llama decoder layers and
   Mamba blocks add their own residual, as the blocks of every supported target do); it
   is returned as a tensor, or as ``(hidden, None)`` where the target's loop unpacks a
   pair.

A forward that continues a cache (incremental decoding) raises: the donor block keeps no
state in the target's cache, so its output would silently be wrong.
"""

from __future__ import annotations

import copy
import inspect
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from itertools import chain
from operator import attrgetter
from typing import Any

import torch
from torch import Tensor, nn

from ..core.errors import GnaValueError
from .hf_compat import build_causal_mask, passed_cache


class Calls(str, Enum):
    """How a family's block is called when it is the donor."""

    ATTENTION = "attention"  # Llama-style decoder layer: (cos, sin) and a causal mask
    RECURRENT = "recurrent"  # Mamba-style block: a 2D padding mask


def named_tensors(module: nn.Module) -> dict[str, Tensor]:
    """Parameters and buffers by their HF names, each tensor once. TransformerLens's bridge
    nests every wrapped module under ``_original_component`` (and adds aliases of the same
    tensors, which come later and are dropped here)."""
    named: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, tensor in chain(module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            named.setdefault(name.replace("_original_component.", ""), tensor)
    return named


def unwrapped_class(module: nn.Module) -> Any:
    """The HF class of ``module`` (TransformerLens wraps it in a bridge component)."""
    return type(getattr(module, "original_component", module))


class BackboneInputs:
    """What the target's backbone was called with, for the adapters of one swap."""

    def __init__(self) -> None:
        self.attention_mask: Any = None
        self.position_ids: Tensor | None = None


@contextmanager
def backbone_inputs(backbone: nn.Module) -> Iterator[BackboneInputs]:
    """Record the padding mask (and position ids) ``backbone`` receives on every call;
    the hooks are removed when the context exits."""
    inputs = BackboneInputs()
    signature = inspect.signature(type(backbone).forward)

    def remember(module: nn.Module, args: tuple, kwargs: dict) -> None:
        bound = signature.bind(module, *args, **kwargs).arguments
        extra = bound.get("kwargs", {})
        inputs.attention_mask = bound.get("attention_mask", extra.get("attention_mask"))
        inputs.position_ids = bound.get("position_ids", extra.get("position_ids"))

    def forget(module: nn.Module, args: tuple, output: Any) -> None:
        inputs.attention_mask = inputs.position_ids = None

    handles = [backbone.register_forward_pre_hook(remember, with_kwargs=True), backbone.register_forward_hook(forget, always_call=True)]
    try:
        yield inputs
    finally:
        for handle in handles:
            handle.remove()


class SwappedBlock(nn.Module):
    """A donor block of another family, called the way its own model calls it.

    Attributes:
        block: a fresh copy of the donor block (the donor's class and config, its tensors).
        rotary: a copy of the donor model's rotary embedding (attention donors) or ``None``.
        calls: how the donor block is called.
        returns_pair: return ``(hidden, None)`` instead of the hidden states.
        donor_type: the donor model's ``model_type`` (`GnaModel.foreign_layers` reports it).
    """

    def __init__(
        self, block: nn.Module, rotary: nn.Module | None, config: Any, calls: Calls, donor_layer: int, returns_pair: bool, inputs: Any
    ) -> None:
        super().__init__()
        self.block = block
        self.rotary = rotary
        self.calls = calls
        self.returns_pair = returns_pair
        self.donor_type = str(getattr(config, "model_type", None) or "?")
        self._config = config
        self._donor_layer = donor_layer
        self._inputs = inputs
        self._caches_seen: weakref.WeakSet = weakref.WeakSet()

    @classmethod
    def build(
        cls, donor: Any, layers_path: str, calls: Calls, donor_layer: int, *, like: nn.Module, returns_pair: bool, inputs: BackboneInputs
    ) -> SwappedBlock:
        """Copy block ``donor_layer`` of ``donor`` (a HF model; its blocks at
        ``layers_path``) onto the device and into the dtype of ``like``, the block it
        replaces. The copy is built from the donor's config and loaded with its tensors,
        so nothing attached to the donor's modules (hooks, wrappers) comes along."""
        config = copy.deepcopy(donor.config)
        source = attrgetter(layers_path)(donor)[donor_layer]
        with torch.device("meta"):
            block = unwrapped_class(source)(config, layer_idx=donor_layer)  # its index in the donor's config; no cache is used
        tensors = named_tensors(source)
        block.load_state_dict({name: tensors[name].detach().clone() for name in block.state_dict()}, assign=True)
        reference = next(chain(like.parameters(), like.buffers()))
        block.to(device=reference.device, dtype=reference.dtype)
        rotary = None
        if calls is Calls.ATTENTION:
            backbone = layers_path.rpartition(".")[0]
            rotary = copy_rotary(attrgetter(f"{backbone}.rotary_emb")(donor), config).to(reference.device)
        return cls(block, rotary, config, calls, donor_layer, returns_pair, inputs)

    def forward(self, hidden_states: Tensor, *args: Any, **kwargs: Any) -> Any:
        self._refuse_cached_decoding(passed_cache(kwargs))
        mask = self._padding_mask(hidden_states.shape[1])
        if self.calls is Calls.ATTENTION:
            out = self._attention_forward(hidden_states, mask, kwargs.get("position_ids", self._inputs.position_ids))
        else:
            out = self.block(hidden_states, attention_mask=mask)  # no cache: the default
        out = out[0] if isinstance(out, tuple) else out
        return (out, None) if self.returns_pair else out

    def _attention_forward(self, hidden_states: Tensor, mask: Tensor | None, position_ids: Tensor | None) -> Any:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        if position_ids is None:
            position_ids = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
        assert self.rotary is not None
        position_embeddings = self.rotary(hidden_states, position_ids=position_ids)
        make_mask = create_sliding_window_causal_mask if self._sliding() else create_causal_mask
        causal_mask = build_causal_mask(make_mask, self._config, hidden_states, mask, position_ids)
        return self.block(
            hidden_states,
            attention_mask=causal_mask,
            position_ids=position_ids,
            use_cache=False,
            position_embeddings=position_embeddings,
        )

    def _sliding(self) -> bool:
        """Whether the donor's own model gives this layer a sliding-window mask (Qwen2:
        per ``layer_types``; Mistral: whenever ``sliding_window`` is set)."""
        layer_types = getattr(self._config, "layer_types", None)
        if layer_types:
            return layer_types[self._donor_layer] == "sliding_attention"
        return getattr(self._config, "model_type", None) == "mistral" and getattr(self._config, "sliding_window", None) is not None

    def _padding_mask(self, length: int) -> Tensor | None:
        mask = self._inputs.attention_mask
        if mask is None:
            return None
        if not isinstance(mask, Tensor) or mask.ndim != 2:
            raise GnaValueError("a swapped-in block of another family needs a 2D padding attention_mask [batch, pos] (or none)")
        return mask[:, -length:]

    def _refuse_cached_decoding(self, cache: Any) -> None:
        """A cache this block has seen before means the forward continues it."""
        if cache is None:
            return
        if cache in self._caches_seen:
            raise NotImplementedError(
                "a swapped-in block of another family cannot continue a cache (it keeps no state in it): "
                "run full forward passes, e.g. generate(..., use_cache=False)"
            )
        self._caches_seen.add(cache)

    def extra_repr(self) -> str:
        return f"donor={self.donor_type} layer {self._donor_layer}, calls={self.calls.value}"


def swapped_in_layers(hf_model: Any, layers_path: str) -> dict[int, str]:
    """``{layer: donor model_type}`` for every `SwappedBlock` in ``hf_model``'s block list
    (at ``layers_path``; a block wrapped by TransformerLens's bridge counts by what it wraps)."""
    try:
        layers = attrgetter(layers_path)(hf_model)
    except AttributeError:
        return {}
    found = {}
    for layer, block in enumerate(layers):
        block = getattr(block, "original_component", block)
        if isinstance(block, SwappedBlock):
            found[layer] = block.donor_type
    return found


def copy_rotary(rotary: nn.Module, config: Any) -> nn.Module:
    """A fresh rotary module of the donor's class carrying the donor's (non-persistent)
    frequency buffers, so it hands out exactly the donor's ``(cos, sin)``."""
    fresh = unwrapped_class(rotary)(config)
    buffers = named_tensors(rotary)
    for name, _ in list(fresh.named_buffers()):
        owner, _, attribute = name.rpartition(".")
        setattr(fresh.get_submodule(owner), attribute, buffers[name].detach().clone())
    return fresh
