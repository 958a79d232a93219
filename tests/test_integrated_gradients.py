"""Integrated-gradients attribution (issue 29): ``steps=1`` is first-order attribution
patching (against a twin that captures activations and differentiates, no gate); the
effects approach the effect of patching (ablating) every head at once as ``steps`` grows,
within a stated tolerance that shrinks with ``steps``; both backends agree on Llama,
Mamba-2 and the FalconH1 hybrid; the cost meter counts ``steps`` forwards and backwards;
nothing outlives the call."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.core.compile import heads_by_site
from gna_interp.models.tiny import tiny_model
from gna_interp.patching import ablation_attribution

from .conftest import CLEAN, CORRUPT, no_hooks_left

METRIC = gna.logit_diff([5, 7], [6, 8])
FAMILIES = ("llama", "mamba2", "falcon_h1")
REL = 1e-5


@pytest.fixture(scope="module")
def pairs(tokenizer):
    """family -> (tlens model, nnsight model), on the same random weights."""
    out = {}
    for family in FAMILIES:
        hf = tiny_model(family, seed=1)
        out[family] = tuple(gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend=b) for b in ("tlens", "nnsight"))
    return out


def first_order_twin(model, target, source):
    """Today's estimate, without gates: capture every head site on both runs, differentiate
    the metric of the target run with respect to its captured head outputs, and sum
    ``(source - target) . grad`` (``source=None``: zero ablation, ``(0 - target) . grad``)
    per head. Returns ``({head: effect}, metric of the target run)``."""
    sites = sorted(heads_by_site(model.layout, model.heads))
    source_acts = None
    if source is not None:
        source_acts = model.backend.run(model.to_batch(source), model.compile_plan(model.to_batch(source), []), capture=set(sites)).acts
    batch = model.to_batch(target)
    out = model.backend.run(batch, model.compile_plan(batch, []), capture=set(sites), grad=True)
    value = METRIC(out.logits).float().mean()
    grads = torch.autograd.grad(value, [out.acts[site] for site in sites])
    effects = {}
    for site, grad in zip(sites, grads, strict=True):
        act = out.acts[site].detach()
        delta = -act if source_acts is None else source_acts[site] - act
        per_head = (delta * grad).sum((0, 1, 3))
        for head in model.heads:
            head_site, index = model.head_site(head)
            if head_site == site:
                effects[head] = float(per_head[index])
    return effects, float(value.detach())


def effect_table(model, effects):
    table = torch.full((model.n_layers, model.n_heads), float("nan"))
    for head, value in effects.items():
        table[head.layer, head.head] = value
    return table


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", [0, 1])
def test_one_step_is_first_order_attribution(pairs, family, backend):
    model = pairs[family][backend]
    expected, base = first_order_twin(model, CORRUPT, CLEAN)
    got = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, steps=1)
    assert got.meta["method"] == "attribution" and got.meta["steps"] == 1
    assert got.baseline == pytest.approx(base, abs=1e-6)
    table = effect_table(model, expected)
    assert table.abs().max() > 1e-3, "no head has an effect: the test could not fail"
    assert torch.allclose(got.effects(), table, atol=REL * float(table.abs().max()), equal_nan=True), (got.effects() - table).abs().max()
    expected, base = first_order_twin(model, CLEAN, None)
    ablated = ablation_attribution(model, CLEAN, METRIC, steps=1)
    table = effect_table(model, expected)
    assert ablated.baseline == pytest.approx(base, abs=1e-6)
    assert torch.allclose(ablated.effects(), table, atol=REL * float(table.abs().max()), equal_nan=True)


# Completeness: sum_h IG_h -> m(every head patched together) - m(none). The tolerance on the
# relative error shrinks with steps: 0.4 / steps (left Riemann sum, error O(1/steps)) and
# 0.5 / steps^2 (midpoint, O(1/steps^2)). Measured on these models at 2..16 steps, the errors
# lie 1.1x to 40x inside it (steps=16, midpoint: at most 0.11%).
TOLERANCE = {"left": lambda k: 0.4 / k, "midpoint": lambda k: 0.5 / k**2}


@pytest.mark.parametrize("family", FAMILIES)
def test_completeness_patching(pairs, family):
    model = pairs[family][1]
    none = float(METRIC(model.logits(CORRUPT)).mean())
    every = float(METRIC(model.logits(CORRUPT, [gna.Patch(model.heads, source=CLEAN)])).mean())
    full = every - none
    assert abs(full) > 1e-2, f"patching every head moves the metric by {full}: the test could not fail"
    for rule, tolerance in TOLERANCE.items():
        errors = []
        for steps in (2, 4, 8, 16):
            result = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, steps=steps, rule=rule)
            assert result.meta == result.meta | {"method": "integrated_gradients", "steps": steps, "rule": rule}
            assert result.baseline == pytest.approx(none, abs=1e-5)
            errors.append(abs(float(result.effects().nansum()) - full) / abs(full))
            assert errors[-1] <= tolerance(steps), (rule, steps, errors)
        assert errors == sorted(errors, reverse=True), (rule, errors)  # it converges


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_completeness_ablation(pairs, family):
    """The path to every head zeroed at once ends where every layer's heads are silent: the
    integrand is steep there and the midpoint error falls as 1/steps, not 1/steps^2 (Mamba-2,
    measured: 19.5%, 1.9%, 0.47% at 2, 8, 32 steps); the tolerance is 0.5 / steps. (On the
    FalconH1 tiny model the error is 262% and 111% at 2 and 8 steps and 0.27% at 32: its
    path bends too much for few points; not asserted.)"""
    model = pairs[family][0]
    none = float(METRIC(model.logits(CLEAN)).mean())
    full = float(METRIC(model.logits(CLEAN, [gna.Ablate(model.heads)])).mean()) - none
    assert abs(full) > 1e-2, full
    errors = []
    for steps in (2, 8, 32):
        result = ablation_attribution(model, CLEAN, METRIC, steps=steps, rule="midpoint")
        errors.append(abs(float(result.effects().nansum()) - full) / abs(full))
    assert all(error <= 0.5 / steps for error, steps in zip(errors, (2, 8, 32), strict=True)), errors
    assert errors == sorted(errors, reverse=True), errors


@pytest.mark.parametrize("family", FAMILIES)
def test_backends_agree(pairs, family):
    tl, ns = pairs[family]
    for rule in ("left", "midpoint"):
        a = gna.attribution_patching(tl, CLEAN, CORRUPT, METRIC, by_position=True, steps=4, rule=rule)
        b = gna.attribution_patching(ns, CLEAN, CORRUPT, METRIC, by_position=True, steps=4, rule=rule)
        assert a.effects().abs().nan_to_num().max() > 1e-3
        assert torch.allclose(a.scores, b.scores, atol=1e-5, equal_nan=True), (a.scores - b.scores).abs().nan_to_num().max()
        c, d = (ablation_attribution(m, CLEAN, METRIC, steps=3, rule=rule) for m in (tl, ns))
        assert torch.allclose(c.scores, d.scores, atol=1e-5, equal_nan=True)


def test_steps_change_the_estimate_on_the_hybrid(pairs):
    """Integrated gradients are not the first-order estimate under another name: on the
    hybrid the two differ by more than the numbers' rounding."""
    model = pairs["falcon_h1"][1]
    one = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC)
    eight = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, steps=8)
    assert (one.effects() - eight.effects()).abs().nan_to_num().max() > 1e-3


