"""The vocabulary: heads, sites, interventions, architecture specs. Imports no backend."""

from .arch import ArchSpec, LayerKind
from .heads import Head, Resid, Target
from .interventions import (
    ABLATION_KINDS,
    Ablate,
    Intervention,
    MaskAttentionRows,
    Patch,
    Positions,
    SkipLayers,
    Truncate,
    keep_attention_rows,
)

__all__ = [
    "ABLATION_KINDS",
    "Ablate",
    "ArchSpec",
    "Head",
    "Intervention",
    "LayerKind",
    "MaskAttentionRows",
    "Patch",
    "Positions",
    "Resid",
    "SkipLayers",
    "Target",
    "Truncate",
    "keep_attention_rows",
]
