"""Intervention descriptions: plain data that every backend applies the same way.

An intervention says *what* to change; `gna_interp.core.compile` turns a list of
them into tensor edits (a `Plan`) for one batch, and a backend applies the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .errors import GnaTypeError, GnaValueError
from .heads import Head, Resid, Target, refuse_string

AblationKind = Literal["zero", "mean", "resample"]
ABLATION_KINDS: tuple[str, ...] = ("zero", "mean", "resample")

Positions = int | Sequence[int] | torch.Tensor | None
"""Where a patch applies: ``None`` (all positions), an int or list of ints (the same
positions in every row; negative counts from the end), a 1-D ``[batch]`` long tensor
(one position per row), a 2-D ``[batch, k]`` long tensor (``k`` positions per row, e.g.
an encoded task's ``segment_ends``), or a ``[batch, pos]`` bool mask."""


def _refuse_single(value: object, what: str, expected: str) -> None:
    """A value that is neither one item nor a collection of them (``Ablate(3)``): a
    message naming it, instead of Python's "'int' object is not iterable"."""
    if not isinstance(value, Iterable):
        raise GnaTypeError(f"{what}={value!r} ({type(value).__name__}): expected {expected}")


def _as_heads(heads: Head | Iterable[Head], what: str) -> tuple[Head, ...]:
    """``heads`` (one `Head` or an iterable of them) as a non-empty tuple; anything else
    raises a `TypeError` naming ``what``, the value and the expected form."""
    refuse_string(heads, what)
    expected = "a gna_interp.Head or a list of them, e.g. [gna.Head(1, 0)]"
    if not isinstance(heads, Head):
        _refuse_single(heads, what, expected)
    items = (heads,) if isinstance(heads, Head) else tuple(heads)  # type: ignore[arg-type]
    for item in items:
        if not isinstance(item, Head):
            hint = f" (gna.Head{tuple(item)!r} builds it)" if _is_pair(item) else ""
            raise GnaTypeError(f"{what} must contain gna_interp.Head values, got {item!r} ({type(item).__name__}){hint}")
    if not items:
        raise GnaValueError(f"{what} is empty: expected at least one gna_interp.Head")
    return items


def _is_pair(item: object) -> bool:
    """``(layer, head)`` written as a pair of ints."""
    return isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in item)


def _as_layers(layers: int | Iterable[int], what: str) -> tuple[object, ...]:
    """One layer index or several, as a tuple (the items are checked by the caller)."""
    if isinstance(layers, int):
        return (layers,)
    _refuse_single(layers, what, "a layer index (int) or a list of them")
    return tuple(layers)


head_tuple = _as_heads
"""The check behind every ``heads=`` argument (interventions, sweeps, patterns)."""


@dataclass(frozen=True)
class Ablate:
    """Replace the output of ``heads``.

    Args:
        heads: heads to ablate.
        how: ``"zero"`` (the paper's method), ``"mean"`` (the head's output averaged
            over every non-padding token of ``corrupt``) or ``"resample"`` (the
            head's output on ``corrupt`` at the same positions; ``corrupt`` must
            tokenize to the same ``[batch, pos]`` as the inputs, or to one row).
        corrupt: inputs for ``mean`` / ``resample``; activations are taken from a
            forward with no interventions.
        positions: where to ablate (see `Positions`); ``None``, every position. A head's
            output at position ``t`` feeds only the residual stream at ``t``, so this
            tells which positions a head's effect enters through (e.g. each prompt's
            final position, or its segment ends).
    """

    heads: tuple[Head, ...]
    how: AblationKind = "zero"
    corrupt: Any = None
    positions: Positions = None

    def __init__(self, heads: Head | Iterable[Head], *, how: str = "zero", corrupt: Any = None, positions: Positions = None) -> None:
        if how not in ABLATION_KINDS:
            raise GnaValueError(f"how={how!r} is not an ablation kind: expected one of {ABLATION_KINDS}")
        if how != "zero" and corrupt is None:
            raise GnaValueError(f"how={how!r} needs corrupt= inputs to take activations from")
        object.__setattr__(self, "heads", _as_heads(heads, "Ablate heads"))
        object.__setattr__(self, "how", how)
        object.__setattr__(self, "corrupt", corrupt)
        object.__setattr__(self, "positions", positions)


