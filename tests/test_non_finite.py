"""Issue 27, item 8: bad numbers are named, as bad inputs are.

Logits that hold NaN or inf raise `NonFiniteLogitsError` naming where values first turn
non-finite (a layer and head, or a layer's out-projection, and the bad parameter), on both
backends; the model is clean afterwards (no hook, the same logits once the weight is
restored). A metric returning ``[batch, k]`` is refused with the shape it returned."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

import gna_interp as gna
from gna_interp.backends.finite import NonFiniteLogitsError

from .conftest import CLEAN, PROMPTS, no_hooks_left

BACKENDS = ["tlens", "nnsight"]
HEAD_DIM = 8  # the tiny Llama: 6 heads of 8, 2 KV heads


def parameter(model, path: str) -> torch.nn.Parameter:
    """The HF parameter at ``path`` (through the bridge's wrappers on tlens)."""
    root = model.backend.root if model.backend_name == "tlens" else model.hf_model
    for name, value in root.named_parameters():
        if name.replace("._original_component", "") == path:
            return value
    raise KeyError(path)


@contextmanager
def poisoned(model, path: str, index: tuple[int, int], value: float = float("nan")) -> Iterator[None]:
    """One entry of a weight set to ``value`` for the block, restored on exit."""
    weight = parameter(model, path)
    saved = weight.data[index].clone()
    weight.data[index] = value
    try:
        yield
    finally:
        weight.data[index] = saved


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_a_head_names_the_layer_and_head(llama_models, backend):
    """A NaN in layer 1's value projection (KV head 0 serves query heads 0-2): the first
    non-finite value is head 0's output in layer 1, and the parameter is listed."""
    model = llama_models[backend]
    reference = model.logits(PROMPTS)
    with (
        poisoned(model, "model.layers.1.self_attn.v_proj.weight", (3, 5)),
        pytest.raises(
            NonFiniteLogitsError,
            match=r"the logits hold NaN at row 0, position \d+; values first turn non-finite in layer 1: head 0 of its mixer "
            r"model\.layers\.1\.self_attn \(the input of its out-projection model\.layers\.1\.self_attn\.o_proj.*"
            r"non-finite parameters: model\.layers\.1\.self_attn\.v_proj\.weight \(1 value\(s\)\)",
        ),
    ):
        model.logits(PROMPTS)
    assert no_hooks_left(model)
    torch.testing.assert_close(model.logits(PROMPTS), reference, atol=0, rtol=0)  # clean afterwards


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_an_out_projection_names_its_head_columns(llama_models, backend):
    """A NaN in column ``2 * 8 + 5`` of layer 2's out-projection: the heads' outputs are
    finite, the block's output is not, and the bad columns are head 2's. A sweep raises
    the same error (its forwards run stacked, from a prefix)."""
    model = llama_models[backend]
    with poisoned(model, "model.layers.2.self_attn.o_proj.weight", (7, 2 * HEAD_DIM + 5)):
        expected = (
            r"values first turn non-finite in layer 2 after its heads \(their outputs are finite\): in an out-projection, the MLP "
            r"or a norm of block 2 .*model\.layers\.2\.self_attn\.o_proj\.weight \(1 value\(s\), in the out-projection columns "
            r"of head\(s\) \[2\]\)"
        )
        with pytest.raises(NonFiniteLogitsError, match=expected):
            model.logits(CLEAN, logits_to_keep=1)
        with pytest.raises(NonFiniteLogitsError, match=expected):
            gna.ablation_sweep(model, CLEAN, None, gna.logit_diff(5, 6), heads=[gna.Head(2, 0)], progress=False)
    assert no_hooks_left(model)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inf_in_the_embedding_is_named(llama_models, backend):
    """Token 5's embedding row set to inf: already non-finite entering block 0, at the
    first real token that is token 5 (row 0, position 1 after <bos>)."""
    model = llama_models[backend]
    batch = model.to_batch(CLEAN)
    row, position = (batch.input_ids == 5).nonzero()[0].tolist()
    with (
        poisoned(model, "model.embed_tokens.weight", (5, 0), float("inf")),
        pytest.raises(
            NonFiniteLogitsError,
            match=rf"values are already non-finite in the embeddings \(row {row}, position {position}\)",
        ),
    ):
        model.logits(CLEAN)
    assert no_hooks_left(model)


@pytest.mark.parametrize("backend", BACKENDS)
def test_metric_of_shape_batch_by_k_is_refused(llama_models, backend):
    """A metric returning ``[batch, k]`` (the candidates' logits, not reduced), or one value
    per row of the wrong count, is refused with the shape it returned."""
    model = llama_models[backend]
    n_rows = len(CLEAN)

    def per_candidate(logits):
        return logits[:, -1, [5, 6, 7]]

    with pytest.raises(ValueError, match=rf"metric .*per_candidate returned a tensor of shape \({n_rows}, 3\): expected a scalar"):
        gna.ablation_sweep(model, CLEAN, None, per_candidate, heads=[gna.Head(0, 0)], progress=False)
    with pytest.raises(
        ValueError, match=rf"returned a tensor of shape \(2,\): expected a scalar or one value per row \[batch\] \({n_rows}\)"
    ):
        gna.ablation_sweep(model, CLEAN, None, lambda logits: logits[:2, -1, 5], heads=[gna.Head(0, 0)], progress=False)
    assert no_hooks_left(model)
