"""Benchmark: what `gna.discover` costs at depth, locally and under NDIF's simulation.

What is measured
----------------
For each family (``llama``: TransformerLens bridge locally; ``mamba2``: nnsight) and each
depth ``L`` (default 2, 8, 32), ``gna.zoo.deep.deep_toy(family, L)``: the bundled toy's two
layers at ``L/2 - 1`` and ``L/2`` of an ``L``-layer model whose other layers' output
projections are zero, so it computes the toy exactly (``L = 2`` is the toy). On the same
prompts (``gna.toy_task``, ``--prompts``, seed ``--seed``):

``local``
    ``gna.discover(model, task)`` under `gna.cost_meter`: forwards, passes
    (``block_rows / (prompts x L)``: rows x blocks evaluated, over one full pass of the
    task), backward passes (the prescreen's attribution), wall time. The heads found must
    be the toy's, shifted by ``L/2 - 1`` layers, with the toy's accuracies (else FAIL).
``remote``
    The same model loaded with ``remote="local"`` (nnsight's in-process simulation of
    NDIF: every request serialised, local modules hidden, run): requests (round trips)
    and whether the circuit equals the local one (roles, heads, accuracies, needs,
    curves, path patching; pattern scores to 1e-5; not the attribution estimate and the
    prescreen's method, which a remote run has not: no local backward; not the group
    forwards of wide layers, which a remote run spends differently: staged group testing,
    `gna_interp.discovery.scans.StagedGroupTesting`, with the adaptive scan's findings).
``hand``
    The paper's hand procedure in passes, each evaluation a full forward: truncation scan
    (``L``) + layer scan (``L``) + single-head scan of two layers (``2 x heads``) + the
    clean run.

Then, on the 2-layer toys, the rank correlation (Spearman, live heads) of the
prescreen's estimate (zero-ablation attribution of the candidate logit difference) with
the exact zero-ablation effect on the same metric.

Timing is wall clock on whatever machine runs it; the counts do not depend on it.

``--families`` takes any toy `deep_toy` builds: a bundled toy's name (``llama``, ``mamba2``,
``mamba`` once the Mamba-1 toy is bundled) or a trained toy's folder. ``--width W`` makes
the Mamba-1 toys wide (``deep_toy(..., width=W)``: the toy's channels among live filler
channels, every layer ``W`` wide); their heads are then expected at `deep_head`'s places,
and the accuracies within 0.02 of the toy's (the filler perturbs the logits a little).

Run: ``python benchmarks/discover_scale.py [--layers 2 8 32] [--families llama mamba2]
[--width 4096] [--prompts 200] [--no-remote] [--device cuda] [--json PATH]``
"""

from __future__ import annotations

import copy
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from _common import parser, set_threads, spearman, write_json

import gna_interp as gna

# Private, on purpose: gna_interp.zoo.deep builds the deep copies of a toy this benchmark
# scales (no public builder), and `Payloads` wraps NNsightBackend's request and session
# methods to count the bytes a remote run sends and receives.
from gna_interp.zoo.deep import deep_head, deep_toy, placed_channels


class Payloads:
    """Bytes of every request a remote run sends (nnsight's own serialisation of the
    request, as `remote="local"` does it) and of what each session returns (its tensors)."""

    def __init__(self) -> None:
        from nnsight.schema.request import RequestModel

        # Private: NNsightBackend's methods, wrapped to count bytes (see the note at the imports).
        from gna_interp.backends.nnsight import NNsightBackend

        self.sent: list[int] = []
        self.returned: list[int] = []
        self.originals = (RequestModel.serialize, NNsightBackend._session, NNsightBackend.run_greedy)
        serialize, session, greedy = self.originals
        payloads = self

        def measured_serialize(tracer: Any, compress: bool = False) -> bytes:
            blob = serialize(tracer, compress)
            payloads.sent.append(len(blob))
            return blob

        def measured_session(backend: Any, jobs: Any, group: Any, own: Any) -> Any:
            outputs = session(backend, jobs, group, own)
            payloads.returned.append(sum(tensor_bytes(out) for out in outputs))
            return outputs

        def measured_greedy(backend: Any, problem: Any) -> Any:
            result = greedy(backend, problem)
            payloads.returned.append(0)  # head ids and accuracies: a few hundred bytes
            return result

        RequestModel.serialize = staticmethod(measured_serialize)  # type: ignore[method-assign]
        NNsightBackend._session = measured_session  # type: ignore[method-assign]
        NNsightBackend.run_greedy = measured_greedy  # type: ignore[method-assign]

    def close(self) -> None:
        from nnsight.schema.request import RequestModel

        # Private: NNsightBackend's methods, wrapped to count bytes (see the note at the imports).
        from gna_interp.backends.nnsight import NNsightBackend

        RequestModel.serialize = staticmethod(self.originals[0])  # type: ignore[method-assign]
        NNsightBackend._session, NNsightBackend.run_greedy = self.originals[1], self.originals[2]  # type: ignore[method-assign]


