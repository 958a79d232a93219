"""`scoring.verdicts`: each interval against scipy (Wilson, the exact bootstrap distribution),
prompts to settle against the verdict measured on that many prompts, and the label check's
verdict against `evaluate` run independently on the clean and shuffled prompts."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
import torch

import gna_interp as gna
from gna_interp.discovery import GnaCircuit
from gna_interp.scoring.verdicts import (
    MECHANISMS,
    Verdict,
    accuracy_verdict,
    bootstrap_verdict,
    carries_verdict,
    collapse_verdict,
    count_difference_verdict,
    difference_verdict,
    label_verdict,
    newcombe_interval,
    paired_bootstrap,
    paired_prompts,
    wilson_interval,
    wilson_prompts,
)
from gna_interp.tasks.toy import toy_mcq

OPPOSITE = {"by label", "partly by label", "by place"}


def bools(k: int, n: int) -> torch.Tensor:
    return torch.arange(n) < k


CASES = [(0, 10, 0.9), (3, 10, 0.9), (58, 200, 0.9), (30, 128, 0.95), (128, 128, 0.9), (1, 1, 0.99)]


def score_test_inversion(k: int, n: int, level: float) -> tuple[float, float]:
    """Wilson's interval by its definition: the ``p`` whose score test ``|k/n - p| <= z sqrt(p (1 - p) / n)``
    accepts, found by bisection on each side of ``k/n`` (no closed form)."""
    z = NormalDist().inv_cdf((1 + level) / 2)
    phat = k / n

    def accepts(p: float) -> bool:
        return abs(phat - p) <= z * math.sqrt(p * (1 - p) / n)

    ends = []
    for outside in (0.0, 1.0):
        inside, out = phat, outside
        if accepts(out):
            ends.append(out)
            continue
        for _ in range(200):
            mid = (inside + out) / 2
            inside, out = (mid, out) if accepts(mid) else (inside, mid)
        ends.append(inside)
    return ends[0], ends[1]


@pytest.mark.parametrize(("k", "n", "level"), CASES)
def test_wilson_interval_is_the_score_test_inversion(k, n, level):
    assert wilson_interval(k, n, level) == pytest.approx(score_test_inversion(k, n, level), abs=1e-9)


@pytest.mark.parametrize(("k", "n", "level"), CASES)
def test_wilson_interval_matches_scipy(k, n, level):
    stats = pytest.importorskip("scipy.stats")
    expected = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    assert wilson_interval(k, n, level) == pytest.approx((expected.low, expected.high), abs=1e-12)


def test_accuracy_verdict_sides_and_words():
    below = accuracy_verdict(bools(58, 200), 0.35)  # the Mamba-2 counting toy's label check: 0.290 of 200
    assert below.word == "below" and below.interval[1] < 0.35 and below.prompts_to_settle is None
    undetermined = accuracy_verdict(bools(60, 200), 0.35)  # 0.300: its 90% interval reaches 0.356
    assert undetermined.word == "undetermined" and undetermined.interval[0] < 0.35 < undetermined.interval[1]
    assert "prompts would settle it" in undetermined.text
    above = accuracy_verdict(bools(114, 200), 0.35, words=("stays", "falls"))
    assert above.word == "stays" and above.estimate == 0.57


@pytest.mark.parametrize(("p", "line"), [(0.30, 0.35), (0.305, 0.267), (0.9, 0.85), (0.0, 0.05)])
def test_wilson_prompts_is_where_the_verdict_settles(p, line):
    """The count it gives settles the verdict, one fewer does not (Wilson at the same accuracy)."""
    n = wilson_prompts(p, line)
    assert n is not None and n >= 1
    assert accuracy_verdict_at(p, n, line) != "undetermined"
    assert n == 1 or accuracy_verdict_at(p, n - 1, line) == "undetermined"
    assert wilson_prompts(line, line) is None


def accuracy_verdict_at(p: float, n: int, line: float) -> str:
    lo, hi = wilson_interval(p * n, n)
    return "above" if lo > line else "below" if hi < line else "undetermined"


def test_paired_bootstrap_is_the_exact_resampling_distribution():
    """Differences ``[1, 1, 0, 0, 0, 0]``: a resample's mean is Binomial(6, 1/3) / 6, whose 5% and
    95% quantiles (0 and 4/6) sit far from the CDF's steps: the percentile interval is exact."""
    a = torch.tensor([1, 1, 0, 0, 1, 0], dtype=torch.bool)
    b = torch.tensor([0, 0, 0, 0, 1, 0], dtype=torch.bool)  # paired: prompt 4 right in both
    estimate, (lo, hi), sd = paired_bootstrap(a, b, level=0.90, resamples=20_000, seed=3)
    cdf = [sum(math.comb(6, j) * (1 / 3) ** j * (2 / 3) ** (6 - j) for j in range(i + 1)) for i in range(7)]
    ppf = [next(i for i in range(7) if cdf[i] >= q) for q in (0.05, 0.95)]  # 0 (cdf 0.088) and 4 (cdf 0.9 -> 0.98)
    assert estimate == pytest.approx(2 / 6)
    assert (lo, hi) == pytest.approx((ppf[0] / 6, ppf[1] / 6))
    assert sd == pytest.approx(torch.tensor([1.0, 1, 0, 0, 0, 0]).std().item())
    same = paired_bootstrap(a, a)
    assert same[0] == 0 and same[1] == (0.0, 0.0)
    with pytest.raises(ValueError, match="the same prompts"):
        paired_bootstrap(a, b[:5])


