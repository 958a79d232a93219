"""`Context`: what every stage of `plan.PLAN` reads and none changes (the model, the task,
the settings, and what follows from them)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from .runner import Runner, runner_for

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask, Task
    from .estimate import StageBar
    from .roles import RoleThresholds
    from .settings import DiscoverySettings


@dataclass
class Context:
    """What every stage reads and none changes: the model, the task, the settings, and what
    follows from them (`stages.check_arguments`: the thresholds and layers to scan)."""

    model: GnaModel
    task: Task
    settings: DiscoverySettings
    thresholds: RoleThresholds
    scan_layers: list[int]
    estimate: dict[str, Any]
    bar: StageBar
    progress: bool

    @cached_property
    def runner(self) -> Runner:
        """The engine the stages ask (`runner.runner_for`): local, or remote in few requests."""
        return runner_for(self.model)

    @property
    def batched(self) -> bool:
        """Each stage's forwards in one request (`Runner.batched`: a remote model)."""
        return self.runner.batched

    @property
    def evaluate_bars(self) -> bool | None:
        """`evaluate`'s own default bars for single evaluations, or none."""
        return None if self.progress else False

    @property
    def wide(self) -> list[int]:
        """The scan layers of more than ``screen_above`` heads (group testing)."""
        if "heads" not in self.settings.stages:
            return []
        return [layer for layer in self.scan_layers if self.model.heads_per_layer[layer] > self.settings.screen_above]

    @cached_property
    def encoded(self) -> EncodedTask:
        """The task encoded for the model's tokenizer (once per run)."""
        return self.task.encode(self.task.tokenizer_for(self.model.tokenizer))
