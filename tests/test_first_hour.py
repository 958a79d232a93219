"""A researcher's first hour: the public API called slightly wrong, as a new user does.
Each slip gets a message that names the argument, the value and what was expected (or,
where the intent is plain, is accepted), and leaves no hook on the model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import gna_interp as gna
from gna_interp.discovery import GnaCircuit
from gna_interp.zoo.store import toy_path

from .conftest import CLEAN, CORRUPT, no_hooks_left


@pytest.fixture(scope="module")
def toy():
    """The bundled Llama toy (nnsight: the quicker load)."""
    return gna.load_toy("llama", backend="nnsight")


@pytest.fixture(scope="module")
def task():
    return gna.tasks.toy_mcq(4, seed=0)


def untouched(model) -> bool:
    return no_hooks_left(model) and not model.active_interventions


# ----- toy_task / toy_card / load_toy given a model ---------------------------------------


def test_toy_task_and_card_accept_a_model_loaded_from_the_zoo(toy):
    """`gna.toy_task(model, n)` with the model `load_toy` returned: the same prompts as by name."""
    assert gna.toy_task(toy, 6, seed=3).prompts == gna.toy_task("llama", 6, seed=3).prompts
    assert gna.toy_card(toy) == json.loads((toy_path("llama") / "card.json").read_text())


def test_toy_task_accepts_a_model_loaded_from_a_trained_folder(tmp_path):
    """A toy folder outside the zoo (as ``gna-interp zoo train`` writes): its own card's task."""
    folder = tmp_path / "my-toy"
    shutil.copytree(toy_path("llama"), folder)
    card = json.loads((folder / "card.json").read_text())
    card["task"] = {**card.get("task", {}), "n_options": 3}  # a task shape the bundled card lacks
    (folder / "card.json").write_text(json.dumps(card))
    model = gna.load(str(folder), backend="nnsight")
    by_model, by_folder = gna.toy_task(model, 5, seed=1), gna.toy_task(folder, 5, seed=1)
    assert by_model.prompts == by_folder.prompts
    assert all(len(example.candidates) == 3 for example in by_model.examples)
    assert gna.toy_card(model)["task"]["n_options"] == 3


def test_toy_functions_name_what_they_were_given(llama_tlens, toy):
    names = r"expected a toy name from gna.toy_names\(\) \(falcon_h1, falcon_h1_counting, llama, .*\) or a folder holding card.json"
    in_memory = r"toy_task\(name=GnaModel\('LlamaForCausalLM'.*\)\): this GnaModel was not loaded from a toy's folder "
    with pytest.raises(TypeError, match=rf"{in_memory}.*{names}"):
        gna.toy_task(llama_tlens, 16)  # built in memory: it names no toy
    with pytest.raises(TypeError, match=r"toy_card\(name=GnaModel\(.*\): this GnaModel was not loaded"):
        gna.toy_card(llama_tlens)
    with pytest.raises(TypeError, match=rf"toy_task\(name=16\) \(int\): {names}"):
        gna.toy_task(16)  # type: ignore[arg-type]
    loaded = r"load_toy\(name=GnaModel\('toy-llama'.*\) \(GnaModel\) \(already a loaded model: use it as it is\)"
    with pytest.raises(TypeError, match=rf"{loaded}: expected a toy name"):
        gna.load_toy(toy)  # type: ignore[arg-type]
    assert untouched(toy) and untouched(llama_tlens)


def test_toy_functions_take_any_path_like():
    """A toy's folder as a `Path` or any `os.PathLike` is read as that folder (as `load` reads it)."""
    import os

    from gna_interp.zoo.store import toy_path

    class Where(os.PathLike):
        def __init__(self, path):
            self.path = path

        def __fspath__(self):
            return str(self.path)

    folder = toy_path("llama")
    assert gna.toy_card(Where(folder)) == gna.toy_card("llama")
    assert gna.toy_task(Where(folder), 4, seed=1).prompts == gna.toy_task("llama", 4, seed=1).prompts
    model = gna.load_toy(folder)
    assert torch.equal(model.logits(gna.toy_task("llama", 2).prompts), gna.load_toy("llama").logits(gna.toy_task("llama", 2).prompts))


# ----- heads, targets and interventions: the forms a new user writes ------------------------


@pytest.mark.parametrize("sweep", ["ablation", "patching"])
def test_a_string_of_heads_is_refused_not_read_letter_by_letter(llama_tlens, sweep):
    metric = gna.logit_diff(5, 6)

    def run(heads):
        if sweep == "ablation":
            return gna.ablation_sweep(llama_tlens, CLEAN, None, metric, heads=heads, progress=False)
        return gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, metric, heads=heads, progress=False)

    typed = r"e.g. \[gna.Head\(layer=1, head=0\)\] \(gna.Head.parse\('L1H0'\) builds it\)"
    with pytest.raises(TypeError, match=rf"heads is the string 'L1H0': expected gna_interp.Head values, {typed}"):
        run("L1H0")
    with pytest.raises(TypeError, match=r"heads must contain gna_interp.Head values, got \(1, 0\) \(tuple\) \(gna.Head\(1, 0\) builds"):
        run([gna.Head(0, 0), (1, 0)])
    with pytest.raises(TypeError, match=r"heads must contain gna_interp.Head values, got Resid\(layer=1\) \(Resid\)"):
        run([gna.Resid(1)])
    assert untouched(llama_tlens)


