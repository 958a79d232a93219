"""Loading models and the architecture table (names imported on first use, see
`gna_interp._lazy`: `models.registry` needs no torch)."""

from __future__ import annotations

from typing import Any

from .._lazy import lazy_attribute, public_dir

_EXPORTS: dict[str, str] = {
    "DistillHistory": "distill",
    "GnaModel": "handle",
    "distill": "distill",
    "hybridize": "hybrid_student",
    "load": "loading",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return public_dir(__all__, globals())
