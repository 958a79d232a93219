"""Every example runs: the offline ones as they are, the ones that need real weights on
tiny random models of the same family through the same code path (env overrides)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import pytest

import gna_interp as gna
from gna_interp.models.tiny import tiny_model
from gna_interp.tasks.toy import VOCAB_SIZE

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MMLU_ROWS = [
    {"question": f"Question {i}?", "subject": "anatomy", "choices": ["apple", "river", "stone", "cloud"], "answer": i % 4}
    for i in range(12)
]


def run(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Run an example as ``python script`` would, but in this process (a subprocess spends
    most of a small example's time importing torch, transformers and the backends): its
    environment, working folder, ``argv`` and warning filters are set for the run and
    restored after; an exception is exit status 1 with its traceback on stderr."""
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    out, err = io.StringIO(), io.StringIO()
    code = 0
    os.environ.update(env)
    os.chdir(tmp_path)
    sys.argv = [str(EXAMPLES / script)]
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("default")  # a plain interpreter's filters, not the suite's "error"
            try:
                runpy.run_path(str(EXAMPLES / script), run_name="__main__")
            finally:
                for item in caught:  # on stderr, as a plain interpreter prints them
                    err.write(warnings.formatwarning(item.message, item.category, item.filename, item.lineno))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception:
        code = 1
        err.write(traceback.format_exc())
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
    return subprocess.CompletedProcess(sys.argv, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def mmlu_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mmlu") / "test.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in MMLU_ROWS))
    return path


def tiny_folder(tmp_path: Path, family: str) -> Path:
    folder = tmp_path / family
    tiny_model(family, seed=0, vocab_size=VOCAB_SIZE).save_pretrained(folder)
    gna.tasks.toy_tokenizer().save_pretrained(folder)
    return folder


def _docs_discovery() -> str:
    """The discovery guide and its record (docs/records/discovery.md holds the measurements)."""
    docs = EXAMPLES.parent / "docs"
    return (docs / "discovery.md").read_text() + (docs / "records" / "discovery.md").read_text()