def test_one_head_sweeps_as_a_list_of_one(llama_tlens):
    """``heads=gna.Head(1, 0)``: that head alone; its score is the metric with it zero-ablated."""
    metric = gna.logit_diff(5, 6)
    head = gna.Head(1, 0)
    one = gna.ablation_sweep(llama_tlens, CLEAN, None, metric, heads=head, progress=False)
    expected = float(metric(llama_tlens.logits(CLEAN, [gna.Ablate([head])])).mean())
    assert one.scores[1, 0].item() == pytest.approx(expected, abs=1e-5)
    assert int(torch.isfinite(one.scores).sum()) == 1
    patched = gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, metric, heads=head, progress=False)
    listed = gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, metric, heads=[head], progress=False)
    torch.testing.assert_close(patched.scores, listed.scores, rtol=0, atol=0, equal_nan=True)
    denoised = float(metric(llama_tlens.logits(CORRUPT, [gna.Patch(head, source=CLEAN)])).mean())
    assert patched.scores[1, 0].item() == pytest.approx(denoised, abs=1e-5)


def test_one_intervention_needs_no_list_in_sweeps_and_patterns(llama_tlens):
    """``interventions=gna.Truncate(2)`` as ``[gna.Truncate(2)]``, as `evaluate` and `logits` take it."""
    metric = gna.logit_diff(5, 6)
    truncate = gna.Truncate(2)
    sweep = gna.ablation_sweep(llama_tlens, CLEAN, None, metric, heads=[gna.Head(0, 1)], interventions=truncate, progress=False)
    assert sweep.baseline == pytest.approx(float(metric(llama_tlens.logits(CLEAN, [truncate])).mean()), abs=1e-5)
    patch = gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, metric, heads=[gna.Head(0, 1)], interventions=truncate, progress=False)
    assert patch.baseline == pytest.approx(float(metric(llama_tlens.logits(CORRUPT, [truncate])).mean()), abs=1e-5)
    single = gna.attention_pattern(llama_tlens, CLEAN, gna.Head(1, 2), query_positions=[-1], interventions=gna.Ablate([gna.Head(0, 0)]))
    listed = gna.attention_pattern(llama_tlens, CLEAN, gna.Head(1, 2), query_positions=[-1], interventions=[gna.Ablate([gna.Head(0, 0)])])
    plain = gna.attention_pattern(llama_tlens, CLEAN, gna.Head(1, 2), query_positions=[-1])
    assert torch.equal(single, listed) and not torch.allclose(single, plain)  # applied, not dropped
    assert untouched(llama_tlens)


def test_capture_takes_one_target_and_names_a_string(llama_tlens):
    head = gna.Head(1, 0)
    one = llama_tlens.cache(CLEAN, head)
    assert list(one) == [head] and torch.equal(one[head], llama_tlens.cache(CLEAN, [head])[head])
    _, acts = llama_tlens.run(CLEAN, capture=gna.Resid(1))
    assert torch.equal(acts[gna.Resid(1)], llama_tlens.cache(CLEAN, [gna.Resid(1)])[gna.Resid(1)])
    with pytest.raises(TypeError, match=r"targets is the string 'L1H0': expected gna_interp.Head values, .*Head.parse\('L1H0'\) builds it"):
        llama_tlens.cache(CLEAN, "L1H0")
    with pytest.raises(TypeError, match=r"capture is the string 'L1H0'"):
        llama_tlens.run(CLEAN, capture="L1H0")
    with pytest.raises(TypeError, match=r"expected a Head or Resid, got 'L1H0': gna.Head.parse\('L1H0'\) builds it"):
        llama_tlens.cache(CLEAN, ["L1H0"])
    with pytest.raises(TypeError, match=r"expected a Head or Resid, got \(1, 0\): gna.Head\(1, 0\) builds it"):
        llama_tlens.cache(CLEAN, [(1, 0)])
    with pytest.raises(TypeError, match=r"capture=3 \(int\): expected a Head or Resid, or a list of them"):
        llama_tlens.run(CLEAN, capture=3)
    assert untouched(llama_tlens)


def test_head_parse_and_keep_only_name_the_slip():
    with pytest.raises(TypeError, match=r"Head.parse\(text=5\) \(int\): expected a string such as 'L16H22'; Head\(layer, head\) takes"):
        gna.Head.parse(5)  # type: ignore[arg-type]
    # the typo is reported first, before anything else about the call
    with pytest.raises(TypeError, match=r"KeepOnly heads is the string 'L1H0': expected gna_interp.Head values"):
        gna.KeepOnly("L1H0")  # type: ignore[arg-type]


# ----- the model and the task, in their places -----------------------------------------------


