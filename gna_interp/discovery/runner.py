"""The engine a discovery's plan (`plan`) runs on: one protocol, `Runner`, that names what a
stage may ask of it, and two engines, `LocalRunner` and `RemoteRunner`.

A stage asks the runner, never the backend: ``runner.batched`` (each stage's forwards travel
as one request), ``runner.has_backward`` (local gradients: first-order estimates, the spread
roles' orderings), ``runner.has_prefix_cache`` (forwards over a batch seen before start from
its cached clean stream), what it measures ahead (`first_request`: the first stages in one
request; `pool_ahead`: the joint pool's heads scored with the candidates; none locally, where
each stage measures what it needs), and four measurements:

- `accuracy`: one intervention set, behind the accuracy memo (`memo.accuracy`);
- `accuracies`: many sets, in one request on a remote model (`evaluate_many`);
- `joint_search`: each role's joint set (`joint.JointSearch`; the server program in one
  request on a remote model, `remote.joint_search`), the same search either way
  (`gna_interp.core.search`);
- `capture`: clean activations at some sites (`GnaModel.capture_sites`).

`runner_for` picks the engine: a remote nnsight model without an active intervention context
gets `RemoteRunner`; anything else `LocalRunner` (a remote model under ``model.ablated``
runs the local code path, one request per forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..core.heads import Head
from ..models.jobs import is_batched_remote
from ..scoring.evaluation import evaluate_many
from . import memo, remote
from .group_testing import speculated
from .head_order import ordered_layers
from .joint import ROLE_POSITIONS

if TYPE_CHECKING:
    from torch import Tensor

    from ..core.inputs import Batch
    from ..core.interventions import Intervention
    from ..core.plan import Site
    from ..models.handle import GnaModel
    from ..tasks.base import Task
    from .circuit import GnaCircuit
    from .evidence import HeadEvidence, RoleNeed
    from .joint import JointSearch

Run = tuple["Task", Sequence["Intervention"]]
"""A task and the interventions it is evaluated under."""


class Runner(Protocol):
    """What a stage of `plan.PLAN` may ask of the engine it runs on (module docs)."""

    name: ClassVar[str]
    model: GnaModel

    @property
    def batched(self) -> bool: ...

    @property
    def has_backward(self) -> bool: ...

    @property
    def has_prefix_cache(self) -> bool: ...

    def first_request(self, task: Task, stages: Sequence[str], check_labels: bool, wide: Sequence[int]) -> remote.FirstScans | None: ...

    def pool_ahead(self, harmful: list[Head], evidence: dict[Head, HeadEvidence], screen_above: int) -> list[Head]: ...

    def accuracy(self, task: Task, interventions: Sequence[Intervention] = (), *, progress: bool | None = False) -> float: ...

    def accuracies(self, runs: Sequence[Run]) -> list[float]: ...

    def joint_search(self, search: JointSearch, circuit: GnaCircuit, threshold: float, max_heads: int) -> dict[str, RoleNeed]: ...

    def capture(self, inputs: Any, sites: Sequence[Site]) -> tuple[Batch, dict[Site, Tensor]]: ...


@dataclass
class LocalRunner:
    """Forwards here, one at a time, behind the accuracy memo and the prefix cache."""

    model: GnaModel
    name: ClassVar[str] = "local"

    @property
    def batched(self) -> bool:
        return False

    @property
    def has_backward(self) -> bool:
        return not self.model.is_remote

    @property
    def has_prefix_cache(self) -> bool:
        return not self.model.is_remote

    def first_request(self, task: Task, stages: Sequence[str], check_labels: bool, wide: Sequence[int]) -> remote.FirstScans | None:
        """Nothing measured ahead: each stage measures what it needs (``None``)."""
        return None

    def pool_ahead(self, harmful: list[Head], evidence: dict[Head, HeadEvidence], screen_above: int) -> list[Head]:
        """No joint pool heads scored ahead: the joint search scores its pool itself."""
        return []

    def accuracy(self, task: Task, interventions: Sequence[Intervention] = (), *, progress: bool | None = False) -> float:
        """`memo.accuracy`: an evaluation made before in this discovery is answered."""
        return memo.accuracy(self.model, task, interventions, progress=progress)

    def accuracies(self, runs: Sequence[Run]) -> list[float]:
        """Each run's `accuracy`, in order."""
        return [self.accuracy(task, interventions) for task, interventions in runs]

    def joint_search(self, search: JointSearch, circuit: GnaCircuit, threshold: float, max_heads: int) -> dict[str, RoleNeed]:
        """Each role's joint set (`JointSearch.run`), the Aggregate role first."""
        needs = {}
        for role in ROLE_POSITIONS:
            if getattr(circuit, role):
                need = search.run(circuit, role, threshold, max_heads)
                if need is not None:
                    needs[role] = need
        return needs

    def capture(self, inputs: Any, sites: Sequence[Site]) -> tuple[Batch, dict[Site, Tensor]]:
        """`GnaModel.capture_sites`."""
        return self.model.capture_sites(inputs, sites)


@dataclass
class RemoteRunner(LocalRunner):
    """A remote nnsight model (NDIF, or ``remote="local"``): no backward, no prefix cache, and
    each measurement of many sets in one request."""

    name: ClassVar[str] = "remote"

    @property
    def batched(self) -> bool:
        return True

    def first_request(self, task: Task, stages: Sequence[str], check_labels: bool, wide: Sequence[int]) -> remote.FirstScans | None:
        """The first request (`remote.first_scans`): the baseline, the label check, the
        truncation and layer scans, and the first stage of group testing of the ``wide``
        layers when there are at most `remote.SPECULATE_LAYERS` of them, with the tree below
        their first blocks (`group_testing.speculated`: their heads in `head_order.ordered_layers`'
        order, measured by a request before it)."""
        ahead = []
        if wide and len(wide) <= remote.SPECULATE_LAYERS:
            order = ordered_layers(self.model, task, wide)
            ahead = [g for layer in wide for g in speculated(order[layer])]
        return remote.first_scans(self.model, task, stages, check_labels, ahead)

    def pool_ahead(self, harmful: list[Head], evidence: dict[Head, HeadEvidence], screen_above: int) -> list[Head]:
        """The heads the joint search may pool that are not examined yet (`remote.pool_heads`):
        their pattern scores travel with the candidates' in one request."""
        return remote.pool_heads(self.model, harmful, evidence, screen_above)

    def accuracies(self, runs: Sequence[Run]) -> list[float]:
        """Every run in one request (`evaluate_many`)."""
        return [result.accuracy for result in evaluate_many(self.model, list(runs))]

    def joint_search(self, search: JointSearch, circuit: GnaCircuit, threshold: float, max_heads: int) -> dict[str, RoleNeed]:
        """Both roles' searches in one request, their steps decided on the server (`remote.joint_search`)."""
        return remote.joint_search(search, circuit, threshold, max_heads)


def runner_for(model: GnaModel) -> Runner:
    """`RemoteRunner` for a remote nnsight model without an active intervention context (its
    jobs travel as session requests, `models.jobs.is_batched_remote`), else `LocalRunner`."""
    if is_batched_remote(model) and not model.active_interventions:
        return RemoteRunner(model)
    return LocalRunner(model)
