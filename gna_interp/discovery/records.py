"""The stage records (`stage_records`) and the accuracy memo's keys to JSON and back,
exactly: what a run directory's files hold (`run_dir.RunDir`). Floats keep every bit
(JSON's shortest repr round-trips; NaN and infinities as ``NaN`` / ``Infinity``, which
Python's ``json`` reads); tensors as their dtype, shape and base64 bytes; heads as
``"L0H3"``. A record is its fields by name (`record_to_dict`): those JSON does not hold go
through `CODECS`, by field name."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import SkipLayers, Truncate
from ..scoring.evaluation import Evaluation
from ..scoring.verdicts import Verdict
from . import head_scans, remote
from .evidence import HeadEvidence, RoleNeed, SpreadRole
from .group_testing import SpreadGroup
from .positions import PositionScan
from .roles import RoleScores, RoleThresholds, scores_from_dict
from .stage_records import RECORDS, LabelInputs, Record

if TYPE_CHECKING:
    from .context import Context


def tensor_to_dict(tensor: Tensor) -> dict[str, Any]:
    """``{"dtype", "shape", "data"}``: the tensor's bytes, base64 (exact, NaN included)."""
    data = tensor.detach().cpu().contiguous()
    return {
        "dtype": str(data.dtype).removeprefix("torch."),
        "shape": list(data.shape),
        "data": base64.b64encode(data.numpy().tobytes()).decode(),
    }


def tensor_from_dict(data: dict[str, Any]) -> Tensor:
    raw = bytearray(base64.b64decode(data["data"]))
    dtype = getattr(torch, data["dtype"])
    return torch.frombuffer(raw, dtype=dtype).reshape(data["shape"]).clone() if raw else torch.zeros(data["shape"], dtype=dtype)


def _heads(heads: Any) -> list[str] | None:
    return None if heads is None else [str(h) for h in heads]


def _parse(heads: list[str] | None) -> list[Head] | None:
    return None if heads is None else [Head.parse(h) for h in heads]


def _scores(scores: dict[Head, RoleScores]) -> list[list[Any]]:
    return [[str(h), s.to_dict()] for h, s in scores.items()]


def _read_scores(data: list[list[Any]]) -> dict[Head, RoleScores]:
    return {Head.parse(h): scores_from_dict(s) for h, s in data}


def _evaluation(item: Evaluation | None) -> dict[str, Any] | None:
    return None if item is None else {"scores": tensor_to_dict(item.scores), "correct": tensor_to_dict(item.correct)}


def _read_evaluation(data: dict[str, Any] | None) -> Evaluation | None:
    return None if data is None else Evaluation(tensor_from_dict(data["scores"]), tensor_from_dict(data["correct"]))


