"""``discover(..., run_dir=...)``: a discovery killed partway carries on after its last
finished stage and gives the uninterrupted run's circuit, field for field, cost included
(wall time and sampled memory aside); a folder of another run is refused, naming the
difference; and `DiscoverySettings`, the one settings object.

References: the circuit of a plain ``discover`` (no run directory) on the same toy, and the
cost meter's own count of the forwards a run spends."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaValueError
from gna_interp.discovery import DiscoverySettings, RoleThresholds
from gna_interp.discovery.plan import PLAN

N = 32
BLOCK_IN = [s.name for s in PLAN].index("joint")
"""The stage the child is killed in: the joint search, after its second accuracy measured."""

CHILD = """
import sys, time, warnings
warnings.simplefilter("ignore")
from pathlib import Path
import gna_interp as gna
from gna_interp.discovery import memo, run_dir

run_dir.MEMO_EVERY_S = 0.0  # save the memo after every accuracy: the kill finds it on disk
folder, block_in, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
model = gna.load_toy("llama")
measured = memo.evaluate
seen = []

def evaluate(*args, **kwargs):
    opened = memo.open_memo(model)
    if opened is not None and opened.stage == block_in and len(seen) >= 2:
        (folder / "blocked").write_text("stuck in the stage")  # the parent kills us now
        time.sleep(3600)
    if opened is not None and opened.stage == block_in:
        seen.append(1)
    return measured(*args, **kwargs)

memo.evaluate = evaluate
gna.discover(model, gna.toy_task("llama", n=n), progress=False, run_dir=folder)
"""


def comparable(circuit: gna.GnaCircuit) -> dict:
    """``to_dict()`` without the cost's wall time and sampled peak memory."""
    data = circuit.to_dict()
    for key in ("seconds", "peak_memory_mb"):
        data["cost"].pop(key)
    return data


def quiet_discover(model, task, **kwargs) -> gna.GnaCircuit:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gna.discover(model, task, progress=False, **kwargs)


@pytest.fixture(scope="module")
def llama():
    model, task = gna.load_toy("llama"), gna.toy_task("llama", n=N)
    return model, task, quiet_discover(model, task)


def test_a_killed_run_resumes_to_the_uninterrupted_circuit(tmp_path, llama):
    """SIGKILL in the joint stage (two of its accuracies measured and saved); resumed in this
    process: the same circuit, pass counts included, with fewer forwards actually run."""
    model, task, reference = llama
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(gna.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(BLOCK_IN), str(N)], env=env)
    try:
        for _ in range(6000):  # polling for the child's marker, not timing it
            if (tmp_path / "blocked").exists() or child.poll() is not None:
                break
            time.sleep(0.05)
        assert (tmp_path / "blocked").exists(), f"the child never reached stage {BLOCK_IN} (exit code {child.poll()})"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    finished = sorted(p.name for p in tmp_path.glob("stage-*.json"))
    assert finished == [f"stage-{i:02d}-{PLAN[i].name}.json" for i in range(BLOCK_IN)]
    saved = json.loads((tmp_path / "memo.json").read_text())["entries"]
    owed = [key for key, _, stage, counts in saved if stage == BLOCK_IN and counts]
    assert len(owed) == 2  # the killed stage's two accuracies, each with its forward's cost
    with gna.cost_meter(model) as meter:
        resumed = quiet_discover(model, task, run_dir=tmp_path)
    assert comparable(resumed) == comparable(reference)
    assert resumed.cost["forwards"] == reference.cost["forwards"]
    assert 0 < meter.forwards < reference.cost["forwards"]  # the finished stages were read, not run


def test_a_finished_run_dir_gives_its_circuit_without_a_forward(tmp_path, llama):
    model, task, reference = llama
    first = quiet_discover(model, task, run_dir=tmp_path)
    with gna.cost_meter(model) as meter:
        again = quiet_discover(model, task, run_dir=tmp_path)
    assert meter.forwards == 0 and meter.rows == 0
    assert comparable(again) == comparable(first) == comparable(reference)


@pytest.mark.parametrize("cut", [1, 4, 7])
def test_resuming_after_any_stage_gives_the_same_circuit(tmp_path, llama, cut):
    """The run directory of a finished run cut back to its first ``cut`` stages (the memo of
    the whole run kept: the later stages' accuracies are owed, charged when used)."""
    model, task, reference = llama
    quiet_discover(model, task, run_dir=tmp_path)
    for path in sorted(tmp_path.glob("stage-*.json"))[cut:]:
        path.unlink()
    assert comparable(quiet_discover(model, task, run_dir=tmp_path)) == comparable(reference)


