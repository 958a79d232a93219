"""Every example runs: the offline ones as they are, the ones that need real weights on
tiny random models of the same family through the same code path (env overrides)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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
    environment = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=environment
    )


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
    return (EXAMPLES.parent / "docs" / "discovery.md").read_text()


def _check_demo(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    assert (tmp_path / "gna-report" / "index.html").is_file()


def _check_conv_gathering(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """The figures docs/discovery.md quotes for the critical Gather head."""
    rows = {m[0]: m[1:] for m in re.findall(r"^(L0H\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", result.stdout, re.M)}
    assert len(rows) == 8, result.stdout
    implicit, _, folded, with_skip = rows["L0H0"]
    assert f"{implicit} -> {folded} -> {with_skip}" in _docs_discovery()


def _check_aggregate_by_key(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """The figures docs/discovery.md quotes (the identities are asserted in the script)."""
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


OUTPUT_CHECKS = {
    "toy_demo.py": _check_demo,
    "conv_gathering.py": _check_conv_gathering,
    "aggregate_by_key.py": _check_aggregate_by_key,
    "toy_zoo.py": _check_toy_zoo,
}


@pytest.mark.parametrize("script", ["quickstart.py", "toy_zoo.py", "toy_demo.py", "conv_gathering.py", "aggregate_by_key.py"])
def test_offline_examples(script, tmp_path):
    result = run(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    if script in OUTPUT_CHECKS:
        OUTPUT_CHECKS[script](result, tmp_path)


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


def test_discover_at_depth_example(tmp_path):
    """A 3-layer deep toy on 24 prompts: the summary with its cost, and 10 remote requests."""
    result = run("discover_at_depth.py", tmp_path, GNA_EXAMPLE_LAYERS="3", GNA_EXAMPLE_N="24")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cost " in result.stdout and "remote='local': 10 requests" in result.stdout, result.stdout
