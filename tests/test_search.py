"""The joint search, written once (`gna_interp.core.search`): checked against what an additive
oracle makes exact, against an exhaustive step-by-step twin, and shipped to a process where
gna_interp cannot be imported (as on an NDIF server)."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import textwrap

import pytest

from gna_interp.core import search


def additive(weights: dict[int, float], start: float = 1.0):
    """Accuracy ``start - sum of the ablated heads' weights``, and the calls made."""
    calls: list[list[int]] = []

    def oracle(heads: list[int]) -> float:
        calls.append(list(heads))
        return start - sum(weights[h] for h in heads)

    return oracle, calls


def test_greedy_on_an_additive_oracle_takes_the_heaviest_heads_first():
    weights = {0: 0.05, 1: 0.30, 2: 0.01, 3: 0.20, 4: 0.0}
    oracle, calls = additive(weights)
    chosen, curve, value = search.greedy_set(list(weights), oracle, 1.0, 0.5, 8)
    assert chosen == [1, 3]  # 1.0 - 0.30 - 0.20 = 0.5 reaches the threshold
    assert curve == pytest.approx([0.70, 0.50]) and value == pytest.approx(0.5)
    assert len(calls) == 5 + 4  # every remaining head at each step


def test_greedy_stops_where_no_head_lowers_accuracy():
    oracle, _ = additive({0: 0.1, 1: 0.0, 2: -0.05})
    chosen, curve, value = search.greedy_set([0, 1, 2], oracle, 1.0, 0.0, 8)
    assert chosen == [0] and curve == pytest.approx([0.9]) and value == pytest.approx(0.9)


def brute_greedy(pool, oracle, start, threshold, max_heads):
    """The greedy rule by enumeration: at each step every set of (chosen + one head) is
    measured and the lowest kept, ties by the smallest head."""
    chosen, current = [], start
    while len(chosen) < min(max_heads, len(pool)):
        options = sorted((oracle([*chosen, h]), h) for h in pool if h not in chosen)
        if not options or options[0][0] >= current:
            break
        current = options[0][0]
        chosen.append(options[0][1])
        if current <= threshold:
            break
    return chosen, current


@pytest.mark.parametrize("seed", range(6))
def test_greedy_equals_its_brute_force_twin_on_interacting_heads(seed):
    rng = random.Random(seed)
    heads = list(range(6))
    pair = {frozenset(p): rng.uniform(-0.1, 0.2) for p in itertools.combinations(heads, 2)}
    single = {h: rng.uniform(0.0, 0.2) for h in heads}

    def oracle(chosen: list[int]) -> float:  # backups: pairs matter beyond their parts
        return 1.0 - sum(single[h] for h in chosen) - sum(pair[frozenset(p)] for p in itertools.combinations(chosen, 2))

    got = search.greedy_set(heads, oracle, 1.0, 0.25, 4)
    want = brute_greedy(heads, oracle, 1.0, 0.25, 4)
    assert (got[0], got[2]) == (want[0], pytest.approx(want[1]))


@pytest.mark.parametrize("seed", range(6))
def test_greedy_with_quiet_heads_equals_its_brute_force_twin_with_fewer_calls(seed):
    """Quiet heads (each costing less than ``min_drop`` alone) are not measured at the first
    step where another head costs ``min_drop``: the same set and curve as the exhaustive twin
    (interacting heads: a quiet pair may matter together, found at the second step), fewer
    oracle calls; where no other head costs, they are measured as before."""
    rng = random.Random(seed)
    heads = list(range(7))
    single = {h: rng.uniform(0.05, 0.3) if h < 3 else rng.uniform(0.0, 0.019) for h in heads}
    pair = {frozenset(p): rng.uniform(0.0, 0.15) for p in itertools.combinations(heads, 2)}

    def oracle(chosen: list[int]) -> float:
        calls.append(list(chosen))
        return 1.0 - sum(single[h] for h in chosen) - sum(pair[frozenset(p)] for p in itertools.combinations(chosen, 2))

    calls: list[list[int]] = []
    want = brute_greedy(heads, oracle, 1.0, 0.2, 4)
    full = len(calls)
    calls.clear()
    got = search.greedy_set(heads, oracle, 1.0, 0.2, 4, quiet={3, 4, 5, 6}, min_drop=0.02)
    assert (got[0], got[2]) == (want[0], pytest.approx(want[1]))
    assert [c for c in calls if len(c) == 1] == [[0], [1], [2]] and len(calls) == full - 4
    calls.clear()
    alone = search.greedy_set([3, 4, 5], oracle, 1.0, 0.2, 4, quiet={3, 4, 5}, min_drop=0.02)  # none costs: all measured
    assert [c for c in calls if len(c) == 1] == [[3], [4], [5]]
    assert alone[0] == brute_greedy([3, 4, 5], oracle, 1.0, 0.2, 4)[0]


