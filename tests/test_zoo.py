"""The bundled toy zoo: offline loading, card accuracy re-measured on fresh prompts,
deterministic training, the size budget, and `gna-interp zoo train` end to end."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import gna_interp as gna
from gna_interp.cli import main
from gna_interp.zoo import recipe
from gna_interp.zoo.store import ZOO_DIR, card_markdown
from gna_interp.zoo.train import task_shape, train

NAMES = gna.toy_names()
DEFAULT_TASK = dict(n_options=4, words_per_option=2, layout="label_first", vary_lengths=False, shuffle_labels=False, query_last=False)
FRESH_SEED = 777  # neither the training stream nor the card's held-out prompts


def test_the_zoo_is_bundled_and_small():
    assert {"llama", "mamba2"} <= set(NAMES)
    size = sum(p.stat().st_size for p in ZOO_DIR.rglob("*") if p.is_file())
    # 5 MB until the Mamba-1 toy (0.36 MB), 6 MB until the label-reading Mamba-2 and hybrid (1 MB) joined their predecessors
    assert size <= 7 * 2**20, f"zoo is {size / 2**20:.2f} MB"
    for name in NAMES:
        files = {p.name for p in (ZOO_DIR / name).iterdir()}
        assert {"model.safetensors", "config.json", "tokenizer.json", "card.json", "README.md"} <= files
        card = json.loads((ZOO_DIR / name / "card.json").read_text())
        assert (ZOO_DIR / name / "README.md").read_text() == card_markdown(card), name  # the human card is the data's
        assert card["name"] == name
        made_by = recipe(name)  # the recipe that reproduces it
        assert card.get("task", DEFAULT_TASK) == task_shape(made_by), name  # older cards have no task: the default
        assert (card["seed"], card.get("lr", made_by.lr), card.get("init_from")) == (made_by.seed, made_by.lr, made_by.init_from)
        assert list(card.get("pruned_heads", [])) == list(made_by.pruned_heads), name
        config = json.loads((ZOO_DIR / name / "config.json").read_text())
        assert {k: config[k] for k in made_by.config} == made_by.config, name


@pytest.mark.parametrize("name", NAMES)
def test_toy_model_reaches_its_card_accuracy_on_fresh_prompts(name):
    card = gna.toy_card(name)
    assert card["held_out_accuracy"] >= 0.95
    assert card["seed"] == recipe(name).seed and card["family"] == recipe(name).family
    model = gna.load_toy(name)
    task = gna.toy_task(name, 600, seed=FRESH_SEED)
    accuracy = gna.evaluate(model, task).accuracy
    # two samples of one accuracy: within 3 standard errors of their difference (0.02 at 0.986, 0.04 at 0.95)
    p = card["held_out_accuracy"]
    tolerance = 3 * (p * (1 - p) * (1 / card["held_out_n"] + 1 / len(task))) ** 0.5
    assert abs(accuracy - p) <= max(tolerance, 0.01), (accuracy, p, tolerance)
    # The card's bottleneck claim, re-measured on the fresh prompts.
    facts = card["ablation"]
    head = gna.Head.parse(facts["best_single_head"])
    ablated = gna.evaluate(model, task, [gna.Ablate([head])]).accuracy
    assert abs(ablated - facts["best_single_head_accuracy"]) <= 0.04, (ablated, facts["best_single_head_accuracy"])
    # The card's label check: shuffled labels and labels in order, re-measured on fresh prompts.
    for shuffled, key in ((True, "shuffled"), (False, "in_order")):
        fresh = gna.tasks.toy_mcq(300, seed=FRESH_SEED, **{**card["task"], "shuffle_labels": shuffled})
        p = card["labels"][key]
        measured = gna.evaluate(model, fresh).accuracy
        tolerance = 3 * (p * (1 - p) * (1 / card["labels"]["n"] + 1 / len(fresh))) ** 0.5
        assert abs(measured - p) <= max(tolerance, 0.02), (key, measured, p, tolerance)


def test_toy_task_is_the_cards_task(tmp_path, monkeypatch):
    """`toy_task` builds the card's task shape; cards written before the field existed
    get the default `toy_mcq`."""
    from gna_interp.zoo import store

    for name in NAMES:
        assert gna.toy_task(name, 5, seed=1).prompts == gna.tasks.toy_mcq(5, seed=1, **gna.toy_card(name).get("task", {})).prompts
    folder = tmp_path / "models" / "odd"
    folder.mkdir(parents=True)
    shape = {"layout": "label_last", "shuffle_labels": True, "vary_lengths": True, "n_options": 3, "words_per_option": 2}
    (folder / "card.json").write_text(json.dumps({"task": shape}))
    monkeypatch.setattr(store, "ZOO_DIR", tmp_path / "models")
    task = gna.toy_task("odd", 4, seed=2)
    assert task.name == "toy_mcq_label_last_varied_shuffled" and task.n_segments == 3
    assert gna.toy_task(folder, 4, seed=2).prompts == task.prompts  # a trained toy's folder, not bundled
    (folder / "card.json").write_text(json.dumps({}))
    assert gna.toy_task("odd", 4, seed=2).prompts == gna.tasks.toy_mcq(4, seed=2).prompts
    with pytest.raises(ValueError, match="unknown toy model 'nowhere'"):
        gna.toy_task("nowhere")


def test_llama_toy_loads_on_both_backends_with_the_same_numbers():
    task = gna.toy_task("llama", 40, seed=FRESH_SEED)
    tlens = gna.evaluate(gna.load_toy("llama", backend="tlens"), task).scores
    nnsight = gna.evaluate(gna.load_toy("llama", backend="nnsight"), task).scores
    assert torch.allclose(tlens, nnsight, atol=1e-4)


def test_training_is_deterministic_for_a_seed():
    short = dataclasses.replace(recipe("mamba2_counting"), max_steps=4, eval_every=2, batch_size=16)

    def weights(r):
        return {k: v.clone() for k, v in train(r, progress=False, log=lambda _: None).model.state_dict().items()}

    first, second = weights(short), weights(short)
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = weights(dataclasses.replace(short, seed=short.seed + 1))
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_ordered_label_steps_need_shuffled_labels():
    for bad in (-1, 5):
        with pytest.raises(ValueError, match=f"ordered_label_steps={bad}: expected 0"):
            dataclasses.replace(recipe("llama"), shuffle_labels=bad < 0, ordered_label_steps=bad)


def test_ordered_label_steps_keep_the_labels_in_order_then_shuffle():
    """The curriculum: its first steps train exactly as the in-order task does (same
    weights), the step after them does not."""
    shuffled = dataclasses.replace(
        recipe("llama"), layout="label_last", shuffle_labels=True, ordered_label_steps=2, max_steps=3, eval_every=3, batch_size=8
    )
    in_order = dataclasses.replace(shuffled, shuffle_labels=False, ordered_label_steps=0)

    def weights(r, steps):
        trained = train(r, max_steps=steps, progress=False, log=lambda _: None).model.state_dict()
        return {k: v.clone() for k, v in trained.items()}

    first, reference = weights(shuffled, 2), weights(in_order, 2)
    assert all(torch.equal(first[k], reference[k]) for k in first)
    after, reference = weights(shuffled, 3), weights(in_order, 3)
    assert any(not torch.equal(after[k], reference[k]) for k in after)


@pytest.mark.slow
def test_cli_zoo_train_end_to_end(tmp_path, capsys):
    out = tmp_path / "toy"
    assert main(["zoo", "train", "llama", "--max-steps", "3", "--out", str(out), "--quiet"]) == 0  # in-process: the console script's path
    assert "model card:" in capsys.readouterr().out
    card = json.loads((out / "card.json").read_text())
    assert card["steps"] == 3 and card["seed"] == recipe("llama").seed and 0 <= card["held_out_accuracy"] <= 1
    assert card["task"] == task_shape(recipe("llama"))
    model = gna.load(str(out))
    assert model.n_layers == recipe("llama").config["num_hidden_layers"]
    assert (out / "README.md").read_text().startswith("# Toy model `llama`")
    assert "steps | 3 " in (out / "README.md").read_text()


def test_cli_zoo_errors(tmp_path, capsys):
    file = tmp_path / "a_file"
    file.write_text("x")
    for args, message in [
        (["zoo", "train", "gpt5"], "unknown toy model 'gpt5'"),
        (["zoo", "train", "llama", "--out", str(file)], "is an existing file"),
    ]:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_interrupted_training_resumes_to_the_same_weights(tmp_path):
    short = dataclasses.replace(recipe("llama"), max_steps=6, eval_every=2, batch_size=8, target_accuracy=2.0)
    quiet = dict(progress=False, log=lambda _: None)
    whole = train(short, **quiet).model.state_dict()
    checkpoint = tmp_path / "run.pt"
    train(short, max_steps=4, checkpoint=checkpoint, **quiet)  # "interrupted" after step 4
    resumed = train(short, checkpoint=checkpoint, **quiet)
    assert resumed.steps == 6 and [row["step"] for row in resumed.history] == [2, 4, 6]
    assert all(torch.equal(whole[k], resumed.model.state_dict()[k]) for k in whole)
    with pytest.raises(ValueError, match="written for another recipe"):
        train(dataclasses.replace(short, lr=1.0), checkpoint=checkpoint, **quiet)


def _resumes_from_older_checkpoint(checkpoint, trained, variant, missing_fields) -> bool:
    """Train ``trained`` for 2 steps into ``checkpoint``, drop ``missing_fields`` from its
    stored recipe (as a checkpoint written before they existed), then resume under
    ``variant``: whether it resumes (to step 4) or is refused."""
    quiet = dict(progress=False, log=lambda _: None)
    train(trained, max_steps=2, checkpoint=checkpoint, **quiet)
    state = torch.load(checkpoint, weights_only=False)
    for key in missing_fields:
        del state["recipe"][key]
    torch.save(state, checkpoint)
    try:
        assert train(variant, checkpoint=checkpoint, **quiet).steps == 4
    except ValueError as error:
        assert "written for another recipe" in str(error)
        return False
    return True


def test_checkpoints_from_before_the_task_fields_resume_only_for_the_default_task(tmp_path):
    """A checkpoint written before `Recipe` had ``layout`` / ``vary_lengths`` /
    ``shuffle_labels`` was trained on the default task: it resumes under a default
    recipe and is refused under another task."""
    short = dataclasses.replace(
        recipe("llama"), layout="label_first", shuffle_labels=False, max_steps=4, eval_every=2, batch_size=8, target_accuracy=2.0
    )
    missing = ("layout", "vary_lengths", "shuffle_labels", "ordered_label_steps")
    assert _resumes_from_older_checkpoint(tmp_path / "same.pt", short, short, missing)
    assert not _resumes_from_older_checkpoint(tmp_path / "other.pt", short, dataclasses.replace(short, layout="label_last"), missing)


def test_checkpoints_from_before_the_curriculum_resume_only_without_it(tmp_path):
    """A checkpoint written before ``ordered_label_steps`` existed had no curriculum."""
    shuffled = dataclasses.replace(
        recipe("llama"), layout="label_last", shuffle_labels=True, max_steps=4, eval_every=2, batch_size=8, target_accuracy=2.0
    )
    missing = ("ordered_label_steps",)
    assert _resumes_from_older_checkpoint(tmp_path / "plain.pt", shuffled, shuffled, missing)
    curriculum = dataclasses.replace(shuffled, ordered_label_steps=1)
    assert not _resumes_from_older_checkpoint(tmp_path / "curriculum.pt", shuffled, curriculum, missing)


def test_docs_quote_the_cards():
    """The zoo table in the docs is generated from the bundled cards (`gna-interp zoo list --markdown`)."""
    from pathlib import Path

    from gna_interp.zoo.store import zoo_table_markdown

    docs = (Path(__file__).resolve().parent.parent / "docs" / "toys.md").read_text()
    assert zoo_table_markdown() in docs


def test_learning_rate_schedule():
    from gna_interp.zoo.train import lr_factor

    plain = dataclasses.replace(recipe("mamba2_counting"), warmup_steps=10, decay_start=None)
    assert [lr_factor(plain, s) for s in (0, 4, 9, 500)] == [0.1, 0.5, 1.0, 1.0]
    decayed = dataclasses.replace(plain, decay_start=100, decay_steps=50)
    assert [lr_factor(decayed, s) for s in (99, 100, 125, 150, 400)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    restarted = dataclasses.replace(decayed, more_phases=((20, 0.5, 0.5), (10, 0.5, 0.0)))
    assert [lr_factor(restarted, s) for s in (149, 150, 169, 170, 175, 180, 500)] == pytest.approx([0.02, 0.5, 0.5, 0.5, 0.25, 0.0, 0.0])


def test_card_facts_of_wide_layers_double_and_ablate_whole_layers(monkeypatch):
    """A layer wider than `DOUBLING_ABOVE` gets its smallest set at doubling sizes (each point
    re-measured here through `evaluate`), and every layer its heads ablated together,
    everywhere, at the final position and at the segment ends; the card shows both."""
    from gna_interp.zoo import card

    monkeypatch.setattr(card, "DOUBLING_ABOVE", 2)  # the llama toy's 4-head layer 0 counts as wide
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 40, seed=FRESH_SEED)
    facts = card.ablation_facts(model, task)
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    order = sorted((h for h in model.heads if h.layer == 0), key=lambda h: facts.single_head[str(h)])
    row = facts.smallest_sets[0]
    sizes = [int(k) for k, _ in row["curve"]]
    assert sizes == [1, 2, 4][: len(sizes)] and row["heads"] == [str(h) for h in order[: sizes[-1]]]
    for size, accuracy in row["curve"]:
        assert accuracy == gna.evaluate(model, task, [gna.Ablate(order[: int(size)])], progress=False).accuracy
    assert row["reached_chance"] == (row["accuracy"] <= facts.chance + card.CHANCE_MARGIN)
    for layer in range(model.n_layers):
        heads = [h for h in model.heads if h.layer == layer]
        expected = {
            "all": gna.Ablate(heads),
            "final": gna.Ablate(heads, positions=encoded.final),
            "ends": gna.Ablate(heads, positions=encoded.segment_ends),
        }
        for where, ablate in expected.items():
            assert facts.layer_ablation[layer][where] == gna.evaluate(model, task, [ablate], progress=False).accuracy, (layer, where)
    markdown = card_markdown({**gna.toy_card("llama"), "ablation": facts.to_dict(), "ablation_n": 40})
    assert f"- layer 0: {sizes[0]} -> {row['curve'][0][1]:.3f}" in markdown
    assert f"| 1 | {facts.layer_ablation[1]['all']:.3f} | {facts.layer_ablation[1]['final']:.3f} |" in markdown
    assert "Ablations measured on 40 held-out prompts" in markdown


def test_a_gpu_recipe_on_a_machine_without_one_is_refused_by_name(tmp_path, monkeypatch):
    """The bundled Mamba-1 recipe trains on a GPU; without one, `build_toy` names the way out
    before any training (and writes nothing but the folder)."""
    from gna_interp.zoo.build import build_toy

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert recipe("mamba").device == "cuda"
    with pytest.raises(ValueError, match=r"device='cuda': recipe 'mamba' trains on a GPU .* device='cpu' \(CLI: --device cpu\)"):
        build_toy(recipe("mamba"), tmp_path / "out", progress=False)
    assert not any((tmp_path / "out").iterdir())


def test_a_gpu_trained_card_says_so():
    """The Mamba-1 card and the zoo table name the GPU; CPU cards keep their thread count."""
    from gna_interp.zoo.store import zoo_table_markdown

    gpu_card, cpu_card = gna.toy_card("mamba"), gna.toy_card("llama")
    assert gpu_card["device"] == "cuda" and cpu_card.get("device", "cpu") == "cpu"
    assert f"| training time | {gpu_card['train_seconds']:.0f} s on a GPU ({gpu_card['machine']}) |" in card_markdown(gpu_card)
    assert f"s on {cpu_card['threads']} CPU thread(s) |" in card_markdown(cpu_card)
    assert f"| {gpu_card['train_seconds']:.0f} s (GPU) |" in zoo_table_markdown()
