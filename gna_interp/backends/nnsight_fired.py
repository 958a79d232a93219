"""What a forward on the nnsight backend did not reach: a step whose module the model never
called (a fused kernel computing a mixer through its modules' weights calls none of them).

Locally every step counts its firings (`nnsight_program.apply_steps`, ``fired``); a step left
at 0 is the one missed. Remotely (NDIF, or ``remote="local"``) the counts stay on the server,
and the missed step is read from nnsight's own error, which names the location the program
waited for (``'model.<path>.input.i0' was requested but the model already ran past it``).
Either way the forward raises `gna_interp.core.errors.SiteNotFiredError` naming the site and
the module path, instead of returning a forward in which an edit or a capture silently did
nothing.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from ..core.errors import SiteNotFiredError
from ..core.plan import Plan, Read, Site
from .nnsight_program import Op

_WAITED = re.compile(r"'[^'.]+\.([^']+?)\.(?:input|inputs|output)\.i\d+' was requested but the model already ran past it")
"""nnsight's error for a location a program waited for and the model never reached:
the module path (without the envoy root's name)."""

Need = tuple[Plan, Collection[Site], Sequence[Read]]
"""A forward's plan, captures and reads: what its steps were built from."""


def missed_path(steps: Sequence[tuple], fired: Sequence[int] | None, error: BaseException | None) -> str | None:
    """The module path of the step the forward missed, or ``None``. With ``error`` (the trace
    failed): the location nnsight's error names, if it is that error (any other failure, e.g.
    an edit of the wrong shape, is not a missed module, though later steps never ran). Without:
    the first step that fired 0 times (``fired``: counts per step; ``None`` when they stayed on
    a server)."""
    if error is not None:
        found = _WAITED.search(str(error))
        return found.group(1) if found else None
    for step, count in zip(steps, fired or [], strict=False):
        if count == 0:
            return str(step[1])
    return None


def not_fired(backend: Any, path: str, needs: Sequence[Need]) -> SiteNotFiredError:
    """The error for module ``path`` never called, naming the site (or read, skip, start) of
    ``needs`` whose step addresses that module (`NNsightBackend.steps` of it alone)."""
    what: object = None
    for plan, capture, reads in needs:
        alone = Plan(start=plan.start)  # the occurrences of shared modules count from the start block
        for need in sorted(site for site in set(plan.edits) | set(capture) if site.layer >= plan.start_layer):
            what = what or (need if path in _paths(backend.steps(alone, [need])) else None)
        for read in reads:
            what = what or (read if read.layer >= plan.start_layer and path in _paths(backend.steps(alone, (), [read])) else None)
        what = what or next((f"skip of block {layer}" for layer in plan.skips if backend.spec.block_path(layer) == path), None)
    if what is None and path == backend.unembedding_path:
        what = "narrowing of the logits to the last positions"
    if isinstance(what, Site):
        named = f"the plan's {what.describe()}"
    elif isinstance(what, Read):
        named = f"the {what.kind.value} read{f' {what.name!r}' if what.name else ''} at layer {what.layer}, mixer {what.mixer}"
    else:
        named = f"the plan's {what}" if what else "a step of the plan"
    return SiteNotFiredError(
        f"backend 'nnsight': module {path!r} was never called in this forward (its step was never served): {named} was "
        "neither edited nor read. The model computed it without calling that module, as a fused kernel does (one "
        "that reads the module's weights): run the model on its PyTorch path (without the kernel package) to hook it",
        what,
        path,
    )


def _paths(steps: Sequence[tuple]) -> set[str]:
    """The module paths ``steps`` address, blocks that are not run left out."""
    return {str(step[1]) for step in steps if step[0] != Op.NOT_RUN}


def check_fired(
    backend: Any, steps: Sequence[tuple], fired: Sequence[int] | None, error: BaseException | None, needs: Sequence[Need]
) -> None:
    """Raise `SiteNotFiredError` (from ``error``, if any) when a step of ``steps`` was missed."""
    path = missed_path(steps, fired, error)
    if path is not None:
        raise not_fired(backend, path, needs) from error
