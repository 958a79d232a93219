"""``--model_args`` of the ``gna`` lm-eval model: which model to load, and which
interventions to run it with.

lm-eval splits ``--model_args`` on commas, so lists inside one value are joined with
``+``::

    pretrained=toy:llama,ablate=L1H0+L1H2,backend=nnsight
    pretrained=/models/llama-8b,truncate=18,ablate=L16H22
    pretrained=/models/zamba2-7b,mask_attention_rows=-1

Heads are written ``L16H22`` (a bare ``16.22`` reaches us as the float 16.22, whose
head cannot be told from ``16.220``: it is refused).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import Ablate, Intervention, MaskAttentionRows, SkipLayers, Truncate

TOY_PREFIX = "toy:"
LOAD_KEYS = ("pretrained", "backend", "tokenizer", "dtype", "device", "remote", "trust_remote_code")
INTERVENTION_KEYS = ("ablate", "skip_layers", "truncate", "mask_attention_rows")
ADAPTER_KEYS = ("batch_size", "max_length", "max_gen_toks", "prefix_token_id")
IGNORED_KEYS = ("max_batch_size",)
"""Passed by lm-eval's CLI to every model; batches here are `batch_size` forwards."""


@dataclass
class ModelArgs:
    """``--model_args`` sorted into what `load` takes, the interventions and the
    adapter's own settings."""

    pretrained: str
    load: dict[str, Any] = field(default_factory=dict)
    interventions: list[Intervention] = field(default_factory=list)
    adapter: dict[str, Any] = field(default_factory=dict)


def parse_model_args(args: Mapping[str, Any]) -> ModelArgs:
    """Sort and check ``--model_args`` (values as lm-eval's parser leaves them: ints,
    floats, bools or strings)."""
    known = (*LOAD_KEYS, *INTERVENTION_KEYS, *ADAPTER_KEYS, *IGNORED_KEYS)
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise GnaValueError(f"unknown gna model_args {unknown}: expected some of {list(known)}")
    if not args.get("pretrained"):
        raise GnaValueError("the gna model needs pretrained=: a model folder, a hub id, or toy:NAME for a bundled toy model")
    parsed = ModelArgs(pretrained=str(args["pretrained"]))
    for key in LOAD_KEYS[1:]:
        if args.get(key) is not None:
            parsed.load[key] = args[key]
    for key in ADAPTER_KEYS:
        value = None if args.get(key) is None else _batch_size(args[key]) if key == "batch_size" else _positive_int(key, args[key])
        if value is not None:
            parsed.adapter[key] = value
    if args.get("ablate") is not None:
        parsed.interventions.append(Ablate(_heads(args["ablate"])))
    if args.get("skip_layers") is not None:
        parsed.interventions.append(SkipLayers([_int("skip_layers", part) for part in _parts(args["skip_layers"])]))
    if args.get("truncate") is not None:
        parsed.interventions.append(Truncate(_int("truncate", args["truncate"])))
    if args.get("mask_attention_rows") is not None:
        parsed.interventions.append(MaskAttentionRows([_int("mask_attention_rows", part) for part in _parts(args["mask_attention_rows"])]))
    return parsed


def load_from_args(parsed: ModelArgs) -> Any:
    """The `GnaModel` that ``pretrained`` names: ``toy:NAME`` (a bundled toy model),
    a local folder or a hub id."""
    from ..models.loading import load
    from ..zoo import load_toy, toy_names

    options = dict(parsed.load)
    device = options.pop("device", None)
    remote = options.pop("remote", False)
    if remote not in (False, True, "local"):
        raise GnaValueError(f"remote={remote!r}: expected true (NDIF), local (nnsight's simulation) or false")
    if parsed.pretrained.startswith(TOY_PREFIX):
        name = parsed.pretrained[len(TOY_PREFIX) :]
        if name not in toy_names():
            raise GnaValueError(f"pretrained={parsed.pretrained!r}: no bundled toy {name!r}; bundled are {toy_names()}")
        extra = sorted(set(options) - {"backend"})
        if extra or remote:
            raise GnaValueError(f"pretrained={parsed.pretrained!r}: a bundled toy takes only backend=, got {extra or ['remote']}")
        return load_toy(name, backend=options.get("backend"))  # on the CPU, whatever --device says
    return load(parsed.pretrained, remote=remote, device=_available(device), **options)


def _available(device: Any) -> Any:
    """lm-eval's CLI asks for ``cuda:0`` unless told otherwise: without CUDA, the CPU
    (as lm-eval's HF model does)."""
    import torch

    if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
        logging.getLogger(__name__).warning("device %s is not available: running on the CPU", device)
        return None
    return device


def _parts(value: Any) -> list[Any]:
    return [part for part in str(value).split("+") if part] if isinstance(value, str) else [value]


def _heads(value: Any) -> list[Head]:
    if isinstance(value, float):
        raise GnaValueError(f"ablate={value!r}: write heads as L<layer>H<head>, e.g. ablate=L16H22 (a bare 16.22 is read as a number)")
    heads = [Head.parse(str(part)) for part in _parts(value)]
    if not heads:
        raise GnaValueError(f"ablate={value!r}: expected heads such as L16H22, joined by + (L16H22+L17H24)")
    return heads


def _int(key: str, value: Any) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise GnaValueError(f"{key}={value!r}: expected an int (several joined by +)") from None


def _positive_int(key: str, value: Any) -> int:
    number = _int(key, value)
    if number < (0 if key == "prefix_token_id" else 1):
        raise GnaValueError(f"{key}={value!r}: expected a {'token id' if key == 'prefix_token_id' else 'positive int'}")
    return number


def _batch_size(value: Any) -> int | None:
    """lm-eval's ``--batch_size`` (a string: ``8``, ``auto``, ``auto:4``); ``auto`` keeps
    the adapter's default (no search: forwards here are cheap to size by hand)."""
    if isinstance(value, str) and value.startswith("auto"):
        return None
    return _positive_int("batch_size", value)
