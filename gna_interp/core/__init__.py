"""The vocabulary: heads, sites, interventions, architecture specs. Imports no backend.

The names below are imported on first use (see `gna_interp._lazy`): `core.arch` and
`core.heads` are plain Python, so reading a config's heads needs no torch."""

from __future__ import annotations

from typing import Any

from .._lazy import lazy_attribute, public_dir

_EXPORTS: dict[str, str] = {
    "ABLATION_KINDS": "interventions",
    "Ablate": "interventions",
    "ArchSpec": "arch",
    "Head": "heads",
    "HEAD_KINDS": "interventions",
    "Intervention": "interventions",
    "KeepOnly": "interventions",
    "LayerKind": "arch",
    "AttentionDims": "dims",
    "Mamba2Dims": "dims",
    "MaskAttentionRows": "interventions",
    "MixerSpec": "arch",
    "Patch": "interventions",
    "Positions": "interventions",
    "Resid": "heads",
    "SkipLayers": "interventions",
    "Stream": "arch",
    "Target": "heads",
    "Truncate": "interventions",
    "uniform": "arch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return public_dir(__all__, globals())
