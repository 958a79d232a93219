"""Adaptive group testing in the head scan (issue 27, item 3) and roles spread wider than
the search (item 5): the heads found are those single ablations find, at about
k log2(N) group forwards; a spread effect is kept and reported, never dropped."""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.discovery.confirm import SPREAD_FRACTION, spread_set
from gna_interp.discovery.entry import segment_positions
from gna_interp.discovery.group_testing import block_size, group_testing, staged_group_testing
from gna_interp.discovery.head_scans import head_scan
from gna_interp.models.jobs import JobList
from gna_interp.models.tiny import tiny_model, word_tokenizer
from gna_interp.viz.report import write_report


def _heads(n: int, layer: int = 0) -> list[gna.Head]:
    return [gna.Head(layer, i) for i in range(n)]


@pytest.mark.parametrize("n", [8, 128, 4096, 8192])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_k_critical_heads_among_n_cost_about_k_log2_n_tests(n, k):
    """An oracle where each of ``k`` spread-out heads costs 0.1 accuracy: exactly those are
    found, measured alone, in at most ``1 + 2 k ceil(log2 N)`` tests and ``ceil(log2 N) + 1``
    rounds; every other head is screened by a group that costs nothing."""
    critical = {gna.Head(0, (i * 7919) % n) for i in range(k)}

    def measure(groups):
        return [1.0 - 0.1 * len(critical & set(g)) for g in groups]

    found = group_testing(measure, _heads(n), clean=1.0, min_effect=0.02)
    assert found.singles == {h: pytest.approx(0.9) for h in critical}
    assert set(found.screened) == set(_heads(n)) - critical and set(found.screened.values()) <= {1.0}
    assert found.tests <= 1 + 2 * len(critical) * math.ceil(math.log2(n))
    assert n <= 8 or found.tests < n
    assert found.rounds <= math.ceil(math.log2(n)) + 1 and found.spread == []


@pytest.mark.parametrize("spread_heads,quorum", [((5, 70, 100), 3), ((1, 9, 17, 40, 77), 3)])
def test_an_effect_spread_over_heads_is_kept_with_the_heads_it_needs(spread_heads, quorum):
    """No head costs anything alone; ``quorum`` of ``spread_heads`` ablated together do.
    Bisection alone would clear every half; the scan keeps the smallest costly group whose
    halves cost nothing, and names the heads it needs: those whose un-ablation, with the
    rest of the group ablated, brings accuracy back (brute force over the group)."""
    spread = {gna.Head(0, i) for i in spread_heads}

    def accuracy(group):
        return 0.3 if len(spread & set(group)) >= quorum else 1.0

    found = group_testing(lambda groups: [accuracy(g) for g in groups], _heads(128), clean=1.0, min_effect=0.02)
    assert found.singles == {}
    [group] = found.spread
    assert group.accuracy == 0.3 and group.parts == (1.0, 1.0) and len(group.heads) > 4
    half = (len(group.heads) + 1) // 2
    assert accuracy(group.heads[:half]) == accuracy(group.heads[half:]) == 1.0  # the halves cost nothing
    expected = sorted(h for h in group.heads if accuracy([x for x in group.heads if x != h]) == 1.0)
    assert group.needed == expected and len(expected) == quorum
    assert "needs " + ", ".join(map(str, expected)) in group.describe()


