"""The code the nnsight backend runs inside traces and sessions, local or remote (NDIF).

Everything here uses only torch, nnsight and builtins on plain tensors, ints and tuples,
and the module is registered with ``nnsight.register`` (shipped by value, as source), so
the same functions run locally, under nnsight's ``remote="local"`` simulation and on an
NDIF server where gna_interp is not installed.

- `apply_steps`: the body of one trace (the steps of `NNsightBackend.steps`).
- `run_jobs`: many traces in one session (one request). A tensor written
  ``("ref", job, slot, copies)`` in a step is the value job ``job`` of the same session
  saved in ``slot``, repeated ``copies`` times along the batch: a clean prefix or a patch
  source captured on the server and used there, never sent back and forth.
- `greedy_joint`: the joint search of `discover` as a session program: the one search
  (`gna_interp.core.search.role_set`, shipped by value with this module) over an accuracy
  oracle of traces run on the server, in one request.
"""

from __future__ import annotations

from enum import IntEnum
from functools import partial
from typing import Any

import nnsight
import torch

from ..core.search import role_set


class Op(IntEnum):
    """Step opcodes, in the order a block executes them (see `NNsightBackend.steps`). Steps
    carry them as plain ints (what travels to a server); this class travels with the program."""

    READ_INPUT = 0  # a block's (or the final norm's) input: the residual stream
    READ_HEADS = 1  # the out-projection's input, per head
    SKIP_BLOCK = 2  # write a block's input over its output
    NOT_RUN = 3  # do not run a block; it outputs a given value
    READ_OUTPUT = 4  # a module's output (one item of a tuple output), index-selected
    READ_PARAM = 5  # a module's parameter, index-selected
    STREAMS = 6  # column blocks of a module's output or input, per unit
    MODULE_INPUT = 7  # a module's first input, whole (an MLP norm's): as READ_INPUT, no stash
    MODULE_OUTPUT = 8  # a module's output, whole (an MLP's)


def apply_steps(
    model: Any,
    tracer: Any,
    steps: list,
    n_saved: int,
    block_items: Any,
    grad: bool,
    unembed: str = "",
    last: int = 0,
    fired: list | None = None,
) -> tuple[Any, Any]:
    """The body of one trace: apply ``steps`` in execution order; returns the saved list
    (captures and reads, by slot) and the logits. ``last > 0``: the input of the module at
    ``unembed`` (the ``lm_head``) is narrowed to the last ``last`` positions, so the
    logits are ``[batch, last, vocab]``, computed there alone. ``fired``: a list of one
    count per step, each step's count raised when its module's value was served (a module
    the model did not call leaves its count at 0 and nnsight raises at the end)."""
    saved = nnsight.save([None] * n_saved)
    stash: Any = None  # replaced by a block's input before any skip reads it
    for index, (op, path, edits, slot, rows, spec, occurrence) in enumerate(steps):
        envoy = at_path(model, path)
        for _ in tracer.iter[occurrence] if occurrence else (0,):  # which call of a shared module
            if op == Op.STREAMS:
                apply_streams(envoy, spec, saved, grad)
            elif op == Op.MODULE_OUTPUT:
                act = envoy.output
                for mask, value, through in edits:
                    act = edited(act, mask, value, through)
                if edits or grad:  # with grad: the captured tensor must be the one used downstream
                    envoy.output = act
                if slot >= 0:
                    saved[slot] = act
            elif op in (Op.READ_OUTPUT, Op.READ_PARAM):
                saved[slot] = read_value(envoy, op, spec)
            elif op == Op.NOT_RUN:  # a captured residual, already on the model's device
                if isinstance(block_items, str):  # blocks return a dict (Llamba's first release)
                    envoy.skip({block_items: rows})
                else:
                    envoy.skip(rows if block_items == 0 else (rows, *([None] * (block_items - 1))))
            elif op == Op.SKIP_BLOCK:
                skip_block(envoy, rows, stash, block_items)
            else:  # READ_INPUT, READ_HEADS, MODULE_INPUT: the module's first input
                act = apply_input(envoy, op, edits, slot, spec, saved, grad)
                if op == Op.READ_INPUT:
                    stash = act
            if fired is not None:
                fired[index] += 1
    if last > 0 and unembed:
        head = at_path(model, unembed)
        head.input = head.input[:, -last:]
    logits = model.output.logits.save()
    return saved, logits


