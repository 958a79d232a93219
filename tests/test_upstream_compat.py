"""The places that adapt to upstream signatures which changed within the allowed ranges
(docs/dependencies.md), and the lock-drift report of `make test-latest`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from transformers.masking_utils import create_causal_mask

from gna_interp.backends.tlens_hooks import _add_forward_hook, _check_hook_to_add
from gna_interp.models import hf_compat
from gna_interp.models.tiny import tiny_config

ROOT = Path(__file__).resolve().parents[1]


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_causal_mask_blocks_the_future_and_the_padding():
    config = tiny_config("llama")
    config._attn_implementation = "eager"  # a dense additive mask, whatever the release's default kernel
    hidden = torch.zeros(2, 4, config.hidden_size)
    padding = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    mask = hf_compat.build_causal_mask(create_causal_mask, config, hidden, padding, torch.arange(4)[None])
    allowed = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0  # [batch, query, key]; additive masks: 0 = allowed
    expected = torch.tril(torch.ones(4, 4, dtype=torch.bool)).expand(2, 4, 4).clone()
    expected[1, :, 0] = False  # the left pad is never attended to
    assert torch.equal(allowed[:, 1:], expected[:, 1:])  # row 0 of the padded prompt is all-pad, whatever HF fills in


def test_renamed_keywords_are_read_from_the_signature():
    def new(config, inputs_embeds, attention_mask, cache, position_ids=None): ...
    def old(config, input_embeds, attention_mask, cache_position, past_key_values, position_ids=None): ...
    def unknown(config, embeddings): ...

    assert hf_compat._pick(new, "inputs_embeds", "input_embeds") == "inputs_embeds"
    assert hf_compat._pick(old, "inputs_embeds", "input_embeds") == "input_embeds"
    assert hf_compat.cache_keyword(new) == "cache" and hf_compat.cache_keyword(old) == "past_key_values"
    with pytest.raises(TypeError, match=r"'cache', 'past_key_values', 'cache_params'.*outside the range"):
        hf_compat.cache_keyword(unknown)
    assert hf_compat.passed_cache({"cache_params": "c", "cache": None}) == "c"
    assert hf_compat.passed_cache({"use_cache": True}) is None


@pytest.mark.parametrize("release", ["3.9", "4.x"])
def test_bridge_hook_check_is_called_as_each_release_defines_it(release):
    calls = []

    class Bridge39:
        def check_hooks_to_add(self, hook_point_name):
            calls.append((hook_point_name,))

    class Bridge4:
        def check_hooks_to_add(self, hook_point, hook_point_name, hook, dir="fwd", is_permanent=False, prepend=False):
            calls.append((hook_point, hook_point_name, hook))

    bridge = Bridge39() if release == "3.9" else Bridge4()
    _check_hook_to_add(bridge, "POINT", "blocks.0.hook_out", print)
    assert calls == ([("blocks.0.hook_out",)] if release == "3.9" else [("POINT", "blocks.0.hook_out", print)])


@pytest.mark.parametrize("release", ["3.9", "4.x"])
def test_the_hook_handle_is_found_whether_or_not_add_hook_returns_it(release):
    class Point:
        def __init__(self):
            self.fwd_hooks = ["earlier"]

        def add_hook(self, fn, dir="fwd"):
            self.fwd_hooks.append(("handle", fn))
            return None if release == "3.9" else self.fwd_hooks[-1]

    point = Point()
    assert _add_forward_hook(point, print) == ("handle", print)


def test_lock_drift_names_what_differs(tmp_path, capsys):
    drift = _load_tool("lock_drift")
    lock = tmp_path / "lock.txt"
    lock.write_text("# comment\nTransformers==5.24.0\n    # via x\nnnsight==0.8.1 ; python_version >= '3.10'\ngone==1.0\n")
    pins = drift.read_lock(lock)
    assert pins == {"transformers": "5.24.0", "nnsight": "0.8.1", "gone": "1.0"}
    rows = drift.drift(pins, {"transformers": "5.25.0", "nnsight": "0.8.1", "extra": "2.0"}, ignore=set())
    assert rows == [("extra", "-", "2.0"), ("gone", "1.0", "-"), ("transformers", "5.24.0", "5.25.0")]
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    with pytest.raises(SystemExit, match="pins nothing"):
        drift.read_lock(empty)
    with pytest.raises(SystemExit, match="no lock file at"):
        drift.read_lock(tmp_path / "missing.txt")
    assert drift.main([str(ROOT / "requirements" / "lock.txt")]) == 0
    out = capsys.readouterr().out
    assert "transformers" in out and "locked" in out
