"""A researcher's own task: the docs example runs and shows what it prints; tasks built
from `mcq_example` / `kv_example` corrupt by rotation; `Task` refuses annotations outside
the prompt; unknown words are found by the id the tokenizer gives them; toy tasks leave no
temporary folder; every toy card has its task; `Ablate(3)` names its value.

References: prompts and their rotations written out by hand, the toys' recipes, the
temporary directory's listing."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gna_interp as gna
from gna_interp.core.inputs import UnknownWordsWarning, make_batch
from gna_interp.tasks import Example, Segment, Task, kv_example, mcq_example
from gna_interp.zoo import recipe
from gna_interp.zoo.train import task_shape

from .test_examples import EXAMPLES, run

ROOT = Path(__file__).resolve().parents[1]

# ----- the docs example ------------------------------------------------------------------------


def _docs_section() -> str:
    text = (ROOT / "docs" / "tasks.md").read_text()
    return text.split("## Your own task\n", 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def own_task_run(tmp_path_factory):
    return run("own_task.py", tmp_path_factory.mktemp("own_task"))


def test_own_task_example_runs_and_prints_the_prompts(own_task_run):
    assert own_task_run.returncode == 0, own_task_run.stderr[-3000:]
    out = own_task_run.stdout
    france = "What is the capital of France?\nA. Berlin\nB. Paris\nC. Rome\nD. Madrid\nAnswer: -> ' B'\n"
    rotated = "What is the capital of France?\nA. Madrid\nB. Berlin\nC. Paris\nD. Rome\nAnswer: -> ' C'\n"
    ages = "People and their ages:\nAlice is 31\nBob is 47\nCarol is 25\nDave is 62\nSo Bob is -> ' 47'\nBob is 31 -> ' 31'\n"
    assert out.startswith(france + rotated + ages), out[:600]
    unknown = re.search(r"^UnknownWordsWarning 12 word\(s\) in task 'capitals' .* became '<unk>': (.*)$", out, re.M)
    assert unknown is not None, out
    words = {w for line in ("France Italy Norway Spain",) for w in line.split()}
    assert {f"'{w}?'" for w in words} <= set(unknown.group(1).split(", "))  # the unknown words, named
    accuracies = dict(re.findall(r"^toy llama, (\w+): accuracy ([\d.]+)$", out, re.M))
    assert set(accuracies) == {"toy_mcq_label_last_shuffled", "my_wording", "toy_dictionary"}, out
    assert float(accuracies["toy_mcq_label_last_shuffled"]) >= 0.9  # the toy on its own task (card: 0.98)


def test_docs_show_the_examples_code_and_output(own_task_run):
    """Every code block of docs/tasks.md's "Your own task" is code of examples/own_task.py,
    and every output block is lines the example printed."""
    section = _docs_section()
    code = (EXAMPLES / "own_task.py").read_text()
    blocks = re.findall(r"```(python|text)\n(.*?)```", section, re.S)
    assert sum(kind == "python" for kind, _ in blocks) >= 5 and sum(kind == "text" for kind, _ in blocks) >= 4
    printed = own_task_run.stdout
    for kind, block in blocks:
        if kind == "python":
            assert block in code, block
        else:
            assert block in printed, (block, printed)


# ----- building tasks --------------------------------------------------------------------------


def test_mcq_example_tasks_rotate_their_options_by_default():
    task = Task("mine", [mcq_example("Q1\n", ["a b", "c d", "e f"], 0), mcq_example("", ["x", "y", "z"], 2, footer="F\n")])
    assert task.corrupter is gna.tasks.rotate_options is gna.tasks.mcq.rotate_options
    corrupt = task.corrupted()
    assert [e.text for e in corrupt] == ["Q1\nA. e f\nB. a b\nC. c d\nAnswer:", "A. z\nB. x\nC. y\nF\nAnswer:"]
    assert corrupt.correct.tolist() == [1, 0]
    assert Task("mine", task.examples, corrupter=lambda e, rng: e).corrupted().prompts == task.prompts  # an explicit rule wins
    by_hand = Example("x\ny\nz\nAnswer:", (Segment(0, 1, 0), Segment(2, 3, 2), Segment(4, 5, 4)), 0, (" x", " y", " z"))
    mixed = Task("mixed", [task.examples[0], by_hand])
    with pytest.raises(ValueError, match=r"task 'mixed' has no corruption rule: pass Task\(\.\.\., corrupter=f\)"):
        mixed.corrupted()
    with pytest.raises(ValueError, match=r"rotate_options needs an example built by mcq_example .* meta keys \[\]"):
        gna.tasks.rotate_options(by_hand)


def test_kv_example_in_your_own_wording():
    example = kv_example(["Alice", "Bob"], [31, 47], 1, header="Ages:\n", separator=" is ", question="So {key} is")
    assert example.text == "Ages:\nAlice is 31\nBob is 47\nSo Bob is"
    assert example.text[slice(*example.query)] == "Bob" and example.candidates == (" 31", " 47") and example.correct == 1
    assert [example.text[s.start : s.end + 1] for s in example.segments] == ["Alice is 31\n", "Bob is 47\n"]
    corrupt = Task("ages", [example]).corrupted().examples[0]
    assert corrupt.text == "Ages:\nAlice is 47\nBob is 31\nSo Bob is" and corrupt.candidates[corrupt.correct] == " 31"
    default = kv_example(["apple", "river"], [7, 42], 0)
    assert default.text == "Memorize the following dictionary:\napple:7\nriver:42\nThe value of the key 'apple' is"
    with pytest.raises(ValueError, match=r"question='So is': expected one line holding '\{key\}' once"):
        kv_example(["a", "b"], [1, 2], 0, question="So is")
    with pytest.raises(ValueError, match=r"keys repeat \['a'\]: expected distinct keys"):
        kv_example(["a", "a"], [1, 2], 0)
    with pytest.raises(ValueError, match=r"values repeat \['2'\]: expected distinct values"):
        kv_example(["a", "b"], [2, 2], 0)
    with pytest.raises(ValueError, match=r"queried=5: expected the index of a key, 0\.\.1"):
        kv_example(["a", "b"], [1, 2], 5)
    with pytest.raises(ValueError, match=r"header='Ages': expected a string, empty or ending in a newline"):
        kv_example(["a", "b"], [1, 2], 0, header="Ages")


TEXT = "x y\nz w\nAnswer:"  # 15 characters


@pytest.mark.parametrize(
    "bad, message",
    [
        (Example(TEXT, (Segment(0, 40, 0),), 0, (" x",)), r": segment 0 has start=0, label=0, end=40: expected .* end < 15 \(its length\)"),
        (Example(TEXT, (Segment(4, 7, 1),), 0, (" x",)), r": segment 0 has start=4, label=1, end=7: expected .*0 <= start <= label"),
        (Example(TEXT, (Segment(0, 3, 0),), 3, (" x", " z")), r": correct=3: expected the index of a candidate, 0\.\.1"),
        (Example(TEXT, (Segment(0, 3, 0),), True, (" x", " z")), r": correct=True: expected the index of a candidate"),
        (Example(TEXT, (Segment(0, 3, 0),), 0, ()), r": candidates=\(\): expected a non-empty tuple of non-empty strings"),
        (Example(TEXT, (Segment(0, 3, 0),), 0, (" x",), query=(500, 505)), r": query=\(500, 505\): expected .* 0 <= start < end <= 15"),
        ("x y", r" is 'x y' \(str\): expected a gna_interp.tasks.Example"),
    ],
)
def test_task_refuses_annotations_outside_the_prompt(bad, message):
    good = Example(TEXT, (Segment(0, 3, 0),), 0, (" x", " z"))
    with pytest.raises((ValueError, TypeError), match=r"task 'mine', example 1" + message):
        Task("mine", [good, bad])


def test_mcq_example_refuses_a_query_beyond_the_prompt():
    text = mcq_example("Q\n", ["a", "b"], 0).text
    assert text == "Q\nA. a\nB. b\nAnswer:"
    with pytest.raises(ValueError, match=rf"mcq_example: query=\(500, 505\): expected .* 0 <= start < end <= {len(text)} \(its length\)"):
        mcq_example("Q\n", ["a", "b"], 0, query=(500, 505))
    with pytest.raises(ValueError, match=r"mcq_example: query=\(3, 2\)"):
        mcq_example("Q\n", ["a", "b"], 0, query=(3, 2))
    with pytest.raises(ValueError, match=r"correct=4: correct option out of range for 2 options: expected 0\.\.1"):
        mcq_example("Q\n", ["a", "b"], 4)
    assert mcq_example("Q\n", ["a", "b"], 1, query=(0, 1)).query == (0, 1)


# ----- tokenizers: unknown words -------------------------------------------------------------

WORDS = ["<pad>", "<bos>", "<eos>", "Which", "is", "A", "B", "C", ".", "\n", "Answer", ":", "apple", "river"]


def word_level(words: list[str], **attributes: str):
    """An in-memory WordLevel tokenizer over ``words`` whose model maps unknown words to
    ``<unk>`` (which may be missing from ``words``); ``attributes`` set on the HF wrapper."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"[\n.:]"), behavior="isolated"), pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed")]
    )
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", **attributes)


