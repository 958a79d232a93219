"""Turning user inputs (strings, token ids) into a left-padded `Batch`."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .errors import GnaTypeError, GnaValueError


@dataclass
class Batch:
    """A left-padded batch."""

    input_ids: Tensor
    """``[batch, pos]`` long."""
    attention_mask: Tensor
    """``[batch, pos]`` long, 0 on padding."""

    @property
    def n_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_pos(self) -> int:
        return int(self.input_ids.shape[1])

    def repeat(self, copies: int) -> Batch:
        return Batch(self.input_ids.repeat(copies, 1), self.attention_mask.repeat(copies, 1))

    def rows(self, index: slice) -> Batch:
        """The rows ``index`` of this batch (the same positions)."""
        return Batch(self.input_ids[index], self.attention_mask[index])

    def to(self, device: torch.device | str | None) -> Batch:
        if device is None:
            return self
        return Batch(self.input_ids.to(device), self.attention_mask.to(device))


def _is_batch_mapping(inputs: Any) -> bool:
    return isinstance(inputs, Mapping) and "input_ids" in inputs


def make_batch(inputs: Any, tokenizer: Any) -> Batch:
    """Tokenize ``inputs`` with left padding.

    Args:
        inputs: a string, a list of strings, a ``[pos]`` or ``[batch, pos]`` tensor of
            token ids (taken as unpadded), a list of token-id lists (left-padded here),
            a mapping with ``input_ids`` (and optionally ``attention_mask``), a `Batch`,
            or a `gna_interp.tasks.Task` (its annotated, left-padded batch).
        tokenizer: a HF tokenizer (needed for strings and ragged id lists).
    """
    if isinstance(inputs, Batch):
        batch = inputs
    elif hasattr(inputs, "gna_batch"):  # a gna_interp Task
        batch = inputs.gna_batch(tokenizer)
    elif _is_batch_mapping(inputs):
        ids = torch.as_tensor(inputs["input_ids"])
        ids = ids[None] if ids.dim() == 1 else ids
        mask = inputs.get("attention_mask")
        batch = Batch(ids.long(), torch.ones_like(ids) if mask is None else torch.as_tensor(mask).long())
    elif isinstance(inputs, Tensor):
        ids = inputs[None] if inputs.dim() == 1 else inputs
        if ids.dim() != 2 or ids.dtype.is_floating_point:
            raise GnaValueError(f"token ids must be an integer tensor [pos] or [batch, pos], got {tuple(inputs.shape)} {inputs.dtype}")
        batch = Batch(ids.long(), torch.ones_like(ids, dtype=torch.long))
    elif isinstance(inputs, str):
        batch = _tokenize([inputs], tokenizer)
    elif isinstance(inputs, Sequence) and len(inputs) > 0 and all(isinstance(x, str) for x in inputs):
        batch = _tokenize(list(inputs), tokenizer)
    elif isinstance(inputs, Sequence) and len(inputs) > 0 and all(isinstance(x, Sequence) for x in inputs):
        batch = _pad_id_lists([list(map(int, x)) for x in inputs], tokenizer)
    elif isinstance(inputs, Sequence) and len(inputs) == 0:
        raise GnaValueError("inputs is empty: expected a string, a non-empty list of strings, or token ids")
    else:
        raise GnaTypeError(
            f"inputs of type {type(inputs).__name__} not understood: expected a string, a list of strings, "
            "a tensor of token ids, a list of token-id lists, or a mapping with 'input_ids'"
        )
    if batch.n_rows == 0 or batch.n_pos == 0:
        raise GnaValueError(f"inputs is empty: got a batch of shape {tuple(batch.input_ids.shape)}")
    return batch


def check_token_ids(batch: Batch, vocab_size: int, model_name: str) -> None:
    """A clear error for the first token id outside ``0..vocab_size - 1`` (in row-major
    order), naming it, its row and position, and the valid range."""
    ids = batch.input_ids
    bad = (ids < 0) | (ids >= vocab_size)
    if not bool(bad.any()):
        return
    row, position = (int(i) for i in bad.nonzero()[0])
    count = int(bad.sum())
    more = f" ({count - 1} more out of range)" if count > 1 else ""
    raise GnaValueError(
        f"token id {int(ids[row, position])} out of range at row {row}, position {position}{more}: "
        f"{model_name} has a vocabulary of {vocab_size}, so ids must lie in 0..{vocab_size - 1}"
    )


def check_context(batch: Batch, limit: int | None, model_name: str) -> None:
    """A clear error for a row of ``batch`` with more real tokens than ``limit``, the model's
    context (its config's ``max_position_embeddings``; ``None``: no limit): names the longest
    row, its token count and the context. The one rule of `GnaModel.run` and `evaluate`."""
    if limit is None:
        return
    lengths = batch.attention_mask.sum(1)  # [batch]: real tokens per row
    longest = int(lengths.argmax())
    if int(lengths[longest]) > limit:
        raise GnaValueError(f"prompt {longest} has {int(lengths[longest])} tokens, more than {model_name}'s context of {limit}")


def _pad_id(tokenizer: Any) -> int:
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tokenizer, name, None) if tokenizer is not None else None
        if value is not None:
            return int(value)
    return 0


def _pad_id_lists(rows: list[list[int]], tokenizer: Any) -> Batch:
    if any(len(row) == 0 for row in rows):
        index = next(i for i, row in enumerate(rows) if len(row) == 0)
        raise GnaValueError(f"inputs row {index} is empty: every prompt needs at least one token")
    width = max(len(row) for row in rows)
    pad = _pad_id(tokenizer)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return Batch(ids, mask)


def _tokenize(texts: list[str], tokenizer: Any) -> Batch:
    if tokenizer is None:
        raise GnaValueError("string inputs need a tokenizer: pass tokenizer= to gna_interp.load, or give token ids")
    for i, text in enumerate(texts):
        if not text:
            raise GnaValueError(f"inputs[{i}] is an empty string: every prompt needs at least one token")
    encoded = [tokenize_naming_missing_words(tokenizer, text, f"inputs[{i}]")["input_ids"] for i, text in enumerate(texts)]
    unknown = [word for text, ids in zip(texts, encoded, strict=True) for word in unknown_words(tokenizer, text, ids)]
    warn_unknown(unknown, tokenizer, "the inputs")
    return _pad_id_lists(encoded, tokenizer)


def unk_id(tokenizer: Any) -> int | None:
    """The id the tokenizer gives a word its vocabulary lacks, read from its vocabulary
    model (a fast tokenizer's ``backend_tokenizer``), whatever its ``unk_token`` attribute
    says; ``None`` when it never produces one (byte-level BPE, a vocabulary without its
    unknown token, an unknown token that is also bos / eos)."""
    unk = _vocabulary_unk_id(tokenizer)
    if unk is None or unk in (getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        return None
    return int(unk)


_UNIGRAM_UNK: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
"""A Unigram tokenizer's unknown id, read once from its JSON (the model does not expose it)."""


def _vocabulary_unk_id(tokenizer: Any) -> int | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow tokenizer: only its attribute tells
        return getattr(tokenizer, "unk_token_id", None)
    model = backend.model
    if hasattr(model, "unk_token"):  # WordLevel, WordPiece, BPE
        token = model.unk_token
        return None if token is None else backend.token_to_id(token)
    if type(model).__name__ == "Unigram":
        try:
            return _UNIGRAM_UNK[tokenizer]
        except (KeyError, TypeError):
            pass
        import json

        found = json.loads(backend.to_str()).get("model", {}).get("unk_id")
        with contextlib.suppress(TypeError):
            _UNIGRAM_UNK[tokenizer] = found
        return found
    return getattr(tokenizer, "unk_token_id", None)


def tokenize_naming_missing_words(tokenizer: Any, text: str, where: str, **kwargs: Any) -> Any:
    """``tokenizer(text, **kwargs)``; a vocabulary that lacks a word of ``text`` and has no
    unknown token to stand for it (WordLevel's bare "Missing [UNK] token") raises an error
    naming the first such word and ``where`` it is."""
    try:
        return tokenizer(text, **kwargs)
    except Exception as error:  # the tokenizers library raises a bare Exception
        word = _first_missing_word(tokenizer, text)
        if word is None:
            raise
        raise GnaValueError(
            f"{where}: the word {word!r} is not in the tokenizer's vocabulary, and the vocabulary has no unknown token to "
            f"stand for it ({error}): use words the tokenizer knows, or a tokenizer whose vocabulary holds its unknown token"
        ) from error


def _first_missing_word(tokenizer: Any, text: str) -> str | None:
    """The first piece of ``text`` (after normalising and pre-tokenizing) that the
    vocabulary model cannot tokenize; ``None`` if there is none or it cannot be told."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
        pieces = backend.pre_tokenizer.pre_tokenize_str(normalized) if backend.pre_tokenizer is not None else [(normalized, None)]
    except Exception:  # pragma: no cover - a tokenizer that cannot split its text at all
        return None
    for piece, _ in pieces:
        try:
            backend.model.tokenize(piece)
        except Exception:
            return str(piece)
    return None


def unknown_words(tokenizer: Any, text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]] | None = None) -> list[str]:
    """The pieces of ``text`` that tokenized to the unknown token (``ids`` its tokens;
    ``offsets`` their character spans, computed here when needed)."""
    unk = unk_id(tokenizer)
    if unk is None or unk not in ids:
        return []
    if offsets is None:
        if not getattr(tokenizer, "is_fast", False):
            return ["(unknown: a slow tokenizer gives no offsets)"]
        encoding = tokenizer(text, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    return [text[start:end] for token, (start, end) in zip(ids, offsets, strict=True) if token == unk and end > start]


class UnknownWordsWarning(UserWarning):
    """Words of a task or prompt became the tokenizer's unknown token."""


def warn_unknown(words: Sequence[str], tokenizer: Any, where: str) -> None:
    """One warning naming the words of ``where`` that became the unknown token."""
    if not words:
        return
    import warnings

    distinct = sorted(set(words))
    shown = ", ".join(repr(w) for w in distinct[:12]) + (f" and {len(distinct) - 12} more" if len(distinct) > 12 else "")
    unk = unk_id(tokenizer)  # named by its id: the unk_token attribute may be unset
    token = tokenizer.convert_ids_to_tokens(unk) if unk is not None and hasattr(tokenizer, "convert_ids_to_tokens") else None
    warnings.warn(
        f"{len(distinct)} word(s) in {where} are not in the tokenizer's vocabulary and became {token or tokenizer.unk_token!r}: {shown}. "
        "The model cannot tell them apart, so results on them are meaningless (e.g. accuracy near 0 or chance): "
        "use words the tokenizer knows (for the bundled toy models: gna.tasks.toy.VOCAB)",
        UnknownWordsWarning,
        stacklevel=3,
    )
