"""Sweep and edge results: a tensor of scores with named axes, and a DataFrame view."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ..core.errors import GnaValueError
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
            raise GnaValueError("normalized() needs a reference metric (patching sweeps have one)")
        if abs(self.reference - self.baseline) < 1e-12:
            raise GnaValueError(f"normalized() is undefined: reference and baseline are equal ({self.baseline})")
        return (self.scores - self.baseline) / (self.reference - self.baseline)

    def effects(self) -> Tensor:
        """``scores - baseline``, same axes as ``scores``."""
        return self.scores - self.baseline

    def top(self, k: int = 5) -> list[tuple[Head, float]]:
        """The ``k`` heads whose variant moved the metric furthest from the baseline,
        with that signed effect (for per-position results, the position of largest
        magnitude). Heads not swept are left out."""
        if self.dims[:2] != ("layer", "head"):
            raise GnaValueError(f"top() needs head scores, this result has axes {self.dims}")
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


@dataclass
class EdgeResult:
    """Edge scores: sender head -> receiver head (input stream).

    Attributes:
        scores: estimated effects on the metric (score minus the clean metric; how:
            ``meta["method"]``),
            ``[sender, receiver]``, or ``[sender, receiver, stream]`` when several streams
            were chosen. NaN where the edge does not exist (the sender does not precede
            the receiver, or the receiver's mixer has no such stream).
        senders: the heads of the ``sender`` axis (with ``path="direct"`` also ``"embed"``
            and MLPs, ``"L0MLP"``: `gna_interp.patching.direct`).
        receivers: the heads of the ``receiver`` axis (with ``path="direct"`` also MLPs
            and ``"logits"``).
        streams: the names of the ``stream`` axis (one name, or ``("any",)``, when there is
            no stream axis).
        baseline: the clean metric.
        reference: the corrupt metric.
        meta: how it was computed (``method``, ``steps``, ``n_prompts``).
    """

    scores: Tensor
    senders: list[Head | str]
    receivers: list[Head | str]
    streams: tuple[str, ...]
    baseline: float
    reference: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def dims(self) -> tuple[str, ...]:
        return ("sender", "receiver", "stream") if self.scores.dim() == 3 else ("sender", "receiver")

    def to_frame(self) -> pd.DataFrame:
        """Long format: one row per edge, columns ``sender``, ``receiver`` (``"L0H1"``),
        ``stream``, ``score`` (clean metric + effect) and ``effect``; edges that do not
        exist are left out."""
        table = self.scores if self.scores.dim() == 3 else self.scores[..., None]
        rows = []
        for i, sender in enumerate(self.senders):
            for j, receiver in enumerate(self.receivers):
                for k, stream in enumerate(self.streams):
                    value = float(table[i, j, k])
                    if value == value:  # NaN: no such edge
                        names = {"sender": str(sender), "receiver": str(receiver), "stream": stream}
                        rows.append({**names, "score": self.baseline + value, "effect": value})
        return pd.DataFrame(rows, columns=["sender", "receiver", "stream", "score", "effect"])

    def top(self, k: int = 10) -> list[tuple[Head | str, Head | str, str, float]]:
        """The ``k`` edges of largest magnitude: ``(sender, receiver, stream, effect)``."""
        frame = self.to_frame()
        frame = frame.reindex(frame["effect"].abs().sort_values(ascending=False).index)[:k]
        by_name = {str(h): h for h in [*self.senders, *self.receivers]}
        return [(by_name[r.sender], by_name[r.receiver], r.stream, float(r.effect)) for r in frame.itertuples()]


def _table(
    flat: Tensor,
    copies: Sequence[tuple[Head | str, str]],
    receivers: Sequence[Head | str],
    streams: Sequence[str],
    whole: bool,
    n_senders: int,
) -> Tensor:
    """``[sender, copy]`` -> ``[sender, receiver]`` (``"any"``: summed over streams; one
    stream) or ``[sender, receiver, stream]``."""
    table = torch.full((n_senders, len(receivers), len(streams)), float("nan"))
    for c, (receiver, name) in enumerate(copies):
        table[:, receivers.index(receiver), streams.index(name)] = flat[:, c]
    if whole:
        summed = table.nan_to_num(0.0).sum(-1)
        return torch.where(table.isnan().all(-1), float("nan"), summed)
    return table[..., 0] if len(streams) == 1 else table
