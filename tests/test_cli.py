"""The `gna-interp` command end to end, in subprocesses, on the bundled toy models."""

from __future__ import annotations

import json
import re

import pytest

import gna_interp as gna
from gna_interp.cli import main
from gna_interp.commands import DEMO_SEED

from .conftest import DEMO_TEST_PROMPTS


def run(args, capsys) -> tuple[int, str, str]:
    """The command in-process (the console script's code path, without a new interpreter):
    exit status, stdout, stderr."""
    status = main(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_demo_writes_an_offline_report(demo_run):
    result, report = demo_run
    for name in gna.toy_names():
        if name in ("llama", "mamba2"):
            assert f"toy-{name}" in result.stdout
    assert "clean" in result.stdout and "-gather" in result.stdout
    page = (report / "index.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert all((report / img).is_file() for img in re.findall(r'<img src="([^"]+)"', page))
    assert not re.search(r"\d\.\d{5,}", result.stdout)  # figures are rounded (0.310, not 0.3100000023841858)


def test_demo_report_has_each_circuits_faithfulness(demo_run):
    """Per toy, the demo prints what its circuit carries alone and its report section says
    the same: the accuracy with only the circuit's heads kept (every other head
    mean-ablated), re-measured here with `gna.evaluate`, and the curve is drawn."""
    result, report = demo_run
    page = (report / "index.html").read_text()
    printed = re.findall(r"(\S+): faithfulness: the circuit's (\d+) heads alone .*? ([\d.]+), (\d+)% of clean ([\d.]+)", result.stdout)
    models = [name for name in ("llama", "mamba2", "falcon_h1", "mamba") if name in gna.toy_names()]
    assert [name for name, *_ in printed] == [f"toy-{name}" for name in models], result.stdout[-3000:]
    assert page.count('<figure data-role="faithfulness-curve">') == len(models)
    circuit = json.loads((report / "toy-llama.json").read_text())
    model, task = gna.load_toy("llama"), gna.toy_task("llama", DEMO_TEST_PROMPTS, seed=DEMO_SEED)
    kept = {gna.Head.parse(h) for h in [*circuit["gather"], *circuit["aggregate"]]}
    alone = gna.evaluate(model, task, [gna.Ablate([h for h in model.heads if h not in kept], how="mean", corrupt=task)]).accuracy
    clean = gna.evaluate(model, task).accuracy
    _, n, printed_alone, share, printed_clean = printed[0]
    assert (int(n), printed_alone, printed_clean, f"{share}%") == (len(kept), f"{alone:.3f}", f"{clean:.3f}", f"{alone / clean:.0%}")
    assert f"<b>{alone:.3f}, {alone / clean:.0%} of clean</b> ({clean:.3f})" in page


def test_discover_json_and_report(tmp_path, capsys):
    status, out, err = run(["discover", "--model", "mamba2", "--n", "48", "--json", "--out", str(tmp_path / "d"), "--quiet"], capsys)
    assert status == 0, err[-2000:]
    data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    assert data["family"] == "mamba2" and data["n_prompts"] == 48 and data["aggregate"]
    assert (tmp_path / "d" / "index.html").is_file()


def test_discover_stability_flag_records_the_samples(capsys):
    """`--stability K` re-runs the search on K prompt samples: the JSON holds K sets per
    role, each the set one re-run chose (checked against the library call's own record)."""
    status, out, err = run(["discover", "--model", "mamba2", "--n", "24", "--stability", "2", "--json", "--quiet"], capsys)
    assert status == 0, err[-2000:]
    data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    samples = data["stability"]["sets"]
    assert len(samples) == 2 and all(sample["gather"] for sample in samples)
    assert data["stability"]["sampling"] == "bootstrap" and data["stability"]["n_prompts"] == [24, 24]


def test_ablate_prints_accuracy_before_and_after(capsys):
    status, out, err = run(["ablate", "--model", "mamba2", "--head", "0.0", "--n", "100"], capsys)
    assert status == 0, err[-2000:]
    before, after = map(float, re.search(r"accuracy clean ([\d.]+) -> ([\d.]+)", out).groups())
    model = gna.load_toy("mamba2")
    task = gna.toy_task("mamba2", 100, seed=0)
    assert before == pytest.approx(gna.evaluate(model, task).accuracy, abs=1e-3)
    assert after == pytest.approx(gna.evaluate(model, task, [gna.Ablate([gna.Head(0, 0)])]).accuracy, abs=1e-3)


@pytest.mark.parametrize("suffix", ["html", "png"])
def test_patterns_file(tmp_path, suffix, capsys):
    out = tmp_path / "new folder" / f"p.{suffix}"  # a missing folder is created
    args = ["patterns", "--model", "mamba2", "--head", "1.6", "--head", "L0H3"]
    args += ["--prompt", "A. apple lamp\nB. river stone\nQuery: apple\nAnswer:", "--out", str(out)]
    status, _, err = run(args, capsys)
    assert status == 0, err[-2000:]
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == "png" else (b"L1H6" in data and b"apple" in data)


@pytest.mark.parametrize(
    "args,message",
    [
        (["ablate", "--model", "mamba2", "--head", "1-4"], "cannot parse head '1-4'"),
        (["ablate", "--model", "mamba2", "--head", "1.9"], "head L1H9 out of range"),
        (["ablate", "--model", "./no/such/model", "--head", "0.0"], "unknown model './no/such/model'"),
        (["ablate", "--model", "nosuchmodel", "--head", "0.0"], "unknown model 'nosuchmodel'"),
        (["discover", "--model", "mamba2", "--n", "0"], "--n 0: expected a positive number"),
        (["discover", "--model", "mamba2", "--stability", "0"], "--stability 0: expected a positive number of prompt samples"),
        (["patterns", "--model", "mamba2", "--head", "0.0", "--out", "x.txt"], "expected a file name ending in .html or .png"),
        (["discover", "--model", "mamba2", "--task", "mmlu", "--subjects", "astrology", "--mmlu-path", "."], "unknown MMLU subject"),
    ],
)
def test_bad_arguments_are_one_line_errors(args, message, capsys):
    assert main(args) == 2  # in-process: the same code path as the console script, faster
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_out_dir_that_is_a_file(tmp_path, capsys):
    file = tmp_path / "taken"
    file.write_text("x")
    for args in (["demo", "--out", str(file)], ["discover", "--model", "mamba2", "--n", "40", "--out", str(file), "--quiet"]):
        assert main(args) == 2
        assert "is an existing file" in capsys.readouterr().err


def test_help_everywhere(capsys):
    for command in ([], ["demo"], ["discover"], ["ablate"], ["patterns"], ["zoo"], ["zoo", "train"], ["zoo", "list"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*command, "--help"])
        assert exit_info.value.code == 0 and "usage: gna-interp" in capsys.readouterr().out
