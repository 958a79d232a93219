"""`ModelLayout`: a model's layers, heads and sites, resolved from its architecture row and
config. No weights and no backend: what the plan compiler and every check need.

A `GnaModel` holds one (``model.layout``) and answers the same questions through it.
"""

from __future__ import annotations

from .arch import LayerKind, LayerMixer, LayerSpec, check_head_in
from .errors import GnaTypeError, GnaValueError
from .heads import Head, Resid, Target, typed_head_hint
from .plan import Site, SiteKind


class ModelLayout:
    """Heads are numbered per layer over the layer's mixers, attention heads first, then
    SSM heads. A layer in `foreign_layers` (a block of another family, swapped in) has no
    heads the architecture table describes: 0 heads, kind ``MLP``.

    Args:
        name: the model's name, for errors.
        specs: the layers as the architecture table describes them, one `LayerSpec` each.
        d_model: the residual stream's width.
        foreign_layers: layer -> the donor's ``model_type``; shared with the model, which
            updates it in place while a swap lasts.
    """

    def __init__(self, name: str, specs: tuple[LayerSpec, ...], d_model: int, foreign_layers: dict[int, str]) -> None:
        self.name = name
        self.n_layers = len(specs)
        self.d_model = d_model
        self.foreign_layers = foreign_layers
        self._own_specs = specs
        self._specs_cache: tuple[frozenset[int], tuple[LayerSpec, ...]] = (frozenset(), specs)
        mixers = [mixer for spec in specs for mixer in spec.mixers]
        self.n_heads: int = max((spec.n_heads for spec in specs), default=0)
        """The most heads any layer has: the width of every ``[layer, head]`` table. The
        model's own: a swap leaves it as it is."""
        self.head_dim: int = max((mixer.head_dim for mixer in mixers), default=0)
        """The widest head (every head in pure families); `head_dim_of` for one head."""

    @property
    def layer_specs(self) -> tuple[LayerSpec, ...]:
        """Per layer: its mixers (kind, path, heads, width), in head-numbering order; none
        at `foreign_layers`."""
        if not self.foreign_layers:
            return self._own_specs
        key = frozenset(self.foreign_layers)
        if self._specs_cache[0] != key:
            specs = tuple(LayerSpec(spec.layer, ()) if spec.layer in key else spec for spec in self._own_specs)
            self._specs_cache = (key, specs)
        return self._specs_cache[1]

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        return tuple(spec.kind for spec in self.layer_specs)

    @property
    def heads_per_layer(self) -> tuple[int, ...]:
        return tuple(spec.n_heads for spec in self.layer_specs)

    @property
    def heads(self) -> list[Head]:
        """Every head, layer-major; none at `foreign_layers`."""
        return [Head(layer, head) for layer in range(self.n_layers) for head in range(self.heads_per_layer[layer])]

    def check_layer(self, layer: int, *, allow_final: bool = False) -> None:
        top = self.n_layers if allow_final else self.n_layers - 1
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise GnaTypeError(f"layer must be an int, got {layer!r}")
        if not 0 <= layer <= top:
            raise GnaValueError(f"layer {layer} out of range: {self.name} has layers 0..{top}")

    def check_head(self, head: Head) -> None:
        if not isinstance(head, Head):
            raise GnaTypeError(f"expected a gna_interp.Head, got {head!r} ({type(head).__name__}){typed_head_hint(head)}")
        self.check_layer(head.layer)
        if head.layer in self.foreign_layers:
            raise GnaValueError(
                f"head {head}: layer {head.layer} of {self.name} holds a swapped-in {self.foreign_layers[head.layer]} block "
                "(swap_layers), whose heads the architecture table does not describe, so head-level interventions there are "
                f"not supported; residual-stream sites (Resid({head.layer}), Resid({head.layer + 1})) and SkipLayers({head.layer}) "
                "work at that layer, and heads work at every other layer"
            )
        check_head_in(self.layer_specs, head, self.name)

    def mixer_of(self, head: Head) -> tuple[LayerMixer, int]:
        """The mixer that holds ``head`` and the head's index among that mixer's heads."""
        self.check_head(head)
        return self.layer_specs[head.layer].locate(head.head)

    def head_kind(self, head: Head) -> LayerKind:
        """``ATTENTION`` or ``SSM``."""
        return self.mixer_of(head)[0].kind

    def head_site(self, head: Head) -> tuple[Site, int]:
        """The site of ``head``'s mixer and the head's index in that site's ``head`` axis."""
        mixer, index = self.mixer_of(head)
        return Site(SiteKind.HEADS, head.layer, mixer=mixer.index), index

    def head_sites(self, layer: int) -> list[Site]:
        """One head site per mixer of ``layer`` (none for a layer without heads)."""
        return [Site(SiteKind.HEADS, layer, mixer=mixer.index) for mixer in self.layer_specs[layer].mixers]

    def mixer(self, site: Site) -> LayerMixer:
        """The mixer a head or stream site belongs to."""
        return self.layer_specs[site.layer].mixers[site.mixer]

    def site_of(self, target: Target) -> Site:
        if isinstance(target, Head):
            return self.head_site(target)[0]
        if isinstance(target, Resid):
            self.check_layer(target.layer, allow_final=True)
            return Site(SiteKind.RESID, target.layer)
        raise GnaTypeError(f"expected a Head or Resid, got {target!r}{typed_head_hint(target)}")

    def site_shape(self, site: Site) -> tuple[int, ...]:
        """Per-position shape of a site's activation: ``(head, d_head)`` or ``(d_model,)``."""
        if site.kind in (SiteKind.HEADS, SiteKind.PRE_NORM):
            mixer = self.mixer(site)
            return (mixer.n_heads, mixer.head_dim)
        return (self.d_model,)