def tensor_bytes(out: Any) -> int:
    if out is None:
        return 0
    tensors = [out.logits, *out.acts.values(), *out.reads]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def device_name(device: str) -> str:
    """``"cpu"``, or the GPU's name (which card gave the figures)."""
    import torch

    return torch.cuda.get_device_name(device) if str(device).startswith("cuda") else str(device)


def discover(model: gna.GnaModel, task: Any, progress: bool = False) -> tuple[gna.GnaCircuit, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a toy that answers by place warns; the circuit keeps the note
        start = time.perf_counter()
        circuit = gna.discover(model, task, progress=progress)
    return circuit, time.perf_counter() - start


def shifted(heads: list[gna.Head], by: int) -> list[str]:
    return [str(gna.Head(h.layer + by, h.head)) for h in heads]


def same_circuit(a: dict, b: dict, path: str = "", backends_differ: bool = False) -> bool:
    """Equal, pattern scores to 1e-5 (see tests/test_sessions.py); where the two runs' backends
    differ (a TransformerLens model against its nnsight remote), the logit metrics of path
    patching and of MIB's score too (float32 rounding of another implementation). A head's
    entry scan: the remote run (``a``) measures all three position sets in its one request,
    the local one only those a label reads; the local values must be the remote's. A spread
    role's size curve (`discover`'s, local only) is left out."""
    if isinstance(a, dict) and isinstance(b, dict) and path.endswith("/entry"):
        if not set(b) <= set(a) or "segments" not in b:
            return False
        a = {key: a[key] for key in b}
    if isinstance(a, dict) and isinstance(b, dict) and (path == "/settings" or path.startswith("/spread/")):
        # a spread role's size curve is local only (its ordering's attribution needs a local backward)
        local_only = {"size_curve"} if path == "/settings" else {"sizes", "order", "heads_for_half", "size"}
        if any(a.get(key) for key in local_only):
            return False
        a, b = ({k: v for k, v in d.items() if k not in local_only} for d in (a, b))
    if isinstance(a, dict):
        return set(a) == set(b) and all(same_circuit(a[k], b[k], f"{path}/{k}", backends_differ) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_circuit(x, y, path, backends_differ) for x, y in zip(a, b, strict=True))
    rounded = "/scores/" in path or (backends_differ and path.startswith(("/path_patching/", "/score/")))
    if isinstance(a, float) and isinstance(b, float) and rounded:
        return abs(a - b) <= 1e-5 * max(1.0, abs(b))
    return bool(a == b)


def load_toy(name: str) -> gna.GnaModel:
    """A bundled toy by name, or a trained toy's folder."""
    return gna.load_toy(name) if name in gna.toy_names() else gna.load(name)


def prescreen_agreement(family: str, prompts: int, seed: int) -> dict[str, Any]:
    model, task = load_toy(family), gna.toy_task(family, prompts, seed=seed)
    encoded = task.encode()
    metric = gna.candidate_logit_diff(encoded.candidate_ids, encoded.correct)
    estimate = gna.patching.ablation_attribution(model, task, metric)
    exact = gna.ablation_sweep(model, task, None, metric, progress=False)
    a, b = (estimate.scores - estimate.baseline).flatten(), (exact.scores - exact.baseline).flatten()
    live = ~b.isnan() & ((a.abs() > 0) | (b.abs() > 0))
    return {"live": int(live.sum()), "spearman": spearman(a[live], b[live]), "sign_agrees": int(((a[live] > 0) == (b[live] > 0)).sum())}


def main(argv: list[str] | None = None) -> int:
    arguments = parser(__doc__, threads=1)
    arguments.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    arguments.add_argument("--families", nargs="+", default=["llama", "mamba2_counting"], help="bundled toys or trained toys' folders")
    arguments.add_argument("--width", type=int, default=None, help="Mamba-1 toys only: channels per layer (deep_toy's width)")
    arguments.add_argument("--prompts", type=int, default=200)
    arguments.add_argument("--seed", type=int, default=4242)
    arguments.add_argument("--no-remote", action="store_true", help="skip the remote='local' runs")
    arguments.add_argument("--progress", action="store_true", help="discover's stage bar (on stderr) for the local runs")
    arguments.add_argument("--device", default="cpu", help="where the deep models run (the 2-layer toys stay on the CPU)")
    args = arguments.parse_args(argv)
    set_threads(args.threads)
    rows, failed = [], False
    for family in args.families:
        task = gna.toy_task(family, args.prompts, seed=args.seed)
        toy_model = load_toy(family)
        wide = args.width is not None and toy_model.arch.family == "mamba"
        channels = placed_channels(toy_model.heads_per_layer[0], args.width) if wide else None
        toy = None
        for n_layers in args.layers:
            model = deep_toy(family, n_layers, width=args.width if wide else None, device=args.device)
            at = max(0, n_layers // 2 - 1)
            circuit, seconds = discover(model, task, args.progress)  # discover meters itself: circuit.cost
            toy = toy or (circuit if n_layers == toy_model.n_layers and not wide else discover(toy_model, task)[0])
            found = circuit.gather == [deep_head(h, at, channels) for h in toy.gather] and circuit.aggregate == [
                deep_head(h, at, channels) for h in toy.aggregate
            ]
            if wide:  # the filler moves the logits a little
                found &= all(abs(circuit.accuracy[k] - toy.accuracy[k]) <= 0.02 for k in ("clean", "chance"))
            else:
                found &= circuit.accuracy == toy.accuracy
            failed |= not found
            heads_per_layer = max(model.heads_per_layer)
            row = {
                "family": family,
                "layers": n_layers,
                "width": max(model.heads_per_layer),
                "backend": model.backend_name,
                "gather": [str(h) for h in circuit.gather],
                "aggregate": [str(h) for h in circuit.aggregate],
                "toy_heads_shifted": found,
                "forwards": circuit.cost["forwards"],
                "rows": circuit.cost["rows"],
                "passes": circuit.cost["passes"],
                "backwards": circuit.cost["backwards"],
                "prescreen": circuit.settings.get("prescreen"),
                "group_tests": circuit.settings.get("group_testing"),
                "seconds": seconds,
                "hand_passes": 1 + 2 * n_layers + 2 * heads_per_layer,
                "device": device_name(args.device),
            }
            if not args.no_remote:
                remote = gna.load(copy.deepcopy(model.hf_model), tokenizer=model.tokenizer, remote="local")
                remote.name = model.name
                payloads = Payloads()
                try:
                    remote_circuit, remote_seconds = discover(remote, task)
                finally:
                    payloads.close()
                a, b = remote_circuit.to_dict(), circuit.to_dict()
                for data in (a, b):
                    data.pop("cost")
                    data.pop("attribution")  # a remote run has no local backward
                    data["settings"].pop("prescreen", None)  # so it says its prescreen was forward-only
                    data["settings"].pop("group_testing", None)  # the staged design's group forwards (same findings)
                    data["settings"].pop("estimate")  # a remote model has no prefix cache: its scans cost more passes
                equal = same_circuit(a, b, backends_differ=remote.backend_name != model.backend_name)
                failed |= not equal
                row |= {
                    "requests": remote_circuit.cost["requests"],
                    "remote_forwards": remote_circuit.cost["forwards"],
                    "remote_passes": remote_circuit.cost["passes"],
                    "remote_seconds": remote_seconds,
                    "remote_equals_local": equal,
                    "remote_group_tests": remote_circuit.settings.get("group_testing"),
                    "request_bytes": payloads.sent,
                    "session_returned_bytes": payloads.returned,
                }
            rows.append(row)
            print(json.dumps(row), flush=True)
    agreement = {family: prescreen_agreement(family, args.prompts, args.seed) for family in args.families}

    print(f"\n{args.prompts} prompts (toy_task seed {args.seed}); passes = block_rows / (prompts x L); torch threads {args.threads}")
    wide_rows = any(row["width"] > 64 for row in rows)
    header = f"{'model':18} {'forwards':>8} {'passes':>7} {'bwd':>4} {'hand':>5} {'seconds':>8} {'requests':>8}"
    print(f"{header} {'remote = local':>14}  heads found")
    for row in rows:
        requests = str(row.get("requests", "-"))
        equal = {True: "yes", False: "NO", None: "-"}[row.get("remote_equals_local")]
        name = f"{Path(row['family']).name} L={row['layers']}" + (f" W={row['width']}" if wide_rows else "")
        found = ("" if row["toy_heads_shifted"] else "NOT THE TOY'S: ") + ", ".join(row["gather"]) + " | " + ", ".join(row["aggregate"])
        print(
            f"{name:18} {row['forwards']:8d} {row['passes']:7.1f} {row['backwards']:4d} {row['hand_passes']:5d} "
            f"{row['seconds']:8.1f} {requests:>8} {equal:>14}  {found}"
        )
    for row in rows:
        if "request_bytes" in row:
            sent = ", ".join(f"{b / 2**20:.2f}" for b in row["request_bytes"])
            back = ", ".join(f"{b / 2**20:.2f}" for b in row["session_returned_bytes"])
            print(f"{row['family']} L={row['layers']}: request payloads, MiB: {sent}; session results, MiB: {back}")
    print("hand: the paper's procedure, every evaluation a full pass: 1 + truncation (L) + layer scan (L) + head scan of 2 layers")
    for family, figures in agreement.items():
        print(
            f"prescreen on toy {family}: Spearman {figures['spearman']:.3f} over {figures['live']} live heads "
            f"(zero-ablation attribution vs exact, candidate logit difference; same sign for {figures['sign_agrees']})"
        )
    if args.json is not None:
        figures = {"rows": rows, "prescreen": agreement, "prompts": args.prompts, "seed": args.seed, "ok": not failed}
        write_json(args.json, figures)
    print("FAIL" if failed else "OK: every depth found the toy's heads" + ("" if args.no_remote else ", remote runs equal local runs"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
