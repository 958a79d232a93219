"""Ablation, activation patching, and the batched variant runner they share."""

from .metrics import candidate_accuracy, logit_diff, target_logprob
from .results import SweepResult
from .sweeps import ablation_sweep, patching_sweep

__all__ = ["SweepResult", "ablation_sweep", "candidate_accuracy", "logit_diff", "patching_sweep", "target_logprob"]
