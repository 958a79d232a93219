"""``path="direct"`` against TransformerLens's own code, on a tiny Llama built from a config
(2 layers, 4 heads, no grouped-query attention) through the bridge the ``tlens`` backend
boots.

Direction: TransformerLens *denoises*: it runs the corrupted tokens and moves the sender
toward its clean value. gna's ``path_patching(model, clean, corrupt, ...)`` runs ``clean``
with the senders set to their ``corrupt`` values, so TransformerLens's
``(corrupted_tokens, clean_cache)`` is gna's ``(clean=CORRUPT, corrupt=CLEAN)``: the
arguments swapped. Same for ``edge_attribution`` (TransformerLens's gradient at the
corrupted run, times ``clean - corrupt`` writes = gna's gradient at its ``clean`` run,
times ``corrupt - clean``)."""

from __future__ import annotations

import copy
from importlib.metadata import version

import pytest
import torch
from transformer_lens import patching as tl_patching
from transformer_lens.tools.analysis import attribution_patching as tl_attr

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import CLEAN, CORRUPT

H = gna.Head
PARITY = 1e-5
METRIC = gna.logit_diff(5, 6)


@pytest.fixture(scope="module")
def llama(tokenizer):
    hf = tiny_model("llama", seed=1, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4)
    with torch.no_grad():  # sharper attention, so that q and k edges carry visible effects
        for name, param in hf.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(4)
    return gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="tlens")


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_path_patching_direct_equals_get_act_patch_direct_path(llama, component):
    if not hasattr(tl_patching, "get_act_patch_direct_path"):  # the oldest TransformerLens in range (3.9) lacks it
        pytest.skip(f"TransformerLens {version('transformer-lens')} has no patching.get_act_patch_direct_path")
    bridge = llama.backend.bridge
    clean, corrupt = llama.to_batch(CLEAN), llama.to_batch(CORRUPT)
    _, clean_cache = bridge.run_with_cache(clean.input_ids, attention_mask=clean.attention_mask)
    _, corrupt_cache = bridge.run_with_cache(corrupt.input_ids, attention_mask=corrupt.attention_mask)
    for sender in (0, 3):
        try:
            expected = tl_patching.get_act_patch_direct_path(
                bridge,
                corrupt.input_ids,
                clean_cache,
                corrupt_cache,
                lambda logits: METRIC(logits).mean(),
                0,
                sender,
                component,
                verbose=False,
            )[1]
        except (NotImplementedError, ValueError, RuntimeError) as error:
            pytest.skip(f"TransformerLens's get_act_patch_direct_path cannot run here: {error}")
        ours = torch.tensor(
            [
                gna.path_patching(
                    llama, CORRUPT, CLEAN, METRIC, senders=H(0, sender), receivers=[H(1, h)], receiver_input=component, path="direct"
                )
                for h in range(4)
            ]
        )
        every = torch.tensor(
            [
                gna.path_patching(llama, CORRUPT, CLEAN, METRIC, senders=H(0, sender), receivers=[H(1, h)], receiver_input=component)
                for h in range(4)
            ]
        )
        assert torch.allclose(ours, expected, atol=PARITY, rtol=0), (component, sender, ours, expected)
        assert (every - expected).abs().max() > 10 * PARITY, "path='all' equals TransformerLens too: the test could not tell them apart"
        assert expected.std() > 10 * PARITY


def test_edge_attribution_direct_equals_edge_granularity(llama):
    bridge = llama.backend.bridge
    clean, corrupt = llama.to_batch(CLEAN), llama.to_batch(CORRUPT)
    try:
        result = tl_attr.attribution_patch(
            bridge,
            clean.input_ids,
            corrupt.input_ids,
            lambda logits: METRIC(logits).sum(),
            tl_attr.EdgeAttributionConfig(granularity="edge"),
        )
    except (NotImplementedError, ValueError, RuntimeError) as error:
        pytest.skip(f"TransformerLens's attribution_patch(granularity='edge') cannot run here: {error}")
    expected = torch.zeros(4, 4, 3)  # [sender L0 head, receiver L1 head, q/k/v]
    for (src, dst), score in result.edge_scores.items():
        if src.kind == "attn_head_out" and src.layer == 0 and dst.kind in ("q_input", "k_input", "v_input") and dst.layer == 1:
            expected[src.head, dst.head, "qkv".index(dst.kind[0])] += score
    ours = gna.edge_attribution(
        llama,
        CORRUPT,
        CLEAN,
        METRIC,
        senders=[H(0, h) for h in range(4)],
        receivers=[H(1, h) for h in range(4)],
        receiver_input=["q", "k", "v"],
        path="direct",
        progress=False,
    )
    every = gna.edge_attribution(
        llama,
        CORRUPT,
        CLEAN,
        METRIC,
        senders=[H(0, h) for h in range(4)],
        receivers=[H(1, h) for h in range(4)],
        receiver_input=["q", "k", "v"],
        progress=False,
    )
    assert ours.scores.shape == expected.shape
    assert torch.allclose(ours.scores, expected, atol=PARITY, rtol=0), (ours.scores - expected).abs().max()
    assert (every.scores - expected).abs().max() > 10 * PARITY
    assert expected.abs().max() > 100 * PARITY
