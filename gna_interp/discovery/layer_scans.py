"""The layer scans of G&A discovery, each measured as task accuracy.

1. `truncation_scan`: keep layers ``0..k-1`` (then the final norm and unembedding) for
   every ``k``; the *critical layer* is the last kept layer of the first truncation that
   recovers at least half of the clean accuracy above chance (the paper's MMLU jump).
2. `layer_scan`: leave one layer out at a time. `discover` runs `screened_layer_scan`
   instead: the same question in contiguous groups of layers (`screen_layers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.interventions import Intervention, SkipLayers, Truncate
from ..progress import progress_bar
from .group_testing import masked_parts
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


@dataclass
class LayerScan:
    """A screened layer scan (`screen_layers`).

    Attributes:
        accuracy: per layer, the accuracy of the forward that decided it: with the layer
            alone skipped, or, for a layer cleared in a group, with its group skipped.
        skipped: per layer, ``(first, last)``: the layers ``first..last`` skipped in that
            forward (``(l, l)``: measured alone).
        tests: the forwards the rule asked for (answered from a memo or not).
    """

    accuracy: list[float]
    skipped: list[tuple[int, int]]
    tests: int

    @property
    def grouped(self) -> list[int]:
        """The layers cleared in a group (not measured alone)."""
        return [layer for layer, (first, last) in enumerate(self.skipped) if first != last]


def skip_range(first: int, last: int, n_layers: int) -> list[Intervention]:
    """Skipping layers ``first..last``: `Truncate` where they run to the last layer (the
    same forward as the truncation scan's), else `SkipLayers`."""
    return [Truncate(first)] if last == n_layers - 1 else [SkipLayers(range(first, last + 1))]


def screen_layers(n_layers: int, clean: float, min_effect: float, measure: Callable[[int, int], float]) -> LayerScan:
    """The layer scan by contiguous groups: which layers cost at least ``min_effect`` of
    ``clean`` accuracy when skipped, each such layer measured alone.

    ``measure(first, last)``: accuracy with layers ``first..last`` skipped. A forward that
    skips ``first..last`` starts from the cached clean prefix after ``last`` (blocks
    ``last + 1 ..`` run), so a group costs what its last layer's removal costs, and the
    groups that run to the last layer (the truncation scan's) cost nothing:

    1. the truncations, from the top: layers ``c..L-1`` are cleared while skipping ``c..L-1``
       costs less than ``min_effect`` (each layer by its own truncation);
    2. layer ``c - 1`` alone, then each layer below it alone while they cost; after one that
       does not, the group of every layer left (``0..b``, from the cached embeddings): cleared
       if it costs nothing, else layer ``b`` alone again, and so on.

    As `group_testing.group_testing` for heads, this assumes a group costs at least what its
    members cost; a split whose parts do not add up to their group by ``min_effect``
    (`group_testing.masked_parts`: skipping ``c - 1..L-1`` against ``c - 1`` and ``c..L-1``;
    ``0..L-1`` against ``0..b`` and ``b + 1..L-1``) sends the part that costs nothing to
    layer-by-layer measurement. Where many layers cost (a trained model), it is the
    layer-by-layer scan plus, for each layer that costs nothing alone, one group forward
    that costs what the next layer's removal costs: at most twice the layer-by-layer scan."""
    last = n_layers - 1
    accuracy: list[float] = [float("nan")] * n_layers
    skipped: list[tuple[int, int]] = [(layer, layer) for layer in range(n_layers)]
    measured: dict[tuple[int, int], float] = {}

    def value(first: int, end: int) -> float:
        if (first, end) not in measured:
            measured[first, end] = measure(first, end)
        return measured[first, end]

    def costs(first: int, end: int) -> bool:
        return clean - value(first, end) >= min_effect

    def alone(layer: int) -> bool:
        accuracy[layer], skipped[layer] = value(layer, layer), (layer, layer)
        return costs(layer, layer)

    def cleared(layers: range, group: tuple[int, int]) -> None:
        for layer in layers:
            accuracy[layer], skipped[layer] = value(*group), group

    def masked(group: tuple[int, int], parts: list[tuple[int, int]]) -> bool:
        """The split of ``group`` into ``parts`` does not add up (`masked_parts`)."""
        effects = [clean - value(*part) for part in parts]
        layers = [list(range(first, end + 1)) for first, end in parts]
        return bool(masked_parts(layers, effects, clean - value(*group), min_effect))

    top = n_layers  # layers top..L-1 cleared by their truncations
    while top > 0 and not costs(top - 1, last):
        top -= 1
        cleared(range(top, top + 1), (top, last))
    if top == 0:
        return LayerScan(accuracy, skipped, len(measured))
    costly = alone(top - 1)
    if top < last and masked((top - 1, last), [(top - 1, top - 1), (top, last)]):
        for layer in range(top, n_layers):
            alone(layer)
    below, search = top - 2, False
    while below >= 0:
        if costly or search or below == 0:
            costly = alone(below)
            below -= 1
        elif costs(0, below):
            costly = True  # layer ``below`` alone next
        elif masked((0, last), [(0, below), (below + 1, last)]):
            search = True
        else:
            cleared(range(below + 1), (0, below))
            break
    return LayerScan(accuracy, skipped, len(measured))


def screen_ranges(n_layers: int) -> list[tuple[int, int]]:
    """Every ``(first, last)`` `screen_layers` may ask for on ``n_layers`` layers (a remote
    model measures them at once): each layer alone, every truncation ``k..L-1`` and every
    group ``0..b``."""
    ranges = {(layer, layer) for layer in range(n_layers)}
    ranges |= {(k, n_layers - 1) for k in range(n_layers)} | {(0, b) for b in range(n_layers)}
    return sorted(ranges)


def screened_layer_scan(model: GnaModel, task: Task, clean: float, min_effect: float, *, progress: bool = True) -> LayerScan:
    """`screen_layers` on ``model``: each group's accuracy from `memo.accuracy` (a truncation
    the truncation scan measured is not run again)."""
    n_layers = model.n_layers
    bar = progress_bar(show=progress, desc="layer scan", total=None)

    def measure(first: int, last: int) -> float:
        bar.update(1)
        return _accuracy(model, task, skip_range(first, last, n_layers))

    try:
        return screen_layers(n_layers, clean, min_effect, measure)
    finally:
        bar.close()
