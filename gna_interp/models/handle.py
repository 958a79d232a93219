"""`GnaModel`: one handle over a HF causal LM and the backend that runs it."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ..backends.base import RunOutput
from ..core.arch import ArchSpec, LayerKind, LayerMixer, LayerSpec
from ..core.compile import compile_plan
from ..core.errors import GnaTypeError, short_repr
from ..core.heads import Head, Resid, Target, refuse_string
from ..core.inputs import Batch, check_context, check_token_ids, make_batch
from ..core.interventions import Ablate, Intervention, as_interventions
from ..core.layout import ModelLayout
from ..core.plan import Plan, Read, Site, SiteKind
from ..tasks.base import Task, not_a_task
from .prefix import DEFAULT_PREFIX_MB, PrefixCache
from .swap_block import swapped_in_layers


def weights_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (the CPU for none, or for meta weights)."""
    parameter = next(module.parameters(), None)
    return torch.device("cpu") if parameter is None or parameter.is_meta else parameter.device


class GnaModel:
    """A model with a backend. Same calls, same numbers, on every backend.

    Attributes:
        hf_model: the ``transformers`` model the backend runs: on ``nnsight`` the one
            given to `gna_interp.load`; on ``tlens`` a twin of it sharing every tensor
            (`gna_interp.models.loading.module_twin`), whose modules the bridge wraps in
            place (the caller's object is left as it was).
        tokenizer: the HF tokenizer.
        arch: the architecture table row.
        backend: the backend object (``.name`` is ``"tlens"`` or ``"nnsight"``).

    Heads are numbered per layer over the layer's mixers, attention heads first, then
    SSM heads (a FalconH1 layer, or a Zamba2 hybrid layer: the shared attention block's
    heads at that application, then the layer's Mamba-2 heads). ``heads_per_layer`` can
    differ between layers and be 0 (NemotronH's MLP / MoE layers); ``n_heads`` is the
    largest, so every ``[layer, head]`` table has ``n_heads`` columns and NaN where a
    layer has no such head.

    A layer holding a block of another family (`foreign_layers`, see
    `gna_interp.swap_layers`) has no heads the architecture table describes: it reports
    0 heads and the kind ``MLP``, `heads` skips it, and a `Head` there raises.
    """

    def __init__(self, hf_model: Any, tokenizer: Any, arch: ArchSpec, backend: Any, name: str = "") -> None:
        self.hf_model = hf_model
        self.tokenizer = tokenizer
        self.arch = arch
        self.backend = backend
        config = hf_model.config
        self.n_layers: int = arch.n_layers(config)
        self.d_model: int = arch.d_model(config)
        self.vocab_size: int = int(config.vocab_size)
        self.layout = ModelLayout(
            name or config.name_or_path or arch.family,
            arch.resolve(config, self.n_layers),
            self.d_model,
            swapped_in_layers(hf_model, arch.layers_path),
        )
        """Layers, heads and sites (`gna_interp.core.layout`): what plans are compiled against."""
        self._ambient: list[Intervention] = []
        self._prefix: PrefixCache | None = None
        self._sources: dict[int, tuple[Any, Batch, dict[Site, Tensor]]] | None = None  # see source_cache

    # ----- structure (answered by `layout`) ----------------------------------------
    @property
    def name(self) -> str:
        return self.layout.name

    @name.setter
    def name(self, value: str) -> None:
        self.layout.name = value

    @property
    def n_heads(self) -> int:
        """The most heads any layer has: the width of every ``[layer, head]`` table (NaN
        where a layer has fewer heads). The model's own: a swap leaves it as it is."""
        return self.layout.n_heads

    @property
    def head_dim(self) -> int:
        """The widest head (every head in pure families); `head_dim_of` for one head."""
        return self.layout.head_dim

    @property
    def foreign_layers(self) -> dict[int, str]:
        """Layers holding a block of another family: layer -> the donor's ``model_type``.
        Set by `swap_layers` on a `GnaModel` target for its context, and found when a model
        is loaded inside the context (its block list holds a `SwappedBlock`; such a
        `GnaModel` describes the swapped model: use it inside the context)."""
        return self.layout.foreign_layers

    @property
    def backend_name(self) -> str:
        return str(self.backend.name)

    @property
    def layer_specs(self) -> tuple[LayerSpec, ...]:
        """Per layer: its mixers (kind, path, heads, width), in head-numbering order. A
        layer in `foreign_layers` has none: its block is not the one the table describes."""
        return self.layout.layer_specs

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Per layer: ``ATTENTION``, ``SSM``, ``HYBRID`` (both kinds of mixer in one block)
        or ``MLP`` (no heads: no token mixer, or a swapped-in block of another family,
        see `foreign_layers`)."""
        return self.layout.layer_kinds

    @property
    def heads_per_layer(self) -> tuple[int, ...]:
        """Per layer: its head count (0 for a layer without a mixer and at `foreign_layers`)."""
        return self.layout.heads_per_layer

    @property
    def heads(self) -> list[Head]:
        """Every head, layer-major (within a layer: attention heads, then SSM heads);
        none at `foreign_layers`."""
        return self.layout.heads

    def check_layer(self, layer: int, *, allow_final: bool = False) -> None:
        self.layout.check_layer(layer, allow_final=allow_final)

    def check_head(self, head: Head) -> None:
        self.layout.check_head(head)

    def mixer_of(self, head: Head) -> tuple[LayerMixer, int]:
        """The mixer that holds ``head`` and the head's index among that mixer's heads."""
        return self.layout.mixer_of(head)

    def receiver_inputs(self, head: Head) -> tuple[str, ...]:
        """The input streams path patching can patch on ``head`` as a receiver (besides
        ``"any"``): ``("q", "k", "v")`` for attention, ``("gate", "x", "B", "C", "dt")`` for Mamba-2."""
        return self.mixer_of(head)[0].receiver_inputs

    def head_kind(self, head: Head) -> LayerKind:
        """``ATTENTION`` or ``SSM``."""
        return self.layout.head_kind(head)

    def head_position(self, head: Head) -> tuple[int, int]:
        """``(layer, stage)``: a head at a later position can read this head's output
        (`gna_interp.core.arch.MixerSpec.stage`; a Zamba2 hybrid layer's Mamba-2 heads
        come after its shared-attention heads)."""
        return self.mixer_of(head)[0].position

    def head_dim_of(self, head: Head) -> int:
        return self.mixer_of(head)[0].head_dim

    def head_site(self, head: Head) -> tuple[Site, int]:
        """The site of ``head``'s mixer and the head's index in that site's ``head`` axis."""
        return self.layout.head_site(head)

    def head_sites(self, layer: int) -> list[Site]:
        """One head site per mixer of ``layer`` (none for a layer without heads)."""
        return self.layout.head_sites(layer)

    def mixer(self, site: Site) -> LayerMixer:
        """The mixer a head or stream site belongs to."""
        return self.layout.mixer(site)

    def site_of(self, target: Target) -> Site:
        return self.layout.site_of(target)

    def site_shape(self, site: Site) -> tuple[int, ...]:
        """Per-position shape of a site's activation."""
        return self.layout.site_shape(site)

    # ----- running ---------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where inputs go: the weights' device (CPU for remote models)."""
        if getattr(self.backend, "remote", False):
            return torch.device("cpu")
        return weights_device(self.hf_model)

    def to_batch(self, inputs: Any) -> Batch:
        """Tokenize (left padding), validate against the vocabulary and the context window, move to `device`."""
        batch = make_batch(inputs, self.tokenizer)
        check_token_ids(batch, self.vocab_size, self.name)
        check_context(batch, context_limit(self.hf_model), self.name)
        return batch.to(self.device)

    def run(
        self,
        inputs: Any,
        interventions: Intervention | Sequence[Intervention] = (),
        capture: Target | Iterable[Target] = (),
        logits_to_keep: int = 0,
    ) -> tuple[Tensor, dict[Target, Tensor]]:
        """Logits ``[batch, pos, vocab]`` and the activations at ``capture``.

        Captured heads come back as ``[batch, pos, d_head]``, residual sites as
        ``[batch, pos, d_model]``, both after the interventions at that site.
        ``logits_to_keep=k > 0``: the logits of the last ``k`` positions alone,
        ``[batch, k, vocab]``, the unembedding computed there alone (same numbers).
        Logits that hold NaN or inf on a real token raise
        `gna_interp.backends.finite.NonFiniteLogitsError`, naming where they began.
        """
        targets = _capture_list(capture)
        batch = self.to_batch(inputs)
        sites = {self.site_of(t) for t in targets}
        plan = self.compile_plan(batch, [*self._ambient, *as_interventions(interventions)])
        out = self.run_plan(batch, plan, capture=sites, logits_to_keep=logits_to_keep)
        acts: dict[Target, Tensor] = {}
        for target in targets:
            if isinstance(target, Head):
                site, index = self.head_site(target)
                acts[target] = out.acts[site][:, :, index]
            else:
                acts[target] = out.acts[self.site_of(target)]
        return out.logits, acts

    def compile_plan(self, batch: Batch, interventions: Sequence[Intervention]) -> Plan:
        """The `Plan` of tensor edits that ``interventions`` make on ``batch``
        (`gna_interp.core.compile`); the activations they need from other inputs (means,
        resample inputs, patch sources) come from `capture_sites`."""
        return compile_plan(self.layout, batch, interventions, self.capture_sites)

    def capture_sites(self, inputs: Any, sites: Collection[Site]) -> tuple[Batch, dict[Site, Tensor]]:
        """One forward over ``inputs`` with no interventions: the batch and the activations at
        ``sites``. Inside `source_cache`, sites already captured over the same ``inputs``
        object are read back, and only the missing ones run."""
        if self._sources is None:
            batch = self.to_batch(inputs)
            return batch, self.backend.run(batch, Plan(), capture=set(sites), logits_to_keep=1).acts  # logits unread
        kept = self._sources.get(id(inputs))
        if kept is None or kept[0] is not inputs:  # identity: the object is held, so its id is not reused
            kept = (inputs, self.to_batch(inputs), {})
            self._sources[id(inputs)] = kept
        _, batch, acts = kept
        missing = set(sites) - set(acts)
        if missing:
            acts.update(self.backend.run(batch, Plan(), capture=missing, logits_to_keep=1).acts)
        return batch, {site: acts[site] for site in sites}

    @contextmanager
    def source_cache(self) -> Iterator[None]:
        """Inside the block, the activations that mean / resample ablations and patches take
        from their ``corrupt`` / ``source`` inputs are captured once per inputs object (by
        identity) and site, and reused: many evaluations against one input set (a
        faithfulness curve) run its forward once instead of once per call and chunk. The
        same numbers; the cache holds what one call over every site would, and is dropped
        on exit (nested blocks share the outer one)."""
        if self._sources is not None:
            yield
            return
        self._sources = {}
        try:
            yield
        finally:
            self._sources = None

    def run_plan(
        self,
        batch: Batch,
        plan: Plan,
        capture: Collection[Site] = (),
        logits_to_keep: int = 0,
        *,
        reads: Sequence[Read] = (),
        grad: bool = False,
        prefix: bool = True,
    ) -> RunOutput:
        """The one way a forward of a `Plan` runs (`Backend.run`'s arguments): from the clean
        prefix cached by an open `prefix_cache` where the plan allows (see
        `gna_interp.models.prefix`), or in full with ``prefix=False``. With ``grad=True``
        (autograd records the forward) or ``reads`` (attention weights read where they are
        made), only from a batch the cache already holds (`PrefixCache.run_held`), else in full."""
        if self._prefix is not None and prefix and (grad or reads):
            held = self._prefix.run_held(batch, plan, capture, logits_to_keep, grad=grad, reads=reads)
            if held is not None:
                return held
        if self._prefix is None or not prefix or grad or reads:
            out = self.backend.run(batch, plan, capture=capture, reads=reads, grad=grad, logits_to_keep=logits_to_keep)
            return out  # type: ignore[no-any-return]
        return self._prefix.run(batch, plan, capture, logits_to_keep)

    @property
    def is_remote(self) -> bool:
        """Whether the model's forwards run elsewhere (NDIF, or nnsight's ``remote="local"``
        simulation): no local backward, no prefix cache, each forward a request."""
        return bool(getattr(self.backend, "remote", False))

    def prefix_sites(self, batch: Batch) -> set[Site]:
        """The residual sites an open `prefix_cache` keeps of ``batch`` (empty when none is open):
        a caller whose forward computes the clean run captures them for `remember_prefix`."""
        if self._prefix is None:
            return set()
        return {Site(SiteKind.RESID, layer) for layer in self._prefix.layers_to_keep(batch)}

    def remember_prefix(self, batch: Batch, acts: Mapping[Site, Tensor]) -> None:
        """Give an open `prefix_cache` ``batch``'s clean residual streams (`prefix_sites`,
        captured by a forward equal to the clean one); nothing without an open cache."""
        if self._prefix is not None:
            self._prefix.remember(batch, {site.layer: act for site, act in acts.items() if site.kind is SiteKind.RESID})

    @contextmanager
    def prefix_cache(self, max_mb: float = DEFAULT_PREFIX_MB) -> Iterator[PrefixCache | None]:
        """Inside the block, forwards over a batch seen before start at their first edited
        block from its cached clean residual stream (`gna_interp.models.prefix`): the same
        numbers, fewer blocks evaluated. Nested blocks share the outer cache; a remote model
        gets none (yields ``None``). The cache is dropped on exit."""
        if self._prefix is not None or self.is_remote:
            yield self._prefix
            return
        self._prefix = PrefixCache(self.backend, self.n_layers, self.d_model, max_mb)
        try:
            yield self._prefix
        finally:
            self._prefix = None

    def logits(self, inputs: Any, interventions: Intervention | Sequence[Intervention] = (), logits_to_keep: int = 0) -> Tensor:
        """``[batch, pos, vocab]`` logits with ``interventions`` (and any active
        ``ablated`` / ``intervening`` contexts) applied; ``logits_to_keep=k > 0``: the last
        ``k`` positions' alone, ``[batch, k, vocab]``, computed there alone (`run`)."""
        return self.run(inputs, interventions, logits_to_keep=logits_to_keep)[0]

    def cache(self, inputs: Any, targets: Target | Iterable[Target], interventions: Sequence[Intervention] = ()) -> dict[Target, Tensor]:
        return self.run(inputs, interventions, capture=_capture_list(targets, "targets"))[1]

    @contextmanager
    def intervening(self, *interventions: Intervention) -> Iterator[GnaModel]:
        """Apply ``interventions`` to every call inside the block. Nothing is edited
        in the model; leaving the block (normally or by an exception) ends it."""
        for item in interventions:
            if not isinstance(item, Intervention):  # type: ignore[arg-type, misc]
                kinds = "Ablate, KeepOnly, Patch, SkipLayers, Truncate, MaskAttentionRows"
                raise GnaTypeError(f"expected an intervention ({kinds}), got {item!r}")
        depth = len(self._ambient)
        self._ambient.extend(interventions)
        try:
            yield self
        finally:
            del self._ambient[depth:]

    @contextmanager
    def ablated(self, heads: Head | Iterable[Head], *, how: str = "zero", corrupt: Any = None) -> Iterator[GnaModel]:
        """``with model.ablated([Head(16, 22)]):`` every call inside runs with those heads
        ablated (``how`` and ``corrupt`` as in `Ablate`)."""
        ablation = Ablate(heads, how=how, corrupt=corrupt)
        for head in ablation.heads:
            self.check_head(head)
        with self.intervening(ablation):
            yield self

    @property
    def active_interventions(self) -> tuple[Intervention, ...]:
        return tuple(self._ambient)

    def __repr__(self) -> str:
        if self.arch.layer_kind is LayerKind.HYBRID:
            kinds = ",".join(f"{kind.value}:{sum(k is kind for k in self.layer_kinds)}" for kind in LayerKind if kind in self.layer_kinds)
            heads = f"heads<={self.n_heads} ({kinds})"
        else:
            heads = f"heads={self.n_heads}x{self.head_dim}"
        return f"GnaModel({self.name!r}, family={self.arch.family}, backend={self.backend_name}, layers={self.n_layers}, {heads})"


