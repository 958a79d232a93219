"""The library's own errors, and values shown in their messages.

Every error gna_interp raises for bad input is a `GnaError`: `GnaValueError` (a wrong value)
or `GnaTypeError` (a wrong kind of value), which are also Python's `ValueError` / `TypeError`,
so ``except ValueError`` keeps working; `SiteNotFiredError` (a hooked module the model did not
call) is also a ``RuntimeError``. The command line prints a `GnaError` as one line; any
other exception is a bug and shows its traceback.
"""

from __future__ import annotations


class GnaError(Exception):
    """Base of every error gna_interp raises on purpose (bad input, missing files, a model it
    cannot run)."""


class GnaValueError(GnaError, ValueError):
    """A value gna_interp cannot use; the message names it and what was expected."""


class GnaTypeError(GnaError, TypeError):
    """A value of the wrong kind (e.g. a list of prompts where a Task is expected); the
    message names it and what was expected."""


class SiteNotFiredError(GnaError, RuntimeError):
    """A hook a forward needed never ran: the model computed a site of the plan (or a read, a
    skip, a start) without calling the module it lives on, as a fused kernel does when it reads
    a module's weights instead of calling it. Its edit or capture would have been a silent no-op,
    so the forward raises instead; the message names the site (layer, kind) and the module path.

    ``need`` is what needed the hook (a `gna_interp.core.plan.Site`, a read, or a phrase) and
    ``path`` the module's dotted path in the HF model."""

    def __init__(self, message: str, need: object = None, path: str = "") -> None:
        super().__init__(message)
        self.need = need
        self.path = path


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (``...`` ends a cut one)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
