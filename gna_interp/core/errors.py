"""Values shown in error messages: cut, so a long list or a module does not fill the screen."""

from __future__ import annotations


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (``...`` ends a cut one)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
