"""The checks of ``write_report``'s ``faithfulness`` and ``retention`` arguments, and the words
for each ablation (`HOW`). The curves are measured elsewhere
(`discovery.report_inputs.circuit_faithfulness`, `gna.retention_curve`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.errors import GnaTypeError, GnaValueError
from ..discovery.report_inputs import circuit_heads

if TYPE_CHECKING:
    from ..discovery.circuit import GnaCircuit
    from ..scoring.faithfulness import FaithfulnessCurve
    from ..scoring.retention_results import RetentionCurve


HOW = {
    "mean": "each ablated head's output replaced by its mean over every token of the reference prompts, the task's own by default",
    "resample": "each ablated head's output taken from the corrupted prompts, the options rotated, by default",
    "zero": "each ablated head's output set to zero",
}


def check_faithfulness(faithfulness: Any, circuits: list[GnaCircuit]) -> dict[str, FaithfulnessCurve]:
    """``write_report``'s ``faithfulness``: model names of ``circuits`` to curves of their heads."""
    from ..scoring.faithfulness import FaithfulnessCurve

    if faithfulness is None:
        return {}
    if not isinstance(faithfulness, dict):
        raise GnaTypeError(f"faithfulness={type(faithfulness).__name__}: expected a dict of circuit.model -> FaithfulnessCurve")
    by_name = {circuit.model: circuit for circuit in circuits}
    for name, curve in faithfulness.items():
        if name not in by_name:
            raise KeyError(f"faithfulness[{name!r}]: no circuit of the report has that model; expected one of {sorted(by_name)}")
        if not isinstance(curve, FaithfulnessCurve):
            raise GnaTypeError(f"faithfulness[{name!r}] is {type(curve).__name__}: expected a FaithfulnessCurve (circuit_faithfulness)")
        heads = circuit_heads(by_name[name])
        if curve.circuit_point is None or set(curve.circuit) != set(heads):
            given = ", ".join(map(str, curve.circuit)) or "none"
            raise GnaValueError(
                f"faithfulness[{name!r}] has circuit heads {given}: expected the circuit's own, "
                f"{', '.join(map(str, heads))} (faithfulness_curve(..., circuit=...); circuit_faithfulness does it)"
            )
    return dict(faithfulness)


def check_retention(retention: Any, circuits: list[GnaCircuit]) -> dict[str, RetentionCurve]:
    """``write_report``'s ``retention``: model names of ``circuits`` to keep-only curves."""
    from ..scoring.retention_results import RetentionCurve

    if retention is None:
        return {}
    if not isinstance(retention, dict):
        raise GnaTypeError(f"retention={type(retention).__name__}: expected a dict of circuit.model -> RetentionCurve")
    names = sorted(circuit.model for circuit in circuits)
    for name, curve in retention.items():
        if name not in names:
            raise KeyError(f"retention[{name!r}]: no circuit of the report has that model; expected one of {names}")
        if not isinstance(curve, RetentionCurve):
            raise GnaTypeError(f"retention[{name!r}] is {type(curve).__name__}: expected a RetentionCurve (gna.retention_curve)")
    return dict(retention)
