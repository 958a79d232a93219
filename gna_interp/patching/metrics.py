"""Metric helpers: functions of logits ``[batch, pos, vocab]`` returning ``[batch]``.

A sweep calls the metric on the logits of each variant (the same rows, in the same
order, as the inputs) and averages a per-example result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

Metric = Callable[[Tensor], Tensor | float]
TokenSpec = int | Sequence[int] | Sequence[Sequence[int]] | Tensor


def _token_table(tokens: TokenSpec, n_rows: int, what: str) -> Tensor:
    """``[batch, k]`` long: per row, a set of ``k`` token ids.

    An int is one id for every row; a list of ints is one set shared by every row; a
    1-D tensor is one id *per row*; a 2-D tensor or list of lists is one set per row.
    """
    if isinstance(tokens, Tensor) and tokens.dim() == 1:
        if tokens.numel() != n_rows:
            raise ValueError(f"{what} is a 1-D tensor of {tokens.numel()} ids: expected one id per row ({n_rows})")
        return tokens.long().view(-1, 1)
    table = torch.as_tensor(tokens, dtype=torch.long)
    if table.dim() == 0:
        table = table.view(1, 1)
    elif table.dim() == 1:
        table = table.view(1, -1)
    if table.dim() != 2 or table.shape[0] not in (1, n_rows) or table.shape[1] == 0:
        raise ValueError(f"{what} has shape {tuple(table.shape)}: expected an id, a list of ids, or one row per example ({n_rows})")
    return table.expand(n_rows, -1)


def logit_diff(correct: TokenSpec, incorrect: TokenSpec, position: int = -1) -> Metric:
    """Mean logit of ``correct`` minus mean logit of ``incorrect`` at ``position``.

    ``correct`` / ``incorrect``: a token id, a list of ids (one set shared by every
    row), a 1-D ``[batch]`` tensor (one id per row) or a ``[batch, k]`` table of sets.
    """

    def metric(logits: Tensor) -> Tensor:
        final = logits[:, position]
        good = final.gather(1, _token_table(correct, final.shape[0], "correct").to(final.device)).mean(1)
        bad = final.gather(1, _token_table(incorrect, final.shape[0], "incorrect").to(final.device)).mean(1)
        return good - bad

    return _reads(metric, position)


def target_logprob(targets: TokenSpec, position: int = -1) -> Metric:
    """Log-probability of ``targets`` (one id, or one per row) at ``position``."""

    def metric(logits: Tensor) -> Tensor:
        logprobs = logits[:, position].float().log_softmax(-1)
        table = _token_table(targets, logprobs.shape[0], "targets").to(logprobs.device)
        if table.shape[1] != 1:
            raise ValueError(f"targets has {table.shape[1]} ids per row: target_logprob takes one id per row")
        return logprobs.gather(1, table).squeeze(1)

    return _reads(metric, position)


def candidate_accuracy(candidates: TokenSpec, correct: Sequence[int] | Tensor, position: int = -1) -> Metric:
    """1.0 where the correct candidate has the highest logit among ``candidates``.

    ``candidates``: a list of token ids shared by every row, or ``[batch, n_candidates]``;
    ``correct``: ``[batch]`` index into the candidates.
    """
    correct_index = torch.as_tensor(correct, dtype=torch.long).view(-1)

    def metric(logits: Tensor) -> Tensor:
        final = logits[:, position]
        table = _token_table(candidates, final.shape[0], "candidates").to(final.device)
        chosen = final.gather(1, table).argmax(1)
        return (chosen == correct_index.to(final.device)).float()

    return _reads(metric, position)


def candidate_logprob(candidates: TokenSpec, correct: Sequence[int] | Tensor, position: int = -1) -> Metric:
    """Log-probability of the correct candidate among ``candidates`` alone (a log-softmax
    over their logits): the differentiable counterpart of `candidate_accuracy`."""
    correct_index = torch.as_tensor(correct, dtype=torch.long).view(-1, 1)

    def metric(logits: Tensor) -> Tensor:
        final = logits[:, position].float()
        table = _token_table(candidates, final.shape[0], "candidates").to(final.device)
        return final.gather(1, table).log_softmax(-1).gather(1, correct_index.to(final.device)).squeeze(1)

    return _reads(metric, position)


def candidate_logit_diff(candidates: TokenSpec, correct: Sequence[int] | Tensor, position: int = -1) -> Metric:
    """Logit of the correct candidate minus the mean logit of the other candidates: linear
    in the logits, so it does not saturate where the model is confident (as
    `candidate_logprob` does); what attribution estimates best."""
    correct_index = torch.as_tensor(correct, dtype=torch.long).view(-1, 1)

    def metric(logits: Tensor) -> Tensor:
        final = logits[:, position].float()
        table = final.gather(1, _token_table(candidates, final.shape[0], "candidates").to(final.device))
        right = table.gather(1, correct_index.to(final.device)).squeeze(1)
        return right - (table.sum(1) - right) / max(1, table.shape[1] - 1)

    return _reads(metric, position)


def _reads(metric: Metric, position: int) -> Metric:
    """Tag ``metric`` with the one position it reads (``metric.position``): a sweep on a
    remote model then asks only for that position's logits back."""
    metric.position = position  # type: ignore[attr-defined]
    return metric


def check_metric(metric: object) -> None:
    """A clear error for a metric that is not a function (e.g. the name ``"accuracy"``)."""
    if callable(metric):
        return
    hint = ""
    if isinstance(metric, str):
        hint = (
            f"; {metric!r} is a name, not a metric: build one, e.g. gna.candidate_accuracy(encoded.candidate_ids, "
            "encoded.correct) with encoded = task.encode(model.tokenizer), or gna.logit_diff(correct_ids, wrong_ids)"
        )
    raise TypeError(f"metric={metric!r} is not callable: expected a function of logits [batch, pos, vocab] -> scalar or [batch]{hint}")


def reduce_metric(value: Tensor | float) -> float:
    """A metric's output as one number: scalars pass, per-example tensors are averaged."""
    if isinstance(value, Tensor):
        if value.numel() == 0:
            raise ValueError("metric returned an empty tensor")
        return float(value.float().mean())
    return float(value)