def context_limit(hf_model: Any) -> int | None:
    """The model's context window, its config's ``max_position_embeddings`` (``None``: none set)."""
    limit = getattr(getattr(hf_model, "config", None), "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def check_model(model: object, call: str) -> None:
    """A clear `TypeError` where ``call``'s ``model`` argument is not a `GnaModel` (a hub
    id or toy name given as text, a raw HF model, or a task passed first by mistake)."""
    if isinstance(model, GnaModel):
        return
    kind = type(model).__name__
    if isinstance(model, str):
        hint = f"; load it first: gna.load({model!r}) (a hub id or folder) or gna.load_toy({model!r}) (a bundled toy)"
    elif kind == "Task":
        hint = f"; the task came first: {call}(model, task, ...) takes the model first"
    elif isinstance(model, torch.nn.Module):
        hint = "; wrap a transformers model with gna.load(hf_model, tokenizer=...)"
    else:
        hint = " (gna.load or gna.load_toy returns one)"
    shown = f"<a {kind}>" if isinstance(model, torch.nn.Module) else short_repr(model)  # a module's repr runs to pages
    raise GnaTypeError(f"{call}: model={shown} ({kind}): expected a gna_interp GnaModel{hint}")


def check_model_and_task(model: object, task: object, call: str) -> None:
    """`check_model`, then a clear `TypeError` where ``call``'s ``task`` is not a `Task`
    (`tasks.base.not_a_task`): both name a swapped ``(task, model)`` as such."""
    check_model(model, call)
    if not isinstance(task, Task):
        raise not_a_task(task, call)


def _capture_list(capture: Any, what: str = "capture") -> list[Target]:
    """``capture`` (one `Head` or `Resid`, or an iterable of them) as a list; a string
    (``"L1H0"``, which would be read letter by letter) or a non-iterable raises, naming
    the argument ``what``."""
    if isinstance(capture, (Head, Resid)):
        return [capture]
    refuse_string(capture, what)
    if not isinstance(capture, Iterable):
        raise GnaTypeError(f"{what}={capture!r} ({type(capture).__name__}): expected a Head or Resid, or a list of them")
    return list(capture)