def at_path(model: Any, path: str) -> Any:
    """The envoy of the module at dotted ``path`` (digits index a module list)."""
    envoy = model
    for part in path.split("."):
        envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
    return envoy


def apply_streams(envoy: Any, spec: Any, saved: list, grad: bool) -> None:
    """`Op.STREAMS`: column blocks of a module's output / input (``spec = (is_input, blocks)``),
    each viewed ``[batch, pos, unit, width]``, edited and saved; written back if touched."""
    full = envoy.input if spec[0] else envoy.output
    lead = (full.shape[0], full.shape[1])
    parts = []
    touched = grad
    for start, units, width, block_edits, block_slot in spec[1]:
        piece = full[:, :, start : start + units * width].reshape(lead[0], lead[1], units, width)
        for mask, value, through in block_edits:
            piece = edited(piece, mask, value, through)
        touched = touched or len(block_edits) > 0
        if block_slot >= 0:
            saved[block_slot] = piece
        parts.append(piece)
    if touched:
        new = full.clone()
        for (start, units, width, _, _), piece in zip(spec[1], parts, strict=True):
            new[:, :, start : start + units * width] = piece.reshape(lead[0], lead[1], units * width)
        if spec[0]:
            envoy.input = new
        else:
            envoy.output = new


def read_value(envoy: Any, op: int, spec: Any) -> Any:
    """`Op.READ_OUTPUT` / `Op.READ_PARAM`: a module's output (item ``spec[0]`` of a tuple, if
    ``>= 0``) or its parameter ``spec[1]``, index-selected by ``spec[2]``."""
    value = envoy.output if op == Op.READ_OUTPUT else getattr(envoy, spec[1]).detach()
    if spec[0] >= 0:
        value = value[spec[0]]
    if value is not None:
        for dim, index in spec[2]:
            value = value.index_select(dim, index.to(value.device))
    return value


def skip_block(envoy: Any, rows: Any, stash: Any, block_items: Any) -> None:
    """`Op.SKIP_BLOCK`: the block's input (``stash``) written over its output on ``rows``."""
    output = envoy.output
    if isinstance(block_items, str):  # a dict output: the hidden state under that key
        hidden = torch.where(rows.to(stash.device).view(-1, 1, 1), stash, output[block_items])
        envoy.output = {**output, block_items: hidden}
        return
    hidden = output if block_items == 0 else output[0]
    hidden = torch.where(rows.to(hidden.device).view(-1, 1, 1), stash, hidden)
    envoy.output = hidden if block_items == 0 else (hidden, *output[1:])


def apply_input(envoy: Any, op: int, edits: list, slot: int, spec: Any, saved: list, grad: bool) -> Any:
    """`Op.READ_INPUT` / `Op.READ_HEADS` / `Op.MODULE_INPUT`: the module's first input (per
    head, ``spec = (n_heads, head_dim)``, for heads), edited, saved; returns it."""
    act = envoy.input
    if op == Op.MODULE_INPUT and grad:  # the block's residual add reads this tensor too: the norm gets its own copy
        act = act.clone()
    flat_shape = act.shape
    if op == Op.READ_HEADS:
        act = act.reshape(flat_shape[0], flat_shape[1], spec[0], spec[1])
    for mask, value, through in edits:
        act = edited(act, mask, value, through)
    if edits or grad:  # with grad: the captured tensor must be the one used downstream
        envoy.input = act.reshape(flat_shape)
    if slot >= 0:
        saved[slot] = act
    return act


