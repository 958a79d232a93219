"""Shared fixtures: tiny random models (built from configs, nothing downloaded), a
local word-level tokenizer, and raw-PyTorch reference helpers that share no code
with the library."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model, word_tokenizer

TOL = 1e-4

# Tiny models are overhead-bound: one thread is faster, and steadier when cores are shared.
torch.set_num_threads(1)

PROMPTS = ["w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14 w15 w16 w17 w18", "w19 w20 w21"]
# Same-length clean / corrupt pairs (4 words each -> 5 tokens with <bos>).
CLEAN = ["w5 w6 w7 w8", "w9 w10 w11 w12", "w13 w14 w15 w16"]
CORRUPT = ["w5 w30 w7 w8", "w9 w10 w31 w12", "w40 w14 w15 w41"]


@pytest.fixture(scope="session")
def tokenizer():
    return word_tokenizer()


@pytest.fixture(scope="session")
def llama_hf():
    """The pristine tiny GQA Llama (6 query heads, 2 KV heads); never loaded into gna."""
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="session")
def llama_tlens(llama_hf, tokenizer):
    return gna.load(copy.deepcopy(llama_hf), tokenizer=tokenizer, backend="tlens")


@pytest.fixture(scope="session")
def llama_nnsight(llama_hf, tokenizer):
    return gna.load(copy.deepcopy(llama_hf), tokenizer=tokenizer, backend="nnsight")


@pytest.fixture(scope="session")
def mamba2(tokenizer):
    """A tiny 3-layer Mamba-2 on nnsight (files that need another define their own)."""
    return gna.load(tiny_model("mamba2", seed=4, num_hidden_layers=3), tokenizer=tokenizer)


@pytest.fixture(scope="session", params=["tlens", "nnsight", "mamba2"])
def any_model(request, llama_models, mamba2):
    """The tiny Llama on both backends, and `mamba2`."""
    return mamba2 if request.param == "mamba2" else llama_models[request.param]


@pytest.fixture(scope="session")
def llama_models(llama_tlens, llama_nnsight):
    return {"tlens": llama_tlens, "nnsight": llama_nnsight}


def real_positions(model: gna.GnaModel, inputs) -> torch.Tensor:
    """``[batch, pos]`` bool: True on real (non-padding) tokens."""
    return model.to_batch(inputs).attention_mask.bool()


def assert_close_on_tokens(actual: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor, tol: float = TOL) -> None:
    """Logits agree on every real token (padding-position logits are unspecified)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    diff = (actual - expected)[mask].abs().max().item()
    assert diff < tol, f"max difference {diff} on real tokens"


# ----- raw PyTorch reference: forward pre-hooks on the HF out-projection ------------------


def out_proj(hf_model, layer: int) -> torch.nn.Module:
    backbone = hf_model.model if hasattr(hf_model, "model") else hf_model.backbone
    block = backbone.layers[layer]
    return block.self_attn.o_proj if hasattr(block, "self_attn") else block.mixer.out_proj


