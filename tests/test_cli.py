"""The `gna-interp` command end to end, in subprocesses, on the bundled toy models."""

from __future__ import annotations

import json
import re
import warnings
from types import SimpleNamespace

import pytest

import gna_interp as gna
from gna_interp.cli import main
from gna_interp.commands import DEMO_MODELS, DEMO_SEED
from gna_interp.scoring.carries import CARRIES_SHARE, carries_from_curve
from gna_interp.scoring.verdicts import MECHANISMS, wilson_interval
from gna_interp.viz.summary import HEADS_SHOWN

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
    status, out, err = run(
        ["discover", "--model", "mamba2_counting", "--n", "48", "--json", "--out", str(tmp_path / "d"), "--quiet"], capsys
    )
    assert status == 0, err[-2000:]
    data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    assert data["family"] == "mamba2" and data["n_prompts"] == 48 and data["aggregate"]
    assert (tmp_path / "d" / "index.html").is_file()


@pytest.mark.slow
def test_discover_stability_flag_records_the_samples(capsys):
    """`--stability K` re-runs the search on K prompt samples: the JSON holds K sets per
    role, each the set one re-run chose (checked against the library call's own record)."""
    status, out, err = run(["discover", "--model", "mamba2_counting", "--n", "24", "--stability", "2", "--json", "--quiet"], capsys)
    assert status == 0, err[-2000:]
    data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    samples = data["stability"]["sets"]
    assert len(samples) == 2 and all(sample["gather"] for sample in samples)
    assert data["stability"]["sampling"] == "bootstrap" and data["stability"]["n_prompts"] == [24, 24]


def test_discover_run_dir_keeps_the_run(tmp_path, capsys):
    """`--run-dir DIR`: each stage saved there; run again, the same circuit (the library
    call without a folder is the reference), read from the folder (its stages are all there)."""
    args = ["discover", "--model", "llama", "--n", "24", "--json", "--quiet", "--run-dir", str(tmp_path / "run")]
    circuits = []
    for _ in range(2):
        status, out, err = run(args, capsys)
        assert status == 0, err[-2000:]
        circuits.append(json.loads(out[out.index("{") : out.rindex("}") + 1]))
    reference = gna.discover(gna.load_toy("llama"), gna.toy_task("llama", 24), progress=False).to_dict()
    for data in (*circuits, reference):
        for key in ("seconds", "peak_memory_mb"):
            data["cost"].pop(key)
    assert circuits[0] == circuits[1] == json.loads(json.dumps(reference))
    assert len(list((tmp_path / "run").glob("stage-*.json"))) == len(gna.discovery.plan.PLAN)


def test_ablate_prints_accuracy_before_and_after(capsys):
    status, out, err = run(["ablate", "--model", "mamba2_counting", "--head", "0.0", "--n", "100"], capsys)
    assert status == 0, err[-2000:]
    before, after = map(float, re.search(r"accuracy clean ([\d.]+) -> ([\d.]+)", out).groups())
    model = gna.load_toy("mamba2_counting")
    task = gna.toy_task("mamba2_counting", 100, seed=0)
    assert before == pytest.approx(gna.evaluate(model, task).accuracy, abs=1e-3)
    assert after == pytest.approx(gna.evaluate(model, task, [gna.Ablate([gna.Head(0, 0)])]).accuracy, abs=1e-3)


@pytest.mark.parametrize("suffix", ["html", "png"])
def test_patterns_file(tmp_path, suffix, capsys):
    out = tmp_path / "new folder" / f"p.{suffix}"  # a missing folder is created
    args = ["patterns", "--model", "mamba2_counting", "--head", "1.6", "--head", "L0H3"]
    args += ["--prompt", "A. apple lamp\nB. river stone\nQuery: apple\nAnswer:", "--out", str(out)]
    status, _, err = run(args, capsys)
    assert status == 0, err[-2000:]
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == "png" else (b"L1H6" in data and b"apple" in data)


