"""The one protocol every backend implements: run a forward with a `Plan` applied and
return the logits plus the activations captured at the requested sites."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor

from ..core.plan import Plan, Site
from ..models.inputs import Batch


@dataclass
class RunOutput:
    logits: Tensor
    """``[batch, pos, vocab]``."""
    acts: dict[Site, Tensor] = field(default_factory=dict)
    """Captured activations (after the plan's edits at that site)."""


class Backend(Protocol):
    name: str

    def run(self, batch: Batch, plan: Plan, capture: Collection[Site] = ()) -> RunOutput:
        """One forward over ``batch`` with ``plan`` applied. Leaves no hook behind."""
        ...
