"""The bundled hybrid toy (FalconH1: attention and Mamba-2 heads side by side in every
layer): discovery labels heads of both kinds, and the measured answer to the paper's
hybrid question (which kind aggregates) is re-measured here through `evaluate`."""

from __future__ import annotations

import warnings

import pytest

import gna_interp as gna

TASK_SEED = 4242  # fresh prompts: neither training nor the card used them

# slow: discovery on 200 prompts of the counting hybrid toy (about 20 s), `make test-slow`
pytestmark = [pytest.mark.skipif("falcon_h1" not in gna.toy_names(), reason="hybrid toy not bundled"), pytest.mark.slow]


@pytest.fixture(scope="module")
def found():
    model = gna.load_toy("falcon_h1_counting")
    task = gna.toy_task("falcon_h1_counting", 200, seed=TASK_SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", gna.discovery.PositionalAnswerWarning)  # see test_answers_by_place
        circuit = gna.discover(model, task, progress=False)
    return model, task, circuit


def kinds_in(model: gna.GnaModel, layer: int) -> dict[str, list[gna.Head]]:
    heads: dict[str, list[gna.Head]] = {"attention": [], "ssm": []}
    for head in model.heads:
        if head.layer == layer:
            heads[model.head_kind(head).value].append(head)
    return heads


def test_both_kinds_are_found_and_recorded(found):
    model, task, circuit = found
    assert gna.evaluate(model, task).accuracy >= 0.95
    for item in circuit.heads:
        assert item.kind == model.head_kind(item.head).value
    assert {circuit.evidence(h).kind for h in circuit.aggregate} == {"attention", "ssm"}, circuit.summary()
    assert gna.evaluate(model, task, [gna.Ablate(circuit.needs["gather"].heads)]).accuracy <= 0.35
    assert gna.GnaCircuit.from_json(circuit.to_json()) == circuit
    assert "(attention)" in circuit.summary() and "(ssm)" in circuit.summary()


def test_which_kind_aggregates(found):
    """As measured (docs/records/hybrids.md): at the final position of the last layer, the SSM
    heads together matter more than the attention heads together, and masking the final
    attention row everywhere (the paper's Zamba2 experiment) does not collapse accuracy."""
    model, task, _ = found
    last = kinds_in(model, 1)
    without_attention = gna.evaluate(model, task, [gna.Ablate(last["attention"], positions=-1)]).accuracy
    without_ssm = gna.evaluate(model, task, [gna.Ablate(last["ssm"], positions=-1)]).accuracy
    masked = gna.evaluate(model, task, [gna.MaskAttentionRows(-1)]).accuracy
    assert without_ssm < without_attention < 0.95, (without_ssm, without_attention)
    assert masked > 0.6
    # Masking the final row of layer 1's attention is ablating its attention heads there.
    assert gna.evaluate(model, task, [gna.MaskAttentionRows(-1, layers=[1])]).accuracy == pytest.approx(without_attention)


def test_answers_by_place(found):
    """Like the bundled Mamba-2 (both trained with labels in order), the hybrid answers by
    the option's place: with the labels shuffled, accuracy falls to chance."""
    model, task, circuit = found
    shuffled = gna.evaluate(model, gna.tasks.shuffle_labels(task)).accuracy
    assert circuit.accuracy["shuffled_labels"] == pytest.approx(shuffled)
    assert shuffled < circuit.accuracy["chance"] + circuit.settings["chance_margin"]
