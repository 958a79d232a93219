"""Attribution patching: exact where the model is linear in the patched activation, equal
to a raw-autograd reference everywhere, the same on both backends, clear errors, and no
residue (no hooks, no accumulated ``.grad``)."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from . import path_twin
from .conftest import CLEAN, CORRUPT, TOL, no_hooks_left

METRIC = gna.logit_diff([5, 7], [6, 8])
NAMES = ["llama-tlens", "llama-nnsight", "mamba2", "mamba"]


class FixedScale(torch.nn.Module):
    """A final "norm" that is linear: multiply by a constant (of the size RMSNorm's 1/rms
    would have here, so the logits keep their usual scale)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def linear_tail(hf, scale: float = 30.0):
    """Make the logits linear in the last layer's head outputs: the final norm becomes a
    fixed scale and (Llama) the last MLP's down-projection is zeroed, so only ``out_proj``
    -> residual -> unembedding follows those heads."""
    backbone = hf.model if hasattr(hf, "model") else hf.backbone
    setattr(backbone, "norm" if hasattr(backbone, "norm") else "norm_f", FixedScale(scale))
    last = backbone.layers[-1]
    if hasattr(last, "mlp"):
        with torch.no_grad():
            last.mlp.down_proj.weight.zero_()
    return hf


def _load(name, tokenizer, hf):
    return gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="tlens" if name == "llama-tlens" else "nnsight")


def _hf(name, seed=1):
    return tiny_model(name.split("-")[0], seed=seed)


@pytest.fixture(scope="module")
def plain(tokenizer):
    hfs = {name: _hf(name) for name in NAMES}
    return {name: (hf, _load(name, tokenizer, hf)) for name, hf in hfs.items()}


@pytest.mark.parametrize("name", NAMES)
def test_exact_where_the_model_is_linear_in_the_activation(tokenizer, name):
    model = _load(name, tokenizer, linear_tail(_hf(name)))
    last = [gna.Head(model.n_layers - 1, h) for h in range(model.n_heads)]
    for direction in ("denoise", "noise"):
        attribution = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, heads=last, direction=direction)
        exact = gna.patching_sweep(model, CLEAN, CORRUPT, METRIC, heads=last, direction=direction, progress=False)
        assert attribution.kind == "attribution" and attribution.dims == ("layer", "head")
        assert abs(attribution.baseline - exact.baseline) < TOL and abs(attribution.reference - exact.reference) < TOL
        assert exact.effects()[-1].abs().max() > 1e-2, "patching the last layer has no effect: the test could not fail"
        assert torch.allclose(attribution.scores, exact.scores, atol=TOL, equal_nan=True)
        assert [head for head, _ in attribution.top(3)] == [head for head, _ in exact.top(3)]


def test_nonlinear_layers_are_only_approximate(plain):
    """The same comparison on the unmodified model differs: the linear construction matters."""
    _, model = plain["mamba2"]
    attribution = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC)
    exact = gna.patching_sweep(model, CLEAN, CORRUPT, METRIC, progress=False)
    assert (attribution.scores - exact.scores).abs().max() > 1e-3


def _raw_reference(hf, batch, source_batch, sites):
    """Per layer, ``((source - target) * d metric / d act)`` summed over batch and features:
    ``[pos, head]`` (head outputs) or ``[pos]`` (residual), from raw hooks and autograd."""
    acts, hooks = {"target": {}, "source": {}}, []
    for layer in range(hf.config.num_hidden_layers):
        backbone = hf.model if hasattr(hf, "model") else hf.backbone
        module = path_twin.mixer(hf, layer)
        module = (module.o_proj if hasattr(module, "o_proj") else module.out_proj) if sites == "heads" else backbone.layers[layer]
        hooks.append((layer, module))
    for role, b in (("source", source_batch), ("target", batch)):
        handles = []
        for layer, module in hooks:

            def pre(mod, args, layer=layer, role=role):
                if args[0].requires_grad:
                    args[0].retain_grad()
                acts[role][layer] = args[0]

            handles.append(module.register_forward_pre_hook(pre))
        try:
            with torch.set_grad_enabled(role == "target"):
                logits = hf(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        finally:
            for handle in handles:
                handle.remove()
    METRIC(logits).mean().backward()
    hf.zero_grad(set_to_none=True)
    out = {}
    for layer, act in acts["target"].items():
        term = (acts["source"][layer] - act.detach()) * act.grad
        if sites == "heads":
            term = term.reshape(*term.shape[:2], path_twin.n_heads(hf), -1)
        out[layer] = term.sum(-1).sum(0)
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sites", ["heads", "resid"])
def test_matches_raw_autograd(plain, name, sites):
    hf, model = plain[name]
    for direction in ("denoise", "noise"):
        target, source = (CORRUPT, CLEAN) if direction == "denoise" else (CLEAN, CORRUPT)
        expected = _raw_reference(hf, model.to_batch(target), model.to_batch(source), sites)
        per_pos = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, sites=sites, by_position=True, direction=direction)
        total = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, sites=sites, direction=direction)
        assert per_pos.dims == (("layer", "head", "pos") if sites == "heads" else ("layer", "pos"))
        for layer, ref in expected.items():
            got = per_pos.effects()[layer]
            got = got.T if sites == "heads" else got  # [head, pos] -> [pos, head]
            assert ref.abs().max() > 1e-3, f"layer {layer} has no gradient signal: the test could not fail"
            assert torch.allclose(got, ref, atol=TOL), (layer, (got - ref).abs().max())
            assert torch.allclose(total.effects()[layer], ref.sum(0), atol=TOL)
    assert all(p.grad is None for p in model.hf_model.parameters()), "attribution left gradients on the weights"


