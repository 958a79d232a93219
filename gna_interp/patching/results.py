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
        if abs(self.reference - self.baseline) < 1e-12:
            raise ValueError(f"normalized() is undefined: reference and baseline are equal ({self.baseline})")
        return (self.scores - self.baseline) / (self.reference - self.baseline)

    def effects(self) -> Tensor:
        """``scores - baseline``, same axes as ``scores``."""
        return self.scores - self.baseline

    def top(self, k: int = 5) -> list[tuple[Head, float]]:
        """The ``k`` heads whose variant moved the metric furthest from the baseline,
        with that signed effect (for per-position results, the position of largest
        magnitude). Heads not swept are left out."""
        if self.dims[:2] != ("layer", "head"):
            raise ValueError(f"top() needs head scores, this result has axes {self.dims}")
        effects = self.effects()
        if effects.dim() > 2:
            flat_pos = effects.nan_to_num(0.0).flatten(2)
            pick = flat_pos.abs().argmax(-1, keepdim=True)
            swept = ~self.scores.isnan().flatten(2).all(-1)
            effects = torch.where(swept, flat_pos.gather(-1, pick).squeeze(-1), float("nan"))
        magnitude = effects.abs().nan_to_num(-1.0).flatten()
        order = torch.argsort(magnitude, descending=True)[: min(k, int((magnitude >= 0).sum()))]
        n_heads = self.scores.shape[1]
        return [(Head(int(i) // n_heads, int(i) % n_heads), float(effects.flatten()[i])) for i in order]
