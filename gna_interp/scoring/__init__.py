"""Scoring: how much of a task a set of heads or edges carries.

- `evaluation`: accuracy of a task under interventions (`evaluate`, `evaluate_many`);
- `curve`: the sizes and summaries every curve below shares;
- `faithfulness`: keep only the top-n heads of a ranking (`faithfulness_curve`);
- `edge_faithfulness`: the same over edges (`edge_faithfulness_curve`);
- `circuit_scores`: MIB's faithfulness, CPR and CMD of a ranking's circuits (`circuit_score`);
- `mib`, `mib_graph`, `mib_read`, `mib_scores`: MIB's graph files (`to_mib`, `from_mib`) and
  its edge-budget scores (`circuit_score(..., unit="edge")`, `mib_attribution`);
- `retention`: retrieval-aware head ranking and keep-only curves against random sets (what
  they return: `retention_results`);
- `verdicts`: every verdict a test with its interval over the prompts (`Verdict`,
  `label_verdict`: the mechanism the label check shows).

Names are imported on first use (`gna_interp._lazy`).
"""

from __future__ import annotations

from typing import Any

from .._lazy import lazy_attribute, public_dir

_EXPORTS: dict[str, str] = {
    "CircuitScore": "circuit_scores",
    "EdgeFaithfulnessCurve": "edge_faithfulness",
    "Evaluation": "evaluation",
    "MibGraph": "mib",
    "FaithfulnessCurve": "faithfulness",
    "RetentionCurve": "retention_results",
    "RetrievalRanking": "retention_results",
    "circuit_score": "circuit_scores",
    "edge_faithfulness_curve": "edge_faithfulness",
    "evaluate": "evaluation",
    "evaluate_many": "evaluation",
    "faithfulness_curve": "faithfulness",
    "from_mib": "mib",
    "mib_attribution": "mib_scores",
    "retention_curve": "retention",
    "retrieval_ranking": "retention",
    "to_mib": "mib",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return public_dir(__all__, globals())