def _wide_mamba(channels: int, live: list[int]) -> gna.GnaModel:
    """A random 2-layer Mamba-1 with ``channels`` channels per layer (every channel a head),
    whose layer-1 out-projection reads only the ``live`` channels: ablating any other
    channel of layer 1 changes nothing, exactly."""
    hf = tiny_model("mamba", seed=3, hidden_size=32, expand=channels // 32)
    with torch.no_grad():
        out = hf.backbone.layers[1].mixer.out_proj.weight  # [d_model, channels]
        keep = torch.zeros(channels, dtype=torch.bool)
        keep[live] = True
        out[:, ~keep] = 0
        out[:, keep] *= 20
    return gna.load(hf, tokenizer=word_tokenizer())


@pytest.mark.parametrize("channels,live", [(128, [17]), (128, [3, 64, 100, 127]), (4096, [5, 4000])])
def test_a_wide_mamba1_layer_costs_k_log2_n_group_forwards(channels, live):
    """On a real Mamba-1 (channels as heads), with "accuracy" the share of 8 prompts whose
    final logits stay within 1e-4 of the clean ones: the heads found are the live channels
    (each re-measured alone), in ``<= 1 + 2 k log2 N`` forwards."""
    model = _wide_mamba(channels, live)
    assert model.heads_per_layer[1] == channels
    prompts = [" ".join(f"w{(7 * r + 3 * c) % 60 + 4}" for c in range(6)) for r in range(8)]
    clean = model.logits(prompts)[:, -1]
    forwards = []

    def measure(groups):
        forwards.extend(groups)
        changes = [(model.logits(prompts, [gna.Ablate(g)])[:, -1] - clean).abs().amax(-1) for g in groups]  # [batch] each
        return [float((change <= 1e-4).float().mean()) for change in changes]

    found = group_testing(measure, _heads(channels, layer=1), clean=1.0, min_effect=0.02)
    alone = {gna.Head(1, c): measure([[gna.Head(1, c)]])[0] for c in live}
    assert found.singles == alone and max(alone.values()) < 1.0
    assert found.tests == len(forwards) - len(live) <= 1 + 2 * len(live) * math.ceil(math.log2(channels))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "mamba" else n for n in gna.toy_names()])
def test_the_adaptive_scan_finds_the_exhaustive_scans_heads_on_every_toy(name):
    """Every bundled toy, both layers by group testing (``screen_above=0``) against every
    head ablated alone: the same heads cost at least ``min_effect``, with the same
    accuracies; the others are screened by a group that costs less."""
    model, task = gna.load_toy(name), gna.toy_task(name, 16, seed=4242)
    layers = list(range(model.n_layers))
    clean = gna.evaluate(model, task).accuracy
    exhaustive = head_scan(model, task, layers, screen_above=10**6, progress=False)
    adaptive = head_scan(model, task, layers, screen_above=0, clean=clean, progress=False)
    costly = clean - exhaustive.accuracy >= 0.02
    assert bool(costly.any()), f"{name}: no head costs accuracy alone"
    assert torch.equal(adaptive.verified & (clean - adaptive.accuracy >= 0.02), costly & exhaustive.verified)
    assert torch.allclose(adaptive.accuracy[costly], exhaustive.accuracy[costly])
    screened = ~adaptive.verified & ~adaptive.accuracy.isnan()
    assert bool((clean - adaptive.accuracy[screened] < 0.02).all())
    assert set(adaptive.tests) == set(layers)


def _discover(model, task, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gna.discovery.PositionalAnswerWarning)
        return gna.discover(model, task, progress=False, **options)


@pytest.fixture(scope="module")
def mamba2():
    return gna.load_toy("mamba2_counting"), gna.toy_task("mamba2_counting", 60, seed=4242)


@pytest.mark.slow
def test_a_role_wider_than_the_search_is_reported(mamba2, tmp_path):
    """The Mamba-2 toy's Gather role needs 5 heads; with ``max_heads_per_role=2`` no set
    reaches chance: the circuit says so, names the layer it enters at the segment ends
    (every head of each costly layer ablated there, re-measured), gives the best set with
    its curve, and keeps it through JSON, the summary and the report."""
    model, task = mamba2
    circuit = _discover(model, task, max_heads_per_role=2)
    need = circuit.needs["gather"]
    assert not need.reached_chance and len(need.heads) == 2
    spread = circuit.spread["gather"]
    ends = task.encode().segment_ends
    for layer, value in spread.layers.items():
        heads = [gna.Head(layer, h) for h in range(model.heads_per_layer[layer])]
        assert value == pytest.approx(gna.evaluate(model, task, [gna.Ablate(heads, positions=ends)]).accuracy)
    assert spread.layer == min(spread.layers, key=lambda layer: spread.layers[layer]) == 0
    assert spread.best == need and spread.max_heads == 2 and spread.positions == "ends"
    assert circuit.accuracy["clean"] - spread.layers[0] >= 0.02
    assert ("aggregate" in circuit.spread) == (not circuit.needs["aggregate"].reached_chance)
    text = "spread beyond the search: no set of up to 2 heads reaches chance"
    assert text in circuit.summary() and "enters at layer 0, at the segment ends" in circuit.summary()
    assert gna.GnaCircuit.from_json(circuit.to_json()) == circuit
    page = write_report([(circuit, None, None)], tmp_path).read_text()
    assert 'data-role="spread"' in page and text in page


