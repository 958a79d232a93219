"""Multiple-choice prompts in the lm-eval MMLU layout, shared by MMLU and the toy task::

    <header><question>
    A. <option>
    B. <option>
    ...
    <footer>
    Answer:            -> " A" / " B" / ...

One segment per option: from its label letter to the ``\\n`` ending its line. The
footer is empty in MMLU; the toy task's query-last layout puts its query there.

The toy task also has a *label-last* layout, ``<option> A`` per line: the label ends
the segment (it is the segment-end token) and the line's ``\\n`` lies outside it. The
option's words then cannot know their label, so a model can only answer through a
summary of the segment written into its label: the Gather-and-Aggregate route.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from typing import Any

from ..core.errors import GnaValueError
from .base import Example, Segment, Task, check_example, not_a_task

LETTERS = tuple(string.ascii_uppercase)
ANSWER_PROMPT = "Answer:"
LAYOUTS = ("label_first", "label_last")
"""``label_first``: MMLU's ``A. <option>``; ``label_last``: ``<option> A``."""
MCQ_KEYS = frozenset({"header", "options", "layout", "labels", "footer"})
"""The ``meta`` keys `mcq_example` writes, from which the prompt can be built again."""


def mcq_example(
    header: str,
    options: Sequence[str],
    correct: int,
    *,
    query: tuple[int, int] | None = None,
    meta: dict[str, Any] | None = None,
    layout: str = "label_first",
    labels: Sequence[str] | None = None,
    footer: str = "",
) -> Example:
    """Build one multiple-choice prompt and its annotations.

    Args:
        header: everything before the first option: empty, or ending in ``\\n``.
        options: the option texts, labelled ``A``, ``B``, ... in order.
        correct: index of the correct option.
        query: ``[start, end)`` characters of the query in the prompt's text, if any
            (inside the prompt: ``0 <= start < end <= len(text)``).
        meta: kept on the example (subject, ids, ...); the keys this function sets
            (`MCQ_KEYS`) are refused.
        layout: one of `LAYOUTS`.
        labels: the options' labels in prompt order (default ``A``, ``B``, ...); the
            candidates follow that order, so ``correct`` indexes both.
        footer: text between the last option's line and ``Answer:`` (empty, or ending
            in ``\\n``).

    Returns:
        an `Example` whose corruption rule is `rotate_options` (so a `Task` of these
        prompts has ``task.corrupted()`` without further ado).
    """
    if isinstance(options, str) or not isinstance(options, Sequence) or not options:
        raise GnaValueError(f"options={options!r}: expected a non-empty list of option texts")
    if isinstance(correct, bool) or not isinstance(correct, int) or not 0 <= correct < len(options):
        raise GnaValueError(f"correct={correct!r}: correct option out of range for {len(options)} options: expected 0..{len(options) - 1}")
    if layout not in LAYOUTS:
        raise GnaValueError(f"layout={layout!r}: expected one of {LAYOUTS}")
    if len(options) > len(LETTERS):
        raise GnaValueError(f"{len(options)} options: at most {len(LETTERS)} labels exist")
    labels = list(LETTERS[: len(options)] if labels is None else labels)
    if len(labels) != len(options) or len(set(labels)) != len(labels):
        raise GnaValueError(f"labels={labels!r}: expected {len(options)} distinct labels, one per option")
    for name, part in (("header", header), ("footer", footer)):
        if not isinstance(part, str) or (part and not part.endswith("\n")):
            raise GnaValueError(f"{name}={part!r}: expected a string, empty or ending in a newline")
    reserved = sorted(MCQ_KEYS & set(meta or {}))
    if reserved:
        raise GnaValueError(f"meta keys {reserved} are set by mcq_example itself: rename them")
    pieces = [header]
    segments = []
    cursor = len(header)
    for letter, option in zip(labels, options, strict=True):
        if layout == "label_first":
            line = f"{letter}. {option}"
            segments.append(Segment(start=cursor, end=cursor + len(line), label=cursor))
        else:  # the label is the segment's last token; the "\n" lies outside
            line = f"{option} {letter}"
            segments.append(Segment(start=cursor, end=cursor + len(line) - 1, label=cursor + len(option) + 1))
        pieces.append(line + "\n")
        cursor += len(line) + 1
    text = "".join(pieces) + footer + ANSWER_PROMPT
    info = {"header": header, "options": list(options), "layout": layout, "labels": labels, "footer": footer, **(meta or {})}
    candidates = tuple(f" {letter}" for letter in labels)
    example = Example(text, tuple(segments), correct, candidates, query=query, meta=info, corrupter=rotate_options)
    check_example(example, "mcq_example")
    return example


