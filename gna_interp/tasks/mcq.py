"""Multiple-choice prompts in the lm-eval MMLU layout, shared by MMLU and the toy task::

    <header><question>
    A. <option>
    B. <option>
    ...
    Answer:            -> " A" / " B" / ...

One segment per option: from its label letter to the ``\\n`` ending its line.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from typing import Any

from .base import Example, Segment

LETTERS = tuple(string.ascii_uppercase)
ANSWER_PROMPT = "Answer:"


def mcq_example(
    header: str,
    options: Sequence[str],
    correct: int,
    *,
    query: tuple[int, int] | None = None,
    meta: dict[str, Any] | None = None,
) -> Example:
    """Build one multiple-choice prompt and its annotations.

    Args:
        header: everything before the first option, ending in ``\\n``.
        options: the option texts, labelled ``A``, ``B``, ... in order.
        correct: index of the correct option.
        query: ``[start, end)`` characters of the query inside ``header``, if any.
        meta: kept on the example (subject, ids, ...).
    """
    if not 0 <= correct < len(options):
        raise ValueError(f"correct option {correct} out of range for {len(options)} options")
    if len(options) > len(LETTERS):
        raise ValueError(f"{len(options)} options: at most {len(LETTERS)} labels exist")
    pieces = [header]
    segments = []
    cursor = len(header)
    for letter, option in zip(LETTERS, options, strict=False):
        line = f"{letter}. {option}"
        segments.append(Segment(start=cursor, end=cursor + len(line), label=cursor))
        pieces.append(line + "\n")
        cursor += len(line) + 1
    text = "".join(pieces) + ANSWER_PROMPT
    info = {"header": header, "options": list(options), **(meta or {})}
    candidates = tuple(f" {letter}" for letter in LETTERS[: len(options)])
    return Example(text=text, segments=tuple(segments), correct=correct, candidates=candidates, query=query, meta=info)


def rotate_options(example: Example, rng: random.Random | None = None) -> Example:
    """The same prompt with the option texts rotated by one place: the correct answer
    moves to the next label and, since each line tokenizes on its own, the token
    length stays the same."""
    options = example.meta["options"]
    n = len(options)
    rotated = [options[(i - 1) % n] for i in range(n)]
    meta = {k: v for k, v in example.meta.items() if k not in ("header", "options")}
    return mcq_example(example.meta["header"], rotated, (example.correct + 1) % n, query=example.query, meta=meta)
