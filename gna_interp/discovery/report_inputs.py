"""What the report shows of a circuit beyond what discovery recorded, measured here, where
results are made (`viz.report` only renders): `measure_report` runs every forward the report
needs and returns a `ReportInputs`; its pieces are `circuit_heads` and `circuit_ranking` (no
forward), `circuit_faithfulness` (the circuit kept alone, `faithfulness_curve`),
`with_need_curves` (a copy of a circuit with the heads-needed curves it lacks), the averaged
G&A picture (`picture.role_picture`) and one prompt's patterns (`prompt_view`)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ..attention.pattern import attention_pattern
from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..core.inputs import Batch
from ..scoring.faithfulness import FaithfulnessCurve, faithfulness_curve
from ..scoring.verdicts import wilson_interval
from .picture import RolePicture, need_curve, role_picture

if TYPE_CHECKING:
    from ..scoring.retention_results import RetentionCurve
    from .circuit import GnaCircuit


def circuit_heads(circuit: GnaCircuit) -> list[Head]:
    """The circuit's heads: its Gather set, then the Aggregate heads not in it."""
    return list(dict.fromkeys([*circuit.gather, *circuit.aggregate]))


def circuit_ranking(circuit: GnaCircuit, model: Any) -> list[Head]:
    """The heads discovery measured, largest accuracy drop first: each head's single
    zero-ablation accuracy from the head scan (``circuit.head_scan``), or, for a head the
    scan lacks, the accuracy it was ablated alone at in the examined-heads evidence. Heads
    measured neither way are left out (`faithfulness_curve` puts them last, in
    ``model.heads`` order). No forward is run."""
    drop = drops(circuit, model.heads)
    return sorted(drop, key=lambda head: -drop[head])  # stable: ties keep model.heads order


def drops(circuit: GnaCircuit, heads: Any) -> dict[Any, float]:
    """Clean accuracy minus each measured head's single-ablation accuracy (`circuit_ranking`)."""
    clean = circuit.accuracy["clean"]
    alone = {item.head: item.ablated_accuracy for item in circuit.heads if item.ablated_accuracy is not None}
    scan = circuit.head_scan or []
    drop: dict[Any, float] = {}
    for head in heads:
        value = scan[head.layer][head.head] if head.layer < len(scan) and head.head < len(scan[head.layer]) else None
        value = alone.get(head) if value is None else value
        if value is not None and not math.isnan(value):
            drop[head] = clean - value
    return drop


def circuit_faithfulness(
    circuit: GnaCircuit, model: Any, task: Any, *, sizes: Any = None, how: str = "mean", progress: bool = False
) -> FaithfulnessCurve | None:
    """How much of ``task`` the circuit's heads carry alone (`gna.faithfulness_curve`):
    the top-n heads of `circuit_ranking` kept at each of ``sizes`` (default: every n up to
    32 heads, else 24 points), every other head ``how``-ablated, plus the point of the
    circuit's Gather and Aggregate heads kept alone. ``None`` for a circuit without heads.
    Cost: one `evaluate` per size and one for the circuit (and a reference forward each
    for a mean or resample ablation); the ranking costs nothing (discovery measured it)."""
    heads = circuit_heads(circuit)
    if not heads:
        return None
    ranking = circuit_ranking(circuit, model)
    return faithfulness_curve(model, task, ranking, sizes=sizes, how=how, circuit=heads, progress=progress)


def with_need_curves(circuit: GnaCircuit, model: Any, task: Any) -> GnaCircuit:
    """A copy of ``circuit`` with each `RoleNeed.curve` it lacks measured (`picture.need_curve`:
    the needed heads ablated cumulatively at every position), when the model and task are
    given; ``circuit`` itself is not changed."""
    circuit = copy.deepcopy(circuit)
    for need in circuit.needs.values():
        if not need.curve and model is not None and task is not None and need.heads:
            need.curve = list(zip(need.heads, need_curve(model, task, need.heads), strict=True))  # at every position
            need.curve_positions = "all"
    return circuit


def token_labels(model: Any, ids: Tensor) -> list[str]:
    """A readable label per token id (``[pos]``): the tokenizer's decoding of that one token."""
    labels = []
    for token in ids.tolist():
        text = model.tokenizer.decode([token]) if model.tokenizer is not None else ""
        if not text:
            labels.append(f"<{token}>")
        elif not text.strip():
            labels.append(repr(text))  # whitespace tokens stay visible
        else:
            labels.append(text.replace("\n", "\\n"))
    return labels


