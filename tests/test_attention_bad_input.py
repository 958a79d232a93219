"""Issue 3, test 6: bad input fails early with an error naming the bad value and what
was expected; nothing is left behind."""

from __future__ import annotations

import pytest
import torch

import gna_interp as gna
from gna_interp.core.plan import Plan, Read, ReadKind
from gna_interp.models.tiny import tiny_model

from .conftest import PROMPTS, no_hooks_anywhere


@pytest.fixture(scope="module")
def mamba2(tokenizer):
    return gna.load(tiny_model("mamba2", seed=9), tokenizer=tokenizer)


@pytest.mark.parametrize(
    ("query_positions", "message"),
    [
        ([8], r"query position 8 out of range: the batch has 8 positions \(valid: -8..7\)"),
        ([0, -9], r"query position -9 out of range"),
        (torch.tensor([1, 2, 3, 40]), r"query position 40 out of range"),
        ([], r"query_positions is empty"),
        (torch.tensor([1.0, 2.0, 3.0, 4.0]), r"integer \[batch\] or \[batch, query\] with batch=4, got \(4,\) torch.float32"),
        (torch.tensor([1, 2]), r"with batch=4, got \(2,\)"),
    ],
)
def test_bad_query_positions(mamba2, query_positions, message):
    with pytest.raises(ValueError, match=message):
        gna.attention_pattern(mamba2, PROMPTS, [gna.Head(0, 0)], query_positions=query_positions)


def test_query_positions_must_be_ints(mamba2):
    with pytest.raises(TypeError, match=r"query_positions must be ints, got \[1.5\]"):
        gna.attention_pattern(mamba2, PROMPTS, [gna.Head(0, 0)], query_positions=[1.5])  # type: ignore[list-item]


def test_bad_heads(mamba2, llama_tlens):
    with pytest.raises(ValueError, match="heads is empty"):
        gna.attention_pattern(mamba2, PROMPTS, [])
    with pytest.raises(ValueError, match=r"head L1H4 out of range: layer 1 of .* has heads 0..3"):
        gna.attention_pattern(mamba2, PROMPTS, [gna.Head(1, 4)])
    with pytest.raises(ValueError, match=r"layer 2 out of range"):
        gna.attention_pattern(mamba2, PROMPTS, gna.Head(2, 0))
    with pytest.raises(TypeError, match=r"expected a gna_interp.Head, got 'L0H0'"):
        gna.attention_pattern(mamba2, PROMPTS, ["L0H0"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"heads must be a gna_interp.Head or a list of them, got 'L0H0'"):
        gna.attention_pattern(mamba2, PROMPTS, "L0H0")  # type: ignore[arg-type]


def test_heads_of_a_kind_the_model_lacks(mamba2, llama_tlens):
    with pytest.raises(ValueError, match=r"kind='attention' but heads \['L0H1'\] are not attention heads: .* has ssm heads only"):
        gna.attention_pattern(mamba2, PROMPTS, [gna.Head(0, 1)], kind="attention")
    with pytest.raises(ValueError, match=r"kind='ssm' but heads \['L1H2'\] are not ssm heads: .* has attention heads only"):
        gna.attention_pattern(llama_tlens, PROMPTS, [gna.Head(1, 2)], kind="ssm")
    with pytest.raises(ValueError, match=r"kind='mamba': expected 'attention', 'ssm', 'all' or None"):
        gna.attention_pattern(llama_tlens, PROMPTS, [gna.Head(1, 2)], kind="mamba")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"include_skip=True .* heads \['L1H2'\] are softmax attention heads"):
        gna.attention_pattern(llama_tlens, PROMPTS, [gna.Head(1, 2)], include_skip=True)
    with pytest.raises(ValueError, match=r"layer 0 of .* is an attention layer"):
        gna.attention.ssm_inputs(llama_tlens, PROMPTS, 0)
    with pytest.raises(
        ValueError, match=r"cannot read output 'in_proj' of layer 0: its attention mixer \(model.layers.0.self_attn\) has no such submodule"
    ):
        llama_tlens.backend.run(llama_tlens.to_batch(PROMPTS), Plan(), reads=[Read(ReadKind.OUTPUT, 0, "in_proj")])


