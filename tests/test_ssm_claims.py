"""benchmarks/ssm_claims.py's building blocks: its KV prompts are the library's KV prompts
tokenized, and its by-hand layer swap is exact and leaves the student as it was."""

from __future__ import annotations

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