@dataclass
class PromptView:
    """One prompt's attention patterns, measured for the report's circuitsvis view.

    Attributes:
        row: the prompt's index in the task.
        tokens: one label per token (its padding dropped), ``[pos]``.
        pattern: ``[head, query pos, key pos]``, rows as distributions of ``|w|``.
        heads: the heads of ``pattern``, in order (the Aggregate set, then the Gather set).
    """

    row: int
    tokens: list[str]
    pattern: Tensor
    heads: list[Head]


@dataclass
class ReportInputs:
    """Everything the report draws of one circuit, measured (`measure_report`); rendering
    it (`gna.write_report`) runs no forward.

    Attributes:
        circuit: the circuit, with every heads-needed curve (`with_need_curves`).
        faithfulness: the circuit kept alone and the top-n curve (`circuit_faithfulness`);
            ``None`` only for a circuit without heads.
        picture: the G&A picture averaged over the task (`picture.role_picture`).
        view: the prompt the picture chose, its patterns (``None``: none answered correctly).
        retention: a keep-only curve (`gna.retention_curve`), when one was given.
    """

    circuit: GnaCircuit
    faithfulness: FaithfulnessCurve | None = None
    picture: RolePicture | None = None
    view: PromptView | None = None
    retention: RetentionCurve | None = None

    def interval(self, which: str, level: float = 0.95) -> tuple[float, float] | None:
        """The Wilson interval (two-sided at ``level``, `scoring.verdicts.wilson_interval`) of
        an accuracy of the faithfulness curve: ``which`` is ``"clean"``, ``"alone"`` (the
        circuit kept alone) or ``"ablated"`` (every head); ``None`` without a curve. Binomial
        over the curve's prompts."""
        curve = self.faithfulness
        if curve is None or curve.circuit_point is None:
            return None
        points = {"clean": curve.clean, "alone": curve.circuit_point, "ablated": curve.ablated}
        if which not in points:
            raise GnaValueError(f"interval({which!r}): expected 'clean', 'alone' or 'ablated'")
        n = curve.n_prompts
        return wilson_interval(round(float(points[which]["accuracy"]) * n), n, level)


def prompt_view(circuit: GnaCircuit, model: Any, task: Any, row: int) -> PromptView:
    """The patterns of the circuit's Aggregate and Gather heads on prompt ``row`` of ``task``
    (one forward), as `viz.views.attention_view` draws them."""
    heads = [*circuit.aggregate, *circuit.gather]
    batch = model.to_batch(task)
    start = int(batch.attention_mask[row].argmax())  # first real token (left padding)
    one = Batch(batch.input_ids[row : row + 1, start:], batch.attention_mask[row : row + 1, start:])
    pattern = attention_pattern(model, one, heads, normalize="row")[0].cpu()
    return PromptView(row, token_labels(model, one.input_ids[0]), pattern, heads)


def measure_report(
    circuit: GnaCircuit,
    model: Any,
    task: Any,
    *,
    faithfulness: FaithfulnessCurve | bool = True,
    sizes: Any = None,
    retention: RetentionCurve | None = None,
    progress: bool = False,
) -> ReportInputs:
    """Every forward the report needs, run here, so that `gna.write_report` only renders:
    the heads-needed curves the circuit lacks (`with_need_curves`, on a copy), the circuit
    kept alone and its top-n curve (`circuit_faithfulness` at ``sizes``; a curve given is
    used as it is; ``False``: none), the averaged G&A picture (`picture.role_picture`) and
    the chosen prompt's patterns (`prompt_view`). ``circuit`` is not changed.

    Cost: one `evaluate` per needed head without its curve, one per faithfulness size and
    one for the circuit (plus one reference forward), the picture's pattern forward and one
    `evaluate` over its prompts, and one forward for the view."""
    from .circuit import GnaCircuit

    if not isinstance(circuit, GnaCircuit):
        raise GnaTypeError(f"measure_report: circuit is {type(circuit).__name__}: expected a GnaCircuit (gna.discover)")
    if model is None or task is None:
        raise GnaValueError(f"measure_report({circuit.model!r}): model and task are needed to measure (got model={model!r})")
    measured = with_need_curves(circuit, model, task)
    given = None if faithfulness is False else faithfulness
    curve = circuit_faithfulness(measured, model, task, sizes=sizes, progress=progress) if given is True else given
    picture = view = None
    if measured.gather or measured.aggregate:
        picture = role_picture(measured, model, task)
        view = None if picture.prompt is None else prompt_view(measured, model, task, picture.prompt)
    return ReportInputs(measured, curve, picture, view, retention)
