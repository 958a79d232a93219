"""Tasks: annotated positions decode to what they claim, for several tokenizers, with
and without padding; MMLU's exact prompt format; toy prompts built as tensors equal the
tokenized text. References: each prompt tokenized alone, offsets searched by brute force."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
import torch

import gna_interp as gna
from gna_interp.tasks.mcq import mcq_example
from gna_interp.tasks.toy import toy_token_batch

MMLU_ROWS = [
    {"question": "What is 2 + 2?", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "22"], "answer": 1},
    {
        "question": "  Which gas do plants absorb?  ",
        "subject": "high_school_biology",
        "choices": ["Oxygen", "Nitrogen", "Carbon dioxide.", "Helium"],
        "answer": 2,
    },
    {
        "question": "Who wrote Hamlet?",
        "subject": "high_school_world_history",
        "choices": ["Marlowe", "Shakespeare", "Jonson", "Kyd"],
        "answer": 1,
    },
    {"question": "Pick D.", "subject": "elementary_mathematics", "choices": ["a", "b", "c", "d"], "answer": 3},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory):
    """A byte-level BPE trained here on prompts of every task (so merges cross words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    corpus = gna.tasks.toy_mcq(200, seed=5).prompts + gna.tasks.kv_retrieval(6, n=50, seed=5).prompts
    corpus += [mcq_example(f"Question about {r['subject']}.\n\n{r['question']}\n", r["choices"], r["answer"]).text for r in MMLU_ROWS] * 20
    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", "<bos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    folder = tmp_path_factory.mktemp("bpe")
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>").save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def mmlu_task(tmp_path_factory):
    return gna.tasks.mmlu(path=write_jsonl(tmp_path_factory.mktemp("mmlu") / "test.jsonl", MMLU_ROWS))


def token_containing(tokenizer, text: str, char: int) -> int:
    """Brute force over the offsets of ``text`` tokenized alone."""
    offsets = tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    hits = [i for i, (a, b) in enumerate(offsets) if a <= char < b]
    assert len(hits) == 1, (text, char, offsets)
    return hits[0]


def tasks_for(tokenizer_name, mmlu_task):
    return {
        "toy_mcq": gna.tasks.toy_mcq(12, seed=1),
        "toy_mcq_6": gna.tasks.toy_mcq(5, seed=2, n_options=6, words_per_option=3),
        "toy_query_last": gna.tasks.toy_mcq(6, seed=3, query_last=True),
        "kv": gna.tasks.kv_retrieval(5, n=6, seed=3),
        "mmlu": mmlu_task,
    }


@pytest.mark.parametrize("tokenizer_name", ["toy", "bpe"])
@pytest.mark.parametrize("task_name", ["toy_mcq", "toy_mcq_6", "toy_query_last", "kv", "mmlu"])
def test_annotations_decode_to_what_they_claim(tokenizer_name, task_name, bpe_tokenizer, mmlu_task):
    tokenizer = gna.tasks.toy_tokenizer() if tokenizer_name == "toy" else bpe_tokenizer
    task = tasks_for(tokenizer_name, mmlu_task)[task_name]
    with unknown_words_named(tokenizer_name == "toy" and task_name == "mmlu"):  # MMLU's words are not the toy's
        encoded = task.encode(tokenizer)
    ids, mask = encoded.batch.input_ids, encoded.batch.attention_mask
    for row, example in enumerate(task):
        pad = int((mask[row] == 0).sum())
        alone = tokenizer(example.text)["input_ids"]
        assert ids[row, pad:].tolist() == alone  # left padding, nothing else
        assert (mask[row, :pad] == 0).all() and (mask[row, pad:] == 1).all()

        def decode(position, row=row):
            return tokenizer.decode([int(ids[row, position])])

        assert int(encoded.final[row]) == ids.shape[1] - 1
        assert example.text.endswith(decode(encoded.final[row]).strip())
        for s, segment in enumerate(example.segments):
            end, label = int(encoded.segment_ends[row, s]), int(encoded.labels[row, s])
            assert end - pad == token_containing(tokenizer, example.text, segment.end)
            assert label - pad == token_containing(tokenizer, example.text, segment.label)
            assert "\n" in decode(end)
            label_char = example.text[segment.label]
            assert label_char in decode(label)
            if task_name != "kv":
                assert label_char == "ABCDEFGH"[s]
            start, stop = encoded.spans[row, s].tolist()
            assert start == label and stop == end + 1
        if encoded.query is not None:
            q0, q1 = encoded.query[row].tolist()
            span_text = tokenizer.decode(ids[row, q0:q1].tolist())
            assert example.text[example.query[0] : example.query[1]] in span_text


def test_padding_does_not_shift_annotations(mmlu_task, bpe_tokenizer):
    """Each row of a padded batch carries the annotations of the prompt encoded alone."""
    together = mmlu_task.encode(bpe_tokenizer)
    assert together.batch.attention_mask.min() == 0  # prompts differ in length: padding happened
    for row in range(len(mmlu_task)):
        alone = mmlu_task[row].encode(bpe_tokenizer)
        pad = together.batch.n_pos - alone.batch.n_pos
        assert torch.equal(together.segment_ends[row], alone.segment_ends[0] + pad)
        assert torch.equal(together.labels[row], alone.labels[0] + pad)
        assert torch.equal(together.spans[row], alone.spans[0] + pad)
        assert together.candidates[row] == alone.candidates[0]


def test_toy_tensor_batches_equal_tokenized_text():
    tokenizer = gna.tasks.toy_tokenizer()
    ids, answers = toy_token_batch(16, torch.Generator().manual_seed(3), n_options=4, words_per_option=2)
    for row in range(16):
        tokens = tokenizer.convert_ids_to_tokens(ids[row].tolist())
        query = tokens[3]
        options = [" ".join(tokens[7 + 5 * i : 9 + 5 * i]) for i in range(4)]
        correct = next(i for i, option in enumerate(options) if query in option.split())
        example = mcq_example(f"Query: {query}\n", options, correct)
        assert tokenizer(example.text)["input_ids"] == ids[row].tolist()
        assert tokenizer.convert_ids_to_tokens([int(answers[row])]) == ["ABCD"[correct]]
        assert len(set(options[0].split() + options[1].split() + options[2].split() + options[3].split())) == 8


def _parse_toy_tokens(tokens: list[str], layout: str, query_last: bool) -> tuple[str, list[str], list[str]]:
    """A toy prompt's tokens (with ``<bos>``, ending ``Answer :``) -> its query word, labels
    and options, read back from the text's structure alone."""
    body = tokens[1:-2]
    query_line, option_lines = (body[-4:], body[:-4]) if query_last else (body[:4], body[4:])
    assert query_line[:2] == ["Query", ":"] and query_line[3] == "\n", tokens
    parts = [line.split() for line in " ".join(option_lines).split("\n")[:-1]]
    labels = [p[0] if layout == "label_first" else p[-1] for p in parts]
    options = [" ".join(p[2:] if layout == "label_first" else p[:-1]) for p in parts]
    return query_line[2], labels, options


TOY_VARIANTS = [
    ("label_last", False, False, False),
    ("label_last", True, True, False),
    ("label_first", True, False, False),
    ("label_first", False, True, False),
    ("label_first", False, False, True),
    ("label_last", True, True, True),
]


@pytest.mark.parametrize("layout, vary_lengths, shuffle_labels, query_last", TOY_VARIANTS)
def test_toy_variants_tensors_equal_text(layout, vary_lengths, shuffle_labels, query_last):
    """Every variant: the tensor batches equal the tokenized text of the same options and
    labels, the answer is the label of the option holding the query, every prompt of a
    batch has one length, and lengths / label orders really vary when asked to."""
    tokenizer = gna.tasks.toy_tokenizer()
    shape = dict(layout=layout, vary_lengths=vary_lengths, shuffle_labels=shuffle_labels)
    ids, answers = toy_token_batch(32, torch.Generator().manual_seed(3), n_options=4, words_per_option=2, query_last=query_last, **shape)
    sizes, orders = set(), set()
    for row in range(32):
        tokens = tokenizer.convert_ids_to_tokens(ids[row].tolist())
        query, labels, options = _parse_toy_tokens(tokens, layout, query_last)
        correct = next(i for i, option in enumerate(options) if query in option.split())
        header, footer = ("", f"Query: {query}\n") if query_last else (f"Query: {query}\n", "")
        example = mcq_example(header, options, correct, layout=layout, labels=labels, footer=footer)
        assert tokenizer(example.text)["input_ids"] == ids[row].tolist()
        assert tokenizer.convert_ids_to_tokens([int(answers[row])]) == [labels[correct]]
        sizes.add(tuple(len(o.split()) for o in options))
        orders.add(tuple(labels))
    assert (len(sizes) > 1) == vary_lengths and all(sum(s) == 8 and min(s) >= 1 and max(s) <= 3 for s in sizes)
    assert (len(orders) > 1) == shuffle_labels and all(sorted(o) == list("ABCD") for o in orders)


def _draws(options, labels, correct, query):
    """The random choices behind one prompt, as (statistic, category) pairs."""
    sizes = [len(o.split()) for o in options]
    yield "correct slot", correct
    yield "query's place in its option", options[correct].split().index(query)
    yield "label order", "".join(labels)
    for slot, size in enumerate(sizes):
        yield "option sizes", (slot, size)
    for word in " ".join(options).split():
        yield "words", word


def _chi2_critical(dof: int, z: float = 3.72) -> float:
    """Upper quantile of chi-square(dof) at p ~ 1e-4 (Wilson-Hilferty)."""
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


@pytest.mark.parametrize(
    "layout, vary_lengths, shuffle_labels, query_last",
    [("label_last", True, True, False), ("label_first", False, False, False), ("label_first", True, True, True)],
)
def test_toy_tensors_and_text_draw_from_one_distribution(layout, vary_lengths, shuffle_labels, query_last):
    """Training prompts (`toy_token_batch`) and evaluation prompts (`toy_mcq`) are drawn
    from the same distribution: for each random choice (correct slot, the query's place
    in its option, label order, option sizes, words), a two-sample chi-square test of
    3,000 prompts of each does not reject at p ~ 1e-4. A generator that, say, never put
    the query in an option's last word, or favoured slot 0, fails it."""
    from collections import Counter

    tokenizer = gna.tasks.toy_tokenizer()
    shape = dict(layout=layout, vary_lengths=vary_lengths, shuffle_labels=shuffle_labels, query_last=query_last)
    n = 3000
    text_counts, tensor_counts = Counter(), Counter()
    for example in gna.tasks.toy_mcq(n, seed=11, **shape):
        meta = example.meta
        text_counts.update(_draws(meta["options"], meta["labels"], example.correct, example.text[slice(*example.query)]))
    ids, _ = toy_token_batch(n, torch.Generator().manual_seed(11), n_options=4, words_per_option=2, **shape)
    for row in ids.tolist():
        query, labels, options = _parse_toy_tokens(tokenizer.convert_ids_to_tokens(row), layout, query_last)
        correct = next(i for i, option in enumerate(options) if query in option.split())
        tensor_counts.update(_draws(options, labels, correct, query))
    for statistic in sorted({key for key, _ in text_counts}):
        categories = sorted({c for key, c in [*text_counts, *tensor_counts] if key == statistic}, key=str)
        a = torch.tensor([text_counts[(statistic, c)] for c in categories], dtype=torch.float64)
        b = torch.tensor([tensor_counts[(statistic, c)] for c in categories], dtype=torch.float64)
        if len(categories) < 2:
            assert torch.equal(a, b), statistic
            continue
        pooled = (a + b) / (a.sum() + b.sum())
        expected_a, expected_b = pooled * a.sum(), pooled * b.sum()
        chi2 = float(((a - expected_a) ** 2 / expected_a + (b - expected_b) ** 2 / expected_b).sum())
        counts = {str(c): (x, y) for c, x, y in zip(categories, a.tolist(), b.tolist(), strict=True)}
        assert chi2 < _chi2_critical(len(categories) - 1), (statistic, chi2, counts)


def test_label_last_positions_and_rotation():
    """``w1 w2 A`` lines: the label is the segment end (the line's "\\n" lies outside the
    span), candidates follow the prompt's label order, rotation keeps the labels."""
    tokenizer = gna.tasks.toy_tokenizer()
    task = gna.tasks.toy_mcq(6, seed=2, layout="label_last", vary_lengths=True, shuffle_labels=True)
    encoded = task.encode()
    for row, example in enumerate(task):
        tokens = tokenizer.convert_ids_to_tokens(encoded.batch.input_ids[row].tolist())
        lines = example.text.split("\n")[1:5]
        assert [tokens[i] for i in encoded.segment_ends[row].tolist()] == [line.split()[-1] for line in lines]
        assert [c.strip() for c in example.candidates] == [line.split()[-1] for line in lines]
        assert torch.equal(encoded.labels[row], encoded.segment_ends[row])
        assert torch.equal(encoded.spans[row, :, 1], encoded.segment_ends[row] + 1)
        assert [tokens[i] for i in encoded.spans[row, :, 0].tolist()] == [line.split()[0] for line in lines]
        assert example.query is not None and lines[example.correct].split().count(example.text[slice(*example.query)]) == 1
    rotated = task.corrupted()
    for before, after in zip(task, rotated, strict=True):
        assert after.candidates == before.candidates and after.correct == (before.correct + 1) % 4
        assert [line.split()[-1] for line in after.text.split("\n")[1:5]] == [c.strip() for c in before.candidates]
    assert rotated.encode().batch.n_pos == encoded.batch.n_pos
    with pytest.raises(ValueError, match="layout='sideways': expected one of"):
        gna.tasks.toy_mcq(2, layout="sideways")
    with pytest.raises(ValueError, match="expected 4 distinct labels"):
        mcq_example("Q\n", ["a", "b", "c", "d"], 0, labels=["A", "A", "B", "C"])


def test_query_last_puts_the_query_after_the_options():
    """``query_last``: the options come first, then ``Query: w``, then ``Answer:``; the
    query span names the word of the correct option and follows every segment; rotating
    the options or shuffling the labels keeps that span and those rules."""
    task = gna.tasks.toy_mcq(20, seed=6, query_last=True)
    assert task.name == "toy_mcq_query_last"
    encoded = task.encode()
    for row, example in enumerate(task):
        lines = example.text.split("\n")
        assert lines[-2] == f"Query: {example.text[slice(*example.query)]}" and lines[-1] == "Answer:"
        assert [line[0] for line in lines[:4]] == list("ABCD")
        assert example.query[0] > max(segment.end for segment in example.segments)
        assert lines[example.correct].split().count(example.text[slice(*example.query)]) == 1
        assert int(encoded.query[row, 0]) > int(encoded.segment_ends[row].max())
    for variant in (task.corrupted(), gna.tasks.shuffle_labels(task, seed=2)):
        for before, after in zip(task, variant, strict=True):
            assert after.query == before.query and after.text.endswith(before.text[before.query[0] - 7 :])
            query = after.text[slice(*after.query)]
            assert query in after.text.split("\n")[after.correct].split()
    assert (task.corrupted().correct == (task.correct + 1) % 4).all()
    for flag in ("query_last", "vary_lengths", "shuffle_labels"):
        with pytest.raises(ValueError, match=f"{flag}='yes': expected True or False"):
            gna.tasks.toy_mcq(2, **{flag: "yes"})
        with pytest.raises(ValueError, match=f"{flag}='yes': expected True or False"):
            toy_token_batch(2, torch.Generator(), **{flag: "yes"})
    with pytest.raises(ValueError, match="footer='Q': expected a string, empty or ending in a newline"):
        mcq_example("", ["a", "b"], 0, footer="Q")
    with pytest.raises(ValueError, match="footer=None: expected a string"):
        mcq_example("", ["a", "b"], 0, footer=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="header='Q': expected a string, empty or ending in a newline"):
        mcq_example("Q", ["a", "b"], 0)
    with pytest.raises(ValueError, match=r"meta keys \['footer'\] are set by mcq_example itself"):
        mcq_example("", ["a", "b"], 0, meta={"footer": "X\n", "subject": "s"})


def test_shuffle_labels_keeps_options_and_answers():
    """Each prompt's labels permuted (seeded), the options and the correct option in place,
    the candidates in the new label order; MMLU-style prompts too; non-MCQ tasks refused."""
    task = gna.tasks.toy_mcq(40, seed=8)
    shuffled = gna.tasks.shuffle_labels(task, seed=1)
    assert shuffled.prompts == gna.tasks.shuffle_labels(task, seed=1).prompts != gna.tasks.shuffle_labels(task, seed=2).prompts
    moved = 0
    for before, after in zip(task, shuffled, strict=True):
        old_lines, new_lines = before.text.split("\n")[1:5], after.text.split("\n")[1:5]
        assert [line[1:] for line in old_lines] == [line[1:] for line in new_lines]  # same options, same places
        assert [line[0] for line in new_lines] == [c.strip() for c in after.candidates]
        assert sorted(c.strip() for c in after.candidates) == list("ABCD") and after.correct == before.correct
        moved += after.candidates[after.correct] != before.candidates[before.correct]
    assert moved > 20  # the correct option's label changes in most prompts
    assert (shuffled.corrupted().correct == (shuffled.correct + 1) % 4).all()
    mmlu_like = gna.tasks.Task("m", [mcq_example("Q?\n", ["one", "two", "three", "four"], 2)])
    assert gna.tasks.shuffle_labels(mmlu_like).examples[0].text.startswith("Q?\n")
    with pytest.raises(ValueError, match="is not plain multiple choice"):
        gna.tasks.shuffle_labels(gna.tasks.kv_retrieval(5, n=2))
    edited = [dataclasses.replace(e, candidates=tuple(c + " ." for c in e.candidates)) for e in task.examples]
    with pytest.raises(ValueError, match="is not plain multiple choice"):  # rebuilding would drop the edit
        gna.tasks.shuffle_labels(gna.tasks.Task("edited", edited, tokenizer=task.tokenizer))


PINNED_CHECKSUM = (2877664, 1457)  # measured with the code that trained the bundled toys


def test_default_toy_batches_are_pinned():
    """The bundled toys were trained on these exact batches: the default stream must not
    change (first prompt and answer of seed 0, and a checksum of a larger batch)."""
    ids, answers = toy_token_batch(1, torch.Generator().manual_seed(0))
    assert ids.tolist() == [[1, 8, 6, 130, 4, 10, 5, 139, 162, 4, 11, 5, 170, 154, 4, 12, 5, 129, 184, 4, 13, 5, 130, 171, 4, 9, 6]]
    assert answers.tolist() == [13]
    ids, answers = toy_token_batch(128, torch.Generator().manual_seed(1))
    weights = torch.arange(1, ids.shape[1] + 1)
    assert (int((ids * weights).sum()), int(answers.sum())) == PINNED_CHECKSUM


def test_toy_task_is_seeded_and_answers_are_right():
    a, b = gna.tasks.toy_mcq(30, seed=4), gna.tasks.toy_mcq(30, seed=4)
    assert a.prompts == b.prompts and a.prompts != gna.tasks.toy_mcq(30, seed=5).prompts
    for example in a:
        query = example.text.split("\n")[0].removeprefix("Query: ")
        lines = example.text.split("\n")[1:-1]
        assert [query in line.split() for line in lines].index(True) == example.correct
    assert sorted(set(a.correct.tolist())) == [0, 1, 2, 3]


MMLU_FIRST = (
    "The following are multiple choice questions (with answers) about elementary mathematics.\n\n"
    "What is 2 + 2?\nA. 3\nB. 4\nC. 5\nD. 22\nAnswer:"
)


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet", "csv_letters", "folder"])
def test_mmlu_local_files_load_in_the_exact_format(tmp_path, suffix):
    import pandas as pd

    frame = pd.DataFrame(MMLU_ROWS)
    if suffix == "jsonl":
        path = write_jsonl(tmp_path / "test.jsonl", MMLU_ROWS)
    elif suffix == "parquet":
        path = tmp_path / "test.parquet"
        frame.to_parquet(path)
    elif suffix == "csv":
        path = tmp_path / "test.csv"
        frame.assign(choices=frame.choices.map(json.dumps)).to_csv(path, index=False)
    elif suffix == "csv_letters":
        path = tmp_path / "test.csv"
        letters = pd.DataFrame([dict(zip("ABCD", r["choices"], strict=True)) for r in MMLU_ROWS])
        frame.drop(columns="choices").join(letters).assign(answer=[("ABCD"[r["answer"]]) for r in MMLU_ROWS]).to_csv(path, index=False)
    else:  # cais/mmlu layout: <subject>/test-*.parquet, subject taken from the folder
        for subject in {r["subject"] for r in MMLU_ROWS}:
            (tmp_path / subject).mkdir()
            frame[frame.subject == subject].drop(columns="subject").to_parquet(tmp_path / subject / "test-00000-of-00001.parquet")
        path = tmp_path
    task = gna.tasks.mmlu(subjects=["elementary_mathematics"], path=path)
    assert len(task) == 2
    first = next(e for e in task if "2 + 2" in e.text)
    assert first.text == MMLU_FIRST
    assert first.candidates == (" A", " B", " C", " D") and first.correct == 1
    other = next(e for e in task if "Pick D" in e.text)
    assert other.correct == 3 and other.text.endswith("D. d\nAnswer:")
    everything = gna.tasks.mmlu(path=path, n=3)
    assert len(everything) == 3


def test_mmlu_question_whitespace_and_subject_spaces(mmlu_task):
    example = next(e for e in mmlu_task if "plants" in e.text)
    assert example.text.startswith("The following are multiple choice questions (with answers) about high school biology.\n\nWhich gas")
    assert "C. Carbon dioxide.\nD. Helium\nAnswer:" in example.text and example.correct == 2


def test_mmlu_hub_path_passes_configs_and_split(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return [dict(MMLU_ROWS[0], subject=config)]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("gna_interp.network.hub_reachable", lambda endpoint=None: True)  # the hub "answers"
    task = gna.tasks.mmlu(subjects=["anatomy", "virology"], split="validation")
    assert calls == [("cais/mmlu", "anatomy", "validation"), ("cais/mmlu", "virology", "validation")]
    assert "about anatomy." in task.prompts[0] and "about virology." in task.prompts[1]


def unknown_words_named(expected: bool):
    """Encoding text with words outside the tokenizer's vocabulary warns, naming them (the
    annotations stay right: the unknown token still covers those characters)."""
    return pytest.warns(UserWarning, match="not in the tokenizer's vocabulary") if expected else contextlib.nullcontext()


@pytest.mark.parametrize("task_fn", [lambda: gna.tasks.toy_mcq(8, seed=9), lambda: gna.tasks.kv_retrieval(6, n=8, seed=9)])
def test_corrupted_keeps_lengths_and_changes_answers(task_fn, bpe_tokenizer, mmlu_task):
    for task in (task_fn(), mmlu_task):
        corrupt = task.corrupted()
        for tokenizer in (gna.tasks.toy_tokenizer(), bpe_tokenizer):
            with unknown_words_named(task is mmlu_task and tokenizer is not bpe_tokenizer):
                clean_batch, corrupt_batch = task.encode(tokenizer).batch, corrupt.encode(tokenizer).batch
            assert torch.equal(clean_batch.attention_mask, corrupt_batch.attention_mask)
        for clean_example, corrupt_example in zip(task, corrupt, strict=True):
            right = clean_example.candidates[clean_example.correct]
            moved = corrupt_example.candidates[corrupt_example.correct]
            assert (right != moved) or (clean_example.correct != corrupt_example.correct)
            assert len(clean_example.text) == len(corrupt_example.text)


def test_kv_format_and_answer():
    task = gna.tasks.kv_retrieval(3, n=4, seed=0)
    example = task.examples[0]
    keys, values = example.meta["keys"], example.meta["values"]
    expected = "Memorize the following dictionary:\n" + "".join(f"{k}:{v}\n" for k, v in zip(keys, values, strict=True))
    expected += f"The value of the key '{keys[example.correct]}' is"
    assert example.text == expected
    assert example.candidates[example.correct] == f" {values[example.correct]}"
    assert len(set(values)) == 3 and all(0 <= v < 100 for v in values)


def test_task_is_valid_inputs_everywhere(bpe_tokenizer):
    task = gna.tasks.toy_mcq(3, seed=0)
    from gna_interp.core.inputs import make_batch

    assert torch.equal(make_batch(task, bpe_tokenizer).input_ids, task.encode().batch.input_ids)  # toy task: its own tokenizer
    kv = gna.tasks.kv_retrieval(3, n=2, seed=0)
    assert torch.equal(make_batch(kv, bpe_tokenizer).input_ids, kv.encode(bpe_tokenizer).batch.input_ids)


def test_subsets_and_shuffling(tmp_path, mmlu_task):
    assert mmlu_task[1:3].prompts == mmlu_task.prompts[1:3]
    path = write_jsonl(tmp_path / "test.jsonl", MMLU_ROWS)
    shuffled = gna.tasks.mmlu(path=path, seed=3)
    assert sorted(shuffled.prompts) == sorted(mmlu_task.prompts) and shuffled.prompts != mmlu_task.prompts
    assert gna.tasks.mmlu(path=path, seed=3, n=2).prompts == shuffled.prompts[:2]


@pytest.mark.parametrize(
    "row,message",
    [
        ({"question": "q", "subject": "anatomy", "answer": 0}, r"test.jsonl row 1: missing field 'choices'"),
        ({"question": "q", "subject": "anatomy", "choices": ["a", "b", "c"], "answer": 0}, r"test.jsonl row 1: 3 choices, expected 4"),
        ({"question": "q", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": 4}, r"row 1: answer 4 out of range 0\.\.3"),
        ({"question": "q", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": "E"}, r"row 1: answer 'E' is not an index"),
        ({"subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": 1}, r"row 1: missing field 'question'"),
    ],
)
def test_mmlu_malformed_rows_name_the_row(tmp_path, row, message):
    path = write_jsonl(tmp_path / "test.jsonl", [MMLU_ROWS[0], row])
    with pytest.raises(ValueError, match=message):
        gna.tasks.mmlu(path=path)


def test_mmlu_bad_arguments(tmp_path):
    path = write_jsonl(tmp_path / "test.jsonl", MMLU_ROWS)
    with pytest.raises(ValueError, match=r"unknown MMLU subject 'anatomyy' \(did you mean anatomy"):
        gna.tasks.mmlu(subjects="anatomyy", path=path)
    with pytest.raises(ValueError, match=r"no questions for subjects \['virology'\]"):
        gna.tasks.mmlu(subjects="virology", path=path)
    with pytest.raises(ValueError, match="unknown split 'tests'"):
        gna.tasks.mmlu(path=path, split="tests")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gna.tasks.mmlu(path=tmp_path / "missing")
    with pytest.raises(ValueError, match=r"no 'validation' files"):
        gna.tasks.mmlu(path=tmp_path, split="validation")
    with pytest.raises(ValueError, match="n=0"):
        gna.tasks.mmlu(path=path, n=0)


def test_task_builders_reject_bad_shapes():
    with pytest.raises(ValueError, match=r"n_options=9: expected 2\.\.8"):
        gna.tasks.toy_mcq(4, n_options=9)
    with pytest.raises(ValueError, match="n=0"):
        gna.tasks.toy_mcq(0)
    with pytest.raises(ValueError, match="n_pairs=1"):
        gna.tasks.kv_retrieval(1)
    with pytest.raises(ValueError, match="keys has duplicates"):
        gna.tasks.kv_retrieval(2, keys=["a", "a", "b"])
    with pytest.raises(ValueError, match=r"mixes examples with \[3, 4\] segments"):
        gna.tasks.Task("mixed", [*gna.tasks.toy_mcq(1, n_options=3), *gna.tasks.toy_mcq(1, n_options=4)])
    with pytest.raises(ValueError, match="has no tokenizer of its own"):
        gna.tasks.kv_retrieval(3, n=2).encode()