def _first(item: remote.FirstScans | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return {
        "clean": _evaluation(item.clean),
        "shuffled": _evaluation(item.shuffled),
        "truncation": item.truncation,
        "layer_ranges": [[a, b, v] for (a, b), v in item.layer_ranges.items()],
        "groups": [[_heads(g), v] for g, v in item.groups.items()],
    }


def _read_first(data: dict[str, Any] | None) -> remote.FirstScans | None:
    if data is None:
        return None
    ranges = {(a, b): v for a, b, v in data["layer_ranges"]}
    groups = {tuple(_parse(g) or ()): v for g, v in data["groups"]}
    shuffled = _read_evaluation(data["shuffled"]) if isinstance(data["shuffled"], dict) else None  # a number: written before
    return remote.FirstScans(_read_evaluation(data["clean"]), shuffled, data["truncation"], ranges, groups)  # type: ignore[arg-type]


def _early(item: head_scans.FirstOrder | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return {
        "heads": _heads(sorted(item.heads)),
        "estimates": tensor_to_dict(item.estimates),
        **{k: getattr(item, k) for k in ("baselines", "rows", "steps")},
    }


def _read_early(data: dict[str, Any] | None) -> head_scans.FirstOrder | None:
    if data is None:
        return None
    return head_scans.FirstOrder(
        frozenset(_parse(data["heads"]) or ()), tensor_from_dict(data["estimates"]), data["baselines"], data["rows"], data["steps"]
    )


def _scan(scan: head_scans.HeadScan | None) -> dict[str, Any] | None:
    """A head scan without its remote search in flight (``in_flight`` says there was one:
    `scan_in_flight`); its ``measure`` as a flag (`head_scans.group_measure` rebuilds it);
    ``unsearched`` as indices into ``spread``."""
    if scan is None:
        return None
    return {
        "accuracy": tensor_to_dict(scan.accuracy),
        "verified": tensor_to_dict(scan.verified),
        "spread": [g.to_dict() for g in scan.spread],
        "inside": [[_heads(sorted(group)) for group in g.inside] for g in scan.spread],  # what spares their search
        "tests": [[layer, n] for layer, n in scan.tests.items()],
        "unsearched": [next(i for i, g in enumerate(scan.spread) if g is item) for item in scan.unsearched],
        "measure": scan.measure is not None,
        "cleared": _heads(scan.cleared),
        "clean": scan.clean,
        "min_effect": scan.min_effect,
        "in_flight": scan.search is not None,
    }


def _read_scan(data: dict[str, Any] | None) -> head_scans.HeadScan | None:
    if data is None:
        return None
    spread = [SpreadGroup.from_dict(g) for g in data["spread"]]
    for group, inside in zip(spread, data.get("inside", []), strict=False):  # absent from a record written before it
        group.inside = [frozenset(_parse(heads) or ()) for heads in inside]
    scan = head_scans.HeadScan(
        tensor_from_dict(data["accuracy"]), tensor_from_dict(data["verified"]), spread, dict(map(tuple, data["tests"]))
    )
    scan.unsearched = [spread[i] for i in data["unsearched"]]
    scan.measure = "group" if data["measure"] else None  # type: ignore[assignment]  # rebuilt by the run directory
    scan.cleared, scan.clean, scan.min_effect = _parse(data["cleared"]) or [], data["clean"], data["min_effect"]
    return scan


HEAD_LISTS = ("only", "quiet", "candidates", "harmful", "ahead", "gather", "aggregate")
"""Record fields that hold a list of heads (``None`` kept)."""


def _evidence(items: dict[Head, HeadEvidence]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in items.values()]


def _read_evidence(data: list[dict[str, Any]]) -> dict[Head, HeadEvidence]:
    return {item.head: item for item in (HeadEvidence.from_dict(e) for e in data)}


def _evidence_list(items: list[HeadEvidence] | None) -> list[dict[str, Any]] | None:
    return None if items is None else [e.to_dict() for e in items]


def _read_evidence_list(data: list[dict[str, Any]] | None) -> list[HeadEvidence] | None:
    return None if data is None else [HeadEvidence.from_dict(e) for e in data]


def _labels(labels: LabelInputs | None) -> dict[str, Any] | None:
    return None if labels is None else {"scores": _scores(labels.scores), "thresholds": labels.thresholds.to_dict(), "clean": labels.clean}


def _read_labels(data: dict[str, Any] | None) -> LabelInputs | None:
    if data is None:
        return None
    thresholds = RoleThresholds(**{f.name: data["thresholds"][f.name] for f in fields(RoleThresholds)})
    return LabelInputs(_read_scores(data["scores"]), thresholds, data["clean"])


CODECS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "clean": (_evaluation, _read_evaluation),
    "first": (_first, _read_first),
    "early": (_early, _read_early),
    "scan": (_scan, _read_scan),
    "evidence": (_evidence, _read_evidence),
    "labels": (_labels, _read_labels),
    "measured": (_scores, _read_scores),
    "needs": (lambda d: {r: n.to_dict() for r, n in d.items()}, lambda d: {r: RoleNeed.from_dict(n) for r, n in d.items()}),
    "spread": (lambda d: {r: s.to_dict() for r, s in d.items()}, lambda d: {r: SpreadRole.from_dict(s) for r, s in d.items()}),
    "position_scan": (lambda p: None if p is None else p.to_dict(), lambda d: None if d is None else PositionScan.from_dict(d)),
    "positions": (lambda p: None if p is None else p.to_dict(), lambda d: None if d is None else PositionScan.from_dict(d)),
    "heads": (
        lambda h: None if h is None else [e.to_dict() for e in h],
        lambda d: None if d is None else [HeadEvidence.from_dict(e) for e in d],
    ),
    "order": (
        lambda d: None if d is None else [[layer, _heads(heads)] for layer, heads in d.items()],
        lambda d: None if d is None else {int(layer): _parse(heads) for layer, heads in d},
    ),
    "verdicts": (lambda d: {k: v.to_dict() for k, v in d.items()}, lambda d: {k: Verdict.from_dict(v) for k, v in d.items()}),
    **{name: (_heads, _parse) for name in HEAD_LISTS},
}
"""Per record field of a kind JSON does not hold, its writer and reader; other fields are
JSON values already (numbers, strings, lists and dicts of them)."""


def record_to_dict(record: Record) -> dict[str, Any]:
    """``record`` as JSON-ready values (module docs), with its ``stage``."""
    data = {f.name: CODECS.get(f.name, (_plain, _plain))[0](getattr(record, f.name)) for f in fields(record)}
    return {"stage": record.stage, **data}


def record_from_dict(data: dict[str, Any], ctx: Context) -> Record:
    """The record of `record_to_dict`; a head scan's group measure rebuilt on ``ctx``'s model and task."""
    kind = next((k for k in RECORDS if k.stage == data.get("stage")), None)
    if kind is None:
        raise GnaValueError(f"a saved record of stage {data.get('stage')!r}: expected one of {[k.stage for k in RECORDS]}")
    required = [f.name for f in fields(kind) if f.name not in data and f.default is MISSING and f.default_factory is MISSING]
    if required:
        raise GnaValueError(f"a saved record of stage {kind.stage!r} lacks {required}: expected every field of {kind.__name__}")
    values = {f.name: CODECS.get(f.name, (_plain, _plain))[1](data[f.name]) for f in fields(kind) if f.name in data}  # absent: its default
    scan = values.get("scan")
    if scan is not None and scan.measure == "group":  # `_scan`: rebuilt here
        scan.measure = head_scans.group_measure(ctx.model, ctx.task)
    return kind(**values)


def _plain(value: Any) -> Any:
    return value


def scan_in_flight(data: dict[str, Any]) -> bool:
    """Whether a saved record (`record_to_dict`) holds a head scan whose remote search was
    still in flight (`HeadScan.search`; read back without it: only a later record's finished scan counts)."""
    return bool((data.get("scan") or {}).get("in_flight"))


def key_to_json(value: Any) -> Any:
    """A memo key (`memo.memo_key`'s parts: strings, numbers, ``None``, tuples, `Head`,
    bytes, `SkipLayers`, `Truncate`) as JSON: a tuple ``{"t": [...]}``, a head ``{"h":
    "L0H3"}``, bytes ``{"b": base64}``, ``{"skip": layers}``, ``{"truncate": n}``."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, Head):
        return {"h": str(value)}
    if isinstance(value, tuple):
        return {"t": [key_to_json(v) for v in value]}
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode()}
    if isinstance(value, SkipLayers):
        return {"skip": list(value.layers)}
    if isinstance(value, Truncate):
        return {"truncate": value.n_layers}
    raise GnaValueError(f"memo key part {value!r} ({type(value).__name__}): not a kind the run directory writes")


def key_from_json(value: Any) -> Any:
    """The memo key of `key_to_json`."""
    if not isinstance(value, dict):
        return value
    if "h" in value:
        return Head.parse(value["h"])
    if "t" in value:
        return tuple(key_from_json(v) for v in value["t"])
    if "b" in value:
        return base64.b64decode(value["b"])
    if "skip" in value:
        return SkipLayers(value["skip"])
    return Truncate(value["truncate"])
