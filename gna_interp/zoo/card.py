"""What a model card records about a toy model: clean accuracy and the ablation facts
that show (or fail to show) the Gather-and-Aggregate bottleneck."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..discovery.scans import collapsing_set, head_scan
from ..evaluation import evaluate

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import Task

CHANCE_MARGIN = 0.10
"""A head set "brings accuracy to chance" when accuracy falls to chance + this."""


@dataclass
class AblationFacts:
    clean_accuracy: float
    chance: float
    single_head: dict[str, float]
    """Accuracy with each head zero-ablated alone, by head name (``"L0H3"``)."""
    best_single_head: str
    best_single_head_accuracy: float
    smallest_sets: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Per layer: the smallest set of that layer's heads (greedy, most harmful first)
    whose joint zero-ablation brings accuracy to chance + `CHANCE_MARGIN`, its accuracy,
    and whether the threshold was reached at all."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["smallest_sets"] = {str(k): v for k, v in self.smallest_sets.items()}
        return data


def ablation_facts(model: GnaModel, task: Task, *, progress: bool = False) -> AblationFacts:
    """Clean accuracy, every head's single ablation, and the smallest collapsing set per layer."""
    bars = None if progress else False  # evaluate's own default, or none
    clean = evaluate(model, task, progress=bars)
    layers = range(model.n_layers)
    scan = head_scan(model, task, layers, screen_above=model.n_heads, progress=progress)
    single = {str(h): float(scan.accuracy[h.layer, h.head]) for h in model.heads}
    best = min(single, key=single.__getitem__)
    threshold = clean.chance + CHANCE_MARGIN
    sets: dict[int, dict[str, Any]] = {}
    for layer in layers:
        order = sorted((h for h in model.heads if h.layer == layer), key=lambda h: float(scan.accuracy[h.layer, h.head]))
        if not order:  # a layer without heads (an MLP-only layer)
            continue
        chosen, accuracy, reached = collapsing_set(model, task, order, threshold, len(order), clean.accuracy, evaluate_progress=bars)
        sets[layer] = {"heads": [str(h) for h in chosen], "accuracy": accuracy, "reached_chance": reached}
    return AblationFacts(clean.accuracy, clean.chance, single, best, single[best], sets)
