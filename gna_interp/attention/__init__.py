"""Attention patterns for every kind of head, and how sharp they are.

- Attention heads: the softmax probabilities the model computes.
- SSM heads: *implicit attention*. A selective SSM is a causal linear map of its inputs
  ``x`` (after the conv and activation): ``y_t = sum_s M[t, s] x_s + D x_t``. ``M`` plays
  the role of the attention matrix (Mamba-2: one per head; Mamba-1: one per channel). See
  `gna_interp.attention.implicit` for the formulas, `gna_interp.attention.reference` for
  the step-by-step twin the tests compare against.

Shapes: patterns are ``[batch, head, query, key]`` (axis names as in `gna_interp.core.heads`,
with ``query`` / ``key`` positions of the padded batch).
"""

from .capture import SSM_RECIPES, SSMInputs
from .implicit import implicit_rows
from .pattern import DEFAULT_MAX_BYTES, attention_pattern, ssm_inputs
from .positions import KeyPositions, QueryPositions
from .reference import implicit_loop, ssm_output_loop
from .sharpness import entropy, mass_on, normalize_rows, top1_mass

__all__ = [
    "DEFAULT_MAX_BYTES",
    "SSM_RECIPES",
    "KeyPositions",
    "QueryPositions",
    "SSMInputs",
    "attention_pattern",
    "entropy",
    "implicit_loop",
    "implicit_rows",
    "mass_on",
    "normalize_rows",
    "ssm_inputs",
    "ssm_output_loop",
    "top1_mass",
]
