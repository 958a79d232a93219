"""What a model card records about a toy model: clean accuracy and the ablation facts
that show (or fail to show) the Gather-and-Aggregate bottleneck."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.heads import Head
from ..core.interventions import Ablate
from ..evaluation import evaluate
from ..patching.metrics import candidate_accuracy
from ..patching.sweeps import ablation_sweep

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
    clean = evaluate(model, task)
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    metric = candidate_accuracy(encoded.candidate_ids, encoded.correct)
    sweep = ablation_sweep(model, task, metric, progress=progress)
    single = {str(Head(layer, head)): float(sweep.scores[layer, head]) for layer in range(model.n_layers) for head in range(model.n_heads)}
    best = min(single, key=single.__getitem__)
    threshold = clean.chance + CHANCE_MARGIN
    sets: dict[int, dict[str, Any]] = {}
    for layer in range(model.n_layers):
        order = sorted(range(model.n_heads), key=lambda h: float(sweep.scores[layer, h]))
        chosen: list[Head] = []
        accuracy = clean.accuracy
        for head in order:
            chosen.append(Head(layer, head))
            accuracy = evaluate(model, task, [Ablate(chosen)]).accuracy
            if accuracy <= threshold:
                break
        sets[layer] = {"heads": [str(h) for h in chosen], "accuracy": accuracy, "reached_chance": accuracy <= threshold}
    return AblationFacts(clean.accuracy, clean.chance, single, best, single[best], sets)
