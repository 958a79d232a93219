"""Metric helpers: functions of logits ``[batch, pos, vocab]`` returning ``[batch]``.

A sweep calls the metric on the logits of each variant (the same rows, in the same
order, as the inputs) and averages a per-example result.

Every helper checks what it can when it is built (ids are ints of 0 or more, a
``correct`` index lies among the candidates, candidates are distinct) and the rest when
it reads logits (``position`` within the positions, ids within the vocabulary, one row
of ids or indices per row of logits); each error names the helper, the argument, the
bad value and what was expected.

Candidate accuracy counts a tie as wrong: a row scores 1.0 only when the correct
candidate's logit is strictly above every other candidate's.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core.errors import GnaTypeError, GnaValueError, short_repr
from ..core.keywords import suggest_keywords

Metric = Callable[[Tensor], Tensor | float]
TokenSpec = int | Sequence[int] | Sequence[Sequence[int]] | Tensor


def _integer_tensor(value: Any, what: str, owner: str, kind: str) -> Tensor:
    """``value`` as a long tensor; a float, bool, string or ragged list is refused."""
    if _holds_text(value):
        raise GnaTypeError(
            f"{owner}: {what}={short_repr(value)} is text: expected {kind}; get a token's id from the tokenizer, e.g. "
            f"model.tokenizer.encode({_first_text(value)!r}, add_special_tokens=False)[0] (a task's candidates: "
            "task.encode(model.tokenizer).candidate_ids)"
        )
    try:
        raw = value if isinstance(value, Tensor) else torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:  # a string (TypeError), a ragged list (ValueError)
        kind_of_error = TypeError if isinstance(error, TypeError) else ValueError
        raise kind_of_error(f"{owner}: {what}={value!r} is not understood: expected {kind} ({error})") from None
    if raw.numel() == 0:
        raise GnaValueError(f"{owner}: {what} is empty: expected {kind}")
    if raw.dtype == torch.bool or raw.is_floating_point() or raw.is_complex():
        raise GnaTypeError(f"{owner}: {what}={value!r} has dtype {raw.dtype}: expected {kind} (integers)")
    return raw.long()


def _holds_text(value: Any) -> bool:
    """A string, or a list (of lists) holding one, where token ids are expected."""
    if isinstance(value, (str, bytes)):
        return True
    return isinstance(value, (list, tuple)) and any(_holds_text(item) for item in value)


def _first_text(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        return value
    return next(_first_text(item) for item in value if _holds_text(item))


@dataclass(frozen=True)
class _Ids:
    """Token ids checked when a metric is built: ``table`` ``[1 or batch, k]``.

    ``one_per_row``: given as a 1-D tensor, one id per row of logits.
    """

    table: Tensor
    one_per_row: bool
    what: str
    owner: str

    def rows(self, n_rows: int, vocab: int, device: torch.device) -> Tensor:
        """``[n_rows, k]`` long on ``device``, after the checks that need the logits."""
        table = self.table
        if self.one_per_row and table.shape[0] != n_rows:
            raise GnaValueError(f"{self.owner}: {self.what} is a 1-D tensor of {table.shape[0]} ids: expected one id per row ({n_rows})")
        if table.shape[0] not in (1, n_rows):
            raise GnaValueError(
                f"{self.owner}: {self.what} has shape {tuple(table.shape)}: expected an id, a list of ids, "
                f"or one row per example ({n_rows})"
            )
        if int(table.max()) >= vocab:
            where = _first(table >= vocab)
            raise GnaValueError(
                f"{self.owner}: {self.what} holds token id {int(table[where])}{_at(where, table)}, out of range "
                f"for logits of a vocabulary of {vocab}: expected ids 0..{vocab - 1}"
            )
        return table.expand(n_rows, -1).to(device)


def _first(mask: Tensor) -> tuple[int, ...]:
    """Index of the first True of ``mask`` in row-major order."""
    return tuple(int(i) for i in mask.nonzero()[0])


def _at(where: tuple[int, ...], table: Tensor) -> str:
    """`` (row 2, entry 1)`` for a table of several, nothing for a single id."""
    if table.numel() == 1:
        return ""
    row, column = where
    return f" (row {row}, entry {column})" if table.shape[0] > 1 else f" (entry {column})"


def _token_ids(tokens: TokenSpec, what: str, owner: str) -> _Ids:
    """Parse a token-id argument: an int is one id for every row; a list of ints is one
    set shared by every row; a 1-D tensor is one id *per row*; a 2-D tensor or list of
    lists is one set per row (or ``[1, k]``, one set for every row)."""
    kind = "a token id, a list of ids, a 1-D tensor (one id per row) or a [batch, k] table"
    raw = _integer_tensor(tokens, what, owner, kind)
    one_per_row = isinstance(tokens, Tensor) and raw.dim() == 1
    if raw.dim() > 2:
        raise GnaValueError(f"{owner}: {what} has shape {tuple(raw.shape)}: expected {kind}")
    table = raw.view(-1, 1) if one_per_row else raw.view(1, -1) if raw.dim() < 2 else raw
    if int(table.min()) < 0:
        where = _first(table < 0)
        raise GnaValueError(f"{owner}: {what} holds token id {int(table[where])}{_at(where, table)}: token ids are 0 or more")
    return _Ids(table.cpu(), one_per_row, what, owner)


def _distinct(ids: _Ids) -> None:
    """Candidates of one row that share a token could only tie: refused."""
    table = ids.table
    for row in range(table.shape[0]):
        values = table[row].tolist()
        for j, token in enumerate(values):
            if token in values[:j]:
                i = values.index(token)
                where = f"row {row} of {ids.what}" if table.shape[0] > 1 else ids.what
                raise GnaValueError(
                    f"{ids.owner}: {where} has token id {token} twice (candidates {i} and {j}): each candidate "
                    "needs its own token, or the two always tie"
                )


def _position(position: Any, owner: str) -> int:
    if isinstance(position, bool):
        raise GnaTypeError(f"{owner}: position={position!r}: expected an int position (-1: the last)")
    try:
        return operator.index(position)
    except TypeError:
        raise GnaTypeError(f"{owner}: position={position!r}: expected an int position (-1: the last)") from None


def _read(logits: Tensor, position: int, owner: str) -> Tensor:
    """``[batch, vocab]``: the logits at ``position``, checked against their shape."""
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise GnaValueError(f"{owner}: got logits of shape {shape}: expected [batch, pos, vocab]")
    n_pos = logits.shape[1]
    if not -n_pos <= position < n_pos:
        raise GnaValueError(f"{owner}: position={position} out of range for logits of {n_pos} positions: expected {-n_pos}..{n_pos - 1}")
    return logits[:, position]


def _correct_index(correct: Sequence[int] | Tensor | int, n_candidates: int, owner: str) -> Tensor:
    """``[n]`` long indices into the candidates, each in ``0..n_candidates - 1``."""
    index = _integer_tensor(correct, "correct", owner, "an index into the candidates, or one per row").reshape(-1)
    bad = (index < 0) | (index >= n_candidates)
    if bool(bad.any()):
        first = int(bad.nonzero()[0])
        name = f"correct[{first}]" if index.numel() > 1 else "correct"
        raise GnaValueError(
            f"{owner}: {name}={int(index[first])} out of range for {n_candidates} candidates: expected an index 0..{n_candidates - 1}"
        )
    return index.cpu()


def _correct_rows(index: Tensor, n_rows: int, owner: str, device: torch.device) -> Tensor:
    """``[n_rows, 1]`` long: one correct index per row of logits."""
    if index.numel() not in (1, n_rows):
        raise GnaValueError(
            f"{owner}: correct has {index.numel()} values for logits of {n_rows} rows: "
            f"expected one index per row ({n_rows}) or a single index"
        )
    return index.view(-1, 1).expand(n_rows, 1).to(device)


@suggest_keywords
def logit_diff(correct: TokenSpec, incorrect: TokenSpec, position: int = -1) -> Metric:
    """Mean logit of ``correct`` minus mean logit of ``incorrect`` at ``position``.

    ``correct`` / ``incorrect``: a token id, a list of ids (one set shared by every
    row), a 1-D ``[batch]`` tensor (one id per row) or a ``[batch, k]`` table of sets.
    """
    owner = "logit_diff"
    good_ids, bad_ids = _token_ids(correct, "correct", owner), _token_ids(incorrect, "incorrect", owner)
    position = _position(position, owner)

    def metric(logits: Tensor) -> Tensor:
        final = _read(logits, position, owner)
        n_rows, vocab = final.shape
        good = final.gather(1, good_ids.rows(n_rows, vocab, final.device)).mean(1)
        bad = final.gather(1, bad_ids.rows(n_rows, vocab, final.device)).mean(1)
        return good - bad

    return _reads(metric, position, owner)


@suggest_keywords
def target_logprob(targets: TokenSpec, position: int = -1) -> Metric:
    """Log-probability of ``targets`` (one id, or one per row) at ``position``."""
    owner = "target_logprob"
    ids = _token_ids(targets, "targets", owner)
    if ids.table.shape[1] != 1:
        raise GnaValueError(f"targets has {ids.table.shape[1]} ids per row: target_logprob takes one id per row")
    position = _position(position, owner)

    def metric(logits: Tensor) -> Tensor:
        final = _read(logits, position, owner)
        n_rows, vocab = final.shape
        table = ids.rows(n_rows, vocab, final.device)
        return final.float().log_softmax(-1).gather(1, table).squeeze(1)

    return _reads(metric, position, owner)


def _candidate_metric(
    owner: str, candidates: TokenSpec, correct: Sequence[int] | Tensor, position: int, score: Callable[[Tensor, Tensor], Tensor]
) -> Metric:
    """A metric of the candidates' logits ``[batch, k]`` and the correct index ``[batch, 1]``."""
    ids = _token_ids(candidates, "candidates", owner)
    _distinct(ids)
    index = _correct_index(correct, ids.table.shape[1], owner)
    position = _position(position, owner)

    def metric(logits: Tensor) -> Tensor:
        final = _read(logits, position, owner)
        n_rows, vocab = final.shape
        chosen = final.gather(1, ids.rows(n_rows, vocab, final.device))
        return score(chosen, _correct_rows(index, n_rows, owner, final.device))

    return _reads(metric, position, owner)


