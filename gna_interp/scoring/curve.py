"""The result of a faithfulness curve (`FaithfulnessCurve`) and what head and edge curves
share: the default sizes and one point's summary (`gna_interp.scoring.faithfulness` defines the
quantities)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from .evaluation import Evaluation

if TYPE_CHECKING:
    import pandas as pd

DENSE_UP_TO = 32
"""Default ``sizes``: every n when the model has at most this many heads, else `SPARSE_POINTS`."""
SPARSE_POINTS = 24


@dataclass
class FaithfulnessCurve:
    """Accuracy and metrics of a task with only the top-n heads of a ranking kept.

    Attributes:
        sizes: ``[n_sizes]`` long, heads kept at each point (ascending).
        accuracy, margin, logprob: ``[n_sizes]`` float64 (see the module docs).
        order: the ranking, best first: the first ``sizes[i]`` heads are kept at point ``i``.
        clean: accuracy / margin / logprob with nothing ablated.
        ablated: the same with every head of the model ablated (n = 0).
        how: ``"mean"``, ``"resample"`` or ``"zero"``.
        chance: ``1 / candidates``.
        circuit: the heads of ``circuit=`` (empty when not given) and ``circuit_point``
            their accuracy / margin / logprob kept alone.
        n_prompts: prompts of the task.
    """

    sizes: Tensor
    accuracy: Tensor
    margin: Tensor
    logprob: Tensor
    order: list[Head]
    clean: dict[str, float]
    ablated: dict[str, float]
    how: str
    chance: float
    n_prompts: int
    circuit: list[Head] = field(default_factory=list)
    circuit_point: dict[str, float] | None = None
    unit: ClassVar[str] = "head"
    """What ``sizes`` counts (``"edge"`` in `EdgeFaithfulnessCurve`)."""

    @property
    def n_heads(self) -> int:
        """Heads of the model (the size at which nothing is ablated)."""
        return len(self.order)

    def of_clean(self, accuracy: float | Tensor | None = None) -> Any:
        """``accuracy / clean accuracy`` (default: of every point, ``[n_sizes]``)."""
        value = self.accuracy if accuracy is None else accuracy
        return value / self.clean["accuracy"] if self.clean["accuracy"] > 0 else value * math.nan

    def recovered(self, accuracy: float | Tensor | None = None) -> Any:
        """``(accuracy - ablated) / (clean - ablated)`` (default: of every point, ``[n_sizes]``)."""
        value = self.accuracy if accuracy is None else accuracy
        span = self.clean["accuracy"] - self.ablated["accuracy"]
        return (value - self.ablated["accuracy"]) / span if span != 0 else value * math.nan

    def to_frame(self) -> pd.DataFrame:
        """One row per size: ``size``, ``accuracy``, ``margin``, ``logprob``, ``of_clean``,
        ``recovered``, and ``added``, the head that point adds to the previous one's set
        (several names when a step adds several)."""
        import pandas as pd

        sizes = self.sizes.tolist()
        added = [", ".join(str(h) for h in self.order[(sizes[i - 1] if i else 0) : n]) for i, n in enumerate(sizes)]
        return pd.DataFrame(
            {
                "size": sizes,
                "accuracy": self.accuracy.tolist(),
                "margin": self.margin.tolist(),
                "logprob": self.logprob.tolist(),
                "of_clean": self.of_clean().tolist(),
                "recovered": self.recovered().tolist(),
                "added": added,
            }
        )

    def __repr__(self) -> str:
        text = (
            f"FaithfulnessCurve({len(self.sizes)} sizes of {self.n_heads} heads, how={self.how!r}, "
            f"clean {self.clean['accuracy']:.3f}, all ablated {self.ablated['accuracy']:.3f}"
        )
        if self.circuit_point is not None:
            text += f", circuit of {len(self.circuit)} heads {self.circuit_point['accuracy']:.3f}"
        return text + ")"


def summary(evaluation: Evaluation) -> dict[str, float]:
    rows = torch.arange(evaluation.scores.shape[0])
    return {
        "accuracy": evaluation.accuracy,
        "margin": float(evaluation.margins.double().mean()),
        "logprob": float(evaluation.scores[rows, evaluation.correct].double().mean()),
    }


def check_sizes(sizes: Sequence[int] | None, n_heads: int, what: str = "heads") -> list[int]:
    """Sorted distinct sizes, with 0 and ``n_heads`` added (the two ends of the curve)."""
    if sizes is None:
        if n_heads <= DENSE_UP_TO:
            return list(range(n_heads + 1))
        return sorted({round(i * n_heads / SPARSE_POINTS) for i in range(SPARSE_POINTS + 1)})
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence | range | Tensor):
        raise GnaTypeError(f"sizes={sizes!r}: expected a list of ints, {what} kept, each in 0..{n_heads}")
    values = sizes.tolist() if isinstance(sizes, Tensor) else list(sizes)
    for index, n in enumerate(values):
        if isinstance(n, bool) or not isinstance(n, int):
            raise GnaTypeError(f"sizes[{index}]={n!r}: expected an int, {what} kept, in 0..{n_heads}")
        if not 0 <= n <= n_heads:
            whose = "the model's heads" if what == "heads" else f"the {what} ranked"
            raise GnaValueError(f"sizes[{index}]={n}: expected {what} kept in 0..{n_heads} ({whose})")
    return sorted({0, n_heads, *values})