@pytest.mark.parametrize(
    "args,message",
    [
        (["ablate", "--model", "mamba2_counting", "--head", "1-4"], "cannot parse head '1-4'"),
        (["ablate", "--model", "mamba2_counting", "--head", "1.9"], "head L1H9 out of range"),
        (["ablate", "--model", "./no/such/model", "--head", "0.0"], "unknown model './no/such/model'"),
        (["ablate", "--model", "nosuchmodel", "--head", "0.0"], "unknown model 'nosuchmodel'"),
        (["discover", "--model", "mamba2_counting", "--n", "0"], "--n 0: expected a positive number"),
        (["discover", "--model", "mamba2_counting", "--stability", "0"], "--stability 0: expected a positive number of prompt samples"),
        (["patterns", "--model", "mamba2_counting", "--head", "0.0", "--out", "x.txt"], "expected a file name ending in .html or .png"),
        (
            ["discover", "--model", "mamba2_counting", "--task", "mmlu", "--subjects", "astrology", "--mmlu-path", "."],
            "unknown MMLU subject",
        ),
        (["ablate", "--model", "mamba2_counting", "--head", "0.0", "--device", "gpu"], "--device 'gpu': expected cpu, cuda, cuda:N"),
        (["ablate", "--model", "mamba2_counting", "--head", "0.0", "--dtype", "float16"], "--dtype float16 with toy 'mamba2_counting'"),
        (["discover", "--model", "mamba2_counting", "--device", "cuda:7"], "--device 'cuda:7': this machine has"),
    ],
)
def test_bad_arguments_are_one_line_errors(args, message, capsys):
    assert main(args) == 2  # in-process: the same code path as the console script, faster
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_out_dir_that_is_a_file(tmp_path, capsys):
    file = tmp_path / "taken"
    file.write_text("x")
    for args in (["demo", "--out", str(file)], ["discover", "--model", "mamba2_counting", "--n", "40", "--out", str(file), "--quiet"]):
        assert main(args) == 2
        assert "is an existing file" in capsys.readouterr().err


def test_help_everywhere(capsys):
    for command in ([], ["demo"], ["discover"], ["ablate"], ["patterns"], ["zoo"], ["zoo", "train"], ["zoo", "list"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*command, "--help"])
        assert exit_info.value.code == 0 and "usage: gna-interp" in capsys.readouterr().out


# ----- the demo's log ---------------------------------------------------------------------------


def summary_rows(stdout: str) -> tuple[list[str], list[str]]:
    """The demo's summary table: its lines (header to legend) and its rows' first lines."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("model ") and " alone " in line)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("-gather, -aggr, -both:"))
    table = lines[start : end + 1]
    return table, [line for line in table[2:] if line.startswith("toy-")]


def test_demo_log_has_no_progress_bars(demo_run):
    """The suite's demo runs without --quiet into files: no bar, no carriage return."""
    result, _ = demo_run
    assert "\r" not in result.stdout and "\r" not in result.stderr, result.stderr[-500:]
    assert "it/s" not in result.stderr and "%|" not in result.stderr


def test_demo_summary_fits_120_columns_and_leads_with_faithfulness(demo_run):
    """Every line of the summary table fits 120 columns (the falcon_h1 toy's 16 heads wrap
    inside their cells), and each model's row leads with what its circuit carries: alone (the
    accuracy its faithfulness line prints), share (the gap from every head ablated to clean it
    recovers, from the same line), path (path patching's share of the gap, from its JSON) and
    the carries verdict (`scoring.carries`: recomputed here from the printed accuracies and the
    prompts), which never says "whole" under 80% of the gap nor "partial" above it."""
    result, _ = demo_run
    table, rows = summary_rows(result.stdout)
    assert max(len(line) for line in table) <= 120, "\n".join(table)
    printed = re.findall(
        r"(\S+): faithfulness: the circuit's \d+ heads alone .*? ([\d.]+), \d+% of clean ([\d.]+) \(every head ablated ([\d.]+)\)",
        result.stdout,
    )
    assert len(rows) == len(printed) >= 2
    circuits = {json.loads(path.read_text())["model"]: json.loads(path.read_text()) for path in demo_run[1].glob("toy-*.json")}
    for row, (model, alone, clean, ablated) in zip(rows, printed, strict=True):
        cells = row.split()
        share = (float(alone) - float(ablated)) / (float(clean) - float(ablated))
        path = (circuits[model]["path_patching"] or {}).get("fraction_of_effect")
        assert cells[:2] == [model, alone] and abs(int(cells[2].rstrip("%")) - 100 * share) <= 1.0, row
        assert cells[3] == ("-" if path is None else f"{path:.2f}"), row
        n = circuits[model]["n_prompts"]
        points = ({"accuracy": float(a)} for a in (alone, clean, ablated))
        curve = SimpleNamespace(n_prompts=n, circuit_point=next(points), clean=next(points), ablated=next(points))
        curve.recovered = lambda a, lo=float(ablated), hi=float(clean): (a - lo) / (hi - lo)
        assert cells[4].rstrip(":") == carries_from_curve(curve).word and cells[5] == circuits[model]["mechanism"], row
        assert not (cells[4] == "whole" and share < CARRIES_SHARE) and not (cells[4] == "partial" and share >= CARRIES_SHARE), row
    for model, data in circuits.items():  # each role's list: its heads, or their count and the first few
        block = "\n".join(table[table.index(next(r for r in rows if r.startswith(model + " "))) :])
        for heads in (data["gather"], data["aggregate"]):
            shown = heads if len(heads) <= HEADS_SHOWN + 1 else heads[:HEADS_SHOWN]
            assert all(head.split(" ")[0] in block for head in shown) and (shown == heads or f"{len(heads)}: " in block), (model, heads)