@suggest_keywords
def candidate_accuracy(candidates: TokenSpec, correct: Sequence[int] | Tensor, position: int = -1) -> Metric:
    """1.0 where the correct candidate's logit is strictly the highest among ``candidates``;
    0.0 otherwise, a tie included (a tie is scored as wrong).

    ``candidates``: a list of distinct token ids shared by every row, or ``[batch,
    n_candidates]``; ``correct``: ``[batch]`` index into the candidates (or one index for
    every row), each in ``0..n_candidates - 1``.
    """

    def score(chosen: Tensor, index: Tensor) -> Tensor:
        right = chosen.gather(1, index).squeeze(1)
        others = chosen.scatter(1, index, float("-inf")).max(1).values
        return (right > others).float()

    return _candidate_metric("candidate_accuracy", candidates, correct, position, score)


@suggest_keywords
def candidate_logprob(candidates: TokenSpec, correct: Sequence[int] | Tensor, position: int = -1) -> Metric:
    """Log-probability of the correct candidate among ``candidates`` alone (a log-softmax
    over their logits): the differentiable counterpart of `candidate_accuracy`."""

    def score(chosen: Tensor, index: Tensor) -> Tensor:
        return chosen.float().log_softmax(-1).gather(1, index).squeeze(1)

    return _candidate_metric("candidate_logprob", candidates, correct, position, score)


