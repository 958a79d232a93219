"""The synthetic retrieval task of the toy zoo, and its word-level tokenizer.

``toy_mcq`` prompts have MMLU's segment structure with the question first::

    Query: river
    A. apple stone
    B. river cloud
    C. bread lamp
    D. tiger music
    Answer:                -> " B"  (the option that contains the query word)

Every word, letter, ``.``, ``:`` and ``\\n`` is one token, so every prompt of a task has
the same length. The tokenizer also covers `kv_retrieval` prompts over its words.
"""

from __future__ import annotations

import functools
import random
import tempfile
from typing import Any

import torch
from torch import Tensor

from .base import Task
from .mcq import LETTERS, mcq_example, rotate_options

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
STRUCTURE = ("\n", ".", ":", "'", "Query", "Answer")
KV_WORDS = ("Memorize", "the", "following", "dictionary", "The", "value", "of", "key", "is")
NUMBERS = tuple(str(i) for i in range(100))
CONTENT_WORDS = (
    "apple", "river", "stone", "cloud", "bread", "lamp", "tiger", "music", "chair", "ocean",
    "pencil", "garden", "mirror", "candle", "forest", "window", "rocket", "button", "castle", "dragon",
    "engine", "feather", "glove", "hammer", "island", "jacket", "kettle", "ladder", "magnet", "needle",
    "orange", "parrot", "quartz", "rabbit", "saddle", "tunnel", "umbrella", "violin", "wagon", "yogurt",
    "zebra", "anchor", "basket", "cactus", "donkey", "falcon", "guitar", "helmet", "igloo", "jungle",
    "koala", "lemon", "marble", "nickel", "onion", "pepper", "quilt", "radar", "salmon", "tomato",
    "velvet", "walnut", "yacht", "zipper",
)  # fmt: skip
MAX_OPTIONS = 8
VOCAB: tuple[str, ...] = (*SPECIALS, *STRUCTURE, *LETTERS[:MAX_OPTIONS], *KV_WORDS, *NUMBERS, *CONTENT_WORDS)
VOCAB_SIZE = 192  # len(VOCAB) rounded up


@functools.lru_cache(maxsize=1)
def toy_tokenizer() -> Any:
    """The zoo's word-level tokenizer (fast, saved to a folder as TransformerLens needs).

    Words are split on spaces; ``\\n``, ``.``, ``:`` and ``'`` are tokens of their own;
    ``<bos>`` is prepended.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(VOCAB)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"[\n.:']"), behavior="isolated"), pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed")]
    )
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    folder = tempfile.mkdtemp(prefix="gna_toy_tokenizer_")
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def _check_shape(n: int, n_options: int, words_per_option: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: expected a positive number of prompts")
    if not 2 <= n_options <= MAX_OPTIONS:
        raise ValueError(f"n_options={n_options}: expected 2..{MAX_OPTIONS}")
    if words_per_option < 1 or n_options * words_per_option > len(CONTENT_WORDS):
        raise ValueError(f"words_per_option={words_per_option}: expected 1..{len(CONTENT_WORDS) // n_options} for {n_options} options")


def toy_mcq(n: int = 200, seed: int = 0, n_options: int = 4, words_per_option: int = 2) -> Task:
    """``n`` fresh toy multiple-choice prompts (see the module docstring).

    The query word sits at a random place in the correct option; all words of a prompt
    are distinct. ``task.corrupted()`` rotates the options (same query, another answer).
    """
    _check_shape(n, n_options, words_per_option)
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        words = rng.sample(CONTENT_WORDS, n_options * words_per_option)
        options = [" ".join(words[i * words_per_option : (i + 1) * words_per_option]) for i in range(n_options)]
        correct = rng.randrange(n_options)
        query_word = words[correct * words_per_option + rng.randrange(words_per_option)]
        header = f"Query: {query_word}\n"
        start = header.index(query_word)
        examples.append(mcq_example(header, options, correct, query=(start, start + len(query_word))))
    return Task("toy_mcq", examples, tokenizer=toy_tokenizer(), corrupter=rotate_options)


def toy_token_batch(n: int, generator: torch.Generator, n_options: int = 4, words_per_option: int = 2) -> tuple[Tensor, Tensor]:
    """Token ids of ``n`` toy prompts built directly as tensors (for training speed).

    Equal to tokenizing `toy_mcq`-style text with `toy_tokenizer` (a test checks this).

    Returns:
        ``input_ids [n, pos]`` and ``answer_ids [n]`` (the correct letter's token).
    """
    _check_shape(n, n_options, words_per_option)
    vocab = {token: i for i, token in enumerate(VOCAB)}
    content = torch.tensor([vocab[w] for w in CONTENT_WORDS])
    n_words = n_options * words_per_option
    words = content[torch.rand(n, len(CONTENT_WORDS), generator=generator).argsort(1)[:, :n_words]]  # distinct per row
    correct = torch.randint(n_options, (n,), generator=generator)
    pick = torch.randint(words_per_option, (n,), generator=generator)
    query = words[torch.arange(n), correct * words_per_option + pick]
    col = functools.partial(torch.full, (n, 1), dtype=torch.long)
    parts = [col(vocab["<bos>"]), col(vocab["Query"]), col(vocab[":"]), query[:, None], col(vocab["\n"])]
    for i in range(n_options):
        parts += [col(vocab[LETTERS[i]]), col(vocab["."]), words[:, i * words_per_option : (i + 1) * words_per_option], col(vocab["\n"])]
    parts += [col(vocab["Answer"]), col(vocab[":"])]
    letters = torch.tensor([vocab[letter] for letter in LETTERS[:n_options]])
    return torch.cat(parts, 1), letters[correct]