@pytest.mark.slow
def test_a_remote_run_reports_the_same_spread_in_no_extra_request(mamba2):
    """``remote="local"``: the spread check's layer measurements travel in the
    confirmation's request. The spread record equals the local run's but the size curve (a
    remote model has no local backward for its ordering: not measured), and the request count
    equals that of a run whose roles all reach chance (the check costs no request)."""
    model, task = mamba2
    remote = gna.load(copy.deepcopy(model.hf_model), tokenizer=model.tokenizer, remote="local")
    remote.name = model.name
    local = _discover(model, task, max_heads_per_role=2)
    with gna.cost_meter(remote) as spread_cost:
        spread = _discover(remote, task, max_heads_per_role=2)
    with gna.cost_meter(remote) as full_cost:
        full = _discover(remote, task)
    unsized = {role: dataclasses.replace(item, sizes=[], order=[]) for role, item in local.spread.items()}
    assert spread.spread and spread.spread == unsized and all(item.sizes for item in local.spread.values())
    assert not full.spread
    assert spread_cost.requests == full_cost.requests


def test_an_empty_role_is_never_silent(mamba2):
    """With labels made impossible (an entry share above 1), no head gets a role: each empty
    role still names where it enters (the final position for Aggregate, the segment ends for
    Gather) and the best set of that layer with its curve, each point re-measured. Without
    the cover step (not in ``stages``) the spread sets stay out of the circuit; with it, each
    role's set is its spread set (`confirm.spread_set`), every head a member of the set."""
    model, task = mamba2
    thresholds = gna.discovery.RoleThresholds(entry_share=1.5)
    stages = ("truncation", "layers", "heads", "entry", "roles", "confirm")
    circuit = _discover(model, task, thresholds=thresholds, stages=stages)
    assert circuit.gather == [] and circuit.aggregate == [] and circuit.needs == {}
    covered = _discover(model, task, thresholds=thresholds, stages=(*stages, "cover"))
    for role in ("gather", "aggregate"):
        assert getattr(covered, role) == spread_set(covered.spread[role], SPREAD_FRACTION) != []
        assert all(covered.evidence(h).joint for h in getattr(covered, role))
    encoded = task.encode()
    where = {"final": encoded.final, "ends": encoded.segment_ends}
    assert set(circuit.spread) == {"gather", "aggregate"}
    for role, positions in (("aggregate", "final"), ("gather", "ends")):
        spread = circuit.spread[role]
        assert spread.positions == positions and spread.layer is not None and spread.best is not None
        best = spread.best
        assert [h for h, _ in best.curve] == best.heads and {h.layer for h in best.heads} == {spread.layer}
        for count, (_, accuracy) in enumerate(best.curve, start=1):
            ablate = gna.Ablate(best.heads[:count], positions=where[positions])
            assert accuracy == pytest.approx(gna.evaluate(model, task, [ablate]).accuracy)
        assert best.accuracy == pytest.approx(gna.evaluate(model, task, [gna.Ablate(best.heads)]).accuracy)
        assert spread.describe() in circuit.summary()
    assert circuit.spread["aggregate"].layer == 1  # the toy's Aggregate head L1H6 reads at the final position
    assert segment_positions(encoded).any()


