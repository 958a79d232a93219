"""`discover` on a remote nnsight model (NDIF, or ``remote="local"``) in a handful of requests.

Every forward of a remote model is a round trip with its own queue wait, so each stage
sends all its forwards in one nnsight session (`gna_interp.models.jobs`), chunked by
payload, with the clean prefix captured and used on the server:

0. the wide layers' write sizes, the order group testing splits their heads in
   (`head_order.write_sizes`: one clean forward capturing their head outputs): one request;
1. the clean accuracy, the label check (measured whether or not it is needed), the
   truncation scan and the layer scan, and the first stage of group testing for the wide
   layers (at most `SPECULATE_LAYERS` of them), with the whole tree below their first blocks
   (`group_testing.speculated`: where the largest writes are, and the costly heads gather): one
   request;
2. the head scan (`ablation_sweep`; wide layers by `group_testing.StagedGroupTesting`, the second
   stage of every layer at once, not one request per adaptive round; only what request 1 did not
   measure: none where every costly block is a speculated one): one request;
3. the entry scan, with the first round of the spread groups' search: one request (more
   only where a spread group of more than `group_testing.SEARCH_AT_ONCE` heads needs a part);
4. the pattern scores of the candidates and of every head the joint search may pool (the
   heads of the harmful candidates' layers): one request;
5. the joint search of both roles: one request, its steps decided on the server
   (`gna_interp.backends.nnsight_program.greedy_joint`, ordered or greedy as ``joint_search``);
6. the confirmation's accuracies (and, for a role without a joint set, every cumulative
   set up to ``max_heads_per_role``: the first that reaches chance is the one the
   sequential search stops at): one request;
7. path patching of the Gather -> Aggregate edge (`patching.paths.prepare`): its clean and
   corrupt captures in one request, then its chain, one request each (two for one receiver
   layer);
8. MIB's circuit score: its circuits in one request, their corrupt head outputs read from
   path patching's corrupt capture (`confirm.mib_score`).

The numbers are those of the local run (tests compare every stage). The prescreen has no
attribution on a remote model (no local backward): layers only, and
``circuit.settings["prescreen"]`` says so (`head_scans.prescreen_method`). Discovery under an
active intervention context (``model.ablated``) runs the local code path, one request per
forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.heads import Head
from ..core.interventions import Ablate, Intervention, Truncate
from ..core.plan import Plan, Site, SiteKind
from ..scoring.evaluation import Evaluation, _single_token_chunks, evaluate_many
from ..tasks.mcq import shuffle_labels
from . import layer_scans
from .circuit import GnaCircuit
from .entry import segment_positions
from .evidence import HeadEvidence, RoleNeed
from .joint import ROLE_POSITIONS, JointSearch

if TYPE_CHECKING:
    from torch import Tensor

    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask, Task


@dataclass
class FirstScans:
    clean: Evaluation
    shuffled: Evaluation | None
    """The prompts with their labels shuffled (per-prompt: the label check's paired test)."""
    truncation: list[float] | None
    layer_ranges: dict[tuple[int, int], float]
    """Accuracy with layers ``first..last`` skipped, for every range the screened layer scan
    may ask for (`layer_scans.screen_ranges`)."""
    groups: dict[tuple[Head, ...], float]
    """Accuracy with each group of ``groups`` ablated (`group_testing.speculated`: the first stage of
    `group_testing.staged_group_testing` and the tree below the first blocks; a layer's whole group
    first, its heads in the order the head scan splits them: `head_scans.head_scan` reads it)."""


SPECULATE_LAYERS = 4
"""`discover` measures the first stage of group testing with the first scans (request 1) when
at most this many scanned layers are wide (every wide layer, costly or not); with more, the
stage waits for the layer scan and tests the costly layers alone, in a request of its own (their
order, `head_order.write_sizes`, in one before it: one request more than in index order)."""


def first_scans(model: GnaModel, task: Task, stages: Any, check_labels: bool, groups: Sequence[list[Head]] = ()) -> FirstScans:
    """Request 1: clean, shuffled labels, truncation and layer scans, and accuracy with
    each of ``groups`` ablated."""
    runs: list[tuple[Task, list[Intervention]]] = [(task, [])]
    relabelled = None
    if check_labels:
        try:
            relabelled = shuffle_labels(task)
        except ValueError:
            relabelled = None
    if relabelled is not None:
        runs.append((relabelled, []))
    n_layers = model.n_layers
    if "truncation" in stages:
        runs += [(task, [Truncate(k)]) for k in range(1, n_layers + 1)]
    ranges = layer_scans.screen_ranges(n_layers) if "layers" in stages else []
    if "truncation" in stages:  # the truncations are measured already
        ranges = [(a, b) for a, b in ranges if a == 0 or b < n_layers - 1]
    first_range = len(runs)
    runs += [(task, layer_scans.skip_range(a, b, n_layers)) for a, b in ranges]
    first_group = len(runs)
    runs += [(task, [Ablate(list(group))]) for group in groups]
    evaluations = evaluate_many(model, runs)
    results = [result.accuracy for result in evaluations]
    measured = {tuple(group): value for group, value in zip(groups, results[first_group:], strict=True)}
    at = 2 if relabelled is not None else 1
    truncation = results[at : at + n_layers] if "truncation" in stages else None
    layer_ranges = dict(zip(ranges, results[first_range:first_group], strict=True))
    if "layers" in stages and truncation is not None:
        layer_ranges |= {(k, n_layers - 1): truncation[k - 1] for k in range(1, n_layers)}
    return FirstScans(evaluations[0], evaluations[1] if relabelled is not None else None, truncation, layer_ranges, measured)


def pool_heads(model: GnaModel, harmful: list[Head], evidence: dict[Head, HeadEvidence], screen_above: int) -> list[Head]:
    """Heads the joint search may pool that are not examined yet: every head of the harmful
    candidates' layers (roles go to harmful heads; pools are their layers' heads), where a
    layer has at most ``screen_above`` heads."""
    layers = sorted({head.layer for head in harmful})
    heads = [h for layer in layers for h in (Head(layer, i) for i in range(model.heads_per_layer[layer]))]
    return [h for h in heads if h not in evidence and model.heads_per_layer[h.layer] <= screen_above]


def joint_search(search: JointSearch, circuit: GnaCircuit, threshold: float, max_heads: int) -> dict[str, RoleNeed]:
    """Request 5: the joint search of both roles (`gna_interp.core.search.role_set`, ordered or
    greedy as ``search.method``) on the server (`greedy_joint`), over an oracle of traces
    built here: each head's ablation steps per position set and chunk (`_entries`), merged there."""
    model, encoded = search.model, search.encoded
    roles = [role for role in ("aggregate", "gather") if getattr(circuit, role)]
    if not roles:
        return {}
    pools = {role: search.pool(circuit, role, bounded=False) for role in roles}
    clean = circuit.accuracy["clean"]
    order = {role: search.ranked(pool, role, clean) if search.method == "ordered" else [] for role, pool in pools.items()}
    members = {role: list(getattr(circuit, role)) for role in roles}
    heads = sorted({h for role in roles for h in [*pools[role], *members[role]]})
    ids = {head: i for i, head in enumerate(heads)}
    chunk_sets = {
        "positional": _single_token_chunks(encoded, [Ablate([heads[0]], positions=encoded.final)], 64, keep_columns=True),
        "plain": _single_token_chunks(encoded, [Ablate([heads[0]])], 64),
    }
    starts = sorted({h.layer for h in heads})
    prefix_jobs, clean_index = _prefix_jobs(model, chunk_sets, starts)
    bound = [model.head_position(h) for h in members.get("aggregate", [])] or [(model.n_layers, 0)]
    common = {"threshold": threshold, "max_heads": max_heads, "start_accuracy": clean, "search": search.method}
    problem = {
        "prefix_jobs": prefix_jobs,
        "chunks": {
            name: [
                (rows.input_ids.to(model.device), rows.attention_mask.to(model.device), *_answers(encoded, a, b))
                for a, b, rows, _ in chunks
            ]
            for name, chunks in chunk_sets.items()
        },
        "entries": _entries(model, encoded, heads, starts, chunk_sets, clean_index),
        "head_layer": {ids[h]: h.layer for h in heads},
        "positions": {ids[h]: model.head_position(h) for h in heads},
        "n_rows": encoded.batch.n_rows,
        "n_layers": model.n_layers,
        "roles": [
            {
                **common,
                "pool": [ids[h] for h in pools[role]],
                "members": [ids[h] for h in members[role]],
                "where": ROLE_POSITIONS[role],
                "after": roles.index("aggregate") if role == "gather" and "aggregate" in roles else None,
                "bound": bound if role == "gather" else [],
                "order": [ids[h] for h in order[role]],
                "min_drop": search.thresholds.min_effect,
            }
            for role in roles
        ],
    }
    needs = {}
    for role, (_, chosen, curve, everywhere) in zip(roles, model.backend.run_greedy(problem), strict=True):
        if chosen:
            chosen_heads = [heads[i] for i in chosen]
            needs[role] = search.accept(circuit, role, chosen_heads, list(zip(chosen_heads, curve, strict=True)), everywhere, threshold)
    return needs


def _answers(encoded: EncodedTask, start: int, stop: int) -> tuple[Tensor, Tensor]:
    """The candidate ids ``[rows, options]`` and correct indices ``[rows]`` of rows ``start:stop``."""
    return encoded.candidate_ids[start:stop], encoded.correct[start:stop]


def _prefix_jobs(model: GnaModel, chunk_sets: dict[str, list], starts: list[int]) -> tuple[list[tuple], dict[tuple[str, int], int]]:
    """The clean runs of each chunk that capture the residual at every start layer (kept on the
    server), and each chunk's index among them."""
    prefix_jobs: list[tuple] = []
    clean_index: dict[tuple[str, int], int] = {}
    capture = sorted(Site(SiteKind.RESID, layer) for layer in starts if layer > 0)
    for name, chunks in chunk_sets.items():
        for c, (_, _, rows, _) in enumerate(chunks):
            rows = rows.to(model.device)
            clean_index[(name, c)] = len(prefix_jobs)
            prefix_jobs.append((rows.input_ids, rows.attention_mask, model.backend.steps(Plan(), capture), len(capture), 0))
    return prefix_jobs, clean_index


def _entries(
    model: GnaModel,
    encoded: EncodedTask,
    heads: list[Head],
    starts: list[int],
    chunk_sets: dict[str, list],
    clean_index: dict[tuple[str, int], int],
) -> dict[tuple, list]:
    """``{(where, start, head id, chunk): [(key, step)]}``: the steps of ablating each head at
    ``where`` (``"final"``, ``"segments"``, ``"all"``) in a forward starting at layer ``start``
    from the clean prefix job of its chunk (`greedy_joint` merges several heads' steps by key)."""
    positions = {"final": encoded.final, "segments": segment_positions(encoded), "all": None}
    capture = sorted(Site(SiteKind.RESID, layer) for layer in starts if layer > 0)
    entries: dict[tuple, list] = {}
    for mode in ("final", "segments", "all"):
        name = "plain" if mode == "all" else "positional"
        for c, (start_row, stop_row, rows, _) in enumerate(chunk_sets[name]):
            rows = rows.to(model.device)
            for index, head in enumerate(heads):
                chosen = positions[mode]
                ablate = Ablate([head], positions=None if chosen is None else chosen[start_row:stop_row])
                plan = model.compile_plan(rows, [ablate])
                for start in (s for s in starts if s <= head.layer):
                    if start > 0:
                        ref = ("ref", clean_index[(name, c)], capture.index(Site(SiteKind.RESID, start)), 1)
                        plan = Plan(edits=plan.edits, start=(start, _Marker(ref)))  # type: ignore[arg-type]
                    else:
                        plan = Plan(edits=plan.edits)
                    entries[(mode, start, index, c)] = [(key, _unmark(step)) for key, step in model.backend.keyed_steps(plan)]
    return entries


class _Marker:
    """A reference marker carried through `NNsightBackend.steps` in place of a tensor."""

    def __init__(self, ref: tuple) -> None:
        self.ref = ref


def _unmark(step: tuple) -> tuple:
    op, path, edits, slot, rows, spec, occurrence = step
    return (op, path, edits, slot, rows.ref if isinstance(rows, _Marker) else rows, spec, occurrence)


def confirm(
    model: GnaModel,
    task: Task,
    sets: dict[str, list[Head]],
    cumulative: dict[str, list[Head]],
    max_heads: int,
    extra: Sequence[tuple[Task, list[Intervention]]] = (),
) -> tuple[dict[str, float], dict[str, list[float]], list[float]]:
    """Request 6: accuracy with each set ablated, with each cumulative set of each role up to
    ``max_heads``, and with each of the ``extra`` runs (the spread check's layers)."""
    runs: list[tuple[Task, list[Intervention]]] = [(task, [Ablate(heads)]) for heads in sets.values()]
    spans = {}
    for role, heads in cumulative.items():
        first = len(runs)
        runs += [(task, [Ablate(list(heads)[:k])]) for k in range(1, min(max_heads, len(heads)) + 1)]
        spans[role] = (first, len(runs))
    first_extra = len(runs)
    runs += list(extra)
    accuracies = [result.accuracy for result in evaluate_many(model, runs)]
    measured = dict(zip(sets, accuracies, strict=False))
    prefixes = {role: accuracies[a:b] for role, (a, b) in spans.items()}
    return measured, prefixes, accuracies[first_extra:]
