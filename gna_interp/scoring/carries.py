"""Whether a circuit kept alone carries the task (`carries_from_curve`): a tested verdict on its
share of the gap from every head ablated ("none") to clean, from a faithfulness curve's counts.

The line: the circuit kept alone at ``none + share * (clean - none)`` (`CARRIES_SHARE` of the
gap). A faithfulness curve keeps accuracies, not per-prompt results, so the interval of
``alone - (share * clean + (1 - share) * none)`` combines the three accuracies' Wilson
intervals (Zou and Donner's MOVER, the three-term form of Newcombe's hybrid score interval;
`scoring.verdicts.newcombe_interval` is its two-term case). It treats the three as
independent; measured on the same prompts they are positively correlated, so the interval is
wider than a paired one: conservative. With per-prompt results, `verdicts.carries_verdict`
(paired bootstrap) is the sharper test.

Words: ``"whole"`` (the interval above the line), ``"partial"`` (below) or ``"undetermined"``
with the prompts that would settle it (each count scaled by one factor until the interval
clears the line, as `verdicts.count_difference_verdict`)."""

from __future__ import annotations

import math
from typing import Any

from .verdicts import LEVEL, MAX_PROMPTS, Verdict, settle_words, side, wilson_interval

CARRIES_SHARE = 0.8
"""The line of `carries_from_curve`: the circuit kept alone recovers this share of the gap from every head ablated to clean."""


def percent(value: float | None) -> str:
    """A share as the texts print it (``"73%"``; ``"-"`` for none or NaN): one formatter for the table and the verdict."""
    return "-" if value is None or value != value else f"{float(value):.0%}"


def mover_interval(counts: list[tuple[float, float, float]], level: float = LEVEL) -> tuple[float, float]:
    """The interval of ``sum(c * k / n)`` over ``counts`` of ``(c, k, n)`` (independent proportions,
    each with its Wilson interval at ``level``): MOVER's recovered variance estimates."""
    estimate = sum(c * k / n for c, k, n in counts)
    below = above = 0.0
    for c, k, n in counts:
        p = k / n
        lo, hi = wilson_interval(k, n, level)  # type: ignore[arg-type]  # scaled counts are not integers
        low_end, high_end = (c * lo, c * hi) if c >= 0 else (c * hi, c * lo)
        below += (c * p - low_end) ** 2
        above += (high_end - c * p) ** 2
    return estimate - math.sqrt(below), estimate + math.sqrt(above)


def carries_from_curve(curve: Any, share: float = CARRIES_SHARE, level: float = LEVEL) -> Verdict | None:
    """Whether ``curve``'s circuit kept alone (`FaithfulnessCurve.circuit_point`) recovers at
    least ``share`` of the gap from every head ablated (``curve.ablated``) to clean
    (``curve.clean``): ``alone - (share * clean + (1 - share) * none)`` against 0 (module docs).
    ``None``: no curve, or no circuit point."""
    if curve is None or curve.circuit_point is None:
        return None
    n = int(curve.n_prompts)
    alone, clean, none = (round(float(point["accuracy"]) * n) for point in (curve.circuit_point, curve.clean, curve.ablated))
    terms = [(1.0, alone, n), (-share, clean, n), (share - 1.0, none, n)]

    def scaled(factor: float) -> tuple[float, float]:
        return mover_interval([(c, k * factor, m * factor) for c, k, m in terms], level)

    interval = scaled(1.0)
    estimate = sum(c * k / m for c, k, m in terms)
    where = side(interval, 0.0)
    word = {"above": "whole", "below": "partial"}.get(where, where)
    settle = None
    if where == "undetermined" and estimate != 0:
        factor = 1.0
        while factor * n < MAX_PROMPTS and settle is None:
            factor *= 1.25
            settle = round(n * factor) if side(scaled(factor), 0.0) != "undetermined" else None
    kind = f"alone - ({share:g} clean + {1 - share:g} none)"
    verdict = Verdict(word, estimate, interval, 0.0, level, n, "mover (counts)", kind, settle)
    return Verdict(**{**verdict.__dict__, "text": carries_text(verdict, curve, share)})


def carries_text(v: Verdict, curve: Any, share: float) -> str:
    """The verdict in words with its numbers: ``"partial: alone 0.770 recovers 73% of the gap from
    none 0.230 to clean 0.970, against 80% (alone - (0.8 clean + 0.2 none) -0.039 [-0.121,
    0.043], 90% interval, mover (counts), 100 prompts); about 640 prompts would settle it"``."""
    alone, clean, none = (float(p["accuracy"]) for p in (curve.circuit_point, curve.clean, curve.ablated))
    of_gap = percent(curve.recovered(alone))
    text = (
        f"{v.word}: alone {alone:.3f} recovers {of_gap} of the gap from none {none:.3f} to clean {clean:.3f}, against {share:.0%} "
        f"({v.kind} {v.estimate:.3f} [{v.interval[0]:.3f}, {v.interval[1]:.3f}], {v.level:.0%} interval, {v.method}, {v.n} prompts)"
    )
    return text + settle_words(v)
