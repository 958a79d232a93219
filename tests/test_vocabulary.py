"""Issue 53, item 6: one vocabulary. Each old keyword or name still works for one release
with a `FutureWarning` naming the new one, and gives exactly what the new one gives; the new
spelling is checked against an independent reference (`Ablate` with `model.logits`, the
softmax formula), so the equality is between two right answers. The signatures themselves are
checked in `tests/test_api_convention.py`."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaTypeError
from gna_interp.models.hybrid_student import hybridize

from .conftest import CLEAN, CORRUPT

METRIC = gna.logit_diff(5, 6)
HEAD = gna.Head(1, 2)

RENAMES = {
    "ablation_sweep": {"max_rows": "batch_size"},
    "patching_sweep": {"max_rows": "batch_size"},
    "attribution_patching": {"max_rows": "batch_size"},
    "path_patching_sweep": {"max_rows": "batch_size"},
    "edge_attribution": {"max_rows": "batch_size"},
    "circuit_score": {"max_rows": "batch_size"},
    "retrieval_ranking": {"probe": "task", "max_rows": "batch_size"},
    "attention_pattern": {"inputs": "clean"},
    "distill": {"show_progress": "progress"},
}
"""Every renamed keyword: function -> {old: new} (the CHANGELOG's migration lines)."""

MOVED = {"entropy": "attention.entropy", "mass_on": "attention.mass_on", "top1_mass": "attention.top1_mass", "evaluation": "scoring"}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.all((a == b) | (a.isnan() & b.isnan())))


def old_call(function, *args, old: str, new: str, **kwargs):
    """``function(*args, **kwargs)``, which must warn once that ``old`` is renamed ``new``."""
    with pytest.warns(FutureWarning, match=rf"{old}.* is renamed .*{new}.*write .*{new}") as record:
        result = function(*args, **kwargs)
    assert len([w for w in record if issubclass(w.category, FutureWarning)]) == 1
    return result


def test_every_rename_is_declared_where_the_function_is():
    for name, renames in RENAMES.items():
        function = getattr(gna, name)
        assert function.__renamed__ == renames, name
        assert not set(renames) & set(inspect.signature(function).parameters), name  # only the new names show


NAMESPACED = {
    "attention.ssm_inputs": {"inputs": "clean"},
    "viz.attention_view": {"inputs": "clean"},
    "viz.heatmap_png": {"inputs": "clean"},
}
NAMESPACED["viz.circuit_view"] = {"inputs": "clean"}


def test_the_namespaces_renames_are_declared_and_work(mamba2):
    for where, renames in NAMESPACED.items():
        namespace, name = where.split(".")
        assert getattr(getattr(gna, namespace), name).__renamed__ == renames, where
    new = gna.attention.ssm_inputs(mamba2, clean=CLEAN, layer=1)
    old = old_call(gna.attention.ssm_inputs, mamba2, inputs=CLEAN, layer=1, old="inputs=", new="clean=")
    assert torch.equal(old.dt, new.dt) and torch.equal(old.B, new.B) and float(new.dt.abs().sum()) > 0


def test_the_old_and_the_new_keyword_at_once_is_an_error(llama_tlens):
    with pytest.raises(GnaTypeError, match=r"max_rows= and batch_size=: max_rows= is the old name of batch_size="):
        gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, METRIC, max_rows=3, batch_size=3, progress=False)