def test_demo_labels_each_toy_by_its_mechanism(demo_run):
    """Each toy's mechanism is its label check's verdict (`verdicts.label_verdict`: the shuffled
    accuracy's Wilson interval against chance + margin, recomputed here from the recorded
    accuracy), in the table, its JSON and its printed headline; the Mamba-1 toy reads the
    labels only in part."""
    result, folder = demo_run
    _, rows = summary_rows(result.stdout)
    for path in folder.glob("toy-*.json"):
        data = json.loads(path.read_text())
        acc, n = data["accuracy"], data["n_prompts"]
        verdict, floor = data["verdicts"]["labels"], data["verdicts"]["labels_vs_chance"]
        assert floor["interval"] == pytest.approx(list(wilson_interval(round(acc["shuffled_labels"] * n), n, floor["level"])))
        assert floor["line"] == pytest.approx(acc["chance"] + data["settings"]["chance_margin"])
        assert data["mechanism"] == MECHANISMS[verdict["word"]], (data["model"], acc)
        assert (data["mechanism"] == "partly") == (data["model"] == "toy-mamba"), (data["model"], verdict["text"])
        assert next(r for r in rows if r.startswith(data["model"] + " ")).split()[5] == data["mechanism"]
        assert f"{data['model']}: {data['headline']}" in result.stdout
    # the demo's toys read the labels: the counting ones (mamba2_counting, falcon_h1_counting) are not in it
    assert not any(name.endswith("_counting") for name in DEMO_MODELS)


def test_summary_table_shows_long_head_lists_by_count():
    """A circuit of 40 heads per role fits 120 columns: each list as its count and first heads."""
    from types import SimpleNamespace

    from gna_interp.commands import summary_table

    many = [gna.Head(0, h) for h in range(40)]
    circuit = SimpleNamespace(
        model="toy-wide",
        mechanism="g&a",
        gather=many,
        aggregate=many,
        accuracy={"clean": 1.0, "-gather": 0.25},
        named=lambda heads: ", ".join(map(str, heads)),
    )
    points = {"circuit_point": {"accuracy": 0.5}, "clean": {"accuracy": 1.0}, "ablated": {"accuracy": 0.25}}
    curve = SimpleNamespace(n_prompts=200, recovered=lambda a: (a - 0.25) / 0.75, **points)
    table = summary_table([circuit], {"toy-wide": curve})
    lines = table.splitlines()
    assert max(map(len, lines)) <= 120, table
    assert lines[2].split()[:7] == ["toy-wide", "0.500", "33%", "-", "partial", "g&a", "1.000"]
    assert lines[2].split()[-4:] == ["40:", "L0H0,L0H1,L0H2,…", "40:", "L0H0,L0H1,L0H2,…"], lines[2]


# ----- options and errors -----------------------------------------------------------------------


