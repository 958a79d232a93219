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
from gna_interp.discovery.positions import POSITION_CLASSES, describe, position_classes, position_scan
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
        scan = position_scan(LocalRunner(model), task, encoded, [0, 1], clean=clean, min_effect=0.1, screen=False)
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


def test_the_screen_clears_the_other_classes_of_a_layer_acting_only_at_the_final_position() -> None:
    """The screened scan (discover's): each layer at the final position, then at every other
    class together; layer 1 (Aggregate) costs nothing there, so its other classes are cleared
    by that one forward (its accuracy: `evaluate` at the union of their masks) and not measured;
    layer 0 costs there, so each class is measured alone, as the unscreened scan measures it.
    Forwards: 2 per layer, and one per other class of layer 0."""
    model, task, encoded = _encoded("llama", 24)
    clean = evaluate(model, task, progress=False).accuracy
    with accuracy_memo(model):
        full = position_scan(LocalRunner(model), task, encoded, [0, 1], clean=clean, min_effect=0.1, screen=False)
    with accuracy_memo(model), gna.cost_meter(model) as cost:
        scan = position_scan(LocalRunner(model), task, encoded, [0, 1], clean=clean, min_effect=0.1)
    classes, _ = position_classes(encoded)
    others = [name for name in classes if name != "final"]
    union = torch.stack([classes[name] for name in others]).any(0)
    heads = [Head(1, h) for h in range(model.heads_per_layer[1])]
    direct = evaluate(model, task, [Ablate(heads, positions=union)], progress=False).accuracy
    assert list(scan.cleared) == [1] and scan.cleared[1] == pytest.approx(direct, abs=1e-9) and clean - direct < 0.1
    assert scan.accuracy[1] == {"final": full.accuracy[1]["final"]}
    assert scan.accuracy[0] == full.accuracy[0] and scan.acting(0) == full.acting(0)
    assert scan.acts_at(list(classes)) == full.acts_at(list(classes))
    batches = cost.forwards // (2 * 2 + len(others))  # evaluate's forwards per measurement (its chunks)
    assert cost.forwards == batches * (2 * 2 + len(others)) and batches >= 1
    assert type(scan).from_dict(scan.to_dict()) == scan
    assert "elsewhere" in describe(scan)


def test_the_entry_scan_reads_a_cleared_layer_without_measuring_its_heads() -> None:
    """A layer the screen clears at every position but the final one (layer 1 of the Llama
    toy): the entry scan gives its heads that accuracy on the segments and at their ends,
    without a forward (the final position still measured); each head measured there by
    `evaluate` costs less than ``min_effect`` too (the premise the clearing rests on), and
    layer 0's heads are measured as without it."""
    from gna_interp.discovery.entry import entry_scan, segment_positions

    model, task, encoded = _encoded("llama", 24)
    clean = evaluate(model, task, progress=False).accuracy
    with accuracy_memo(model):
        scan = position_scan(LocalRunner(model), task, encoded, [0, 1], clean=clean, min_effect=0.1)
    heads = [Head(1, h) for h in range(model.heads_per_layer[1])] + [Head(0, 0)]
    with accuracy_memo(model), gna.cost_meter(model) as cost:
        found = entry_scan(model, task, encoded, heads, progress=False, cleared=scan.cleared)
    with accuracy_memo(model), gna.cost_meter(model) as full_cost:
        full = entry_scan(model, task, encoded, heads, progress=False)
    where = {"segments": segment_positions(encoded), "ends": encoded.segment_ends}
    for head in heads[:-1]:
        assert found[head]["segments"] == found[head]["ends"] == scan.cleared[1]
        assert found[head]["final"] == full[head]["final"]
        for name, positions in where.items():
            direct = evaluate(model, task, [Ablate([head], positions=positions)], progress=False).accuracy
            assert clean - direct < 0.1 and full[head][name] == pytest.approx(direct, abs=1e-9)
    assert found[heads[-1]] == full[heads[-1]]
    assert full_cost.forwards - cost.forwards == 2 * (len(heads) - 1) * (full_cost.forwards // (3 * len(heads)))


def test_a_scan_measured_at_once_is_screened_as_the_local_one() -> None:
    """A remote run measures every class and the rest together in one request
    (`scan_runs(..., names=[*classes, REST])`, `ScanRuns.scan`): the screen applied to those
    values gives the local screened scan exactly (the same accuracies, the same cleared layers)."""
    from gna_interp.discovery.positions import REST, scan_runs

    model, task, encoded = _encoded("llama", 24)
    clean = evaluate(model, task, progress=False).accuracy
    runner = LocalRunner(model)
    with accuracy_memo(model):
        local = position_scan(runner, task, encoded, [0, 1], clean=clean, min_effect=0.1)
        planned = scan_runs(runner, task, encoded, [0, 1], names=[*position_classes(encoded)[0], REST])
        at_once = planned.scan(runner.accuracies(planned.runs), clean, 0.1)
    assert at_once == local and local.cleared