def _check_demo(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    assert (tmp_path / "gna-report" / "index.html").is_file()


def _check_path_isolation(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """The figures docs/patching.md quotes: L1H4's and L1H5's own B, and B for the whole layer."""
    rows = {m[0]: m[1:] for m in re.findall(r"^(L1H\d+|all 8)\s+(-?[\d.]+)\s+(-?[\d.]+)$", result.stdout, re.M)}
    assert len(rows) == 9, result.stdout
    docs = " ".join((EXAMPLES.parent / "docs" / "patching.md").read_text().split())
    own = f"L1H4 carries {rows['L1H4'][1]} of the clean - corrupt logit difference and L1H5 {rows['L1H5'][1]};"
    assert f"{own} patching `B` for the whole layer carries {rows['all 8'][1]}" in docs, rows


def _check_conv_gathering(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """The figures docs/records/discovery.md quotes for the critical Gather head."""
    rows = {m[0]: m[1:] for m in re.findall(r"^(L0H\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", result.stdout, re.M)}
    assert len(rows) == 8, result.stdout
    implicit, _, folded, with_skip = rows["L0H0"]
    assert f"{implicit} -> {folded} -> {with_skip}" in _docs_discovery()


def _check_aggregate_by_key(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """The figures docs/records/discovery.md quotes (the identities are asserted in the script)."""
    docs = _docs_discovery()
    quoted = 0
    sections = result.stdout.strip().split("\n\n")
    held = re.findall(r"^(L1H\d+)\s+([+-][\d.]+)\s+([+-][\d.]+)$", sections[-1], re.M)  # the MLP-held table
    assert len(held) == 4 and all(f"| {head} | {total} | {direct} |" in docs for head, total, direct in held), held
    for section in sections[:-1]:
        toy = section.split(":")[0]
        rows = re.findall(r"^(L\d+H\d+)((?:\s+[+-][\d.]+){4})$", section, re.M)
        assert toy in ("toy-llama_4heads", "toy-mamba2_8heads") and rows, section
        for head, numbers in rows:
            if f"| {toy} {head} |" in docs:
                assert f"| {toy} {head} | " + " | ".join(numbers.split()) + " |" in docs, (toy, head, numbers)
                quoted += 1
    assert quoted == 7, quoted


def _check_toy_zoo(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """Each toy on its own task: clean accuracy near its card's, not near chance."""
    lines = [line for line in result.stdout.splitlines() if " clean " in line and "(card " in line]
    assert len(lines) == len(gna.toy_names()), result.stdout
    for line in lines:
        clean, card = (float(x) for x in re.search(r"clean ([\d.]+) \(card ([\d.]+)\)", line).groups())
        assert abs(clean - card) <= 0.05, line


def _check_mib_circuits(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """MIB's own count for GPT-2's shape (its paper and graph files: 32,491 edges), both
    files read back equal, and every faithfulness at the last budget 1 (every edge kept)."""
    assert "GPT-2's shape: 158 nodes, 32491 edges" in result.stdout, result.stdout
    assert result.stdout.count("scores read back equal: True") == 2, result.stdout
    last = re.findall(r"^\s+(\d+)\s+1\.000\s+(-?[\d.]+)\s+([\d.]+)\s+(\d+)$", result.stdout, re.M)
    assert [(n, f, k) for n, _, f, k in last] == [("110", "1.000000", "110"), ("417", "1.000000", "417")], last
    assert json.loads((tmp_path / "mib" / "llama_scores.json").read_text())["cfg"] == {
        "n_layers": 2,
        "n_heads": 4,
        "parallel_attn_mlp": False,
        "d_model": 64,
    }


OUTPUT_CHECKS = {
    "mib_circuits.py": _check_mib_circuits,
    "toy_demo.py": _check_demo,
    "conv_gathering.py": _check_conv_gathering,
    "aggregate_by_key.py": _check_aggregate_by_key,
    "path_isolation.py": _check_path_isolation,
    "toy_zoo.py": _check_toy_zoo,
}


FEWER_PROMPTS = {"toy_demo.py": "48", "toy_zoo.py": "100", "mib_circuits.py": "32"}
"""Prompts per model for the examples that take ``GNA_EXAMPLE_N``: the same code on fewer
prompts (the demo's full run is `gna-interp demo`; the zoo's accuracies stay within the
check's 0.05 at 100 prompts: standard error <= 0.02 at the cards' 0.98)."""


@pytest.mark.parametrize(
    "script",
    [
        "quickstart.py",
        pytest.param("toy_zoo.py", marks=pytest.mark.slow),
        pytest.param("toy_demo.py", marks=pytest.mark.slow),  # `gna-interp demo` is tested in test_cli
        "conv_gathering.py",
        "aggregate_by_key.py",
        "path_isolation.py",
        pytest.param("mib_circuits.py", marks=pytest.mark.slow),  # docs/mib.md runs the same calls
    ],
)
def test_offline_examples(script, tmp_path):
    result = run(script, tmp_path, **({"GNA_EXAMPLE_N": FEWER_PROMPTS[script]} if script in FEWER_PROMPTS else {}))
    assert result.returncode == 0, result.stderr[-3000:]
    if script in OUTPUT_CHECKS:
        OUTPUT_CHECKS[script](result, tmp_path)


def test_ssm_on_tlens_example_runs_in_process(capsys):
    """In this process (the libraries are already imported: a subprocess would spend most
    of its time importing them); the script asserts that both backends agree."""
    runpy.run_path(str(EXAMPLES / "ssm_on_tlens.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("largest difference") == 2 and "blocks.1.mixer.out_proj.hook_in" in out, out


@pytest.mark.parametrize(
    "script,family,extra",
    [
        ("paper_llama31_8b.py", "llama", {}),
        ("falcon_mamba_7b.py", "falcon_mamba", {}),
        ("ndif_llama70b.py", "llama", {"GNA_EXAMPLE_REMOTE": "local"}),
        ("zamba2_hybrid.py", "zamba2", {}),
    ],
)
def test_examples_that_need_weights_run_on_tiny_models(script, family, extra, tmp_path, mmlu_file):
    env = {"GNA_EXAMPLE_MODEL": str(tiny_folder(tmp_path, family)), "GNA_EXAMPLE_MMLU": str(mmlu_file), "GNA_EXAMPLE_N": "8", **extra}
    result = run(script, tmp_path, **env)
    assert result.returncode == 0, result.stderr[-3000:]


def test_llamba_example_runs_on_the_cpu_twin(tmp_path, mmlu_file):
    """`llamba_8b.py` on a tiny Llamba twin folder (Cartesia's naming) and a tiny Llama donor
    of the same width: clean and ablated MMLU, then the layer swap, restored after."""
    from gna_interp.models.llamba import save_llamba, tiny_llamba

    twin = save_llamba(tiny_llamba(seed=0, vocab_size=VOCAB_SIZE), tmp_path / "llamba")
    gna.tasks.toy_tokenizer().save_pretrained(twin)
    donor = tmp_path / "llama"
    tiny_model("llama", seed=0, vocab_size=VOCAB_SIZE, hidden_size=32, num_attention_heads=4, num_key_value_heads=2).save_pretrained(donor)
    env = {"GNA_EXAMPLE_MODEL": str(twin), "GNA_EXAMPLE_DONOR": str(donor), "GNA_EXAMPLE_MMLU": str(mmlu_file), "GNA_EXAMPLE_N": "8"}
    result = run("llamba_8b.py", tmp_path, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "family=llamba" in result.stdout and "MMLU clean" in result.stdout, result.stdout
    assert re.search(r"MMLU with Llama's layer 2: [\d.]+ -> [\d.]+", result.stdout), result.stdout


@pytest.mark.slow
def test_discover_at_depth_example(tmp_path):
    """A 3-layer deep toy on 24 prompts: the summary with its cost, and 10 remote requests."""
    result = run("discover_at_depth.py", tmp_path, GNA_EXAMPLE_LAYERS="3", GNA_EXAMPLE_N="24")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cost " in result.stdout and "remote='local': 10 requests" in result.stdout, result.stdout


def test_make_notebooks_keeps_the_executed_copies(tmp_path):
    """`make notebooks` keeps each executed notebook, outputs included, in the folder the
    README names; a failing notebook is kept too, its outputs up to the failing cell."""
    import nbformat

    sys.path.insert(0, str(EXAMPLES))
    try:
        import run_notebooks
    finally:
        sys.path.remove(str(EXAMPLES))
    makefile = (EXAMPLES.parent / "Makefile").read_text()
    kept_in = re.search(r"run_notebooks\.py --keep (\S+)", makefile)
    assert kept_in is not None and f"`{kept_in.group(1)}/`" in (EXAMPLES.parent / "README.md").read_text()
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)"), nbformat.v4.new_code_cell("1 / 0")])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, tmp_path / "sum.ipynb")
    problems = run_notebooks.run(tmp_path / "sum.ipynb", keep=tmp_path / "kept")
    assert problems and "ZeroDivisionError" in problems[-1]
    executed = nbformat.read(tmp_path / "kept" / "sum.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "42\n"
    assert executed.cells[1].outputs[0]["ename"] == "ZeroDivisionError"