def rotate_options(example: Example, rng: random.Random | None = None) -> Example:
    """The same prompt with the option texts rotated by one place (the labels stay): the
    correct answer moves to the next label and, since each line tokenizes on its own,
    the token length stays the same (and so does the character length: a query in the
    footer keeps its span).

    The default corruption rule of `mcq_example` prompts (``task.corrupted()``); ``rng``
    is unused (the rotation is deterministic).

    Raises:
        ValueError: for an example not built by `mcq_example` (no options in its ``meta``).
    """
    if "options" not in example.meta or "header" not in example.meta:
        raise GnaValueError(
            f"rotate_options needs an example built by mcq_example (its meta holds the options); got one with meta keys "
            f"{sorted(example.meta)}: give the task a corrupter of its own"
        )
    options = example.meta["options"]
    n = len(options)
    return _rebuild(example, options=[options[(i - 1) % n] for i in range(n)], correct=(example.correct + 1) % n)


def _rebuild(
    example: Example, *, options: Sequence[str] | None = None, correct: int | None = None, labels: Sequence[str] | None = None
) -> Example:
    """``example`` built again by `mcq_example` from its ``meta``, with other ``options``,
    ``correct`` index or ``labels`` where given."""
    meta = {k: v for k, v in example.meta.items() if k not in MCQ_KEYS}
    return mcq_example(
        example.meta["header"],
        example.meta["options"] if options is None else options,
        example.correct if correct is None else correct,
        query=example.query,
        meta=meta,
        layout=example.meta.get("layout", "label_first"),
        labels=example.meta.get("labels") if labels is None else labels,
        footer=example.meta.get("footer", ""),
    )


def shuffle_labels(task: Task, seed: int = 0) -> Task:
    """The same multiple-choice prompts with each prompt's labels in a random order
    (``C. <option>``, ``A. <option>``, ...; the candidates follow the labels, the correct
    option stays in its place). The task keeps its corruption rule.

    A model that reads an option's label keeps its accuracy; one that answers by the
    option's place (counting lines) falls to chance: its "Gather" heads then count
    options rather than summarise them. `discover` measures this in its baseline.

    Raises:
        ValueError: for a task whose prompts are not exactly what `mcq_example` builds
            from their ``meta`` (other tasks, or examples edited afterwards, e.g. with
            other candidates).
    """
    if not isinstance(task, Task):
        raise not_a_task(task, "shuffle_labels")
    if not is_multiple_choice(task):
        raise GnaValueError(
            f"task {task.name!r} is not plain multiple choice (prompts as mcq_example builds them): its labels cannot be shuffled"
        )
    rng = random.Random(seed)
    examples = []
    for example in task.examples:
        labels = list(example.meta.get("labels") or LETTERS[: len(example.meta["options"])])
        rng.shuffle(labels)
        examples.append(_rebuild(example, labels=labels))
    return Task(f"{task.name}:shuffled_labels", examples, tokenizer=task.tokenizer, corrupter=task.corrupter)


def is_multiple_choice(task: Task) -> bool:
    """Whether every prompt of ``task`` is exactly what `mcq_example` builds from its
    ``meta`` (same text, segments and candidates): its labels can then be shuffled."""
    for example in task.examples:
        if "options" not in example.meta or "header" not in example.meta:
            return False
        try:
            rebuilt = _rebuild(example)
        except (ValueError, TypeError):
            return False
        if (rebuilt.text, rebuilt.segments, rebuilt.candidates) != (example.text, example.segments, example.candidates):
            return False
    return True