def unigram(words: list[str]):
    """An in-memory Unigram tokenizer: unknown pieces become id 0 (``<unk>``), no ``unk_token`` attribute."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.Unigram([("<unk>", 0.0), *[(w, -1.0) for w in words]], unk_id=0))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"[\n.:]"), behavior="isolated"), pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed")]
    )
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>")


def own_task() -> Task:
    return Task(
        "own",
        [mcq_example("Which is apple\n", ["apple", "river", "C"], 0), mcq_example("Which is zebra\n", ["apple", "river", "stone"], 1)],
    )


@pytest.mark.parametrize(
    "name, make",
    [
        ("unk_token set", lambda: word_level([*WORDS, "<unk>"], unk_token="<unk>")),
        ("unk_token unset", lambda: word_level([*WORDS, "<unk>"])),
        ("unigram, unk_token unset", lambda: unigram([w for w in WORDS if w not in ("<pad>",)] + ["<pad>"])),
    ],
)
def test_unknown_words_are_found_by_the_id_the_tokenizer_gives(name, make):
    tokenizer = make()
    unk = tokenizer.backend_tokenizer.token_to_id("<unk>")
    assert tokenizer("zebra")["input_ids"] == [unk]  # the reference: what the tokenizer really produces
    with pytest.warns(
        UnknownWordsWarning, match=r"2 word\(s\) in task 'own' are not in the tokenizer's vocabulary and became '<unk>': 'stone', 'zebra'"
    ):
        encoded = own_task().encode(tokenizer)
    assert (encoded.batch.input_ids == unk).sum() == 2
    with pytest.warns(UnknownWordsWarning, match=r"1 word\(s\) in the inputs .* 'zebra'"):
        make_batch(["apple zebra", "river"], tokenizer)


def test_a_vocabulary_without_its_unknown_token_names_the_first_missing_word():
    tokenizer = word_level(WORDS)  # the model's "<unk>" is not in the vocabulary
    with pytest.raises(Exception, match=r"Missing \[UNK\]"):  # the reference: the bare error the tokenizer raises
        tokenizer("zebra stone")
    with pytest.raises(
        ValueError,
        match=r"task 'own', example 1: the word 'zebra' is not in the tokenizer's vocabulary, and the vocabulary has no unknown token",
    ):
        own_task().encode(tokenizer)
    odd_candidate = Example("Which is apple\nA. apple\nAnswer:", (Segment(15, 23, 15),), 0, (" A", " Q"))
    with pytest.raises(ValueError, match=r"task 'c', example 0, candidate ' Q': the word 'Q' is not in the tokenizer's vocabulary"):
        Task("c", [odd_candidate]).encode(tokenizer)
    with pytest.raises(ValueError, match=r"inputs\[1\]: the word 'stone' is not in the tokenizer's vocabulary"):
        make_batch(["apple river", "river stone zebra"], tokenizer)
    assert (
        own_task()[0].encode(tokenizer).batch.input_ids[0].tolist()
        == tokenizer("Which is apple\nA. apple\nB. river\nC. C\nAnswer:")["input_ids"]
    )


# ----- temporary folders and toy cards ---------------------------------------------------------

LOAD_EVERY_TOY_TASK = """
import os, sys, tempfile
import gna_interp as gna
for name in gna.toy_names():
    gna.toy_task(name, n=2)
