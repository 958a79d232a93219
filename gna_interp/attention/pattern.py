"""`attention_pattern`: one call for every kind of head.

Attention heads give their softmax probabilities; SSM heads (Mamba-2 heads, Mamba-1 /
FalconMamba / Jamba channels) give their implicit attention (see
`gna_interp.attention.implicit`). One list may mix both kinds (a hybrid's attention and
SSM heads, even two mixers of one FalconH1 layer): the result is one ``[batch, head,
query, key]`` tensor, heads in the order given. Everything is read in one forward of the
model through its backend, with the model's active interventions (``model.ablated(...)``)
and ``interventions`` applied.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from ..core.arch import LayerKind
from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..core.interventions import Intervention, as_interventions
from ..core.keywords import renamed, renamed_message, suggest_keywords
from ..core.plan import Read, Site
from ..models.handle import check_model
from .capture import SSMInputs, recipe_for
from .implicit import implicit_rows, work_bytes
from .positions import QueryPositions, query_rows
from .sharpness import NORMALIZE_OPTIONS, Normalize, normalize_rows
from .softmax import softmax_read, softmax_rows

if TYPE_CHECKING:
    from ..core.inputs import Batch
    from ..models.handle import GnaModel

HeadKind = Literal["attention", "ssm", "all"]
KINDS: dict[LayerKind, str] = {LayerKind.ATTENTION: "attention", LayerKind.SSM: "ssm"}
OLD_KINDS = {"softmax": "attention", "implicit": "ssm"}
"""``kind=``'s old values (issue 53: ``kind`` names a head kind as everywhere else), kept for one release."""
DEFAULT_MAX_BYTES = 2 * 1024**3
"""Default memory budget of one `attention_pattern` call (2 GiB)."""


