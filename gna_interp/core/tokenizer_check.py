"""Is this the model's tokenizer? Probes run at load (`gna_interp.load`) and when a task's
text cannot be placed on tokens: a tokenizer that does not give back text made of its own
vocabulary (a word-level vocabulary read by a byte-level BPE class turns "w5 w6 w7" into 1
token), or whose ids the model cannot embed, would tokenize every prompt wrongly without
an error."""

from __future__ import annotations

from typing import Any

TOKENIZER_FIX = "pass the tokenizer the model was trained with: gna.load(model, tokenizer=<a tokenizer object, or its folder or hub id>)"
"""How to pass the right tokenizer: the one wording every tokenizer error ends with."""

PROBE_WORDS = 8
_SCAN = 512  # vocabulary ids looked at, evenly spread, to find the probe's words


def probe_text(tokenizer: Any, n_words: int = PROBE_WORDS) -> str | None:
    """``n_words`` words of the tokenizer's own vocabulary joined by spaces: tokens that
    decode alone to ASCII letters and digits (2 characters or more), from ids spread over the
    vocabulary; ``None`` when it has fewer than 2 such tokens (or is no HF tokenizer)."""
    try:
        size = len(tokenizer)
        special = set(tokenizer.all_special_ids)
        step = max(1, size // _SCAN)
        words: list[str] = []
        for token_id in range(0, size, step):
            if token_id in special:
                continue
            word = tokenizer.decode([token_id]).strip()
            if len(word) >= 2 and word.isascii() and word.isalnum() and word not in words:  # no text a normaliser rewrites
                words.append(word)
                if len(words) == n_words:
                    break
    except (AttributeError, TypeError, NotImplementedError):  # not a HF tokenizer: nothing to probe with
        return None
    return " ".join(words) if len(words) >= 2 else None


def round_trip_problem(tokenizer: Any, text: str) -> str | None:
    """What goes wrong tokenizing ``text``, or ``None``: the ids must decode back to the
    text (spaces aside), and several words must not become one id. The message reads
    ``'w5 w6 w7' -> 1 token(s) [3] -> '<unk>'``."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    back = tokenizer.decode(ids, skip_special_tokens=True)
    words = text.split()
    if back.split() == words and not (len(words) > 2 and len(ids) == 1):
        return None
    shown = ids if len(ids) <= 12 else [*ids[:12], "..."]
    return f"{text!r} -> {len(ids)} token(s) {shown} -> {back!r}"


def tokenizer_problem(tokenizer: Any, embedding_rows: int | None = None) -> str | None:
    """Why ``tokenizer`` cannot be the model's, or ``None``: it does not give back text of
    its own vocabulary (`probe_text`, `round_trip_problem`), or it has ids the model's
    ``embedding_rows`` cannot embed (its base vocabulary or special tokens; ids a vocabulary
    smaller than the embedding never uses are fine)."""
    text = probe_text(tokenizer)
    if text is not None:
        problem = round_trip_problem(tokenizer, text)
        if problem is not None:
            return f"it does not give back text made of its own vocabulary: {problem}"
    if embedding_rows is not None:
        base = int(getattr(tokenizer, "vocab_size", 0) or 0)
        specials = [int(i) for i in getattr(tokenizer, "all_special_ids", ()) if i is not None]
        top = max([base - 1, *specials])
        if top >= embedding_rows:
            return (
                f"its ids reach {top} (vocabulary of {base}, special ids {sorted(specials)}) but the model embeds "
                f"{embedding_rows} ids (0..{embedding_rows - 1})"
            )
    return None


def tokenizer_error(tokenizer: Any, problem: str, origin: str = "") -> ValueError:
    """The error for a tokenizer `tokenizer_problem` refused: its class, where it came from,
    what went wrong and `TOKENIZER_FIX`."""
    where = f" {origin}" if origin else ""
    return ValueError(f"tokenizer refused: the {type(tokenizer).__name__}{where} cannot be this model's: {problem}; {TOKENIZER_FIX}")