def test_full_matrix_over_budget_suggests_query_positions(mamba2):
    heads = [gna.Head(0, h) for h in range(4)]
    # full: 3 x float32 x 4 prompts x 4 heads x 8 x 8 = 12,288 bytes; one row: 1,536 bytes
    with pytest.raises(ValueError, match=r"4 prompts x 4 heads x 8 queries x 8 keys .* over max_bytes=4,000: pass query_positions"):
        gna.attention_pattern(mamba2, PROMPTS, heads, max_bytes=4000)
    rows = gna.attention_pattern(mamba2, PROMPTS, heads, query_positions=[-1], max_bytes=4000)
    assert rows.shape == (4, 4, 1, 8)
    with pytest.raises(ValueError, match=r"over max_bytes=1,000: ask for fewer heads, rows or prompts"):
        gna.attention_pattern(mamba2, PROMPTS, heads, query_positions=[-1], max_bytes=1000)


def test_bad_normalize_and_metric_inputs(mamba2):
    with pytest.raises(ValueError, match=r"normalize='softmax': expected one of \(None, 'abs', 'row'\)"):
        gna.attention_pattern(mamba2, PROMPTS, [gna.Head(0, 0)], normalize="softmax")  # type: ignore[arg-type]
    pattern = torch.rand(2, 1, 3, 5)
    with pytest.raises(ValueError, match=r"key position 5 out of range: the batch has 5 positions"):
        gna.attention.mass_on(pattern, [0, 5])
    with pytest.raises(ValueError, match=r"key positions give 3 lists, expected one per prompt \(2\)"):
        gna.attention.mass_on(pattern, [[0], [1], [2]])
    with pytest.raises(ValueError, match=r"key mask of shape \(4,\) does not fit patterns of 2 prompts x 3 queries x 5 keys"):
        gna.attention.mass_on(pattern, torch.ones(4, dtype=torch.bool))
    with pytest.raises(
        ValueError,
        match=r"must be integer positions \[batch, k\] \(one position per prompt: t\[:, None\]\) or a bool mask; got torch.float32",
    ):
        gna.attention.mass_on(pattern, torch.tensor([[0.0, 1.0]] * 2))
    with pytest.raises(ValueError, match=r"got torch.int64 of shape \(2,\) \(a list of ints gives positions shared by every prompt\)"):
        gna.attention.mass_on(pattern, torch.tensor([0, 1]))  # [batch] elsewhere, a shared set here: refused, not guessed
    with pytest.raises(ValueError, match=r"or a bool mask; got torch.int64 of shape \(2, 3, 1\)"):
        gna.attention.mass_on(pattern, torch.zeros(2, 3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"key positions give 3 lists, expected one per prompt \(2\)"):
        gna.attention.mass_on(pattern, torch.zeros(3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"key position -6 out of range: the batch has 5 positions"):
        gna.attention.mass_on(pattern, torch.tensor([[0], [-6]]))
    with pytest.raises(ValueError, match=r"mass_on expects a pattern \[batch, head, query, key\], got shape \(3, 5\)"):
        gna.attention.mass_on(pattern[0, 0], [0])
    with pytest.raises(ValueError, match=r"at least one key"):
        gna.attention.entropy(torch.zeros(2, 0))


def test_a_failing_read_leaves_nothing_behind(mamba2):
    logits = mamba2.logits(PROMPTS)
    with pytest.raises(Exception):  # noqa: B017 - nnsight's error for a missing submodule
        mamba2.backend.run(mamba2.to_batch(PROMPTS), Plan(), reads=[Read(ReadKind.OUTPUT, 1, "no_such_module")])
    assert no_hooks_anywhere(mamba2.hf_model)
    assert torch.equal(mamba2.logits(PROMPTS), logits)
