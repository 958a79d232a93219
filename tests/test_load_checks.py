"""`gna.load` and the CLI check what they can before any weight is read (issue 32): the
architecture from ``config.json`` alone, folders that do not exist, the tokenizer, keywords;
then weights that do not match the config. In-memory tokenizers work on both backends."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

import gna_interp as gna
from gna_interp import network
from gna_interp.cli import main
from gna_interp.models import hub
from gna_interp.models.preflight import ModelFilesError, WeightsMismatchWarning
from gna_interp.models.tiny import tiny_model, word_tokenizer

from .conftest import CLEAN, raw_logits

SUPPORTED = r"supported are \[.*'llama'.*'mamba2'.*\]"


def model_folder(folder: Path, family: str = "llama", tokenizer: bool = True, **overrides) -> Path:
    """A tiny random model saved with ``save_pretrained`` (and the word tokenizer)."""
    tiny_model(family, seed=4, **overrides).save_pretrained(folder)
    if tokenizer:
        word_tokenizer().save_pretrained(folder)
    return folder


def edit_config(folder: Path, **fields) -> None:
    file = folder / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **fields}))


@pytest.fixture
def no_weights(monkeypatch):
    """Record every call that would read weights; the test asserts there was none."""
    from transformers import AutoModelForCausalLM

    calls: list[str] = []

    def refuse(*args, **kwargs):
        calls.append(str(args[0]))
        raise AssertionError(f"weights were read: from_pretrained{args}")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    return calls


def temp_folders(prefix: str) -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith(prefix)}


# ----- A. in-memory tokenizers on both backends ----------------------------------------------


def in_memory_tokenizer(**specials):
    """The word tokenizer's vocabulary built in memory, never saved: ``name_or_path`` is
    empty and ``init_kwargs`` has no ``"name_or_path"``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *(f"w{i}" for i in range(4, 64))])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, **specials)


# "bos": the state that failed on tlens (TransformerLens reloads a tokenizer with a BOS token
# from init_kwargs["name_or_path"]: KeyError); "bare" was changed in place (TransformerLens
# added "<|endoftext|>" to it); "all" worked.
STATES = {
    "bos": {"bos_token": "<bos>"},
    "bos_eos": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "bare": {},
    "all": {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"},
}


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
@pytest.mark.parametrize("state", sorted(STATES))
def test_in_memory_tokenizer_on_both_backends(tmp_path, monkeypatch, backend, state):
    folder = model_folder(tmp_path / "model", tokenizer=False)
    tokenizer = in_memory_tokenizer(**STATES[state])
    assert "name_or_path" not in tokenizer.init_kwargs and tokenizer.name_or_path == ""
    tokenizer.save_pretrained(tmp_path / "saved")
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(tmp_path / "saved")
    vocab_before, specials_before = tokenizer.get_vocab(), dict(tokenizer.special_tokens_map)
    # a temporary directory of this test's own: another process's gna_tokenizer_ folders
    # (a second suite on the same machine) cannot come and go in it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left_before = temp_folders("gna_tokenizer_")

    model = gna.load(str(folder), tokenizer=tokenizer, backend=backend)
    reference = gna.load(str(folder), tokenizer=reloaded, backend=backend)
    assert model.backend_name == backend and model.tokenizer is tokenizer
    logits = model.logits(CLEAN)
    assert torch.equal(logits, reference.logits(CLEAN))
    hf = tiny_model("llama", seed=4)  # an independent copy of the same weights
    assert torch.allclose(logits, raw_logits(hf, reference.to_batch(CLEAN)), atol=1e-4)
    assert tokenizer.get_vocab() == vocab_before and dict(tokenizer.special_tokens_map) == specials_before  # never modified
    assert temp_folders("gna_tokenizer_") == left_before  # the bridge's copy is removed


def test_tokenizer_copy_is_removed_when_the_bridge_fails(tmp_path, monkeypatch):
    from transformer_lens.model_bridge import TransformerBridge

    folder = model_folder(tmp_path / "model", tokenizer=False)
    seen: list[Path] = []

    def fail(name, hf_model=None, tokenizer=None, **kwargs):
        seen.append(Path(tokenizer.name_or_path))
        raise RuntimeError("bridge failed")

    monkeypatch.setattr(TransformerBridge, "boot_transformers", staticmethod(fail))
    with pytest.raises(RuntimeError, match="bridge failed"):
        gna.load(str(folder), tokenizer=in_memory_tokenizer(bos_token="<bos>"), backend="tlens")
    assert len(seen) == 1 and seen[0].name.startswith("gna_tokenizer_") and not seen[0].exists()


# ----- B. checks before weights ---------------------------------------------------------------


def gpt2_folder(folder: Path) -> Path:
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64).save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")  # reading it would fail differently
    word_tokenizer().save_pretrained(folder)
    return folder