def test_ablation_sweep_old_order_and_max_rows_equal_the_new_and_an_ablate_by_hand(llama_tlens):
    model = llama_tlens
    new = gna.ablation_sweep(model, CLEAN, CORRUPT, METRIC, heads=[HEAD, gna.Head(0, 0)], how="resample", batch_size=3, progress=False)
    with pytest.warns(FutureWarning) as record:
        old = gna.ablation_sweep(
            model, CLEAN, METRIC, heads=[HEAD, gna.Head(0, 0)], how="resample", corrupt=CORRUPT, max_rows=3, progress=False
        )
    messages = " | ".join(str(w.message) for w in record)
    assert "write (model, clean, corrupt, metric)" in messages and "write batch_size=" in messages, messages
    assert same(old.scores, new.scores)
    assert old.baseline == new.baseline
    by_hand = float(METRIC(model.logits(CLEAN, [gna.Ablate([HEAD], how="resample", corrupt=CORRUPT)])).mean())
    assert new.scores[HEAD.layer, HEAD.head].item() == pytest.approx(by_hand, abs=1e-4)
    assert abs(by_hand - new.baseline) > 1e-3  # the head matters: the equality is not of two baselines
    # Zero ablation, the old call without corrupt=: corrupt becomes None.
    zero_old = old_call(gna.ablation_sweep, model, CLEAN, METRIC, heads=[HEAD], progress=False, old="order", new="metric")
    zero_new = gna.ablation_sweep(model, CLEAN, None, METRIC, heads=[HEAD], progress=False)
    assert zero_old.scores[HEAD.layer, HEAD.head].item() == zero_new.scores[HEAD.layer, HEAD.head].item()
    by_keyword = old_call(gna.ablation_sweep, model, clean=CLEAN, metric=METRIC, heads=[HEAD], progress=False, old="order", new="metric")
    assert by_keyword.scores[HEAD.layer, HEAD.head].item() == zero_new.scores[HEAD.layer, HEAD.head].item()
    zero_by_hand = float(METRIC(model.logits(CLEAN, [gna.Ablate([HEAD])])).mean())
    assert zero_new.scores[HEAD.layer, HEAD.head].item() == pytest.approx(zero_by_hand, abs=1e-4)


@pytest.mark.parametrize(
    "name, extra",
    [
        ("patching_sweep", {}),
        ("attribution_patching", {}),
        ("path_patching_sweep", {"receivers": ["logits"], "senders": [HEAD, gna.Head(0, 1)]}),
        ("edge_attribution", {"receivers": [gna.Head(2, 0)], "senders": [HEAD, gna.Head(0, 1)]}),
    ],
)
def test_max_rows_equals_batch_size(llama_tlens, name, extra):
    function = getattr(gna, name)
    new = function(llama_tlens, CLEAN, CORRUPT, METRIC, batch_size=len(CLEAN), progress=False, **extra)
    old = old_call(
        function, llama_tlens, CLEAN, CORRUPT, METRIC, max_rows=len(CLEAN), progress=False, **extra, old="max_rows=", new="batch_size="
    )
    assert same(old.scores, new.scores) and bool(torch.isfinite(new.scores).any())
    assert float(new.scores.nan_to_num().abs().max()) > 1e-4  # not an all-zero table


def test_circuit_score_max_rows_equals_batch_size(llama_tlens):
    order = [HEAD, gna.Head(0, 1), gna.Head(2, 0)]
    kwargs = dict(fractions=(0.5, 1.0), progress=False)
    new = gna.circuit_score(llama_tlens, CLEAN, CORRUPT, METRIC, order, batch_size=3, **kwargs)
    old = old_call(gna.circuit_score, llama_tlens, CLEAN, CORRUPT, METRIC, order, max_rows=3, **kwargs, old="max_rows=", new="batch_size=")
    assert same(old.faithfulness, new.faithfulness) and same(old.metric, new.metric)
    full = float(METRIC(llama_tlens.logits(CLEAN)).mean())
    assert new.metric_full == pytest.approx(full, abs=1e-4)  # the reference: the clean run by hand


