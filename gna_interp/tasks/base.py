"""Tasks: prompts whose important positions are known.

A retrieval prompt is a sequence of *segments* (MMLU's answer options ``A. <text>\\n``,
the lines of a dictionary), each ending in a *segment-end* token (the line's ``\\n``;
the label in the toy task's label-last layout),
followed by a *final position* (``Answer:``) from which the model must read the right
segment. An `Example` records these places as character offsets, so it is independent
of any tokenizer; `Task.encode` maps them to token positions of a left-padded batch.

Axis names used in shapes: ``batch`` (prompts), ``pos`` (padded token positions),
``segment`` (options / dictionary lines), ``candidate`` (answers scored).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..core.errors import GnaTypeError, GnaValueError, short_repr
from ..core.inputs import Batch, make_batch, tokenize_naming_missing_words, unk_id, unknown_words, warn_unknown
from ..core.tokenizer_check import TOKENIZER_FIX, round_trip_problem


@dataclass(frozen=True)
class Segment:
    """One segment of a prompt, in characters of `Example.text`."""

    start: int
    """First character (the label, e.g. the ``A`` of ``A. text``)."""
    end: int
    """The segment-end character: the line's ``\\n`` (the label in a label-last layout)."""
    label: int
    """The label character (``A``; a dictionary line's key)."""


@dataclass(frozen=True)
class Example:
    """One prompt with its annotations (character offsets)."""

    text: str
    segments: tuple[Segment, ...]
    correct: int
    """Index of the correct candidate (= the correct segment for multiple choice)."""
    candidates: tuple[str, ...]
    """Continuations scored after the prompt, e.g. ``(" A", " B", " C", " D")``."""
    query: tuple[int, int] | None = None
    """``[start, end)`` characters of the query (toy task, dictionary key), if any."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    corrupter: Callable[[Example, random.Random], Example] | None = field(default=None, compare=False, repr=False)
    """How to build this prompt's corrupted counterpart (`Task.corrupted`), if the builder
    knows one: `mcq_example` sets `rotate_options`, `kv_example` rotates the values. A `Task`
    built without ``corrupter=`` uses its examples' own when they all share one."""


def check_example(example: Example, where: str) -> None:
    """Refuse annotations that do not fit the prompt: a segment or query outside the
    text, a label outside its segment, a ``correct`` index outside the candidates.

    Args:
        where: how the error names the example (``"task 'x', example 3"``).
    """
    if not isinstance(example, Example):
        raise GnaTypeError(f"{where} is {example!r} ({type(example).__name__}): expected a gna_interp.tasks.Example")
    text = example.text
    if not isinstance(text, str) or not text:
        raise GnaValueError(f"{where}: text={text!r}: expected a non-empty prompt string")
    n = len(text)
    for s, segment in enumerate(example.segments):
        bounds = (segment.start, segment.label, segment.end)
        if any(isinstance(b, bool) or not isinstance(b, int) for b in bounds) or not 0 <= segment.start <= segment.label <= segment.end < n:
            raise GnaValueError(
                f"{where}: segment {s} has start={segment.start!r}, label={segment.label!r}, end={segment.end!r}: "
                f"expected characters of the prompt with 0 <= start <= label <= end < {n} (its length)"
            )
    candidates = example.candidates
    if isinstance(candidates, str) or not candidates or not all(isinstance(c, str) and c for c in candidates):
        raise GnaValueError(f"{where}: candidates={candidates!r}: expected a non-empty tuple of non-empty strings (e.g. (' A', ' B'))")
    correct = example.correct
    if isinstance(correct, bool) or not isinstance(correct, int) or not 0 <= correct < len(candidates):
        raise GnaValueError(f"{where}: correct={correct!r}: expected the index of a candidate, 0..{len(candidates) - 1}")
    if example.query is not None:
        query = example.query
        pair = isinstance(query, (tuple, list)) and len(query) == 2 and all(isinstance(q, int) and not isinstance(q, bool) for q in query)
        if not pair or not 0 <= query[0] < query[1] <= n:
            expected = f"[start, end) characters of the prompt, 0 <= start < end <= {n} (its length)"
            raise GnaValueError(f"{where}: query={query!r}: expected {expected}")