def test_unsupported_architecture_is_refused_from_config_json(tmp_path, no_weights):
    folder = gpt2_folder(tmp_path)
    with pytest.raises(
        ValueError, match=rf"unknown architecture model_type='gpt2': {SUPPORTED} \(read from .*config.json, before any weights\)"
    ):
        gna.load(str(folder))
    assert no_weights == []


def test_unsupported_hub_architecture_downloads_only_its_config(tmp_path, monkeypatch, no_weights):
    import huggingface_hub

    file = gpt2_folder(tmp_path) / "config.json"
    downloads: list[tuple[str, str]] = []

    def download(repo_id, filename, **kwargs):
        downloads.append((repo_id, filename))
        return str(file)

    monkeypatch.setattr("gna_interp.models.loading.hub_access", lambda name, revision=None: {})
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    with pytest.raises(ValueError, match=rf"model_type='gpt2': {SUPPORTED} \(read from some-org/gpt2-like's config.json"):
        gna.load("some-org/gpt2-like")
    assert downloads == [("some-org/gpt2-like", "config.json")] and no_weights == []


def test_missing_weights_are_an_error_naming_them(tmp_path):
    folder = model_folder(tmp_path, num_hidden_layers=2)
    edit_config(folder, num_hidden_layers=3)  # layer 2 has no weights
    with pytest.raises(
        ValueError,
        match=r"do not match its config: missing 9 tensor\(s\): model\.layers\.2\.input_layernorm\.weight, .*check_weights=False",
    ):
        gna.load(str(folder))
    with pytest.warns(WeightsMismatchWarning, match=r"missing 9 tensor\(s\): model\.layers\.2\."):
        model = gna.load(str(folder), check_weights=False)
    assert model.n_layers == 3


def test_unexpected_weights_are_an_error_naming_them(tmp_path):
    folder = model_folder(tmp_path, num_hidden_layers=2)
    edit_config(folder, num_hidden_layers=1)
    with pytest.raises(ValueError, match=r"unexpected 9 tensor\(s\): model\.layers\.1\.input_layernorm\.weight, .* and 3 more"):
        gna.load(str(folder))


def test_matching_weights_load_silently(tmp_path, recwarn):
    folder = model_folder(tmp_path)
    model = gna.load(str(folder))
    assert torch.allclose(model.logits(CLEAN), raw_logits(tiny_model("llama", seed=4), model.to_batch(CLEAN)), atol=1e-4)
    assert not [w for w in recwarn if issubclass(w.category, WeightsMismatchWarning)]


def test_folder_like_path_that_does_not_exist(tmp_path, monkeypatch, no_weights):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad").mkdir()

    def no_hub(*args, **kwargs):
        raise AssertionError("a folder path was sent to the hub")

    monkeypatch.setattr("gna_interp.models.loading.hub_access", no_hub)
    with pytest.raises(FileNotFoundError, match=r"model path 'bad/nothere' does not exist: folder 'bad' exists but holds no 'nothere'"):
        gna.load("bad/nothere")
    with pytest.raises(ModelFilesError, match=r"model path 'a/b/c' does not exist: no folder of that name"):
        gna.load("a/b/c")  # two separators: never a hub id
    with pytest.raises(ValueError, match=r"model path '\./bad/nothere' does not exist"):
        gna.load("./bad/nothere")


