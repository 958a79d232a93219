"""What a new user meets first: a lazy namespace and a CLI that answers at once, bad
arguments refused before any weights load, an unreachable hub reported in seconds,
clear errors for common slips, and quiet output (progress switch, no loading bars)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import gna_interp as gna
from gna_interp import network, progress
from gna_interp.cli import main
from gna_interp.models import hub
from gna_interp.models.tiny import tiny_model
from gna_interp.tasks.mcq import mcq_example
from gna_interp.tasks.toy import CONTENT_WORDS, VOCAB_SIZE

from .conftest import CLEAN, CORRUPT

HEAVY = ("torch", "transformers", "transformer_lens", "nnsight", "pandas", "numpy", "circuitsvis", "matplotlib")


# ----- the lazy namespace and the CLI parser --------------------------------------------------


def test_namespace_and_cli_parser_import_nothing_heavy():
    """`import gna_interp` and building the CLI parser (what `--help` needs) load none of the
    heavy libraries, in a fresh interpreter; the console script answers `--help`."""
    code = (
        "import json, sys, gna_interp, gna_interp.cli as cli; cli.build_parser().format_help(); "
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
    shown = subprocess.run([sys.executable, "-m", "gna_interp.cli", "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "usage: gna-interp" in shown.stdout


def test_lazy_namespace_keeps_every_name():
    assert gna.__all__ == sorted(gna.__all__) and set(gna.__all__) <= set(dir(gna))
    for name in gna.__all__:
        assert getattr(gna, name) is not None, name
    from gna_interp import Ablate, evaluate, tasks  # `from` imports go through the same table

    assert Ablate is gna.core.interventions.Ablate and evaluate is gna.scoring.evaluate and tasks.toy_mcq is gna.tasks.toy_mcq
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        _ = gna.no_such_name


@pytest.mark.parametrize("package", ["gna_interp", "gna_interp.core", "gna_interp.models", "gna_interp.zoo"])
def test_dir_lists_only_the_public_api(package):
    """Tab completion shows the public names, not the helpers the package imports."""
    import importlib

    module = importlib.import_module(package)
    for name in module.__all__:  # load every name (and so every submodule) first
        getattr(module, name)
    shown = [name for name in dir(module) if not name.startswith("_")]
    assert shown == sorted(module.__all__)
    assert "Any" not in shown and "annotations" not in shown and "lazy_attribute" not in shown


# ----- the CLI checks before any weights load -------------------------------------------------


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a command reaches model loading."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command loaded a model before refusing its arguments")

    monkeypatch.setattr("gna_interp.commands.load_model", refuse)


@pytest.mark.parametrize(
    "args,message",
    [
        (["ablate", "--model", "llama", "--head", "7.9"], "head L7H9: layer 7 out of range: llama has layers 0..1"),
        (["ablate", "--model", "llama", "--head", "1.9"], "head L1H9 out of range: layer 1 of llama has heads 0..3"),
        (["patterns", "--model", "falcon_h1_counting", "--head", "0.12", "--out", "p.png"], "head L0H12 out of range"),
        (["ablate", "--model", "llama", "--head", "0.1", "--head", "L0H1"], "--head '0.1' and 'L0H1' all name head L0H1"),
        (["ablate", "--model", "llama", "--head", "0.1", "--task", "kv", "--kv-pairs", "0"], "--kv-pairs 0: expected 2..64"),
    ],
)
def test_bad_heads_are_refused_from_the_config(no_loading, args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_heads_read_from_config_json_equal_the_config_class(tmp_path):
    """The CLI's torch-free reading of a folder's config.json gives the layout that
    transformers' config class gives, for every bundled toy and every family's tiny config,
    or declines (None) when the file leaves out a field its class fills in."""
    from transformers import AutoConfig

    from gna_interp.commands import layer_specs_from_json
    from gna_interp.models.registry import spec_for
    from gna_interp.models.tiny import TINY_CONFIGS, tiny_config
    from gna_interp.zoo.store import toy_path

    folders = {name: toy_path(name) for name in gna.toy_names()}
    for family in TINY_CONFIGS:
        tiny_config(family).save_pretrained(tmp_path / family)
        folders[family] = tmp_path / family
    read = {}
    for name, folder in folders.items():
        config = AutoConfig.from_pretrained(folder)
        expected = spec_for(config).resolve(config, config.num_hidden_layers)
        read[name] = layer_specs_from_json(folder / "config.json")
        if read[name] is not None:
            assert [s.describe() for s in read[name]] == [s.describe() for s in expected], name
    assert read["llama"] is not None and read["mamba2"] is not None  # the toys take the fast path


def test_out_folder_is_made_before_the_work(no_loading, tmp_path, capsys):
    """A missing `--out` folder is created first (the work then has somewhere to write);
    one that cannot be created is a one-line error, before any model loads."""
    out = tmp_path / "new" / "deeper" / "p.html"
    with pytest.raises(AssertionError, match="loaded a model"):  # the arguments passed: the work would start
        main(["patterns", "--model", "mamba2_counting", "--head", "1.6", "--prompt", "Answer:", "--out", str(out)])
    assert out.parent.is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for args in (["discover", "--model", "mamba2_counting", "--out", str(blocker / "report")], ["demo", "--out", str(blocker / "r")]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "cannot create this folder" in err and err.count("\n") == 1, err


# ----- the hub, unreachable ---------------------------------------------------------------------


@pytest.fixture
def dead_hub(monkeypatch):
    """The hub at a local port nothing listens on (refused at once, network or not); the
    probes it receives are counted."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(network, "_probes", {})
    calls = []
    import huggingface_hub.utils

    session = huggingface_hub.utils.get_session

    def counted():
        calls.append(1)
        return session()

    monkeypatch.setattr(huggingface_hub.utils, "get_session", counted)
    return calls


