"""The bundled toy models (trained here on `toy_mcq`) and the code that trains them, for
any family transformers builds (`Recipe` or `family_recipe`, then `train_toy`: docs/own_family.md).
Names are imported on first use (see `gna_interp._lazy`: `zoo.store` finds the toys without
torch). The trainer is exported as ``train_toy``: the name ``train`` is its module's."""

from __future__ import annotations

from typing import Any

from .._lazy import lazy_attribute, public_dir

_EXPORTS: dict[str, str] = {
    "RECIPES": "recipes",
    "Recipe": "recipes",
    "TrainResult": "train",
    "family_recipe": "recipes",
    "load_toy": "store",
    "recipe": "recipes",
    "toy_card": "store",
    "toy_names": "store",
    "toy_task": "store",
    "train_toy": "train:train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return public_dir(__all__, globals())