@pytest.mark.parametrize("live", [[17], [3, 64, 100]])
def test_a_remote_scan_finds_the_live_channels_in_two_requests(live):
    """``remote="local"``: the staged design (`staged_group_testing`) on a real Mamba-1 whose
    layer 1 reads only the ``live`` channels, "accuracy" the share of 8 prompts whose final
    logits stay within 1e-4 of the clean ones, every round's groups in one request
    (`JobList`): the findings are the adaptive design's (`group_testing`, run locally): the
    live channels, each measured alone, in 2 requests: the layer halved down to blocks of
    ``b`` (``2 N / b - 1`` groups), then each costly block's halves and heads (``2 + b``)."""
    local = _wide_mamba(128, live)
    remote = gna.load(copy.deepcopy(local.hf_model), tokenizer=local.tokenizer, remote="local")
    prompts = [" ".join(f"w{(7 * r + 3 * c) % 60 + 4}" for c in range(6)) for r in range(8)]
    batch = remote.to_batch(prompts)
    clean = local.logits(prompts)[:, -1]

    def share_unchanged(logits):
        return float(((logits[:, -1] - clean).abs().amax(-1) <= 1e-4).float().mean())

    def measure(groups):
        jobs = JobList(remote)
        for group in groups:
            jobs.add(batch, remote.compile_plan(batch, [gna.Ablate(group)]), keep=2)
        return [share_unchanged(out.logits) for out in jobs.run()]

    with gna.cost_meter(remote) as cost:
        [found] = staged_group_testing(measure, [_heads(128, layer=1)], clean=1.0, min_effect=0.02)
    adaptive = group_testing(
        lambda groups: [share_unchanged(local.logits(prompts, [gna.Ablate(g)])) for g in groups], _heads(128, layer=1), 1.0, 0.02
    )
    assert found.singles == adaptive.singles and found.screened == adaptive.screened and found.spread == adaptive.spread == []
    assert set(found.singles) == {gna.Head(1, c) for c in live} and max(found.singles.values()) < 1.0
    assert cost.requests == found.rounds == 2
    b = block_size(128)
    assert b == 8 and found.tests == 2 * 128 // b - 1 + (2 + b) * len(live)


def test_the_staged_design_keeps_a_spread_effect_with_the_heads_it_needs():
    """The spread oracle of `test_an_effect_spread_over_heads_is_kept_with_the_heads_it_needs`
    (3 of ``(5, 70, 100)`` together cost 0.7; none alone) in the staged design, with a
    second layer holding one critical head, both layers in the same rounds: the findings
    equal the adaptive design's layer by layer (the spread group, the heads it needs, the
    singles, the screened heads' accuracies), in 3 rounds: layer 0's halves cost nothing, so
    the first round ends its tree and finds the spread layer, whose quarters' complements go
    with layer 1's second round, and every part below the needed quarters in a third.
    """
    spread, critical = {gna.Head(0, i) for i in (5, 70, 100)}, gna.Head(1, 9)
    calls = []

    def measure(groups):
        calls.append(len(groups))
        return [(0.3 if len(spread & set(g)) == 3 else 1.0) - (0.1 if critical in g else 0.0) for g in groups]

    zero, one = staged_group_testing(measure, [_heads(128), _heads(128, layer=1)], clean=1.0, min_effect=0.02)
    rounds = len(calls)
    for staged, heads in ((zero, _heads(128)), (one, _heads(128, layer=1))):
        adaptive = group_testing(measure, heads, clean=1.0, min_effect=0.02)
        assert (staged.singles, staged.screened, staged.spread) == (adaptive.singles, adaptive.screened, adaptive.spread)
    [group] = zero.spread
    assert group.needed == sorted(spread) and group.accuracy == pytest.approx(0.3)
    assert zero.singles == {} and one.singles == {critical: pytest.approx(0.9)} and one.spread == []
    assert zero.rounds == 3 and one.rounds == 2 and rounds == 3


def _brute_force_singles(measure, heads, clean, min_effect):
    """Every head measured alone: those whose single ablation costs at least ``min_effect``."""
    values = measure([[h] for h in heads])
    return {h: v for h, v in zip(heads, values, strict=True) if clean - v >= min_effect}


