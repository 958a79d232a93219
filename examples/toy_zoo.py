# %% [markdown]
# # Tasks and the toy zoo (offline)
#
# The bundled toy models were trained here, on CPU, on `toy_mcq`: a query word, four
# options, and `Answer:`; the answer is the letter of the option containing the query.
# Each toy has its own variant (the Llama's options end in their label, in a shuffled
# order; the Mamba-2's query comes after the options): `gna.toy_task(name, n, seed)`
# gives fresh prompts of the one it was trained on.
# This script evaluates them, shows the annotated positions, and reproduces the
# single-head bottleneck recorded in their model cards.

# %%
import os

import gna_interp as gna

N = int(os.environ.get("GNA_EXAMPLE_N", "300"))  # prompts per model (the test suite runs fewer)

task = gna.tasks.toy_mcq(n=N, seed=123)
print(task.prompts[0])
enc = task.encode()
print("final position", int(enc.final[0]), "segment ends", enc.segment_ends[0].tolist(), "labels", enc.labels[0].tolist())

# %% Clean accuracy on fresh prompts of its own task, and the card's most harmful head ablated, for each toy model.
for name in gna.toy_names():
    model, own_task = gna.load_toy(name), gna.toy_task(name, N, seed=123)
    card = gna.toy_card(name)
    head = gna.Head.parse(card["ablation"]["best_single_head"])
    clean = gna.evaluate(model, own_task)
    ablated = gna.evaluate(model, own_task, [gna.Ablate([head])])
    print(
        f"{name:9s} on {own_task.name}: clean {clean.accuracy:.3f} (card {card['held_out_accuracy']:.3f}); "
        f"{head} ablated: {ablated.accuracy:.3f}"
    )

# %% Every head's ablation as a sweep, scored by candidate accuracy, on the Mamba-2 toy's own task.
model, own_task = gna.load_toy("mamba2_counting"), gna.toy_task("mamba2_counting", N, seed=123)
own = own_task.encode()
metric = gna.candidate_accuracy(own.candidate_ids, own.correct)
sweep = gna.ablation_sweep(model, own_task, None, metric, progress=False)
print(sweep.to_frame().sort_values("score").head().round(3))

# %% MMLU and KV retrieval build the same annotations for any tokenizer.
kv = gna.tasks.kv_retrieval(n_pairs=5, n=3, seed=0)
print(kv.prompts[0])
print("candidates:", kv.examples[0].candidates, "correct:", kv.examples[0].correct)