@pytest.mark.parametrize("rule", ["left", "midpoint"])
def test_cost_counts_steps_forwards_and_backwards(pairs, rule):
    model = pairs["mamba2"][1]
    n = len(CLEAN)
    with gna.cost_meter(model) as cost:
        gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, steps=5, rule=rule)
    extra = int(rule == "midpoint")  # the midpoint rule never evaluates alpha = 0: one plain forward for the baseline
    assert (cost.forwards, cost.backwards) == (1 + 5 + extra, 5)
    assert cost.backward_block_rows == 5 * n * model.n_layers
    with gna.cost_meter(model) as cost:
        ablation_attribution(model, CLEAN, METRIC, steps=3, rule=rule)
    assert (cost.forwards, cost.backwards, cost.rows) == (3 + extra, 3, (3 + extra) * n)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(steps=0), ValueError, r"steps=0: expected an int >= 1"),
        (dict(steps=2.5), ValueError, r"steps=2.5: expected an int >= 1"),
        (dict(steps=True), ValueError, r"steps=True: expected an int >= 1"),
        (dict(rule="trapezoid"), ValueError, r"rule='trapezoid': expected one of \('left', 'midpoint'\)"),
        (dict(steps=2, sites="resid"), ValueError, r"steps=2 with sites='resid': integrated gradients score heads"),
    ],
)
def test_bad_steps(pairs, kwargs, error, message):
    with pytest.raises(error, match=message):
        gna.attribution_patching(pairs["llama"][1], CLEAN, CORRUPT, METRIC, **kwargs)
    if "sites" not in kwargs:
        with pytest.raises(error, match=message):
            ablation_attribution(pairs["llama"][0], CLEAN, METRIC, **kwargs)


@pytest.mark.parametrize("backend", [0, 1])
def test_no_residue_even_when_a_step_raises(pairs, backend):
    model = pairs["falcon_h1"][backend]
    before = model.logits(CLEAN)
    calls = {"n": 0}

    def metric(logits):
        calls["n"] += 1
        if calls["n"] == 3:  # the second point of the path
            raise RuntimeError("metric failed")
        return logits[:, -1, 5]

    with pytest.raises(RuntimeError, match="metric failed"):
        gna.attribution_patching(model, CLEAN, CORRUPT, metric, steps=4)
    gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, steps=3)
    assert torch.equal(model.logits(CLEAN), before)
    assert all(p.grad is None for p in model.hf_model.parameters())
    assert no_hooks_left(model)


class SavedBytes:
    """Bytes autograd saves for the backward: now and at the peak (a saved tensor counts
    until its graph is freed)."""

    def __init__(self):
        self.now = self.peak = 0

    def pack(self, tensor):
        return _Held(tensor, self)

    @staticmethod
    def unpack(held):
        return held.tensor


class _Held:
    """One saved tensor. Holds a detached view (same storage): holding the saved tensor
    itself would, for a node's own output, make a cycle through autograd's graph that no
    garbage collection frees."""

    def __init__(self, tensor, meter):
        self.tensor, self.size, self.meter = tensor.detach(), tensor.numel() * tensor.element_size(), meter
        meter.now += self.size
        meter.peak = max(meter.peak, meter.now)

    def __del__(self):
        self.meter.now -= self.size


@pytest.mark.parametrize("family", ["llama", "falcon_h1"])
def test_one_graph_at_a_time(pairs, family):
    """The peak of tensors saved for the backward does not grow with ``steps``: each point's
    graph is freed before the next forward, and none outlives the call."""
    model = pairs[family][1]
    peaks = {}
    for steps in (1, 4):
        saved = SavedBytes()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            gna.attribution_patching(model, CLEAN, CORRUPT, METRIC, steps=steps)
            ablation_attribution(model, CLEAN, METRIC, steps=steps)
        assert saved.now == 0
        peaks[steps] = saved.peak
    assert peaks[1] > 0
    assert peaks[4] == peaks[1]
