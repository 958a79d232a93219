"""Session-batched remote runs (nnsight ``remote="local"``: the whole session serialised and
run through nnsight's simulation of NDIF) equal local runs, stage by stage, in the
requests the docs promise."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.backends.jobs import Job
from gna_interp.core.plan import Plan, Ref, Site, SiteKind
from gna_interp.cost import COUNTS
from gna_interp.models.jobs import run_jobs
from gna_interp.scoring.evaluation import evaluate_many
from gna_interp.zoo.deep import deep_toy

N_PROMPTS = 40


@pytest.fixture(scope="module")
def pair():
    local = deep_toy("mamba2_counting", 4, backend="nnsight")  # the toy at layers 1, 2
    remote = gna.load(copy.deepcopy(local.hf_model), tokenizer=local.tokenizer, remote="local")
    remote.name = local.name
    return local, remote, gna.toy_task("mamba2_counting", N_PROMPTS, seed=4242)


def _metered(model, fn):
    with gna.cost_meter(model) as cost:
        out = fn()
    return out, cost


def test_jobs_with_references_run_in_one_request(pair):
    """A clean job captures the residual at layer 2; later jobs start there from it
    (`Ref`), one tiled twice. Remote: one request, the same logits as local; with a payload
    limit below one job, one request per job, each taking the referenced job along."""
    local, remote, task = pair
    batch = local.to_batch(task)
    resid = Site(SiteKind.RESID, 2)
    ablate = local.compile_plan(batch, [gna.Ablate([gna.Head(2, 6)])])
    twice = ablate.tiled(batch.n_rows, 2)
    jobs = [
        Job(batch, Plan(), frozenset({resid}), keep=0),
        Job(batch, Plan(edits=ablate.edits, start=(2, Ref(0, resid)))),
        Job(batch.repeat(2), Plan(edits=twice.edits, start=(2, Ref(0, resid, 2))), keep=2),
    ]
    expected = [None, local.logits(batch, [gna.Ablate([gna.Head(2, 6)])]), None]
    expected[2] = expected[1].repeat(2, 1, 1)[:, -1:]
    for model, requests in ((local, 0), (remote, 1)):
        outputs, cost = _metered(model, lambda model=model: run_jobs(model, jobs))
        assert outputs[0] is None and cost.requests == requests
        assert (outputs[1].logits - expected[1]).abs().max() < 1e-5
        assert outputs[2].logits.shape == (2 * batch.n_rows, 1, local.vocab_size)
        assert (outputs[2].logits - expected[2]).abs().max() < 1e-5
        assert cost.block_rows == batch.n_rows * 4 + batch.n_rows * 2 + 2 * batch.n_rows * 2
    remote.backend.max_request_mb = 1e-6
    try:
        outputs, cost = _metered(remote, lambda: run_jobs(remote, jobs))
    finally:
        remote.backend.max_request_mb = 256.0
    assert cost.requests == 3 and cost.forwards == 5  # the clean job runs again with each later job
    assert (outputs[2].logits - expected[2]).abs().max() < 1e-5


def test_first_scans_sweep_and_entry_each_take_one_request(pair):
    """The evaluations of the first stage (clean, labels shuffled, truncation, layer scan),
    the head-scan sweep and the entry scan: the same numbers, one request each."""
    local, remote, task = pair
    runs = [(task, []), (gna.tasks.shuffle_labels(task), [])]
    runs += [(task, [gna.Truncate(k)]) for k in range(1, 5)] + [(task, [gna.SkipLayers([layer])]) for layer in range(4)]
    final = task.encode().final
    runs += [(task, [gna.Ablate([gna.Head(1, 3)], positions=final)])]
    expected = evaluate_many(local, runs)
    actual, cost = _metered(remote, lambda: evaluate_many(remote, runs))
    assert cost.requests == 1
    for a, b in zip(actual, expected, strict=True):
        assert torch.equal(a.predictions, b.predictions) and (a.scores - b.scores).abs().max() < 1e-5
    encoded = task.encode()
    metric = gna.candidate_accuracy(encoded.candidate_ids, encoded.correct)
    heads = [gna.Head(layer, h) for layer in (1, 2) for h in range(8)]
    sweep = gna.ablation_sweep(local, task, None, metric, heads=heads, batch_size=4 * N_PROMPTS, progress=False)
    remote_sweep, cost = _metered(
        remote, lambda: gna.ablation_sweep(remote, task, None, metric, heads=heads, batch_size=4 * N_PROMPTS, progress=False)
    )
    assert cost.requests == 1 and cost.forwards == 1 + 4
    assert torch.equal(sweep.scores.isnan(), remote_sweep.scores.isnan())
    assert torch.allclose(sweep.scores, remote_sweep.scores, equal_nan=True) and sweep.baseline == remote_sweep.baseline


def _same(actual, expected, path=""):
    """Equal, except pattern scores: equal to float32 rounding (see the test below); and a
    head's entry scan, which a remote run measures at all three position sets in its one
    request, and a local run only where a label reads it: the local values are the remote's."""
    if isinstance(expected, dict) and path.endswith("/entry"):
        assert set(expected) <= set(actual) and "segments" in expected, path
        actual = {key: actual[key] for key in expected}
    if isinstance(expected, dict):
        assert set(actual) == set(expected), path
        for key in expected:
            _same(actual[key], expected[key], f"{path}/{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), path
        for i, (a, b) in enumerate(zip(actual, expected, strict=True)):
            _same(a, b, f"{path}[{i}]")
    elif isinstance(expected, float) and "/scores/" in path:
        assert actual == pytest.approx(expected, rel=1e-5, abs=1e-7), path
    else:
        assert actual == expected, path


SEARCHED = tuple(stage for stage in gna.discovery.STAGES if stage != "cover")
"""Every stage but the cover step, which orders heads by a local backward (a remote model has
none): local and remote run the same search."""


@pytest.mark.slow
def test_discover_remote_equals_local_in_ten_requests(pair):
    """The whole pipeline, in 10 requests: 6 stage requests, 3 of path patching
    (`gna_interp.discovery.remote`: its clean and corrupt captures in one, then its chain of two)
    and 1 for MIB's circuit score (`circuit_score`: its circuits in one, the corrupt head outputs
    read from path patching's corrupt capture). Every field of the circuit is equal, but the
    cost, the pass estimate (a remote model has no prefix cache) and the pattern scores of heads
    the joint search pools: a remote run scores them in the forward that scores the candidates
    (locally: a forward per pool), which moves their float32 rounding (measured: relative
    differences of about 1e-7)."""
    local, remote, task = pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gna.discovery.PositionalAnswerWarning)
        expected = gna.discover(local, task, progress=False, stages=SEARCHED)
        actual = gna.discover(remote, task, progress=False, stages=SEARCHED)
    assert actual.cost["requests"] == 10 and expected.cost["requests"] == 0
    assert actual.gather and actual.aggregate and actual.needs["gather"].curve
    stages_run, parts = actual.cost["stages"], actual.cost["confirm"]  # where the requests went
    assert sum(spent["requests"] for spent in stages_run.values()) == 10
    assert {k: sum(part[k] for part in parts.values()) for k in COUNTS} == {k: stages_run["confirm"][k] for k in COUNTS}
    assert parts["path patching"]["requests"] == 3 and parts["MIB score"]["requests"] == 1
    a, b = actual.to_dict(), expected.to_dict()
    for data in (a, b):
        data.pop("cost")
        data["settings"].pop("estimate")  # a remote model has no prefix cache: its scans cost more passes
    _same(a, b)


@pytest.mark.slow
def test_the_servers_ordered_search_continues_greedily_as_the_local_one():
    """The deep Llama toy at 4 layers: its Gather search in order ends short of chance
    (L1H0 0.400, +L1H2 0.375, +L1H3 rose), so both runs continue it by the greedy rule (the
    server with its own memo): +L1H1 0.330. The same circuit, field for field (as above), in
    10 requests."""
    local = deep_toy("llama", 4, backend="nnsight")
    remote = gna.load(copy.deepcopy(local.hf_model), tokenizer=local.tokenizer, remote="local")
    remote.name = local.name
    task = gna.toy_task("llama", 200, seed=4242)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gna.discovery.PositionalAnswerWarning)
        expected = gna.discover(local, task, progress=False, stages=SEARCHED)
        actual = gna.discover(remote, task, progress=False, stages=SEARCHED)
    assert actual.cost["requests"] == 10
    assert expected.needs["gather"].heads == [gna.Head(1, 0), gna.Head(1, 2), gna.Head(1, 1)]  # the order's two, then the greedy step's
    a, b = actual.to_dict(), expected.to_dict()
    for data in (a, b):
        data.pop("cost")
        data["settings"].pop("estimate")
    _same(a, b)
