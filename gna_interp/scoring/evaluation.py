"""`evaluate`: accuracy and margins of a model on a `Task`, with or without interventions.

Each candidate is scored by its log-probability after the prompt (summed over its
tokens when it has several), as lm-eval scores MMLU. Single-token candidates come from
the final-position logits of one forward; multi-token ones from forwards over the
prompt followed by each candidate.

A prompt is answered correctly when its correct candidate scores strictly above every
other candidate: a tie is scored as wrong (so a model that cannot tell the candidates
apart scores 0, never 1). Two candidates of one prompt that tokenize alike would always
tie, and are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.errors import GnaValueError
from ..core.inputs import Batch, make_batch
from ..core.inputs import check_context as check_batch_context
from ..core.interventions import Ablate, Intervention, KeepOnly, MaskAttentionRows, Patch, as_interventions
from ..core.keywords import suggest_keywords
from ..models.handle import check_model, context_limit
from ..progress import progress_bar
from ..tasks.base import EncodedTask, Task, not_a_task

if TYPE_CHECKING:
    import pandas as pd

    from ..models.handle import GnaModel


@dataclass
class Evaluation:
    """Per-example scores of one task."""

    scores: Tensor
    """``[batch, candidate]`` log-probability of each candidate."""
    correct: Tensor
    """``[batch]`` index of the correct candidate."""

    @property
    def predictions(self) -> Tensor:
        """``[batch]`` index of the best-scoring candidate (the first of tied ones)."""
        return self.scores.argmax(-1)

    @property
    def is_correct(self) -> Tensor:
        """``[batch]`` bool: the correct candidate scores strictly above every other one.
        A tie is wrong, even where `predictions` (the first of the tied) is the correct index."""
        return self.margins > 0

    @property
    def accuracy(self) -> float:
        """The share of prompts answered correctly (ties count as wrong)."""
        return float(self.is_correct.double().mean())  # exact: 31 of 100 is 0.31, not 0.3100000023841858

    @property
    def margins(self) -> Tensor:
        """``[batch]`` log-prob of the correct candidate minus the best other one:
        positive exactly when the example is answered correctly (0 on a tie, scored wrong)."""
        rows = torch.arange(self.scores.shape[0])
        right = self.scores[rows, self.correct]
        others = self.scores.clone()
        others[rows, self.correct] = float("-inf")
        return right - others.max(-1).values

    @property
    def chance(self) -> float:
        return 1.0 / self.scores.shape[1]

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(
            {
                "correct": self.correct.tolist(),
                "prediction": self.predictions.tolist(),
                "is_correct": self.is_correct.tolist(),
                "margin": self.margins.tolist(),
                "correct_logprob": self.scores[torch.arange(self.scores.shape[0]), self.correct].tolist(),
            }
        )

    def __repr__(self) -> str:
        return f"Evaluation(accuracy={self.accuracy:.3f} on {self.scores.shape[0]} prompts, chance {self.chance:.3f})"


@suggest_keywords
def evaluate(
    model: GnaModel,
    task: Task,
    interventions: Intervention | Sequence[Intervention] = (),
    *,
    batch_size: int = 64,
    progress: bool | None = None,
) -> Evaluation:
    """Score every prompt of ``task``.

    Args:
        model: any `GnaModel`; the task is tokenized with the task's own tokenizer if
            it has one (the toy task), else with the model's.
        task: a `Task`.
        interventions: one intervention or a list, applied to every forward (as are
            active ``model.ablated`` blocks).
        batch_size: prompts per forward. Interventions that pair rows with their
            own data (a `Patch`, a resample `Ablate`) run all prompts in one forward;
            positional ones (`MaskAttentionRows`, `Ablate(positions=...)`) keep the
            task's padded width, with per-row positions sliced along with the rows.
        progress: a tqdm bar over batches (default: when there are more than 4).
    """
    check_model(model, "evaluate")
    check_task(task, "evaluate")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GnaValueError(f"batch_size={batch_size!r}: expected a positive int")
    interventions = as_interventions(interventions)
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    check_distinct_candidates(task, encoded)
    check_context(model, encoded)
    ambient = model.active_interventions
    row_paired = any(_row_paired(item) for item in interventions) or any(_row_paired(i) or _per_row(i) for i in ambient)
    positional = any(_positional(item) for item in [*ambient, *interventions])
    if row_paired:
        batch_size = encoded.batch.n_rows
    if encoded.single_token:
        scores = _single_token_scores(model, encoded, interventions, batch_size, progress, keep_columns=positional)
    else:
        if row_paired or positional:
            raise GnaValueError(
                "multi-token candidates are scored over re-padded batches, which a Patch, MaskAttentionRows, "
                "or a resample or positional Ablate cannot follow"
            )
        scores = _continuation_scores(model, encoded, interventions, batch_size, progress)
    return Evaluation(scores=scores, correct=encoded.correct.clone())


def _row_paired(item: Intervention) -> bool:
    """Interventions that pair each row with its own data: all prompts go in one forward."""
    return isinstance(item, Patch) or (isinstance(item, (Ablate, KeepOnly)) and item.how == "resample")


def _positional(item: Intervention) -> bool:
    """Interventions at chosen positions: batches keep the task's padded columns (so
    positions mean the same), and re-padded continuation batches cannot follow them."""
    return isinstance(item, MaskAttentionRows) or (isinstance(item, Ablate) and item.positions is not None)


def _per_row(item: Intervention) -> bool:
    """Positions given per row (a tensor): a chunk of rows needs its own slice of them."""
    return _positional(item) and isinstance(getattr(item, "positions", None), Tensor) and item.positions.dim() >= 1  # type: ignore[union-attr]


def _rows_of(item: Intervention, start: int, stop: int) -> Intervention:
    """``item`` for rows ``start:stop`` of the batch (per-row positions sliced)."""
    if isinstance(item, (Ablate, MaskAttentionRows)) and _per_row(item):
        positions: Tensor = item.positions  # type: ignore[assignment]
        return replace(item, positions=positions[start:stop])
    return item


def check_task(task: object, call: str) -> None:
    """A clear `TypeError` where ``call``'s ``task`` argument is not a `Task` (e.g. a list
    of prompts, which has no answers to score, or a toy's name): `not_a_task`."""
    if not isinstance(task, Task):
        raise not_a_task(task, call)