def test_retrieval_ranking_probe_and_max_rows(toy_llamas):
    model = toy_llamas["tlens"]
    task = gna.toy_task("llama", 16, seed=53)
    new = gna.retrieval_ranking(model, task=task, batch_size=32, progress=False)
    with pytest.warns(FutureWarning) as record:
        old = gna.retrieval_ranking(model, probe=task, max_rows=32, progress=False)
    assert {"write task=", "write batch_size="} <= {str(w.message).rsplit(": ", 1)[-1] for w in record}
    assert same(old.drop, new.drop) and old.order == new.order
    clean = gna.evaluate(model, task, progress=False).accuracy
    alone = gna.evaluate(model, task, [gna.Ablate([new.order[0]])], progress=False).accuracy
    assert new.drop[new.order[0].layer, new.order[0].head].item() == pytest.approx(clean - alone, abs=1e-12) and clean - alone > 0


def test_attention_pattern_inputs_equals_clean_and_the_softmax(llama_tlens):
    new = gna.attention_pattern(llama_tlens, clean=CLEAN, heads=[HEAD])
    old = old_call(gna.attention_pattern, llama_tlens, inputs=CLEAN, heads=[HEAD], old="inputs=", new="clean=")
    assert torch.equal(old, new)
    rows = new[:, 0].sum(-1)
    assert torch.allclose(rows[rows > 0], torch.ones_like(rows[rows > 0]), atol=1e-5)  # probabilities over the keys


def test_attention_pattern_old_kinds_are_the_head_kinds(llama_tlens, mamba2):
    """``kind="softmax"`` / ``"implicit"`` are ``kind="attention"`` / ``"ssm"``, as ``kind`` names heads elsewhere."""
    for model, head, old, new in ((llama_tlens, HEAD, "softmax", "attention"), (mamba2, gna.Head(1, 0), "implicit", "ssm")):
        expected = gna.attention_pattern(model, CLEAN, [head], kind=new)
        got = old_call(gna.attention_pattern, model, CLEAN, [head], kind=old, old=f"kind='{old}'", new=f"kind='{new}'")
        assert torch.equal(got, expected) and torch.equal(expected, gna.attention_pattern(model, CLEAN, [head]))
        assert float(expected.abs().sum()) > 0
    with pytest.raises(ValueError, match=r"kind='ssm' but heads \['L1H2'\] are not ssm heads"):
        gna.attention_pattern(llama_tlens, CLEAN, [HEAD], kind="ssm")


def test_distill_show_progress_equals_progress(llama_hf, tokenizer):
    teacher = gna.load(copy.deepcopy(llama_hf), tokenizer=tokenizer, backend="nnsight")
    texts = [" ".join(f"w{(i * 7 + j * 3) % 56 + 4}" for j in range(6)) for i in range(6)]
    kwargs = dict(stages=("B",), steps=2, batch_size=3, lr=3e-3, seed=1)
    new_student = hybridize(teacher, [gna.Head(0, 1)], seed=1)
    new = gna.distill(new_student, teacher, texts, progress=False, **kwargs)
    old_student = hybridize(teacher, [gna.Head(0, 1)], seed=1)
    old = old_call(gna.distill, old_student, teacher, texts, show_progress=False, **kwargs, old="show_progress=", new="progress=")
    assert torch.equal(old.losses, new.losses) and bool(torch.all(new.losses > 0))
    for (name, a), (_, b) in zip(old_student.hf_model.named_parameters(), new_student.hf_model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("name", sorted(MOVED))
def test_moved_top_level_names_still_resolve_with_a_warning(name):
    where = MOVED[name]
    new = gna
    for part in where.split("."):
        new = getattr(new, part)
    with pytest.warns(FutureWarning, match=rf"gna_interp\.{name} is renamed gna_interp\.{where}"):
        old = getattr(gna, name)
    assert old is new
    if name != "evaluation":
        pattern = torch.tensor([[[[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]]]])  # [batch, head, query, key]
        expected = {"entropy": torch.tensor([1.0397208, 0.0]), "top1_mass": torch.tensor([0.5, 1.0])}
        value = old(pattern, [0]) if name == "mass_on" else old(pattern)
        assert torch.allclose(value, expected.get(name, torch.tensor([0.5, 1.0])).view(1, 1, 2), atol=1e-6)
