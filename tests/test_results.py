"""SweepResult views against hand-computed values."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import gna_interp as gna
from gna_interp.patching.results import SweepResult


def test_to_frame_and_top_on_a_hand_made_table():
    scores = torch.tensor([[0.5, float("nan"), 0.9], [0.1, 1.0, 0.8]])
    result = SweepResult(scores, ("layer", "head"), baseline=1.0)
    frame = result.to_frame()
    assert isinstance(frame, pd.DataFrame) and len(frame) == 5
    row = frame[(frame["layer"] == 1) & (frame["head"] == 0)].iloc[0]
    assert row.score == pytest.approx(0.1) and row.effect == pytest.approx(-0.9)
    top = result.top(10)
    assert [str(h) for h, _ in top] == ["L1H0", "L0H0", "L1H2", "L0H2", "L1H1"]
    assert top[0][1] == pytest.approx(-0.9)


def test_top_for_per_position_scores_uses_the_largest_effect():
    scores = torch.tensor([[[0.0, 3.0], [1.0, 1.5]]])  # [layer, head, pos]
    result = SweepResult(scores, ("layer", "head", "pos"), baseline=1.0)
    assert [(str(h), e) for h, e in result.top(2)] == [("L0H0", 2.0), ("L0H1", 0.5)]


def test_normalized_guards_equal_reference():
    result = SweepResult(torch.tensor([1.0, 2.0]), ("layer",), baseline=1.0, reference=3.0, kind="patching")
    assert torch.allclose(result.normalized(), torch.tensor([0.0, 0.5]))
    with pytest.raises(ValueError, match="reference and baseline are equal"):
        SweepResult(torch.tensor([1.0]), ("layer",), baseline=1.0, reference=1.0).normalized()


def test_head_parse_round_trip():
    assert gna.Head.parse("16.22") == gna.Head(16, 22) == gna.Head.parse("L16H22")
    assert str(gna.Head(3, 4)) == "L3H4"
    with pytest.raises(ValueError, match=r"cannot parse head '16-22'"):
        gna.Head.parse("16-22")