def check_distinct_candidates(task: Task, encoded: EncodedTask) -> None:
    """A clear error where two candidates of one prompt tokenize to the same tokens (e.g.
    labels the tokenizer lacks, all become its unknown token): they would always tie."""
    for row, (example, tokens) in enumerate(zip(task.examples, encoded.candidates, strict=True)):
        seen: dict[tuple[int, ...], int] = {}
        for index, candidate in enumerate(tokens):
            first = seen.setdefault(tuple(candidate), index)
            if first != index:
                labels = example.candidates
                raise GnaValueError(
                    f"task {task.name!r}, prompt {row}: candidates {labels[first]!r} and {labels[index]!r} both tokenize "
                    f"to {candidate}, so they always tie: every candidate needs its own tokens (labels the tokenizer "
                    "knows; for the bundled toy models: gna.tasks.toy.VOCAB)"
                )


def check_context(model: GnaModel, encoded: EncodedTask) -> None:
    """A clear error for prompts longer than the model's context window (`core.inputs.check_context`)."""
    check_batch_context(encoded.batch, context_limit(model.hf_model), model.name)


def _chunks(n_rows: int, size: int, progress: bool | None, what: str) -> Any:
    starts = range(0, n_rows, size)
    return progress_bar(starts, show=len(starts) > 4 if progress is None else progress, desc=what)


