"""Issue 3, tests 2 and 3: the vectorised implicit attention equals its step-by-step loop
twin (the recurrence run on unit impulses), and query-row mode equals the same rows of
the full matrix, for softmax and SSM heads, with left padding."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.attention import SSMInputs, implicit_loop, implicit_rows, ssm_inputs
from gna_interp.models.tiny import tiny_model

from .conftest import PROMPTS, no_hooks_anywhere

ATOL = 1e-6


@pytest.fixture(scope="module", params=["mamba2", "mamba", "falcon_mamba"])
def ssm_model(request, tokenizer):
    return gna.load(tiny_model(request.param, seed=5, time_step_min=0.05, time_step_max=0.5), tokenizer=tokenizer)


def all_rows(ssm: SSMInputs) -> torch.Tensor:
    n_rows, n_pos, _ = ssm.dt.shape
    return torch.arange(n_pos).expand(n_rows, n_pos)


def random_ssm(scalar_decay: bool, n_rows=3, n_pos=12, n_heads=3, n_state=4, seed=0) -> SSMInputs:
    """Random SSM inputs with large steps (strong decay) and left padding."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n_rows, n_pos, dtype=torch.bool)
    mask[1, :5] = False
    mask[2, :2] = False
    dt = torch.rand(n_rows, n_pos, n_heads, generator=g) * 1.5 + 0.05
    A = -(torch.rand(n_heads, generator=g) + 0.1) if scalar_decay else -(torch.rand(n_heads, n_state, generator=g) + 0.1)
    shape = (n_rows, n_pos, n_heads, n_state) if scalar_decay else (n_rows, n_pos, n_state)
    B = torch.randn(*shape, generator=g) * mask.view(n_rows, n_pos, *([1] * (len(shape) - 2)))
    C = torch.randn(*shape, generator=g) * mask.view(n_rows, n_pos, *([1] * (len(shape) - 2)))
    return SSMInputs(dt, A, B, C, torch.randn(n_heads, generator=g), mask)


@pytest.mark.parametrize("scalar_decay", [True, False])
@pytest.mark.parametrize("include_skip", [False, True])
def test_loop_twin_equals_vectorised_on_random_inputs(scalar_decay, include_skip):
    ssm = random_ssm(scalar_decay)
    fast = implicit_rows(ssm, all_rows(ssm), include_skip)
    slow = implicit_loop(ssm, include_skip)
    assert slow.abs().max() > 0.1
    assert torch.allclose(fast, slow, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("block", [1, 4, 5, 13, 64])
def test_mamba1_blocked_full_matrix_equals_loop_twin(block):
    """The full-matrix path splits positions into blocks (T = 13: a ragged last block)."""
    ssm = random_ssm(False, n_pos=13, seed=block)
    slow = implicit_loop(ssm)
    assert torch.allclose(implicit_rows(ssm, all_rows(ssm), block=block), slow, atol=ATOL, rtol=1e-5)
    some = torch.tensor([[12, 3], [7, 12], [0, 5]])  # the per-row path: not all rows
    assert torch.allclose(implicit_rows(ssm, some), torch.stack([slow[b][:, some[b]] for b in range(3)]), atol=ATOL, rtol=1e-5)


def test_loop_twin_equals_vectorised_on_real_inputs(ssm_model):
    for layer in range(ssm_model.n_layers):
        ssm = ssm_inputs(ssm_model, PROMPTS, layer)
        slow = implicit_loop(ssm)
        assert slow.abs().max() > 1e-3
        assert torch.allclose(implicit_rows(ssm, all_rows(ssm)), slow, atol=ATOL, rtol=1e-5)
        heads = [gna.Head(layer, h) for h in (ssm_model.n_heads - 1, 0)]
        pattern = gna.attention_pattern(ssm_model, PROMPTS, heads, include_skip=True)
        twin = implicit_loop(ssm, include_skip=True)[:, [ssm_model.n_heads - 1, 0]]
        assert torch.allclose(pattern, twin, atol=ATOL, rtol=1e-5)


def test_padding_and_causality_are_zero(ssm_model):
    pattern = gna.attention_pattern(ssm_model, PROMPTS, [gna.Head(1, 0), gna.Head(1, 1)], include_skip=True)
    real = ssm_model.to_batch(PROMPTS).attention_mask.bool()
    n_pos = real.shape[1]
    assert torch.all(pattern.triu(1) == 0)
    assert torch.all(pattern.transpose(1, 2)[~real] == 0), "padding queries"
    assert torch.all(pattern.permute(0, 3, 1, 2)[~real] == 0), "padding keys"
    assert torch.all(pattern.diagonal(dim1=2, dim2=3).transpose(1, 2)[real] != 0)
    assert pattern.shape == (len(PROMPTS), 2, n_pos, n_pos)
    assert no_hooks_anywhere(ssm_model.hf_model)


QUERY_SPECS = {
    "final": [-1],
    "list": [0, -1, 3, 3],
    "int": 5,
    "per-prompt": torch.tensor([7, 6, 7, 5]),
    "per-prompt-2d": torch.tensor([[7, 3], [6, 7], [2, 4], [5, 5]]),
}


def expected_rows(spec, n_rows: int, n_pos: int) -> torch.Tensor:
    if isinstance(spec, torch.Tensor):
        return spec.view(n_rows, -1)
    items = [spec] if isinstance(spec, int) else spec
    return torch.tensor([p % n_pos for p in items]).expand(n_rows, -1)


def check_query_rows(model, heads, **kwargs):
    full = gna.attention_pattern(model, PROMPTS, heads, **kwargs)
    n_rows, _, n_pos, _ = full.shape
    for name, spec in QUERY_SPECS.items():
        rows = expected_rows(spec, n_rows, n_pos)
        got = gna.attention_pattern(model, PROMPTS, heads, query_positions=spec, **kwargs)
        want = torch.stack([full[b][:, rows[b]] for b in range(n_rows)])
        assert got.shape == want.shape, name
        assert torch.allclose(got, want, atol=1e-7), name


def test_query_rows_equal_full_rows_ssm(ssm_model):
    check_query_rows(ssm_model, [gna.Head(1, 1), gna.Head(0, 2)], include_skip=True)


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_query_rows_equal_full_rows_softmax(llama_models, backend):
    check_query_rows(llama_models[backend], [gna.Head(2, 3), gna.Head(0, 0)])


def test_chunk_size_does_not_change_the_pattern(tokenizer):
    """The model's chunked scan is an implementation detail: M depends only on the weights."""
    patterns = []
    for chunk_size in (2, 3, 64):
        hf = tiny_model("mamba2", seed=6, chunk_size=chunk_size)
        model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer)
        patterns.append(gna.attention_pattern(model, PROMPTS, [gna.Head(1, h) for h in range(4)]))
    assert patterns[0].abs().max() > 1e-3
    assert all(torch.allclose(patterns[0], other, atol=1e-7) for other in patterns[1:])
