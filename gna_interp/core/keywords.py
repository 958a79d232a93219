"""Keyword typos at the front door: `suggest_keywords` makes a public function answer an
unexpected keyword (``max_head_per_role=``, ``batchsize=``) with a `GnaTypeError` naming it
and the parameters it was close to, instead of Python's bare ``TypeError``."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import GnaTypeError

F = TypeVar("F", bound=Callable[..., Any])

_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unexpected_keyword(call: str, key: str, names: list[str]) -> GnaTypeError:
    """The error for ``call(key=...)`` where ``call`` takes the keywords ``names``: the keyword,
    its close matches (`difflib`) and every keyword ``call`` takes."""
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    hint = f": did you mean {' or '.join(f'{name}=' for name in close)}?" if close else ""
    return GnaTypeError(f"{call}() got an unexpected keyword argument {key!r}{hint} ({call} takes {', '.join(names)})")


def suggest_keywords(function: F) -> F:
    """``function``, checking its keyword arguments first: an unknown one raises
    `unexpected_keyword`. The signature, name and docstring stay ``function``'s
    (`functools.wraps`: `inspect.signature` reads through it); a function with ``**kwargs``
    takes any keyword and is returned as it is."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return function
    names = [p.name for p in parameters if p.kind in _BY_NAME]
    known = frozenset(names)

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for key in kwargs:
            if key not in known:
                raise unexpected_keyword(function.__name__, key, names)
        return function(*args, **kwargs)

    return checked  # type: ignore[return-value]
