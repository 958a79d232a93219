"""Keywords at the front door: `suggest_keywords` makes a public function answer an
unexpected keyword (``max_head_per_role=``, ``batchsize=``) with a `GnaTypeError` naming it
and the parameters it was close to, instead of Python's bare ``TypeError``. `renamed` (and
`corrupt_before_metric`, for `ablation_sweep`'s old order) keeps an old spelling working for
one release (issue 53: one vocabulary), with a `FutureWarning` naming the new one."""

from __future__ import annotations

import difflib
import functools
import inspect
import warnings
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


def renamed_message(call: str, old: str, new: str) -> str:
    """The one wording of a rename's warning: what is old, what to write instead."""
    return f"{call}: {old} is renamed {new} (issue 53); the old name still works in this release and goes in the next: write {new}"


def renamed(**old_to_new: str) -> Callable[[F], F]:
    """Old keyword names that still work for one release: ``@renamed(show_progress="progress")``
    makes ``f(show_progress=False)`` call ``f(progress=False)`` with a `FutureWarning` naming
    the new keyword (`renamed_message`); both at once is a `GnaTypeError`. The signature stays
    ``function``'s (the new names only), so `inspect.signature` and `suggest_keywords` see the
    new vocabulary; put ``@renamed`` above ``@suggest_keywords``. ``__renamed__`` keeps the map."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise GnaTypeError(
                            f"{function.__name__}() got {old}= and {new}=: {old}= is the old name of {new}=, pass {new}= only"
                        )
                    warnings.warn(renamed_message(f"{function.__name__}()", f"{old}=", f"{new}="), FutureWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        call.__renamed__ = dict(old_to_new)  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorate


def corrupt_before_metric(function: F) -> F:
    """The old call of ``ablation_sweep(model, clean, metric, *, corrupt=None)`` kept working
    for one release, with a `FutureWarning`, now that every sweep's head is ``(model, clean,
    corrupt, metric)``: three positional arguments and no ``metric=`` are the old order, so
    the third is the metric and ``corrupt=`` (default None) moves before it; ``metric=`` with
    no ``corrupt`` (it had a default) is ``corrupt=None``."""
    order = "the order (model, clean, metric, corrupt=None)", "(model, clean, corrupt, metric)"

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 3 and "metric" not in kwargs:
            warnings.warn(renamed_message(f"{function.__name__}()", *order), FutureWarning, stacklevel=2)
            args = (*args[:2], kwargs.pop("corrupt", None), args[2])
        elif len(args) < 3 and "metric" in kwargs and "corrupt" not in kwargs:
            warnings.warn(renamed_message(f"{function.__name__}()", *order), FutureWarning, stacklevel=2)
            kwargs["corrupt"] = None
        return function(*args, **kwargs)

    return call  # type: ignore[return-value]
