"""Long calls say how long: `discover` estimates its passes before it starts (recorded in
``circuit.cost["estimate"]``), and its bar names the stages with the estimate."""

from __future__ import annotations

import warnings

import pytest

import gna_interp as gna
from gna_interp.discovery.estimate import RANGE, estimate_passes

FACTOR = 1.6  # the stated factor: measured passes within [mid / FACTOR, mid * FACTOR]


@pytest.mark.parametrize("name", ["llama", "mamba2_counting", "mamba"])
def test_the_estimate_brackets_the_measured_passes(name):
    """On the bundled toys at 64 prompts (Llama: 2 x 4 heads, Mamba-2: 2 x 8, Mamba: 2 x 128
    channels through the prescreen and group testing) the measured passes (the cost meter's
    block rows / (prompts x layers)) fall in the estimate's range, within FACTOR of its middle."""
    model, task = gna.load_toy(name), gna.toy_task(name, 64, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        circuit = gna.discover(model, task, progress=False)
    estimate, measured = circuit.cost["estimate"], circuit.cost["passes"]
    assert RANGE == FACTOR and estimate["low"] == pytest.approx(estimate["mid"] / FACTOR)
    assert estimate["mid"] / FACTOR <= measured <= estimate["mid"] * FACTOR, (measured, estimate)
    assert f"(estimated beforehand: {estimate['low']:.0f}-{estimate['high']:.0f} passes)" in circuit.summary()
    assert gna.GnaCircuit.from_json(circuit.to_json()).cost["estimate"] == pytest.approx(estimate)


def test_the_estimate_follows_the_stages_and_the_heads():
    """Fewer stages, fewer passes; twice the heads per layer, more: the head scan term is
    each head's share of a pass, ``(L - l) / L`` (1 for layer 0, 1/2 for layer 1 of 2)."""
    llama, mamba2 = gna.load_toy("llama"), gna.load_toy("mamba2_counting")
    knobs = (16, 64, True, 64, 64, 32)
    full = estimate_passes(llama, 64, gna.discovery.STAGES, [0, 1], *knobs)
    wider = estimate_passes(mamba2, 64, gna.discovery.STAGES, [0, 1], *knobs)
    only_heads = estimate_passes(llama, 64, ["heads"], [0, 1], *knobs)
    assert full["stages"]["heads"] == pytest.approx(4 * 1 + 4 * 0.5) and wider["stages"]["heads"] == pytest.approx(8 + 4)
    assert only_heads["mid"] < full["mid"] < wider["mid"]
    assert full["text"] == f"about {full['low']:.0f}-{full['high']:.0f} passes over 64 prompts (a rough estimate)"


def test_the_bar_names_the_estimate_and_the_stages(capfd):
    """With progress on, the stage bar (stderr) carries the estimate and each stage's name."""
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 64, seed=3)
    gna.discover(model, task, progress=True)
    err = capfd.readouterr().err
    estimate = estimate_passes(model, 64, gna.discovery.STAGES, [0, 1], 16, 64, True, 64, 64, 32)
    assert f"discover, {estimate['text']}" in err
    for stage in ("baseline", "label check", "layer scans", "head scan", "entry", "roles", "joint", "confirm"):
        assert f"stage {stage}" in err, stage
    gna.discover(model, task, progress=False)
    assert "discover," not in capfd.readouterr().err