def test_unreachable_hub_id_also_says_no_such_folder(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(network, "_probes", {})
    with pytest.raises(hub.HubUnreachableError, match=r"cannot load 'nobody/nothere'.*no local folder 'nobody/nothere' exists either"):
        gna.load("nobody/nothere")


def test_folder_without_config_json(tmp_path, no_weights):
    with pytest.raises(ModelFilesError, match=rf"no config.json in '{tmp_path}'"):
        gna.load(str(tmp_path))


def test_invalid_config_json_names_file_and_line(tmp_path, no_weights):
    (tmp_path / "config.json").write_text('{\n  "model_type": "llama"\n  "vocab_size": 64\n}\n')
    with pytest.raises(ValueError, match=rf"{tmp_path}/config.json is not valid JSON: Expecting ',' delimiter at line 3, column 3"):
        gna.load(str(tmp_path))


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_folder_without_tokenizer_names_folder_and_argument(tmp_path, family, no_weights):
    """Mamba-2's folder used to load a 2-token GPT-NeoX tokenizer without a word: now refused
    too, before any weight is read."""
    folder = model_folder(tmp_path / family, family=family, tokenizer=False)
    with pytest.raises(ModelFilesError, match=rf"no usable tokenizer in '{folder}' \(.*\): .*or pass tokenizer="):
        gna.load(str(folder))
    assert no_weights == []


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_folder_without_tokenizer_loads_with_tokenizer_argument(tmp_path, family):
    folder = model_folder(tmp_path, family=family, tokenizer=False)
    model = gna.load(str(folder), tokenizer=word_tokenizer())
    assert torch.allclose(model.logits(CLEAN), raw_logits(tiny_model(family, seed=4), model.to_batch(CLEAN)), atol=1e-4)


def test_tokenizer_argument_folder_that_does_not_exist(tmp_path, no_weights):
    folder = model_folder(tmp_path / "model")
    with pytest.raises(ModelFilesError, match=r"tokenizer='\./no/tokenizer': no such folder"):
        gna.load(str(folder), tokenizer="./no/tokenizer")


@pytest.mark.parametrize(("keyword", "guess"), [("backnd", "backend"), ("tokenzier", "tokenizer"), ("devce", "device")])
def test_misspelt_keyword_names_load_parameters(tmp_path, keyword, guess, no_weights):
    folder = model_folder(tmp_path)
    expected = rf"unexpected keyword argument '{keyword}' \(did you mean {guess}=\?\): its parameters are model, backend=, tokenizer="
    with pytest.raises(TypeError, match=expected):
        gna.load(str(folder), **{keyword: "nnsight"})
    assert no_weights == []


def test_keyword_nobody_takes_names_load_parameters(tmp_path):
    folder = model_folder(tmp_path)
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'colour': its parameters are model, backend=.*which take no 'colour' either"
    ):
        gna.load(str(folder), colour="red")


def test_from_pretrained_keywords_still_pass(tmp_path):
    folder = model_folder(tmp_path)
    model = gna.load(str(folder), attn_implementation="eager", backend="nnsight")
    assert model.hf_model.config._attn_implementation == "eager"


# ----- C. the CLI -----------------------------------------------------------------------------


def cli_error(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a command reaches `gna.load` or `gna.load_toy`."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command loaded a model before refusing its arguments")

    monkeypatch.setattr("gna_interp.models.loading.load", refuse)
    monkeypatch.setattr("gna_interp.zoo.load_toy", refuse)


@pytest.mark.parametrize("command", [["ablate", "--head", "0.0"], ["discover"]])
def test_cli_invalid_config_json_names_file_and_line(tmp_path, command, capsys, no_weights):
    (tmp_path / "config.json").write_text('{"model_type": "llama" "vocab_size": 64}')
    err = cli_error([command[0], "--model", str(tmp_path), *command[1:]], capsys)
    assert f"{tmp_path}/config.json is not valid JSON: Expecting ',' delimiter at line 1, column 24" in err


@pytest.mark.parametrize("command", [["ablate", "--head", "0.0"], ["discover"]])
def test_cli_empty_folder_has_no_config_json(tmp_path, command, capsys, no_weights):
    err = cli_error([command[0], "--model", str(tmp_path), *command[1:]], capsys)
    assert f"no config.json in '{tmp_path}'" in err and "model_type" not in err


def test_cli_folder_like_path_that_does_not_exist(tmp_path, monkeypatch, capsys, no_loading):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad").mkdir()
    err = cli_error(["ablate", "--model", "bad/nothere", "--head", "0.0"], capsys)
    assert "model path 'bad/nothere' does not exist: folder 'bad' exists but holds no 'nothere'" in err


@pytest.mark.parametrize("command", [["ablate", "--head", "0.0"], ["discover"], ["patterns", "--head", "0.0", "--out", "p.png"]])
def test_cli_remote_refuses_a_bundled_toy(command, capsys, monkeypatch, no_loading):
    monkeypatch.setattr(hub, "ndif_api_key", lambda: "a-key")
    err = cli_error([command[0], "--model", "llama", "--remote", *command[1:]], capsys)
    assert "--remote runs the model on NDIF, which serves hub models: 'llama' is a bundled toy, which runs locally (drop --remote)" in err


@pytest.mark.parametrize("command", [["ablate", "--head", "0.0"], ["discover"]])
def test_cli_remote_without_api_key_says_how_to_set_it(command, capsys, monkeypatch, no_loading):
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setattr(hub, "ndif_api_key", lambda: None)
    err = cli_error([command[0], "--model", "some-org/some-model", "--remote", *command[1:]], capsys)
    assert "--remote needs an NDIF API key: set NDIF_API_KEY in the environment (export NDIF_API_KEY=<your key>)" in err
    assert "CONFIG.set_default_api_key" in err
