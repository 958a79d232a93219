"""`plan.State` and the accuracy memo's keys to JSON and back, exactly: what a run
directory's files hold (`run_dir.RunDir`). Floats keep every bit (JSON's shortest repr
round-trips; NaN and infinities as ``NaN`` / ``Infinity``, which Python's ``json`` reads);
tensors as their dtype, shape and base64 bytes; heads as ``"L0H3"``."""

from __future__ import annotations

import base64
from dataclasses import fields
from typing import Any

import torch
from torch import Tensor

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import SkipLayers, Truncate
from ..scoring.evaluation import Evaluation
from . import head_scans, remote
from .circuit import GnaCircuit
from .evidence import HeadEvidence
from .group_testing import SpreadGroup
from .plan import State
from .roles import RoleScores, RoleThresholds, scores_from_dict
from .stages import LabelInputs


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


def _read_shuffled(data: Any) -> Evaluation | None:
    """The shuffled-label evaluation; a run directory written before it was kept holds its
    accuracy only (a number): ``None``, and the label check measures it again."""
    return _read_evaluation(data) if isinstance(data, dict) else None


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
    return remote.FirstScans(_read_evaluation(data["clean"]), _read_shuffled(data["shuffled"]), data["truncation"], ranges, groups)  # type: ignore[arg-type]


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
    """A head scan without its remote search in flight (`State.resumable`); its ``measure``
    as a flag (`head_scans.group_measure` rebuilds it); ``unsearched`` as indices into ``spread``."""
    if scan is None:
        return None
    return {
        "accuracy": tensor_to_dict(scan.accuracy),
        "verified": tensor_to_dict(scan.verified),
        "spread": [g.to_dict() for g in scan.spread],
        "tests": [[layer, n] for layer, n in scan.tests.items()],
        "unsearched": [next(i for i, g in enumerate(scan.spread) if g is item) for item in scan.unsearched],
        "measure": scan.measure is not None,
        "cleared": _heads(scan.cleared),
        "clean": scan.clean,
        "min_effect": scan.min_effect,
    }


def _read_scan(data: dict[str, Any] | None) -> head_scans.HeadScan | None:
    if data is None:
        return None
    spread = [SpreadGroup.from_dict(g) for g in data["spread"]]
    scan = head_scans.HeadScan(
        tensor_from_dict(data["accuracy"]), tensor_from_dict(data["verified"]), spread, dict(map(tuple, data["tests"]))
    )
    scan.unsearched = [spread[i] for i in data["unsearched"]]
    scan.measure = "group" if data["measure"] else None  # type: ignore[assignment]  # rebuilt by the run directory
    scan.cleared, scan.clean, scan.min_effect = _parse(data["cleared"]) or [], data["clean"], data["min_effect"]
    return scan


def state_to_dict(state: State) -> dict[str, Any]:
    """``state`` as JSON-ready values (module docs). The evidence of a circuit whose
    ``heads`` hold it is kept once, there."""
    circuit = state.circuit
    shared = circuit is not None and bool(circuit.heads)
    labels = state.labels
    return {
        "circuit": None if circuit is None else circuit.to_dict(finite=False),
        "clean": _evaluation(state.clean),
        "first": _first(state.first),
        "early": _early(state.early),
        "done": state.done,
        "only": _heads(state.only),
        "adaptive": list(state.adaptive),
        "quiet": _heads(state.quiet),
        "scan": _scan(state.scan),
        "candidates": _heads(state.candidates),
        "evidence": [str(h) for h in state.evidence] if shared else [e.to_dict() for e in state.evidence.values()],
        "harmful": _heads(state.harmful),
        "labels": None
        if labels is None
        else {"scores": _scores(labels.scores), "thresholds": labels.thresholds.to_dict(), "clean": labels.clean},
        "ahead": _heads(state.ahead),
        "measured": _scores(state.measured),
        "positions_pending": state.positions_pending,
    }


def state_from_dict(data: dict[str, Any]) -> State:
    """The `State` of `state_to_dict`."""
    circuit = None if data["circuit"] is None else GnaCircuit.from_dict(data["circuit"])
    if circuit is not None and circuit.heads:  # the same objects as the circuit's heads
        held = {e.head: e for e in circuit.heads}
        evidence = {Head.parse(h): held[Head.parse(h)] for h in data["evidence"]}
    else:
        evidence = {item.head: item for item in (HeadEvidence.from_dict(e) for e in data["evidence"])}
    labels = data["labels"]
    state = State(
        circuit=circuit,
        clean=_read_evaluation(data["clean"]),
        first=_read_first(data["first"]),
        early=_read_early(data["early"]),
        done=data["done"],
        only=_parse(data["only"]),
        adaptive=list(data["adaptive"]),
        quiet=_parse(data["quiet"]) or [],
        scan=_read_scan(data["scan"]),
        candidates=_parse(data["candidates"]) or [],
        evidence=evidence,
        harmful=_parse(data["harmful"]) or [],
        ahead=_parse(data["ahead"]) or [],
        measured=_read_scores(data["measured"]),
        positions_pending=data.get("positions_pending"),
    )
    if labels is not None:
        thresholds = RoleThresholds(**{f.name: labels["thresholds"][f.name] for f in fields(RoleThresholds)})
        state.labels = LabelInputs(_read_scores(labels["scores"]), thresholds, labels["clean"])
    return state


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