def raw_logits(hf_model, batch, edits: dict[int, Callable[[torch.Tensor], torch.Tensor]] | None = None) -> torch.Tensor:
    """Logits with ``edits[layer](heads)`` applied to the out-projection input viewed
    ``[batch, pos, head, d_head]``; hooks are removed before returning."""
    handles = []
    n_heads_of = _n_heads(hf_model)
    for layer, edit in (edits or {}).items():

        def pre(module, args, edit=edit):
            x = args[0]
            heads = x.reshape(*x.shape[:2], n_heads_of, -1)
            return (edit(heads.clone()).reshape(x.shape), *args[1:])

        handles.append(out_proj(hf_model, layer).register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            return hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    finally:
        for handle in handles:
            handle.remove()


def raw_head_outputs(hf_model, batch, layer: int) -> torch.Tensor:
    """``[batch, pos, head, d_head]`` out-projection input, captured with a raw hook."""
    store = {}

    def pre(module, args):
        store["x"] = args[0].detach().clone()

    handle = out_proj(hf_model, layer).register_forward_pre_hook(pre)
    try:
        with torch.no_grad():
            hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    finally:
        handle.remove()
    x = store["x"]
    return x.reshape(*x.shape[:2], _n_heads(hf_model), -1)


def _n_heads(hf_model) -> int:
    config = hf_model.config
    if config.model_type in ("mamba", "falcon_mamba"):
        return config.intermediate_size
    if config.model_type == "mamba2":
        return config.num_heads
    return config.num_attention_heads


def zero_columns(hf_model, head: gna.Head, head_dim: int):
    """A copy of ``hf_model`` with ``head``'s out-projection weight columns zeroed
    (the paper's way of disabling a head)."""
    edited = copy.deepcopy(hf_model)
    with torch.no_grad():
        out_proj(edited, head.layer).weight[:, head.head * head_dim : (head.head + 1) * head_dim] = 0
    return edited


def no_hooks_anywhere(module: torch.nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks and not getattr(m, "_backward_hooks", None) for m in module.modules())


def no_hooks_left(model) -> bool:
    """No temporary hook on ``model``'s backend: the bridge's hook points on tlens (its own
    modules keep hooks of their own for good), every module of the HF model on nnsight."""
    if model.backend_name == "tlens":
        return all(not hp._forward_hooks and not hp._backward_hooks for hp in model.backend.bridge.hook_dict.values())
    return no_hooks_anywhere(model.hf_model)


@pytest.fixture(autouse=True)
def _progress_switch_restored():
    """`gna.set_progress` is process-wide: whatever a test (or a file it runs in-process, such
    as a benchmark or an example) sets, the next test starts with the switch as it was.
    benchmarks/ssm_claims.py turned it off at import and silenced `test_claims.py`'s bar."""
    from gna_interp import progress

    was = progress._enabled
    yield
    progress.set_progress(was)


DEMO_TEST_PROMPTS = 48
"""Prompts per model in the suite's demo run (`gna-interp demo` uses 200): the same code, a
quarter of the work."""


class _DemoInBackground:
    """`gna-interp demo` started once, in a fresh interpreter, as soon as collection knows a
    selected test needs it (`pytest_collection_modifyitems`). The suite runs on one thread
    (above), so the demo's minutes run on the second core beside the other tests instead of
    before the first test that reads its output. It runs without ``--quiet``: its output
    goes to files, so it must draw no progress bars of its own accord (a test checks)."""

    process: subprocess.Popen | None = None
    folder: Path | None = None
    command: tuple[str, ...] = ()

    @classmethod
    def start(cls) -> None:
        if cls.process is not None:
            return
        cls.folder = Path(tempfile.mkdtemp(prefix="gna_demo_"))
        report = cls.folder / "gna-report"
        cls.command = (sys.executable, "-m", "gna_interp.cli", "demo", "--out", str(report), "--n", str(DEMO_TEST_PROMPTS))
        with open(cls.folder / "stdout", "w") as out, open(cls.folder / "stderr", "w") as err:
            cls.process = subprocess.Popen(list(cls.command), stdout=out, stderr=err, text=True)

    @classmethod
    def result(cls) -> tuple[subprocess.CompletedProcess, Path]:
        cls.start()
        assert cls.process is not None and cls.folder is not None
        code = cls.process.wait()
        stdout, stderr = (cls.folder / "stdout").read_text(), (cls.folder / "stderr").read_text()
        return subprocess.CompletedProcess(list(cls.command), code, stdout, stderr), cls.folder / "gna-report"

    @classmethod
    def stop(cls) -> None:
        if cls.process is not None and cls.process.poll() is None:
            cls.process.kill()
            cls.process.wait()
        if cls.folder is not None:
            shutil.rmtree(cls.folder, ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected
def pytest_collection_modifyitems(session, config, items) -> None:
    """Start the demo, and run the files that read it last (whole files, so that their module
    fixtures are built once): the demo's minutes then pass beside the rest of the suite. In
    file order, `test_claims.py` waited 154 s for it near the start of a CI run."""
    readers = {item.path for item in items if "demo_run" in getattr(item, "fixturenames", ())}
    if readers:
        _DemoInBackground.start()
        items[:] = [item for item in items if item.path not in readers] + [item for item in items if item.path in readers]


def pytest_sessionfinish(session, exitstatus) -> None:
    _DemoInBackground.stop()


@pytest.fixture(scope="session")
def demo_run() -> tuple[subprocess.CompletedProcess, object]:
    """`gna-interp demo` run once per session through the console entry point, in a fresh
    interpreter started at collection (no time limit): its completed process and its
    report folder, for every test that needs the demo's output or report."""
    result, report = _DemoInBackground.result()
    assert result.returncode == 0, result.stderr[-3000:]
    return result, report


@pytest.fixture(scope="module")
def toy_llamas():
    """The bundled Llama toy on each backend: ``{"tlens": model, "nnsight": model}``."""
    return {backend: gna.load_toy("llama", backend=backend) for backend in ("tlens", "nnsight")}