def _slice(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``start:stop``, with columns that are padding in every row dropped."""
    ids, mask = batch.input_ids[start:stop], batch.attention_mask[start:stop]
    first = int(mask.any(0).long().argmax())
    return Batch(ids[:, first:], mask[:, first:])


def _single_token_chunks(
    encoded: EncodedTask, interventions: Sequence[Intervention], size: int, keep_columns: bool = False
) -> list[tuple[int, int, Batch, list[Intervention]]]:
    """The forwards `evaluate` runs for single-token candidates: ``(start, stop, rows,
    interventions)``, ``size`` prompts each. ``keep_columns``: chunks keep the task's padded
    width (positional interventions index it) and per-row positions are sliced with the
    rows; otherwise columns that are padding in every row of a chunk are dropped."""
    batch = encoded.batch
    chunks = []
    for start in range(0, batch.n_rows, size):
        stop = min(start + size, batch.n_rows)
        if size >= batch.n_rows:  # one forward: the padded width row-paired interventions expect
            chunks.append((start, stop, batch, list(interventions)))
        elif keep_columns:
            rows = Batch(batch.input_ids[start:stop], batch.attention_mask[start:stop])
            chunks.append((start, stop, rows, [_rows_of(item, start, stop) for item in interventions]))
        else:
            chunks.append((start, stop, _slice(batch, start, stop), list(interventions)))
    return chunks


def _candidate_logprobs(final_logits: Tensor, candidate_ids: Tensor) -> Tensor:
    """``[rows, candidate]`` log-probs from the final position's logits ``[rows, vocab]``."""
    return final_logits.float().log_softmax(-1).cpu().gather(1, candidate_ids)


def _single_token_scores(
    model: GnaModel, encoded: EncodedTask, interventions: Sequence[Intervention], size: int, progress: Any, keep_columns: bool = False
) -> Tensor:
    """Log-probs ``[batch, candidate]`` of single-token candidates (see `_single_token_chunks`)."""
    chunks = _single_token_chunks(encoded, interventions, size, keep_columns)
    parts = []
    for start, stop, rows, chunk in progress_bar(chunks, show=len(chunks) > 4 if progress is None else progress, desc="evaluate"):
        parts.append(_candidate_logprobs(model.logits(rows, chunk, logits_to_keep=1)[:, -1], encoded.candidate_ids[start:stop]))
    return torch.cat(parts)


def evaluate_many(
    model: GnaModel, runs: Sequence[tuple[Task, Sequence[Intervention]]], *, batch_size: int = 64, progress: bool | None = None
) -> list[Evaluation]:
    """`evaluate` of each ``(task, interventions)``, the same numbers, run together: see
    `evaluate_with_logits`, which this is without extra logits."""
    return evaluate_with_logits(model, runs, (), batch_size=batch_size, progress=progress)[0]


def evaluate_with_logits(
    model: GnaModel,
    runs: Sequence[tuple[Task, Sequence[Intervention]]],
    logits_of: Sequence[Any],
    *,
    batch_size: int = 64,
    progress: bool | None = None,
) -> tuple[list[Evaluation], list[Tensor]]:
    """`evaluate` of each ``(task, interventions)``, the same numbers, run together, and
    the final position's logits ``[batch, 1, vocab]`` of each input of ``logits_of`` (no
    interventions beyond active contexts).

    Locally this is a loop of `evaluate` and `GnaModel.logits`. On a remote nnsight model (NDIF or
    ``remote="local"``) every forward of every run goes into one session request
    (`gna_interp.models.jobs`), each starting from its batch's clean prefix captured on
    the server, and only the final position's logits come back. Interventions that need
    activations (mean / resample ablation, patching) capture them first, in requests of
    their own; runs with multi-token candidates are evaluated one by one.
    """
    from ..models.jobs import JobList, is_batched_remote

    if not is_batched_remote(model):
        evaluations = [evaluate(model, task, interventions, batch_size=batch_size, progress=progress) for task, interventions in runs]
        return evaluations, [model.logits(inputs, logits_to_keep=1) for inputs in logits_of]
    jobs = JobList(model)
    pending: list[tuple[EncodedTask, list[tuple[int, int, int]]] | Evaluation] = []
    for task, interventions in runs:
        check_task(task, "evaluate_with_logits")
        encoded = task.encode(task.tokenizer_for(model.tokenizer))
        check_distinct_candidates(task, encoded)
        if not encoded.single_token:
            pending.append(evaluate(model, task, interventions, batch_size=batch_size, progress=progress))
            continue
        check_context(model, encoded)
        ambient = model.active_interventions
        row_paired = any(_row_paired(item) for item in interventions) or any(_row_paired(i) or _per_row(i) for i in ambient)
        positional = any(_positional(item) for item in [*ambient, *interventions])
        size = encoded.batch.n_rows if row_paired else batch_size
        handles = []
        for start, stop, rows, chunk in _single_token_chunks(encoded, interventions, size, keep_columns=positional):
            rows = rows.to(model.device)
            handles.append((start, stop, jobs.add(rows, model.compile_plan(rows, [*ambient, *chunk]), keep=2)))
        pending.append((encoded, handles))
    plain = []
    for inputs in logits_of:
        batch = model.to_batch(inputs)
        plain.append(jobs.add(batch, model.compile_plan(batch, list(model.active_interventions)), keep=2))
    outputs = jobs.run()
    evaluations = []
    for item in pending:
        if isinstance(item, Evaluation):
            evaluations.append(item)
            continue
        encoded, handles = item
        parts = [_candidate_logprobs(outputs[h].logits[:, -1], encoded.candidate_ids[start:stop]) for start, stop, h in handles]  # type: ignore[union-attr]
        evaluations.append(Evaluation(scores=torch.cat(parts), correct=encoded.correct.clone()))
    return evaluations, [outputs[h].logits for h in plain]  # type: ignore[union-attr]


def _continuation_scores(model: GnaModel, encoded: EncodedTask, interventions: Sequence[Intervention], size: int, progress: Any) -> Tensor:
    """Summed log-prob of each candidate's tokens, from forwards over prompt + candidate."""
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(encoded.batch.input_ids, encoded.batch.attention_mask, strict=True)]
    sequences, spans = [], []
    for prompt, candidates in zip(prompts, encoded.candidates, strict=True):
        for tokens in candidates:
            sequences.append(prompt + tokens[:-1])
            spans.append(tokens)
    totals = []
    for start in _chunks(len(sequences), size, progress, "evaluate (continuations)"):
        chunk = sequences[start : start + size]
        batch = make_batch(chunk, model.tokenizer)
        logprobs = model.logits(batch, interventions).float().log_softmax(-1).cpu()
        for row, tokens in enumerate(spans[start : start + size]):
            positions = torch.arange(batch.n_pos - len(tokens), batch.n_pos)
            totals.append(logprobs[row, positions, torch.tensor(tokens)].sum())
    n_candidates = len(encoded.candidates[0])
    return torch.stack(totals).view(-1, n_candidates)
