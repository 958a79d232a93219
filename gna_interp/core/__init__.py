"""The vocabulary: heads, sites, interventions, architecture specs. Imports no backend."""

from .arch import ArchSpec, LayerKind
from .heads import Head, Resid, Target
from .interventions import ABLATION_KINDS, Ablate, Intervention, Patch, Positions, SkipLayers, Truncate

__all__ = [
    "ABLATION_KINDS",
    "Ablate",
    "ArchSpec",
    "Head",
    "Intervention",
    "LayerKind",
    "Patch",
    "Positions",
    "Resid",
    "SkipLayers",
    "Target",
    "Truncate",
]
