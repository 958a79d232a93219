"""Where the passes of a deep toy's discovery go (issue 52, item 8): no ablation is measured
twice under two keys of the accuracy memo (a position given as an index in one stage and as
a mask in another would be), and each head ablation starts from the cached clean prefix at
its earliest ablated layer. Each evaluation that reaches `evaluate` is recorded here with what
it cost, its positions rewritten as a ``[batch, pos]`` mask by hand (not by `memo.memo_key`),
and its charged block rows compared with the layer arithmetic."""

from __future__ import annotations

import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.core.interventions import Ablate
from gna_interp.discovery import memo as memos
from gna_interp.zoo.deep import deep_toy

N_LAYERS, PROMPTS = 6, 64


def _mask(positions: object, n_rows: int, n_pos: int) -> bytes | None:
    """``positions`` (`Ablate`'s) as a ``[n_rows, n_pos]`` bool mask's bytes; ``None``: every position."""
    if positions is None:
        return None
    mask = torch.zeros(n_rows, n_pos, dtype=torch.bool)
    if isinstance(positions, torch.Tensor) and positions.dtype == torch.bool:
        mask |= positions
    elif isinstance(positions, torch.Tensor):
        index = positions[:, None] if positions.dim() == 1 else positions
        for row in range(n_rows):
            for column in index[row].tolist():
                mask[row, column] = True
    else:
        for column in [positions] if isinstance(positions, int) else positions:  # type: ignore[union-attr]
            mask[:, column] = True
    return mask.numpy().tobytes()


@pytest.fixture(scope="module")
def recorded():
    """The deep Mamba-2 counting toy (its layers at 2-3 of 6) discovered with every evaluation
    behind the memo recorded: ``(heads, mask, block rows charged)`` per zero head ablation,
    and the circuit."""
    model, task = deep_toy("mamba2_counting", N_LAYERS), gna.toy_task("mamba2_counting", PROMPTS, seed=4242)
    n_pos = task.encode().batch.n_pos
    runs: list[tuple[frozenset, bytes | None, int]] = []
    others: list[int] = []
    evaluate = memos.evaluate

    def recording(model_, task_, interventions, progress=None):
        meter = model_.backend._cost_meters[0]
        before = meter.block_rows
        out = evaluate(model_, task_, interventions, progress=progress)
        charged = meter.block_rows - before
        ablations = [item for item in interventions if isinstance(item, Ablate) and item.how == "zero"]
        if task_ is task and len(ablations) == len(interventions) == 1 and not model_.active_interventions:
            runs.append((frozenset(ablations[0].heads), _mask(ablations[0].positions, len(task_), n_pos), charged))
        else:
            others.append(charged)
        return out

    memos.evaluate = recording
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the toy's spread roles warn
            circuit = gna.discover(model, task, progress=False)
    finally:
        memos.evaluate = evaluate
    return runs, circuit


@pytest.mark.slow
def test_no_head_ablation_is_measured_twice_under_two_keys(recorded):
    """Every head ablation discovery evaluates (through the memo) is a distinct (heads,
    positions) pair once positions are written as masks: the memo answered every repeat."""
    runs, circuit = recorded
    pairs = [(heads, mask) for heads, mask, _ in runs]
    assert len(pairs) >= 20  # the position scan, the entry scan, the joint search, the confirmation
    assert len(set(pairs)) == len(pairs)
    assert circuit.gather and circuit.aggregate


@pytest.mark.slow
def test_each_head_ablation_starts_at_its_earliest_ablated_layer(recorded):
    """The block rows each head ablation was charged are ``prompts x (n_layers - first
    ablated layer)``: the cached clean prefix served every chunk (64-prompt chunks, whatever
    chunking filled the cache)."""
    runs, _ = recorded
    expected = [PROMPTS * (N_LAYERS - min(h.layer for h in heads)) for heads, _, _ in runs]
    assert [charged for _, _, charged in runs] == expected
    assert min(expected) < PROMPTS * N_LAYERS  # the toy's layers sit at depth: the check can fail