def test_ablate_resample_uses_the_corrupted_prompts(capsys):
    """`--how resample`: each head's output on the task's corrupted prompts (options rotated),
    the library's own `Ablate(how="resample")` on `task.corrupted(seed)`."""
    status, out, err = run(
        ["ablate", "--model", "mamba2_counting", "--head", "1.6", "--how", "resample", "--n", "64", "--seed", "3"], capsys
    )
    assert status == 0, err[-2000:]
    after = float(re.search(r"-> ([\d.]+) with L1H6 resample-ablated", out).group(1))
    model, task = gna.load_toy("mamba2_counting"), gna.toy_task("mamba2_counting", 64, seed=3)
    corrupted = task.corrupted(seed=3)
    expected = gna.evaluate(model, task, [gna.Ablate([gna.Head(1, 6)], how="resample", corrupt=corrupted)]).accuracy
    zero = gna.evaluate(model, task, [gna.Ablate([gna.Head(1, 6)])]).accuracy
    assert after == pytest.approx(expected, abs=1e-3) and after != pytest.approx(zero, abs=1e-3)


def test_resample_without_a_corruption_rule_is_refused():
    from gna_interp.commands import corrupted_task

    task = gna.tasks.Task("plain", list(gna.toy_task("mamba2_counting", 4)), corrupter=None)
    task._corrupter = None  # its examples' own rule, dropped: a task with no corruption rule
    with pytest.raises(ValueError, match="--how resample needs corrupted prompts of the same length: task 'plain'"):
        corrupted_task(task, 0)


def test_device_and_dtype_reach_load(monkeypatch, capsys):
    """`--device` and `--dtype` are passed to `gna.load` for a local folder (here a toy's)."""
    from gna_interp.zoo.store import toy_path

    seen = {}

    def fake_load(source, **kwargs):
        seen.update(kwargs, source=source)
        raise gna.core.errors.GnaValueError("stop here")

    monkeypatch.setattr("gna_interp.models.loading.load", fake_load)
    folder = str(toy_path("mamba2_counting"))
    status, _, err = run(["ablate", "--model", folder, "--head", "0.0", "--device", "cpu", "--dtype", "bfloat16"], capsys)
    assert status == 2 and "stop here" in err
    assert (seen["source"], seen["device"], seen["dtype"]) == (folder, "cpu", "bfloat16")


