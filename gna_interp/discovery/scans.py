"""The causal scans of G&A discovery, each measured as task accuracy.

1. `truncation_scan`: keep layers ``0..k-1`` (then the final norm and unembedding) for
   every ``k``; the *critical layer* is the last kept layer of the first truncation that
   recovers at least half of the clean accuracy above chance (the paper's MMLU jump).
2. `layer_scan`: leave one layer out at a time.
3. `head_scan`: zero-ablate heads one at a time (batched sweep). Layers with more heads
   than ``screen_above`` (Mamba-1: every channel is a head) are pre-screened by ablating
   contiguous groups of heads; only heads of the most harmful groups are then ablated
   one by one (*verified*); the others keep their group's accuracy (*screened*).
4. `entry_scan`: ablate a head only at the final position, then only on the segment
   tokens, then only at the segment ends; a head's output at position ``t`` enters the
   residual stream at ``t`` alone, so this says where its effect comes in.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..core.heads import Head
from ..core.inputs import Batch
from ..core.interventions import Ablate, Intervention, SkipLayers, Truncate
from ..evaluation import evaluate, evaluate_many
from ..models.jobs import is_batched_remote
from ..patching.metrics import candidate_accuracy
from ..patching.sweeps import ablation_sweep
from ..progress import progress_bar

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask, Task


def _accuracy(model: GnaModel, task: Task, interventions: Sequence[Intervention] = ()) -> float:
    """`evaluate`'s accuracy without its per-batch bar (the scans draw their own)."""
    return evaluate(model, task, interventions, progress=False).accuracy


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
class HeadScan:
    accuracy: Tensor
    """``[layer, head]`` accuracy with that head zero-ablated; NaN where not scanned."""
    verified: Tensor
    """``[layer, head]`` bool: measured alone (not only through its group)."""


PRESCREEN_STEPS = 4
"""Integration points of the prescreen's integrated-gradients ranking (`prescreen`)."""


def prescreen_method(model: GnaModel, steps: int = PRESCREEN_STEPS) -> str:
    """How `prescreen` ranks heads on ``model``, in words (recorded in the circuit's settings)."""
    if getattr(model.backend, "remote", False):
        return "forward-only: the layer scan's costly layers (remote model: no local backward for attribution)"
    return f"integrated gradients, {steps} steps, of zero ablation on the candidate logit difference"


def prescreen(
    model: GnaModel,
    task: Task,
    layers: Sequence[int],
    harmful_layers: Sequence[int],
    keep: int,
    rows: int = 64,
    steps: int = PRESCREEN_STEPS,
) -> tuple[list[Head], Tensor | None]:
    """Which heads of ``layers`` to ablate one by one when there are too many: every head of
    ``harmful_layers`` (from the layer scan: removing the layer costs accuracy), and the
    ``keep`` heads with the largest estimate of their zero-ablation effect on the candidate
    logit difference: integrated gradients over ``steps`` points (`ablation_attribution`;
    ``steps`` forwards and backwards; first-order attribution misranks the hybrid toy's
    heads, docs/patching.md). A head whose estimate is exactly 0 (its output reaches
    nothing the metric depends on, e.g. its out-projection columns are zero) is kept only
    through its layer. Remote models get no attribution (no local backward): the layers
    alone, the forward-only screen (`prescreen_method` says which ran).

    Returns:
        the heads, layer-major, and the ``[layer, head]`` estimates (``None`` without them).
    """
    from ..patching.attribution import ablation_attribution
    from ..patching.metrics import candidate_logit_diff

    scanned = [Head(layer, h) for layer in layers for h in range(model.heads_per_layer[layer])]
    chosen = {head for head in scanned if head.layer in set(harmful_layers)}
    estimates = None
    if not getattr(model.backend, "remote", False) and scanned:
        encoded = task.encode(task.tokenizer_for(model.tokenizer))
        estimates = torch.zeros(model.n_layers, model.n_heads)
        for start in range(0, encoded.batch.n_rows, rows):  # gradients of `rows` prompts at a time
            stop = min(start + rows, encoded.batch.n_rows)
            chunk = Batch(encoded.batch.input_ids[start:stop], encoded.batch.attention_mask[start:stop])
            metric = candidate_logit_diff(encoded.candidate_ids[start:stop], encoded.correct[start:stop])
            result = ablation_attribution(model, chunk, metric, scanned, steps=steps)
            estimates += (result.scores - result.baseline).nan_to_num() * (stop - start) / encoded.batch.n_rows
        ranked = sorted(scanned, key=lambda h: (-abs(float(estimates[h.layer, h.head])), h))
        chosen |= {h for h in ranked[:keep] if float(estimates[h.layer, h.head]) != 0.0}
    return sorted(chosen), estimates


def head_scan(
    model: GnaModel,
    task: Task,
    layers: Sequence[int],
    *,
    screen_above: int = 64,
    group_size: int = 16,
    verify_groups: int = 4,
    only: Collection[Head] | None = None,
    progress: bool = True,
) -> HeadScan:
    """Single-head zero-ablation accuracy for every head of ``layers`` (see module docs);
    with ``only``, for those heads alone (a `prescreen`; no grouped screening then)."""
    accuracy = torch.full((model.n_layers, model.n_heads), float("nan"))
    verified = torch.zeros(model.n_layers, model.n_heads, dtype=torch.bool)
    direct: list[Head] = []
    if only is not None:
        layers = []
        direct = sorted(only)
    for layer in layers:
        heads = [Head(layer, h) for h in range(model.heads_per_layer[layer])]
        if len(heads) <= screen_above:
            direct += heads
            continue
        groups = [heads[i : i + group_size] for i in range(0, len(heads), group_size)]
        scores = [_accuracy(model, task, [Ablate(g)]) for g in progress_bar(groups, show=progress, desc=f"screening layer {layer}")]
        for group, score in zip(groups, scores, strict=True):
            for head in group:
                accuracy[head.layer, head.head] = score
        for index in sorted(range(len(groups)), key=scores.__getitem__)[:verify_groups]:
            direct += groups[index]
    for head, value in _single_ablations(model, task, direct, progress).items():
        accuracy[head.layer, head.head] = value
        verified[head.layer, head.head] = True
    return HeadScan(accuracy, verified)


