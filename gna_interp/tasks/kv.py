"""Key-value retrieval in the paper's dictionary format::

    Memorize the following dictionary:
    apple:42
    river:7
    ...
    The value of the key 'river' is        -> " 7"

One segment per dictionary line (key to ``\\n``); the candidates are the dictionary's
values, scored by their summed log-probability after the prompt.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ..core.errors import GnaValueError
from .base import Example, Segment, Task
from .toy import CONTENT_WORDS

KV_HEADER = "Memorize the following dictionary:\n"
KV_QUESTION = "The value of the key '{key}' is"
N_VALUES = 100


def kv_example(
    keys: Sequence[str],
    values: Sequence[int | str],
    queried: int,
    *,
    header: str = KV_HEADER,
    separator: str = ":",
    question: str = KV_QUESTION,
) -> Example:
    """One dictionary prompt, in the paper's wording or your own::

        <header><key><separator><value>
        ...
        <question, with {key} replaced by the queried key>      -> " <its value>"

    Args:
        keys: the dictionary's keys, one line each (distinct, no newline).
        values: their values (distinct: they are the candidates, ``" <value>"``).
        queried: index of the line whose key is asked for (= the correct candidate).
        header: text before the first line: empty, or ending in ``\\n``.
        separator: between a key and its value (``":"``, ``" = "``, ...).
        question: the final line; ``{key}`` marks where the queried key goes (the
            query span).

    Returns:
        an `Example` with one segment per line (key to ``\\n``) whose corruption rule
        rotates the values by one line (same keys and question, another answer).
    """
    keys, values = [str(k) for k in keys], list(values)
    if len(keys) != len(values) or len(keys) < 1:
        raise GnaValueError(f"keys and values: expected one value per key, got {len(keys)} keys and {len(values)} values")
    for name, items in (("keys", keys), ("values", [str(v) for v in values])):
        if len(set(items)) != len(items):
            repeated = sorted({x for x in items if items.count(x) > 1})
            raise GnaValueError(f"{name} repeat {repeated}: expected distinct {name} (each line must be told apart)")
        if any(not x or "\n" in x for x in items):
            raise GnaValueError(f"{name}={items!r}: expected non-empty {name} without newlines")
    if isinstance(queried, bool) or not isinstance(queried, int) or not 0 <= queried < len(keys):
        raise GnaValueError(f"queried={queried!r}: expected the index of a key, 0..{len(keys) - 1}")
    if not isinstance(header, str) or (header and not header.endswith("\n")):
        raise GnaValueError(f"header={header!r}: expected a string, empty or ending in a newline")
    if not isinstance(separator, str) or "\n" in separator:
        raise GnaValueError(f"separator={separator!r}: expected a string without newlines")
    if not isinstance(question, str) or question.count("{key}") != 1 or "\n" in question:
        raise GnaValueError(f"question={question!r}: expected one line holding '{{key}}' once, where the queried key goes")
    pieces = [header]
    cursor = len(header)
    segments = []
    for key, value in zip(keys, values, strict=True):
        line = f"{key}{separator}{value}"
        segments.append(Segment(start=cursor, end=cursor + len(line), label=cursor))
        pieces.append(line + "\n")
        cursor += len(line) + 1
    before, after = question.split("{key}")
    start = cursor + len(before)
    text = "".join(pieces) + before + keys[queried] + after
    meta = {"keys": keys, "values": values, "header": header, "separator": separator, "question": question}
    candidates = tuple(f" {v}" for v in values)
    query = (start, start + len(keys[queried]))
    return Example(text, tuple(segments), queried, candidates, query=query, meta=meta, corrupter=rotate_values)


def rotate_values(example: Example, rng: random.Random | None = None) -> Example:
    """Same keys and query, values rotated by one line: another answer, same tokens in
    total (the default corruption rule of `kv_example` prompts; ``rng`` is unused)."""
    if "keys" not in example.meta or "values" not in example.meta:
        raise GnaValueError(
            f"rotate_values needs an example built by kv_example (its meta holds keys and values); got meta keys {sorted(example.meta)}"
        )
    values = example.meta["values"]
    rotated = [values[(i - 1) % len(values)] for i in range(len(values))]
    wording = {name: example.meta[name] for name in ("header", "separator", "question") if name in example.meta}
    return kv_example(example.meta["keys"], rotated, example.correct, **wording)


def kv_retrieval(n_pairs: int = 10, n: int = 100, seed: int = 0, keys: Sequence[str] | None = None) -> Task:
    """``n`` dictionary prompts of ``n_pairs`` lines each.

    Args:
        n_pairs: dictionary size (the paper uses 10 to 50).
        n: number of prompts.
        seed: for keys, values and the queried key.
        keys: the key vocabulary (default: the toy task's 64 words).
    """
    vocabulary = list(keys) if keys is not None else list(CONTENT_WORDS)
    if len(set(vocabulary)) != len(vocabulary):
        raise GnaValueError("keys has duplicates: dictionary keys must be distinct")
    if not 2 <= n_pairs <= min(len(vocabulary), N_VALUES):
        raise GnaValueError(f"n_pairs={n_pairs}: expected 2..{min(len(vocabulary), N_VALUES)} (distinct keys and values 0..99)")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GnaValueError(f"n={n!r}: expected a positive number of prompts")
    rng = random.Random(seed)
    examples = [kv_example(rng.sample(vocabulary, n_pairs), rng.sample(range(N_VALUES), n_pairs), rng.randrange(n_pairs)) for _ in range(n)]
    return Task(f"kv_retrieval_{n_pairs}", examples, corrupter=rotate_values)


PROBE_PAIRS = (20, 30, 40, 50)
"""Dictionary sizes of the KV-retrieval probe: the 20 to 50 pairs of Bick, Xing and Gu
(2026)'s ranking probe (`kv_probe`)."""


def kv_probe(n: int = 100, seed: int = 0, pairs: Sequence[int] = PROBE_PAIRS, keys: Sequence[str] | None = None) -> list[Task]:
    """The KV-retrieval probe of the retrieval-aware head ranking: `kv_retrieval` prompts
    in the paper's format, ``n`` in all, spread evenly over the dictionary sizes ``pairs``
    (one `Task` per size: a task's prompts share their number of lines).

    Args:
        n: prompts in all (at least one per size; the first sizes take the remainder).
        seed: task ``i`` uses seed ``seed * 1000 + i``.
        pairs: dictionary sizes (default 20, 30, 40, 50 lines; values 0 to 99).
        keys: the key vocabulary (default: the toy task's 64 words, common English words).
    """
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence) or not pairs:
        raise GnaValueError(f"pairs={pairs!r}: expected a non-empty list of dictionary sizes, e.g. {PROBE_PAIRS}")
    if isinstance(n, bool) or not isinstance(n, int) or n < len(pairs):
        raise GnaValueError(f"n={n!r}: expected an int, at least one prompt per dictionary size ({len(pairs)} sizes)")
    share, extra = divmod(n, len(pairs))
    return [kv_retrieval(size, n=share + (i < extra), seed=seed * 1000 + i, keys=keys) for i, size in enumerate(pairs)]
