"""Issue 27, item 6: only the logits that are read are computed.

A metric that reads one position (the library's own read the last) gets the logits of
that position alone, computed there alone (the unembedding's input narrowed), on both
backends and under nnsight's ``remote="local"`` simulation; a user metric that declares
nothing gets every position. The numbers are those of the full run."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model
from gna_interp.patching.metrics import logits_read

from .conftest import CLEAN, CORRUPT, PROMPTS, TOL, no_hooks_left

BACKENDS = ["tlens", "nnsight"]


@pytest.fixture(scope="module")
def mamba2_models(tokenizer):
    hf = tiny_model("mamba2", seed=4)
    return {backend: gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend=backend) for backend in BACKENDS}


@pytest.fixture(params=["llama", "mamba2"])
def family_models(request, llama_models, mamba2_models):
    return llama_models if request.param == "llama" else mamba2_models


def unembedding_rows(model) -> tuple[torch.nn.Module, list[tuple[int, ...]]]:
    """The HF model's unembedding module and a list for a raw forward hook to fill with the
    shape of each output it computes (the hook is removed by the caller)."""
    root = model.backend.root if model.backend_name == "tlens" else model.hf_model
    head = root.get_output_embeddings()
    return head._modules.get("_original_component", head), []  # the HF module inside the bridge's wrapper


@pytest.mark.parametrize("backend", BACKENDS)
def test_last_position_logits_equal_the_full_runs(family_models, backend):
    """``logits_to_keep=k``: ``[batch, k, vocab]``, equal to the full run's last ``k``
    positions (with and without an ablation), and the unembedding sees ``k`` positions."""
    model = family_models[backend]
    ablate = [gna.Ablate([gna.Head(1, 0), gna.Head(0, 1)])]
    for interventions in ([], ablate):
        full = model.logits(PROMPTS, interventions)
        for k in (1, 3):
            head, shapes = unembedding_rows(model)
            handle = head.register_forward_hook(lambda module, args, out, shapes=shapes: shapes.append(tuple(out.shape)))
            try:
                kept = model.logits(PROMPTS, interventions, logits_to_keep=k)
            finally:
                handle.remove()
            assert kept.shape == (len(PROMPTS), k, full.shape[-1])
            torch.testing.assert_close(kept, full[:, -k:], atol=TOL, rtol=0)
            assert shapes == [(len(PROMPTS), k, full.shape[-1])], shapes  # computed at k positions only
    assert no_hooks_left(model)


def test_remote_programs_compute_the_final_position_alone(llama_hf, tokenizer):
    """Under ``remote="local"`` a sweep's jobs come back with the final position only, and
    the remote program narrowed the unembedding's input to it (the scores equal the local
    model's, which runs every position for an undeclared metric)."""
    local = gna.load(copy.deepcopy(llama_hf), tokenizer=tokenizer, backend="nnsight")
    remote = gna.load(copy.deepcopy(llama_hf), tokenizer=tokenizer, remote="local")
    heads = [gna.Head(layer, h) for layer in range(2) for h in range(3)]
    shapes: list[tuple[int, ...]] = []
    handle = remote.hf_model.get_output_embeddings().register_forward_hook(lambda m, args, out: shapes.append(tuple(out.shape)))
    try:
        declared = gna.ablation_sweep(remote, CLEAN, None, gna.logit_diff(5, 6), heads=heads, progress=False)
    finally:
        handle.remove()
    assert shapes and all(shape[1] == 1 for shape in shapes), shapes
    undeclared = gna.ablation_sweep(local, CLEAN, None, lambda logits: logits[:, -1, 5] - logits[:, -1, 6], heads=heads, progress=False)
    torch.testing.assert_close(declared.scores, undeclared.scores, atol=TOL, rtol=0, equal_nan=True)
    assert declared.baseline == pytest.approx(undeclared.baseline, abs=TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sweeps_and_patching_give_the_same_numbers(family_models, backend):
    """A declared metric (logits at the last position alone) and the same metric as an
    undeclared lambda (every position) give the same sweep, patching and path patching
    numbers; the lambda was handed every position, the declared metric one."""
    model = family_models[backend]
    seen: dict[str, set[int]] = {"declared": set(), "undeclared": set()}
    base = gna.logit_diff(5, 6)

    def declared_body(logits):
        seen["declared"].add(logits.shape[1])
        return base(logits)

    def undeclared(logits):
        seen["undeclared"].add(logits.shape[1])
        return base(logits)

    declared = gna.reads_position(declared_body, -1)
    assert logits_read(declared) == 1 and logits_read(undeclared) == 0 and logits_read(base) == 1
    heads = [gna.Head(layer, h) for layer in range(2) for h in range(2)]
    for run in (
        lambda metric: gna.ablation_sweep(model, CLEAN, None, metric, heads=heads, progress=False),
        lambda metric: gna.patching_sweep(model, CLEAN, CORRUPT, metric, sites="resid", progress=False),
    ):
        a, b = run(declared), run(undeclared)
        torch.testing.assert_close(a.scores, b.scores, atol=TOL, rtol=0, equal_nan=True)
        assert a.baseline == pytest.approx(b.baseline, abs=TOL)
    value = gna.path_patching(model, CLEAN, CORRUPT, declared, senders=[gna.Head(0, 0)], receivers=[gna.Head(1, 1)])
    assert value == pytest.approx(
        gna.path_patching(model, CLEAN, CORRUPT, undeclared, senders=[gna.Head(0, 0)], receivers=[gna.Head(1, 1)]), abs=TOL
    )
    n_pos = model.to_batch(CLEAN).n_pos
    assert seen == {"declared": {1}, "undeclared": {n_pos}}
    assert no_hooks_left(model)


def test_reads_position_refuses_what_is_not_a_metric_or_a_position():
    with pytest.raises(TypeError, match=r"metric='accuracy' is not callable"):
        gna.reads_position("accuracy")
    with pytest.raises(TypeError, match=r"reads_position: position=True: expected an int position"):
        gna.reads_position(lambda logits: logits[:, -1, 0], True)
    assert logits_read(gna.reads_position(lambda logits: logits[:, 2, 0], 2)) == 0  # a position from the start: every position
    assert logits_read(gna.target_logprob(3, position=-2)) == 2


def test_llamba_computes_the_kept_positions_alone(tokenizer):
    """Llamba (no ``get_output_embeddings``: Cartesia's class and the twin): the root
    ``lm_head`` is the unembedding narrowed, so ``logits_to_keep`` saves its cost there too."""
    from gna_interp.models.llamba import tiny_llamba

    twin = tiny_llamba(seed=2, vocab_size=len(tokenizer))
    model = gna.load(twin, tokenizer=tokenizer)
    full = model.logits(PROMPTS, [gna.Ablate([gna.Head(1, 0)])])
    shapes: list[tuple[int, ...]] = []
    handle = twin.lm_head.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    try:
        kept = model.logits(PROMPTS, [gna.Ablate([gna.Head(1, 0)])], logits_to_keep=1)
    finally:
        handle.remove()
    torch.testing.assert_close(kept, full[:, -1:], atol=TOL, rtol=0)
    assert shapes == [(len(PROMPTS), 1, full.shape[-1])], shapes
