"""TransformerLens backend: a `TransformerBridge` with hooks scoped to one forward.

Every site is the input or the output of one module of the HF model (a `Tap`), the same
module the nnsight backend addresses. The table `TAPS` says which, per site kind; `tap`
is the one function that turns a site into a hook:

- heads of mixer ``m`` of layer ``l``: the input of its out-projection, viewed
  ``[batch, pos, head, d_head]`` (Llama: ``blocks.{l}.attn.o.hook_in``, alias
  ``attn.hook_z``; Mamba-2: ``blocks.{l}.mixer.out_proj.hook_in``);
- residual stream entering block ``l``: the input of block ``l`` (``blocks.{l}.hook_in``,
  alias ``hook_resid_pre``), or of the final norm (``ln_final.hook_in``) for
  ``l == n_layers``;
- an input stream of mixer ``m`` (`SiteKind.STREAM`): columns of the output (or input) of
  its module (``q_proj``: ``blocks.{l}.attn.q.hook_out``, alias ``attn.hook_q``;
  Mamba-2 ``in_proj``: ``blocks.{l}.mixer.in_proj.hook_out``; Mamba-1 ``x_proj``'s input:
  ``blocks.{l}.mixer.x_proj.hook_in``), viewed ``[batch, pos, unit, width]``;
- block ``l``'s MLP (`SiteKind.MLP_IN` / `SiteKind.MLP_OUT`): the input of its norm
  (``blocks.{l}.ln2.hook_in``) / the MLP's output (``blocks.{l}.mlp.hook_out``);
- a skipped block ``l`` stashes the block's input and writes it over its output
  (``blocks.{l}.hook_in`` / ``hook_out``, aliases ``hook_resid_pre`` / ``hook_resid_post``);
- a plan that starts at block ``l`` does not run blocks ``0 .. l-1``: for that one forward
  each of them returns the given residual stream instead of computing (its ``forward`` is
  shadowed on the instance and restored afterwards, exceptions included; generic over
  block types: only the block's return structure, ``ArchSpec.block_output``, is needed),
  and the input of block ``l`` (the final norm for ``l == n_layers``: no block runs) is
  replaced by that stream. The bridge itself runs on the tokens (see `TLensBackend.run`);
- a `Read`: ``PATTERN`` is ``blocks.{l}.attn.hook_pattern`` (``[batch, head, query,
  key]``; the bridge runs attention eagerly); ``OUTPUT`` is the output of the mixer's
  submodule ``name``; ``PARAM`` is read straight from the module, no hook.

A module the bridge wraps has its own hook points (``hook_in`` / ``hook_out``): the tap
uses them by name (``HookPoint.add_hook``, as ``bridge.hooks`` does). A module the bridge
does not wrap (GraniteMoeHybrid's Mamba-2 ``out_proj``, NemotronH's attention, Zamba2's
hybrid layers, Qwen3-Next's gated DeltaNet, FalconMamba's ``dt`` / ``B`` / ``C`` norms) gets
a raw torch hook on the module itself, registered for the one forward and removed after it,
exceptions included.
An attention mixer without ``hook_pattern`` gives its weights as item 1 of its output.

Hooks that never fire. HF's PyTorch path for Mamba and Mamba-2 (the one that runs on
CPU) does not call ``conv1d`` or ``dt_proj`` as modules, so the bridge's
``mixer.conv1d.hook_*`` and ``mixer.dt_proj.hook_*`` never fire. No site uses them:
implicit attention reads ``in_proj``'s (Mamba-2) or ``x_proj``'s (Mamba-1) output and the
conv / ``dt_proj`` *weights*, and recomputes the conv itself
(`gna_interp.attention.capture`). Every hook counts its firings in the forward; one that
fired 0 times (a site at or after the plan's start layer whose module the model did not
call, e.g. a fused kernel that reads the module's weights) raises
`gna_interp.core.errors.SiteNotFiredError` naming the site and the module path, instead of
editing or returning nothing.

A module object shared by several blocks (Zamba2's attention block in the transformers
4.x layout) runs once per block: its hooks act only while the block of their site runs.

Note: booting a bridge wraps the HF model's modules in place (and switches it to eager
attention); the HF model still computes the same function.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ..core.arch import ArchSpec, LayerMixer, LayerSpec
from ..core.errors import GnaTypeError, GnaValueError
from ..core.inputs import Batch
from ..core.plan import Plan, Read, ReadKind, Site, SiteKind
from ..cost import charge_forward
from .base import RunOutput, attention_kernel, eager_attention
from .finite import check_logits, keep_last, output_embedding_path
from .tlens_hooks import (
    HookFn,
    Need,
    Tap,
    View,
    _add_forward_hook,
    _check_fired,
    _check_hook_to_add,
    _enter_block,
    _firing,
    _hook_prefix,
    _in_input_dtype,
    _last_positions,
    _raw_post,
    _raw_pre,
    _read_hook,
    _remove_handle,
    _select,
    _site_hook,
    _skip_hook,
    _start_hook,
    _stash_hook,
)


def _heads(backend: TLensBackend, site: Site) -> tuple[str, str, View]:
    mixer = backend.mixer(site.layer, site.mixer)
    return mixer.out_proj_path, "input", ("heads", (mixer.n_heads, mixer.head_dim))


def _pre_norm(backend: TLensBackend, site: Site) -> tuple[str, str, View]:
    """Mamba-2's group-norm input (the scan output ``y``), per head: the first input of
    the mixer's gated norm (`gna_interp.core.arch.LayerMixer.norm_path`)."""
    mixer = backend.mixer(site.layer, site.mixer)
    if not mixer.norm_path:
        raise GnaValueError(f"layer {site.layer} mixer {site.mixer} has no gated group norm: no {site.kind.value} site")
    return mixer.norm_path, "input", ("heads", (mixer.n_heads, mixer.head_dim))


