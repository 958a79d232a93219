"""gna_interp: Gather-and-Aggregate interpretability for Transformers and SSMs.

Everything a user needs is importable from here::

    import gna_interp as gna
    model = gna.load("meta-llama/Llama-3.1-8B-Instruct")      # TransformerLens bridge
    logits = model.logits(prompts, interventions=[gna.Ablate([gna.Head(16, 22)])])
"""

from . import attention, tasks, viz
from .attention import attention_pattern, entropy, mass_on, top1_mass
from .core import Ablate, ArchSpec, Head, LayerKind, MaskAttentionRows, Patch, Resid, SkipLayers, Truncate, keep_attention_rows
from .cost import Cost, cost_meter
from .discovery import GnACircuit, discover, write_report
from .evaluation import Evaluation, evaluate
from .models import GnaModel, load
from .models.registry import ARCHITECTURES
from .models.swap import swap_layers
from .patching import (
    SweepResult,
    ablation_sweep,
    attribution_patching,
    candidate_accuracy,
    logit_diff,
    patching_sweep,
    path_patching,
    path_patching_sweep,
    target_logprob,
)
from .zoo import load_toy, toy_card, toy_names, toy_task

__version__ = "0.1.0"

__all__ = [
    "ARCHITECTURES",
    "Ablate",
    "ArchSpec",
    "Cost",
    "Evaluation",
    "GnACircuit",
    "GnaModel",
    "Head",
    "LayerKind",
    "MaskAttentionRows",
    "Patch",
    "Resid",
    "SkipLayers",
    "SweepResult",
    "Truncate",
    "ablation_sweep",
    "attention",
    "attention_pattern",
    "attribution_patching",
    "candidate_accuracy",
    "cost_meter",
    "discover",
    "entropy",
    "evaluate",
    "keep_attention_rows",
    "load",
    "load_toy",
    "logit_diff",
    "mass_on",
    "patching_sweep",
    "path_patching",
    "path_patching_sweep",
    "swap_layers",
    "target_logprob",
    "tasks",
    "top1_mass",
    "toy_card",
    "toy_names",
    "toy_task",
    "viz",
    "write_report",
]
