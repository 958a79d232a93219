"""Hub ids without a network: detect it once, in seconds, and say which model failed.

Left alone, ``from_pretrained`` on a machine that cannot reach the model hub retries
each file for half a minute and ends with a message that does not name the model.
Before loading a hub id, `hub_access` asks the hub once (one HEAD request, a few
seconds at most; the answer is kept for a minute):

- the hub answers: load as usual (a wrong id then fails with transformers' own error);
- it does not, and the model is in the local cache: load from the cache, no retries;
- it does not, and the model is not cached: `HubUnreachableError`, naming the model
  and what to do. ``HF_HUB_OFFLINE=1`` skips the probe and uses the cache only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core.errors import GnaError
from ..network import PROBE_TIMEOUT_S, hub_reachable


class HubUnreachableError(GnaError, OSError):
    """A hub id was asked for, the hub cannot be reached and the model is not cached."""


def is_cached(name: str, revision: str | None = None) -> bool:
    """Whether hub id ``name``'s ``config.json`` is in the local hub cache."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(name, "config.json", revision=revision)
    return isinstance(found, str)


def hub_access(name: str, revision: str | None = None) -> dict[str, Any]:
    """Keyword arguments for ``from_pretrained(name, ...)``: ``{}`` when the hub
    answers, ``{"local_files_only": True}`` when it does not but ``name`` is cached.

    Raises:
        HubUnreachableError: the hub cannot be reached (or ``HF_HUB_OFFLINE`` is set)
            and ``name`` is not in the local cache.
    """
    from huggingface_hub import constants

    offline = bool(constants.HF_HUB_OFFLINE)
    if not offline and hub_reachable():
        return {}
    if is_cached(name, revision):
        return {"local_files_only": True}
    where = f"the local cache ({constants.HF_HUB_CACHE})"
    if offline:
        raise HubUnreachableError(
            f"cannot load {name!r}: HF_HUB_OFFLINE is set and {name!r} is not in {where}; "
            "unset HF_HUB_OFFLINE on a machine with network access, or pass the model's local folder"
        )
    folder = "" if Path(name).exists() else f"; no local folder {name!r} exists either"
    raise HubUnreachableError(
        f"cannot load {name!r}: the model hub ({constants.ENDPOINT}) did not answer within {PROBE_TIMEOUT_S:.0f} s "
        f"and {name!r} is not in {where}{folder}; connect to the network, or download the model on another machine "
        "and pass its local folder (HF_HUB_OFFLINE=1 uses cached models without asking the hub)"
    )


NDIF_KEY_HELP = (
    "set NDIF_API_KEY in the environment (export NDIF_API_KEY=<your key>), or store the key once in nnsight's "
    "config: python -c \"from nnsight import CONFIG; CONFIG.set_default_api_key('<your key>')\" (keys: https://ndif.us)"
)
"""How to give nnsight an NDIF API key (quoted by the errors that need one)."""


def ndif_api_key() -> str | None:
    """The NDIF API key: ``NDIF_API_KEY``, else nnsight's stored config; ``None`` without one."""
    key = os.environ.get("NDIF_API_KEY")
    if key:
        return key
    try:
        from nnsight import CONFIG

        return getattr(CONFIG.API, "APIKEY", None) or None
    except Exception:  # pragma: no cover - nnsight config unreadable
        return None
