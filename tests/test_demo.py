"""`gna-interp demo`'s run (issue 53): the expected time stated first, each toy's row printed
as soon as that toy is done, the slowest toy's row from a second process, and the time per toy."""

from __future__ import annotations

import re

import pytest

import gna_interp as gna
import gna_interp.demo as demo
from gna_interp.cli import main
from gna_interp.commands import DEMO_SEED

from .conftest import DEMO_TEST_PROMPTS


def row_of(stdout: str, model: str) -> list[str]:
    """The cells of ``model``'s row of the demo table (its first line)."""
    return next(line for line in stdout.splitlines() if line.startswith(model + " ")).split()


def alone_and_clean(name: str, n: int, kept: set) -> tuple[float, float]:
    """A toy's accuracy with only ``kept`` heads (every other head mean-ablated) and clean,
    measured here with `gna.evaluate` (the independent reference of the demo's figures)."""
    model, task = gna.load_toy(name), gna.toy_task(name, n, seed=DEMO_SEED)
    others = [h for h in model.heads if h not in kept]
    return gna.evaluate(model, task, [gna.Ablate(others, how="mean", corrupt=task)]).accuracy, gna.evaluate(model, task).accuracy


def test_demo_states_its_time_first_and_times_each_toy(demo_run):
    """The first line names every toy with its prompts before any work; the line after the
    legend gives each toy's seconds, in the table's order."""
    result, _ = demo_run
    lines = result.stdout.splitlines()
    models = [name for name in demo.DEMO_MODELS if name in gna.toy_names()]
    expected = f"about {demo.DEMO_SECONDS} s on an idle 2-core machine at the default prompts: "  # the suite's demo runs --n
    assert lines[0].startswith(f"demo: {len(models)} toys, {expected}"), lines[0]
    assert re.findall(r"(\w+) \((\d+) prompts", lines[0]) == [(name, str(DEMO_TEST_PROMPTS)) for name in models]
    timing = next(line for line in lines if line.startswith("time per toy"))
    assert re.findall(r"toy-(\w+) [\d.]+ s", timing) == models
    assert lines[1].startswith("model ") and set(lines[2]) == {"-"}  # the table's header, before any toy's row


def test_demo_row_from_the_second_process_is_measured_again_here(demo_run):
    """The slowest toy (`DEMO_APART`, run in a second process on a machine of two cores) has
    the row of its own JSON circuit: its ``clean`` and ``alone`` cells are the accuracies this
    process measures with `gna.evaluate` (its heads kept, every other head mean-ablated)."""
    import json

    result, report = demo_run
    for name in demo.DEMO_APART:
        circuit = json.loads((report / f"toy-{name}.json").read_text())
        kept = {gna.Head.parse(h) for h in [*circuit["gather"], *circuit["aggregate"]]}
        alone, clean = alone_and_clean(name, DEMO_TEST_PROMPTS, kept)
        cells = row_of(result.stdout, f"toy-{name}")
        assert (cells[1], cells[6]) == (f"{alone:.3f}", f"{clean:.3f}"), cells


@pytest.mark.slow
def test_demo_prints_each_row_as_its_toy_finishes(tmp_path, capsys, monkeypatch):
    """In process, on two toys: when the second toy starts, the first toy's row is already
    printed (and the second's is not), with the first circuit's figures re-measured by `gna.evaluate`."""
    monkeypatch.setattr("gna_interp.commands.DEMO_MODELS", ("llama", "mamba2"))
    printed_before: dict[str, str] = {}
    runs: dict[str, demo.ToyRun] = {}
    real = demo.run_toy

    def watched(name, n, **options):
        printed_before[name] = capsys.readouterr().out
        runs[name] = real(name, n, **options)
        return runs[name]

    monkeypatch.setattr(demo, "run_toy", watched)
    assert main(["demo", "--quiet", "--n", "16", "--out", str(tmp_path / "report")]) == 0
    assert "toy-llama " not in printed_before["llama"] and "toy-mamba2 " not in printed_before["mamba2"]
    cells = row_of(printed_before["mamba2"], "toy-llama")
    circuit = runs["llama"].circuit
    alone, clean = alone_and_clean("llama", 16, {*circuit.gather, *circuit.aggregate})
    assert (cells[1], cells[6]) == (f"{alone:.3f}", f"{clean:.3f}"), cells


def test_curve_sizes_are_the_powers_of_two_below_the_head_count():
    """`curve_sizes` against a brute-force twin: every k in 1..n-1 that is a power of two."""
    for n_heads in (1, 2, 8, 16, 24, 256, 257):
        assert demo.curve_sizes(n_heads) == [k for k in range(1, n_heads) if k & (k - 1) == 0], n_heads


def test_torch_threads_are_restored_after_an_error():
    """The demo's thread setting does not outlive its block, an exception included."""
    import torch

    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"), demo.torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
