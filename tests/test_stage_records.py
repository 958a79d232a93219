"""Each stage of `plan.PLAN` returns its own typed record, and the circuit is assembled from
the records (issue 51, item 4).

References: `discover`'s circuit on the same toy (the plain run, no records asked for), the
cost meter's own count of the forwards, and each record as its run directory saved it when
its stage ended (a later stage that changed it would show)."""

from __future__ import annotations

import json
import warnings

import pytest

import gna_interp as gna
from gna_interp.core.errors import GnaValueError
from gna_interp.discovery import DiscoverySettings, memo
from gna_interp.discovery.pipeline import _context, discover_records
from gna_interp.discovery.plan import PLAN
from gna_interp.discovery.records import record_to_dict
from gna_interp.discovery.run_dir import RunDir
from gna_interp.discovery.stage_records import HeadScanRecord, Records, assemble

N = 32


def exact(data: dict) -> str:
    """JSON with every bit of every float (NaN included: ``nan != nan`` in a dict compare)."""
    return json.dumps(data, sort_keys=True)


def without_cost(circuit: gna.GnaCircuit) -> dict:
    data = circuit.to_dict()
    data.pop("cost")
    return data


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    """The Llama toy's plan run with its records, in a run directory, and the plain circuit."""
    model, task = gna.load_toy("llama"), gna.toy_task("llama", n=N)
    folder = tmp_path_factory.mktemp("run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = gna.discover(model, task, progress=False)
        with gna.cost_meter(model) as meter:
            circuit, records = discover_records(model, task, run_dir=folder)
    return model, task, folder, reference, circuit, records, meter


def test_every_stage_ran_with_its_typed_record(llama_run):
    """The plain check: on the Llama toy every stage of PLAN applies, each returned its own
    record, in PLAN's order; their costs add up to what the meter counted."""
    _, _, _, reference, _, records, meter = llama_run
    assert records.names() == [step.name for step in PLAN]
    assert [type(r) for r in records] == [step.record for step in PLAN]
    assert sum(r.cost["forwards"] for r in records) == meter.forwards == reference.cost["forwards"]
    assert sum(r.cost["rows"] for r in records) == meter.rows


def test_the_assembled_circuit_is_discovers(llama_run):
    """The circuit assembled from the records is `discover`'s, field for field (its cost
    summary, added by `discover`, aside)."""
    _, _, _, reference, circuit, _, _ = llama_run
    assert exact(without_cost(circuit)) == exact(without_cost(reference))
    assert circuit.gather and circuit.aggregate  # the toy's circuit is found: not an empty comparison


def test_no_stage_changed_an_earlier_record(llama_run):
    """Each record at the end of the run equals the one its run directory saved when its
    stage ended: no later stage changed it."""
    _, _, folder, _, _, records, _ = llama_run
    for index, record in enumerate(records):
        saved = json.loads((folder / f"stage-{index:02d}-{PLAN[index].name}.json").read_text())["record"]
        assert exact(saved) == exact(json.loads(json.dumps(record_to_dict(record)))), PLAN[index].name


def test_records_read_back_assemble_the_same_circuit(llama_run):
    """The records read back from the run directory are the same records (as JSON, exactly),
    and assemble the same circuit, field for field."""
    model, task, folder, _, circuit, records, _ = llama_run
    settings = DiscoverySettings()
    with model.prefix_cache(), memo.accuracy_memo(model):
        ctx = _context(model, task, settings, False, None)
        read = RunDir(folder, model, task, settings).read(ctx)
        assert [exact(record_to_dict(r)) for r in read] == [exact(record_to_dict(r)) for r in records]
        assert exact(assemble(ctx, read).to_dict()) == exact(circuit.to_dict())


def test_a_record_read_before_its_stage_ran_is_named():
    with pytest.raises(GnaValueError, match=r"the 'head_scan' record was read before its stage ran \(stages run: none\)"):
        Records().of(HeadScanRecord)
    with pytest.raises(GnaValueError, match=r"the 'head_scan' record was read before its stage ran"):
        _ = Records().evidence  # the evidence starts with the head scan
