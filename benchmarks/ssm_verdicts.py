"""The verdict of each claim of benchmarks/ssm_claims.py, computed from its JSON as tests
with their intervals (`gna_interp.scoring.verdicts`, 90% two-sided: each claim a one-sided
test at 5%). ``examples/ssm_claims.ipynb`` and the script print them; nothing here runs a model.

- (a) smoother SSM Aggregate rows: the Mamba-2 toy's per-prompt entropy minus the
  Transformer's (their aggregate layer's heads weighted by single-head drops), over the
  same prompts, against `ENTROPY_MARGIN` (paired bootstrap); on the 4 labels or the whole row.
- (b) attention takes the Aggregate role: the attention heads' share of the summed
  single-head drops minus their share of the heads, against 0 (bootstrap over prompts).
- (c) the swapped Aggregate layer raises retrieval: swapped minus the student alone, on the
  same prompts, against `GAIN_MARGIN` (paired bootstrap); if not, layers 0 and 2 together.
- (d) the skill gap: compared only when a Transformer learnt the task (above chance +
  `CHANCE_MARGIN` at some trained pair count, Wilson): otherwise ``"not measured"``.

A JSON written before the per-prompt results were kept gives (a) and (b) as undetermined
(no interval) and (c) from counts (Newcombe's interval, unpaired: conservative).
"""

from __future__ import annotations

from typing import Any

import torch

# Private: gna_interp.scoring.verdicts's tests are not re-exported at the top level (its Verdict is read from a circuit).
from gna_interp.scoring.verdicts import Verdict, accuracy_verdict, bootstrap_verdict, count_difference_verdict, difference_verdict

ENTROPY_MARGIN = 0.05
"""(a): the SSM's rows are smoother when their entropy (nats) is above the Transformer's by this."""
GAIN_MARGIN = 0.05
"""(c): a swap raises retrieval when it adds this much accuracy."""
CHANCE_MARGIN = 0.10
"""(d): a model learnt KV retrieval when its accuracy is above chance + this at some trained pair count."""


