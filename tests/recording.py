"""Raw-torch observation helpers shared by the reference tests: hooks and wrapped
module globals, both undone on exit (also after a raise)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def hooked(pairs: list[tuple[torch.nn.Module, str, Callable[..., Any]]]) -> Iterator[None]:
    """Raw torch hooks ``(module, "pre" | "post", fn)``, removed on exit."""
    handles = [m.register_forward_pre_hook(fn) if kind == "pre" else m.register_forward_hook(fn) for m, kind, fn in pairs]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def recorded_calls(module: Any, name: str) -> Iterator[list[tuple[tuple, dict, Any]]]:
    """Wrap the module global ``name`` (e.g. HF's scan function) so each call's
    ``(args, kwargs, result)`` is kept; the original is restored on exit."""
    original = getattr(module, name)
    calls: list[tuple[tuple, dict, Any]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    setattr(module, name, recording)
    try:
        yield calls
    finally:
        setattr(module, name, original)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())