@dataclass(frozen=True)
class Patch:
    """Replace activations at ``targets`` with their values on ``source``.

    ``source`` keeps its name (every other public function says ``corrupt``): a patch's
    source is the clean run when denoising, the corrupted one when noising.

    Args:
        targets: heads and/or residual-stream sites.
        source: inputs whose activations are patched in; must tokenize to the same
            number of positions as the patched inputs (and the same rows, or one row).
        positions: see `Positions`; ``None`` patches every position.
    """

    targets: tuple[Target, ...]
    source: Any
    positions: Positions = None

    def __init__(self, targets: Target | Iterable[Target], source: Any, positions: Positions = None) -> None:
        refuse_string(targets, "Patch targets")
        if not isinstance(targets, (Head, Resid)):
            _refuse_single(targets, "Patch targets", "a gna_interp.Head or Resid, or a list of them, e.g. [gna.Head(1, 0)]")
        items = (targets,) if isinstance(targets, (Head, Resid)) else tuple(targets)  # type: ignore[arg-type]
        for item in items:
            if not isinstance(item, (Head, Resid)):
                raise GnaTypeError(f"Patch targets must be Head or Resid values, got {item!r}")
        if not items:
            raise GnaValueError("Patch targets is empty: expected at least one Head or Resid")
        if source is None:
            raise GnaValueError("Patch needs source= inputs to take activations from")
        object.__setattr__(self, "targets", items)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "positions", positions)


@dataclass(frozen=True)
class SkipLayers:
    """Layer ablation: skip these blocks; the residual stream passes through."""

    layers: tuple[int, ...]

    def __init__(self, layers: int | Iterable[int]) -> None:
        items = _as_layers(layers, "SkipLayers layers")
        for layer in items:
            if isinstance(layer, bool) or not isinstance(layer, int):
                raise GnaTypeError(f"SkipLayers layers must be ints, got {layer!r} ({type(layer).__name__})")
            if layer < 0:
                raise GnaValueError(f"SkipLayers layers must be >= 0, got {layer}")
        object.__setattr__(self, "layers", tuple(sorted(set(items))))


@dataclass(frozen=True)
class Truncate:
    """Keep the first ``n_layers`` blocks, then the final norm and unembedding (the
    paper's truncation scan). Equivalent to skipping every later block."""

    n_layers: int

    def __post_init__(self) -> None:
        if isinstance(self.n_layers, bool) or not isinstance(self.n_layers, int) or self.n_layers < 0:
            raise GnaValueError(f"Truncate n_layers must be a non-negative int, got {self.n_layers!r}")


@dataclass(frozen=True)
class MaskAttentionRows:
    """Zero chosen query rows of the attention weights, after the softmax and without
    renormalising (the paper's Zamba2 experiment masked each prompt's final row in every
    attention call).

    A row of weights that is all zero makes that head's attention output exactly zero at
    that query position (``0 @ V = 0``), so this is applied as a zero-ablation of the
    attention heads' outputs (the out-projection input) at those positions. It needs no
    particular attention implementation and gives the same numbers on every backend,
    locally and remotely. SSM heads are never touched.

    Args:
        positions: the query rows (see `Positions`); default ``-1``, each prompt's final
            position (left padding keeps it in the last column). ``[]`` masks nothing.
        layers: attention layers to mask (default: every attention layer).
        heads: only these attention heads (default: every attention head of ``layers``).
            Give ``layers`` or ``heads``, not both.
        keep: ``True`` inverts the rows: keep only ``positions`` and zero every other
            query row.
    """

    positions: Positions = -1
    layers: tuple[int, ...] | None = None
    heads: tuple[Head, ...] | None = None
    keep: bool = False

    def __init__(
        self,
        positions: Positions = -1,
        layers: int | Iterable[int] | None = None,
        heads: Head | Iterable[Head] | None = None,
        keep: bool = False,
    ) -> None:
        if positions is None:
            raise GnaValueError("MaskAttentionRows positions=None is ambiguous: give the rows to mask (e.g. -1) or [] for none")
        if layers is not None and heads is not None:
            raise GnaValueError("MaskAttentionRows takes layers= or heads=, not both")
        if layers is not None:
            items = _as_layers(layers, "MaskAttentionRows layers")
            for layer in items:
                if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
                    raise GnaValueError(f"MaskAttentionRows layers must be non-negative ints, got {layer!r}")
            object.__setattr__(self, "layers", tuple(sorted(set(items))))
        else:
            object.__setattr__(self, "layers", None)
        object.__setattr__(self, "heads", None if heads is None else _as_heads(heads, "MaskAttentionRows heads"))
        if not isinstance(keep, bool):
            raise GnaTypeError(f"MaskAttentionRows keep must be a bool, got {keep!r}")
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "keep", keep)