@dataclass
class EncodedTask:
    """A task tokenized into one left-padded batch; every position indexes ``batch``'s columns."""

    batch: Batch
    final: Tensor
    """``[batch]`` the final prompt position (always ``pos - 1`` with left padding)."""
    segment_ends: Tensor
    """``[batch, segment]`` the token holding each segment's end (its ``\\n``)."""
    labels: Tensor
    """``[batch, segment]`` the token holding each segment's label character."""
    spans: Tensor
    """``[batch, segment, 2]`` ``[start, end)`` tokens of each segment, first token to segment end inclusive."""
    correct: Tensor
    """``[batch]`` index of the correct candidate."""
    candidates: list[list[list[int]]]
    """Per row, per candidate, its token ids (as they follow the prompt)."""
    query: Tensor | None = None
    """``[batch, 2]`` ``[start, end)`` tokens of the query, when the task has one."""

    @property
    def single_token(self) -> bool:
        """Whether every candidate is one token (scored from the final logits alone)."""
        return all(len(c) == 1 for row in self.candidates for c in row)

    @property
    def candidate_ids(self) -> Tensor:
        """``[batch, candidate]`` long; only for single-token candidates."""
        if not self.single_token:
            raise GnaValueError("some candidates span several tokens: use .candidates (token-id lists) instead of .candidate_ids")
        return torch.tensor([[c[0] for c in row] for row in self.candidates], dtype=torch.long)

    def segment_mask(self, segment: Tensor | None = None) -> Tensor:
        """``[batch, pos]`` bool: the tokens of one segment per row (default: the correct one)."""
        chosen = self.correct if segment is None else segment
        rows = torch.arange(self.batch.n_rows)
        start, end = self.spans[rows, chosen, 0], self.spans[rows, chosen, 1]
        cols = torch.arange(self.batch.n_pos)
        return (cols[None] >= start[:, None]) & (cols[None] < end[:, None])


TASK_HOW = (
    "expected a gna_interp Task with prompts and answers, e.g. gna.toy_task('llama'), gna.tasks.mmlu(...), "
    "gna.tasks.kv_retrieval(...), or your own: gna.tasks.Task(name, [gna.tasks.mcq_example(...), ...])"
)
"""How to build a Task: the one wording of every error for a value where a Task is expected."""


def not_a_task(value: object, call: str, what: str = "task") -> TypeError:
    """The error for ``value`` given as ``call``'s ``what`` where a `Task` is expected:
    the value (cut), `TASK_HOW`, and a hint for a toy's name or bare prompts."""
    if isinstance(value, str):
        hint = f"; a bundled toy's task is gna.toy_task(name) (gna.toy_names() lists them), not its name {value!r}"
    elif isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        hint = "; prompts alone have no answers to score: model.logits(prompts) gives their logits"
    elif type(value).__name__ == "GnaModel":  # by name: tasks/ sits below models/
        hint = f"; the model came where the task goes: {call}(model, task, ...) takes the model first"
    else:
        hint = ""
    return GnaTypeError(f"{call}: {what}={short_repr(value)} ({type(value).__name__}): {TASK_HOW}{hint}")


