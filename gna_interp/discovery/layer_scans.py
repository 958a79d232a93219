"""The layer scans of G&A discovery, each measured as task accuracy.

1. `truncation_scan`: keep layers ``0..k-1`` (then the final norm and unembedding) for
   every ``k``; the *critical layer* is the last kept layer of the first truncation that
   recovers at least half of the clean accuracy above chance (the paper's MMLU jump).
2. `layer_scan`: leave one layer out at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.interventions import SkipLayers, Truncate
from ..progress import progress_bar
from .memo import accuracy as _accuracy

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import Task


def truncation_scan(model: GnaModel, task: Task, *, progress: bool = True) -> list[float]:
    """Accuracy keeping the first ``k`` layers, for ``k = 1 .. n_layers`` (index ``k - 1``)."""
    depths = progress_bar(range(1, model.n_layers + 1), show=progress, desc="truncation scan")
    return [_accuracy(model, task, [Truncate(k)]) for k in depths]


def critical_layer(truncation: Sequence[float], clean: float, chance: float) -> int | None:
    """The last kept layer of the first truncation that recovers half the clean accuracy
    above chance; ``None`` when no truncation does (or clean is at chance)."""
    if clean - chance <= 0:
        return None
    for k, accuracy in enumerate(truncation):
        if accuracy - chance >= 0.5 * (clean - chance):
            return k
    return None


def layer_scan(model: GnaModel, task: Task, *, progress: bool = True) -> list[float]:
    """Accuracy with layer ``l`` skipped (its block passes the residual through), per layer."""
    layers = progress_bar(range(model.n_layers), show=progress, desc="layer scan")
    return [_accuracy(model, task, [SkipLayers([layer])]) for layer in layers]
