"""The bundled toy models (trained here on `toy_mcq`) and the code that trains them."""

from .recipes import RECIPES, Recipe, recipe
from .store import load_toy, toy_card, toy_names, toy_task

__all__ = ["RECIPES", "Recipe", "load_toy", "recipe", "toy_card", "toy_names", "toy_task"]