class Task:
    """Prompts with known positions and candidate answers.

    Args:
        name: e.g. ``"toy_mcq"``, ``"mmlu"``.
        examples: the prompts and their annotations.
        tokenizer: the tokenizer the task is meant for (the toy task's own); ``None``
            means "the model's", given at `encode` time.
        corrupter: ``(example, rng) -> example`` building a same-length counterpart
            with a different correct answer, for patching; default: the examples' own
            (`Example.corrupter`: `mcq_example` prompts rotate their options, see
            `gna_interp.tasks.rotate_options`).

    Raises:
        ValueError: for an example whose segments or query lie outside its prompt, or
            whose ``correct`` index is not one of its candidates (naming the example).
    """

    def __init__(
        self,
        name: str,
        examples: Iterable[Example],
        *,
        tokenizer: Any = None,
        corrupter: Callable[[Example, random.Random], Example] | None = None,
    ) -> None:
        if isinstance(examples, (str, Example)) or not isinstance(examples, Iterable):
            raise GnaTypeError(f"task {name!r}: examples={examples!r}: expected a list of gna_interp.tasks.Example")
        examples = list(examples)
        if not examples:
            raise GnaValueError(f"task {name!r} has no examples")
        for index, example in enumerate(examples):
            check_example(example, f"task {name!r}, example {index}")
        if corrupter is not None and not callable(corrupter):
            raise GnaTypeError(f"task {name!r}: corrupter={corrupter!r} is not callable: expected a function (example, rng) -> example")
        counts = {len(e.segments) for e in examples}
        if len(counts) != 1:
            raise GnaValueError(f"task {name!r} mixes examples with {sorted(counts)} segments: every prompt needs the same number")
        self.name = name
        self.examples = list(examples)
        self.tokenizer = tokenizer
        own = {e.corrupter for e in examples}
        self._corrupter = corrupter if corrupter is not None or len(own) != 1 else own.pop()
        self._encoded: dict[int, EncodedTask] = {}

    @property
    def prompts(self) -> list[str]:
        return [e.text for e in self.examples]

    @property
    def corrupter(self) -> Callable[[Example, random.Random], Example] | None:
        """The rule `corrupted` applies to each example (``None``: none)."""
        return self._corrupter

    @property
    def n_segments(self) -> int:
        return len(self.examples[0].segments)

    @property
    def correct(self) -> Tensor:
        """``[batch]`` index of the correct candidate."""
        return torch.tensor([e.correct for e in self.examples], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, index: int | slice) -> Task:
        """A sub-task (an int gives a one-prompt task)."""
        chosen = self.examples[index] if isinstance(index, slice) else [self.examples[index]]
        return Task(self.name, chosen, tokenizer=self.tokenizer, corrupter=self._corrupter)

    def __repr__(self) -> str:
        return f"Task({self.name!r}, {len(self)} prompts, {self.n_segments} segments)"

    def corrupted(self, seed: int = 0) -> Task:
        """The same prompts with a different correct answer and the same token length
        (e.g. the option texts rotated by one), for activation patching."""
        if self._corrupter is None:
            raise GnaValueError(
                f"task {self.name!r} has no corruption rule: pass Task(..., corrupter=f), f(example, rng) -> an example of "
                "the same token length with another answer (mcq_example prompts get gna_interp.tasks.rotate_options)"
            )
        rng = random.Random(seed)
        examples = [self._corrupter(e, rng) for e in self.examples]
        return Task(f"{self.name}:corrupted", examples, tokenizer=self.tokenizer, corrupter=self._corrupter)

    def resolve_tokenizer(self, tokenizer: Any = None) -> Any:
        chosen = tokenizer if tokenizer is not None else self.tokenizer
        if chosen is None:
            raise GnaValueError(f"task {self.name!r} has no tokenizer of its own: pass the model's tokenizer (or the model)")
        return chosen

    def encode(self, tokenizer: Any = None) -> EncodedTask:
        """Tokenize with left padding and map every annotation to a batch column.

        Args:
            tokenizer: a fast HF tokenizer; default: the task's own.
        """
        tokenizer = self.resolve_tokenizer(tokenizer)
        key = id(tokenizer)
        if key not in self._encoded:
            self._encoded[key] = _encode(self, tokenizer)
        return self._encoded[key]

    def tokenizer_for(self, model_tokenizer: Any) -> Any:
        """The tokenizer a model runs this task with: the task's own when it has one
        (the toy task's ids are its vocabulary), else the model's."""
        return self.tokenizer if self.tokenizer is not None else model_tokenizer

    def gna_batch(self, tokenizer: Any) -> Batch:
        """The protocol `make_batch` uses, so a task is valid ``inputs`` everywhere."""
        return self.encode(self.tokenizer_for(tokenizer)).batch