def claim_verdicts(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per claim ``"(a)"``..``"(d)"``: ``{"word": ..., "text": ..., "tests": [Verdict, ...]}``."""
    parts = {"(a)": smoother, "(b)": attention_share, "(c)": swap, "(d)": skill_gap}
    key = {"(a)": "a", "(b)": "b", "(c)": "c", "(d)": "d"}
    return {claim: fn(figures[key[claim]]) for claim, fn in parts.items() if key[claim] in figures}


def _claim(word: str, tests: list[Verdict], text: str = "") -> dict[str, Any]:
    return {"word": word, "text": text or "; ".join(v.text for v in tests), "tests": tests}


def _weighted(model: dict[str, Any], key: str) -> torch.Tensor | None:
    """``[prompt]``: the heads' per-prompt ``key`` averaged with their positive single-head
    drops (`ssm_claims.weighted_per_prompt`); ``None`` in a JSON written before it was kept."""
    values = model.get("per_prompt", {}).get(key)
    return None if values is None else torch.tensor(values, dtype=torch.float64)


def _bits(value: str | list[int]) -> list[int]:
    """Per-prompt right (1) or wrong (0), from ``"0110..."`` (`ssm_claims.bits`) or a list."""
    return [int(c) for c in value] if isinstance(value, str) else list(value)


def smoother(a: dict[str, Any]) -> dict[str, Any]:
    t, m = a["models"]["transformer"], a["models"]["mamba2"]
    tests = []
    for key in ("entropy", "row_entropy"):
        mine, theirs = _weighted(m, key), _weighted(t, key)
        if mine is None or theirs is None:
            return _claim("undetermined", [], "no per-prompt rows in the JSON (written before they were kept): rerun part a")
        tests.append(difference_verdict(mine, theirs, ENTROPY_MARGIN, f"Mamba-2 - Transformer {key} (nats)", words=("smoother", "not")))
    words = {v.word for v in tests}
    word = "yes" if "smoother" in words else "no: about as sharp" if words == {"not"} else "undetermined"
    return _claim(word, tests)


def attention_share(b: dict[str, Any]) -> dict[str, Any]:
    layer = b["layers"]["1"]
    per_prompt = layer.get("per_prompt")
    if not per_prompt:
        return _claim("undetermined", [], "no per-prompt ablations in the JSON (written before they were kept): rerun part b")
    heads = list(layer["single_drops"])
    attention = torch.tensor([h in layer["attention_heads"] for h in heads])
    clean = torch.tensor(_bits(per_prompt["clean"]), dtype=torch.float64)
    ablated = torch.tensor([_bits(per_prompt[h]) for h in heads], dtype=torch.float64).T  # [prompt, head]

    def lead(clean: torch.Tensor, ablated: torch.Tensor) -> float:
        positive = (clean.mean() - ablated.mean(0)).clamp(min=0)
        total = float(positive.sum())
        return (float(positive[attention].sum()) / total if total else 0.0) - float(attention.double().mean())

    test = bootstrap_verdict(lead, [clean, ablated], 0.0, "attention's share of the drops - its share of the heads")
    word = {"above": "partly: attention over its share", "below": "no"}.get(test.word, test.word)
    return _claim(word, [test])


def swap(c: dict[str, Any]) -> dict[str, Any]:
    swaps, n = c["swaps"], c["prompts"]

    def gain(key: str) -> Verdict:
        kind = f"layers {key} swapped in - student alone"
        if "correct" in swaps[key] and "student" in swaps:
            right, alone = _bits(swaps[key]["correct"]), _bits(swaps["student"]["correct"])
            return difference_verdict(right, alone, GAIN_MARGIN, kind, words=("yes", "no"))
        k1, k2 = round(swaps[key]["accuracy"] * n), round(c["student_accuracy"] * n)
        return count_difference_verdict(k1, n, k2, n, GAIN_MARGIN, kind, words=("yes", "no"))

    alone = gain("2")
    if alone.word != "no":
        return _claim(alone.word, [alone])
    both = gain("0+2")
    word = {"yes": "not alone; with the Gather layer too, yes", "no": "no"}.get(
        both.word, "not alone; with the Gather layer too, undetermined"
    )
    return _claim(word, [alone, both])


def skill_gap(d: dict[str, Any]) -> dict[str, Any]:
    n, trained, models = d["held_out"], [str(p) for p in d["pairs_trained"]], d["models"]

    def learnt(name: str) -> list[Verdict]:
        row = models[name]
        return [
            accuracy_verdict(torch.arange(n) < round(row["accuracy"][p] * n), row["chance"][p] + CHANCE_MARGIN, f"{name} at {p} pairs")
            for p in trained
        ]

    transformers = [name for name, row in models.items() if row["family"] == "llama"]
    shown = {name: learnt(name) for name in transformers}
    learners = [name for name, tests in shown.items() if any(v.word == "above" for v in tests)]
    if not learners:
        best = [max(tests, key=lambda v: v.interval[0] - v.line) for tests in shown.values()]
        text = "no Transformer learnt the task (none above chance + 0.1 at any trained pair count); closest: " + "; ".join(
            v.text for v in best
        )
        return _claim("not measured", best, text)
    top, steps = trained[-1], models["mamba2"].get("steps", d["steps"])
    equal = [name for name in learners if models[name].get("steps", d["steps"]) == steps] or learners
    name = max(equal, key=lambda m: models[m]["accuracy"][top])
    k1, k2 = round(models[name]["accuracy"][top] * n), round(models["mamba2"]["accuracy"][top] * n)
    test = count_difference_verdict(k1, n, k2, n, 0.0, f"{name} - mamba2 at {top} pairs", words=("yes", "no: reversed"))
    return _claim(test.word, [test])
