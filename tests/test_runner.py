"""The engine discovery runs on (`gna_interp.discovery.runner`): which one a model gets, and
that both give `evaluate`'s numbers, the remote one in one request; and the two counts the
runner protocol brought to zero, kept there: no stage probes the backend for ``remote``, and
no forward of a plan skips `GnaModel.run_plan`."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

import gna_interp as gna
from gna_interp.discovery import HeadEvidence
from gna_interp.discovery.runner import LocalRunner, RemoteRunner, runner_for
from gna_interp.zoo.deep import deep_toy

PACKAGE = Path(__file__).resolve().parents[1] / "gna_interp"
H = gna.Head


@pytest.fixture(scope="module")
def pair():
    local = deep_toy("mamba2_counting", 3, backend="nnsight")
    remote = gna.load(copy.deepcopy(local.hf_model), tokenizer=local.tokenizer, remote="local")
    remote.name = local.name
    return local, remote, gna.toy_task("mamba2_counting", 24, seed=7)


def test_each_model_gets_its_engine(pair):
    local, remote, _ = pair
    assert isinstance(runner_for(local), LocalRunner) and not isinstance(runner_for(local), RemoteRunner)
    found = runner_for(remote)
    assert isinstance(found, RemoteRunner) and found.batched and not found.has_backward and not found.has_prefix_cache
    assert runner_for(local).has_backward and runner_for(local).has_prefix_cache and not runner_for(local).batched
    with remote.ablated([H(1, 0)]):  # an active context: the local code path, one request per forward
        inside = runner_for(remote)
        assert type(inside) is LocalRunner and not inside.has_backward


def test_both_engines_give_evaluates_accuracies(pair):
    local, remote, task = pair
    runs = [(task, []), (task, [gna.Ablate([H(1, 2)])]), (task, [gna.Ablate([H(1, 0), H(1, 3)], positions=[-1] * len(task))])]
    expected = [gna.evaluate(local, t, interventions, progress=False).accuracy for t, interventions in runs]
    with gna.cost_meter(local) as cost:
        assert runner_for(local).accuracies(runs) == expected
    assert cost.requests == 0 and cost.forwards == len(runs)
    with gna.cost_meter(remote) as cost:
        assert runner_for(remote).accuracies(runs) == pytest.approx(expected, abs=1e-9)
    assert cost.requests == 1  # every run in one request
    assert runner_for(local).accuracy(task, runs[1][1]) == expected[1]


def _lines(pattern: str, allowed: set[str]) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if name in allowed:
            continue
        found += [f"{name}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(pattern, line)]
    return found


def test_no_stage_probes_the_backend_for_remote():
    """`GnaModel.is_remote` is the one probe (`models/handle.py`); the engines ask it."""
    assert _lines(r"getattr\([\w.]*backend, \"remote\"", {"models/handle.py"}) == []


def test_every_forward_of_a_plan_goes_through_run_plan():
    """`backend.run(` only in the handle (`run_plan`) and the prefix cache behind it."""
    assert _lines(r"backend\.run\(", {"models/handle.py", "models/prefix.py"}) == []


def test_what_each_engine_measures_ahead(pair):
    """Locally nothing is measured ahead; remotely the first request gives `evaluate`'s clean
    accuracy in one request, and the joint pool ahead is every head of the harmful heads'
    layers not examined yet (listed here by hand)."""
    local, remote, task = pair
    assert runner_for(local).first_request(task, ("truncation", "layers"), False, []) is None
    assert runner_for(local).pool_ahead([H(1, 0)], {}, 64) == []
    with gna.cost_meter(remote) as cost:
        first = runner_for(remote).first_request(task, ("truncation", "layers"), False, [])
    assert cost.requests == 1
    assert first is not None and first.clean.accuracy == pytest.approx(gna.evaluate(local, task, progress=False).accuracy, abs=1e-9)
    examined = {H(1, 1): HeadEvidence(H(1, 1), None, 0.5, True)}
    expected = [H(1, h) for h in range(local.heads_per_layer[1]) if h != 1]
    assert runner_for(remote).pool_ahead([H(1, 0)], examined, 64) == expected
    assert runner_for(remote).pool_ahead([H(1, 0)], examined, local.heads_per_layer[1] - 1) == []  # a wide layer: no pool ahead