print(sorted(p for p in os.listdir(tempfile.gettempdir()) if p.startswith("gna_")))
folder = gna.tasks.toy_tokenizer().name_or_path
child = os.fork()
if child == 0:  # a forked child that exits normally (its exit handlers run) leaves the folder alone
    sys.exit(0)
os.waitpid(child, 0)
print(os.path.isdir(folder))
"""


@pytest.mark.slow  # make test stays within 5 minutes; CI runs it in make test-slow
def test_toy_tasks_leave_no_temporary_folder(tmp_path):
    """Every toy task loaded in a fresh interpreter whose temporary directory is empty: the
    toy tokenizer's folder is there while it runs and gone once it exits."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    before = sorted(p.name for p in scratch.iterdir() if p.name.startswith("gna_"))
    result = subprocess.run([sys.executable, "-c", LOAD_EVERY_TOY_TASK], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    during, forked = result.stdout.strip().splitlines()[-2:]
    assert len(ast.literal_eval(during)) == 1 and ast.literal_eval(during)[0].startswith("gna_toy_tokenizer_"), during
    assert forked == "True"
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith("gna_")) == before == []
    assert tempfile.gettempdir() != str(scratch)  # this process's own temporary directory was not touched


@pytest.mark.parametrize("name", gna.toy_names())
def test_every_toy_card_has_its_task(name):
    shape = task_shape(recipe(name))  # the recipe that trained it
    assert gna.toy_card(name)["task"] == shape
    assert gna.toy_task(name, 3, seed=1).prompts == gna.tasks.toy_mcq(3, seed=1, **shape).prompts


