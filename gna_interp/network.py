"""Is the hub there? One probe, in seconds, shared by model and dataset loading.

Left alone, ``from_pretrained`` and ``datasets.load_dataset`` on a machine that cannot reach
the hub retry each file for half a minute. `hub_reachable` asks once (one HEAD request, at
most `PROBE_TIMEOUT_S`) and keeps the answer for `PROBE_TTL_S`, so callers can fail fast
with a message that says what to do instead. Imports nothing from the package.
"""

from __future__ import annotations

import time

PROBE_TIMEOUT_S = 3.0
"""How long the one reachability probe may take."""
PROBE_TTL_S = 60.0
"""How long a probe's answer is reused (a notebook that gets its network back retries after this)."""

_probes: dict[str, tuple[float, bool]] = {}
"""Endpoint -> (time of the probe, reachable)."""


def hub_reachable(endpoint: str | None = None) -> bool:
    """Whether the hub answers an HTTP request within `PROBE_TIMEOUT_S` (any status
    counts: only a transport failure means unreachable). Probed once per `PROBE_TTL_S`,
    through huggingface_hub's own session (so its proxies apply)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    url = endpoint or constants.ENDPOINT
    now = time.monotonic()
    seen = _probes.get(url)
    if seen is not None and now - seen[0] < PROBE_TTL_S:
        return seen[1]
    try:
        get_session().head(url, timeout=PROBE_TIMEOUT_S)
        reachable = True
    except Exception:  # DNS, refused, timeout, TLS: the hub cannot be used
        reachable = False
    _probes[url] = (time.monotonic(), reachable)
    return reachable
