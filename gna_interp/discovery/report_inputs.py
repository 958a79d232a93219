"""What the report shows of a circuit beyond what discovery recorded, measured here, where
results are made (`viz.report` only renders): `circuit_heads` and `circuit_ranking` (no
forward), `circuit_faithfulness` (the circuit kept alone, `faithfulness_curve`) and
`with_need_curves` (a copy of a circuit with the heads-needed curves it lacks)."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

from ..scoring.faithfulness import faithfulness_curve
from .picture import need_curve

if TYPE_CHECKING:
    from ..core.heads import Head
    from ..scoring.faithfulness import FaithfulnessCurve
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