def test_ordered_keeps_heads_that_lower_accuracy_by_min_drop():
    oracle, calls = additive({0: 0.3, 1: 0.01, 2: 0.2, 3: 0.3})
    chosen, curve, value = search.ordered_set([0, 1, 2, 3], oracle, 1.0, 0.45, 8, min_drop=0.02)
    assert chosen == [0, 2, 3] and curve == pytest.approx([0.7, 0.5, 0.2]) and value == pytest.approx(0.2)
    assert calls == [[0], [0, 1], [0, 2], [0, 2, 3]]  # one call per head tried: 1 drops 0.01 < min_drop


def test_ordered_stops_at_the_threshold_and_at_max_heads():
    oracle, calls = additive({0: 0.3, 1: 0.3, 2: 0.3})
    assert search.ordered_set([0, 1, 2], oracle, 1.0, 0.45, 8, min_drop=0.02)[0] == [0, 1]  # 0.4 <= 0.45: 2 not tried
    assert search.ordered_set([0, 1, 2], oracle, 1.0, 0.0, 1, min_drop=0.02)[0] == [0]
    assert calls == [[0], [0, 1], [0]]


def test_role_set_continues_greedily_from_the_ordered_set_short_of_the_threshold():
    oracle, calls = additive({0: 0.1, 1: 0.05, 2: 0.4, 3: 0.01})
    ranked = [0]  # only head 0 costs alone in this ranking: the ordered search ends at 0.9
    chosen, curve, value = search.role_set([0, 1, 2, 3], ranked, oracle, 1.0, 0.5, 8, method="ordered", min_drop=0.02)
    assert chosen == [0, 2] and curve == pytest.approx([0.9, 0.5]) and value == pytest.approx(0.5)
    assert calls == [[0], [0, 1], [0, 2], [0, 3]]  # the ordered try, then greedy from {0} (no memo here)
    with pytest.raises(ValueError, match="method='best'"):
        search.role_set([0], [0], oracle, 1.0, 0.5, 8, method="best", min_drop=0.02)


def test_role_set_keeps_what_the_ordered_search_kept_where_a_restart_would_drop_it():
    """Heads that interact: 0 alone 0.8, 0 and 1 0.7 (kept), but 0 and 2 reach 0.3 only
    without 1 (1 cancels 2). Continuing from {0, 1} ends at 0.6, short of 0.35, where a
    restart would find {0, 2}: the search continues, as documented, and measures no more."""
    values = {frozenset([0]): 0.8, frozenset([0, 1]): 0.7, frozenset([0, 2]): 0.3, frozenset([0, 1, 2]): 0.6, frozenset([0, 1, 3]): 0.75}
    calls: list[list[int]] = []

    def oracle(heads: list[int]) -> float:
        calls.append(list(heads))
        return values.get(frozenset(heads), 0.9)

    chosen, curve, value = search.role_set([0, 1, 2, 3], [0, 1], oracle, 1.0, 0.35, 8, method="ordered", min_drop=0.02)
    assert chosen == [0, 1, 2] and curve == pytest.approx([0.8, 0.7, 0.6]) and value == pytest.approx(0.6)
    assert calls == [[0], [0, 1], [0, 1, 2], [0, 1, 3], [0, 1, 2, 3]]


def test_role_set_from_nothing_kept_is_the_greedy_search():
    oracle, _ = additive({0: 0.01, 1: 0.3, 2: 0.4})
    got = search.role_set([0, 1, 2], [0], oracle, 1.0, 0.35, 8, method="ordered", min_drop=0.02)  # 0 drops 0.01: kept nothing
    assert got == search.greedy_set([0, 1, 2], additive({0: 0.01, 1: 0.3, 2: 0.4})[0], 1.0, 0.35, 8)


