"""Ablation, activation patching, path patching, attribution patching, and the batched
variant runner they share."""

from .attribution import ablation_attribution, attribution_patching
from .edges import edge_attribution
from .metrics import candidate_accuracy, candidate_logit_diff, candidate_logprob, logit_diff, reads_position, target_logprob
from .paths import LOGITS, path_patching, path_patching_sweep
from .results import EdgeResult, SweepResult
from .sweeps import ablation_sweep, patching_sweep

__all__ = [
    "LOGITS",
    "EdgeResult",
    "SweepResult",
    "ablation_attribution",
    "ablation_sweep",
    "attribution_patching",
    "candidate_accuracy",
    "candidate_logit_diff",
    "candidate_logprob",
    "edge_attribution",
    "logit_diff",
    "patching_sweep",
    "path_patching",
    "path_patching_sweep",
    "reads_position",
    "target_logprob",
]