def test_a_model_that_is_not_loaded_or_comes_second_is_named(llama_tlens, task):
    loaded = r"expected a gna_interp GnaModel; load it first: gna.load\('llama'\) \(a hub id or folder\) or gna.load_toy\('llama'\)"
    with pytest.raises(TypeError, match=rf"evaluate: model='llama' \(str\): {loaded}"):
        gna.evaluate("llama", task)  # type: ignore[arg-type]
    swapped = r"model=Task\('toy_mcq', 4 prompts, 4 segments\) \(Task\): expected a gna_interp GnaModel; the task came first"
    with pytest.raises(TypeError, match=rf"evaluate: {swapped}: evaluate\(model, task, ...\) takes the model first"):
        gna.evaluate(task, llama_tlens)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=rf"ablation_sweep: {swapped}"):
        gna.ablation_sweep(task, CLEAN, None, gna.logit_diff(5, 6))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=rf"patching_sweep: {swapped}"):
        gna.patching_sweep(task, CLEAN, CORRUPT, gna.logit_diff(5, 6))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=rf"attention_pattern: {swapped}"):
        gna.attention_pattern(task, llama_tlens, [gna.Head(0, 0)])  # type: ignore[arg-type]
    wrap = r"expected a gna_interp GnaModel; wrap a transformers model with gna.load\(hf_model, tokenizer=...\)"
    with pytest.raises(TypeError, match=rf"ablation_sweep: model=<a LlamaForCausalLM> \(LlamaForCausalLM\): {wrap}"):
        gna.ablation_sweep(llama_tlens.hf_model, CLEAN, None, gna.logit_diff(5, 6))
    meter = r"cost_meter: model='llama' \(str\): expected a gna_interp GnaModel; load it first: gna.load_toy\('llama'\)"
    with pytest.raises(TypeError, match=meter), gna.cost_meter("llama"):
        pass
    assert untouched(llama_tlens)


def test_prompts_or_a_name_where_a_task_is_expected(llama_tlens, task):
    expected = r"expected a gna_interp Task with prompts and answers, e.g. gna.toy_task\('llama'\)"
    no_answers = r"; prompts alone have no answers to score: model.logits\(prompts\)"
    with pytest.raises(TypeError, match=rf"evaluate: task=\['Query: .*\.\.\. \(list\): {expected}.*{no_answers}"):
        gna.evaluate(llama_tlens, task.prompts)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=rf"evaluate: task='llama' \(str\): {expected}.*gna.toy_task\(name\) .*not its name 'llama'"):
        gna.evaluate(llama_tlens, "llama")  # type: ignore[arg-type]
    many = [f"w{5 + i} w{6 + i} w{7 + i}" for i in range(50)]
    for call in (
        lambda: gna.faithfulness_curve(llama_tlens, many, [gna.Head(1, 0)]),
        lambda: gna.retention_curve(llama_tlens, many, [gna.Head(1, 0)]),
    ):
        with pytest.raises(TypeError, match=rf"_curve: task=\['w5 w6 w7', .*\.\.\. \(list\): {expected}") as raised:
            call()
        assert len(str(raised.value)) < 400  # the prompts are cut, not printed in full
    with pytest.raises(TypeError, match=r"shuffle_labels: task=\['Query: .*\(list\): expected a gna_interp Task"):
        gna.tasks.shuffle_labels(task.prompts)  # type: ignore[arg-type]
    assert untouched(llama_tlens)


# ----- what the analysis helpers are given -----------------------------------------------------


def test_sharpness_metrics_name_a_pattern_that_is_not_a_tensor(task):
    expected = r"expected a tensor \[\.\.\., key\] of attention weights, e.g. gna.attention_pattern\(model, task, heads, query_positions"
    with pytest.raises(TypeError, match=rf"entropy: pattern=Task\('toy_mcq', 4 prompts, 4 segments\) \(Task\): {expected}"):
        gna.attention.entropy(task)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=rf"top1_mass: pattern=\[\[0.5, 0.5\]\] \(list\): {expected}"):
        gna.attention.top1_mass([[0.5, 0.5]])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=rf"mass_on: pattern=Task\(.*\(Task\): {expected}"):
        gna.attention.mass_on(task, [0])  # type: ignore[arg-type]
    assert gna.attention.entropy(torch.tensor([[0.5, 0.5]])).item() == pytest.approx(
        float(torch.log(torch.tensor(2.0)))
    )  # tensors still work


def test_write_report_names_a_bare_circuit_before_making_the_folder(tmp_path):
    circuit = GnaCircuit(model="toy-x", family="llama", task="t", n_prompts=1, gather=[], aggregate=[], heads=[], accuracy={}, needs={})
    out = tmp_path / "report"
    expected = r"expected a list of \(circuit, model, task\) tuples, e.g. \[\(circuit, model, task\)\]"
    with pytest.raises(TypeError, match=rf"write_report: items is one GnaCircuit \('toy-x'\): {expected}"):
        gna.write_report(circuit, out)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=rf"write_report: items\[1\]=GnaCircuit\(.*\.\.\. \(GnaCircuit\): {expected}"):
        gna.write_report([(circuit, None, None), circuit], out)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=rf"write_report: items='report' \(str\): {expected}"):
        gna.write_report("report", out)  # type: ignore[arg-type]
    assert not out.exists()