def _single_ablations(model: GnaModel, task: Task, heads: list[Head], progress: bool) -> dict[Head, float]:
    if not heads:
        return {}
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    if encoded.single_token:  # one batched sweep, scored by candidate accuracy
        metric = candidate_accuracy(encoded.candidate_ids, encoded.correct)
        sweep = ablation_sweep(model, task, metric, heads=heads, progress=progress)
        return {h: float(sweep.scores[h.layer, h.head]) for h in heads}
    return {h: _accuracy(model, task, [Ablate([h])]) for h in progress_bar(heads, show=progress, desc="head scan")}


def segment_positions(encoded: EncodedTask) -> Tensor:
    """``[batch, pos]`` bool: every token of every segment (first token to segment end, inclusive)."""
    cols = torch.arange(encoded.batch.n_pos)
    inside = (cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2])  # [batch, segment, pos]
    return inside.any(1)


def entry_scan(
    model: GnaModel, task: Task, encoded: EncodedTask, heads: Sequence[Head], *, progress: bool = True
) -> dict[Head, dict[str, float]]:
    """Per head: task accuracy with it ablated only at each prompt's ``final`` position,
    only on its ``segments`` (`segment_positions`), and only at the segment ``ends`` (the
    paper's Gather writes its summary there; a head writing elsewhere in the segments,
    e.g. tagging each word with its label, shows a small ``ends`` effect). Empty when
    candidates span several tokens: their continuation batches are re-padded, so
    positions move."""
    if not encoded.single_token or not heads:
        return {}
    where = {"final": encoded.final, "segments": segment_positions(encoded), "ends": encoded.segment_ends}
    if is_batched_remote(model):  # every evaluation in one request
        runs = [(task, [Ablate([head], positions=positions)]) for head in heads for positions in where.values()]
        values = iter(result.accuracy for result in evaluate_many(model, runs))
        return {head: {name: next(values) for name in where} for head in heads}
    out: dict[Head, dict[str, float]] = {}
    for head in progress_bar(list(heads), show=progress, desc="entry scan"):
        out[head] = {name: _accuracy(model, task, [Ablate([head], positions=positions)]) for name, positions in where.items()}
    return out


def joint_set(
    model: GnaModel,
    task: Task,
    pool: Sequence[Head],
    positions: Tensor,
    threshold: float,
    max_heads: int,
    *,
    progress: bool = True,
    desc: str = "joint search",
    clean: float | None = None,
    curve: list[tuple[Head, float]] | None = None,
) -> tuple[list[Head], float, bool]:
    """Greedy search for heads that matter together: at each step, add the head of
    ``pool`` whose ablation at ``positions``, jointly with the heads already chosen,
    lowers accuracy most; stop at ``threshold``, at ``max_heads``, or when no head lowers
    it further. Finds backup heads, which cost nothing alone because others compensate.

    Args:
        clean: the accuracy with nothing ablated, if already known (else measured).
        curve: if given, ``(head, accuracy)`` of each step is appended to it.

    Returns:
        the heads chosen (in order), the accuracy with them ablated at ``positions``, and
        whether it reached ``threshold``.
    """
    chosen: list[Head] = []
    accuracy = _accuracy(model, task) if clean is None else clean
    remaining = list(pool)
    bar = progress_bar(range(min(max_heads, len(remaining))), show=progress, desc=desc)
    for _ in bar:
        trials = {h: _accuracy(model, task, [Ablate([*chosen, h], positions=positions)]) for h in remaining}
        best = min(remaining, key=lambda h: (trials[h], h))
        if trials[best] >= accuracy:
            break
        chosen.append(best)
        remaining.remove(best)
        accuracy = trials[best]
        if curve is not None:
            curve.append((best, accuracy))
        if accuracy <= threshold:
            return chosen, accuracy, True
    return chosen, accuracy, False


def collapsing_set(
    model: GnaModel,
    task: Task,
    ordered: Sequence[Head],
    threshold: float,
    max_heads: int,
    clean: float,
    *,
    evaluate_progress: bool | None = None,
    curve: list[tuple[Head, float]] | None = None,
) -> tuple[list[Head], float, bool]:
    """Ablate ``ordered`` heads cumulatively until accuracy is at most ``threshold``.

    Args:
        clean: the accuracy with nothing ablated (returned when ``ordered`` is empty).
        evaluate_progress: `evaluate`'s per-batch bars (``None``: its default; ``False``:
            none). This search draws no bar of its own.
        curve: if given, ``(head, accuracy)`` of each cumulative ablation is appended to it.

    Returns:
        the heads used, the accuracy with all of them ablated, and whether the
        threshold was reached within ``max_heads``.
    """
    chosen: list[Head] = []
    accuracy = clean
    for head in list(ordered)[:max_heads]:
        chosen.append(head)
        accuracy = evaluate(model, task, [Ablate(chosen)], progress=evaluate_progress).accuracy
        if curve is not None:
            curve.append((head, accuracy))
        if accuracy <= threshold:
            return chosen, accuracy, True
    return chosen, accuracy, False