HEAD_KINDS: tuple[str, ...] = ("attention", "ssm", "all")


@dataclass(frozen=True)
class KeepOnly:
    """Keep ``heads`` and ablate every other head of ``kind`` (the opposite of `Ablate`).

    Heads of other kinds are untouched: ``KeepOnly(heads, kind="attention")`` on a hybrid
    ablates every attention head but the kept ones and leaves its SSM heads alone.
    Keeping every head of the kind changes nothing (the clean run, exactly); keeping none
    equals `Ablate` of every head of the kind.

    Args:
        heads: heads to keep (may be empty: ablate every head of ``kind``); each must be
            of ``kind`` (checked against the model when applied).
        kind: ``"attention"``, ``"ssm"`` or ``"all"`` (attention and SSM heads alike).
        how: how the others are ablated: ``"mean"`` (default), ``"zero"`` or ``"resample"``,
            with ``corrupt`` as in `Ablate`.
        corrupt: inputs for ``mean`` / ``resample``. With ``how="mean"`` and ``corrupt=None``
            the mean is taken over the inputs of the forward it runs in (a plain forward
            over them, with no interventions), so ``KeepOnly(heads)`` works as it stands;
            ``"resample"`` needs ``corrupt``.
    """

    heads: tuple[Head, ...]
    kind: str = "attention"
    how: AblationKind = "mean"
    corrupt: Any = None

    def __init__(self, heads: Head | Iterable[Head], *, kind: str = "attention", how: str = "mean", corrupt: Any = None) -> None:
        if kind not in HEAD_KINDS:
            raise GnaValueError(f"KeepOnly kind={kind!r}: expected one of {HEAD_KINDS}")
        if how not in ABLATION_KINDS:
            raise GnaValueError(f"KeepOnly how={how!r} is not an ablation kind: expected one of {ABLATION_KINDS}")
        refuse_string(heads, "KeepOnly heads")  # before the corrupt check: the typo is the first thing to fix
        if how == "resample" and corrupt is None:
            raise GnaValueError("KeepOnly how='resample' needs corrupt= inputs to take activations from (same length as the inputs)")
        if not isinstance(heads, Head):
            _refuse_single(heads, "KeepOnly heads", "a gna_interp.Head or a list of them (empty: keep none)")
        listed: tuple[Head, ...] = (heads,) if isinstance(heads, Head) else tuple(heads)
        kept = _as_heads(listed, "KeepOnly heads") if listed else ()
        if len(set(kept)) != len(kept):
            repeated = sorted({str(h) for h in kept if kept.count(h) > 1})
            raise GnaValueError(f"KeepOnly heads repeat {repeated}: expected each head once")
        object.__setattr__(self, "heads", kept)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "how", how)
        object.__setattr__(self, "corrupt", corrupt)


Intervention = Ablate | KeepOnly | Patch | SkipLayers | Truncate | MaskAttentionRows
INTERVENTION_TYPES: tuple[type, ...] = (Ablate, KeepOnly, Patch, SkipLayers, Truncate, MaskAttentionRows)


def as_interventions(items: Intervention | Iterable[Intervention] | None, what: str = "interventions") -> list[Intervention]:
    """One intervention or several, as a list (``gna.Ablate(...)`` and ``[gna.Ablate(...)]``
    mean the same); a clear error for anything else."""
    if items is None:
        return []
    if isinstance(items, INTERVENTION_TYPES):
        return [items]  # type: ignore[list-item]
    kinds = "an intervention (Ablate, KeepOnly, Patch, SkipLayers, Truncate, MaskAttentionRows)"
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise GnaTypeError(f"{what}={items!r}: expected {kinds} or a list of them")
    listed = list(items)
    for index, item in enumerate(listed):
        if not isinstance(item, INTERVENTION_TYPES):
            raise GnaTypeError(f"{what}[{index}] is {item!r}: expected {kinds}")
    return listed
