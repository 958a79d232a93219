"""gna_interp: Gather-and-Aggregate interpretability for Transformers and SSMs.

Everything a user needs is importable from here::

    import gna_interp as gna
    model = gna.load("meta-llama/Llama-3.1-8B-Instruct")      # TransformerLens bridge
    logits = model.logits(prompts, interventions=[gna.Ablate([gna.Head(16, 22)])])

The namespace is lazy (PEP 562, `gna_interp._lazy`): ``import gna_interp`` imports
neither torch nor any backend; each name below is imported from its module on first use,
so the ``gna-interp`` command answers ``--help`` at once. To export a new name, add one
line to `_EXPORTS`: ``"name": "module"`` (the name is that module's attribute), or
``"name": "module:attribute"``; a subpackage is exported as ``"name": "name:"``.
"""

from __future__ import annotations

from typing import Any

from ._lazy import lazy_attribute, moved_attribute, public_dir

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "ARCHITECTURES": "models.registry",
    "Ablate": "core",
    "ArchSpec": "core",
    "core": "core:",
    "cost_meter": "cost",
    "Cost": "cost",
    "Evaluation": "scoring.evaluation",
    "DiscoverySettings": "discovery",
    "GnaCircuit": "discovery",
    "GnaModel": "models",
    "LMEvalRun": "harness",
    "LMEvalTable": "harness",
    "Head": "core",
    "KeepOnly": "core",
    "LayerKind": "core",
    "MaskAttentionRows": "core",
    "MixerSpec": "core",
    "Stream": "core",
    "Patch": "core",
    "Resid": "core",
    "SkipLayers": "core",
    "SweepResult": "patching",
    "Truncate": "core",
    "ablation_sweep": "patching",
    "attention": "attention:",
    "attention_pattern": "attention",
    "attribution_patching": "patching",
    "candidate_accuracy": "patching",
    "candidate_logit_diff": "patching",
    "candidate_logprob": "patching",
    "circuit_score": "scoring.circuit_scores",
    "from_mib": "scoring.mib",
    "mib_attribution": "scoring.mib_scores",
    "MibGraph": "scoring.mib",
    "to_mib": "scoring.mib",
    "CircuitScore": "scoring.circuit_scores",
    "discover": "discovery",
    "discovery": "discovery:",
    "distill": "models.distill",
    "DistillHistory": "models.distill",
    "edge_attribution": "patching",
    "edge_faithfulness_curve": "scoring.edge_faithfulness",
    "EdgeFaithfulnessCurve": "scoring.edge_faithfulness",
    "EdgeResult": "patching",
    "evaluate": "scoring.evaluation",
    "faithfulness_curve": "scoring.faithfulness",
    "FaithfulnessCurve": "scoring.faithfulness",
    "RetentionCurve": "scoring.retention_results",
    "RetrievalRanking": "scoring.retention_results",
    "harness": "harness:",
    "hybridize": "models",
    "lm_eval": "harness",
    "lm_eval_table": "harness",
    "load": "models",
    "load_toy": "zoo",
    "models": "models:",
    "logit_diff": "patching",
    "patching": "patching:",
    "patching_sweep": "patching",
    "path_patching": "patching",
    "path_patching_sweep": "patching",
    "progress_enabled": "progress",
    "reads_position": "patching",
    "register_architecture": "models.registry",
    "retention_curve": "scoring.retention",
    "retrieval_ranking": "scoring.retention",
    "set_progress": "progress",
    "swap_layers": "models.swap",
    "target_logprob": "patching",
    "scoring": "scoring:",
    "tasks": "tasks:",
    "toy_card": "zoo",
    "toy_names": "zoo",
    "toy_task": "zoo",
    "viz": "viz:",
    "zoo": "zoo:",
    "write_report": "viz.report",
}
"""Public name -> where it lives, relative to this package (one line per name)."""

_MOVED: dict[str, str] = {
    "entropy": "attention.entropy",
    "mass_on": "attention.mass_on",
    "top1_mass": "attention.top1_mass",
    "evaluation": "scoring",
}
"""Old top-level name -> its namespace now (issue 53: generic helpers under the namespace they
measure, no ``evaluation`` module beside `evaluate` and `Evaluation`): it still resolves, with a
`FutureWarning`, for one release; not in ``__all__`` nor ``dir(gna_interp)``."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return moved_attribute(__name__, name, _MOVED[name])
    return lazy_attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return public_dir(__all__, globals())
