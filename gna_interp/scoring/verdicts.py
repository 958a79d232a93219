"""Verdicts as tests: an accuracy (or a difference of two accuracies on the same prompts)
against a line, with its interval over the prompts.

A verdict is one of two one-sided claims, "above the line" or "below the line", each made
only when the interval's end on the other side clears the line; otherwise it is
``"undetermined"`` and says how many prompts would settle it. The interval is two-sided
at ``level`` (default `LEVEL`, 0.90): each of its ends is a one-sided 95% bound, so each
claim is a one-sided test at the 5% level (as in two one-sided tests of equivalence).

- one accuracy (``k`` of ``n`` prompts right): Wilson's score interval (`wilson_interval`);
- a difference of two accuracies measured on the same prompts (clean and shuffled labels,
  clean and ablated): a paired bootstrap over the prompts (`paired_bootstrap`: the prompts
  resampled with replacement, the same resample for both), from each measured set's
  per-prompt results (`Evaluation.is_correct`): no forward of its own.

Prompts to settle an undetermined verdict, assuming the observed value stays:

- Wilson (`wilson_prompts`): the smallest ``n`` whose Wilson interval at the observed
  accuracy ``p`` excludes the line (found by bisection; it exists whenever ``p`` is not on it);
- paired (`paired_prompts`): ``ceil((z * sd / |d - line|) ** 2)``, with ``d`` the observed
  difference, ``sd`` the per-prompt standard deviation of the differences and ``z`` the
  normal quantile of ``(1 + level) / 2``: the ``n`` at which the normal half-width
  ``z * sd / sqrt(n)`` equals the distance to the line.

The mechanism verdict (`label_verdict`) and the circuit's other verdicts build on these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import torch
from torch import Tensor

from ..core.errors import GnaValueError

LEVEL = 0.90
"""Two-sided level of every interval: its ends are one-sided 95% bounds (module docs)."""
RESAMPLES = 10_000
"""Bootstrap resamples of a paired verdict."""
MAX_PROMPTS = 10**8
"""`wilson_prompts` searches up to this many prompts."""


@dataclass(frozen=True)
class Verdict:
    """A claim about a measured value against a line, with its interval.

    Attributes:
        word: ``"above"``, ``"below"`` or ``"undetermined"`` (or a word of the caller's,
            e.g. `label_verdict`'s ``"partly by label"``).
        estimate: the measured value (an accuracy, or a difference of two).
        interval: ``(lo, hi)``, two-sided at ``level``.
        line: what the value is compared with.
        level: the interval's two-sided level.
        n: prompts measured.
        method: ``"wilson"`` or ``"paired bootstrap (R resamples, seed S)"``.
        kind: what was measured (``"shuffled labels"``, ``"-gather (mean)"``), or ``None``.
        prompts_to_settle: prompts that would settle an undetermined verdict (``None``:
            settled, or the estimate is on the line and no number settles it).
        text: the verdict in plain words, with its numbers.
    """

    word: str
    estimate: float
    interval: tuple[float, float]
    line: float
    level: float
    n: int
    method: str
    kind: str | None = None
    prompts_to_settle: int | None = None
    text: str = ""

    @property
    def settled(self) -> bool:
        return self.word != "undetermined"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["interval"] = list(self.interval)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        return cls(**{**data, "interval": tuple(data["interval"])})


def z_value(level: float = LEVEL) -> float:
    """The standard normal quantile of ``(1 + level) / 2`` (1.645 at 0.90)."""
    if not 0.0 < level < 1.0:
        raise GnaValueError(f"level={level!r}: expected a number in (0, 1)")
    return NormalDist().inv_cdf((1.0 + level) / 2.0)


def wilson_interval(successes: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval of a binomial proportion ``successes / n`` (two-sided at ``level``)."""
    if n < 1 or not 0 <= successes <= n:
        raise GnaValueError(f"wilson_interval({successes!r}, {n!r}): expected 0 <= successes <= n and n >= 1")
    z = z_value(level)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def side(interval: tuple[float, float], line: float) -> str:
    """``"above"`` (the interval's lower end above ``line``), ``"below"`` or ``"undetermined"``."""
    lo, hi = interval
    return "above" if lo > line else "below" if hi < line else "undetermined"


def wilson_prompts(p: float, line: float, level: float = LEVEL) -> int | None:
    """The fewest prompts whose Wilson interval at accuracy ``p`` excludes ``line`` (``None``
    when ``p == line``: none does)."""
    if p == line:
        return None

    def settles(n: int) -> bool:
        return side(wilson_interval(p * n, n, level), line) != "undetermined"

    hi = 1
    while not settles(hi):
        if hi >= MAX_PROMPTS:
            return None
        hi *= 2
    lo = hi // 2  # settles(lo) is False (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if settles(mid) else (mid, hi)
    return hi


def paired_prompts(difference: float, sd: float, line: float, level: float = LEVEL) -> int | None:
    """``ceil((z * sd / |difference - line|) ** 2)`` (module docs); ``None`` on the line."""
    gap = abs(difference - line)
    if gap == 0:
        return None
    return max(1, math.ceil((z_value(level) * sd / gap) ** 2))


def _as_correct(values: Tensor | Sequence[bool] | Sequence[float], name: str) -> Tensor:
    """``[prompt]`` float64 0/1 (or any per-prompt score) from a bool or number vector."""
    tensor = torch.as_tensor(values).detach().to(torch.float64).flatten().cpu()
    if tensor.numel() == 0:
        raise GnaValueError(f"{name}: expected one value per prompt, got none")
    return tensor


def paired_bootstrap(
    a: Tensor | Sequence[bool], b: Tensor | Sequence[bool], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, tuple[float, float], float]:
    """``mean(a) - mean(b)`` over the same prompts, its percentile interval over
    ``resamples`` resamples of the prompts (each resample taken for both), and the
    per-prompt standard deviation of ``a - b``. ``a``, ``b``: ``[prompt]`` (bool: right or wrong)."""
    x, y = _as_correct(a, "a"), _as_correct(b, "b")
    if x.shape != y.shape:
        raise GnaValueError(f"paired_bootstrap: a has {x.numel()} prompts and b {y.numel()}: expected the same prompts in both")
    d = x - y
    n = d.numel()
    generator = torch.Generator().manual_seed(seed)
    means = torch.empty(resamples, dtype=torch.float64)
    chunk = max(1, 2_000_000 // n)
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        means[start : start + size] = d[torch.randint(n, (size, n), generator=generator)].mean(1)
    tail = (1.0 - level) / 2.0
    lo, hi = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    sd = float(d.std(unbiased=True)) if n > 1 else 0.0
    return float(d.mean()), (lo, hi), sd


def accuracy_verdict(
    correct: Tensor | Sequence[bool],
    line: float,
    kind: str | None = None,
    level: float = LEVEL,
    words: tuple[str, str] = ("above", "below"),
) -> Verdict:
    """An accuracy (``correct``: ``[prompt]`` bool) against ``line``: Wilson's interval;
    ``words`` name the two sides (above, below)."""
    x = _as_correct(correct, "correct")
    n, k = x.numel(), float(x.sum())
    interval = wilson_interval(k, n, level)
    where = side(interval, line)
    word = {"above": words[0], "below": words[1]}.get(where, where)
    settle = None if where != "undetermined" else wilson_prompts(k / n, line, level)
    verdict = Verdict(word, k / n, interval, line, level, n, "wilson", kind, settle)
    return _with_text(verdict)


def difference_verdict(
    a: Tensor | Sequence[bool],
    b: Tensor | Sequence[bool],
    line: float,
    kind: str | None = None,
    level: float = LEVEL,
    words: tuple[str, str] = ("above", "below"),
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Verdict:
    """``accuracy(a) - accuracy(b)`` on the same prompts against ``line``: the paired bootstrap."""
    estimate, interval, sd = paired_bootstrap(a, b, level, resamples, seed)
    where = side(interval, line)
    word = {"above": words[0], "below": words[1]}.get(where, where)
    settle = None if where != "undetermined" else paired_prompts(estimate, sd, line, level)
    method = f"paired bootstrap ({resamples} resamples, seed {seed})"
    return _with_text(Verdict(word, estimate, interval, line, level, len(_as_correct(a, "a")), method, kind, settle))


def _with_text(v: Verdict) -> Verdict:
    """``v`` with its plain words: ``"0.234 [0.17, 0.31] (90%, wilson, 128 prompts) against
    0.267: undetermined; about 412 prompts would settle it"``."""
    what = f"{v.kind} " if v.kind else ""
    text = (
        f"{what}{v.estimate:.3f} [{v.interval[0]:.3f}, {v.interval[1]:.3f}] ({v.level:.0%} interval, {v.method}, {v.n} prompts) "
        f"against {v.line:.3f}: {v.word}"
    )
    return Verdict(**{**v.__dict__, "text": text + settle_words(v)})


def settle_words(v: Verdict) -> str:
    """What would settle an undetermined verdict, in words (empty for a settled one)."""
    if v.settled:
        return ""
    if v.prompts_to_settle is None:
        return "; on the line: no number of prompts settles it"
    return f"; about {v.prompts_to_settle} prompts would settle it"


MECHANISMS = {"by label": "g&a", "partly by label": "partly", "by place": "counting", "undetermined": "undetermined"}
"""`label_verdict`'s words and the circuit ``mechanism`` each gives."""


def label_verdict(
    clean: Tensor | Sequence[bool], shuffled: Tensor | Sequence[bool], chance: float, margin: float, level: float = LEVEL, seed: int = 0
) -> tuple[Verdict, Verdict, Verdict]:
    """What the answers rest on, from the label check: ``clean`` and ``shuffled`` (``[prompt]``
    bool, the same prompts with each prompt's labels permuted, `tasks.shuffle_labels`).

    A model that reads the labels keeps its accuracy with them shuffled; one that answers
    by the option's place falls to chance. Two tests: the shuffled accuracy against ``chance
    + margin`` (Wilson: below it, the model answers ``"by place"``), and the drop ``clean -
    shuffled`` against ``margin`` (paired bootstrap: below it, it keeps its accuracy). Above
    the line and keeping it: ``"by label"``; above the line but dropping more than ``margin``:
    ``"partly by label"``; any test that decides the word undetermined: ``"undetermined"``,
    with the larger of those tests' prompts to settle.

    Returns ``(verdict, shuffled against chance + margin, drop against margin)``; the first's
    interval and line are the shuffled accuracy's.
    """
    floor = accuracy_verdict(shuffled, chance + margin, "shuffled labels", level, ("above chance", "at chance"))
    drop = difference_verdict(clean, shuffled, margin, "clean - shuffled", level, ("drops", "keeps"), seed=seed)
    if floor.word == "at chance":
        word, deciding = "by place", []
    elif floor.word == "above chance":
        word, deciding = {"keeps": "by label", "drops": "partly by label"}.get(drop.word, "undetermined"), [drop]
    else:
        word, deciding = "undetermined", [floor] if drop.word == "keeps" else [floor, drop]
    open_tests = [v for v in deciding if not v.settled]
    settle = max((v.prompts_to_settle or 0 for v in open_tests), default=0) or None
    text = _label_text(word, floor, drop, chance, margin, settle)
    verdict = Verdict(word, floor.estimate, floor.interval, floor.line, level, floor.n, "wilson + paired bootstrap", "labels", settle, text)
    return verdict, floor, drop


def _label_text(word: str, floor: Verdict, drop: Verdict, chance: float, margin: float, settle: int | None) -> str:
    """`label_verdict`'s words with its numbers."""
    s, (lo, hi) = floor.estimate, floor.interval
    d, (dlo, dhi) = drop.estimate, drop.interval
    shuffled = f"shuffled {s:.3f} [{lo:.3f}, {hi:.3f}] against chance {chance:.3f} + {margin:g}"
    dropped = f"clean - shuffled {d:.3f} [{dlo:.3f}, {dhi:.3f}] against {margin:g}"
    if word == "by place":
        return f"by place: with the labels shuffled accuracy falls to chance ({shuffled})"
    if word == "by label":
        return f"by label: with the labels shuffled accuracy stays ({shuffled}; {dropped})"
    if word == "partly by label":
        return f"partly by label (shuffled {s:.3f}): above chance, below clean ({shuffled}; {dropped})"
    settles = f"; about {settle} prompts would settle it" if settle else ""
    return f"undetermined ({shuffled}: {floor.word}; {dropped}: {drop.word}){settles}"


def collapse_verdict(
    ablated: Tensor | Sequence[bool], chance: float, margin: float, kind: str | None = None, level: float = LEVEL
) -> Verdict:
    """Whether an ablation "collapses to chance": its accuracy (``ablated``: ``[prompt]`` bool)
    against ``chance + margin`` (Wilson): ``"collapses"`` below, ``"does not collapse"`` above."""
    return accuracy_verdict(ablated, chance + margin, kind, level, ("does not collapse", "collapses"))


def carries_verdict(
    alone: Tensor | Sequence[bool],
    clean: Tensor | Sequence[bool],
    empty: Tensor | Sequence[bool] | float,
    share: float,
    level: float = LEVEL,
    seed: int = 0,
) -> Verdict:
    """Whether a circuit kept alone carries the task: ``alone`` (``[prompt]`` bool: every
    other head ablated) against the line ``empty + share * (clean - empty)``, with ``clean``
    and ``empty`` (every head ablated; a number such as chance, or ``[prompt]`` bool) on the
    same prompts. Paired bootstrap of ``alone - (share * clean + (1 - share) * empty)``
    against 0: ``"carries"`` above, ``"partial"`` below; the estimate is that difference."""
    a = _as_correct(alone, "alone")
    base = torch.full_like(a, float(empty)) if isinstance(empty, (int, float)) else _as_correct(empty, "empty")
    line = share * _as_correct(clean, "clean") + (1.0 - share) * base
    kind = f"alone - ({share:g} clean + {1 - share:g} empty)"
    return difference_verdict(a, line, 0.0, kind, level, ("carries", "partial"), seed=seed)


def newcombe_interval(k1: int, n1: int, k2: int, n2: int, level: float = LEVEL) -> tuple[float, float]:
    """Newcombe's hybrid score interval of ``k1 / n1 - k2 / n2`` (two independent proportions,
    each with its Wilson interval): for two accuracies recorded as counts only. On the same
    prompts (positively correlated) it is wider than the paired bootstrap: conservative."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, level)
    l2, u2 = wilson_interval(k2, n2, level)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def count_difference_verdict(
    k1: int,
    n1: int,
    k2: int,
    n2: int,
    line: float,
    kind: str | None = None,
    level: float = LEVEL,
    words: tuple[str, str] = ("above", "below"),
) -> Verdict:
    """``k1 / n1 - k2 / n2`` against ``line`` from counts alone (`newcombe_interval`); prompts
    to settle: each sample scaled by the same factor until the interval clears the line."""
    interval = newcombe_interval(k1, n1, k2, n2, level)
    where = side(interval, line)
    word = {"above": words[0], "below": words[1]}.get(where, where)
    settle = None
    if where == "undetermined" and k1 / n1 - k2 / n2 != line:
        factor = 1.0
        while factor < MAX_PROMPTS / max(n1, n2):
            factor *= 1.25
            if side(newcombe_interval(k1 * factor, n1 * factor, k2 * factor, n2 * factor, level), line) != "undetermined":  # type: ignore[arg-type]
                settle = round(max(n1, n2) * factor)
                break
    verdict = Verdict(word, k1 / n1 - k2 / n2, interval, line, level, max(n1, n2), "newcombe (counts)", kind, settle)
    return _with_text(verdict)


def bootstrap_verdict(
    statistic: Callable[..., float],
    columns: Sequence[Tensor],
    line: float,
    kind: str | None = None,
    level: float = LEVEL,
    words: tuple[str, str] = ("above", "below"),
    resamples: int = 2_000,
    seed: int = 0,
) -> Verdict:
    """Any ``statistic(*columns)`` of per-prompt values (each column ``[prompt, ...]``, the
    same prompts) against ``line``: its percentile interval over resamples of the prompts
    (the same resample for every column). Prompts to settle: ``ceil(n * (z * se / gap) ** 2)``
    with ``se`` the bootstrap standard deviation (the normal rule of `paired_prompts`)."""
    n = int(columns[0].shape[0])
    if any(int(c.shape[0]) != n for c in columns):
        raise GnaValueError(
            f"bootstrap_verdict: columns of {[int(c.shape[0]) for c in columns]} prompts: expected the same prompts in each"
        )
    generator = torch.Generator().manual_seed(seed)
    values = torch.tensor([statistic(*(c[idx] for c in columns)) for idx in torch.randint(n, (resamples, n), generator=generator)])
    tail = (1.0 - level) / 2.0
    lo, hi = torch.quantile(values.double(), torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    estimate = float(statistic(*columns))
    where = side((lo, hi), line)
    word = {"above": words[0], "below": words[1]}.get(where, where)
    se, gap = float(values.double().std()), abs(estimate - line)
    settle = None if where != "undetermined" or gap == 0 else max(n + 1, math.ceil(n * (z_value(level) * se / gap) ** 2))
    method = f"bootstrap over prompts ({resamples} resamples, seed {seed})"
    return _with_text(Verdict(word, estimate, (lo, hi), line, level, n, method, kind, settle))