def _resid(backend: TLensBackend, site: Site) -> tuple[str, str, View]:
    path = backend.spec.final_norm_path if site.layer == backend.n_layers else backend.spec.block_path(site.layer)
    return path, "input", ("all", ())


def _mlp_in(backend: TLensBackend, site: Site) -> tuple[str, str, View]:
    return backend.spec.mlp_path(site.layer, 0), "input", ("all", ())


def _mlp_out(backend: TLensBackend, site: Site) -> tuple[str, str, View]:
    return backend.spec.mlp_path(site.layer, 1), "output", ("all", ())


def _stream(backend: TLensBackend, site: Site) -> tuple[str, str, View]:
    mixer = backend.mixer(site.layer, site.mixer)
    stream = mixer.stream(site.stream)
    return f"{mixer.path}.{stream.module}", stream.io, ("columns", stream.layout(mixer.dims))


TAPS: dict[SiteKind, Callable[[TLensBackend, Site], tuple[str, str, View]]] = {
    SiteKind.HEADS: _heads,
    SiteKind.PRE_NORM: _pre_norm,
    SiteKind.RESID: _resid,
    SiteKind.STREAM: _stream,
    SiteKind.MLP_IN: _mlp_in,
    SiteKind.MLP_OUT: _mlp_out,
}
"""Site kind -> ``(module path, "input" | "output", view)``: where a site lives. A new site
kind is one entry here (and one in the nnsight backend's `steps`)."""


Native = tuple[nn.Module, Callable[..., Any], str]
"""``(bridge component, HF's forward to run in its place, prefix of its own hook names)``."""

_UNSET = object()  # a module had no instance-level ``forward`` before `_shadowed_forwards`


