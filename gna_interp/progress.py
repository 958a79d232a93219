"""Progress bars: one switch for every bar the library draws.

Every long loop (sweeps, scans, `evaluate` over many batches, path patching, training)
draws its bar through `progress_bar`. A bar is shown when the call asks for one
(``progress=True``, or its default) **and** bars are enabled:

- ``gna.set_progress(False)`` turns every bar off for the process (``True`` back on);
- the environment variable ``TQDM_DISABLE`` (``1``, ``true``, ``yes``), read at each
  bar, turns them off as it does for tqdm itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from .core.errors import GnaTypeError

_enabled = True


def set_progress(enabled: bool) -> None:
    """Turn every progress bar of the library on or off (default: on).

    Example::

        gna.set_progress(False)      # quiet notebooks and logs
    """
    global _enabled
    if not isinstance(enabled, bool):
        raise GnaTypeError(f"set_progress(enabled={enabled!r}): expected True or False")
    _enabled = enabled


def progress_enabled() -> bool:
    """Whether bars may be drawn: `set_progress` is on and ``TQDM_DISABLE`` is not set."""
    disabled = os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")
    return _enabled and not disabled


def progress_bar(items: Iterable[Any] | None = None, *, show: bool = True, desc: str = "", total: int | None = None) -> Any:
    """A transient tqdm bar over ``items`` (or a manual one of ``total`` steps), hidden
    when ``show`` is false or bars are off (`progress_enabled`)."""
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total, disable=not (show and progress_enabled()), leave=False)