def test_backends_agree(plain):
    a = gna.attribution_patching(plain["llama-tlens"][1], CLEAN, CORRUPT, METRIC, by_position=True)
    b = gna.attribution_patching(plain["llama-nnsight"][1], CLEAN, CORRUPT, METRIC, by_position=True)
    assert torch.allclose(a.scores, b.scores, atol=TOL) and a.effects().abs().max() > 1e-3


def test_subset_of_heads_and_frame(plain):
    _, model = plain["mamba"]
    heads = [gna.Head(1, 3), gna.Head(1, 60)]
    result = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, heads=heads)
    full = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC)
    assert result.scores.isnan().sum() == result.scores.numel() - 2
    for head in heads:
        assert abs(float(result.scores[head.layer, head.head]) - float(full.scores[head.layer, head.head])) < TOL
    assert len(result.to_frame()) == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(corrupt=["w5 w6 w7"] * 3), ValueError, r"clean has 5 token positions and corrupt has 4"),
        (dict(sites="streams"), ValueError, r"sites='streams': expected 'heads' or 'resid'"),
        (dict(direction="up"), ValueError, r"direction='up'"),
        (dict(heads=[]), ValueError, r"heads is empty"),
        (dict(metric=gna.candidate_accuracy([5, 6], [0, 0, 0])), ValueError, r"does not depend differentiably on the logits"),
        (dict(metric=lambda logits: 1.0), TypeError, r"needs a metric that returns a tensor .* got float"),
    ],
)
def test_bad_input(plain, kwargs, error, message):
    args = dict(clean=CLEAN, corrupt=CORRUPT, metric=METRIC) | kwargs
    with pytest.raises(error, match=message):
        gna.attribution_patching(plain["llama-nnsight"][1], **args)


@pytest.mark.parametrize("name", ["llama-tlens", "llama-nnsight", "mamba2"])
def test_raising_metric_leaves_no_residue(plain, name):
    _, model = plain[name]
    before = model.logits(CLEAN)
    calls = {"n": 0}

    def metric(logits):
        calls["n"] += 1
        if calls["n"] == 2:  # the gradient run
            raise RuntimeError("metric failed")
        return logits[:, -1, 5]

    with pytest.raises(RuntimeError, match="metric failed"):
        gna.attribution_patching(model, CLEAN, CORRUPT, metric)
    assert torch.equal(model.logits(CLEAN), before)
    assert all(p.grad is None for p in model.hf_model.parameters())
    assert no_hooks_left(model)


def _batch_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """A scalar that mixes the rows (not a mean of per-row values): chunking must still be exact."""
    return logits[:, -1, 5:9].float().logsumexp(-1).logsumexp(0)


@pytest.mark.parametrize("name", ["llama-tlens", "mamba2"])
def test_chunked_rows_equal_the_whole_batch(plain, name):
    """batch_size splits the rows of each forward-and-backward; the scores are the whole
    batch's (1e-6), for a per-row metric and one that mixes the rows, with integrated
    gradients, by position, and under a per-row (resample) intervention."""
    model = plain[name][1]
    per_row = gna.logit_diff(torch.tensor([5, 9, 13]), torch.tensor([6, 10, 14]))
    resample = gna.Ablate([gna.Head(0, 1)], how="resample", corrupt=CORRUPT)
    cases = [
        dict(metric=METRIC),
        dict(metric=per_row, steps=3, rule="midpoint"),
        dict(metric=_batch_logsumexp, steps=2, by_position=True),
        dict(metric=METRIC, direction="noise", interventions=[resample]),
    ]
    for case in cases:
        metric = case.pop("metric")
        whole = gna.attribution_patching(model, CLEAN, CORRUPT, metric, progress=False, **case)
        assert whole.effects().abs().nan_to_num().max() > 1e-3, "no effect: the comparison could not fail"
        for rows in (1, 2):
            chunked = gna.attribution_patching(model, CLEAN, CORRUPT, metric, batch_size=rows, progress=False, **case)
            assert abs(chunked.baseline - whole.baseline) < 1e-6 and abs(chunked.reference - whole.reference) < 1e-6
            assert torch.allclose(chunked.scores, whole.scores, atol=1e-6, rtol=0, equal_nan=True), (case, rows)
    assert no_hooks_left(model)
