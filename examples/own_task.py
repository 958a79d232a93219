# %% [markdown]
# # Your own task (offline)
#
# A multiple-choice task and a key-value task in your own words, built with
# `gna.tasks.mcq_example` and `gna.tasks.kv_example`, then evaluated, ablated and
# corrupted on a model loaded from a folder and on a bundled toy. docs/tasks.md
# ("Your own task") shows these cells; the test suite runs this file.

# %%
import tempfile
import warnings

import gna_interp as gna
from gna_interp.tasks import Task, kv_example, mcq_example

# %% A multiple-choice task: a header (ending in "\n"), the options, the index of the right one.
capitals = [
    ("What is the capital of France?", ["Berlin", "Paris", "Rome", "Madrid"], 1),
    ("What is the capital of Italy?", ["Rome", "Vienna", "Oslo", "Paris"], 0),
    ("What is the capital of Norway?", ["Madrid", "Berlin", "Oslo", "Vienna"], 2),
    ("What is the capital of Spain?", ["Vienna", "Oslo", "Paris", "Madrid"], 3),
]
mcq = Task("capitals", [mcq_example(question + "\n", options, right) for question, options, right in capitals])
first = mcq.examples[0]
print(first.text, "->", repr(first.candidates[first.correct]))
# The corruption for patching: the option texts rotated by one line (rotate_options), the labels kept.
corrupted = mcq.corrupted().examples[0]
print(corrupted.text, "->", repr(corrupted.candidates[corrupted.correct]))

# %% A key-value task: one line per key, then a question with {key} where the queried key goes.
ages = {"Alice": 31, "Bob": 47, "Carol": 25, "Dave": 62}
kv = Task(
    "ages",
    [
        kv_example(list(ages), list(ages.values()), asked, header="People and their ages:\n", separator=" is ", question="So {key} is")
        for asked in range(len(ages))
    ],
)
bob = kv.examples[1]
print(bob.text, "->", repr(bob.candidates[bob.correct]))
rotated = kv.corrupted().examples[1]  # the values rotated by one line: Bob is now 31
print(rotated.text.splitlines()[2], "->", repr(rotated.candidates[rotated.correct]))


# %% A model loaded from a folder. The folder here holds a stand-in for yours: a tiny random
# Llama and a byte-level BPE tokenizer trained on these prompts (it knows every word).
def write_stand_in(folder: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from gna_interp.models.tiny import tiny_model

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>"], initial_alphabet=alphabet, show_progress=False)
    core.train_from_iterator(mcq.prompts + kv.prompts, trainer)
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>").save_pretrained(folder)
    tiny_model("llama", seed=0, vocab_size=core.get_vocab_size()).save_pretrained(folder)


with tempfile.TemporaryDirectory() as folder:
    write_stand_in(folder)
    model = gna.load(folder)  # your model's folder (or a hub id) instead
    for task in (mcq, kv):  # random weights: accuracy at chance, but the ablation moves the margins
        clean = gna.evaluate(model, task)
        ablated = gna.evaluate(model, task, gna.Ablate(gna.Head(0, 0)))
        moved = (ablated.margins - clean.margins).abs().mean()
        print(f"folder model, {task.name}: accuracy {clean.accuracy:.2f} (chance {clean.chance:.2f});", end=" ")
        print(f"ablating L0H0 moves the margins by {moved:.3f} on average")

# %% A bundled toy knows only its 192 words (gna.tasks.toy.VOCAB): the others become <unk>, and gna names them.
toy = gna.load_toy("llama")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    gna.evaluate(toy, mcq)
print(caught[0].category.__name__, str(caught[0].message).split(".")[0])

# %% In the toy's words: the questions the toy was trained on (gna.toy_task), asked in your own
# header line instead of its "Query: <word>", and a dictionary in your own wording.
trained = gna.toy_task("llama", n=24, seed=0)
mine = Task(
    "my_wording",
    [
        mcq_example(f"The key is {e.text[slice(*e.query)]}\n", e.meta["options"], e.correct, layout="label_last", labels=e.meta["labels"])
        for e in trained
    ],
    tokenizer=gna.tasks.toy_tokenizer(),  # the toy's own ids
)
toy_kv = Task(
    "toy_dictionary",
    [kv_example(["apple", "river", "stone", "cloud"], [7, 42, 13, 99], asked, question="The value of {key} is") for asked in range(4)],
    tokenizer=gna.tasks.toy_tokenizer(),
)
print(mine.examples[0].text)
for task in (trained, mine, toy_kv):
    print(f"toy llama, {task.name}: accuracy {gna.evaluate(toy, task).accuracy:.2f}")
