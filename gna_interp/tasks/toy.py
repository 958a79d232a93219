"""The synthetic retrieval task of the toy zoo, and its word-level tokenizer.

``toy_mcq`` prompts have MMLU's segment structure with the question first::

    Query: river
    A. apple stone
    B. river cloud
    C. bread lamp
    D. tiger music
    Answer:                -> " B"  (the option that contains the query word)

or, with ``layout="label_last"``, each line ``apple stone A``: the label ends the segment,
so the words cannot carry it and only a summary written into the label can answer.

With ``query_last=True`` the ``Query: river`` line comes after the options, just before
``Answer:``: no option can see the query, so a causal model must summarise each option
before it knows what is asked.

Every word, letter, ``.``, ``:`` and ``\\n`` is one token, so every prompt of a task has
the same length. The tokenizer also covers `kv_retrieval` prompts over its words.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import random
import shutil
import tempfile
from typing import Any

import torch
from torch import Tensor

from ..core.errors import GnaValueError
from .base import Task
from .mcq import ANSWER_PROMPT, LAYOUTS, LETTERS, mcq_example, rotate_options

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
    """The zoo's word-level tokenizer (fast, saved to a folder as TransformerLens needs:
    one per process, in the temporary directory, removed when the process exits).

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
    folder = _folder_for_this_process("gna_toy_tokenizer_")
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def _folder_for_this_process(prefix: str) -> str:
    """A new temporary folder, removed when this process exits (not when a forked child
    that inherited the exit handler does: the parent may still use it)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)
    return folder


def _check_shape(
    n: int,
    n_options: int,
    words_per_option: int,
    layout: str = "label_first",
    vary_lengths: bool = False,
    shuffle_labels: bool = False,
    query_last: bool = False,
) -> None:
    for name, flag in (("vary_lengths", vary_lengths), ("shuffle_labels", shuffle_labels), ("query_last", query_last)):
        if not isinstance(flag, bool):
            raise GnaValueError(f"{name}={flag!r}: expected True or False")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GnaValueError(f"n={n!r}: expected a positive number of prompts")
    if not 2 <= n_options <= MAX_OPTIONS:
        raise GnaValueError(f"n_options={n_options}: expected 2..{MAX_OPTIONS}")
    if words_per_option < 1 or n_options * words_per_option > len(CONTENT_WORDS):
        raise GnaValueError(f"words_per_option={words_per_option}: expected 1..{len(CONTENT_WORDS) // n_options} for {n_options} options")
    if layout not in LAYOUTS:
        raise GnaValueError(f"layout={layout!r}: expected one of {LAYOUTS}")
    if vary_lengths and words_per_option < 2:
        raise GnaValueError(f"vary_lengths with words_per_option={words_per_option}: lengths can only vary from 2 words per option up")


def toy_mcq(
    n: int = 200,
    seed: int = 0,
    n_options: int = 4,
    words_per_option: int = 2,
    layout: str = "label_first",
    vary_lengths: bool = False,
    shuffle_labels: bool = False,
    query_last: bool = False,
) -> Task:
    """``n`` fresh toy multiple-choice prompts (see the module docstring).

    The query word sits at a random place in the correct option; all words of a prompt
    are distinct. ``task.corrupted()`` rotates the options (same query, another answer).

    Args:
        layout: ``"label_first"`` (MMLU's ``A. w1 w2``) or ``"label_last"`` (``w1 w2 A``).
        vary_lengths: options of 1 to ``2 * words_per_option - 1`` words (their total
            stays ``n_options * words_per_option``, so all prompts have one length):
            a word's position no longer tells its option.
        shuffle_labels: the labels ``A..`` in a random order per prompt: an option's
            label is then told by the label token alone (not by its place, nor by the
            label before it).
        query_last: the ``Query: w`` line after the options instead of before them.

    A bundled toy model's own task is `gna_interp.toy_task`.
    """
    _check_shape(n, n_options, words_per_option, layout, vary_lengths, shuffle_labels, query_last)
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        words = rng.sample(CONTENT_WORDS, n_options * words_per_option)
        sizes = _option_sizes(rng, n_options, words_per_option) if vary_lengths else [words_per_option] * n_options
        bounds = [sum(sizes[:i]) for i in range(n_options + 1)]
        options = [" ".join(words[bounds[i] : bounds[i + 1]]) for i in range(n_options)]
        correct = rng.randrange(n_options)
        query_word = words[bounds[correct] + rng.randrange(sizes[correct])]
        query_line = f"Query: {query_word}\n"
        labels = rng.sample(LETTERS[:n_options], n_options) if shuffle_labels else None
        header, footer = ("", query_line) if query_last else (query_line, "")
        example = mcq_example(header, options, correct, layout=layout, labels=labels, footer=footer)
        start = len(example.text) - len(ANSWER_PROMPT) - len(query_line) if query_last else 0
        start += query_line.index(query_word)
        examples.append(dataclasses.replace(example, query=(start, start + len(query_word))))
    variants = (
        "_label_last" if layout == "label_last" else "",
        "_varied" if vary_lengths else "",
        "_shuffled" if shuffle_labels else "",
        "_query_last" if query_last else "",
    )
    name = "toy_mcq" + "".join(variants)
    return Task(name, examples, tokenizer=toy_tokenizer(), corrupter=rotate_options)


def _option_sizes(rng: random.Random, n_options: int, words_per_option: int) -> list[int]:
    """A random split of ``n_options * words_per_option`` words into ``n_options`` options
    of 1 to ``2 * words_per_option - 1`` words: words moved between random options."""
    sizes = [words_per_option] * n_options
    for _ in range(2 * n_options):
        source, target = rng.randrange(n_options), rng.randrange(n_options)
        if source != target and sizes[source] > 1 and sizes[target] < 2 * words_per_option - 1:
            sizes[source] -= 1
            sizes[target] += 1
    return sizes


def _option_sizes_tensor(n: int, generator: torch.Generator, n_options: int, words_per_option: int) -> Tensor:
    """``[n, n_options]``: `_option_sizes` per row, drawn from a torch generator."""
    sizes = torch.full((n, n_options), words_per_option)
    rows = torch.arange(n)
    for _ in range(2 * n_options):
        source = torch.randint(n_options, (n,), generator=generator)
        target = torch.randint(n_options, (n,), generator=generator)
        movable = (sizes[rows, source] > 1) & (sizes[rows, target] < 2 * words_per_option - 1) & (source != target)
        sizes[rows[movable], source[movable]] -= 1
        sizes[rows[movable], target[movable]] += 1
    return sizes


def toy_token_batch(
    n: int,
    generator: torch.Generator,
    n_options: int = 4,
    words_per_option: int = 2,
    layout: str = "label_first",
    vary_lengths: bool = False,
    shuffle_labels: bool = False,
    query_last: bool = False,
) -> tuple[Tensor, Tensor]:
    """Token ids of ``n`` toy prompts built directly as tensors (for training speed).

    Equal to tokenizing `toy_mcq`-style text with `toy_tokenizer` (a test checks this).
    The random draws come from ``generator`` alone, in a fixed order.

    Returns:
        ``input_ids [n, pos]`` and ``answer_ids [n]`` (the correct letter's token).
    """
    _check_shape(n, n_options, words_per_option, layout, vary_lengths, shuffle_labels, query_last)
    vocab = {token: i for i, token in enumerate(VOCAB)}
    content = torch.tensor([vocab[w] for w in CONTENT_WORDS])
    rows = torch.arange(n)
    shuffled = torch.rand(n, len(CONTENT_WORDS), generator=generator).argsort(1)
    words = content[shuffled[:, : n_options * words_per_option]]  # distinct per row
    correct = torch.randint(n_options, (n,), generator=generator)
    if vary_lengths:
        sizes = _option_sizes_tensor(n, generator, n_options, words_per_option)
        pick = (torch.rand(n, generator=generator) * sizes[rows, correct]).long()
    else:
        sizes = torch.full((n, n_options), words_per_option)
        pick = torch.randint(words_per_option, (n,), generator=generator)
    starts = sizes.cumsum(1) - sizes
    query = words[rows, starts[rows, correct] + pick]
    order = torch.rand(n, n_options, generator=generator).argsort(1) if shuffle_labels else torch.arange(n_options).expand(n, -1)
    labels = torch.tensor([vocab[letter] for letter in LETTERS[:n_options]])[order]  # [n, option]
    col = functools.partial(torch.full, (n, 1), dtype=torch.long)
    query_line = [col(vocab["Query"]), col(vocab[":"]), query[:, None], col(vocab["\n"])]
    answer = [col(vocab["Answer"]), col(vocab[":"])]
    if not vary_lengths:  # one layout for every row: build by columns
        lines = []
        for i in range(n_options):
            option, label = words[:, starts[0, i] : starts[0, i] + words_per_option], labels[:, i : i + 1]
            lines += [label, col(vocab["."]), option] if layout == "label_first" else [option, label]
            lines.append(col(vocab["\n"]))
        parts = [*lines, *query_line] if query_last else [*query_line, *lines]
        return torch.cat([col(vocab["<bos>"]), *parts, *answer], 1), labels[rows, correct]
    prompts = []
    for row in range(n):
        tokens = []
        for i in range(n_options):
            option_words = words[row, starts[row, i] : starts[row, i] + sizes[row, i]].tolist()
            label_id = int(labels[row, i])
            tokens += [label_id, vocab["."], *option_words] if layout == "label_first" else [*option_words, label_id]
            tokens.append(vocab["\n"])
        asked = [vocab["Query"], vocab[":"], int(query[row]), vocab["\n"]]
        tokens = [*tokens, *asked] if query_last else [*asked, *tokens]
        prompts.append([vocab["<bos>"], *tokens, vocab["Answer"], vocab[":"]])
    return torch.tensor(prompts), labels[rows, correct]