def edited(act: Any, mask: Any, value: Any, through: bool = False) -> Any:
    """One edit (`gna_interp.core.plan.Edit`; written out here, as this module is shipped
    alone): a bool ``mask`` selects ``value``, a floating one mixes it in,
    ``act + mask * (value - act)`` (a gate of integrated gradients, local runs only);
    ``through``: the same value, the gradient passed on to ``act`` whole (straight-through)."""
    if through:
        return edited(act.detach(), mask, value) + (act - act.detach())
    value = value.to(act.device, act.dtype)
    if mask.dtype.is_floating_point:
        return act + mask.to(act.device, act.dtype) * (value - act)
    return torch.where(mask.to(act.device), value, act)


def resolve(value: Any, results: list) -> Any:
    """A ``("ref", job, slot, copies)`` marker -> that saved value, tiled; else ``value``."""
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "ref":
        found = results[value[1]][0][value[2]]
        return found if value[3] == 1 else found.repeat(value[3], *([1] * (found.dim() - 1)))
    return value


def resolve_steps(steps: list, results: list) -> list:
    """``steps`` with every reference (edit values, not-run residuals) replaced by its value."""
    out = []
    for op, path, edits, slot, rows, spec, occurrence in steps:
        edits = [(resolve(mask, results), resolve(value, results), through) for mask, value, through in edits]
        out.append((op, path, edits, slot, resolve(rows, results), spec, occurrence))
    return out


def run_trace(
    model: Any, ids: Any, mask: Any, steps: list, n_saved: int, block_items: Any, unembed: str = "", last: int = 0
) -> tuple[Any, Any]:
    """One trace (inside a session: on the session's backend); ``unembed``, ``last`` as
    in `apply_steps`."""
    with model.trace(input_ids=ids, attention_mask=mask) as tracer:
        saved, logits = apply_steps(model, tracer, steps, n_saved, block_items, False, unembed, last)
    return saved, logits


def run_jobs(model: Any, jobs: list, block_items: Any, unembed: str = "") -> list:
    """Each job ``(ids, mask, steps, n_saved, keep)`` as one trace, in order; a job's
    references point at earlier jobs. ``keep``: 0 = nothing comes back (a prefix or
    source kept on the server), 1 = saved values and logits, 2 = the final position's
    logits ``[batch, vocab]`` alone, 3 = saved values and the final position's logits
    ``[batch, 1, vocab]``. With ``unembed`` (the ``lm_head`` path) jobs of ``keep`` 0, 2
    and 3 compute the final position's logits alone (`apply_steps`)."""
    results: list = []
    for ids, mask, steps, n_saved, keep in jobs:
        last = 1 if keep != 1 else 0
        results.append(run_trace(model, ids, mask, resolve_steps(steps, results), n_saved, block_items, unembed, last))
    returned: list = []
    for (_, _, _, _, keep), (saved, logits) in zip(jobs, results, strict=True):
        if keep == 0:
            returned.append(None)
        else:
            returned.append(([], logits[:, -1]) if keep == 2 else (list(saved), logits[:, -1:] if keep == 3 else logits))
    return returned


def search_role(role: dict, pool: list, accuracy: Any) -> tuple[list, list, float]:
    """One role of `greedy_joint`'s ``roles``: `role_set` over ``pool``, its ordered search over
    ``role["order"]``'s heads that are in the pool; ``accuracy(heads)`` measures a set."""
    order = [h for h in role["order"] if h in pool]
    method, drop = role.get("search", "greedy"), role["min_drop"]
    return role_set(pool, order, accuracy, role["start_accuracy"], role["threshold"], role["max_heads"], method=method, min_drop=drop)


def verdicts(logits: Any, candidate_ids: Any, correct: Any) -> Any:
    """``[rows]`` bool: answered correctly, scored as `gna_interp.evaluate` scores single
    tokens (the correct candidate strictly above every other: a tie is wrong)."""
    logprobs = logits[:, -1].float().log_softmax(-1)
    scores = logprobs.gather(1, candidate_ids.to(logprobs.device))
    index = correct.to(logprobs.device).view(-1, 1)
    return scores.gather(1, index).squeeze(1) > scores.scatter(1, index, float("-inf")).max(-1).values


