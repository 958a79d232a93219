"""Argument checks shared by the sweeps, attribution and path patching: one place, one
wording, so every entry point refuses the same bad input with the same message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.compile import check_aligned
from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.inputs import Batch
from ..core.interventions import ABLATION_KINDS, head_tuple
from ..models.handle import GnaModel

SITE_KINDS = ("heads", "resid")
DIRECTIONS = ("denoise", "noise")


def head_list(model: GnaModel, heads: Head | Sequence[Head] | None) -> list[Head]:
    """``heads`` as a list (``None``: every head of ``model``; one `Head`: that head); an
    empty selection, a string (``"L1H0"``) or an item that is not a `Head` raises, naming it."""
    if heads is None:
        return list(model.heads)
    if not isinstance(heads, Head) and isinstance(heads, Sequence) and len(heads) == 0:
        raise GnaValueError("heads is empty: expected at least one Head (or None for every head)")
    return list(head_tuple(heads, "heads"))


def check_sites(sites: str, heads: Head | Sequence[Head] | None, verb: str) -> None:
    """``sites`` is ``"heads"`` or ``"resid"``, and ``heads=`` is given only with ``"heads"``."""
    if sites not in SITE_KINDS:
        raise GnaValueError(f"sites={sites!r}: expected 'heads' or 'resid'")
    if sites == "resid" and heads is not None:
        raise GnaValueError(f"heads= selects heads to {verb}; it has no meaning with sites='resid'")


def check_ablation(how: str, corrupt: Any) -> None:
    if how not in ABLATION_KINDS:
        raise GnaValueError(f"how={how!r} is not an ablation kind: expected one of {ABLATION_KINDS}")
    if how != "zero" and corrupt is None:
        raise GnaValueError(f"how={how!r} needs corrupt= inputs to take activations from")


def check_local(model: GnaModel, what: str) -> None:
    """Gradients need the weights here: a remote model is refused."""
    if model.is_remote:
        raise GnaValueError(f"{what} needs gradients of a local forward: load the model without remote=")


def clean_corrupt_batches(model: GnaModel, clean: Any, corrupt: Any, what: str, detail: str = "") -> tuple[Batch, Batch]:
    """Tokenize a clean / corrupt pair and check they can be patched into each other.

    Args:
        what: the method, for the error (``"patching"``, ``"path patching"``...).
        detail: appended to the error's first clause (e.g. the option that matters).
    """
    clean_batch, corrupt_batch = model.to_batch(clean), model.to_batch(corrupt)
    if clean_batch.n_pos != corrupt_batch.n_pos:
        raise GnaValueError(
            f"clean has {clean_batch.n_pos} token positions and corrupt has {corrupt_batch.n_pos}{detail}: {what} "
            "replaces activations position by position, so both must tokenize to the same length"
        )
    check_aligned(clean_batch, corrupt_batch, "corrupt")
    return clean_batch, corrupt_batch


def target_and_source(model: GnaModel, clean: Any, corrupt: Any, direction: str, what: str, detail: str = "") -> tuple[Batch, Batch]:
    """The batch whose run is patched and the batch its values come from: ``denoise``
    patches clean values into the corrupted run, ``noise`` the reverse."""
    if direction not in DIRECTIONS:
        raise GnaValueError(f"direction={direction!r}: expected 'denoise' or 'noise'")
    clean_batch, corrupt_batch = clean_corrupt_batches(model, clean, corrupt, what, detail)
    target, source = (corrupt_batch, clean_batch) if direction == "denoise" else (clean_batch, corrupt_batch)
    check_aligned(target, source, "clean/corrupt")
    return target, source
