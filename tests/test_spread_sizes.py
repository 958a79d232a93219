"""A spread role's size (`discovery.sizes`, `SpreadRole.sizes` / `heads_for`): the bisection on
``k`` against brute force (every ``k`` measured), the ordering by importance (not by index),
`heads_for` on a hand-built curve, the JSON round trip, and the demo table's honest headline
(`viz.summary`: what each circuit carries, partial with its size)."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaValueError
from gna_interp.discovery import sizes
from gna_interp.discovery.circuit import GnaCircuit
from gna_interp.discovery.evidence import RoleNeed, SpreadRole
from gna_interp.discovery.head_scans import HeadScan


def brute_heads_for(curve: list[float], fraction: float) -> int:
    """The fewest ``k`` whose effect reaches ``fraction`` of the whole (``curve[k]``: every ``k`` measured)."""
    clean, whole = curve[0], curve[-1]
    return next(k for k, value in enumerate(curve) if clean - value >= fraction * (clean - whole) - 1e-9)


def role_with(points: list[tuple[int, float]]) -> SpreadRole:
    return SpreadRole("aggregate", "final", {1: points[-1][1] if points else 0.3}, 1, None, 8, sizes=points)


@pytest.mark.parametrize("width", [7, 128, 4096])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_bisection_finds_what_brute_force_finds(width, seed):
    """A monotone curve (the summed effects of heads of random sizes, most important first, as
    accuracy): the bisection's `heads_for(0.5)` is brute force's, exactly, in at most
    ``log2(width)`` grid points and ``log2`` of the bracket's width more; every other share lies
    within the doubling grid's bracket (at most twice brute force's count)."""
    generator = torch.Generator().manual_seed(seed)
    effects = torch.rand(width, generator=generator) ** 6  # a few large, many small
    effects = effects.sort(descending=True).values * 0.7 / effects.sum()
    curve = [1.0, *(1.0 - effects.cumsum(0)).tolist()]  # accuracy with the first k ablated, k = 0..width
    calls: list[int] = []

    def measure(k: int) -> float:
        calls.append(k)
        return curve[k]

    points = sizes.size_curve(measure, width, curve[0], curve[-1])
    role = role_with(points)
    assert [k for k, _ in points] == sorted({k for k, _ in points}) and points[0][0] == 0 and points[-1][0] == width
    assert all(value == curve[k] for k, value in points)
    assert role.heads_for(0.5) == brute_heads_for(curve, 0.5)
    assert len(calls) == len(set(calls)) <= math.ceil(math.log2(width)) * 2 <= sizes.MAX_EVALUATIONS
    for fraction in (0.1, 0.25, 0.9, 1.0):
        exact = brute_heads_for(curve, fraction)
        assert exact <= role.heads_for(fraction) <= max(1, 2 * exact), fraction


def test_the_bisection_stops_at_its_bound():
    """``max_evaluations`` bounds the points measured; the bracket is then the upper end measured."""
    curve = [1.0 - 0.5 * k / 4096 for k in range(4097)]
    calls: list[int] = []
    points = sizes.size_curve(lambda k: calls.append(k) or curve[k], 4096, 1.0, 0.5, max_evaluations=14)
    assert len(calls) == 14
    assert role_with(points).heads_for(0.5) >= brute_heads_for(curve, 0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_cover_bisection_from_a_curves_points_finds_what_brute_force_finds(seed):
    """`sizes.fewest_reaching` with ``known`` points (a size curve's, as the cover step passes
    them): the fewest ``k`` at or under the line is brute force's, no known point is measured
    again, and the bracket they give saves evaluations against starting from nothing."""
    generator = torch.Generator().manual_seed(seed)
    effects = torch.rand(300, generator=generator) ** 4
    effects = effects.sort(descending=True).values * 0.7 / effects.sum()
    curve = [1.0, *(1.0 - effects.cumsum(0)).tolist()]
    line = curve[-1] + 0.02
    exact = next(k for k, value in enumerate(curve) if value <= line)
    known = {k: curve[k] for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 300)}
    with_known: list[int] = []
    without: list[int] = []
    assert sizes.fewest_reaching(lambda k: with_known.append(k) or curve[k], 300, line, known) == exact
    assert sizes.fewest_reaching(lambda k: without.append(k) or curve[k], 300, line) == exact
    assert not set(with_known) & set(known) and len(with_known) < len(without)


def test_a_spread_group_left_to_the_size_curve_says_so():
    """A group whose needed heads were not searched because its role is sized says why, and
    keeps it through JSON (a searched group's dict is unchanged)."""
    from gna_interp.discovery.confirm import SIZED
    from gna_interp.discovery.group_testing import SpreadGroup

    heads = [gna.Head(0, h) for h in range(4)]
    group = SpreadGroup(heads, 0.3, (0.9, 0.95), skipped=SIZED)
    assert group.describe().endswith(f"; needs not searched ({SIZED})") and "redundant" not in group.describe()
    assert SpreadGroup.from_dict(group.to_dict()) == group
    assert "skipped" not in SpreadGroup(heads, 0.3, (0.9, 0.95)).to_dict()


def test_heads_for_on_a_hand_built_curve():
    """Effect = clean - accuracy; the whole layer's effect 0.8 (1.0 -> 0.2): half is 0.4, first
    reached at k = 4 (effect 0.5); the upper end of the bracket, never interpolated; a curve
    that rises again keeps its first k reaching the share."""
    role = role_with([(0, 1.0), (1, 0.9), (2, 0.8), (4, 0.5), (8, 0.7), (16, 0.2)])
    assert [role.heads_for(f) for f in (0.1, 0.125, 0.25, 0.5, 0.6, 0.8, 1.0)] == [1, 1, 2, 4, 4, 16, 16]
    assert role.width == 16
    assert role.describe_size(unit="channels").startswith("the Aggregate role needs 4 of 16 channels for half of the layer's effect")
    for bad in (0, -0.1, 1.5, "half", True):
        with pytest.raises(GnaValueError, match="heads_for: fraction="):
            role.heads_for(bad)  # type: ignore[arg-type]
    with pytest.raises(GnaValueError, match="no size curve"):
        role_with([]).heads_for(0.5)


def test_a_spread_role_with_its_size_round_trips_through_json():
    need = RoleNeed([gna.Head(1, 22)], 0.965, False, [(gna.Head(1, 22), 0.965)], "final")
    role = SpreadRole("aggregate", "final", {1: 0.29}, 1, need, 8, [], [(0, 1.0), (1, 0.965), (5, 0.605), (128, 0.29)], [22, 92, 16])
    circuit = GnaCircuit("toy", "mamba", "toy_mcq", 200, [], [], [], {"clean": 1.0, "chance": 0.25}, {})
    circuit.spread["aggregate"] = role
    circuit.cost = {
        "forwards": 381,
        "passes": 77.8,
        "n_prompts": 200,
        "n_layers": 2,
        "requests": 0,
        "seconds": 1.0,
        "size_curves": {"aggregate": {"evaluations": 8.0, "forwards": 36.0, "backwards": 4.0, "passes": 4.5}},
    }
    back = GnaCircuit.from_json(circuit.to_json())
    assert back.spread["aggregate"] == role and back.spread["aggregate"].heads_for(0.5) == 5
    data = circuit.to_dict()["spread"]["aggregate"]
    assert data["heads_for_half"] == 5 and data["size"].startswith("the Aggregate role needs 5 of 128 heads")
    assert back.cost == circuit.cost
    assert "size: the Aggregate role needs 5 of 128 channels for half" in circuit.summary()
    assert "(layer 1 ablated at the final position: 1.000 -> 0.290); cost 4.5 passes, 4 backward(s)" in circuit.summary()


@pytest.fixture(scope="module")
def mamba():
    if "mamba" not in gna.toy_names():
        pytest.skip("the Mamba-1 toy is not bundled")
    model, task = gna.load_toy("mamba"), gna.toy_task("mamba", 16, seed=4242)
    return model, task, task.encode(task.tokenizer_for(model.tokenizer))


def scan_with(model, verified: dict[gna.Head, float]) -> HeadScan:
    accuracy = torch.full((model.n_layers, model.n_heads), float("nan"))
    mask = torch.zeros(model.n_layers, model.n_heads, dtype=torch.bool)
    for head, value in verified.items():
        accuracy[head.layer, head.head], mask[head.layer, head.head] = value, True
    return HeadScan(accuracy, mask, [], {}, None)


def test_the_order_is_by_importance_not_by_index(mamba):
    """Heads costly alone come first (here L1H40 at 0.5 before L1H22 at 0.9, though 22 < 40,
    and L1H3, measured alone at no cost, is not among them); then every other head by the size
    of its zero-ablation attribution at the positions, against `gna.patching.ablation_attribution`
    (every position: its per-head sum), which is not index order."""
    model, task, encoded = mamba
    scan = scan_with(model, {gna.Head(1, 22): 0.9, gna.Head(1, 40): 0.5, gna.Head(1, 3): 0.995})
    every = torch.arange(encoded.batch.n_pos)
    order = sizes.importance_order(model, task, encoded, 1, every, scan, 1.0, 0.02)
    assert order[:2] == [40, 22] and sorted(order) == list(range(128))
    metric = gna.patching.candidate_logit_diff(encoded.candidate_ids, encoded.correct)
    result = gna.patching.ablation_attribution(model, task, metric, heads=[gna.Head(1, h) for h in range(128)])
    size = (result.scores[1] - result.baseline).abs()
    rest = order[2:]
    assert all(float(size[a]) >= float(size[b]) - 1e-4 for a, b in itertools.pairwise(rest))
    assert rest != sorted(rest)


def test_one_attribution_serves_both_entry_layers(mamba):
    """Within discovery's accuracy memo, the Gather layer's ordering (layer 0, on the
    segments) runs the attribution that the Aggregate layer's (layer 1, final position) then
    reads: no forward or backward of its own, and the same order as layer 1's run alone (no
    memo: its own attribution of layer 1's heads only); without a memo, each runs its own."""
    from gna_interp.discovery.entry import segment_positions
    from gna_interp.discovery.memo import accuracy_memo

    model, task, encoded = mamba
    scan = scan_with(model, {gna.Head(1, 22): 0.9})
    alone = sizes.importance_order(model, task, encoded, 1, encoded.final, scan, 1.0, 0.02)
    with accuracy_memo(model), gna.cost_meter(model) as first:
        gather = sizes.importance_order(model, task, encoded, 0, segment_positions(encoded), scan, 1.0, 0.02)
        with gna.cost_meter(model) as second:
            shared = sizes.importance_order(model, task, encoded, 1, encoded.final, scan, 1.0, 0.02)
    assert shared == alone and sorted(gather) == list(range(128))
    assert (second.forwards, second.backwards) == (0, 0) and first.backwards == 1  # 16 prompts: one chunk
    with gna.cost_meter(model) as apart:
        sizes.importance_order(model, task, encoded, 0, segment_positions(encoded), scan, 1.0, 0.02)
        sizes.importance_order(model, task, encoded, 1, encoded.final, scan, 1.0, 0.02)
    assert apart.backwards == 2


def test_an_ordering_started_at_an_earlier_layer_serves_that_layer_later(mamba):
    """The Aggregate layer's ordering first (layer 1), told that layer 0 may follow
    (``start=0``): its attribution starts there, and layer 0's ordering then reads it (no forward
    or backward of its own); both orders equal those each layer's own attribution gives (no memo)."""
    from gna_interp.discovery.entry import segment_positions
    from gna_interp.discovery.memo import accuracy_memo

    model, task, encoded = mamba
    scan = scan_with(model, {gna.Head(1, 22): 0.9})
    segments = segment_positions(encoded)
    final_alone = sizes.importance_order(model, task, encoded, 1, encoded.final, scan, 1.0, 0.02)
    gather_alone = sizes.importance_order(model, task, encoded, 0, segments, scan, 1.0, 0.02)
    with accuracy_memo(model), gna.cost_meter(model) as first:
        final = sizes.importance_order(model, task, encoded, 1, encoded.final, scan, 1.0, 0.02, start=0)
        with gna.cost_meter(model) as second:
            gather = sizes.importance_order(model, task, encoded, 0, segments, scan, 1.0, 0.02)
    assert final == final_alone and gather == gather_alone
    assert (second.forwards, second.backwards) == (0, 0) and first.backwards == 1  # 16 prompts: one chunk


def test_the_final_position_order_finds_the_heads_single_ablation_finds(mamba):
    """Brute force: every head of layer 1 ablated alone at the final position (the candidate logit
    difference's change); the ordering's top 10 (nothing verified) hold at least 7 of its top 10
    (8 measured on 64 prompts)."""
    model, task, encoded = mamba
    order = sizes.importance_order(model, task, encoded, 1, encoded.final, scan_with(model, {}), 1.0, 0.02)
    metric = gna.patching.candidate_logit_diff(encoded.candidate_ids, encoded.correct)
    base = float(metric(model.logits(task)).mean())
    true = [
        float(metric(model.logits(task, interventions=[gna.Ablate([gna.Head(1, h)], positions=encoded.final)])).mean()) - base
        for h in range(128)
    ]
    top = set(sorted(range(128), key=lambda h: true[h])[:10])
    assert len(top & set(order[:10])) >= 7, (sorted(top), order[:10])


# ----- the honest headline --------------------------------------------------------------------


def test_a_circuit_under_the_line_is_marked_partial_with_its_size():
    """The demo table leads with what each circuit carries: ``alone``, ``share`` (of the gap from
    every head ablated to clean), ``path`` (path patching's share of the gap), and the carries
    verdict (`scoring.carries.carries_from_curve`, tested against 80% of the gap on 200
    prompts): a circuit clearly under the line says partial with the spread role's size,
    within 120 columns; one clearly above it, whole."""
    from gna_interp.scoring.carries import CARRIES_SHARE
    from gna_interp.viz.summary import carries, summary_table

    assert CARRIES_SHARE == 0.8
    role = role_with([(0, 1.0), (1, 0.965), (5, 0.605), (128, 0.29)])

    def circuit(model, path, spread):
        return SimpleNamespace(
            model=model,
            mechanism="g&a",
            gather=[gna.Head(0, 70)],
            aggregate=[gna.Head(1, 22)],
            accuracy={"clean": 1.0, "-gather": 0.91, "-aggregate": 0.965, "-both": 0.73},
            path_patching={"fraction_of_effect": path},
            spread=spread,
            named=lambda heads: ", ".join(map(str, heads)),
        )

    def curve(alone):
        points = {"circuit_point": {"accuracy": alone}, "clean": {"accuracy": 1.0}, "ablated": {"accuracy": 0.275}}
        return SimpleNamespace(**points, n_prompts=200, recovered=lambda a: (a - 0.275) / (1.0 - 0.275))

    weak, strong = circuit("toy-mamba", 0.03, {"aggregate": role}), circuit("toy-llama", 0.93, {})
    assert carries(weak, curve(0.275)) == "partial: Aggregate spread, 5/128 for half"
    assert carries(strong, curve(0.99)) == "whole"
    assert carries(strong, curve(0.4)) == "partial"  # faithfulness alone under the line
    table = summary_table([strong, weak], {"toy-mamba": curve(0.275), "toy-llama": curve(0.99)})
    lines = table.splitlines()
    assert max(map(len, lines)) <= 120, table
    assert lines[0].split()[:6] == ["model", "alone", "share", "path", "carries", "mechanism"]
    assert lines[2].split()[:6] == ["toy-llama", "0.990", "99%", "0.93", "whole", "g&a"]
    assert lines[3].split()[:5] == ["toy-mamba", "0.275", "0%", "0.03", "partial:"]
    start = lines[0].index("carries")
    cell = " ".join(line[start : start + 12].strip() for line in lines[3:])  # the cell's words, wrapped
    assert "partial: Aggregate spread, 5/128 for half" in " ".join(cell.split()), table