def test_unreachable_hub_is_reported_once_naming_the_model(dead_hub):
    for _ in range(2):
        with pytest.raises(hub.HubUnreachableError, match=r"cannot load 'no-such-org/no-such-model': the model hub .* did not answer"):
            gna.load("no-such-org/no-such-model")
    assert len(dead_hub) == 1  # probed once; the second load reused the answer


def test_unreachable_hub_with_a_cached_model_loads_from_the_cache(dead_hub, monkeypatch):
    monkeypatch.setattr(hub, "is_cached", lambda name, revision=None: True)
    assert hub.hub_access("some-org/cached-model") == {"local_files_only": True}


def test_offline_mode_names_the_model_without_probing(dead_hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(hub.HubUnreachableError, match=r"cannot load 'no-such-org/no-such-model': HF_HUB_OFFLINE is set"):
        gna.load("no-such-org/no-such-model")
    assert dead_hub == []


def test_cli_reports_an_unreachable_hub_in_one_line(dead_hub, capsys):
    assert main(["ablate", "--model", "no-such-org/no-such-model", "--head", "0.0"]) == 2
    err = capsys.readouterr().err
    assert "cannot load 'no-such-org/no-such-model'" in err and err.count("\n") == 1


# ----- clear errors ---------------------------------------------------------------------------


def test_a_head_as_a_string_is_refused_with_the_typed_value():
    for build in (lambda h: gna.Ablate(h), lambda h: gna.Patch(h, source=CLEAN), lambda h: gna.MaskAttentionRows(heads=h)):
        with pytest.raises(TypeError, match=r"is the string 'L1H0': expected gna_interp.Head values, e.g. \[gna.Head\(layer=1, head=0\)\]"):
            build("L1H0")
    with pytest.raises(TypeError, match=r"is the string 'first': expected gna_interp.Head values, e.g. \[gna.Head\(1, 0\)\]"):
        gna.Ablate("first")


def test_a_metric_name_is_refused_before_any_work(llama_tlens):
    calls = [
        lambda m: gna.ablation_sweep(llama_tlens, CLEAN, None, m),
        lambda m: gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, m),
        lambda m: gna.path_patching(llama_tlens, CLEAN, CORRUPT, m, senders=[gna.Head(0, 0)], receivers="logits"),
        lambda m: gna.path_patching_sweep(llama_tlens, CLEAN, CORRUPT, m, receivers="logits"),
        lambda m: gna.attribution_patching(llama_tlens, CLEAN, CORRUPT, m),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=r"metric='accuracy' is not callable: expected a function of logits .* gna.candidate_accuracy"):
            call("accuracy")


@pytest.fixture(scope="module")
def toy_pair():
    """A tiny random Llama over the toy vocabulary and a few toy prompts."""
    model = gna.load(tiny_model("llama", seed=3, vocab_size=VOCAB_SIZE), tokenizer=gna.tasks.toy_tokenizer(), backend="nnsight")
    return model, gna.tasks.toy_mcq(8, seed=0)