def _encode(task: Task, tokenizer: Any) -> EncodedTask:
    if not getattr(tokenizer, "is_fast", False):
        raise GnaValueError(f"tasks need a fast tokenizer (character offsets); got {type(tokenizer).__name__}")
    rows = [_encode_example(e, f"task {task.name!r}, example {i}", tokenizer) for i, e in enumerate(task.examples)]
    warn_unknown([word for r in rows for word in r["unknown"]], tokenizer, f"task {task.name!r}")
    batch = make_batch([r["ids"] for r in rows], tokenizer)
    width = batch.n_pos
    shift = torch.tensor([width - len(r["ids"]) for r in rows])
    ends = torch.tensor([r["ends"] for r in rows]) + shift[:, None]
    labels = torch.tensor([r["labels"] for r in rows]) + shift[:, None]
    spans = torch.tensor([r["spans"] for r in rows]) + shift[:, None, None]
    query = None
    if all(r["query"] is not None for r in rows):
        query = torch.tensor([r["query"] for r in rows]) + shift[:, None]
    return EncodedTask(
        batch=batch,
        final=torch.full((batch.n_rows,), width - 1, dtype=torch.long),
        segment_ends=ends,
        labels=labels,
        spans=spans,
        correct=task.correct,
        candidates=[r["candidates"] for r in rows],
        query=query,
    )


def _encode_example(example: Example, where: str, tokenizer: Any) -> dict[str, Any]:
    encoding = tokenize_naming_missing_words(tokenizer, example.text, where, return_offsets_mapping=True)
    ids = list(encoding["input_ids"])

    def token_at(char: int, what: str) -> int:
        position = encoding.char_to_token(char)
        if position is None:
            problem = round_trip_problem(tokenizer, example.text)
            why = f"; the {type(tokenizer).__name__} does not give the text back ({problem}): {TOKENIZER_FIX}" if problem else ""
            raise GnaValueError(f"{where}: the {what} (character {char}, {example.text[char]!r}) falls in no token{why}")
        return int(position)

    ends = [token_at(s.end, "segment end") for s in example.segments]
    labels = [token_at(s.label, "label") for s in example.segments]
    spans = [[token_at(s.start, "segment start"), e + 1] for s, e in zip(example.segments, ends, strict=True)]
    query = None
    if example.query is not None:
        query = [token_at(example.query[0], "query"), token_at(example.query[1] - 1, "query") + 1]
    candidates = _candidate_tokens(example, ids, tokenizer, where)
    unknown = unknown_words(tokenizer, example.text, ids, encoding["offset_mapping"])
    unk = unk_id(tokenizer)
    unknown += [c.strip() for c, tokens in zip(example.candidates, candidates, strict=True) if unk is not None and unk in tokens]
    return {
        "ids": ids,
        "unknown": unknown,
        "ends": ends,
        "labels": labels,
        "spans": spans,
        "query": query,
        "candidates": candidates,
    }


def _candidate_tokens(example: Example, prompt_ids: list[int], tokenizer: Any, where: str) -> list[list[int]]:
    """Each continuation's tokens as they follow the prompt: tokenize prompt + continuation
    and drop the prompt's tokens (how lm-eval splits context and continuation); where the
    two merge across the boundary, fall back to the continuation tokenized alone."""
    out = []
    for candidate in example.candidates:
        at = f"{where}, candidate {candidate!r}"
        whole = list(tokenize_naming_missing_words(tokenizer, example.text + candidate, at)["input_ids"])
        if whole[: len(prompt_ids)] == prompt_ids and len(whole) > len(prompt_ids):
            out.append(whole[len(prompt_ids) :])
        else:
            out.append(list(tokenize_naming_missing_words(tokenizer, candidate, at, add_special_tokens=False)["input_ids"]))
        if not out[-1]:
            raise GnaValueError(f"{at} tokenizes to no tokens")
    return out