def test_a_run_dir_of_another_run_is_refused_naming_the_difference(tmp_path, llama):
    model, task, _ = llama
    quiet_discover(model, task, run_dir=tmp_path, stages=("truncation",))
    with pytest.raises(GnaValueError, match=r"settings max_candidates: 16 then, 8 now"):
        quiet_discover(model, task, run_dir=tmp_path, stages=("truncation",), max_candidates=8)
    with pytest.raises(ValueError, match=r"task prompts \(hash\): '[0-9a-f]{64}' then, '[0-9a-f]{64}' now"):
        quiet_discover(model, gna.toy_task("llama", n=N, seed=1), run_dir=tmp_path, stages=("truncation",))
    changed = gna.load_toy("llama")
    with torch.no_grad():
        next(changed.hf_model.parameters()).view(-1)[0] += 1e-3
    with pytest.raises(ValueError, match=r"model weights \(hash\)") as refused:
        quiet_discover(changed, task, run_dir=tmp_path, stages=("truncation",))
    assert "settings " not in str(refused.value) and "prompts" not in str(refused.value)  # only what differs


@pytest.mark.slow
def test_a_remote_run_resumes(tmp_path):
    """``remote="local"`` (nnsight's simulation of NDIF): resumed after any saved stage, the
    same circuit and requests as the uninterrupted remote run."""
    toy = gna.load_toy("llama")
    model = gna.load(copy.deepcopy(toy.hf_model), tokenizer=toy.tokenizer, remote="local")
    task = gna.toy_task("llama", n=N)
    reference = quiet_discover(model, task)
    quiet_discover(model, task, run_dir=tmp_path)
    stages = sorted(tmp_path.glob("stage-*.json"))
    assert len(stages) >= 5
    for path in stages[3:]:
        path.unlink()
    with gna.cost_meter(model) as meter:
        resumed = quiet_discover(model, task, run_dir=tmp_path)
    assert comparable(resumed) == comparable(reference)
    assert 0 < meter.requests < reference.cost["requests"]


def test_settings_are_one_object(llama):
    """Keywords and ``settings=`` give the same circuit; the circuit's settings read back."""
    model, task, _ = llama
    settings = DiscoverySettings(max_candidates=4, thresholds=RoleThresholds(min_effect=0.05), joint_search="greedy")
    by_object = quiet_discover(model, task, settings=settings)
    by_keywords = quiet_discover(model, task, max_candidates=4, thresholds=RoleThresholds(min_effect=0.05), joint_search="greedy")
    assert comparable(by_object) == comparable(by_keywords)
    read = DiscoverySettings.from_dict(by_object.settings)
    assert read == dataclasses.replace(settings, layers=(0, 1), prescreen_keep=8)
    assert DiscoverySettings.from_dict(settings.to_dict()) == settings


def test_bad_settings_are_named():
    with pytest.raises(TypeError, match=r"unknown discover settings \['max_candidate'\] \('max_candidate': did you mean 'max_candidates'"):
        DiscoverySettings.build(max_candidate=3)
    with pytest.raises(ValueError, match=r"chance_margin=1.5: expected a number in \[0, 1\)"):
        DiscoverySettings(chance_margin=1.5)
    with pytest.raises(ValueError, match=r"max_candidates=0: expected an int of at least 1"):
        DiscoverySettings(max_candidates=0)
    with pytest.raises(ValueError, match=r"joint_search='best'"):
        DiscoverySettings(joint_search="best")
    with pytest.raises(TypeError, match=r"layers=\[0, 'x'\]: 'x' is not a layer index"):
        DiscoverySettings(layers=[0, "x"])
    with pytest.raises(TypeError, match=r"settings= and setting keywords \['max_candidates'\] both given"):
        gna.discover(gna.load_toy("llama"), gna.toy_task("llama", n=8), settings=DiscoverySettings(), max_candidates=3)


def test_the_run_directory_json_is_exact():
    """Tensors (NaN included) and memo keys (heads, positions as tensor bytes, skipped
    layers, truncations) come back equal from JSON: the same key reads the same accuracy."""
    from gna_interp.discovery.memo import memo_key
    from gna_interp.discovery.records import key_from_json, key_to_json, tensor_from_dict, tensor_to_dict

    values = torch.tensor([[0.1, float("nan")], [float("-inf"), 1 / 3]])
    back = tensor_from_dict(json.loads(json.dumps(tensor_to_dict(values))))
    assert back.dtype == values.dtype and torch.equal(back.isnan(), values.isnan())
    assert torch.equal(back.nan_to_num(), values.nan_to_num())
    interventions = [
        gna.Ablate([gna.Head(1, 2), gna.Head(0, 3)], positions=torch.tensor([0, 4])),
        gna.Ablate([gna.Head(0, 1)], positions=[-1]),
        gna.SkipLayers([1]),
        gna.Truncate(1),
    ]
    key = ("task", memo_key([]), memo_key(interventions))
    assert key_from_json(json.loads(json.dumps(key_to_json(key)))) == key
    assert hash(key_from_json(json.loads(json.dumps(key_to_json(key))))) == hash(key)