@suggest_keywords
def candidate_logit_diff(candidates: TokenSpec, correct: Sequence[int] | Tensor, position: int = -1) -> Metric:
    """Logit of the correct candidate minus the mean logit of the other candidates: linear
    in the logits, so it does not saturate where the model is confident (as
    `candidate_logprob` does); what attribution estimates best."""

    def score(chosen: Tensor, index: Tensor) -> Tensor:
        table = chosen.float()
        right = table.gather(1, index).squeeze(1)
        return right - (table.sum(1) - right) / max(1, table.shape[1] - 1)

    return _candidate_metric("candidate_logit_diff", candidates, correct, position, score)


def _reads(metric: Callable[[Tensor], Tensor], position: int, name: str) -> Metric:
    """Name ``metric`` for errors and tag it with the one position it reads
    (``metric.position``): forwards scored by it compute the logits there alone
    (`logits_read`), and a remote model sends only those back."""
    metric.__name__ = metric.__qualname__ = name
    metric.position = position  # type: ignore[attr-defined]
    return metric


@suggest_keywords
def reads_position(metric: Metric, position: int = -1) -> Metric:
    """``metric``, declared to read the logits at ``position`` alone (a negative position,
    ``-k``: forwards scored by it compute the logits of the last ``k`` positions only, and
    the metric receives those, ``[batch, k, vocab]``, where ``logits[:, position]`` is what
    it was). The library's metrics declare their position themselves; an undeclared
    callable gets every position.

    Args:
        metric: a function of logits ``[batch, pos, vocab]`` returning a scalar or ``[batch]``.
        position: the one position it reads (``-1``: the last).
    """
    check_metric(metric)
    position = _position(position, "reads_position")

    def declared(logits: Tensor) -> Tensor | float:
        return metric(logits)

    return _reads(declared, position, metric_name(metric))  # type: ignore[arg-type]


