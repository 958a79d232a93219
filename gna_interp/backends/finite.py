"""Bad numbers are named: logits that hold NaN or inf raise, saying where they began.

A model whose weights hold a NaN, or whose bf16 activations overflow at real widths,
returns logits that score as silently as good ones (one NaN weight in a tiny model scored
accuracy 0.125 and said nothing). Every forward of both backends therefore checks its
logits on the real tokens (padding positions are not scored and not checked) and raises
`NonFiniteLogitsError` when one is NaN or infinite. Clean logits cost one min-and-max
reduction in their own dtype (NaN carries into both, +inf shows in the max, -inf in the min;
no copy: a float32 sum of bf16 logits made a float32 copy of them, twice their memory);
only a non-finite extreme looks at positions (padding may hold NaN in some models).

The error names where values first turn non-finite. The same forward (same plan, same
batch) runs once more with the residual stream entering every block and every mixer's
heads (the input of its out-projection) captured; the first block whose output is
non-finite while its input is finite is named, with the first head whose output is
already non-finite there, or else "after the heads" (the out-projection, the MLP, a
norm). Non-finite parameters of a local model are listed too; for an out-projection
weight, with the heads whose columns hold them. That second forward runs only when the
check fails; it leaves no hook behind, as every forward.

An error rather than a warning: a sweep scored on NaN logits ranks heads by noise, and a
warning scrolls past in a loop of thousands of forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..core.arch import LayerSpec
from ..core.errors import GnaValueError
from ..core.inputs import Batch
from ..core.plan import Plan, Site, SiteKind
from .base import RunOutput


class NonFiniteLogitsError(GnaValueError):
    """The logits of a forward hold NaN or inf on a real token (see the module docs)."""


Runner = Callable[[Batch, Plan, Collection[Site]], RunOutput]
"""``(batch, plan, capture) -> RunOutput``: the backend's own forward, unchecked."""


def first_bad(values: Tensor, real: Tensor) -> tuple[int, int] | None:
    """``(row, position)`` of the first real token whose values (``[batch, pos, ...]``) are
    not all finite; ``real`` ``[batch, pos]`` bool marks the real tokens."""
    flat = values.reshape(values.shape[0], values.shape[1], -1)
    bad = ~torch.isfinite(flat).all(-1) & real.to(flat.device)
    if not bool(bad.any()):
        return None
    row, position = bad.nonzero()[0].tolist()
    return int(row), int(position)


def check_logits(
    backend: str, logits: Tensor, batch: Batch, plan: Plan, layers: Sequence[LayerSpec], run: Runner | None, root: nn.Module | None
) -> None:
    """Raise `NonFiniteLogitsError` if ``logits`` ``[batch, k, vocab]`` (the last ``k``
    positions of ``batch``) are non-finite on a real token.

    Args:
        backend: the backend's name, for the message.
        logits: what the forward returned.
        batch: its input; its attention mask marks the real tokens.
        plan: the plan it ran (run again, capturing, to locate the first bad value).
        layers: the model's layers (their head sites are captured).
        run: the backend's unchecked forward; ``None``: do not locate (a remote job).
        root: the HF model whose parameters are scanned; ``None``: not scanned (remote).
    """
    if logits.numel() == 0:
        return
    low, high = torch.aminmax(logits.detach())  # NaN and inf show in the extremes: the cheap common case, no copy
    if bool(torch.isfinite(low) & torch.isfinite(high)):
        return
    real = batch.attention_mask[:, batch.n_pos - logits.shape[1] :].bool()
    where = first_bad(logits.detach(), real)
    if where is None:
        return
    row, position = where
    position += batch.n_pos - logits.shape[1]
    kind = "NaN" if bool(torch.isnan(logits[row, position - batch.n_pos]).any()) else "inf"
    message = f"backend {backend!r}: the logits hold {kind} at row {row}, position {position}"
    if run is not None:
        message += f"; {locate(batch, plan, layers, run)}"
    if root is not None:
        message += bad_parameters(root, layers)
    raise NonFiniteLogitsError(message + ". Check the weights (a NaN loaded or written) and the dtype (bf16 / fp16 overflow)")


