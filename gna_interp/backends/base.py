"""The one protocol every backend implements: run a forward with a `Plan` applied and
return the logits plus the activations captured at the requested sites."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from ..core.inputs import Batch
from ..core.plan import Plan, Read, Site


@dataclass
class RunOutput:
    logits: Tensor
    """``[batch, pos, vocab]``; ``[batch, k, vocab]`` (the last ``k`` positions) for a forward
    run with ``logits_to_keep=k``."""
    acts: dict[Site, Tensor] = field(default_factory=dict)
    """Captured activations (after the plan's edits at that site)."""
    reads: list[Tensor] = field(default_factory=list)
    """The values of the requested `Read` s, in request order."""


class Backend(Protocol):
    name: str

    def run(
        self,
        batch: Batch,
        plan: Plan,
        capture: Collection[Site] = (),
        reads: Sequence[Read] = (),
        grad: bool = False,
        logits_to_keep: int = 0,
    ) -> RunOutput:
        """One forward over ``batch`` with ``plan`` applied. Leaves no hook behind.

        With ``grad=True`` autograd records the forward, and the captured activations are
        the tensors the forward goes on with: the logits can be differentiated with
        respect to them. ``logits_to_keep=k > 0``: the unembedding runs on the last ``k``
        positions alone and the logits are ``[batch, k, vocab]`` (the same numbers as those
        positions of the full logits); ``0``: every position. Logits that are NaN or inf on
        a real token raise `gna_interp.backends.finite.NonFiniteLogitsError`."""
        ...


@contextmanager
def attention_kernel(config: Any, kernel: str | None) -> Iterator[None]:
    """``config._attn_implementation`` set to ``kernel`` (``"eager"``, ``"sdpa"``, ...) for
    one forward and restored afterwards, exceptions included; ``None`` (or no config, or a
    config without that field: a model that is not a transformers class): left as it is."""
    if kernel is None or config is None or not hasattr(config, "_attn_implementation"):  # not a transformers config
        yield
        return
    previous = config._attn_implementation
    config._attn_implementation = kernel
    try:
        yield
    finally:
        config._attn_implementation = previous


def eager_attention(config: Any, needed: bool) -> AbstractContextManager[None]:
    """HF returns attention weights only from eager attention: switch ``config`` to it for
    one forward (when ``needed``; `attention_kernel`). (TransformerLens 4.x switches a
    bridged model to eager attention itself; 3.9 does not.)"""
    return attention_kernel(config, "eager" if needed else None)