def test_model_help_names_every_toy(capsys):
    with pytest.raises(SystemExit):
        main(["discover", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in gna.toy_names()) and len(gna.toy_names()) >= 4


def test_quiet_is_accepted_by_every_command_that_draws_bars(capsys):
    for command in (["demo"], ["discover"], ["ablate"], ["patterns"], ["zoo", "train"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert "--quiet" in capsys.readouterr().out


def test_a_bug_shows_its_traceback(monkeypatch, capsys):
    """A ValueError, TypeError or KeyError that is not one of the library's own errors is a
    bug: it propagates (the interpreter prints its traceback) instead of becoming a one-line
    'error:'. The library's own (`GnaError`) is one line."""
    for bug in (ValueError("bad value deep in torch"), TypeError("bad call"), KeyError("missing")):

        def broken(args, bug=bug):
            raise bug

        monkeypatch.setattr("gna_interp.commands.build_task", broken)
        with pytest.raises(type(bug)):
            main(["ablate", "--model", "mamba2_counting", "--head", "0.0"])
        assert "error:" not in capsys.readouterr().err

    def refused(args):
        raise gna.core.errors.GnaValueError("n=-1: expected a positive number of prompts")

    monkeypatch.setattr("gna_interp.commands.build_task", refused)
    assert main(["ablate", "--model", "mamba2_counting", "--head", "0.0"]) == 2
    assert capsys.readouterr().err == "gna-interp: error: n=-1: expected a positive number of prompts\n"


def test_a_missing_extra_is_a_one_line_error(monkeypatch, capsys):
    def no_datasets(args):
        raise ModuleNotFoundError("No module named 'datasets'", name="datasets")

    monkeypatch.setattr("gna_interp.commands.build_task", no_datasets)
    assert main(["ablate", "--model", "mamba2_counting", "--head", "0.0"]) == 2
    err = capsys.readouterr().err
    assert "datasets" in err and err.count("\n") == 1


# ----- issue 53, item 4: --task FILE and --arch MODULE:NAME, against the library's own calls -----------


def write_rows(path, task, *, csv_columns=False):
    """``task``'s prompts (label-first, labels in order) as a JSON-lines or CSV task file."""
    import csv

    rows = [(e.meta["header"].rstrip("\n"), e.meta["options"], "ABCD"[e.correct] if csv_columns else e.correct) for e in task.examples]
    if not csv_columns:
        path.write_text("".join(json.dumps({"question": q, "options": o, "answer": a}) + "\n" for q, o, a in rows))
        return path
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["question", "A", "B", "C", "D", "answer"])
        writer.writerows([q, *o, a] for q, o, a in rows)
    return path


def same_prompts(mine, reference):
    return [(e.text, e.segments, e.candidates, e.correct) for e in mine.examples] == [
        (e.text, e.segments, e.candidates, e.correct) for e in reference.examples
    ]


def test_task_file_is_the_task_the_library_builds(tmp_path, capsys):
    """A JSON-lines file and a CSV file of toy_mcq's prompts give toy_mcq's prompts, segments,
    candidates and answers; `discover --task FILE` finds the circuit the library call finds on
    `gna.tasks.task_file`'s task."""
    toy = gna.tasks.toy_mcq(24, seed=5)
    jsonl, table = write_rows(tmp_path / "p.jsonl", toy), write_rows(tmp_path / "p.csv", toy, csv_columns=True)
    assert same_prompts(gna.tasks.task_file(jsonl), toy) and same_prompts(gna.tasks.task_file(table), toy)
    assert same_prompts(gna.tasks.task_file(jsonl, n=7), gna.tasks.toy_mcq(7, seed=5))
    status, out, err = run(["discover", "--model", "mamba2_query_first", "--task", str(jsonl), "--json", "--quiet"], capsys)
    assert status == 0, err[-2000:]
    data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    with warnings.catch_warnings():  # the CLI prints them; the circuit keeps them
        warnings.simplefilter("ignore")
        reference = gna.discover(gna.load_toy("mamba2_query_first"), gna.tasks.task_file(jsonl), progress=False).to_dict()
    assert data["task"] == reference["task"] == "p" and data["n_prompts"] == 24
    for key in ("mechanism", "gather", "aggregate", "accuracy"):
        assert data[key] == reference[key], key


@pytest.mark.parametrize(
    "text,message",
    [
        (
            '{"question": "q", "options": ["x", "y"], "answer": "A"}\n\n{"question": "q", "options": ["x", "y"], "answer": "C"}\n',
            "p.jsonl row 2 (line 3), field 'answer': 'C': expected a label (A, B) or an index 0..1",
        ),
        ('{"question": "q", "options": ["x", "y"], "answer": 5}\n', "p.jsonl row 1 (line 1), field 'answer': 5 is out of range"),
        ('{"question": "q", "answer": 0}\n', "p.jsonl row 1 (line 1): field 'options' is missing"),
        (
            '{"question": "q", "options": ["x"], "answer": 0}\n',
            "p.jsonl row 1 (line 1), field 'options': ['x']: expected a list of at least 2",
        ),
        (
            '{"question": "q", "options": ["x", "y"], "answr": 0}\n',
            "p.jsonl row 1 (line 1): unknown field 'answr' (did you mean 'answer'?)",
        ),
        (
            '{"options": ["x", "y"], "answer": 0}\n{"options": ["x", "y", "z"], "answer": 0}\n',
            "p.jsonl row 2 (line 2), field 'options': 3 options, but row 1 has 2",
        ),
        ('{"options": ["x", "y"], "answer": 0}\n{"options": ["x", "y"], "answer": 0,}\n', "p.jsonl row 2 (line 2): not valid JSON"),
        ('["x", "y"]\n', "p.jsonl row 1 (line 1): list"),
        ("", "p.jsonl: no prompts"),
    ],
)
def test_a_bad_row_of_a_task_file_is_named(tmp_path, text, message, capsys):
    (tmp_path / "p.jsonl").write_text(text)
    assert main(["discover", "--model", "mamba2_query_first", "--task", str(tmp_path / "p.jsonl")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_bad_csv_row_is_named(tmp_path, capsys):
    (tmp_path / "p.csv").write_text('question,options,answer\nq,"[""x"", ""y""]",B\nq,not a list,A\n')
    assert main(["ablate", "--model", "mamba2_query_first", "--head", "0.0", "--task", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err
    assert "p.csv row 2 (line 3), field 'options': 'not a list' is not a JSON list of texts" in err, err
    assert main(["discover", "--model", "mamba2_query_first", "--task", "tyo"]) == 2
    assert "--task 'tyo' (did you mean toy?): expected toy, mmlu, kv or a .jsonl / .csv file" in capsys.readouterr().err


ARCH_FILE = """
import gna_interp as gna
from gna_interp.models.registry import attention

QWEN3 = gna.ArchSpec("qwen3", ("qwen3",), gna.LayerKind.ATTENTION, "model.layers", "model.norm", gna.core.uniform(attention()), tlens=False)
NOT_A_SPEC = {"family": "qwen3"}
"""


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory):
    """A random 2-layer Qwen3 (a family the table lacks) with the toy tokenizer, saved, and a
    module file describing it (``my_arch.py:QWEN3``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gna_interp.zoo.recipes import TOY_TOKENS

    folder = tmp_path_factory.mktemp("qwen3")
    config = AutoConfig.for_model(
        "qwen3",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        **TOY_TOKENS,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder / "model")
    gna.tasks.toy_tokenizer().save_pretrained(folder / "model")
    (folder / "my_arch.py").write_text(ARCH_FILE)
    return folder


def test_arch_flag_loads_a_family_the_table_lacks(qwen3_folder, capsys):
    """`ablate --arch FILE.py:NAME` prints the accuracies `evaluate` gives on the model loaded
    with ``arch=``; `discover --arch` gives the library's circuit."""
    import importlib.util

    model_dir, arch = str(qwen3_folder / "model"), f"{qwen3_folder / 'my_arch.py'}:QWEN3"
    spec = importlib.util.spec_from_file_location("my_arch", qwen3_folder / "my_arch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, task = gna.load(model_dir, arch=module.QWEN3), gna.tasks.toy_mcq(40, seed=0)
    status, out, err = run(["ablate", "--model", model_dir, "--arch", arch, "--head", "1.1", "--n", "40"], capsys)
    assert status == 0, err[-2000:]
    before, after = map(float, re.search(r"accuracy clean ([\d.]+) -> ([\d.]+)", out).groups())
    assert before == pytest.approx(gna.evaluate(model, task).accuracy, abs=1e-3)
    assert after == pytest.approx(gna.evaluate(model, task, [gna.Ablate([gna.Head(1, 1)])]).accuracy, abs=1e-3)
    status, out, err = run(["discover", "--model", model_dir, "--arch", arch, "--n", "24", "--json", "--quiet"], capsys)
    assert status == 0, err[-2000:]
    data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    with warnings.catch_warnings():  # at chance: "no retrieval to explain"
        warnings.simplefilter("ignore")
        reference = gna.discover(model, gna.tasks.toy_mcq(24, seed=0), progress=False).to_dict()
    assert data["family"] == "qwen3" and all(data[k] == reference[k] for k in ("mechanism", "gather", "aggregate", "accuracy"))


def test_arch_flag_errors(qwen3_folder, capsys, monkeypatch):
    model_dir, file = str(qwen3_folder / "model"), qwen3_folder / "my_arch.py"
    monkeypatch.chdir(qwen3_folder)  # MODULE:NAME imports from the current folder
    for args, message in [
        ([], "unknown architecture model_type='qwen3'"),
        (["--arch", "my_arch"], "--arch 'my_arch': expected MODULE:NAME (my_arch:QWEN3) or FILE.py:NAME"),
        (
            ["--arch", "my_arch:QWEN"],
            "--arch 'my_arch:QWEN': my_arch.QWEN is no such name: expected a gna_interp.ArchSpec (the module's: ['QWEN3'])",
        ),
        (["--arch", "my_arch:NOT_A_SPEC"], "my_arch.NOT_A_SPEC is a dict: expected a gna_interp.ArchSpec"),
        (["--arch", "no_such_module:QWEN3"], "--arch 'no_such_module:QWEN3': cannot import 'no_such_module' (ModuleNotFoundError"),
        (["--arch", f"{file}x.py:QWEN3"], "no file"),
    ]:
        assert main(["ablate", "--model", model_dir, "--head", "0.0", "--n", "4", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (args, err)
    assert main(["ablate", "--model", model_dir, "--head", "1.3", "--n", "4", "--arch", "my_arch:QWEN3"]) == 0
    assert main(["ablate", "--model", model_dir, "--head", "1.4", "--n", "4", "--arch", "my_arch:QWEN3"]) == 2
    assert "head L1H4 out of range" in capsys.readouterr().err
    assert main(["ablate", "--model", "llama", "--head", "0.0", "--arch", "my_arch:QWEN3"]) == 2
    assert "--arch with toy 'llama'" in capsys.readouterr().err


# ----- issue 53, item 3: zoo train --family, against gna.zoo's own recipe and trainer --------------------


def test_zoo_train_family_trains_the_library_recipe(qwen3_folder, tmp_path, capsys, monkeypatch):
    """`zoo train NAME --family qwen3 ...` trains `gna.zoo.family_recipe`'s recipe: the same
    weights as `gna.zoo.train_toy` on it (3 steps), its task on the card, loadable with
    ``arch=`` (the card's held-out prompts cut to 64 to keep this test short)."""
    import torch

    from gna_interp.zoo import build
    from gna_interp.zoo.train import task_shape

    monkeypatch.setattr(build, "HELD_OUT_PROMPTS", 64)
    out = tmp_path / "mine"
    flags = ["--options", "2", "--words-per-option", "1", "--shuffle-labels", "--lr", "0.002", "--batch-size", "16"]
    args = ["zoo", "train", "mine", "--family", "qwen3", "--config", '{"num_hidden_layers": 3}', *flags]
    status, _, err = run(
        [*args, "--max-steps", "3", "--arch", f"{qwen3_folder / 'my_arch.py'}:QWEN3", "--out", str(out), "--quiet"], capsys
    )
    assert status == 0, err[-2000:]
    recipe = gna.zoo.family_recipe(
        "mine", "qwen3", {"num_hidden_layers": 3}, n_options=2, words_per_option=1, shuffle_labels=True, lr=0.002, batch_size=16
    )
    assert recipe.config["num_hidden_layers"] == 3 and recipe.config["hidden_size"] == 64
    card = json.loads((out / "card.json").read_text())
    assert card["steps"] == 3 and card["family"] == "qwen3" and card["task"] == task_shape(recipe)
    trained = gna.zoo.train_toy(recipe, max_steps=3, progress=False, log=lambda _: None).model.state_dict()
    from safetensors.torch import load_file

    saved = load_file(out / "model.safetensors")
    assert set(saved) <= set(trained) and all(torch.equal(saved[k], trained[k]) for k in saved)
    assert gna.toy_task(out, 5, seed=2).examples[0].text == gna.tasks.toy_mcq(5, seed=2, **task_shape(recipe)).examples[0].text


@pytest.mark.parametrize(
    "args,message",
    [
        (["zoo", "train", "mine", "--config", "{}"], "--config sets the config of a new toy: give --family too"),
        (["zoo", "train", "mine", "--family", "qwen3", "--config", "{bad"], "--config '{bad': not valid JSON"),
        (["zoo", "train", "mine", "--family", "qwen3", "--options", "0"], "--options 0: expected a positive number"),
        (["zoo", "train", "mine", "--family", "qwen3", "--options", "30"], "n_options"),
        (["zoo", "train", "mine", "--family", "qwen3", "--arch", "x"], "--arch 'x': expected MODULE:NAME"),
        (["zoo", "train", "mine", "--family", "no_such_family", "--max-steps", "1"], "family='no_such_family' is not a model_type"),
    ],
)
def test_zoo_train_family_errors(args, message, tmp_path, capsys):
    assert main([*args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_discover_takes_the_ablation_kinds_and_resamples(capsys):
    """`--ablation-kinds mean --resamples 2`: the JSON holds the mean-ablated confirmation
    (equal to `evaluate` with the same mean ablation, run here) and two resampled sets."""
    status, out, err = run(
        ["discover", "--model", "llama", "--n", "24", "--ablation-kinds", "mean", "--resamples", "2", "--json", "--quiet"], capsys
    )
    assert status == 0, err[-2000:]
    data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 24)
    aggregate = [gna.Head.parse(h) for h in data["aggregate"]]
    direct = gna.evaluate(model, task, [gna.Ablate(aggregate, how="mean", corrupt=task)], progress=False).accuracy
    assert data["accuracy"]["-aggregate@mean"] == pytest.approx(direct, abs=1e-9)
    assert len(data["stability"]["sets"]) == 2