@renamed(inputs="clean")
@suggest_keywords
def attention_pattern(
    model: GnaModel,
    clean: Any,
    heads: Head | Iterable[Head],
    *,
    query_positions: QueryPositions = None,
    include_skip: bool = False,
    normalize: Normalize = None,
    kind: HeadKind | None = None,
    interventions: Intervention | Sequence[Intervention] = (),
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Tensor:
    """Attention patterns of ``heads`` on the prompts ``clean``.

    Args:
        model: a loaded `GnaModel` (any backend, any architecture).
        clean: the prompts measured: prompts or token ids, as for `GnaModel.logits` (left-padded).
        heads: a `Head` or a list of them, from any layers; attention and SSM heads may
            be mixed.
        query_positions: the query rows to compute (see `QueryPositions`): ``None`` for
            all ``T`` rows, ``[-1]`` for every prompt's final token, a ``[batch]`` or
            ``[batch, query]`` tensor for per-prompt rows (e.g. segment ends). Each row
            costs ``O(T)`` memory; no ``T x T`` matrix is built for SSM heads.
        include_skip: SSM heads only: add ``D_h`` on the diagonal.
        normalize: ``None`` (raw values: probabilities for softmax heads, signed
            ``M[t, s]`` for SSM heads), ``"abs"`` (``|M|``) or ``"row"`` (``|M|`` divided by
            its row sum: a distribution over keys, for display).
        kind: ``"attention"`` (softmax patterns) or ``"ssm"`` (implicit ones) to insist on
            that kind of head, as ``kind`` chooses heads elsewhere (default ``None`` or
            ``"all"``: each head gives its own kind).
        interventions: applied during the forward, after the model's active ones.
        max_bytes: memory budget; a larger request raises before any work.

    Returns:
        ``[batch, head, query, key]`` float32, heads in the order given, ``key`` = every
        position. Zero above the diagonal, on padding keys and on padding queries.
    """
    check_model(model, "attention_pattern")
    if normalize not in NORMALIZE_OPTIONS:
        raise GnaValueError(f"normalize={normalize!r}: expected one of {NORMALIZE_OPTIONS}")
    heads = _as_heads(model, heads)
    _check_kinds(model, heads, _new_kind(kind), include_skip)
    batch = model.to_batch(clean)
    rows = query_rows(query_positions, batch.n_rows, batch.n_pos)
    _check_budget(batch, len(heads), rows, query_positions, max_bytes)
    located = {head: model.head_site(head) for head in heads}
    per_site: dict[Site, list[int]] = {}
    for site, index in sorted(located.values()):
        if index not in per_site.setdefault(site, []):
            per_site[site].append(index)
    computed = _compute(model, batch, per_site, rows, as_interventions(interventions), include_skip)
    columns = [computed[site][:, per_site[site].index(index)] for site, index in (located[head] for head in heads)]
    return normalize_rows(torch.stack(columns, dim=1), normalize)


def _as_heads(model: GnaModel, heads: Head | Iterable[Head]) -> list[Head]:
    if isinstance(heads, Head):
        heads = [heads]
    elif isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise GnaTypeError(f"heads must be a gna_interp.Head or a list of them, got {heads!r}")
    items = list(heads)
    if not items:
        raise GnaValueError("heads is empty: expected at least one gna_interp.Head")
    for head in items:
        model.check_head(head)
    return items


def _new_kind(kind: str | None) -> str | None:
    """``kind`` in today's values (``None`` for "all"); an old one warns and is mapped."""
    if kind in OLD_KINDS:
        message = renamed_message("attention_pattern()", f"kind={kind!r}", f"kind={OLD_KINDS[kind]!r}")
        warnings.warn(message, FutureWarning, stacklevel=5)  # the caller of attention_pattern
        return OLD_KINDS[kind]
    return None if kind == "all" else kind


def _check_kinds(model: GnaModel, heads: list[Head], kind: str | None, include_skip: bool) -> None:
    kinds = {head: KINDS[model.head_kind(head)] for head in heads}
    if kind is not None and kind not in KINDS.values():
        raise GnaValueError(f"kind={kind!r}: expected 'attention', 'ssm', 'all' or None")
    if kind is not None and any(k != kind for k in kinds.values()):
        present = sorted({KINDS[model.head_kind(h)] for h in model.heads})
        wrong = [str(h) for h in heads if kinds[h] != kind]
        have = " and ".join(present) + ("" if len(present) > 1 else " heads only")
        raise GnaValueError(f"kind={kind!r} but heads {wrong} are not {kind} heads: {model.name} has {have}")
    if include_skip and any(k == "attention" for k in kinds.values()):
        wrong = [str(h) for h in heads if kinds[h] == "attention"]
        raise GnaValueError(f"include_skip=True adds an SSM's D on the diagonal, but heads {wrong} are softmax attention heads")


def _check_budget(batch: Batch, n_heads: int, rows: Tensor, query_positions: QueryPositions, max_bytes: int) -> None:
    need = work_bytes(batch.n_rows, n_heads, rows.shape[1], batch.n_pos)
    if need <= max_bytes:
        return
    what = f"{batch.n_rows} prompts x {n_heads} heads x {rows.shape[1]} queries x {batch.n_pos} keys"
    hint = (
        "pass query_positions (e.g. [-1] for each prompt's final token, or a [batch] tensor of segment ends) to compute only those rows"
        if query_positions is None
        else "ask for fewer heads, rows or prompts per call"
    )
    raise GnaValueError(f"attention patterns for {what} need about {need / 2**20:,.0f} MiB, over max_bytes={max_bytes:,}: {hint}")


@renamed(inputs="clean")
def ssm_inputs(
    model: GnaModel, clean: Any, layer: int, heads: Sequence[int] | None = None, interventions: Sequence[Intervention] = ()
) -> SSMInputs:
    """The `SSMInputs` (``dt``, ``A``, ``B``, ``C``, ``D``, padding mask) of one SSM layer,
    read from a real forward on the prompts ``clean``, for ``heads`` (head numbers in the layer, as in `Head`;
    default: every SSM head of the layer). In a hybrid layer the heads must all be SSM
    heads (of its one SSM mixer); the result indexes them in the order given."""
    model.check_layer(layer)
    ssm = [mixer for mixer in model.layer_specs[layer].mixers if mixer.kind is LayerKind.SSM]
    if not ssm:
        raise GnaValueError(
            f"layer {layer} of {model.name} is an {model.layer_kinds[layer].value} layer: SSM inputs exist only in SSM layers"
        )
    numbers = list(range(ssm[0].offset, ssm[0].offset + ssm[0].n_heads)) if heads is None else list(heads)
    sites = [model.head_site(Head(layer, number)) for number in numbers]
    wrong = [str(Head(layer, n)) for n, (site, _) in zip(numbers, sites, strict=True) if model.mixer(site).kind is not LayerKind.SSM]
    if wrong:
        raise GnaValueError(f"heads {wrong} of {model.name} are attention heads: SSM inputs exist only for SSM heads")
    site = sites[0][0]
    batch = model.to_batch(clean)
    rows = torch.zeros(batch.n_rows, 1, dtype=torch.long)
    return _compute(model, batch, {site: [index for _, index in sites]}, rows, interventions, finish=False)[site]


def _compute(
    model: GnaModel,
    batch: Batch,
    per_site: dict[Site, list[int]],
    rows: Tensor,
    interventions: Sequence[Intervention],
    include_skip: bool = False,
    finish: bool = True,
) -> dict[Site, Any]:
    """One forward reading every mixer's inputs; ``head site -> [batch, head, query, key]``
    (or ``site -> SSMInputs`` with ``finish=False``), heads in ``per_site`` order."""

    reads: list[Read] = []
    spans: dict[Site, tuple[int, int, Tensor | None]] = {}
    for site, indices in per_site.items():
        mixer = model.mixer(site)
        index = torch.tensor(indices, dtype=torch.long)
        if mixer.kind is LayerKind.ATTENTION:
            read, union = softmax_read(site.layer, index, rows, mixer.index)
            layer_reads, extra = [read], union
        else:
            layer_reads, extra = recipe_for(mixer.spec.recipe).reads(mixer.dims, site.layer, mixer.index, index), None  # type: ignore[arg-type]
        spans[site] = (len(reads), len(reads) + len(layer_reads), extra)
        reads += layer_reads
    plan = model.compile_plan(batch, [*model.active_interventions, *interventions])
    with torch.no_grad():
        values = model.run_plan(batch, plan, reads=reads, logits_to_keep=1).reads  # logits unread; from a held prefix
    mask = batch.attention_mask.bool()
    out: dict[Site, Any] = {}
    for site, (start, stop, query_union) in spans.items():
        if query_union is not None:
            out[site] = softmax_rows(values[start], rows, query_union, mask)
            continue
        mixer = model.mixer(site)
        index = torch.tensor(per_site[site], dtype=torch.long)
        recipe = recipe_for(mixer.spec.recipe)
        ssm = recipe.build(mixer.dims, [v.to(mask.device) for v in values[start:stop]], index, mask)  # type: ignore[arg-type]
        out[site] = implicit_rows(ssm, rows, include_skip) if finish else ssm
    return out
