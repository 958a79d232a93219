"""lm-eval tasks through `gna.lm_eval`: the same accuracy as `gna.evaluate` on the same
rows (bundled toys, clean and under interventions), lm-eval's own MMLU config, a
generative task, the ``gna`` model in lm-eval's CLI, and no residue. Offline: every task
reads a local JSONL file written here."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gna_interp as gna

from .conftest import no_hooks_anywhere

lm_eval = pytest.importorskip("lm_eval")

N = 24
SEED = 4321
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def toys():
    return {name: gna.load_toy(name) for name in ("llama", "mamba2", "falcon_h1")}


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    """``toy_llama`` / ``toy_mamba2`` (each toy's own prompts, exported), ``toy_llama_gen``
    (the same prompts as a one-token generation) and ``mmlu_toy`` (lm-eval's own MMLU
    anatomy config over the hybrid toy's prompts in ``cais/mmlu``'s schema)."""
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    for name in ("llama", "mamba2"):
        gna.harness.write_task(gna.toy_task(name, N, seed=SEED), folder, f"toy_{name}")
    gna.harness.write_task(gna.toy_task("llama", N, seed=SEED), folder, "toy_llama_gen", generative=True, max_gen_toks=1)
    rows = [
        {"question": e.meta["header"], "subject": "anatomy", "choices": e.meta["options"], "answer": e.correct}
        for e in gna.toy_task("falcon_h1", N, seed=SEED)
    ]
    (folder / "mmlu_rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    anatomy = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "default" / "mmlu_anatomy.yaml"
    config = {
        "include": str(anatomy),
        "task": "mmlu_toy",
        "tag": None,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": str(folder / "mmlu_rows.jsonl")}},
        "fewshot_split": None,
    }
    (folder / "mmlu_toy.yaml").write_text(json.dumps(config))
    return folder


def per_document(run: gna.LMEvalRun, task: str) -> tuple[torch.Tensor, list[str]]:
    """``[doc, choice]`` log-likelihoods lm-eval recorded, and each document's context."""
    samples = sorted(run.results["samples"][task], key=lambda s: s["doc_id"])
    scores = torch.tensor([[resp[0][0] for resp in s["resps"]] for s in samples])
    return scores, [s["arguments"][0][0] for s in samples]


def check_parity(model, task_name, task, interventions, tasks_dir):
    """lm-eval's accuracy is evaluate's, document by document, with the same scores."""
    run = gna.lm_eval(model, task_name, interventions, include_path=tasks_dir, log_samples=True)
    ours = gna.evaluate(model, task, interventions)
    scores, contexts = per_document(run, task_name)
    assert contexts == task.prompts
    assert torch.allclose(scores, ours.scores, atol=1e-4)
    accuracy = run.frame.set_index("metric").loc["acc", "value"]
    assert accuracy * N == pytest.approx(int(ours.is_correct.sum()))
    return accuracy


@pytest.mark.parametrize("name", ["llama", "mamba2"])
def test_toy_parity_clean_and_ablated(name, toys, tasks_dir):
    """Clean and with the card's most harmful head ablated (an explicit Ablate, and the
    same head through ``model.ablated``): the drop is real and identical on both sides."""
    model, task = toys[name], gna.toy_task(name, N, seed=SEED)
    head = gna.Head.parse(gna.toy_card(name)["ablation"]["best_single_head"])
    clean = check_parity(model, f"toy_{name}", task, [], tasks_dir)
    ablated = check_parity(model, f"toy_{name}", task, [gna.Ablate([head])], tasks_dir)
    with model.ablated([head]):
        in_context = gna.lm_eval(model, f"toy_{name}", include_path=tasks_dir)
    assert in_context.label == f"-{head}" and in_context.frame["value"].iloc[0] == ablated
    assert clean - ablated > 0.4, (clean, ablated)


# MMLU's header words are outside the toy's vocabulary (they become <unk> in both pipelines alike).
@pytest.mark.filterwarnings("ignore::gna_interp.core.inputs.UnknownWordsWarning")
def test_lm_eval_mmlu_config_parity_on_the_hybrid(toys, tasks_dir):
    """lm-eval's own ``mmlu_anatomy`` config (its description and template) over local rows
    builds exactly the prompts of ``gna.tasks.mmlu``; the hybrid toy scores them the same
    clean, with the final attention row masked, and with a head ablated."""
    model = toys["falcon_h1"]
    task = gna.tasks.mmlu("anatomy", path=tasks_dir / "mmlu_rows.jsonl")
    assert task.prompts[0].startswith("The following are multiple choice questions (with answers) about anatomy.\n\nQuery: ")
    clean = check_parity(model, "mmlu_toy", task, [], tasks_dir)
    masked = check_parity(model, "mmlu_toy", task, [gna.MaskAttentionRows(-1)], tasks_dir)
    check_parity(model, "mmlu_toy", task, [gna.Ablate([gna.Head(0, 1)])], tasks_dir)
    assert masked < clean


def test_generative_task_is_the_full_vocabulary_argmax(toys, tasks_dir):
    """A one-token generation scores exact_match 1 exactly where the model's argmax over
    its whole vocabulary is the correct letter: an identity on evaluate's logits."""
    model, task = toys["llama"], gna.toy_task("llama", N, seed=SEED)
    head = gna.Head.parse(gna.toy_card("llama")["ablation"]["best_single_head"])
    encoded = task.encode(model.tokenizer)
    table = gna.lm_eval_table(model, "toy_llama_gen", {"ablated": [gna.Ablate([head])]}, metric="exact_match", include_path=tasks_dir)
    for label, interventions in (("clean", []), ("ablated", [gna.Ablate([head])])):
        top = model.logits(task, interventions)[:, -1].argmax(-1)
        expected = float((top == encoded.candidate_ids[torch.arange(N), encoded.correct]).float().mean())
        assert table.table.loc["toy_llama_gen", label] == pytest.approx(expected)
    assert list(table.table.columns) == ["clean", "ablated"] and table.frame["stderr"].notna().all()


@pytest.mark.slow
def test_cli_runs_the_gna_model(toys, tasks_dir, tmp_path):
    """lm-eval's own CLI (through the launcher that registers ``gna``), in a subprocess,
    gives the accuracy `gna.lm_eval` gives in-process."""
    out = tmp_path / "out"
    args = ["--model", "gna", "--model_args", "pretrained=toy:mamba2,ablate=L1H6+L0H0,batch_size=8"]
    args += ["--tasks", "toy_mamba2", "--include_path", str(tasks_dir), "--limit", "12", "--output_path", str(out), "--no_builtin_tasks"]
    result = subprocess.run(
        [sys.executable, "-m", "gna_interp.harness", *args], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (written,) = out.rglob("results_*.json")
    cli_accuracy = json.loads(written.read_text())["results"]["toy_mamba2"]["acc,none"]
    heads = [gna.Head(1, 6), gna.Head(0, 0)]
    ours = gna.lm_eval(toys["mamba2"], "toy_mamba2", [gna.Ablate(heads)], limit=12, include_path=tasks_dir)
    assert cli_accuracy == ours.frame["value"].iloc[0]
    assert re.search(r"\|toy_mamba2\|", result.stdout.replace(" ", "")), result.stdout


class Boom(RuntimeError):
    pass


def hook_counts(module: torch.nn.Module) -> dict[str, tuple[int, int, int]]:
    """Per submodule: its forward, forward-pre and backward hooks (the TransformerLens
    bridge keeps some of its own; nnsight's and ours must all be gone)."""
    return {
        name: (len(m._forward_hooks), len(m._forward_pre_hooks), len(getattr(m, "_backward_hooks", None) or {}))
        for name, m in module.named_modules()
    }


@pytest.mark.parametrize("name", ["llama", "mamba2"])
def test_no_residue_after_finishing_or_raising(name, toys, tasks_dir):
    """After a run and after one that fails in its third forward: no active intervention,
    no hook on any module, the same logits."""
    model, task = toys[name], gna.toy_task(name, 4, seed=1)
    before, hooks_before = model.logits(task), hook_counts(model.hf_model)
    head = gna.Head.parse(gna.toy_card(name)["ablation"]["best_single_head"])
    with model.ablated([gna.Head(0, 0)]):
        gna.lm_eval(
            model,
            f"toy_{name}",
            [gna.Ablate([head]), gna.Ablate([gna.Head(0, 1)], positions=-1)],
            limit=6,
            include_path=tasks_dir,
            batch_size=2,
        )
    calls = {"n": 0}

    def explode(module, args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Boom("failed in the third forward")

    trap = model.hf_model.get_output_embeddings().register_forward_pre_hook(explode)
    try:
        with pytest.raises(Boom), model.ablated([head]):
            gna.lm_eval(model, f"toy_{name}", [gna.Ablate([gna.Head(0, 1)])], limit=6, include_path=tasks_dir, batch_size=2)
    finally:
        trap.remove()
    assert calls["n"] == 3 and not model.active_interventions
    assert hook_counts(model.hf_model) == hooks_before
    if model.backend_name == "tlens":
        assert all(not hp._forward_hooks for hp in model.backend.bridge.hook_dict.values())
    else:
        assert no_hooks_anywhere(model.hf_model)
    assert torch.equal(model.logits(task), before)


def test_bad_calls(toys, tasks_dir):
    model = toys["llama"]
    with pytest.raises(ValueError, match="limit=0"):
        gna.lm_eval(model, "toy_llama", limit=0, include_path=tasks_dir)
    with pytest.raises(ValueError, match="is not a folder"):
        gna.lm_eval(model, "toy_llama", include_path=tasks_dir / "nowhere")
    with pytest.raises(ValueError, match="tasks is empty"):
        gna.lm_eval(model, [], include_path=tasks_dir)
    with pytest.raises(ValueError, match="'clean' is taken"):
        gna.lm_eval_table(model, "toy_llama", {"clean": []}, include_path=tasks_dir)
    with pytest.raises(ValueError, match="task name 'a b'"):
        gna.harness.write_task(gna.toy_task("llama", 2), tasks_dir, "a b")


def test_example_paper_table(capsys, monkeypatch):
    """examples/lm_eval_table.py on a few prompts: each toy's table, lm-eval's numbers
    equal to evaluate's (the script checks and prints it)."""
    monkeypatch.setenv("GNA_EXAMPLE_N", "16")
    runpy.run_path(str(ROOT / "examples" / "lm_eval_table.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert printed.count("same as gna.evaluate: True") == 3 and "-Aggregate" in printed, printed


def test_overhead_benchmark_runs(tmp_path, monkeypatch):
    """benchmarks/lm_eval_overhead.py end to end on a few prompts (its figures in
    docs/harness.md come from it); it exits 1 unless both accuracies agree."""
    out = tmp_path / "figures.json"
    argv = ["lm_eval_overhead.py", "--prompts", "8", "--repeats", "1", "--threads", "1", "--no-builtin-index", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # what `python benchmarks/x.py` puts first (it imports _common)
    with pytest.raises(SystemExit) as exit_code:
        runpy.run_path(str(ROOT / "benchmarks" / "lm_eval_overhead.py"), run_name="__main__")
    figures = json.loads(out.read_text())
    assert exit_code.value.code == 0 and figures["same"] and figures["lm_eval_s"] > 0 and "index_builtin_tasks_s" not in figures
