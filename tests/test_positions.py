"""The position scan (`discovery.positions`): its classes against the task's own character
annotations, and its accuracies against `evaluate` run directly (no memo, no runner)."""

from __future__ import annotations

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaValueError
from gna_interp.core.heads import Head
from gna_interp.core.interventions import Ablate
from gna_interp.discovery.memo import accuracy_memo
from gna_interp.discovery.positions import POSITION_CLASSES, position_classes, position_scan
from gna_interp.discovery.runner import LocalRunner
from gna_interp.scoring.evaluation import evaluate


def _encoded(name: str, n: int):
    model, task = gna.load_toy(name), gna.toy_task(name, n, seed=3)
    return model, task, task.encode(task.tokenizer_for(model.tokenizer))


@pytest.mark.parametrize("name", ["llama", "mamba"])
def test_the_classes_split_the_prompt_as_its_annotations_say(name: str) -> None:
    model, task, encoded = _encoded(name, 6)
    classes, same = position_classes(encoded)
    assert set(classes) | set(same) <= set(POSITION_CLASSES)
    masks = [classes[k] for k in classes]
    total = torch.stack(masks).sum(0)
    assert int(total.max()) == 1  # disjoint
    assert torch.equal(total.bool(), encoded.batch.attention_mask.bool())  # and every prompt token in one class
    tokenizer = task.tokenizer_for(model.tokenizer)
    for row, example in enumerate(task):
        ids = encoded.batch.input_ids[row]
        ends = classes["ends"][row].nonzero().flatten().tolist()
        assert len(ends) == len(example.segments)
        for position, segment in zip(ends, example.segments, strict=True):  # each end token decodes to the end character
            assert example.text[segment.end].strip() == tokenizer.decode([int(ids[position])]).strip()
        label_mask = classes[same.get("labels", "labels")][row]
        labels = [tokenizer.decode([int(ids[p])]).strip() for p in label_mask.nonzero().flatten().tolist()]
        if "labels" not in same:
            assert labels == [example.text[s.label] for s in example.segments]
        final = classes["final"][row].nonzero().flatten().tolist()
        assert final == [encoded.batch.n_pos - 1]


def test_the_scan_measures_what_evaluate_measures() -> None:
    model, task, encoded = _encoded("llama", 24)
    clean = evaluate(model, task, progress=False).accuracy
    with accuracy_memo(model):
        scan = position_scan(LocalRunner(model), task, encoded, [0, 1], clean=clean, min_effect=0.1)
    classes, _ = position_classes(encoded)
    for layer in (0, 1):
        heads = [Head(layer, h) for h in range(model.heads_per_layer[layer])]
        for name, mask in classes.items():
            direct = evaluate(model, task, [Ablate(heads, positions=mask)], progress=False).accuracy
            assert scan.accuracy[layer][name] == pytest.approx(direct, abs=1e-9)
    assert scan.acting(1) == ["final"]  # layer 1 (the Aggregate layer) acts only at the final position
    assert scan.acts_at(["final"]) == [layer for layer in (0, 1) if clean - scan.accuracy[layer]["final"] >= 0.1]
    again = type(scan).from_dict(scan.to_dict())
    assert again == scan
    assert list(scan.frame().columns) == list(classes)


def test_a_scan_kind_that_is_not_one_is_refused() -> None:
    model, task, encoded = _encoded("llama", 4)
    with pytest.raises(GnaValueError, match="how='resample'"):
        position_scan(LocalRunner(model), task, encoded, [0], clean=1.0, min_effect=0.1, how="resample")


def test_the_report_shows_where_each_layer_acts(tmp_path) -> None:
    """The report's "where each layer acts" fold holds the position scan's accuracies and the
    coverage's floors, each as the circuit's JSON has it (to the 3 decimals shown)."""
    import re

    from gna_interp.viz.report import write_report

    model, task = gna.load_toy("llama"), gna.toy_task("llama", 24, seed=3)
    circuit = gna.discover(model, task, progress=False)
    page = write_report([(circuit, None, None)], tmp_path).read_text()
    fold = page[page.index('data-fold="positions"') :]
    fold = fold[: fold.index("</details>")]
    cells = [float(x) for x in re.findall(r"<td>(\d\.\d{3})</td>", fold)]
    expected = [round(v, 3) for row in circuit.positions.accuracy.values() for v in row.values()]
    expected += [round(item[k], 3) for item in circuit.settings["coverage"].values() for k in ("floor", "accuracy")]
    assert cells == expected and circuit.settings["coverage"]