def logits_read(metric: object) -> int:
    """How many final positions' logits ``metric`` reads, as ``logits_to_keep``: ``k`` when
    it declares a negative ``position`` ``-k`` (the library's metrics, `reads_position`),
    ``0`` (every position) for any other callable: a user metric that says nothing gets
    every position."""
    position = getattr(metric, "position", None)
    if isinstance(position, int) and not isinstance(position, bool) and position < 0:
        return -position
    return 0


def metric_name(metric: object) -> str:
    """How errors name a metric: its qualified name (``logit_diff``,
    ``my_metric``, ``test.<locals>.<lambda>``), else its repr."""
    name = getattr(metric, "__qualname__", None) or getattr(metric, "__name__", None)
    return str(name) if isinstance(name, str) else repr(metric)


def check_metric(metric: object, call: str = "", **inputs: object) -> None:
    """A clear error for a metric that is not a function (e.g. the name ``"accuracy"``);
    where one of ``call``'s ``inputs`` (``clean=...``) is the function, the two arguments are
    named as swapped."""
    if callable(metric):
        return
    shown = f"metric={short_repr(metric)} ({type(metric).__name__})"
    swapped = next((name for name, value in inputs.items() if callable(value) and not isinstance(value, type)), None)
    if swapped is not None:
        order = ", ".join(["model", *inputs, "metric"])
        raise GnaTypeError(
            f"{call}: the arguments {swapped} and metric are swapped: {swapped}={short_repr(inputs[swapped])} is the function "
            f"and {shown} is not; call {call}({order}, ...)"
        )
    hint = ""
    if isinstance(metric, str):
        hint = (
            f"; {metric!r} is a name, not a metric: build one, e.g. gna.candidate_accuracy(encoded.candidate_ids, "
            "encoded.correct) with encoded = task.encode(model.tokenizer), or gna.logit_diff(correct_ids, wrong_ids)"
        )
    where = f"{call}: " if call else ""
    raise GnaTypeError(
        f"{where}metric={short_repr(metric)} is not callable: expected a function of logits [batch, pos, vocab] -> scalar or [batch]{hint}"
    )


METRIC_RESULT = "a float, or a tensor (a scalar, or one value per row: averaged)"


def reduce_metric(value: Tensor | float, metric: object = None, n_rows: int | None = None) -> float:
    """A metric's output as one number: scalars pass, per-example tensors are averaged
    in float32 (a bf16 model's metric is not averaged in bf16).

    Args:
        value: what ``metric`` returned.
        metric: the metric, named in the error when ``value`` is not a number.
        n_rows: the rows of the logits it read; a 1-D result of another length is refused.
    """
    if isinstance(value, Tensor):
        if value.numel() == 0:
            raise GnaValueError(f"metric {metric_name(metric)} returned an empty tensor: expected {METRIC_RESULT}")
        if value.dim() > 1 or (value.dim() == 1 and n_rows is not None and value.numel() not in (1, n_rows)):
            rows = f" ({n_rows})" if n_rows is not None else ""
            raise GnaValueError(
                f"metric {metric_name(metric)} returned a tensor of shape {tuple(value.shape)}: expected a scalar or "
                f"one value per row [batch]{rows}; reduce it over its other axes first (e.g. .mean(-1) or .sum(-1))"
            )
        return float(value.float().mean())
    if not isinstance(value, (str, bytes)) and value is not None:
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    hint = f"; make its {len(value)} values a tensor: torch.tensor(values)" if isinstance(value, (list, tuple)) else ""
    raise GnaTypeError(
        f"metric {metric_name(metric)} returned {short_repr(value)} ({type(value).__name__}): expected {METRIC_RESULT}{hint}"
    )