def test_one_intervention_needs_no_list(toy_pair):
    model, task = toy_pair
    ablate = gna.Ablate([gna.Head(1, 2), gna.Head(0, 1)])
    listed = gna.evaluate(model, task, [ablate]).scores
    assert torch.equal(gna.evaluate(model, task, ablate).scores, listed)
    assert not torch.allclose(listed, gna.evaluate(model, task).scores)  # the ablation did something
    assert torch.equal(model.logits(task.prompts[:2], ablate), model.logits(task.prompts[:2], [ablate]))
    with pytest.raises(TypeError, match=r"interventions='L1H0': expected an intervention \(Ablate, KeepOnly, Patch"):
        gna.evaluate(model, task, "L1H0")
    with pytest.raises(TypeError, match=r"interventions\[1\] is Head\(layer=1, head=0\): expected an intervention"):
        gna.evaluate(model, task, [ablate, gna.Head(1, 0)])


def test_words_outside_the_vocabulary_are_named(toy_pair):
    model, _ = toy_pair
    known = CONTENT_WORDS[:3]
    example = mcq_example("Query: xyzzy\n", [f"{known[0]} {known[1]}", f"xyzzy {known[2]}"], 1)
    task = gna.tasks.Task("oov", [example], tokenizer=gna.tasks.toy_tokenizer())
    with pytest.warns(UserWarning, match=r"1 word\(s\) in task 'oov' are not in the tokenizer's vocabulary and became '<unk>': 'xyzzy'"):
        gna.evaluate(model, task)
    with pytest.warns(UserWarning, match=r"in the inputs .* 'quux', 'xyzzy'"):
        model.logits([f"{known[0]} xyzzy", "quux"])


# ----- quiet runs -----------------------------------------------------------------------------


@pytest.fixture
def restore_progress():
    yield
    gna.set_progress(True)


def test_one_switch_for_every_progress_bar(llama_tlens, monkeypatch, capsys, restore_progress):
    heads = [gna.Head(0, 0), gna.Head(1, 1)]

    def bar_drawn() -> bool:
        gna.ablation_sweep(llama_tlens, CLEAN, None, gna.logit_diff(5, 6), heads=heads, batch_size=3, progress=True)
        return "ablation (zero)" in capsys.readouterr().err

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert bar_drawn()
    gna.set_progress(False)
    assert not gna.progress_enabled() and not bar_drawn()
    gna.set_progress(True)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert not gna.progress_enabled() and not bar_drawn()
    with pytest.raises(TypeError, match="expected True or False"):
        gna.set_progress("no")  # type: ignore[arg-type]
    assert progress.progress_enabled is gna.progress_enabled


def test_loading_a_local_folder_draws_no_bar(tmp_path, tokenizer, capfd):
    from transformers.utils import logging

    tiny_model("mamba2", seed=1).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    capfd.readouterr()
    before = logging.is_progress_bar_enabled()
    gna.load(str(tmp_path))
    assert "Loading weights" not in capfd.readouterr().err
    assert logging.is_progress_bar_enabled() == before  # transformers' own setting is left as it was


def test_accuracy_is_an_exact_fraction(toy_pair):
    model, task = toy_pair
    result = gna.evaluate(model, task)
    assert result.accuracy == int(result.is_correct.sum()) / len(task)  # 0.375, not 0.375000001


def test_mmlu_from_an_unreachable_hub_says_to_pass_local_files(dead_hub, capsys):
    """MMLU from the hub, offline: one probe, no retries, and the message names `path=`
    (and the CLI's `--mmlu-path`), from Python and from the CLI."""
    pytest.importorskip("datasets")
    with pytest.raises(OSError, match=r"cannot load MMLU: the dataset hub .* did not answer within 3 s; pass path= .*--mmlu-path"):
        gna.tasks.mmlu(n=5)
    assert main(["ablate", "--model", "llama", "--head", "0.0", "--task", "mmlu"]) == 2
    err = capsys.readouterr().err
    assert "--mmlu-path" in err and err.count("\n") == 1, err
    assert len(dead_hub) == 1  # probed once for both


def test_mmlu_offline_and_not_cached_says_to_pass_local_files(monkeypatch, tmp_path):
    datasets = pytest.importorskip("datasets")
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # the name differs across datasets releases
        if hasattr(datasets.config, flag):
            monkeypatch.setattr(datasets.config, flag, True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    with pytest.raises(OSError, match=r"cannot load MMLU \('cais/mmlu', 'all'\): .*pass path= .*--mmlu-path"):
        gna.tasks.mmlu(n=5)
