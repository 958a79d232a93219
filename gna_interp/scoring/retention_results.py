"""What `gna_interp.scoring.retention` returns: `RetrievalRanking` (every head's accuracy drop
on a retrieval probe) and `RetentionCurve` (accuracy with the top-n heads of a ranking kept,
against random sets of the same size)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.heads import Head
from ..patching.results import SweepResult

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class RetrievalRanking:
    """Every head's accuracy drop on a retrieval probe when ablated alone.

    Attributes:
        drop: ``[layer, head]`` float64, clean accuracy minus accuracy with that head
            ablated (NaN for heads not ranked: another kind, or a layer without them).
        accuracy: ``[layer, head]`` float64, probe accuracy with that head ablated.
        clean: probe accuracy with nothing ablated.
        order: the ranked heads, largest drop first (ties in ``model.heads`` order).
        kinds: per ranked head, ``"attention"`` or ``"ssm"``.
        how: ``"zero"`` (the paper's), ``"mean"`` or ``"resample"``.
        probe: the probe tasks' names; ``n_prompts`` their prompts in all.
        chance: mean over prompts of ``1 / candidates``.
        cost: `gna_interp.cost.Cost.to_dict` of the whole ranking (``passes`` included).
    """

    drop: Tensor
    accuracy: Tensor
    clean: float
    order: list[Head]
    kinds: dict[Head, str]
    how: str
    probe: list[str]
    n_prompts: int
    chance: float
    cost: dict[str, Any] = field(default_factory=dict)

    def top(self, k: int) -> list[Head]:
        """The ``k`` heads whose ablation costs the most."""
        return self.order[:k]

    def as_sweep(self) -> SweepResult:
        """The same numbers as an ablation sweep's `SweepResult`: ``scores`` the
        ``[layer, head]`` accuracy, ``baseline`` the clean accuracy."""
        meta = {"how": self.how, "n_prompts": self.n_prompts, "probe": list(self.probe)}
        return SweepResult(self.accuracy.float(), ("layer", "head"), self.clean, kind="ablation", meta=meta)

    def to_frame(self) -> pd.DataFrame:
        """One row per ranked head, best first: ``rank`` (1 = largest drop), ``head``,
        ``layer``, ``index``, ``kind``, ``accuracy``, ``drop``."""
        import pandas as pd

        return pd.DataFrame(
            {
                "rank": list(range(1, len(self.order) + 1)),
                "head": [str(h) for h in self.order],
                "layer": [h.layer for h in self.order],
                "index": [h.head for h in self.order],
                "kind": [self.kinds[h] for h in self.order],
                "accuracy": [float(self.accuracy[h.layer, h.head]) for h in self.order],
                "drop": [float(self.drop[h.layer, h.head]) for h in self.order],
            }
        )

    def __repr__(self) -> str:
        best = ", ".join(f"{h} {float(self.drop[h.layer, h.head]):+.3f}" for h in self.order[:3])
        return (
            f"RetrievalRanking({len(self.order)} heads, how={self.how!r}, clean {self.clean:.3f} on {self.n_prompts} prompts, "
            f"chance {self.chance:.3f}; largest drops: {best})"
        )


@dataclass
class RetentionCurve:
    """Accuracy with only the top-n heads of a ranking kept, against random sets.

    Attributes:
        sizes: ``[n_sizes]`` long, heads kept (ascending; 0 and every head of the kind included).
        accuracy: ``[n_sizes]`` float64, the ranking's top-n kept.
        random: ``[n_seeds, n_sizes]`` float64, the first n of each random order kept.
        order: the ranking's heads of ``kind``, best first.
        random_orders: one random order of the same heads per seed.
        seeds: the random orders' seeds.
        clean: accuracy with every head kept (nothing ablated); ``ablated``: with none kept.
        kind: the heads kept or ablated (``"attention"``, ``"ssm"`` or ``"all"``; heads
            of other kinds are never touched); ``how``: their ablation.
        chance: ``1 / candidates``; ``n_prompts``: prompts of the task.
        cost: `gna_interp.cost.Cost.to_dict` of the whole curve.
    """

    sizes: Tensor
    accuracy: Tensor
    random: Tensor
    order: list[Head]
    random_orders: list[list[Head]]
    seeds: list[int]
    clean: float
    ablated: float
    kind: str
    how: str
    chance: float
    n_prompts: int
    cost: dict[str, Any] = field(default_factory=dict)

    @property
    def n_heads(self) -> int:
        """Heads of ``kind`` (the size at which nothing is ablated)."""
        return len(self.order)

    @property
    def random_mean(self) -> Tensor:
        """``[n_sizes]`` mean over the random orders."""
        return self.random.mean(0)

    @property
    def random_std(self) -> Tensor:
        """``[n_sizes]`` sample standard deviation over the random orders (0 with one seed)."""
        return self.random.std(0, unbiased=True) if self.random.shape[0] > 1 else torch.zeros_like(self.random[0])

    def to_frame(self) -> pd.DataFrame:
        """One row per size: ``size``, ``fraction`` (of the kind's heads), ``accuracy``,
        ``of_clean``, ``random_mean``, ``random_std``, ``random_min``, ``random_max``,
        ``random_of_clean`` and ``added`` (the ranking's heads this point adds)."""
        import pandas as pd

        sizes = self.sizes.tolist()
        clean = self.clean if self.clean > 0 else math.nan
        added = [", ".join(str(h) for h in self.order[(sizes[i - 1] if i else 0) : n]) for i, n in enumerate(sizes)]
        return pd.DataFrame(
            {
                "size": sizes,
                "fraction": [n / self.n_heads for n in sizes],
                "accuracy": self.accuracy.tolist(),
                "of_clean": (self.accuracy / clean).tolist(),
                "random_mean": self.random_mean.tolist(),
                "random_std": self.random_std.tolist(),
                "random_min": self.random.min(0).values.tolist(),
                "random_max": self.random.max(0).values.tolist(),
                "random_of_clean": (self.random_mean / clean).tolist(),
                "added": added,
            }
        )

    def __repr__(self) -> str:
        return (
            f"RetentionCurve({len(self.sizes)} sizes of {self.n_heads} {self.kind} heads, how={self.how!r}, {len(self.seeds)} "
            f"random orders, clean {self.clean:.3f}, none kept {self.ablated:.3f})"
        )
