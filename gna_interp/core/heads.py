"""Addresses of activations: heads and residual-stream sites.

Glossary of axis names used in shapes throughout the package:

- ``batch``: prompts (rows of a padded batch; left padding).
- ``pos``: token positions.
- ``head``: heads of one layer (for Mamba-1 a head is one inner channel).
- ``d_head``: width of one head's output (1 for Mamba-1 channels).
- ``d_model``: width of the residual stream.
- ``vocab``: vocabulary entries.
- ``layer``: blocks of the model, 0-indexed.

A head's output is its slice of the *input of the out-projection* (``o_proj`` for
attention, ``mixer.out_proj`` for Mamba / Mamba-2). Zero-ablating it equals zeroing
those columns of the out-projection weight, which is how the paper's authors
disabled heads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import GnaTypeError, GnaValueError

_HEAD_PATTERN = re.compile(r"^\s*L?(\d+)\s*[.:H]\s*(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True, order=True, init=False)
class Head:
    """One head: ``Head(layer=16, head=22)``. Frozen, hashable and ordered. Text such as
    ``"L16H22"`` is read by `Head.parse`."""

    layer: int
    head: int

    def __init__(self, layer: int, head: int | None = None) -> None:
        if head is None:  # Head("16.22"), Head(16): Python would only say "missing 1 required positional argument"
            raise GnaTypeError(_missing_head(layer))
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "head", head)
        self.__post_init__()

    def __post_init__(self) -> None:
        for field, value in (("layer", self.layer), ("head", self.head)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise GnaTypeError(f"Head.{field} must be an int, got {value!r} ({type(value).__name__})")
            if value < 0:
                raise GnaValueError(f"Head.{field} must be >= 0, got {value}")

    @classmethod
    def parse(cls, text: str) -> Head:
        """Parse ``"16.22"``, ``"L16H22"`` or ``"16:22"``."""
        if not isinstance(text, str):
            raise GnaTypeError(
                f"Head.parse(text={text!r}) ({type(text).__name__}): expected a string such as 'L16H22'; Head(layer, head) takes ints"
            )
        match = _HEAD_PATTERN.match(text)
        if match is None:
            raise GnaValueError(f"cannot parse head {text!r}: expected 'L.H' such as '16.22' or 'L16H22'")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}"


def _missing_head(layer: object) -> str:
    """The error for ``Head(layer)`` without a head index, pointing text to `Head.parse`."""
    if isinstance(layer, str):
        hint = typed_head_hint(layer)
        fix = f"a head written as text{hint}" if hint else "gna.Head.parse reads text such as 'L16H22' or '16.22'"
        return f"Head({layer!r}): Head(layer, head) takes two ints; {fix}"
    if isinstance(layer, (tuple, list)):
        return f"Head({layer!r}): Head(layer, head) takes two ints, not a pair{typed_head_hint(layer) or ''}"
    return f"Head({layer!r}): the head index is missing: Head(layer, head), e.g. gna.Head({layer!r}, 0)"


def typed_head_hint(value: object) -> str:
    """For a head written as text (``"L1H0"``) or as a pair (``(1, 0)``): how to write it
    as a `Head` (``": gna.Head.parse('L1H0') builds it"``); ``""`` for anything else."""
    if isinstance(value, str):
        try:
            Head.parse(value)
        except ValueError:
            return ""
        return f": gna.Head.parse({value!r}) builds it"
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(type(x) is int for x in value):
        return f": gna.Head{tuple(value)!r} builds it"
    return ""


def refuse_string(value: object, what: str) -> None:
    """A string where heads are expected would be iterated letter by letter: refuse it,
    showing the typed value to write instead."""
    if not isinstance(value, str):
        return
    try:
        example = f"[gna.{Head.parse(value)!r}] (gna.Head.parse({value!r}) builds it)"
    except ValueError:
        example = "[gna.Head(1, 0)] (gna.Head.parse('L1H0') turns text into a Head)"
    raise GnaTypeError(f"{what} is the string {value!r}: expected gna_interp.Head values, e.g. {example}")


@dataclass(frozen=True, order=True)
class Resid:
    """The residual stream entering block ``layer`` (``layer == n_layers``: the
    input of the final norm). Values have shape ``[batch, pos, d_model]``."""

    layer: int

    def __post_init__(self) -> None:
        if isinstance(self.layer, bool) or not isinstance(self.layer, int):
            raise GnaTypeError(f"Resid.layer must be an int, got {self.layer!r}")
        if self.layer < 0:
            raise GnaValueError(f"Resid.layer must be >= 0, got {self.layer}")

    def __str__(self) -> str:
        return f"resid{self.layer}"


Target = Head | Resid
"""Anything an intervention can address."""
