"""The position scan of G&A discovery: where each layer acts.

Before any head search, each costly layer's heads are ablated together only at one class of
positions the task defines (`position_classes`): the segment ends, the labels, the option
tokens, the question, the separators (every other prompt token before the final one) and
the final position. A head's output at position ``t`` enters the residual stream at ``t``
alone, so a layer whose ablation at a class costs accuracy acts through those positions, and
one whose ablation there costs nothing does not: no role is named there.

The scan's forwards run behind the accuracy memo (one request on a remote model,
`Runner.accuracies`); on a local model each starts from the cached clean prefix before its
layer (`GnaModel.run_plan`), and each layer is screened first (`position_scan`): ablated at
the final position, then at every other class together; only where that costs is each
other class measured alone (a layer that acts only at the final position, an Aggregate
layer, takes two forwards, not six).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import Ablate, Intervention

if TYPE_CHECKING:
    import pandas as pd

    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask, Task


class Runner(Protocol):
    """What the scan asks of the engine it runs on (`runner.Runner` has it)."""

    model: GnaModel

    def accuracies(self, runs: Sequence[tuple[Task, Sequence[Intervention]]]) -> list[float]: ...


POSITION_CLASSES = ("ends", "labels", "options", "question", "separators", "final")
"""The position classes a task defines, in the order the scan measures them."""

SCAN_KINDS = ("zero", "mean")
"""How the scan ablates: zero (discovery's kind), or the layer's mean over the task's tokens."""


def position_classes(encoded: EncodedTask) -> tuple[dict[str, Tensor], dict[str, str]]:
    """``[batch, pos]`` bool masks of each position class of ``encoded`` (`POSITION_CLASSES`).

    - ``ends``: each segment's end token; ``labels``: each segment's label token;
    - ``options``: the other tokens of the segments;
    - ``question``: the query's tokens (tasks with a query);
    - ``separators``: every other non-padding token before the final one (template words,
      line breaks, the first token);
    - ``final``: each prompt's last token.

    Returns the non-empty classes, and the classes left out because they hold exactly the
    positions of an earlier one (``{"labels": "ends"}`` where each label is its segment's
    end, a label-last layout); an empty class (no query) is in neither."""
    n_rows, n_pos = encoded.batch.n_rows, encoded.batch.n_pos
    rows = torch.arange(n_rows)[:, None]
    cols = torch.arange(n_pos)

    def at(index: Tensor) -> Tensor:
        mask = torch.zeros(n_rows, n_pos, dtype=torch.bool)
        mask[rows.expand_as(index), index] = True
        return mask

    final, ends, labels = at(encoded.final[:, None]), at(encoded.segment_ends), at(encoded.labels)
    inside = ((cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2])).any(1)  # [batch, pos]
    question = torch.zeros(n_rows, n_pos, dtype=torch.bool)
    if encoded.query is not None:
        question = (cols[None] >= encoded.query[:, :1]) & (cols[None] < encoded.query[:, 1:2])
    padding = encoded.batch.attention_mask == 0
    every = {
        "ends": ends,
        "labels": labels,
        "options": inside & ~ends & ~labels,
        "question": question & ~inside,
        "separators": ~(inside | question | final | padding),
        "final": final,
    }
    classes: dict[str, Tensor] = {}
    same: dict[str, str] = {}
    for name in POSITION_CLASSES:
        mask = every[name]
        if not bool(mask.any()):
            continue
        twin = next((kept for kept, other in classes.items() if torch.equal(other, mask)), None)
        if twin is None:
            classes[name] = mask
        else:
            same[name] = twin
    return classes, same


