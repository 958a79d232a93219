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

from .base import Example, Segment, Task
from .toy import CONTENT_WORDS

KV_HEADER = "Memorize the following dictionary:\n"
N_VALUES = 100


def kv_example(keys: Sequence[str], values: Sequence[int], queried: int) -> Example:
    """One prompt; ``queried`` indexes the line whose key is asked for."""
    pieces = [KV_HEADER]
    cursor = len(KV_HEADER)
    segments = []
    for key, value in zip(keys, values, strict=True):
        line = f"{key}:{value}"
        segments.append(Segment(start=cursor, end=cursor + len(line), label=cursor))
        pieces.append(line + "\n")
        cursor += len(line) + 1
    question = f"The value of the key '{keys[queried]}' is"
    start = cursor + question.index("'") + 1
    text = "".join(pieces) + question
    meta = {"keys": list(keys), "values": list(values)}
    candidates = tuple(f" {v}" for v in values)
    return Example(text, tuple(segments), queried, candidates, query=(start, start + len(keys[queried])), meta=meta)


def _rotate_values(example: Example, rng: random.Random | None = None) -> Example:
    """Same keys and query, values rotated by one line: another answer, same tokens in total."""
    values = example.meta["values"]
    rotated = [values[(i - 1) % len(values)] for i in range(len(values))]
    return kv_example(example.meta["keys"], rotated, example.correct)


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
        raise ValueError("keys has duplicates: dictionary keys must be distinct")
    if not 2 <= n_pairs <= min(len(vocabulary), N_VALUES):
        raise ValueError(f"n_pairs={n_pairs}: expected 2..{min(len(vocabulary), N_VALUES)} (distinct keys and values 0..99)")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: expected a positive number of prompts")
    rng = random.Random(seed)
    examples = [kv_example(rng.sample(vocabulary, n_pairs), rng.sample(range(N_VALUES), n_pairs), rng.randrange(n_pairs)) for _ in range(n)]
    return Task(f"kv_retrieval_{n_pairs}", examples, corrupter=_rotate_values)
