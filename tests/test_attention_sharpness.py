"""Sharpness metrics against plain-Python loops over rows, and on patterns with known answers."""

from __future__ import annotations

import math

import pytest
import torch

import gna_interp as gna
from gna_interp.attention import normalize_rows

from .conftest import PROMPTS


def loop_metrics(row: list[float], keys: set[int]) -> tuple[float, float, float]:
    weights = [abs(w) for w in row]
    total = sum(weights)
    if total == 0:
        return math.nan, math.nan, math.nan
    p = [w / total for w in weights]
    return -sum(q * math.log(q) for q in p if q > 0), max(p), sum(p[k] for k in keys)


def random_pattern(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    pattern = torch.randn(3, 2, 4, 6, generator=g)
    pattern[0, 1, 2] = 0.0  # a row with no mass
    pattern[1, 0, 1] = torch.tensor([0.0, 0.0, 5.0, 0.0, 0.0, 0.0])  # one-hot
    pattern[2, 1, 3] = -1.0  # uniform (signed)
    return pattern


def test_metrics_equal_loops():
    pattern = random_pattern()
    keys = [[0, 5], [2], [-1, 1, 1]]  # per prompt; negative from the end; duplicates count once
    ent, top, mass = gna.attention.entropy(pattern), gna.attention.top1_mass(pattern), gna.attention.mass_on(pattern, keys)
    assert ent.shape == top.shape == mass.shape == (3, 2, 4)
    for b in range(3):
        key_set = {k % 6 for k in keys[b]}
        for h in range(2):
            for q in range(4):
                want = loop_metrics(pattern[b, h, q].tolist(), key_set)
                for got, expected in zip((ent, top, mass), want, strict=True):
                    if math.isnan(expected):
                        assert math.isnan(float(got[b, h, q]))
                    else:
                        assert float(got[b, h, q]) == pytest.approx(expected, abs=1e-6)
    assert float(ent[1, 0, 1]) == 0.0 and float(top[1, 0, 1]) == 1.0
    assert float(ent[2, 1, 3]) == pytest.approx(math.log(6)) and float(top[2, 1, 3]) == pytest.approx(1 / 6)


def test_mass_on_key_spec_forms():
    pattern = random_pattern(1)
    shared = gna.attention.mass_on(pattern, [1, 3])
    mask = torch.zeros(6, dtype=torch.bool)
    mask[[1, 3]] = True
    assert int(shared.isnan().sum()) == 1, "the row with no mass"
    integer = torch.tensor([[1, 3], [1, -3], [-5, 3]])  # [batch, k], negative counts from the end
    for same in (mask, mask.expand(3, 6), mask.expand(3, 4, 6), [[1, 3]] * 3, [-5, -3], integer):
        assert torch.allclose(gna.attention.mass_on(pattern, same), shared, equal_nan=True)
    whole = gna.attention.mass_on(pattern, list(range(6)))
    finite = ~whole.isnan()
    assert torch.allclose(whole[finite], torch.ones_like(whole[finite]))
    assert torch.all(gna.attention.mass_on(pattern, [[], [], []])[finite] == 0)


def test_normalize_rows():
    pattern = random_pattern(2)
    assert torch.equal(normalize_rows(pattern, "abs"), pattern.abs())
    row = normalize_rows(pattern, "row")
    sums = row.sum(-1)
    assert torch.allclose(sums[sums > 0], torch.ones_like(sums[sums > 0]))
    assert float(sums[0, 1, 2]) == 0.0, "a row with no mass stays zero"
    assert torch.allclose(row.max(-1).values[sums > 0], gna.attention.top1_mass(pattern)[sums > 0])


def test_metrics_on_real_softmax_rows(llama_tlens):
    """Softmax rows are distributions already: metrics agree with direct formulas."""
    pattern = gna.attention_pattern(llama_tlens, PROMPTS, [gna.Head(2, 1), gna.Head(1, 5)], query_positions=[-1])
    p = pattern[:, :, 0]
    assert torch.allclose(gna.attention.entropy(pattern)[:, :, 0], -(p * p.clamp_min(1e-30).log()).sum(-1), atol=1e-6)
    assert torch.allclose(gna.attention.top1_mass(pattern)[:, :, 0], p.max(-1).values)
    ends = torch.zeros(len(PROMPTS), pattern.shape[-1], dtype=torch.bool)
    ends[:, -3:] = True
    assert torch.allclose(gna.attention.mass_on(pattern, ends)[:, :, 0], p[..., -3:].sum(-1), atol=1e-6)


def test_normalize_option_of_attention_pattern(ssm_pair):
    model = ssm_pair
    heads = [gna.Head(1, 0)]
    raw = gna.attention_pattern(model, PROMPTS, heads)
    assert (raw < 0).any(), "implicit attention is signed in this model: the test could not fail"
    assert torch.equal(gna.attention_pattern(model, PROMPTS, heads, normalize="abs"), raw.abs())
    assert torch.allclose(gna.attention_pattern(model, PROMPTS, heads, normalize="row"), normalize_rows(raw, "row"))


@pytest.fixture(scope="module")
def ssm_pair(tokenizer):
    from gna_interp.models.tiny import tiny_model

    return gna.load(tiny_model("mamba2", seed=8), tokenizer=tokenizer)
