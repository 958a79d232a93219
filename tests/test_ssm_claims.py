"""benchmarks/ssm_claims.py's building blocks: its KV prompts are the library's KV prompts
tokenized, and its by-hand layer swap is exact and leaves the student as it was."""

from __future__ import annotations

import copy
import json
import runpy
from pathlib import Path

import pytest
import torch

import gna_interp as gna
from gna_interp.tasks.kv import kv_example
from gna_interp.tasks.toy import toy_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield runpy.run_path(str(ROOT / "benchmarks" / "ssm_claims.py"))
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_kv_ids_are_the_tokenized_kv_prompts(bench):
    ids, answer, values = bench["kv_ids"](3, 5, torch.Generator().manual_seed(0))
    tokenizer = toy_tokenizer()
    for row in range(3):
        words = tokenizer.convert_ids_to_tokens(ids[row].tolist())
        keys = [words[7 + 4 * i] for i in range(5)]
        numbers = [int(words[9 + 4 * i]) for i in range(5)]
        example = kv_example(keys, numbers, keys.index(words[-3]))
        assert tokenizer(example.text).input_ids == ids[row].tolist()
        assert tokenizer(example.candidates[example.correct], add_special_tokens=False).input_ids == [int(answer[row])]
        assert values[row].tolist() == [tokenizer.convert_tokens_to_ids(str(n)) for n in numbers]


@pytest.mark.slow  # about 7 s on the shared machine (loads and hybridizes llama_4x8)
def test_blocks_swapped_gives_the_teacher_and_restores_the_student(bench):
    teacher = gna.load_toy("llama_4x8")
    student = gna.hybridize(teacher, [], init="attention", combine="sum")
    ids = gna.toy_task("llama_4x8", 8, seed=3).encode().batch.input_ids
    with torch.no_grad():
        before, wanted = student.hf_model(input_ids=ids).logits, teacher.hf_model(input_ids=ids).logits
        with bench["blocks_swapped"](student.hf_model, teacher.hf_model, (0, 1, 2, 3)):
            swapped = student.hf_model(input_ids=ids).logits
        with pytest.raises(RuntimeError), bench["blocks_swapped"](student.hf_model, teacher.hf_model, (2,)):
            raise RuntimeError("inside")
        after = student.hf_model(input_ids=ids).logits
    torch.testing.assert_close(swapped, wanted)
    assert (before - wanted).abs().max() > 1.0  # the student alone is not the teacher
    assert torch.equal(after, before)
    assert all(type(block).__name__ == "HybridStudentLayer" for block in student.hf_model.model.layers)


@pytest.fixture(scope="module")
def verdicts_module():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield runpy.run_path(str(ROOT / "benchmarks" / "ssm_verdicts.py"))
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_newcombe_interval_matches_the_published_example():
    """Newcombe (1998, Stat. Med. 17:873, table II, example (a)): 56/70 - 48/80, hybrid score
    interval at 95%: 0.0524 to 0.3339."""
    from gna_interp.scoring.verdicts import newcombe_interval

    lo, hi = newcombe_interval(56, 70, 48, 80, level=0.95)
    assert (lo, hi) == pytest.approx((0.0524, 0.3339), abs=1e-4)


def test_the_skill_gap_is_not_measured_until_a_transformer_learns(verdicts_module):
    """(d) on the recorded figures: no Llama is above chance + 0.1 at any trained pair count
    (Wilson, checked here per row), so "not measured", never "reversed"; with a Llama that
    learnt (0.9 at 2 pairs, 0.5 at 16), the comparison is made, and the Mamba-2 ahead reads "no: reversed"."""
    from gna_interp.scoring.verdicts import wilson_interval

    d = json.loads((ROOT / "benchmarks" / "results" / "ssm_claims.json").read_text())["d"]
    n = d["held_out"]
    for row in (r for r in d["models"].values() if r["family"] == "llama"):
        for p in map(str, d["pairs_trained"]):
            assert wilson_interval(round(row["accuracy"][p] * n), n)[0] <= row["chance"][p] + 0.1
    claim = verdicts_module["skill_gap"](d)
    assert claim["word"] == "not measured" and "no Transformer learnt the task" in claim["text"]
    learnt = copy.deepcopy(d)
    learnt["models"]["llama"]["accuracy"] |= {"2": 0.9, "16": 0.5}
    claim = verdicts_module["skill_gap"](learnt)
    (test,) = claim["tests"]
    assert claim["word"] == "no: reversed" and test.estimate == pytest.approx(0.5 - round(d["models"]["mamba2"]["accuracy"]["16"] * n) / n)


def test_the_swap_verdict_pairs_the_prompts(verdicts_module):
    """(c): with per-prompt results, the paired bootstrap on the same prompts; from counts
    only (the recorded figures), Newcombe's interval: the same words here."""
    from gna_interp.scoring.verdicts import difference_verdict

    c = json.loads((ROOT / "benchmarks" / "results" / "ssm_claims.json").read_text())["c"]
    assert verdicts_module["swap"](c)["word"] == "not alone; with the Gather layer too, yes"
    n = c["prompts"]
    rng = torch.Generator().manual_seed(0)
    student = (torch.rand(n, generator=rng) < 0.27).int()
    paired = copy.deepcopy(c)
    paired["swaps"] = {"student": {"correct": student.tolist()}, "2": {"correct": student.tolist()}, "0+2": {"correct": [1] * n}}
    claim = verdicts_module["swap"](paired)
    alone, both = claim["tests"]
    assert alone.word == "no" and alone.interval == (0.0, 0.0)  # the same answers on every prompt: no gain, no spread
    assert both == difference_verdict([1] * n, student.tolist(), 0.05, "layers 0+2 swapped in - student alone", words=("yes", "no"))
    assert claim["word"] == "not alone; with the Gather layer too, yes"


def test_the_attention_share_verdict_recomputes_the_recorded_share(verdicts_module):
    """(b) on synthetic per-prompt ablations: its estimate is the attention heads' share of the
    positive single-head drops minus their share of the heads, computed here by hand."""
    n = 100
    per_prompt = {"clean": [1] * n, "A": [0] * 40 + [1] * 60, "B": [1] * n, "S1": [0] * 10 + [1] * 90, "S2": [1] * 95 + [0] * 5}
    layer = {"attention_heads": ["A", "B"], "single_drops": {h: 0.0 for h in ("A", "B", "S1", "S2")}, "per_prompt": per_prompt}
    claim = verdicts_module["attention_share"]({"layers": {"1": layer}})
    (test,) = claim["tests"]
    assert test.estimate == pytest.approx(0.40 / (0.40 + 0.10 + 0.05) - 0.5)
    assert claim["word"] == "partly: attention over its share" and test.interval[0] > 0


def test_the_results_file_reads_back_exactly(bench):
    """`dump` puts each list of numbers on one line and reads back to the same figures; `bits`
    keeps each prompt's right or wrong."""
    figures = json.loads((ROOT / "benchmarks" / "results" / "ssm_claims.json").read_text())
    figures["x"] = {"per_prompt": {"entropy": [0.5, -1e-07, 2.0, 3]}, "nested": [[1, 2], {"a": [3]}], "words": ["1", "2"]}
    text = bench["dump"](figures)
    assert json.loads(text) == figures
    assert '"entropy": [0.5, -1e-07, 2.0, 3]' in text
    assert bench["bits"](torch.tensor([True, False, True])) == "101"