@pytest.mark.parametrize("seed", range(6))
def test_role_set_equals_its_brute_force_twin_on_interacting_heads(seed):
    """Ranked by the two costliest heads alone, the ordered search ends short of 0.2 (two heads
    cannot take accuracy down 0.8 here), so the greedy rule continues from what it kept: the same
    set, curve and value as the rules enumerated by hand. Ranked by a head that costs nothing
    alone, it keeps nothing, and the greedy search runs from scratch (`brute_greedy`)."""
    rng = random.Random(seed)
    heads = list(range(8))
    pair = {frozenset(p): rng.uniform(-0.05, 0.1) for p in itertools.combinations(heads, 2)}
    single = {h: rng.uniform(0.03, 0.2) for h in heads}
    single[7] = 0.0  # costs nothing alone (its pairs may)

    def oracle(chosen: list[int]) -> float:
        return 1.0 - sum(single[h] for h in chosen) - sum(pair[frozenset(p)] for p in itertools.combinations(chosen, 2))

    ranked = sorted(heads, key=lambda h: -single[h])[:2]
    chosen, curve, value = search.role_set(heads, ranked, oracle, 1.0, 0.2, 5, method="ordered", min_drop=0.02)
    kept, values = [], [1.0]
    for h in ranked:  # the ordered rule
        if values[-1] - oracle([*kept, h]) >= 0.02:
            kept, values = [*kept, h], [*values, oracle([*kept, h])]
    assert kept and values[-1] > 0.2, "the case needs an ordered search that keeps a head and ends short"
    while len(kept) < 5 and values[-1] > 0.2:  # the greedy rule, from what was kept
        best_value, best = min((oracle([*kept, h]), h) for h in heads if h not in kept)
        if best_value >= values[-1]:
            break
        kept, values = [*kept, best], [*values, best_value]
    assert len(kept) > len([h for h in ranked if h in kept]), "the case needs a greedy step"
    assert chosen == kept and curve == pytest.approx(values[1:]) and value == pytest.approx(values[-1])
    nothing = search.role_set(heads, [7], oracle, 1.0, 0.2, 5, method="ordered", min_drop=0.02)
    twin = brute_greedy(heads, oracle, 1.0, 0.2, 5)
    assert nothing[0] == twin[0] and nothing[2] == pytest.approx(twin[1])


def test_greedy_set_from_given_heads_measures_every_head_with_them():
    """With heads ``given``, the quiet heads are measured with them at the first step (beside
    other heads a quiet head may cost), and ``max_heads`` counts the given heads."""
    oracle, calls = additive({0: 0.3, 1: 0.2, 2: 0.01, 3: 0.005})
    chosen, curve, value = search.greedy_set([0, 1, 2, 3], oracle, 0.7, 0.0, 3, quiet={2, 3}, min_drop=0.02, given=[0])
    assert chosen == [0, 1, 2] and curve == pytest.approx([0.5, 0.49]) and value == pytest.approx(0.49)
    # the first step measures the quiet heads 2 and 3 with 0 (not alone), the second stops at max_heads 3 (0 counts)
    assert calls == [[0, 1], [0, 2], [0, 3], [0, 1, 2], [0, 1, 3]]


def test_the_server_program_runs_the_same_search_without_gna_interp(tmp_path):
    """`greedy_joint` is pickled as nnsight ships it (cloudpickle, its modules registered by
    value) and loaded where importing gna_interp raises: the search it calls is there."""
    import cloudpickle

    from gna_interp.backends import nnsight as _backend  # noqa: F401  (registers the modules by value)
    from gna_interp.backends import nnsight_program

    payload = tmp_path / "program.pkl"
    payload.write_bytes(cloudpickle.dumps(nnsight_program.greedy_joint))
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys, cloudpickle
        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "gna_interp":
                    raise ImportError("gna_interp is not installed here")
        sys.meta_path.insert(0, Refuse())
        program = cloudpickle.loads(open({str(payload)!r}, "rb").read())
        role_set = program.__globals__["role_set"]
        weights = {{0: 0.1, 1: 0.05, 2: 0.4}}
        print(role_set([0, 1, 2], [0], lambda h: 1.0 - sum(weights[i] for i in h), 1.0, 0.5, 8, method="ordered", min_drop=0.02))
        print(sorted(m for m in sys.modules if m.startswith("gna_interp")))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    weights = {0: 0.1, 1: 0.05, 2: 0.4}
    assert lines[0] == str(
        search.role_set([0, 1, 2], [0], lambda h: 1.0 - sum(weights[i] for i in h), 1.0, 0.5, 8, method="ordered", min_drop=0.02)
    )
    assert lines[1] == "[]"