@pytest.mark.parametrize("seed", range(6))
def test_group_testing_alone_matches_brute_force_on_a_synthetic_oracle(seed):
    """No model: an additive oracle (every head has its own effect; a few are large, many
    are small but non-zero, below ``min_effect`` alone) scored against the brute-force
    answer, every head ablated alone. Group testing finds exactly the heads brute force
    finds, with the same accuracies, and screens every other head with the accuracy of a
    group that costs less than ``min_effect`` (so each of them costs less alone, by
    monotonicity)."""
    generator = torch.Generator().manual_seed(seed)
    n, clean, min_effect = 96, 0.9, 0.02
    heads = _heads(n, layer=3)
    effects = {h: float(e) for h, e in zip(heads, torch.rand(n, generator=generator) * 1e-4, strict=True)}  # all together below min_effect
    for index in torch.randperm(n, generator=generator)[: 1 + seed % 4].tolist():
        effects[heads[index]] = 0.03 + 0.05 * index / n  # the important heads

    def measure(groups):
        return [clean - sum(effects[h] for h in group) for group in groups]

    found = group_testing(measure, heads, clean=clean, min_effect=min_effect)
    expected = _brute_force_singles(measure, heads, clean, min_effect)
    assert found.singles == pytest.approx(expected) and set(found.singles) == set(expected)
    assert set(found.screened) == set(heads) - set(expected)
    for head, value in found.screened.items():
        assert clean - value < min_effect and clean - value >= effects[head] - 1e-12
    assert found.spread == [] and found.tests < n
    staged = staged_group_testing(measure, [heads], clean, min_effect)[0]
    assert (staged.singles, staged.screened) == (found.singles, found.screened)


@pytest.mark.parametrize(("needed_at", "n"), [((5,), 32), ((2, 17, 30), 32), ((0, 63), 64)])
def test_group_testing_finds_the_needed_heads_of_an_interaction_like_brute_force(needed_at, n):
    """No model: an oracle whose effect (0.5) appears only when every head of a hidden set
    is ablated together (no head costs anything alone). Group testing keeps the layer as a
    spread group, and its search names exactly the heads brute force names: those whose
    un-ablation alone (the rest of the group still ablated) brings accuracy back."""
    heads = _heads(n)
    hidden = {heads[i] for i in needed_at}
    clean, min_effect = 1.0, 0.02

    def measure(groups):
        return [clean - 0.5 * (hidden <= set(group)) for group in groups]

    found = group_testing(measure, heads, clean=clean, min_effect=min_effect)
    [back] = measure([[]])
    brute = [h for h in heads if clean - measure([[g for g in heads if g != h]])[0] < min_effect]
    assert back == clean and found.singles == ({} if len(hidden) > 1 else {next(iter(hidden)): 0.5})
    spread = [group for group in found.spread if group.heads == heads]
    if len(hidden) > 1:
        assert len(spread) == 1 and spread[0].accuracy == 0.5 and spread[0].searched
        assert spread[0].needed == sorted(brute) == sorted(hidden)


