"""`discover`'s confirmation shares one corrupted forward between its Gather -> Aggregate path
patching and its MIB circuit score, and path patching's clean run starts from the prefix cache."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.discovery import confirm as confirm_module
from gna_interp.discovery import stages
from gna_interp.patching.metrics import logit_diff


def _answer_metric(task, corrupt):
    """The candidate logit difference, built from the encodings (not `confirm.answer_metric`)."""
    clean_enc, corrupt_enc = task.encode(), corrupt.encode()
    rows = torch.arange(len(task))
    return logit_diff(clean_enc.candidate_ids[rows, clean_enc.correct], corrupt_enc.candidate_ids[rows, corrupt_enc.correct])


@contextlib.contextmanager
def corrupt_forwards(model, corrupt):
    """Inside the block, ``reads`` lists for each forward whether it ran the ``corrupt`` prompts
    (alone or as a copy in a stacked batch)."""
    reads, run, ids = [], model.backend.run, model.to_batch(corrupt).input_ids

    def counting_run(batch, plan, *args, **kwargs):
        rows = batch.input_ids
        reads.append(rows.shape[1] == ids.shape[1] and any(torch.equal(part, ids) for part in rows.split(len(ids))))
        return run(batch, plan, *args, **kwargs)

    model.backend.run = counting_run
    try:
        yield reads
    finally:
        del model.backend.run  # the class's method again


@pytest.mark.parametrize("name", ["llama", "mamba2"])
def test_the_confirmation_runs_the_corrupted_prompts_once(name, monkeypatch):
    """Inside `discover`'s confirmation, exactly one forward reads the corrupted prompts (path
    patching's, which also captures the score's head outputs); ``circuit.score`` equals
    `gna.circuit_score` called on its own (with its own corrupt forward), and
    ``circuit.path_patching`` `path_patching`'s value."""
    model, task = gna.load_toy(name), gna.toy_task(name, 32, seed=4242)
    corrupt = task.corrupted()
    seen: list[list[bool]] = []
    confirm = stages.confirm_stage

    def confirming(*args, **kwargs):
        with corrupt_forwards(model, corrupt) as reads:
            seen.append(reads)
            return confirm(*args, **kwargs)

    monkeypatch.setattr(stages, "confirm_stage", confirming)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        circuit = gna.discover(model, task, progress=False)
    monkeypatch.undo()
    assert circuit.path_patching is not None and circuit.score is not None
    assert len(seen) == 1 and len(seen[0]) > 3 and sum(seen[0]) == 1  # the one corrupted forward among the confirmation's

    metric = _answer_metric(task, corrupt)
    ranking = [gna.Head.parse(h) for h in circuit.score["ranking"]]
    with corrupt_forwards(model, corrupt) as alone:
        direct = gna.circuit_score(model, task, corrupt, metric, ranking, progress=False)
    assert sum(alone) == 1  # its own corrupted forward: the one the confirmation shares
    assert circuit.score["metric"] == pytest.approx(direct.metric.tolist(), abs=1e-6)
    assert (circuit.score["cpr"], circuit.score["cmd"]) == pytest.approx((direct.cpr, direct.cmd), abs=1e-6)
    assert circuit.score["metric_empty"] == pytest.approx(direct.metric_empty, abs=1e-6)
    with corrupt_forwards(model, corrupt) as own:  # without path patching's capture: its own corrupted forward, the same score
        again = confirm_module.mib_score(model, task, circuit)
    assert sum(own) == 1 and again is not None
    assert again["metric"] == pytest.approx(circuit.score["metric"], abs=1e-6) and again["sizes"] == circuit.score["sizes"]
    receivers = [h for h in circuit.aggregate if h.layer > max(g.layer for g in circuit.gather)]
    path = gna.patching.path_patching(model, task, corrupt, metric, senders=circuit.gather, receivers=receivers)
    assert circuit.path_patching["gather->aggregate"] == pytest.approx(path, abs=1e-6)


@pytest.mark.parametrize("name", ["llama", "mamba2"])
def test_path_patchings_clean_run_starts_from_the_prefix_cache(name):
    """Senders in layer 1: inside a `prefix_cache` holding the clean batch, path patching's clean
    run starts at block 1 from the cached stream (one block fewer per row) and every number is
    the one of a run without the cache."""
    model, task = gna.load_toy(name), gna.toy_task(name, 16, seed=4242)
    corrupt = task.corrupted()
    metric = _answer_metric(task, corrupt)
    senders = [gna.Head(1, 0), gna.Head(1, 1)]
    arguments = dict(senders=senders, receivers="logits")
    with gna.cost_meter(model) as plain:
        expected = gna.patching.path_patching(model, task, corrupt, metric, **arguments)
    with model.prefix_cache():
        model.logits(task, logits_to_keep=1)  # the clean batch's stream, cached
        with gna.cost_meter(model) as cached:
            found = gna.patching.path_patching(model, task, corrupt, metric, **arguments)
    assert found == pytest.approx(expected, abs=1e-6) and found != pytest.approx(metric(model.logits(task)).mean().item(), abs=1e-3)
    assert plain.block_rows - cached.block_rows == len(task)  # block 0 of the clean run
    assert cached.forwards == plain.forwards
