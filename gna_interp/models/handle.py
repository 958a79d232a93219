"""`GnaModel`: one handle over a HF causal LM and the backend that runs it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ..core.arch import ArchSpec, LayerKind
from ..core.heads import Head, Resid, Target
from ..core.interventions import Ablate, Intervention
from ..core.plan import Site, SiteKind
from .inputs import Batch, make_batch


class GnaModel:
    """A model with a backend. Same calls, same numbers, on every backend.

    Attributes:
        hf_model: the underlying ``transformers`` model (for ``tlens``, its modules are
            wrapped in place by the bridge; it still computes the same function).
        tokenizer: the HF tokenizer.
        arch: the architecture table row.
        backend: the backend object (``.name`` is ``"tlens"`` or ``"nnsight"``).
    """

    def __init__(self, hf_model: Any, tokenizer: Any, arch: ArchSpec, backend: Any, name: str = "") -> None:
        self.hf_model = hf_model
        self.tokenizer = tokenizer
        self.arch = arch
        self.backend = backend
        self.name = name or getattr(hf_model.config, "_name_or_path", "") or arch.family
        config = hf_model.config
        self.n_layers: int = int(config.num_hidden_layers)
        self.n_heads: int = arch.n_heads(config)
        self.head_dim: int = arch.head_dim(config)
        self.d_model: int = int(config.hidden_size)
        self.vocab_size: int = int(config.vocab_size)
        self._ambient: list[Intervention] = []

    # ----- structure -------------------------------------------------------------
    @property
    def backend_name(self) -> str:
        return str(self.backend.name)

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        return (self.arch.layer_kind,) * self.n_layers

    @property
    def heads_per_layer(self) -> tuple[int, ...]:
        return (self.n_heads,) * self.n_layers

    @property
    def heads(self) -> list[Head]:
        """Every head, layer-major."""
        return [Head(layer, head) for layer in range(self.n_layers) for head in range(self.heads_per_layer[layer])]

    def check_layer(self, layer: int, *, allow_final: bool = False) -> None:
        top = self.n_layers if allow_final else self.n_layers - 1
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int, got {layer!r}")
        if not 0 <= layer <= top:
            raise ValueError(f"layer {layer} out of range: {self.name} has layers 0..{top}")

    def check_head(self, head: Head) -> None:
        if not isinstance(head, Head):
            raise TypeError(f"expected a gna_interp.Head, got {head!r} ({type(head).__name__})")
        self.check_layer(head.layer)
        n = self.heads_per_layer[head.layer]
        if head.head >= n:
            raise ValueError(f"head {head} out of range: layer {head.layer} of {self.name} has heads 0..{n - 1}")

    def site_of(self, target: Target) -> Site:
        if isinstance(target, Head):
            self.check_head(target)
            return Site(SiteKind.HEADS, target.layer)
        if isinstance(target, Resid):
            self.check_layer(target.layer, allow_final=True)
            return Site(SiteKind.RESID, target.layer)
        raise TypeError(f"expected a Head or Resid, got {target!r}")

    def site_shape(self, site: Site) -> tuple[int, ...]:
        """Per-position shape of a site's activation."""
        return (self.n_heads, self.head_dim) if site.kind is SiteKind.HEADS else (self.d_model,)

    # ----- running ---------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where inputs go: the weights' device (CPU for remote models)."""
        if getattr(self.backend, "remote", False):
            return torch.device("cpu")
        parameter = next(self.hf_model.parameters(), None)
        return torch.device("cpu") if parameter is None or parameter.is_meta else parameter.device

    def to_batch(self, inputs: Any) -> Batch:
        """Tokenize (left padding), validate against the vocabulary, move to `device`."""
        batch = make_batch(inputs, self.tokenizer)
        top = int(batch.input_ids.max())
        if top >= self.vocab_size or int(batch.input_ids.min()) < 0:
            raise ValueError(f"token id {top} out of range: {self.name} has a vocabulary of {self.vocab_size}")
        return batch.to(self.device)

    def run(
        self, inputs: Any, interventions: Sequence[Intervention] = (), capture: Iterable[Target] = ()
    ) -> tuple[Tensor, dict[Target, Tensor]]:
        """Logits ``[batch, pos, vocab]`` and the activations at ``capture``.

        Captured heads come back as ``[batch, pos, d_head]``, residual sites as
        ``[batch, pos, d_model]``, both after the interventions at that site.
        """
        from ..patching.compile import compile_plan

        batch = self.to_batch(inputs)
        targets = list(capture)
        sites = {self.site_of(t) for t in targets}
        plan = compile_plan(self, batch, [*self._ambient, *interventions])
        out = self.backend.run(batch, plan, capture=sites)
        acts: dict[Target, Tensor] = {}
        for target in targets:
            value = out.acts[self.site_of(target)]
            acts[target] = value[:, :, target.head] if isinstance(target, Head) else value
        return out.logits, acts

    def logits(self, inputs: Any, interventions: Sequence[Intervention] = ()) -> Tensor:
        """``[batch, pos, vocab]`` logits with ``interventions`` (and any active
        ``ablated`` / ``intervening`` contexts) applied."""
        return self.run(inputs, interventions)[0]

    def cache(self, inputs: Any, targets: Iterable[Target], interventions: Sequence[Intervention] = ()) -> dict[Target, Tensor]:
        return self.run(inputs, interventions, capture=targets)[1]

    @contextmanager
    def intervening(self, *interventions: Intervention) -> Iterator[GnaModel]:
        """Apply ``interventions`` to every call inside the block. Nothing is edited
        in the model; leaving the block (normally or by an exception) ends it."""
        for item in interventions:
            if not isinstance(item, Intervention):  # type: ignore[arg-type, misc]
                raise TypeError(f"expected an intervention (Ablate, Patch, SkipLayers, Truncate), got {item!r}")
        depth = len(self._ambient)
        self._ambient.extend(interventions)
        try:
            yield self
        finally:
            del self._ambient[depth:]

    @contextmanager
    def ablated(self, heads: Head | Iterable[Head], how: str = "zero", reference: Any = None) -> Iterator[GnaModel]:
        """``with model.ablated([Head(16, 22)]):`` every call inside runs with those heads ablated."""
        ablation = Ablate(heads, how=how, reference=reference)
        for head in ablation.heads:
            self.check_head(head)
        with self.intervening(ablation):
            yield self

    @property
    def active_interventions(self) -> tuple[Intervention, ...]:
        return tuple(self._ambient)

    def __repr__(self) -> str:
        return (
            f"GnaModel({self.name!r}, family={self.arch.family}, backend={self.backend_name}, "
            f"layers={self.n_layers}, heads={self.n_heads}x{self.head_dim})"
        )