@contextmanager
def _shadowed_forwards(replacements: Sequence[tuple[nn.Module, Callable[..., Any]]]) -> Iterator[None]:
    """Each module's ``forward`` replaced on the instance for the block inside, and its own
    (an instance-level one too, e.g. accelerate's wrapper) restored on exit, exceptions
    included. ``object.__setattr__``: a bridge component's ``__setattr__`` would forward the
    attribute to the HF module it wraps."""
    saved = [module.__dict__.get("forward", _UNSET) for module, _ in replacements]
    try:
        for module, forward in replacements:
            object.__setattr__(module, "forward", forward)
        yield
    finally:
        for (module, _), previous in zip(replacements, saved, strict=True):
            if previous is _UNSET:
                module.__dict__.pop("forward", None)
            else:
                object.__setattr__(module, "forward", previous)


class TLensBackend:
    name = "tlens"

    def __init__(self, bridge: Any, spec: ArchSpec, layers: Sequence[LayerSpec], attn_implementation: str | None = None) -> None:
        """``attn_implementation``: the HF model's attention kernel before the bridge
        switched it to eager (``"sdpa"``, ``"eager"``, ...); forwards that read no
        pattern run it (`TLensBackend._native_forwards`). ``None``: keep the config's."""
        self.bridge = bridge
        self.spec = spec
        self.layers = tuple(layers)
        self.n_layers = len(self.layers)
        self.root: nn.Module = bridge.original_model
        self.attn_implementation = attn_implementation
        self._shared: dict[int, tuple[int, ...]] | None = None
        self._kernel_attentions: list[Native] | None = None
        self._native_norms: list[Native] | None = None
        self._hook_points: dict[str, Any] | None = None
        self._unembedding: str | None = None

    # ----- where sites live ----------------------------------------------------------------
    def mixer(self, layer: int, index: int) -> LayerMixer:
        mixers = self.layers[layer].mixers
        if not 0 <= index < len(mixers):
            raise GnaValueError(f"layer {layer} has {len(mixers)} mixer(s): no mixer {index}")
        return mixers[index]

    def tap(self, site: Site) -> tuple[Tap, View]:
        """The hook of ``site`` and how the site sits in the hooked tensor."""
        path, io, view = TAPS[site.kind](self, site)
        return self._resolve(site.layer, path, io), view

    def read_tap(self, read: Read) -> Tap:
        mixer = self.mixer(read.layer, read.mixer)
        if read.kind is ReadKind.PATTERN:
            # An attention mixer the bridge does not wrap returns (output, weights): item 1.
            return Tap(read.layer, mixer.path, "output", self._hook_name(mixer.path, "hook_pattern"), item=1)
        path = f"{mixer.path}.{read.name}"
        try:
            self.root.get_submodule(path)
        except AttributeError:
            raise GnaValueError(
                f"cannot read output {read.name!r} of layer {read.layer}: its {mixer.kind.value} mixer ({mixer.path}) has no such submodule"
            ) from None
        return self._resolve(read.layer, path, "output")

    def _resolve(self, layer: int, path: str, io: str) -> Tap:
        return Tap(layer, path, io, self._hook_name(path, "hook_in" if io == "input" else "hook_out"))

    def _hook_name(self, path: str, attribute: str) -> str:
        """The name of the bridge's hook point ``attribute`` of the module at ``path``, or
        ``""`` if the bridge does not wrap that module."""
        from transformer_lens.hook_points import HookPoint

        point = getattr(self.root.get_submodule(path), attribute, None)
        name = point.name if isinstance(point, HookPoint) else None
        return name if name is not None and self._points().get(name) is point else ""

    def _points(self) -> dict[str, Any]:
        """The bridge's hook points by name, aliases included (``bridge.hook_dict`` rebuilds
        this on every access; the bridge's hook points are fixed once it has booted)."""
        if self._hook_points is None:
            self._hook_points = dict(self.bridge.hook_dict)
        return self._hook_points

    def _param(self, read: Read) -> Tensor:
        owner, _, attr = f"{self.mixer(read.layer, read.mixer).path}.{read.name}".rpartition(".")
        value = getattr(self.root.get_submodule(owner), attr).detach()
        return _select(value, read)

    def _blocks(self) -> list[nn.Module]:
        return list(self.root.get_submodule(self.spec.layers_path).children())

    def _shared_modules(self) -> dict[int, tuple[int, ...]]:
        """``id(module) -> blocks`` for module objects registered in more than one block."""
        if self._shared is None:
            where: dict[int, list[int]] = {}
            for layer, block in enumerate(self._blocks()):
                for module in block.modules():
                    where.setdefault(id(module), []).append(layer)
            self._shared = {key: tuple(layers) for key, layers in where.items() if len(layers) > 1}
        return self._shared

    # ----- one forward -----------------------------------------------------------------------
    def run(
        self,
        batch: Batch,
        plan: Plan,
        capture: Collection[Site] = (),
        reads: Sequence[Read] = (),
        grad: bool = False,
        logits_to_keep: int = 0,
    ) -> RunOutput:
        """`gna_interp.backends.base.Backend.run`; its logits checked (`gna_interp.backends.finite`)."""
        out = self._forward(batch, plan, capture, reads, grad, logits_to_keep)
        check_logits(self.name, out.logits, batch, plan, self.layers, self._unchecked(logits_to_keep), self.root)
        return out

    def _unchecked(self, logits_to_keep: int) -> Callable[[Batch, Plan, Collection[Site]], RunOutput]:
        def forward(batch: Batch, plan: Plan, capture: Collection[Site]) -> RunOutput:
            return self._forward(batch, plan, capture, (), False, logits_to_keep)

        return forward

    def _unembedding_tap(self) -> Tap | None:
        """The input of the unembedding (``lm_head``), where ``logits_to_keep`` narrows the
        hidden states to the positions read; ``None`` if the model has none to find."""
        if self._unembedding is None:
            self._unembedding = output_embedding_path(self.root)
        return self._resolve(self.n_layers, self._unembedding, "input") if self._unembedding else None

    def _forward(
        self, batch: Batch, plan: Plan, capture: Collection[Site], reads: Sequence[Read], grad: bool, logits_to_keep: int
    ) -> RunOutput:
        if logits_to_keep < 0:
            raise GnaValueError(f"logits_to_keep={logits_to_keep}: expected 0 (every position) or k > 0 (the last k positions)")
        captured: dict[Site, Tensor] = {}
        values: list[Tensor] = [torch.empty(0)] * len(reads)
        stash: dict[int, Tensor] = {}
        hooks: dict[Tap, list[tuple[HookFn, Need]]] = {}
        start_layer = plan.start_layer

        def add(tap: Tap, fn: HookFn, need: Need) -> None:
            hooks.setdefault(tap, []).append((fn, need))

        if plan.start is not None:  # first hook at the start block's (or final norm's) input: the given residual
            resid = plan.start[1]
            if not isinstance(resid, Tensor):  # a `Ref` to another job's capture: sessions are nnsight's (remote)
                raise GnaTypeError(f"backend 'tlens' starts a plan from a residual tensor, got {type(resid).__name__}")
            path = _resid(self, Site(SiteKind.RESID, start_layer))[0]
            add(self._resolve(start_layer, path, "input"), _start_hook(resid), f"start residual at layer {start_layer}")
        for site in sorted(set(plan.edits) | set(capture)):
            if site.layer >= start_layer:  # blocks before the start do not run: their sites are not expected to fire
                tap, view = self.tap(site)
                add(tap, _site_hook(site, view, plan.edits.get(site, []), site in capture, captured, grad), site)
        for layer, rows in plan.skips.items():
            if layer >= start_layer:
                path = self.spec.block_path(layer)
                add(self._resolve(layer, path, "input"), _stash_hook(layer, stash), f"skip of block {layer}")
                add(self._resolve(layer, path, "output"), _skip_hook(layer, rows, stash), f"skip of block {layer}")
        for slot, read in enumerate(reads):
            if read.kind is ReadKind.PARAM:
                values[slot] = self._param(read)
            elif read.layer >= start_layer:
                add(self.read_tap(read), _read_hook(read, slot, values, grad), read)

        unembedding = self._unembedding_tap() if logits_to_keep > 0 else None
        if unembedding is not None:
            add(unembedding, _last_positions(logits_to_keep), f"logits of the last {logits_to_keep} position(s)")
        counts: Counter[tuple[Tap, Need]] = Counter()  # each hook's firings in this forward
        named = [(tap.hook, _firing(fn, (tap, need), counts)) for tap, fns in hooks.items() if tap.hook for fn, need in fns]
        raw = {tap: [_firing(fn, (tap, need), counts) for fn, need in fns] for tap, fns in hooks.items() if not tap.hook}
        # The bridge runs on the tokens; blocks before a start are not run (`_not_run`) and
        # the start block's input is replaced by a hook (the bridge's own start_at_layer feeds
        # the residual in as embeddings, which SSM blocks ignore and Zamba2's hybrid layers
        # also read as their "original" embeddings).
        patterns = any(read.kind is ReadKind.PATTERN for read in reads)
        charge_forward(self, batch.n_rows, plan.start_layer, self.n_layers)
        with (
            torch.set_grad_enabled(grad),
            eager_attention(getattr(self.root, "config", None), patterns),
            self._native_forwards([name for name, _ in named], patterns),
            self._raw_hooks(raw),
            self._named_hooks(named),
            self._not_run(plan),
        ):
            logits = self.bridge(batch.input_ids, attention_mask=batch.attention_mask)
        _check_fired([(tap, need) for tap, fns in hooks.items() for _, need in fns], counts)
        return RunOutput(logits=keep_last(logits, logits_to_keep), acts=captured, reads=values)

    @contextmanager
    def _named_hooks(self, named: Sequence[tuple[str, Callable[..., Tensor]]]) -> Iterator[None]:
        """Hooks on the bridge's hook points by canonical name, added to each point directly
        and removed on exit, exceptions included. Same hooks as ``bridge.hooks(fwd_hooks=named)``
        (the point's own tensor conversion, the bridge's gating check), without rebuilding its
        alias maps on every forward (several ms, which short forwards of deep models feel)."""
        points = self._points()
        with ExitStack() as undo:
            for name, fn in named:
                point = points[name]
                _check_hook_to_add(self.bridge, point, name, fn)
                undo.callback(_remove_handle, point, _add_forward_hook(point, fn))
            yield

    @contextmanager
    def _not_run(self, plan: Plan) -> Iterator[None]:
        """Blocks before ``plan.start``'s layer return its residual without computing, for
        the forward inside the block; each block's own ``forward`` is restored on exit."""
        if plan.start is None or plan.start[0] == 0:
            yield
            return
        layer, resid = plan.start
        items = int(self.spec.block_output)  # the start residual's type is checked in `run`; tlens rows return tensors or tuples
        output = resid if items == 0 else (resid, *([None] * (items - 1)))

        def passes_resid(*args: Any, **kwargs: Any) -> Any:
            return output

        with _shadowed_forwards([(block, passes_resid) for block in self._blocks()[:layer]]):  # what the block loop calls
            yield

    def _attentions(self) -> list[Native]:
        """``(attention bridge, HF's forward, prefix of its own hook names)`` for every
        attention the bridge reimplements, if HF's own forward of each calls the bridge's
        q/k/v/o projections (so their hook points fire either way); ``[]`` if any does not."""
        if self._kernel_attentions is None:
            self._kernel_attentions = []
            try:
                from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
                from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
                    PositionEmbeddingsAttentionBridge,
                )
            except ImportError:  # a TransformerLens without these classes: always its own attention
                return self._kernel_attentions
            found: list[Native] = []
            for module in self.bridge.modules():
                if not isinstance(module, AttentionBridge):
                    continue
                hf_attention = module._modules.get("_original_component")
                pattern_name = getattr(getattr(module, "hook_pattern", None), "name", None)
                projections = [module._modules[key] for key in ("q", "k", "v", "o") if key in module._modules]
                if (
                    type(module) is not PositionEmbeddingsAttentionBridge
                    or hf_attention is None
                    or not isinstance(pattern_name, str)
                    or len(projections) != 4
                    or any(projection not in list(hf_attention.children()) for projection in projections)
                ):
                    return self._kernel_attentions  # one attention that must run the bridge's way: all do
                found.append((module, hf_attention.forward, _hook_prefix(pattern_name)))
            self._kernel_attentions = found
        return self._kernel_attentions

    def _norms(self) -> list[Native]:
        """``(norm bridge, HF's forward, prefix of its hook names)`` for every normalization
        bridge on TransformerLens's native path: with no hook on its ``hook_scale`` /
        ``hook_normalized``, that path computes the statistics for those hooks and then
        returns the HF norm's own output (cast to the input's dtype)."""
        if self._native_norms is None:
            self._native_norms = []
            try:
                from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge
            except ImportError:
                return self._native_norms
            for module in self.bridge.modules():
                hf_norm = module._modules.get("_original_component")
                name = getattr(getattr(module, "hook_in", None), "name", None)
                if (
                    isinstance(module, NormalizationBridge)
                    and type(module).forward is NormalizationBridge.forward
                    and getattr(module, "use_native_layernorm_autograd", False)
                    and hf_norm is not None
                    and not isinstance(hf_norm, nn.Identity)
                    and isinstance(name, str)
                ):
                    self._native_norms.append((module, _in_input_dtype(hf_norm), _hook_prefix(name)))
        return self._native_norms

    @contextmanager
    def _native_forwards(self, hook_names: Sequence[str], patterns: bool) -> Iterator[None]:
        """Run HF's own attention (its kernel, e.g. sdpa) and HF's own norms inside the
        bridge's modules for one forward, where nothing needs the bridge's versions.

        The bridge recomputes attention as separate matmul / mask / softmax operations so
        that ``hook_attn_scores`` and ``hook_pattern`` fire; a forward that reads no pattern
        and hooks no hook point of an attention itself (only of its ``q`` / ``k`` / ``v`` /
        ``o`` projections, which HF's forward calls) does not need that. Each attention's
        ``forward`` is shadowed on the instance by HF's, and the config's
        ``_attn_implementation`` set to the model's own kernel. Logits then equal the HF
        model's at every position (to 1e-6, tested; the bridge's recomputation differs by
        float rounding, and at padded positions). A norm none of whose hook points is hooked
        runs HF's forward alone (the bridge's native path returns that same tensor after
        computing ``hook_scale`` / ``hook_normalized`` for nobody). All restored on exit,
        exceptions included."""
        hooked = {_hook_prefix(name) for name in hook_names}
        attentions = [] if patterns else self._attentions()
        if any(prefix in hooked for _, _, prefix in attentions):
            attentions = []
        norms = [native for native in self._norms() if native[2] not in hooked]
        kernel = self.attn_implementation if attentions else None
        with (
            _shadowed_forwards([(module, forward) for module, forward, _ in attentions + norms]),
            attention_kernel(getattr(self.root, "config", None), kernel),
        ):
            yield

    @contextmanager
    def _raw_hooks(self, raw: dict[Tap, list[HookFn]]) -> Iterator[None]:
        """Torch hooks on modules the bridge does not wrap, removed on exit (also on error).
        A hook on a module shared by several blocks acts only while its own block runs."""
        with ExitStack() as undo:
            running = [-1]
            shared = self._shared_modules() if raw else {}
            if any(id(self.root.get_submodule(tap.path)) in shared for tap in raw):
                for layer, block in enumerate(self._blocks()):
                    undo.callback(block.register_forward_pre_hook(_enter_block(layer, running)).remove)
            for tap, fns in raw.items():
                module = self.root.get_submodule(tap.path)
                only = tap.layer if id(module) in shared else None
                if tap.io == "input":
                    handle = module.register_forward_pre_hook(_raw_pre(fns, only, running), with_kwargs=True)
                else:
                    handle = module.register_forward_hook(_raw_post(fns, tap.item, only, running))
                undo.callback(handle.remove)
            yield
