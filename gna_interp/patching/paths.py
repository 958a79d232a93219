"""Path patching: how much of the senders' effect reaches the output *through* the receivers.

Activation patching of a head measures everything its output does downstream. Path
patching (Wang et al. 2022, the IOI paper) keeps only the part that flows through chosen
**receivers**: the later heads that read the senders' output (through some of their
input streams: a query, a key, an SSM head's ``x`` or ``B``), or the logits directly.
The paper's Gather and Aggregate heads are a pair in exactly this sense: the Gather head
matters because the Aggregate head reads it.

**A path into a receiver R changes R's output (its slice of the out-projection input)
and nothing else.** With ``clean`` the run measured and ``corrupt`` the source of the
senders' values:

1. run D: ``clean``, with the senders' outputs set to their ``corrupt`` values and every
   other head, in every layer, attention or SSM, frozen to its clean output; MLPs and
   norms are recomputed; the receivers run free.
2. run ``clean`` with the receivers' outputs changed, and score it with the metric:

   - ``receiver_input="any"``: each receiver's output is its output in D.
   - chosen streams: each receiver's output is recomputed with those streams set to
     their D values and its other inputs clean. A stream shared with heads that are not
     receivers (a grouped-query key/value head, a Mamba-2 ``B`` / ``C`` group, Mamba-1's
     ``dt`` / ``B`` / ``C``) reaches the receivers only: the others keep their clean
     outputs, as if the receivers had their own copy of it.

   For ``receivers="logits"``, D's own logits are scored.

Mamba-2 normalises its heads' outputs together, per group of heads (a gated RMSNorm over
``intermediate_size // n_groups`` channels, the heads of one ``B`` / ``C`` group). A
receiver's output there is its own normalised output, computed from its patched
pre-norm output and the *clean* pre-norm outputs (and gates) of the other heads of its
group; in D those other heads are frozen before the norm too. Receivers of one mixer
share their patched copy: each reads the patched unit, and each is normalised with the
others' patched outputs.

With receivers in several layers, a receiver may also read the change that an earlier
receiver makes: "every other head frozen" then means frozen to its output in the
patched run (`gna_interp.patching.path_chain` has the details). So the effect may flow
along any path that enters a receiver through a chosen stream and meets no other head
before it. Two identities follow, and the tests check both: every head after the
sender plus ``"logits"`` as receivers gives plain activation patching of the sender;
one receiver layer gives exactly the IOI recipe above. Also, ``"any"`` equals the list
of every stream (a head's output is a function of its streams).

**Two definitions** (``path=``). The above is ``path="all"``, the default (the IOI paper's;
it keeps every number this library gave before ``path`` existed, and the paper's G&A pairs):
the MLPs and norms between sender and receiver are recomputed in D, so the senders' effect
may reach a receiver through them. ``path="direct"`` is TransformerLens's
(``patching.get_act_patch_direct_path``), EAP's and MIB's edge: D is replaced by the clean run
from the receiver's block on, with the residual stream entering that block plus the
senders' own writes (their corrupt-minus-clean output through their out-projection,
`gna_interp.patching.direct`); every MLP and other reader sees the senders unchanged. The
final run is the same. With ``"logits"`` the final norm reads the scored run's residual plus
the writes. ``"embed"`` may be a sender there (the embedding's write). Without MLPs and with
receivers in one layer the two agree. ``"all"`` stays the default because changing it would
change existing results silently; ``"direct"`` is the one to compare with those tools.

Input streams (``receiver_input``) come from the architecture table
(`gna_interp.models.registry`): ``"q"``, ``"k"``, ``"v"`` for attention; ``"x"``,
``"B"``, ``"C"``, ``"dt"``, ``"gate"`` for Mamba-1 and Mamba-2; ``"any"`` for the whole
output, which every head has (also heads with no stream in the table: Zamba2's adapted
attention, Qwen3-Next's gated DeltaNet). In a hybrid, receivers may mix attention and SSM
heads: each uses the chosen streams its own mixer has (``["q", "x"]``: the query of
attention receivers, ``x`` of SSM receivers), and a receiver with none of them is an
error. To patch a shared unit for every head that reads it, name all those heads as
receivers (unit ``u`` of a stream with ``units`` units serves the heads ``h`` of the
mixer with ``h * units // n_heads == u``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from ..backends.jobs import Job
from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head, refuse_string
from ..core.interventions import Intervention
from ..core.keywords import renamed, suggest_keywords
from ..core.plan import Site, SiteKind
from ..models.handle import check_model
from ..models.jobs import is_batched_remote, run_jobs
from ..progress import progress_bar
from .checks import clean_corrupt_batches
from .direct import EMBED, LOGITS, check_mlp, mlp_layer, mlp_name, node_position, write_sites
from .metrics import Metric, check_metric, logits_read, reduce_metric
from .path_chain import PathSetup, path_scores, receiver_streams, setup_sites
from .results import SweepResult
from .variants import rows_per_forward

if TYPE_CHECKING:
    from ..backends.base import RunOutput
    from ..core.inputs import Batch
    from ..core.plan import Plan
    from ..models.handle import GnaModel

ANY = "any"
Receivers = Literal["logits"] | Sequence[Head | str]
PathKind = Literal["all", "direct"]
PATHS = ("all", "direct")


def check_path(path: object) -> bool:
    """``path`` checked; True for ``"direct"``."""
    if not isinstance(path, str) or path not in PATHS:
        raise GnaValueError(
            f"path={path!r}: expected 'all' (MLPs and norms between sender and receiver recomputed) "
            "or 'direct' (the senders' own writes only)"
        )
    return path == "direct"


@suggest_keywords
def path_patching(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    *,
    senders: Sequence[Head | str] | Head | str,
    receivers: Receivers,
    receiver_input: str | Sequence[str] = "any",
    path: PathKind = "all",
    interventions: Sequence[Intervention] = (),
) -> float:
    """The metric of ``clean`` when ``senders`` change to their ``corrupt`` outputs and that
    change may reach the output only through ``receivers``.

    Args:
        model: a `GnaModel` (any backend, any architecture).
        clean: inputs of the clean run.
        corrupt: inputs of the corrupted run: the same token length as ``clean`` (and rows, or one row).
        metric: logits ``[batch, pos, vocab]`` -> scalar or ``[batch]`` (averaged).
        senders: heads whose output changes from clean to corrupt; with ``path="direct"``
            also ``"embed"``, the embedding (its write: the residual stream entering block 0),
            and MLPs (``"L0MLP"``: block 0's MLP, its write: its output).
        receivers: heads, ``"logits"`` (the direct path to the output), or a list mixing
            both; with ``path="direct"`` also MLPs (``"L0MLP"``: block 0's MLP, through
            the input of its norm; `gna_interp.patching.direct` lists the nodes). Every
            sender must sit before the last receiver: in an earlier layer, or earlier in
            the same block where a later mixer reads an earlier one's output
            (`GnaModel.head_position`; a Zamba2 hybrid layer's Mamba-2 heads read its
            shared-attention heads). ``"logits"`` counts as after the last block.
        receiver_input: what carries the change into the receiver heads: ``"any"``
            (their whole output, as in D), or one name or a list of names of input
            streams from each receiver's mixer (``model.receiver_inputs(head)``;
            attention: ``"q"``, ``"k"``, ``"v"``; SSMs: ``"x"``, ``"B"``, ``"C"``, ``"dt"``,
            ``"gate"``), patched for the receivers only (see the module docs).
        path: ``"all"`` (default; the IOI paper's path: the MLPs and norms between sender and
            receiver are recomputed, so the senders' effect may reach a receiver through
            them) or ``"direct"`` (TransformerLens's ``get_act_patch_direct_path``, EAP's
            and MIB's edge: only the senders' own writes reach the receivers' inputs; every
            MLP and other reader sees the senders unchanged). ``"all"`` is the default so
            that the numbers of existing calls and of the paper's G&A pairs stay as they
            were; ask for ``"direct"`` to compare with those tools (module docs).
        interventions: applied to every run (e.g. ``Truncate``), on top of active contexts.

    Returns:
        the metric of the final patched run (not a difference from clean).
    """
    check_model(model, "path_patching")
    sender_list = check_senders(model, senders, nodes=True)  # type: ignore[arg-type]
    setup = prepare(model, clean, corrupt, sender_list, receivers, metric, receiver_input, interventions, path)[0]
    return path_scores(setup, [sender_list])[0]


@renamed(max_rows="batch_size")
@suggest_keywords
def path_patching_sweep(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    *,
    receivers: Receivers,
    senders: Sequence[Head] | None = None,
    receiver_input: str | Sequence[str] = "any",
    path: PathKind = "all",
    interventions: Sequence[Intervention] = (),
    batch_size: int | None = None,
    memory_budget_mb: float | None = None,
    progress: bool = True,
) -> SweepResult:
    """`path_patching` of each head alone as the sender, for one fixed receiver set.

    Args:
        senders: heads to score (default: every head before the last receiver).
        batch_size: rows per stacked forward (each sender is one copy of the batch in a
            stacked forward; default: estimated from ``memory_budget_mb``).
        memory_budget_mb: the memory a stacked forward may use, to estimate ``batch_size``.
        progress: show a progress bar.

    The other arguments are as in `path_patching`.

    Returns:
        `SweepResult` of kind ``"path_patching"``: ``scores`` ``[layer, head]`` (NaN where a
        head was not scored), ``baseline`` the clean metric, ``reference`` the corrupt one.
    """
    check_model(model, "path_patching_sweep")
    if senders is None:
        mlps: list[int] = []
        refuse_nodes([], receivers, check_path(path))
        last = last_position(model, *parse_receivers(model, receivers, mlps), mlps)
        sender_list = [head for head in model.heads if model.head_position(head) < last]
    else:
        sender_list = check_senders(model, senders)
    setup, baseline, reference = prepare(model, clean, corrupt, sender_list, receivers, metric, receiver_input, interventions, path)
    ordered = sorted(sender_list)  # by layer: chunks start late when their senders do
    per_chunk = max(1, rows_per_forward(model, setup.batch.n_pos, batch_size, memory_budget_mb) // setup.batch.n_rows)
    scores = torch.full((model.n_layers, model.n_heads), float("nan"))
    with progress_bar(total=len(ordered), show=progress, desc="path patching") as bar:
        for offset in range(0, len(ordered), per_chunk):
            chunk = ordered[offset : offset + per_chunk]
            for head, score in zip(chunk, path_scores(setup, [[head] for head in chunk]), strict=True):
                scores[head.layer, head.head] = score
            bar.update(len(chunk))
    streams = [ANY] if setup.whole_output else list(setup.streams)
    meta = {"receivers": describe_receivers(setup), "receiver_input": streams, "path": path, "n_prompts": setup.batch.n_rows}
    return SweepResult(scores, ("layer", "head"), baseline, reference=reference, kind="path_patching", meta=meta)


# ----- input checks ------------------------------------------------------------------------


def check_senders(model: GnaModel, senders: Sequence[Head | str] | Head, nodes: bool = False) -> list[Head]:
    """The senders as a list; with ``nodes``, ``"embed"`` and MLP names (``"L0MLP"``; the
    direct graph's writers, `gna_interp.patching.direct`) may be among them."""
    if not (nodes and (senders == EMBED or mlp_layer(senders) is not None)):
        refuse_string(senders, "senders")
    items = [senders] if isinstance(senders, (Head, str)) else list(senders)
    if not items:
        raise GnaValueError("senders is empty: expected at least one gna_interp.Head")
    for head in items:
        if nodes and mlp_layer(head) is not None:
            check_mlp(model, head)  # type: ignore[arg-type]
        elif not (nodes and head == EMBED):
            model.check_head(head)  # type: ignore[arg-type]
    return items  # type: ignore[return-value]  # "embed" and MLPs travel as senders of path="direct"


def refuse_nodes(senders: Sequence[Head | str], receivers: Receivers, direct: bool) -> None:
    """``"embed"`` and MLP nodes are ends of path="direct" edges only."""
    items = [receivers] if isinstance(receivers, (str, Head)) else list(receivers)
    for where, node in [*(("senders", s) for s in senders), *(("receivers", r) for r in items)]:
        if not direct and (node == EMBED or mlp_layer(node) is not None):
            what = "the embedding is a sender" if node == EMBED else "an MLP is an edge's end"
            raise GnaValueError(
                f"{where} has {node!r}: {what} with path='direct' only "
                "(path='all' freezes heads and recomputes everything else); pass path='direct'"
            )


def parse_receivers(model: GnaModel, receivers: Receivers, mlps: list[int] | None = None) -> tuple[dict[int, tuple[int, ...]], bool]:
    """``(layer -> receiver head indices, whether "logits" is a receiver)``; with ``mlps``
    (path="direct"), MLP receivers (``"L0MLP"``) are appended there, by layer."""
    items = [receivers] if isinstance(receivers, (str, Head)) else list(receivers)
    if not items:
        raise GnaValueError("receivers is empty: expected gna_interp.Head values and/or 'logits'")
    heads: dict[int, list[int]] = {}
    to_logits = False
    for item in items:
        if isinstance(item, str) and mlp_layer(item) is not None and mlps is not None:
            layer = check_mlp(model, item)
            mlps += [] if layer in mlps else [layer]
        elif isinstance(item, str):
            if item != LOGITS:
                raise GnaValueError(
                    f"receivers has {item!r}: the string receivers are 'logits' (the direct path to the output) "
                    "and, with path='direct', MLPs ('L0MLP')"
                )
            to_logits = True
        elif isinstance(item, Head):
            model.check_head(item)
            heads.setdefault(item.layer, []).append(item.head)
        else:
            raise GnaTypeError(f"receivers must be gna_interp.Head values or 'logits', got {item!r} ({type(item).__name__})")
    return {layer: tuple(sorted(set(hs))) for layer, hs in sorted(heads.items())}, to_logits


def parse_streams(model: GnaModel, receiver_input: str | Sequence[str]) -> tuple[str, ...]:
    """The chosen stream names, checked against every mixer of the model (a hybrid's
    attention and SSM heads have different streams; each receiver uses those its own
    mixer has, see `gna_interp.patching.path_chain.receiver_streams`)."""
    mixers = [mixer for spec in model.layer_specs for mixer in spec.mixers]
    names = tuple(dict.fromkeys(name for mixer in mixers for name in mixer.receiver_inputs))
    if isinstance(receiver_input, str) and receiver_input == ANY:
        return names
    items = [receiver_input] if isinstance(receiver_input, str) else list(receiver_input)
    if not items:
        raise GnaValueError(f"receiver_input is empty: expected 'any' or names from {names}")
    for item in items:
        if item not in names:
            kinds = ", ".join(dict.fromkeys(mixer.kind.value for mixer in mixers))
            raise GnaValueError(
                f"receiver_input={item!r} is not an input stream of {model.arch.family} heads ({kinds}): expected 'any' or one of {names}"
            )
    return tuple(dict.fromkeys(items))


def last_position(model: GnaModel, heads: dict[int, tuple[int, ...]], to_logits: bool, mlps: Sequence[int] = ()) -> tuple[int, int]:
    """The ``(layer, stage)`` of the last receiver (``"logits"``: after the last block)."""
    if to_logits:
        return model.n_layers, 0
    nodes: list[Head | str] = [*(Head(layer, h) for layer, hs in heads.items() for h in hs), *(mlp_name(layer) for layer in mlps)]
    return max(node_position(model, node) for node in nodes)


def check_reach(
    model: GnaModel, senders: Sequence[Head | str], heads: dict[int, tuple[int, ...]], to_logits: bool, mlps: Sequence[int] = ()
) -> None:
    """Every sender must sit before some receiver, or its output could reach none."""
    last = last_position(model, heads, to_logits, mlps)
    for head in senders:
        if node_position(model, head) >= last:
            where = "'logits'" if to_logits else f"layer {last[0]}" + (f" (stage {last[1]} of its block)" if last[1] else "")
            raise GnaValueError(
                f"sender {head} is in layer {node_position(model, head)[0]}, at or after every receiver (the last is {where}): "
                "its output cannot reach them; senders must precede a receiver"
            )


def describe_receivers(setup: PathSetup) -> list[str]:
    heads = [str(Head(layer, h)) for layer, hs in setup.receivers.items() for h in hs]
    return heads + [mlp_name(layer) for layer in setup.mlps] + ([LOGITS] if setup.to_logits else [])


def prepare(
    model: GnaModel,
    clean: Any,
    corrupt: Any,
    senders: Sequence[Head | str],
    receivers: Receivers,
    metric: Metric,
    receiver_input: str | Sequence[str],
    interventions: Sequence[Intervention],
    path: object = "all",
    corrupt_sites_extra: Collection[Site] = (),
) -> tuple[PathSetup, float, float]:
    """Check the inputs, run clean and corrupt once, and return the shared `PathSetup`
    with the clean (baseline) and corrupt (reference) metrics.

    The clean run goes through `GnaModel.run_plan`: inside an open `prefix_cache` that holds
    the clean batch it starts from the cached clean stream at (or before) the first layer it
    captures (the same numbers). On a remote model both runs travel in one request
    (`gna_interp.models.jobs.run_jobs`). ``corrupt_sites_extra``: further sites the corrupt run
    captures too, in ``setup.corrupt_heads`` (``[batch, pos, ...]`` each; e.g. every head site,
    for a circuit score that reads the same corrupted prompts)."""
    check_metric(metric)
    direct = check_path(path)
    refuse_nodes(senders, receivers, direct)
    mlps: list[int] = []
    heads, to_logits = parse_receivers(model, receivers, mlps if direct else None)
    streams = parse_streams(model, receiver_input)
    whole_output = isinstance(receiver_input, str) and receiver_input == ANY
    if direct and model.is_remote:
        raise GnaValueError("path='direct' computes the senders' writes from the out-projection weights: load the model without remote=")
    check_reach(model, senders, heads, to_logits, mlps)
    nodes = {site for s in senders if not isinstance(s, Head) for site in write_sites(model, s)}  # embed, MLPs
    all_senders, head_senders = senders, [s for s in senders if isinstance(s, Head)]
    if not whole_output:
        for layer, indices in heads.items():
            receiver_streams(model, layer, indices, streams)  # every receiver has a chosen stream
    sender_layers = {head.layer for head in head_senders} or {max(0, min(node_position(model, s)[0] for s in all_senders))}
    clean_batch, corrupt_batch = clean_corrupt_batches(model, clean, corrupt, "path patching")
    ambient = [*model.active_interventions, *interventions]
    base = model.compile_plan(clean_batch, ambient)
    keep = logits_read(metric)  # the positions the metric reads: logits computed there alone
    clean_sites = setup_sites(model, heads, streams, sender_layers, whole_output, direct, to_logits) | nodes
    clean_sites |= {Site(SiteKind.MLP_IN, layer) for layer in mlps} | {Site(SiteKind.RESID, layer) for layer in mlps if layer > 0}
    corrupt_sites = {model.head_site(head)[0] for head in head_senders} | nodes | set(corrupt_sites_extra)
    corrupt_plan = model.compile_plan(corrupt_batch, ambient)
    if is_batched_remote(model) and keep in (0, 1):  # one request for both runs
        jobs = [Job(clean_batch, base, frozenset(clean_sites), keep=3 if keep else 1)]
        clean_out, corrupt_out = run_jobs(model, [*jobs, Job(corrupt_batch, corrupt_plan, frozenset(corrupt_sites), keep=3 if keep else 1)])
    else:
        clean_out = _clean_run(model, clean_batch, base, clean_sites, keep)
        corrupt_out = model.run_plan(corrupt_batch, corrupt_plan, capture=corrupt_sites, logits_to_keep=keep, prefix=False)
    assert clean_out is not None and corrupt_out is not None
    setup = PathSetup(
        model=model,
        batch=clean_batch,
        base=base,
        receivers=heads,
        to_logits=to_logits,
        streams=streams,
        whole_output=whole_output,
        clean=clean_out.acts,
        corrupt_heads=dict(corrupt_out.acts),
        metric=metric,
        direct=direct,
        mlps=tuple(sorted(mlps)),
    )
    clean_value = reduce_metric(metric(clean_out.logits), metric, clean_batch.n_rows)
    return setup, clean_value, reduce_metric(metric(corrupt_out.logits), metric, corrupt_batch.n_rows)


def _clean_run(model: GnaModel, batch: Batch, base: Plan, capture: set[Site], keep: int) -> RunOutput:
    """Path patching's clean run: from the open prefix cache's clean stream when the plan is
    unedited (every captured site at layer ``>= k``: blocks ``0 .. k-1`` are the cached run's;
    without a cached entry, the one forward it would run anyway, which fills it); an edited
    plan runs whole, as a cache miss would cost an extra clean forward there."""
    if base:
        return model.run_plan(batch, base, capture=capture, logits_to_keep=keep, prefix=False)  # type: ignore[no-any-return]
    return model.run_plan(batch, base, capture=capture, logits_to_keep=keep)
