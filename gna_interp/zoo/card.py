"""What a model card records about a toy model: clean accuracy and the ablation facts
that show (or fail to show) the Gather-and-Aggregate bottleneck."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.heads import Head
from ..core.interventions import Ablate
from ..discovery.head_scans import head_scan
from ..discovery.joint import collapsing_set
from ..scoring.evaluation import evaluate

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import Task

CHANCE_MARGIN = 0.10
"""A head set "brings accuracy to chance" when accuracy falls to chance + this."""
DOUBLING_ABOVE = 64
"""Layers with more heads than this (Mamba-1: every channel is a head) get their smallest
set at doubling sizes (the 1, 2, 4, ... most harmful heads), not one head at a time."""


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
    and whether the threshold was reached at all. Layers wider than `DOUBLING_ABOVE`: the
    sizes tried double, and ``curve`` lists ``[size, accuracy]`` of each."""
    layer_ablation: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per layer: accuracy with every head of the layer zero-ablated (``all``), only at
    each prompt's final position (``final``) and only at the segment ends (``ends``):
    where a role spread over many heads enters."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["smallest_sets"] = {str(k): v for k, v in self.smallest_sets.items()}
        data["layer_ablation"] = {str(k): v for k, v in self.layer_ablation.items()}
        return data


def ablation_facts(model: GnaModel, task: Task, *, progress: bool = False) -> AblationFacts:
    """Clean accuracy, every head's single ablation, the smallest collapsing set per layer,
    and each layer's heads ablated together (everywhere, at the final position, at the
    segment ends)."""
    bars = None if progress else False  # evaluate's own default, or none
    clean = evaluate(model, task, progress=bars)
    layers = range(model.n_layers)
    scan = head_scan(model, task, layers, screen_above=model.n_heads, progress=progress)
    single = {str(h): float(scan.accuracy[h.layer, h.head]) for h in model.heads}
    best = min(single, key=single.__getitem__)
    threshold = clean.chance + CHANCE_MARGIN
    sets: dict[int, dict[str, Any]] = {}
    whole: dict[int, dict[str, float]] = {}
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    where = {"all": None, **({"final": encoded.final, "ends": encoded.segment_ends} if encoded.single_token else {})}
    for layer in layers:
        order = sorted((h for h in model.heads if h.layer == layer), key=lambda h: float(scan.accuracy[h.layer, h.head]))
        if not order:  # a layer without heads (an MLP-only layer)
            continue
        if len(order) > DOUBLING_ABOVE:
            sets[layer] = doubling_set(model, task, order, threshold, bars)
        else:
            chosen, accuracy, reached = collapsing_set(model, task, order, threshold, len(order), clean.accuracy, evaluate_progress=bars)
            sets[layer] = {"heads": [str(h) for h in chosen], "accuracy": accuracy, "reached_chance": reached}
        whole[layer] = {name: evaluate(model, task, [Ablate(order, positions=at)], progress=bars).accuracy for name, at in where.items()}
    return AblationFacts(clean.accuracy, clean.chance, single, best, single[best], sets, whole)


def doubling_set(model: GnaModel, task: Task, ordered: list[Head], threshold: float, bars: bool | None = None) -> dict[str, Any]:
    """The first of the ``1, 2, 4, ...`` (then all) first heads of ``ordered`` whose joint
    zero-ablation brings accuracy to ``threshold``: ``log2(n)`` evaluations instead of up
    to ``n``, for a role spread over many heads (a card row of `AblationFacts.smallest_sets`
    with its ``curve``)."""
    sizes = [1 << k for k in range(len(ordered).bit_length()) if 1 << k < len(ordered)] + [len(ordered)]
    curve: list[list[float]] = []
    for size in sizes:
        accuracy = evaluate(model, task, [Ablate(ordered[:size])], progress=bars).accuracy
        curve.append([size, accuracy])
        if accuracy <= threshold:
            break
    last, accuracy = curve[-1]
    return {"heads": [str(h) for h in ordered[: int(last)]], "accuracy": accuracy, "reached_chance": accuracy <= threshold, "curve": curve}


def label_reading(model: GnaModel, task_shape: dict[str, Any], n: int, seed: int) -> dict[str, Any]:
    """Held-out accuracy on the toy's task with each prompt's labels shuffled and with
    them in order (``A, B, C, D``): a toy that reads the labels answers both; one that
    answers by the option's place falls to near chance on the shuffled ones.

    Args:
        task_shape: `toy_mcq`'s keyword arguments of the toy's task (its card's ``task``).
        n, seed: the prompts (`toy_mcq` seed; the card's held-out seed).
    """
    from ..tasks.toy import toy_mcq

    accuracy = {
        name: evaluate(model, toy_mcq(n, seed=seed, **{**task_shape, "shuffle_labels": shuffled}), progress=False).accuracy
        for name, shuffled in (("shuffled", True), ("in_order", False))
    }
    return {**accuracy, "n": n, "seed": seed}
