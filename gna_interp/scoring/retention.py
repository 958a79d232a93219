"""Which heads to keep: a retrieval-aware head ranking and keep-only retention curves.

After Bick, Xing and Gu (2026, "Retrieval-Aware Distillation for Transformer-SSM
Hybrids"): rank every head by the accuracy its ablation costs on a KV-retrieval probe
(`retrieval_ranking`), then measure how much of a task the top-n heads carry when every
other head of their kind is ablated (`retention_curve`), against random sets of the same
size.

- `retrieval_ranking`: one `ablation_sweep` per probe task, scored by candidate accuracy
  (batched and prefix-reused: stacked variants, each chunk starting at its first ablated
  block). The probe defaults to `tasks.kv_probe`: the paper's dictionary prompts, 20 to 50
  pairs, values 0 to 99, tokenized with the model's tokenizer. Any `Task` may replace it.
- `retention_curve`: `KeepOnly` of the top-n heads of a ranking, and of the first n heads
  of ``seeds`` random orders of the same heads, evaluated with `evaluate` (the two ends,
  nothing and everything kept, are shared by every order and evaluated once).

Both record what they ran (`gna_interp.cost_meter` counts, with ``passes``: rows x blocks
evaluated over prompts x layers). What they return, `RetrievalRanking` and `RetentionCurve`,
is in `gna_interp.scoring.retention_results`.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.compile import heads_of_kind
from ..core.errors import GnaTypeError, GnaValueError, short_repr
from ..core.heads import Head
from ..core.inputs import UnknownWordsWarning, unk_id
from ..core.interventions import ABLATION_KINDS, HEAD_KINDS, Ablate
from ..core.keywords import renamed, suggest_keywords
from ..cost import cost_meter
from ..models.handle import check_model
from ..patching.metrics import candidate_accuracy
from ..patching.results import SweepResult
from ..patching.sweeps import ablation_sweep
from ..progress import progress_bar
from ..tasks.base import TASK_HOW, Task, not_a_task
from ..tasks.kv import kv_probe
from .curve import check_sizes
from .evaluation import check_context, check_distinct_candidates, check_task, evaluate
from .faithfulness import keep_only_summary, rank_heads
from .retention_results import RetentionCurve, RetrievalRanking

if TYPE_CHECKING:
    from ..models.handle import GnaModel

CHANCE_MARGIN = 0.1
"""`retrieval_ranking` warns when the clean probe accuracy is within this of chance."""

EVALUATE_BATCH = 64
"""`retrieval_ranking`'s prompts per forward where candidates span several tokens, by default (`evaluate`'s)."""


@renamed(probe="task", max_rows="batch_size")
@suggest_keywords
def retrieval_ranking(
    model: GnaModel,
    task: Task | Sequence[Task] | None = None,
    *,
    kind: str = "all",
    how: str = "zero",
    n: int = 100,
    seed: int = 0,
    batch_size: int | None = None,
    memory_budget_mb: float | None = None,
    progress: bool = True,
) -> RetrievalRanking:
    """Rank heads by the probe accuracy their ablation costs (Bick et al. 2026's ranking).

    Args:
        model: any `GnaModel`: attention heads, SSM heads, or both (hybrids).
        task: the probe: a `Task` or a list of them (their drops are averaged, weighted by prompts).
            Default: `tasks.kv_probe` (``n`` dictionary prompts of 20, 30, 40 and 50
            pairs, ``seed``) in the model's own vocabulary; a tokenizer that lacks its words
            is an error (a zoo toy's tokenizer has them, but the toys never saw
            dictionaries: pass ``task=gna.toy_task(name)`` for them).
        kind: rank ``"attention"`` heads, ``"ssm"`` heads, or ``"all"``.
        how: ``"zero"`` (the paper's: the head's out-projection slice zeroed), ``"mean"``
            (its mean over each probe task's tokens) or ``"resample"`` (its output on the
            task's corrupted prompts).
        n: the default probe's number of prompts.
        seed: the default probe's seed.
        batch_size: rows per forward: of the stacked sweep (a row: one prompt under one
            head's ablation; default: estimated from ``memory_budget_mb``, see
            `ablation_sweep`), or, where candidates span several tokens (then each head is
            one `evaluate`), prompts per forward (default 64).
        memory_budget_mb: the memory a stacked forward may use, to estimate ``batch_size``.
        progress: a bar per probe task.

    Returns:
        `RetrievalRanking`: ``drop`` ``[layer, head]``, ``order``, ``.to_frame()``; it is
        a ranking `retention_curve` and `faithfulness_curve` (``.as_sweep()``) accept.

    Warns:
        UserWarning: when the clean probe accuracy is within 0.1 of chance: the model does
            not do the probe, so its drops are noise (pass a task it solves as ``task``).
    """
    check_model(model, "retrieval_ranking")
    if kind not in HEAD_KINDS:
        raise GnaValueError(f"kind={kind!r}: expected one of {HEAD_KINDS}")
    if how not in ABLATION_KINDS:
        raise GnaValueError(f"how={how!r} is not an ablation kind: expected one of {ABLATION_KINDS}")
    tasks = _probe_tasks(model, task, n, seed)
    heads = heads_of_kind(model.layout, kind)
    if not heads:
        raise GnaValueError(f"kind={kind!r}: {model.name} has no {kind} heads")
    with cost_meter(model) as cost:
        accuracy, clean, chance, total = _probe_accuracy(model, tasks, heads, how, batch_size, memory_budget_mb, progress)
    drop = clean - accuracy
    if clean <= chance + CHANCE_MARGIN:
        names = ", ".join(task.name for task in tasks)
        warnings.warn(
            f"retrieval_ranking: {model.name} answers the probe ({names}) at {clean:.3f}, chance {chance:.3f}: it does not do "
            "this task, so the drops are noise; pass task= one it solves (for a zoo toy, gna.toy_task(name))",
            stacklevel=2,
        )
    order = sorted(heads, key=lambda h: -float(drop[h.layer, h.head]))  # stable: ties keep model.heads order
    kinds = {head: model.layout.head_kind(head).value for head in heads}
    return RetrievalRanking(
        drop=drop,
        accuracy=accuracy,
        clean=clean,
        order=order,
        kinds=kinds,
        how=how,
        probe=[task.name for task in tasks],
        n_prompts=total,
        chance=chance,
        cost=cost.to_dict(total),
    )


def _probe_accuracy(
    model: GnaModel,
    tasks: list[Task],
    heads: list[Head],
    how: str,
    batch_size: int | None,
    memory_budget_mb: float | None,
    progress: bool,
) -> tuple[Tensor, float, float, int]:
    """Over every probe task, weighted by prompts: ``[layer, head]`` float64 accuracy with
    each head of ``heads`` ablated alone (NaN elsewhere), the clean accuracy, chance (mean
    ``1 / candidates``), and the prompts in all."""
    shape = (model.n_layers, model.n_heads)
    weighted = torch.zeros(shape, dtype=torch.float64)
    clean_sum = chance_sum = 0.0
    total = sum(len(task) for task in tasks)
    for task in tasks:
        clean, ablated = _ablated_accuracy(model, task, heads, how, batch_size, memory_budget_mb, progress)
        weighted += len(task) * ablated
        clean_sum += len(task) * clean
        chance_sum += sum(1.0 / len(example.candidates) for example in task.examples)
    accuracy = torch.full(shape, math.nan, dtype=torch.float64)
    for head in heads:
        accuracy[head.layer, head.head] = weighted[head.layer, head.head] / total
    return accuracy, clean_sum / total, chance_sum / total, total


def _probe_tasks(model: GnaModel, probe: Task | Sequence[Task] | None, n: int, seed: int) -> list[Task]:
    """``retrieval_ranking``'s ``task=``: the probe tasks, the KV probe for None (checked to fit ``model``)."""
    if probe is None:
        tasks = kv_probe(n, seed)
        unknown = unk_id(model.tokenizer)
        hint = "pass task= a Task in its vocabulary, e.g. tasks.kv_retrieval(keys=[...]) or, for a zoo toy, gna.toy_task(name)"
        for task in tasks:
            try:
                with warnings.catch_warnings():  # unknown words: the error below says what to do
                    warnings.simplefilter("ignore", UnknownWordsWarning)
                    encoded = task.encode(model.tokenizer)
            except ValueError as error:
                raise GnaValueError(
                    f"task=None: {model.name}'s tokenizer cannot encode the default KV probe ({task.name}: {error}): {hint}"
                ) from error
            if unknown is not None and bool((encoded.batch.input_ids == unknown).any()):
                raise GnaValueError(
                    f"task=None: the default KV probe ({task.name}) has words {model.name}'s tokenizer lacks (they tokenize "
                    f"to its unknown token): {hint}"
                )
            limit = getattr(model.hf_model.config, "max_position_embeddings", None)
            longest = int(encoded.batch.attention_mask.sum(1).max())
            if limit is not None and longest > limit:
                raise GnaValueError(
                    f"task=None: the default KV probe's {task.name} prompts have up to {longest} tokens, more than "
                    f"{model.name}'s context of {limit}: pass a probe that fits, e.g. task=tasks.kv_probe(pairs=(5, 10)) "
                    "or, for a zoo toy, gna.toy_task(name)"
                )
        return tasks
    if isinstance(probe, Task):
        return [probe]
    if isinstance(probe, (str, bytes)) or not isinstance(probe, Sequence) or not probe:
        shown = f"{short_repr(probe)} ({type(probe).__name__})"
        raise GnaTypeError(f"retrieval_ranking: task={shown}: a Task, a non-empty list of them, or None (the KV probe); {TASK_HOW}")
    for index, item in enumerate(probe):
        if not isinstance(item, Task):
            raise not_a_task(item, "retrieval_ranking", f"task[{index}]")
    return list(probe)


def _ablated_accuracy(
    model: GnaModel,
    task: Task,
    heads: list[Head],
    how: str,
    batch_size: int | None,
    memory_budget_mb: float | None,
    progress: bool,
) -> tuple[float, Tensor]:
    """Clean accuracy and ``[layer, head]`` float64 accuracy with each head ablated alone."""
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    check_distinct_candidates(task, encoded)
    check_context(model, encoded)
    corrupt = None if how == "zero" else task if how == "mean" else task.corrupted()
    table = torch.full((model.n_layers, model.n_heads), math.nan, dtype=torch.float64)
    if encoded.single_token:  # one stacked sweep; a row's score is 0 or 1, so counts are exact
        metric = candidate_accuracy(encoded.candidate_ids, encoded.correct)
        chunking = dict(batch_size=batch_size, memory_budget_mb=memory_budget_mb, progress=progress)
        sweep = ablation_sweep(model, task, corrupt, metric, heads=heads, how=how, **chunking)  # type: ignore[arg-type]
        rows = len(task)
        for head in heads:
            table[head.layer, head.head] = round(float(sweep.scores[head.layer, head.head]) * rows) / rows
        return round(sweep.baseline * rows) / rows, table
    batch_size = EVALUATE_BATCH if batch_size is None else batch_size
    clean = evaluate(model, task, batch_size=batch_size, progress=False).accuracy
    for head in progress_bar(heads, show=progress, desc=f"ranking ({how})"):
        ablation = Ablate([head], how=how, corrupt=corrupt)
        table[head.layer, head.head] = evaluate(model, task, [ablation], batch_size=batch_size, progress=False).accuracy
    return clean, table


@suggest_keywords
def retention_curve(
    model: GnaModel,
    task: Task,
    ranking: RetrievalRanking | SweepResult | Sequence[Head],
    *,
    sizes: Sequence[int] | None = None,
    seeds: int | Sequence[int] = 5,
    kind: str = "attention",
    how: str = "mean",
    corrupt: Any = None,
    batch_size: int = 64,
    progress: bool = True,
) -> RetentionCurve:
    """Accuracy on ``task`` keeping the top-n heads of ``ranking`` (every other head of
    ``kind`` ablated: `KeepOnly`), against random orders of the same heads.

    Args:
        model: any `GnaModel`.
        task: a `Task` (`evaluate` scores it).
        ranking: a `RetrievalRanking` (its order), a ``[layer, head]`` `SweepResult`
            (heads by ``|score - baseline|``, as `faithfulness_curve` ranks them) or a list
            of `Head` values, best first. Only heads of ``kind`` count; heads of that kind
            it leaves out follow in ``model.heads`` order.
        sizes: heads kept, each in ``0..`` the kind's heads (0 and all always included;
            default as `faithfulness_curve`'s: every n up to 32 heads, else 24 points).
        seeds: the random orders: a count (seeds ``0..count-1``) or a list of seeds.
        kind: ``"attention"`` (default: the paper's student keeps attention heads and
            replaces the rest), ``"ssm"`` or ``"all"``.
        how: ``"mean"`` (default; over ``corrupt``, the task's prompts by default),
            ``"zero"`` or ``"resample"`` (``corrupt`` default ``task.corrupted()``).
        corrupt: see `Ablate`.
        batch_size: prompts per forward (`evaluate`).
        progress: a bar over the evaluations.

    Returns:
        `RetentionCurve`: ``accuracy`` ``[n_sizes]``, ``random`` ``[n_seeds, n_sizes]``,
        ``.to_frame()`` with the random mean and standard deviation.
    """
    check_model(model, "retention_curve")
    check_task(task, "retention_curve")
    if kind not in HEAD_KINDS:
        raise GnaValueError(f"kind={kind!r}: expected one of {HEAD_KINDS}")
    if how not in ABLATION_KINDS:
        raise GnaValueError(f"how={how!r} is not an ablation kind: expected one of {ABLATION_KINDS}")
    seed_list = _seeds(seeds)
    heads = heads_of_kind(model.layout, kind)
    if not heads:
        raise GnaValueError(f"kind={kind!r}: {model.name} has no {kind} heads")
    order = _order_of_kind(model, ranking, heads, kind)
    chosen = check_sizes(sizes, len(heads))
    shuffled = [_shuffled(heads, seed) for seed in seed_list]
    if corrupt is None and how != "zero":
        corrupt = task if how == "mean" else task.corrupted()
    with cost_meter(model) as cost, model.source_cache():
        ends, ranked, random_rows = _retention_points(model, task, heads, order, shuffled, chosen, kind, how, corrupt, batch_size, progress)
    return RetentionCurve(
        sizes=torch.tensor(chosen, dtype=torch.long),
        accuracy=torch.tensor(ranked, dtype=torch.float64),
        random=torch.tensor(random_rows, dtype=torch.float64).view(len(seed_list), len(chosen)),
        order=order,
        random_orders=shuffled,
        seeds=seed_list,
        clean=ends[len(heads)],
        ablated=ends[0],
        kind=kind,
        how=how,
        chance=1.0 / len(task.examples[0].candidates),
        n_prompts=len(task),
        cost=cost.to_dict(len(task)),
    )


def _shuffled(heads: list[Head], seed: int) -> list[Head]:
    """``heads`` in the random order of ``seed``."""
    permutation = list(heads)
    random.Random(seed).shuffle(permutation)
    return permutation


def _retention_points(
    model: GnaModel,
    task: Task,
    heads: list[Head],
    order: list[Head],
    shuffled: list[list[Head]],
    chosen: list[int],
    kind: str,
    how: str,
    corrupt: Any,
    batch_size: int,
    progress: bool,
) -> tuple[dict[int, float], list[float], list[list[float]]]:
    """The accuracy with the first n of ``order`` kept (every other head of ``kind``
    ablated), and of each order of ``shuffled``, for each n of ``chosen``: ``(the two ends,
    nothing and every head kept, shared by every order; the ranking's row; one row per
    random order)``."""
    inner = [n for n in chosen if 0 < n < len(heads)]
    bar = progress_bar(total=2 + len(inner) * (1 + len(shuffled)), show=progress, desc=f"retention ({kind}, {how})")
    with bar:

        def accuracy(kept: Sequence[Head]) -> float:
            bar.update(1)
            return keep_only_summary(model, task, kept, kind, how, corrupt, batch_size)["accuracy"]

        ends = {0: accuracy([]), len(heads): accuracy(heads)}  # the same for every order
        ranked = [ends[n] if n in ends else accuracy(order[:n]) for n in chosen]
        random_rows = [[ends[n] if n in ends else accuracy(perm[:n]) for n in chosen] for perm in shuffled]
    return ends, ranked, random_rows


def _seeds(seeds: int | Sequence[int]) -> list[int]:
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise GnaValueError(f"seeds={seeds}: expected at least one random order (a count >= 1 or a list of seeds)")
        return list(range(seeds))
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds:
        raise GnaTypeError(f"seeds={seeds!r}: expected a count of random orders (int >= 1) or a non-empty list of int seeds")
    for index, seed in enumerate(seeds):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise GnaTypeError(f"seeds[{index}]={seed!r}: expected an int seed")
    return list(seeds)


def _order_of_kind(model: GnaModel, ranking: Any, heads: list[Head], kind: str) -> list[Head]:
    """``ranking``'s heads of ``kind``, best first; the kind's heads it leaves out follow."""
    if isinstance(ranking, RetrievalRanking):
        listed = list(ranking.order)
    else:
        listed = rank_heads(model, ranking)  # checks a list's heads; appends the rest
        if not isinstance(ranking, SweepResult):
            allowed = set(heads)
            for index, head in enumerate(ranking):
                if head not in allowed:
                    actual = model.layout.head_kind(head).value
                    raise GnaValueError(f"ranking[{index}] is {head}, an {actual} head: expected heads of kind={kind!r}")
    allowed = set(heads)
    ordered = [head for head in listed if head in allowed]
    return ordered + [head for head in heads if head not in set(ordered)]
