"""gna_interp: Gather-and-Aggregate interpretability for Transformers and SSMs.

Everything a user needs is importable from here::

    import gna_interp as gna
    model = gna.load("meta-llama/Llama-3.1-8B-Instruct")      # TransformerLens bridge
    logits = model.logits(prompts, interventions=[gna.Ablate([gna.Head(16, 22)])])
"""

from .core import Ablate, ArchSpec, Head, LayerKind, Patch, Resid, SkipLayers, Truncate
from .models import GnaModel, load
from .models.registry import ARCHITECTURES
from .patching import (
    SweepResult,
    ablation_sweep,
    candidate_accuracy,
    logit_diff,
    patching_sweep,
    target_logprob,
)

__version__ = "0.1.0"

__all__ = [
    "ARCHITECTURES",
    "Ablate",
    "ArchSpec",
    "GnaModel",
    "Head",
    "LayerKind",
    "Patch",
    "Resid",
    "SkipLayers",
    "SweepResult",
    "Truncate",
    "ablation_sweep",
    "candidate_accuracy",
    "load",
    "logit_diff",
    "patching_sweep",
    "target_logprob",
]