def test_paired_prompts_settles_the_bootstrap_verdict():
    """The formula's count: the paired verdict on the same prompts repeated to about that many
    settles; repeated to half of it, it does not."""
    clean = torch.tensor([1, 1, 1, 0, 1, 0, 1, 1, 0, 1] * 4, dtype=torch.bool)  # 0.7
    shuffled = torch.tensor([1, 0, 1, 0, 0, 0, 1, 0, 0, 1] * 4, dtype=torch.bool)  # 0.4, drop 0.3
    verdict = difference_verdict(clean, shuffled, 0.2)
    assert verdict.word == "undetermined" and verdict.estimate == pytest.approx(0.3)
    d = (clean.double() - shuffled.double()).std().item()
    n = verdict.prompts_to_settle
    assert n == paired_prompts(0.3, d, 0.2) == math.ceil((1.6448536269514722 * d / 0.1) ** 2)
    times = math.ceil(1.15 * n / 40)
    assert difference_verdict(clean.repeat(times), shuffled.repeat(times), 0.2).word == "above"
    half = max(1, n // 80)
    assert difference_verdict(clean.repeat(half), shuffled.repeat(half), 0.2).word == "undetermined"


@pytest.mark.parametrize(
    ("shuffled", "word", "mechanism"),
    [(50, "by place", "counting"), (195, "by label", "g&a"), (114, "partly by label", "partly"), (64, "undetermined", "undetermined")],
)
def test_label_verdict_words(shuffled, word, mechanism):
    """200 prompts, 4 options, clean right on every prompt; shuffled right on the first
    ``shuffled``: 0.25 falls to chance, 0.975 keeps it, 0.57 is between, 0.32 straddles 0.35."""
    clean = torch.ones(200, dtype=torch.bool)
    verdict, floor, drop = label_verdict(clean, bools(shuffled, 200), 0.25, 0.10)
    assert verdict.word == word and MECHANISMS[word] == mechanism
    assert floor.interval == pytest.approx(wilson_interval(shuffled, 200)) and floor.line == pytest.approx(0.35)
    assert drop.estimate == pytest.approx(1 - shuffled / 200) and drop.line == 0.10
    if word == "undetermined":
        n = verdict.prompts_to_settle
        assert n == wilson_prompts(shuffled / 200, 0.35)
        times = math.ceil(n / 200)
        settled = label_verdict(clean.repeat(times), bools(shuffled, 200).repeat(times), 0.25, 0.10)[0]
        assert settled.word == "by place"  # 0.32 is below 0.35: more prompts settle it there
    else:
        assert verdict.prompts_to_settle is None
    assert Verdict.from_dict(verdict.to_dict()) == verdict


def test_collapse_and_carries_verdicts():
    collapsed = collapse_verdict(bools(52, 200), 0.25, 0.10, "-gather")
    assert collapsed.word == "collapses" and collapsed.interval == pytest.approx(wilson_interval(52, 200))
    assert collapse_verdict(bools(120, 200), 0.25, 0.10).word == "does not collapse"
    clean = torch.ones(200, dtype=torch.bool)
    alone = bools(190, 200)
    carried = carries_verdict(alone, clean, 0.25, 0.5)  # line: 0.25 + 0.5 * 0.75 = 0.625
    assert carried.word == "carries" and carried.estimate == pytest.approx(0.95 - 0.625)
    assert carries_verdict(bools(80, 200), clean, 0.25, 0.5).word == "partial"


@pytest.fixture(scope="module", params=["llama_4x8", "llama_4heads"])
def near_line(request):
    """Near-line tasks: a 4-option Llama toy (4 layers x 8 heads; 2 layers x 4 heads) on 6
    options, labels in a random order in every prompt; the first n prompts of one 512-prompt
    sample. On the second, the cut-off (shuffled against chance + 0.1) said "counting" at 64
    prompts and "G&A" from 128 on."""
    model = gna.load_toy(request.param)
    task = toy_mcq(512, seed=0, **{**gna.toy_card(request.param)["task"], "n_options": 6, "shuffle_labels": True})
    clean = gna.evaluate(model, task, progress=False)
    shuffled = gna.evaluate(model, gna.tasks.shuffle_labels(task), progress=False)
    return request.param, clean, shuffled


@pytest.mark.slow
def test_the_near_line_task_never_gives_opposite_verdicts(near_line):
    """n = 64, 128, 256, 512: undetermined, or one word, never two opposite ones; each
    undetermined verdict names more prompts than it had."""
    name, clean, shuffled = near_line
    words, cut_off = [], set()
    for n in (64, 128, 256, 512):
        verdict = label_verdict(clean.is_correct[:n], shuffled.is_correct[:n], clean.chance, 0.10)[0]
        accuracy = float(shuffled.is_correct[:n].double().mean())
        assert verdict.estimate == pytest.approx(accuracy)
        words.append(verdict.word)
        cut_off.add("counting" if accuracy < clean.chance + 0.10 else "g&a")
        if verdict.word == "undetermined":
            assert verdict.prompts_to_settle is not None and verdict.prompts_to_settle > n
    assert len({w for w in words if w in OPPOSITE}) <= 1, words
    assert name != "llama_4heads" or cut_off == {"counting", "g&a"}  # where the cut-off flipped


def test_the_mamba_toy_reads_labels_in_part():
    """The Mamba-1 toy: its label check's verdict (in `discover`'s baseline) is "partly by
    label", from `evaluate` on the clean and shuffled prompts measured here; the circuit keeps it
    through JSON."""
    model, task = gna.load_toy("mamba"), gna.toy_task("mamba", 200, seed=4242)
    clean = gna.evaluate(model, task, progress=False)
    shuffled = gna.evaluate(model, gna.tasks.shuffle_labels(task), progress=False)
    circuit = gna.discover(model, task, stages=[], progress=False)
    expected = label_verdict(clean.is_correct, shuffled.is_correct, clean.chance, circuit.settings["chance_margin"])
    assert circuit.verdicts["labels"] == expected[0] and circuit.verdicts["labels_vs_clean"] == expected[2]
    assert expected[0].word == "partly by label" and circuit.mechanism == "partly"
    assert circuit.headline().startswith("G&A, partly by label:") and f"(shuffled {shuffled.accuracy:.3f})" in circuit.headline()
    assert GnaCircuit.from_json(circuit.to_json()) == circuit


def test_bootstrap_verdict_of_a_mean_difference_is_the_paired_bootstrap():
    """The generic bootstrap, given the difference of means, draws the same resamples as the
    paired one (same seed): the same interval, estimate and word."""
    rng = torch.Generator().manual_seed(1)
    a, b = torch.rand(150, generator=rng) < 0.7, torch.rand(150, generator=rng) < 0.5
    generic = bootstrap_verdict(lambda x, y: float(x.double().mean() - y.double().mean()), [a, b], 0.1, resamples=2000, seed=7)
    paired = difference_verdict(a, b, 0.1, resamples=2000, seed=7)
    assert generic.interval == pytest.approx(paired.interval) and generic.estimate == pytest.approx(paired.estimate)
    assert generic.word == paired.word


def test_count_difference_verdict_settles_where_it_says():
    """Newcombe from counts: undetermined at 40 of 100 against 30 of 100 (line 0); the same
    shares on the prompts it names settle it."""
    verdict = count_difference_verdict(40, 100, 30, 100, 0.0)
    assert verdict.word == "undetermined" and verdict.interval == newcombe_interval(40, 100, 30, 100)
    n = verdict.prompts_to_settle
    assert n is not None and n > 100
    assert (
        count_difference_verdict(4 * math.ceil(n / 10), 10 * math.ceil(n / 10), 3 * math.ceil(n / 10), 10 * math.ceil(n / 10), 0.0).word
        == "above"
    )


@pytest.mark.slow  # a whole discovery: about 5 s
def test_the_confirmation_tests_each_collapse():
    """After the confirmation, each role's set and each ablation of the table has its collapse
    verdict: Wilson's interval (by its definition, `score_test_inversion`) of the accuracy
    `evaluate` gives with those heads ablated, against chance + chance_margin."""
    model, task = gna.load_toy("llama"), gna.toy_task("llama", 64, seed=11)
    circuit = gna.discover(model, task, progress=False)
    line = circuit.accuracy["chance"] + circuit.settings["chance_margin"]
    sets = {role: need.heads for role, need in circuit.needs.items()}
    sets |= {"-gather": circuit.gather, "-aggregate": circuit.aggregate, "-both": [*circuit.gather, *circuit.aggregate]}
    assert circuit.needs and all(f"collapses:{key}" in circuit.verdicts for key in sets)
    for key, heads in sets.items():
        ablated = gna.evaluate(model, task, [gna.Ablate(heads)], progress=False) if heads else gna.evaluate(model, task, progress=False)
        verdict = circuit.verdicts[f"collapses:{key}"]
        right = int(ablated.is_correct.sum())
        assert verdict.estimate == pytest.approx(ablated.accuracy) and verdict.line == pytest.approx(line)
        assert verdict.interval == pytest.approx(score_test_inversion(right, len(task), verdict.level), abs=1e-9)
        lo, hi = verdict.interval
        assert verdict.word == ("collapses" if hi < line else "does not collapse" if lo > line else "undetermined"), verdict.text
    assert GnaCircuit.from_json(circuit.to_json()) == circuit
    assert f"tested: {circuit.verdicts['collapses:aggregate'].text}" in circuit.summary()
    # each head of a set ablated alone: clean - ablated against min_effect, Newcombe's interval
    # built here from the Wilson ends by definition, of the counts `evaluate` gives
    clean = gna.evaluate(model, task, progress=False)
    for head in [*circuit.gather, *circuit.aggregate]:
        if not circuit.evidence(head).verified:
            continue
        ablated = gna.evaluate(model, task, [gna.Ablate([head])], progress=False)
        k1, k2, n = int(clean.is_correct.sum()), int(ablated.is_correct.sum()), len(task)
        verdict = circuit.verdicts[f"alone:{head}"]
        (l1, u1), (l2, u2) = score_test_inversion(k1, n, verdict.level), score_test_inversion(k2, n, verdict.level)
        d = (k1 - k2) / n
        lo, hi = d - math.hypot(k1 / n - l1, u2 - k2 / n), d + math.hypot(u1 - k1 / n, k2 / n - l2)
        assert verdict.estimate == pytest.approx(d) and verdict.interval == pytest.approx((lo, hi), abs=1e-9)
        assert verdict.line == circuit.thresholds.min_effect
        assert verdict.word == ("effect" if lo > verdict.line else "no effect" if hi < verdict.line else "undetermined")