def test_the_group_testing_module_runs_no_model():
    """`discovery.group_testing` imports nothing of gna_interp but `core.heads` and its
    `SpreadGroup` (`discovery.spread_group`, which imports nothing but `core.heads`): it scores
    groups through the callable it is given, and nothing else."""
    import ast
    from pathlib import Path

    import gna_interp.discovery.group_testing as module
    import gna_interp.discovery.spread_group as spread_module

    for source, expected in ((module, {"core.heads", "spread_group"}), (spread_module, {"core.heads"})):
        tree = ast.parse(Path(source.__file__).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
        assert imported == expected, (source.__name__, imported)


def _cancelling_oracle(n: int, critical: int, masked: int, partner: int):
    """The trained Mamba-1 toy's layer 1 in miniature: ``critical`` costs 0.1 alone,
    ``masked`` 0.035 alone, and ``partner`` (nothing alone) cancels ``masked`` when both are
    ablated, while adding 0.3 with ``critical`` (the layer's heads interact: the whole layer
    costs more than its halves add up to). Bisection without the masked check clears the half
    that holds ``masked`` and ``partner``."""
    c, m, p = gna.Head(0, critical), gna.Head(0, masked), gna.Head(0, partner)

    def accuracy(group):
        g = set(group)
        effect = 0.1 * (c in g) + 0.035 * (m in g and p not in g) + 0.3 * (c in g and p in g)
        return 1.0 - effect

    return lambda groups: [accuracy(g) for g in groups]


@pytest.mark.parametrize(
    ("critical", "masked", "partner", "n"),
    [(22, 92, 110, 128), (3, 40, 60, 64), pytest.param(500, 2000, 1500, 4096, marks=pytest.mark.slow)],
)
def test_a_head_whose_cost_a_partner_cancels_is_found_like_brute_force(critical, masked, partner, n):
    """No model: a head that costs 0.035 alone sits in a half that costs nothing (its partner
    cancels it there). The split's halves do not add up to the group (`masked_parts`), so
    the cleared half is searched anyway: the heads found are brute force's (every head
    alone), with the same accuracies, in both designs; without the check the head is missed."""
    measure, heads, clean = _cancelling_oracle(n, critical, masked, partner), _heads(n), 1.0
    expected = _brute_force_singles(measure, heads, clean, 0.02)
    assert set(expected) == {gna.Head(0, critical), gna.Head(0, masked)}
    assert measure([[gna.Head(0, masked), gna.Head(0, partner)]]) == [clean]  # together they cost nothing
    missed = group_testing(measure, heads, clean, 0.02, masked=False)
    assert set(missed.singles) == {gna.Head(0, critical)}  # the miss, as before
    found = group_testing(measure, heads, clean, 0.02)
    assert found.singles == pytest.approx(expected) and set(found.singles) == set(expected)
    assert set(found.screened) == set(heads) - set(expected)
    assert found.tests <= missed.tests + 4 * math.ceil(math.log2(n)) < n
    staged = staged_group_testing(measure, [heads], clean, 0.02)[0]
    assert (staged.singles, staged.screened) == (found.singles, found.screened)


@pytest.mark.parametrize("seed", range(4))
def test_the_masked_check_costs_nothing_on_additive_effects(seed):
    """Where effects add up (the synthetic oracle of
    `test_group_testing_alone_matches_brute_force_on_a_synthetic_oracle`), no split is
    flagged: the same tests as without the check."""
    generator = torch.Generator().manual_seed(seed)
    heads = _heads(256)
    effects = {h: float(e) for h, e in zip(heads, torch.rand(256, generator=generator) * 1e-4, strict=True)}
    for index in torch.randperm(256, generator=generator)[: 1 + seed].tolist():
        effects[heads[index]] = 0.05

    def measure(groups):
        return [1.0 - sum(effects[h] for h in group) for group in groups]

    with_check, without = group_testing(measure, heads, 1.0, 0.02), group_testing(measure, heads, 1.0, 0.02, masked=False)
    assert (with_check.tests, with_check.singles) == (without.tests, without.singles)


@pytest.mark.slow
def test_the_mamba1_toys_masked_channel_is_found_like_brute_force():
    """The trained 2 x 128 Mamba-1 toy, 200 prompts (seed 4242), layer 1: every channel
    ablated alone (brute force: L1H22 0.895, L1H92 0.965 cost at least 0.02) against
    group testing, where the half L1H64-L1H127 costs nothing (L1H92's cost cancels there):
    the same channels, with the same accuracies; without the masked check L1H92 is missed."""
    if "mamba" not in gna.toy_names():
        pytest.skip("the Mamba-1 toy is not bundled yet")
    model, task = gna.load_toy("mamba"), gna.toy_task("mamba", 200, seed=4242)
    clean = gna.evaluate(model, task).accuracy
    exhaustive = head_scan(model, task, [1], screen_above=10**6, progress=False)
    brute = {gna.Head(1, h): float(v) for h, v in enumerate(exhaustive.accuracy[1].tolist()) if clean - v >= 0.02}
    assert set(brute) == {gna.Head(1, 22), gna.Head(1, 92)}
    adaptive = head_scan(model, task, [1], screen_above=0, clean=clean, progress=False)
    found = {
        gna.Head(1, h): float(adaptive.accuracy[1, h])
        for h in range(128)
        if adaptive.verified[1, h] and clean - adaptive.accuracy[1, h] >= 0.02
    }
    assert found == pytest.approx(brute)
    assert gna.evaluate(model, task, [gna.Ablate([gna.Head(1, h) for h in range(64, 128)])]).accuracy == clean
