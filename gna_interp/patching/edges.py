"""Edge attribution: every sender head -> receiver head input-stream path, to first order
(or with integrated gradients), from a few forwards and backwards.

`gna_interp.patching.paths` defines a path: with ``clean`` the run measured and
``corrupt`` the source of the sender's value, the path ``s -> (r, stream)`` changes the
receiver ``r``'s output alone, through ``stream`` alone:

- D: clean, sender ``s`` set to its corrupt output, every other head frozen to its clean
  output (MLPs and norms recomputed); read ``r``'s ``stream`` there.
- C: clean, with ``r``'s output recomputed from that ``stream`` value (its other streams,
  and the other heads' inputs to a shared group norm, clean); every other head keeps its
  clean output; everything after ``r`` runs free. The metric of C, minus the clean metric,
  is the path's effect.

**The first-order edge score** is the derivative of that effect along the sender's
change ``delta_s = corrupt_s - clean_s`` (``[batch, pos, d_head]``), at the clean run:

    ``score(s -> r, stream) = sum_{rows, pos, d} delta_s * J_s^T (K_r^T g_r)``

- ``g_r = d metric / d out_r`` ``[batch, pos, d_head]``: the gradient of the metric
  (averaged over rows, as `attribution_patching` does) with respect to ``r``'s output in
  the clean run, everything downstream free (one backward for every receiver).
- ``K_r = d out_r / d stream_r``: how ``r``'s output moves with its own copy of
  ``stream`` (the receiver's mixer: convolution, scan or softmax, group norm), its
  other streams and the other heads' inputs to its group norm held at clean.
- ``J_s = d stream_r / d out_s``: how ``r``'s stream moves with ``s``'s output with
  every head frozen: out-projection -> residual -> MLPs and norms of the layers in
  between -> the receiver's norm -> its projection.

So the score is exact to first order in ``delta_s`` for the same quantity
`path_patching` measures (``path_patching(..., senders=s, receivers=[r],
receiver_input=stream) - clean metric``), and equal to it where that quantity is linear
in ``delta_s``. Scores add over streams: ``receiver_input="any"`` (``r``'s whole output)
is scored as the sum over every stream of ``r``'s mixer, which is the first order of
path patching with ``"any"``.

How it is computed (``1 + 1`` forwards and ``1 + 1`` backwards, besides the corrupt
forward): the clean run with ``grad=True`` gives ``g_r``. Then one forward of stacked
copies of the clean batch, one copy per ``(receiver, stream)``: in the copy for
``(r, stream)`` every head site before ``r`` (`GnaModel.head_position`) is replaced by a
leaf tensor holding its clean output (so the forward is the clean run, and gradients
reach those outputs but no head's inside: the heads are frozen); at ``r``'s layer every
other stream of ``r``'s mixer, the streams ``stream`` holds
(`gna_interp.core.arch.Stream.holds`) and the other heads' inputs to a group norm are
replaced by their detached clean values. One backward of ``sum_copies g_r . out_r``
gives ``J_s^T K_r^T g_r`` at every sender at once.

**Integrated gradients** (``steps=k > 1``, in the manner of EAP-IG): the same three
factors are evaluated at ``k`` points ``alpha = 0, 1/k, ..., (k-1)/k`` (a left Riemann
sum, so ``steps=1`` is the first-order score) and averaged; at ``alpha`` the run is the
clean run with *every* sender's output set to ``clean + alpha * delta`` (MLPs, norms and
every other head free), and heads are frozen at their values in that run. The senders
are set straight through (`Edit` with ``straight_through=True``): the forward value is
the interpolated one, and the backward runs through every sender as in an unedited run,
so ``g_r`` is at every point, ``alpha = 0`` included, the full gradient at ``r``'s output
(paths through senders downstream of ``r`` too), as EAP-IG defines it. Cost: ``k``
times the above. All senders move together, so this is the EAP-IG approximation: it does
not integrate each edge's own path-patching curve, and the sum over senders need not
match the sum of their separate path-patching effects (measured in docs/attribution.md, "Edge attribution").

**Exact upstream** (``method="exact_upstream"``) and **exact receiver**
(``method="exact_receiver"``): `gna_interp.patching.edges_exact`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.compile import head_mask
from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import Intervention
from ..core.keywords import renamed, suggest_keywords
from ..core.plan import Edit, Plan, Site, SiteKind
from ..cost import charge
from ..models.handle import check_model
from ..progress import progress_bar
from .attribution import _gradients, _scalar
from .checks import check_local, clean_corrupt_batches
from .direct import LOGITS, mlp_name, node_position, node_write, write_sites
from .edges_direct import _chunk_gradients, _direct_gradients, interpolated, mlp_input_gradients, node_site
from .edges_exact import _exact_upstream
from .metrics import Metric, check_metric, logits_read, reduce_metric
from .path_chain import norm_inputs, receiver_streams
from .paths import ANY, PathKind, Receivers, check_path, check_senders, parse_receivers, parse_streams, refuse_nodes
from .results import EdgeResult, _table
from .variants import rows_per_forward

if TYPE_CHECKING:
    from ..models.handle import GnaModel

METHODS = ("first_order", "exact_upstream", "exact_receiver")

SENDER_BLOCK = 4096
"""Senders of one site scored by one product (``[copy, batch, pos, block, d_head]``): a site's
heads at once, not one by one (a Python loop of small GPU kernels, each read back to the CPU,
over the 8,192 channels of each Falcon-Mamba-7B layer), in blocks that bound its size."""


@renamed(max_rows="batch_size")
@suggest_keywords
def edge_attribution(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    *,
    receivers: Receivers,
    senders: Sequence[Head] | None = None,
    steps: int = 1,
    method: str = "first_order",
    receiver_input: str | Sequence[str] = ANY,
    path: PathKind = "all",
    interventions: Sequence[Intervention] = (),
    batch_size: int | None = None,
    memory_budget_mb: float | None = None,
    progress: bool = True,
) -> EdgeResult:
    """Estimate `path_patching` for every edge ``sender -> receiver stream`` at once: to first
    order (``method="first_order"``, integrated gradients with ``steps > 1``), or with the
    sender's change to the stream exact (``"exact_upstream"``) and the receiver exact too
    (``"exact_receiver"``); see the module docs for the definitions.

    Args:
        model: a `GnaModel` with local weights (the backward runs here), any backend.
        clean: inputs of the clean run (the run measured).
        corrupt: inputs whose sender outputs replace the clean ones: the same token length
            as ``clean`` (and rows, or one row).
        metric: logits ``[batch, pos, vocab]`` -> scalar or ``[batch]`` (averaged over
            rows), differentiable in the logits (``logit_diff``, ``target_logprob``).
        steps: points of the integrated-gradients sum (``1``: first order; see the
            module docs). Cost: ``steps`` clean-sized and ``steps`` stacked forwards and
            backwards.
        receivers: receiver heads; with ``path="direct"`` also MLPs (``"L0MLP"``: the input
            of its norm) and ``"logits"`` (the final norm's input), scored with
            ``receiver_input="any"`` (`gna_interp.patching.direct` lists the nodes).
        senders: sender heads (default: every head before some receiver); with
            ``path="direct"`` also ``"embed"`` and MLPs (their writes: the embedding, the MLP's
            output). An edge exists where the sender sits before the receiver
            (`GnaModel.head_position`; an MLP after every mixer of its block).
        receiver_input: ``"any"`` (one score per edge: the sum over every stream of the
            receiver's mixer), one stream name, or a list of names (``"q"``, ``"k"``,
            ``"v"``; ``"x"``, ``"B"``, ``"C"``, ``"dt"``, ``"gate"``).
        interventions: applied to every run, on top of active contexts.
        batch_size: rows per stacked forward (one copy of the batch per receiver and
            stream), as in `path_patching_sweep`; default: estimated from ``memory_budget_mb``.
            First order only: the exact methods do not chunk and refuse a value.
        memory_budget_mb: the memory a stacked forward may use, to estimate ``batch_size``
            (first order only, as ``batch_size``).
        method: ``"first_order"`` (the default; with ``steps > 1``, integrated gradients
            with every sender moving together) or ``"exact_upstream"``: each sender's change
            to the receiver's stream taken exactly (path patching's D run, one stacked copy
            per sender), the receiver linear, and the gradient downstream of it integrated
            over ``steps`` midpoints of a path per receiver stream (default 1, the midpoint:
            on the toys as good as 8). Cost: a stacked forward of ``senders + 2`` copies, two
            forwards per stream name, and ``steps + 1`` stacked forwards and backwards (one
            copy per receiver stream). ``"exact_receiver"``: the same, with the receiver's
            output recomputed exactly under each sender's stream change instead of ``K_r``
            (AtP*'s idea): ``steps`` backwards, and per stream name one more stacked
            forward of one copy per sender and receiver.
        progress: show a progress bar (over the points and chunks; the exact methods: over
            the receiver positions).
        path: ``"all"`` (default, as `path_patching`: ``J_s`` runs through the MLPs and norms
            between sender and receiver) or ``"direct"`` (TransformerLens's
            ``attribution_patch(granularity="edge")``, EAP's: ``J_s`` is the sender's
            out-projection alone, so the score is the sender's write dotted with the
            gradient at the receiver's own copy of its input; the first order of
            ``path_patching(..., path="direct")``). ``"direct"``: first order only.

    Returns:
        `EdgeResult`: ``scores`` ``[sender, receiver]`` (one stream, or ``"any"``) or
        ``[sender, receiver, stream]`` (several), the effects on the metric as ``method``
        estimates them (``meta["method"]``: ``"first_order"``, ``"exact_upstream"`` or
        ``"exact_receiver"``).
    """
    direct = _check_call(model, clean, corrupt, metric, steps, method, path)
    edges = _edges(model, receivers, senders, receiver_input, direct)
    if method != "first_order":
        return _exact(model, clean, corrupt, metric, edges, receivers, method, steps, interventions, batch_size, memory_budget_mb, progress)
    run = _prepare(model, clean, corrupt, metric, edges, steps, direct, interventions, batch_size, memory_budget_mb)
    return _first_order(run, path, progress)


def _check_call(model: GnaModel, clean: Any, corrupt: Any, metric: Metric, steps: object, method: str, path: object) -> bool:
    """The model, the metric, ``steps``, ``method`` and ``path`` checked; True for path="direct"."""
    check_model(model, "edge_attribution")
    check_metric(metric, "edge_attribution", clean=clean, corrupt=corrupt)
    check_local(model, "edge_attribution")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        what = (
            "1 = first order, more = integrated-gradient points"
            if method == "first_order"
            else "midpoints of the path downstream of each receiver, 1 = the midpoint"
        )
        raise GnaValueError(f"steps={steps!r} with method={method!r}: expected an int >= 1 ({what})")
    if method not in METHODS:
        raise GnaValueError(f"method={method!r}: expected one of {METHODS}")
    direct = check_path(path)
    if direct and method != "first_order":
        raise GnaValueError(f"method={method!r} with path='direct': expected method='first_order' (the exact methods score path='all')")
    return direct


@dataclass(frozen=True)
class _Edges:
    """The edges a call scores, its senders and receivers checked (`_edges`)."""

    senders: list[Head | str]  # heads; with path="direct" also "embed" and MLPs
    receivers: list[Head | str]  # the receiver heads, then the MLP and logits receivers
    nodes: list[str]  # the MLP and logits receivers (path="direct" only)
    streams: tuple[str, ...]  # the chosen stream names
    whole: bool  # receiver_input="any": one score per edge, the sum over streams
    last: tuple[int, int]  # the last receiver's position (`node_position`)

    @property
    def head_senders(self) -> list[Head]:
        return [s for s in self.senders if isinstance(s, Head)]

    @property
    def head_receivers(self) -> list[Head]:
        return [r for r in self.receivers if isinstance(r, Head)]


def _edges(
    model: GnaModel, receivers: Receivers, senders: Sequence[Head] | None, receiver_input: str | Sequence[str], direct: bool
) -> _Edges:
    """The senders, receivers and streams checked against each other and the model."""
    refuse_nodes([] if senders is None else check_senders(model, senders, nodes=True), receivers, direct)
    mlps: list[int] = []
    heads, to_logits = parse_receivers(model, receivers, mlps if direct else None)
    if to_logits and not direct:
        raise GnaValueError(
            "receivers includes 'logits': edge attribution with path='all' scores receiver heads' input streams; "
            "'logits' has none (with path='direct' it is a receiver: the final norm's input)"
        )
    nodes = [*(mlp_name(layer) for layer in sorted(mlps)), *([LOGITS] if to_logits else [])]  # MLP and logits receivers
    receiver_list: list[Head | str] = [*(Head(layer, h) for layer, hs in heads.items() for h in hs), *nodes]
    whole = isinstance(receiver_input, str) and receiver_input == ANY
    streams = parse_streams(model, receiver_input)
    if nodes and not whole:
        raise GnaValueError(
            f"receivers has {nodes[0]!r} with receiver_input={receiver_input!r}: MLP and logits receivers read the "
            "residual stream whole; pass receiver_input='any' (or score them in a call of their own)"
        )
    if not whole:
        for layer, indices in heads.items():
            receiver_streams(model, layer, indices, streams)  # every receiver has a chosen stream
    last = max(node_position(model, r) for r in receiver_list)
    if senders is None:
        sender_list: list[Head | str] = [head for head in model.heads if model.head_position(head) < last]
    else:
        sender_list = list(check_senders(model, senders, nodes=direct))
        for head in sender_list:
            if node_position(model, head) >= last:
                raise GnaValueError(
                    f"senders has {head}, at or after every receiver (the last sits at layer {last[0]}): "
                    "a sender must precede a receiver (GnaModel.head_position)"
                )
    if not sender_list:
        raise GnaValueError(f"no head precedes the receivers {[str(r) for r in receiver_list]}: there are no edges to score")
    return _Edges(sender_list, receiver_list, nodes, streams, whole, last)


def _exact(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    edges: _Edges,
    receivers: Receivers,
    method: str,
    steps: int,
    interventions: Sequence[Intervention],
    batch_size: int | None,
    memory_budget_mb: float | None,
    progress: bool,
) -> EdgeResult:
    """``method="exact_upstream"`` or ``"exact_receiver"`` (`gna_interp.patching.edges_exact`),
    which refuse the chunking options: they stack one copy per sender or receiver stream."""
    for name, given in (("batch_size", batch_size), ("memory_budget_mb", memory_budget_mb)):
        if given is not None:
            raise GnaValueError(
                f"{name}={given!r} with method={method!r}: this method does not chunk its stacked forwards "
                f"(one copy per sender or receiver stream); expected {name}=None"
            )
    return _exact_upstream(
        model,
        clean,
        corrupt,
        metric,
        steps,
        receivers,
        edges.head_receivers,
        edges.head_senders,
        edges.streams,
        edges.whole,
        interventions,
        exact_receiver=method == "exact_receiver",
        progress=progress,
    )


@dataclass
class _FirstOrder:
    """A first-order call's fixed inputs (`_prepare`), and ``flat``, the scores it sums:
    ``[sender, copy]``, one column per ``(receiver, stream)`` copy, then one per MLP and
    logits receiver, summed over the points."""

    model: GnaModel
    metric: Metric
    batch: Any  # the clean batch
    base: Plan  # its plan (the ambient interventions)
    keep: Any  # the positions the metric reads: logits computed there alone
    steps: int
    direct: bool
    edges: _Edges
    first: int  # the first sender's layer: the stacked forwards start there
    copies: list[tuple[Head, str]]  # (receiver head, stream): one stacked copy each
    frozen: set[Site]  # head sites frozen to leaves in the stacked forwards (path="all")
    sender_sites: set[Site]  # the sender heads' sites
    write_nodes: set[Site]  # what "embed" and MLP senders write
    node_reads: set[Site]  # what MLP and logits receivers read, and their outputs
    capture: set[Site]  # what each point run captures
    receiver_order: list[Site]  # where the point run's gradient is taken
    by_site: dict[Site, tuple[Tensor, Tensor]]  # head site -> (its senders' rows of ``flat``, their head indices)
    corrupt: dict[Site, Tensor]  # the corrupt run's senders and writes
    per_chunk: int  # copies per stacked forward
    reference: float  # the corrupt run's metric
    flat: Tensor


def _prepare(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    edges: _Edges,
    steps: int,
    direct: bool,
    interventions: Sequence[Intervention],
    batch_size: int | None,
    memory_budget_mb: float | None,
) -> _FirstOrder:
    """The sites the first-order runs capture and edit, and the corrupt run."""
    clean_batch, corrupt_batch = clean_corrupt_batches(model, clean, corrupt, "edge attribution")
    ambient = [*model.active_interventions, *interventions]
    base = model.compile_plan(clean_batch, ambient)
    heads, nodes, last = edges.head_receivers, edges.nodes, edges.last
    first = max(0, min(node_position(model, head) for head in edges.senders)[0])
    # (receiver, stream) copies: each receiver with each chosen stream its mixer has.
    copies = [(r, name) for r in heads for name in model.mixer_of(r)[0].receiver_inputs if name in edges.streams]
    receiver_sites = {model.head_site(r)[0] for r in heads}
    mixers = [model.mixer_of(r)[0] for r in heads]
    stream_sites = {Site(SiteKind.STREAM, m.layer, s.name, m.index) for m in mixers for s in m.spec.streams}
    frozen = {site for layer in range(first, min(last[0] + 1, model.n_layers)) for site in model.head_sites(layer)}
    frozen = {site for site in frozen if model.mixer(site).position < last}
    sender_sites = {model.head_site(head)[0] for head in edges.head_senders}
    write_nodes = {site for s in edges.senders if not isinstance(s, Head) for site in write_sites(model, s)}  # embed, MLPs
    node_reads = {site for r in nodes for site in node_site(model, r)}  # what MLP and logits receivers read, and their outputs
    norm_sites = set(norm_inputs(model, {site: [] for site in receiver_sites}))
    capture = receiver_sites | stream_sites | frozen | norm_sites | write_nodes | node_reads
    if first > 0:
        capture.add(Site(SiteKind.RESID, first))
    if direct:  # the receivers' own copies of the residual stream
        capture |= {Site(SiteKind.RESID, r.layer) for r in heads}

    keep = logits_read(metric)
    corrupt_out = model.run_plan(
        corrupt_batch, model.compile_plan(corrupt_batch, ambient), capture=sender_sites | write_nodes, logits_to_keep=keep, prefix=False
    )
    reference = reduce_metric(metric(corrupt_out.logits), metric, corrupt_batch.n_rows)
    per_chunk = max(1, rows_per_forward(model, clean_batch.n_pos, batch_size, memory_budget_mb) // clean_batch.n_rows)
    receiver_order = sorted(receiver_sites | {node_site(model, r)[1] for r in nodes})
    by_site: dict[Site, list[tuple[int, int]]] = {}  # site -> (row of ``flat``, head index) of each sender there
    for i, head in enumerate(edges.head_senders):
        site, index = model.head_site(head)
        by_site.setdefault(site, []).append((i, index))
    senders_by_site = {site: (torch.tensor([i for i, _ in pairs]), torch.tensor([h for _, h in pairs])) for site, pairs in by_site.items()}
    flat = torch.zeros((len(edges.senders), len(copies) + len(nodes)))
    return _FirstOrder(
        model=model,
        metric=metric,
        batch=clean_batch,
        base=base,
        keep=keep,
        steps=steps,
        direct=direct,
        edges=edges,
        first=first,
        copies=copies,
        frozen=frozen,
        sender_sites=sender_sites,
        write_nodes=write_nodes,
        node_reads=node_reads,
        capture=capture,
        receiver_order=receiver_order,
        by_site=senders_by_site,
        corrupt=corrupt_out.acts,
        per_chunk=per_chunk,
        reference=reference,
        flat=flat,
    )


def _first_order(run: _FirstOrder, path: PathKind, progress: bool) -> EdgeResult:
    """The points of the Riemann sum (one, ``alpha = 0``, for first order), each scored
    (`_score_direct` or `_score_all`) into ``run.flat``; edges whose sender does not precede
    the receiver set to NaN."""
    model, edges = run.model, run.edges
    clean_acts: dict[Site, Tensor] = {}
    baseline = float("nan")
    writes: list[Tensor] = []
    n_chunks = -(-len(run.copies) // run.per_chunk)
    with progress_bar(total=run.steps * n_chunks, show=progress, desc="edge attribution") as bar:
        for step in range(run.steps):  # left Riemann sum: alpha = 0 (the clean run), 1 / steps, ...
            grads, acts, measured = _point(run, step, clean_acts)
            if step == 0:
                clean_acts, baseline = acts, measured
                writes = [node_write(model, s, clean_acts, run.corrupt).float() for s in edges.senders] if run.direct else []
            if run.direct:
                _score_direct(run, acts, grads, writes, bar)
            else:
                _score_all(run, acts, clean_acts, grads, bar)
    every: list[tuple[Head | str, str]] = [*run.copies, *((r, edges.streams[0]) for r in edges.nodes)]  # columns of ``flat``
    for i, head in enumerate(edges.senders):
        for j, (receiver, _) in enumerate(every):
            if node_position(model, head) >= node_position(model, receiver):
                run.flat[i, j] = float("nan")
    scores = _table(run.flat, every, edges.receivers, edges.streams, edges.whole, len(edges.senders))
    names = (ANY,) if edges.whole else edges.streams
    meta = {"method": "first_order", "steps": run.steps, "n_prompts": run.batch.n_rows, "receiver_input": list(names), "path": path}
    return EdgeResult(scores, edges.senders, edges.receivers, names, baseline, run.reference, meta=meta)


def _point(run: _FirstOrder, step: int, clean_acts: dict[Site, Tensor]) -> tuple[dict[Site, Tensor], dict[Site, Tensor], float]:
    """The run at point ``alpha = step / steps`` (every sender's output moved ``alpha`` of the
    way to corrupt, straight through), with ``grad=True``: ``(the metric's gradient at each
    receiver site, the captured activations detached, the metric)``."""
    model, alpha = run.model, step / run.steps
    plan = Plan()
    plan.extend(run.base)
    for site in sorted(run.sender_sites) if step else []:  # the senders' outputs, interpolated
        mask = head_mask(model.layout, site, [model.head_site(h)[1] for h in run.edges.head_senders if model.head_site(h)[0] == site])
        value = clean_acts[site] + alpha * (run.corrupt[site] - clean_acts[site])
        plan.add(site, Edit(mask, value, straight_through=True))  # gradients run through the sender as unedited
    for site in sorted(run.write_nodes) if step else []:
        plan.add(*interpolated(site, clean_acts[site], run.corrupt[site], alpha))
    point = model.run_plan(run.batch, plan, capture=run.capture, grad=True, logits_to_keep=run.keep, prefix=False)
    value = _scalar(run.metric(point.logits), run.metric)
    grads = dict(zip(run.receiver_order, _gradients(value, [point.acts[s] for s in run.receiver_order]), strict=True))
    charge(model.backend, backwards=1, backward_block_rows=run.batch.n_rows * model.n_layers)
    # Detached: the captured acts keep the forward's graph upstream of the receivers alive (the
    # backward ran only down to them), dropped here before the stacked forwards.
    return grads, {site: act.detach() for site, act in point.acts.items()}, float(value.detach())


def _score_direct(run: _FirstOrder, acts: dict[Site, Tensor], grads: dict[Site, Tensor], writes: list[Tensor], bar: Any) -> None:
    """path="direct" at one point: each sender's write (``writes``, ``[batch, pos, d_model]``)
    dotted with the gradient at each receiver's own copy of the residual stream, added to
    ``run.flat``: MLP and logits receivers from the point run, head receivers in chunks."""
    model, steps, n_copies = run.model, run.steps, len(run.copies)
    mlp_layers = [int(site.layer) for site in sorted(run.node_reads) if site.kind is SiteKind.MLP_IN]
    into_mlps = mlp_input_gradients(model, run.batch, run.base, mlp_layers, acts, grads) if mlp_layers else {}
    for j, node in enumerate(run.edges.nodes):  # [batch, pos, d_model] at the one site the node reads
        read, out = node_site(model, node)
        grad = (into_mlps[read.layer] if read.kind is SiteKind.MLP_IN else grads[out]).float()
        for i, write in enumerate(writes):
            run.flat[i, n_copies + j] += (write.expand_as(grad) * grad).sum().cpu() / steps
    for offset in range(0, n_copies, run.per_chunk):
        chunk = run.copies[offset : offset + run.per_chunk]
        resid_grads = _direct_gradients(model, run.batch, run.base, chunk, acts, grads)  # [copy, batch, pos, d_model]
        for i, write in enumerate(writes):
            run.flat[i, offset : offset + len(chunk)] += (write.expand_as(resid_grads[0]) * resid_grads).sum((1, 2, 3)).cpu() / steps
        bar.update(1)


def _score_all(run: _FirstOrder, acts: dict[Site, Tensor], clean_acts: dict[Site, Tensor], grads: dict[Site, Tensor], bar: Any) -> None:
    """path="all" at one point (head senders and receivers only): per chunk of copies,
    ``J_s^T K_r^T g_r`` at every frozen head site (`_chunk_gradients`) dotted with each
    sender's change ``delta_s``, a site's senders in one product (blocks of `SENDER_BLOCK`),
    added to ``run.flat``."""
    for offset in range(0, len(run.copies), run.per_chunk):
        chunk = run.copies[offset : offset + run.per_chunk]
        sender_grads = _chunk_gradients(run.model, run.batch, run.base, chunk, acts, grads, run.first, run.frozen)
        columns = slice(offset, offset + len(chunk))
        for site, (flat_rows, sender_indices) in run.by_site.items():
            for block in range(0, len(sender_indices), SENDER_BLOCK):  # bounds the product's size
                at = sender_indices[block : block + SENDER_BLOCK]
                delta = (run.corrupt[site][:, :, at] - clean_acts[site][:, :, at]).float()  # [batch | 1, pos, k, d_head]
                grad = sender_grads[site][:, :, :, at].float()  # [copy, batch, pos, k, d_head]
                found = (delta.expand_as(grad[0]) * grad).sum((1, 2, 4)).cpu() / run.steps  # [copy, k]
                run.flat[flat_rows[block : block + SENDER_BLOCK], columns] += found.T
        bar.update(1)