# ----- interventions: a value that is not heads ------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: gna.Ablate(3), r"Ablate heads=3 \(int\): expected a gna_interp.Head or a list of them"),
        (lambda: gna.Ablate(None), r"Ablate heads=None \(NoneType\): expected a gna_interp.Head or a list of them"),
        (
            lambda: gna.Ablate([(0, 3)]),
            r"Ablate heads must contain gna_interp.Head values, got \(0, 3\) \(tuple\) \(gna.Head\(0, 3\) builds it\)",
        ),
        (lambda: gna.Patch(3, source="x"), r"Patch targets=3 \(int\): expected a gna_interp.Head or Resid, or a list of them"),
        (lambda: gna.MaskAttentionRows(heads=4), r"MaskAttentionRows heads=4 \(int\): expected a gna_interp.Head or a list"),
        (lambda: gna.SkipLayers(2.5), r"SkipLayers layers=2.5 \(float\): expected a layer index \(int\) or a list of them"),
        (lambda: gna.MaskAttentionRows(layers=1.5), r"MaskAttentionRows layers=1.5 \(float\): expected a layer index"),
    ],
)
def test_interventions_name_a_value_that_is_not_heads(make, message):
    with pytest.raises(TypeError, match=message):
        make()


def test_interventions_still_take_one_head_or_many():
    head = gna.Head(1, 0)
    assert gna.Ablate(head).heads == gna.Ablate([head]).heads == gna.Ablate(h for h in [head]).heads == (head,)
    assert gna.SkipLayers(1).layers == gna.SkipLayers([1]).layers == (1,)
    assert gna.Patch(head, source="x").targets == (head,)
