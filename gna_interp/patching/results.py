"""Sweep results: a tensor of scores with named axes, and a DataFrame view."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ..core.heads import Head


@dataclass
class SweepResult:
    """Scores of a sweep.

    Attributes:
        scores: metric per variant; axes named by ``dims`` (``("layer", "head")``,
            ``("layer", "head", "pos")``, ``("layer", "pos")`` or ``("layer",)``).
            NaN where a variant was not run.
        dims: names of the axes of ``scores``.
        baseline: the metric of the run without any variant (ablation: the clean
            run; patching: the run the patches are made into).
        reference: patching only: the metric on the inputs the values come from.
        kind: ``"ablation"`` or ``"patching"``.
    """

    scores: Tensor
    dims: tuple[str, ...]
    baseline: float
    reference: float | None = None
    kind: str = "ablation"
    meta: dict[str, Any] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """Long format: one row per variant, a column per axis, plus ``score`` (and
        ``effect``, the score minus the baseline)."""
        rows = []
        for index in itertools.product(*(range(n) for n in self.scores.shape)):
            value = float(self.scores[index])
            if value != value:  # NaN: not run
                continue
            rows.append({**dict(zip(self.dims, index, strict=True)), "score": value, "effect": value - self.baseline})
        return pd.DataFrame(rows, columns=[*self.dims, "score", "effect"])

    def normalized(self) -> Tensor:
        """Patching: ``(score - baseline) / (reference - baseline)``: 0 = no effect,
        1 = the full difference recovered."""
        if self.reference is None:
            raise ValueError("normalized() needs a reference metric (patching sweeps have one)")
        return (self.scores - self.baseline) / (self.reference - self.baseline)

    def top(self, k: int = 5, largest_effect: bool = True) -> list[tuple[Head, float]]:
        """The ``k`` heads whose score moved furthest from the baseline."""
        if self.dims[:2] != ("layer", "head"):
            raise ValueError(f"top() needs head scores, this result has axes {self.dims}")
        effect = (self.scores - self.baseline).abs()
        if effect.dim() > 2:
            effect = effect.nan_to_num(0).amax(dim=tuple(range(2, effect.dim())))
        flat = effect.nan_to_num(-1.0).flatten()
        order = torch.argsort(flat, descending=largest_effect)[:k]
        n_heads = self.scores.shape[1]
        return [
            (Head(int(i) // n_heads, int(i) % n_heads), float(self.scores.flatten()[i]) if self.scores.dim() == 2 else float(flat[i]))
            for i in order
        ]