def greedy_joint(model: Any, problem: dict, block_items: Any) -> tuple[list, list]:
    """`gna_interp.core.search.role_set` for one or more roles, in order, on the server.

    ``problem`` holds plain data built by the client (`gna_interp.discovery.remote`):

    - ``prefix_jobs``: jobs as in `run_jobs`, run first: the clean residual streams;
    - ``chunks``: ``{"positional" | "plain": [(ids, mask, candidate_ids, correct)]}``, the
      batches `evaluate` runs with and without positional ablations;
    - ``entries``: ``{(where, start, head, chunk): [(key, step)]}``, the steps (from
      `NNsightBackend.keyed_steps`) of ablating ``head`` at ``where`` (``"final"``,
      ``"segments"``, ``"all"``) in a forward that starts at layer ``start``; steps of
      several heads merge by key;
    - ``head_layer``, ``positions``: per head id, its layer and ``(layer, stage)``;
    - ``roles``: dicts with ``pool``, ``members`` (head ids), ``where``, ``threshold``,
      ``max_heads``, ``start_accuracy``, and ``after`` / ``bound``: a role searched after
      another drops that role's chosen heads from its pool and keeps only heads before
      the last of ``bound`` and the chosen heads' positions (or its members); ``search``:
      ``"greedy"`` (`joint_set`, the default) or ``"ordered"`` (`ordered_set` over ``order``,
      the pool heads it tries in its order, keeping a head that lowers accuracy by
      ``min_drop``; short of ``threshold``, then the greedy rule continuing from the heads
      kept: `role_set`; each set measured once);
    - ``n_rows``;
    - ``unembed`` (optional): the ``lm_head`` path; logits are then computed at the final
      position alone.

    Returns ``(per role: (pool, chosen, curve, accuracy with the chosen heads ablated at
    every position or None), [forwards, rows, block rows])``; heads are ids, curve the
    accuracy after each step.
    """
    n_layers = problem["n_layers"]
    unembed = problem.get("unembed", "")  # verdicts read the final position: its logits alone are computed
    cost = [0, 0, 0]
    prefix: list = []
    for ids, mask, steps, n_saved, _ in problem["prefix_jobs"]:
        prefix.append(run_trace(model, ids, mask, resolve_steps(steps, prefix), n_saved, block_items, unembed, 1))
        cost = [cost[0] + 1, cost[1] + ids.shape[0], cost[2] + ids.shape[0] * n_layers]

    measured: dict = {}  # each set once, as the client's accuracy memo

    def accuracy(heads: list, where: str) -> float:
        key = (frozenset(heads), where)
        if key not in measured:
            measured[key] = _accuracy(heads, where)
        return measured[key]

    def _accuracy(heads: list, where: str) -> float:
        start = min(problem["head_layer"][h] for h in heads)
        found = []
        for c, (ids, mask, candidate_ids, correct) in enumerate(problem["chunks"]["plain" if where == "all" else "positional"]):
            merged: dict = {}
            for h in heads:
                for key, step in problem["entries"][(where, start, h, c)]:
                    if key in merged and step[0] != Op.NOT_RUN:
                        previous = merged[key]
                        merged[key] = (previous[0], previous[1], previous[2] + step[2], *previous[3:])
                    else:
                        merged[key] = step
            steps = resolve_steps([merged[key] for key in sorted(merged)], prefix)
            _, logits = run_trace(model, ids, mask, steps, 0, block_items, unembed, 1)
            found.append(verdicts(logits, candidate_ids, correct))
            cost[0], cost[1], cost[2] = cost[0] + 1, cost[1] + ids.shape[0], cost[2] + ids.shape[0] * (n_layers - start)
        return float(torch.cat(found).double().mean())  # exact, as `Evaluation.accuracy`

    out: list = []
    for role in problem["roles"]:
        pool = list(role["pool"])
        if role["after"] is not None:
            earlier = out[role["after"]][1]
            last = max([*role["bound"], *(problem["positions"][h] for h in earlier)])
            pool = [h for h in pool if h not in earlier and (h in role["members"] or problem["positions"][h] < last)]
        chosen, curve, _ = search_role(role, pool, partial(accuracy, where=role["where"]))
        out.append((pool, chosen, curve, accuracy(chosen, "all") if chosen else None))
    return out, cost
