"""The bundled toy models (trained here on `toy_mcq`) and the code that trains them
(names imported on first use, see `gna_interp._lazy`: `zoo.store` finds the toys without torch)."""

from __future__ import annotations

from typing import Any

from .._lazy import lazy_attribute, public_dir

_EXPORTS: dict[str, str] = {
    "RECIPES": "recipes",
    "Recipe": "recipes",
    "load_toy": "store",
    "recipe": "recipes",
    "toy_card": "store",
    "toy_names": "store",
    "toy_task": "store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return public_dir(__all__, globals())