@dataclass
class PositionScan:
    """Accuracy with each scanned layer's heads ablated at each position class.

    Attributes:
        accuracy: ``{layer: {class: accuracy}}``.
        clean: the clean accuracy; ``min_effect``: the cost that counts.
        how: the ablation kind (`SCAN_KINDS`).
        same: classes merged into an earlier one with the same positions (`position_classes`).
        cleared: ``{layer: accuracy}`` with the layer ablated at every class but the final
            position together, where that cost less than ``min_effect``: those classes were
            cleared together (monotone effects, as group testing assumes) and are not in
            ``accuracy[layer]``.
    """

    accuracy: dict[int, dict[str, float]]
    clean: float
    min_effect: float
    how: str = "zero"
    same: dict[str, str] = field(default_factory=dict)
    cleared: dict[int, float] = field(default_factory=dict)

    def acting(self, layer: int) -> list[str]:
        """The classes where ablating ``layer`` costs at least ``min_effect``, in scan order."""
        return [name for name, value in self.accuracy.get(layer, {}).items() if self.clean - value >= self.min_effect]

    def acts_at(self, classes: Sequence[str]) -> list[int]:
        """The scanned layers that act at one of ``classes`` at least (a merged class counts as its twin)."""
        wanted = {self.same.get(name, name) for name in classes}
        return [layer for layer in self.accuracy if wanted & set(self.acting(layer))]

    def frame(self) -> pd.DataFrame:
        """One row per layer, one column per class: the accuracy with the layer ablated there."""
        import pandas as pd

        return pd.DataFrame.from_dict(self.accuracy, orient="index").rename_axis("layer")

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": {str(layer): dict(row) for layer, row in self.accuracy.items()},
            "clean": self.clean,
            "min_effect": self.min_effect,
            "how": self.how,
            "same": dict(self.same),
            "cleared": {str(layer): value for layer, value in self.cleared.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PositionScan:
        accuracy = {int(layer): {str(k): float(v) for k, v in row.items()} for layer, row in data["accuracy"].items()}
        cleared = {int(layer): float(v) for layer, v in data.get("cleared", {}).items()}
        how, same = str(data.get("how", "zero")), dict(data.get("same", {}))
        return cls(accuracy, float(data["clean"]), float(data["min_effect"]), how, same, cleared)


def layer_heads(runner: Runner, layer: int) -> list[Head]:
    """Every head of ``layer`` (its whole mixer: attention heads, SSM heads or channels)."""
    return [Head(layer, head) for head in range(runner.model.heads_per_layer[layer])]


@dataclass(frozen=True)
class ScanRuns:
    """A position scan's forwards, to be measured now or in a later request (a remote run
    measures them with its confirmation's, `remote.confirm`): ``runs[i]`` ablates
    ``keys[i] = (layer, class)``."""

    keys: list[tuple[int, str]]
    runs: list[tuple[Task, list[Intervention]]]
    same: dict[str, str]
    how: str

    def scan(self, values: Sequence[float], clean: float, min_effect: float) -> PositionScan:
        """The `PositionScan` of ``values`` (one accuracy per run, in order). Where the runs hold
        `REST` (every class but the final position together), the screen `position_scan`
        applies locally is applied to them: a layer whose `REST` costs less than ``min_effect``
        keeps only its final position and is cleared (`PositionScan.cleared`), so a remote
        scan, which measures every class at once, equals the local one."""
        measured = {key: float(value) for key, value in zip(self.keys, values, strict=True)}
        cleared = {layer: value for (layer, name), value in measured.items() if name == REST and clean - value < min_effect}
        accuracy: dict[int, dict[str, float]] = {layer: {} for layer, _ in self.keys}
        for (layer, name), value in measured.items():
            if name != REST and (layer not in cleared or name == "final"):
                accuracy[layer][name] = value
        return PositionScan(accuracy, float(clean), float(min_effect), self.how, dict(self.same), cleared)


REST = "rest"
"""`scan_runs`'s name for every class but the final position together (the screen's group)."""


def scan_runs(
    runner: Runner, task: Task, encoded: EncodedTask, layers: Sequence[int], how: str = "zero", names: Sequence[str] | None = None
) -> ScanRuns:
    """The forwards of a position scan of ``layers`` (`position_scan`): each layer at each
    class, or at each of ``names`` (classes, or `REST`: every class but ``"final"`` together)."""
    if how not in SCAN_KINDS:
        raise GnaValueError(f"how={how!r} is not a position scan's ablation kind: expected one of {SCAN_KINDS}")
    classes, same = position_classes(encoded)
    corrupt = None if how == "zero" else encoded.batch
    # the final position and the segment ends as the spread check writes them: the same forwards, one memo entry
    where: dict[str, Tensor] = {**classes, "final": encoded.final, **({"ends": encoded.segment_ends} if "ends" in classes else {})}
    rest = [mask for name, mask in classes.items() if name != "final"]
    if rest:
        where[REST] = torch.stack(rest).any(0)
    keys = [(int(layer), name) for layer in layers for name in (classes if names is None else names) if name in where]
    runs = [(task, [Ablate(layer_heads(runner, layer), how=how, corrupt=corrupt, positions=where[name])]) for layer, name in keys]
    return ScanRuns(keys, runs, same, how)  # type: ignore[arg-type]


def position_scan(
    runner: Runner,
    task: Task,
    encoded: EncodedTask,
    layers: Sequence[int],
    *,
    clean: float,
    min_effect: float,
    how: str = "zero",
    screen: bool = True,
) -> PositionScan:
    """`PositionScan` of ``layers`` on ``task``: each layer's heads ablated together (``how``:
    zero, or their mean over the task's own non-padding tokens) at each class of
    `position_classes`, behind the accuracy memo.

    ``screen`` (a local runner): per layer, the final position, then every other class
    together (`REST`); where that costs less than ``min_effect`` those classes are cleared
    together (`PositionScan.cleared`: monotone effects, as group testing assumes), else each
    is measured alone. Two forwards for a layer that acts only at the final position, one
    more than ``len(classes)`` for one that acts elsewhere. Without it (or on a batched
    runner: one request), every layer at every class: ``len(layers) * len(classes)`` forwards."""
    if not screen or getattr(runner, "batched", False):
        names = [*position_classes(encoded)[0], REST] if screen else None  # one request: the screen applied to it
        planned = scan_runs(runner, task, encoded, layers, how, names=names)
        values = runner.accuracies(planned.runs) if planned.runs else []
        return planned.scan(values, clean, min_effect)
    first = scan_runs(runner, task, encoded, layers, how, names=["final", REST])
    measured = dict(zip(first.keys, runner.accuracies(first.runs), strict=True))
    cleared = {layer: value for (layer, name), value in measured.items() if name == REST and clean - value < min_effect}
    costly = [layer for layer in layers if (int(layer), REST) in measured and int(layer) not in cleared]
    rest = scan_runs(runner, task, encoded, costly, how, names=[n for n in position_classes(encoded)[0] if n != "final"])
    measured |= dict(zip(rest.keys, runner.accuracies(rest.runs), strict=True))
    accuracy: dict[int, dict[str, float]] = {int(layer): {} for layer in layers}
    for name in position_classes(encoded)[0]:  # in class order
        for layer in accuracy:
            if (layer, name) in measured:
                accuracy[layer][name] = float(measured[layer, name])
    return PositionScan(accuracy, float(clean), float(min_effect), how, dict(first.same), cleared)


def costly_layers(layer_scan: Sequence[float] | None, scan_layers: Sequence[int], clean: float, min_effect: float) -> list[int]:
    """The scan layers whose removal costs at least ``min_effect`` (the layer scan's; every
    scan layer without one)."""
    if layer_scan is None:
        return list(scan_layers)
    return [layer for layer in scan_layers if clean - layer_scan[layer] >= min_effect]


def describe(scan: PositionScan) -> str:
    """Where each scanned layer acts, in words (the summary's ``where`` line)."""
    merged = "".join(f"; {name} = {twin}" for name, twin in scan.same.items())
    parts = []
    for layer, row in scan.accuracy.items():
        acting = scan.acting(layer)
        values = ", ".join(f"{name} {row[name]:.2f}" for name in acting)
        text = f"L{layer} at {values}" if acting else f"L{layer} nowhere alone"
        if layer in scan.cleared:
            text += f" (elsewhere {scan.cleared[layer]:.2f}: every class but the final position together)"
        parts.append(text)
    return f"{'; '.join(parts)} (whole layer {scan.how}-ablated at each class{merged})"


def describe_coverage(coverage: dict[str, dict[str, Any]]) -> str:
    """Each collapse and the role's set there, in words (the summary's ``collapses`` line;
    `confirm.cover_collapses`): ``"gather@L0 at ends: layer 0.205, its 4 heads 0.205"``."""
    return "; ".join(
        f"{key} at {item['positions']}: layer {item['floor']:.3f}, its {len(item['heads'])} heads {item['accuracy']:.3f}"
        for key, item in coverage.items()
    )