def locate(batch: Batch, plan: Plan, layers: Sequence[LayerSpec], run: Runner) -> str:
    """Where values first turn non-finite in ``plan``'s forward over ``batch`` (module docs)."""
    start, n_layers = plan.start_layer, len(layers)
    resid = [Site(SiteKind.RESID, layer) for layer in range(start, n_layers + 1)]
    heads = [Site(SiteKind.HEADS, spec.layer, mixer=m.index) for spec in layers[start:] for m in spec.mixers]
    with torch.no_grad():
        acts = run(batch, plan, {*resid, *heads}).acts
    real = batch.attention_mask.bool()
    for site in resid:
        where = first_bad(acts[site], real)
        if where is None:
            continue
        if site.layer == start:
            entering = "the embeddings" if start == 0 else f"the residual stream given to block {start}"
            return f"values are already non-finite in {entering} (row {where[0]}, position {where[1]})"
        block = site.layer - 1
        for mixer in layers[block].mixers:
            found = first_bad(acts[Site(SiteKind.HEADS, block, mixer=mixer.index)], real)
            if found is not None:
                values = acts[Site(SiteKind.HEADS, block, mixer=mixer.index)][found]
                head = int((~torch.isfinite(values.reshape(values.shape[0], -1)).all(-1)).nonzero()[0])
                return (
                    f"values first turn non-finite in layer {block}: head {head} of its mixer {mixer.path} (the input of "
                    f"its out-projection {mixer.out_proj_path}, row {found[0]}, position {found[1]})"
                )
        return (
            f"values first turn non-finite in layer {block} after its heads (their outputs are finite): in an "
            f"out-projection, the MLP or a norm of block {block} (row {where[0]}, position {where[1]})"
        )
    return "every block's output is finite: values turn non-finite in the final norm or the unembedding"


def bad_parameters(root: nn.Module, layers: Sequence[LayerSpec], limit: int = 3) -> str:
    """``"; non-finite parameters: <path> (<n> values, head(s) ...), ..."``, or ``""``."""
    out_projs = {f"{m.out_proj_path}.weight": m for spec in layers for m in spec.mixers}
    found: list[str] = []
    for name, parameter in root.named_parameters():
        if parameter.is_meta or bool(torch.isfinite(parameter).all()):
            continue
        path = name.replace("._original_component", "")  # the bridge's wrapper, as HF names it
        bad = ~torch.isfinite(parameter.detach())
        detail = f"{int(bad.sum())} value(s)"
        mixer = out_projs.get(path)
        if mixer is not None and parameter.dim() == 2 and parameter.shape[1] == mixer.n_heads * mixer.head_dim:
            heads = sorted({int(c) // mixer.head_dim for c in bad.any(0).nonzero().flatten()})
            detail += f", in the out-projection columns of head(s) {heads}"
        found.append(f"{path} ({detail})")
        if len(found) == limit:
            break
    return f"; non-finite parameters: {', '.join(found)}" if found else ""


def keep_last(logits: Tensor, logits_to_keep: int) -> Tensor:
    """``logits[:, -k:]`` for ``k > 0`` (a model whose unembedding could not be narrowed)."""
    return logits[:, -logits_to_keep:] if logits_to_keep > 0 else logits


def output_embedding_path(root: Any) -> str:
    """The path of ``root``'s unembedding (HF's ``get_output_embeddings()``, else a root
    ``lm_head`` linear layer, as in Cartesia's Llamba); ``""`` when it has none (logits are
    then computed at every position and sliced)."""
    get = getattr(root, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        linear = getattr(root, "lm_head", None)
        return "lm_head" if isinstance(linear, torch.nn.Linear) else ""
    return next((name for name, module in root.named_modules() if module is head and name), "")
