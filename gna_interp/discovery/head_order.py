"""The order in which group testing splits a wide layer's heads: the size of each head's write.

`group_testing.group_testing` halves a costly group in the order of its heads. In index order
the few heads that cost accuracy are scattered over many halves, each bisected down to them.
Ordered by a cheap importance statistic, they gather in the first halves and the rest is
cleared in few tests: `write_sizes` (each head's write into the residual stream, its output
through its out-projection columns, summed over the prompts' real positions: one clean forward)
and `by_size` (largest first). The findings do not depend on the order where effects are
monotone (every costly head lies in costly groups all the way down); the tests do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..backends.jobs import Job
from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.inputs import Batch
from ..core.plan import Plan, Site
from ..models.jobs import is_batched_remote, run_jobs
from ..patching.direct import write_scale

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import Task

ROWS = 64
"""`write_sizes` captures the head outputs of at most this many prompts a forward."""
CAPTURE_BYTES = 256 * 2**20
"""`write_sizes` reads at most this many bytes of head outputs in all: the first prompts that fit, at
least one (a Mamba-1 of 4,096 channels holds 600 positions x 4,096 floats per prompt and layer);
`discover` measures the order ahead of the baseline only where one prompt's fit
(`stages.early_head_order`)."""


def bytes_per_prompt(model: GnaModel, layers: Sequence[int], n_pos: int) -> int:
    """Bytes of the head outputs of ``layers`` for one prompt of ``n_pos`` positions (float32)."""
    sites = {site for layer in layers for site in model.head_sites(layer)}
    return 4 * n_pos * sum(model.mixer(site).n_heads * model.mixer(site).head_dim for site in sites)


def write_sizes(model: GnaModel, task: Task, layers: Sequence[int], *, prime: bool = False) -> dict[int, Tensor]:
    """Per layer of ``layers``, ``[n_heads]``: each head's write into the residual stream,
    ``|| W_h a_h ||`` (its output ``a_h`` ``[d_head]`` through its out-projection columns ``W_h``
    ``[d_model, d_head]``, times the mixer's `write_scale`), summed over the real positions
    (attention mask 1) of the first prompts whose head outputs fit in `CAPTURE_BYTES` (every
    prompt of a toy), in one clean forward (chunks of `ROWS` prompts, from an open prefix
    cache's clean stream where it holds one; one request on a remote model) capturing the
    layers' head sites. A Mamba-1 channel (``d_head`` 1): its activation size times its
    column's norm. Out-projection weights not held here (an NDIF model's structure lives on the
    meta device): the outputs' norms, ``|| a_h ||``, alone, so an NDIF run's order can differ
    from a local run's. ``prime``: the forward also gives an open prefix cache every prompt's
    clean residual streams (`GnaModel.remember_prefix`; a local model without active
    interventions): it is then the clean run, and `evaluate`'s baseline after it runs no block."""
    sites = sorted({site for layer in layers for site in model.head_sites(layer)})
    out = {layer: torch.zeros(model.heads_per_layer[layer], dtype=torch.float64) for layer in layers}
    if not sites:
        return out
    grams = {site: _gram(model, site) for site in sites}
    batch = task.gna_batch(model.tokenizer)
    read = min(batch.n_rows, max(1, CAPTURE_BYTES // bytes_per_prompt(model, layers, batch.n_pos)))  # prompts the sizes read
    spans = [(a, min(a + ROWS, read)) for a in range(0, read, ROWS)]
    spans += [(a, min(a + ROWS, batch.n_rows)) for a in range(read, batch.n_rows, ROWS)] if prime else []  # the cache's alone
    chunks = [(Batch(batch.input_ids[a:b], batch.attention_mask[a:b]), a < read) for a, b in spans]
    sums = {site: torch.zeros(model.mixer(site).n_heads, dtype=torch.float64) for site in sites}
    for chunk, acts in _captures(model, chunks, sites, prime):
        real = chunk.attention_mask.bool()  # [rows, pos]
        for site in sites:
            if site in acts:
                sums[site] += _norms(acts[site], grams[site])[real].sum(0).double().cpu()
    for site, total in sums.items():
        mixer = model.mixer(site)
        out[mixer.layer][mixer.offset : mixer.offset + mixer.n_heads] = total
    return out


def _captures(
    model: GnaModel, chunks: list[tuple[Batch, bool]], sites: list[Site], prime: bool = False
) -> Iterator[tuple[Batch, dict[Site, Tensor]]]:
    """Each chunk and its clean activations at ``sites`` (where its flag says so): a remote model's
    in one request, a local model's one chunk at a time (`run_jobs`: from an open prefix cache);
    under the model's active interventions (``model.ablated``), as discovery's clean run.
    ``prime`` (`write_sizes`): a local chunk's clean residual streams go to the open prefix cache too."""
    ambient = list(model.active_interventions)  # discovery's clean run is the one under them
    remote = is_batched_remote(model)
    prime = prime and not remote and not ambient

    def job(chunk: Batch, heads: bool) -> Job:
        capture = frozenset(sites if heads else ()) | (model.prefix_sites(chunk) if prime else frozenset())
        return Job(chunk, model.compile_plan(chunk, ambient) if ambient else Plan(), capture, keep=3)

    jobs = [job(chunk, heads) for chunk, heads in chunks]
    outputs = run_jobs(model, jobs) if remote else (run_jobs(model, [one])[0] for one in jobs)
    for (chunk, _), out in zip(chunks, outputs, strict=True):
        assert out is not None  # keep=3: the captures come back
        if prime:
            model.remember_prefix(chunk, out.acts)
        yield chunk, out.acts


def _gram(model: GnaModel, site: Site) -> Tensor | None:
    """``[n_heads, d_head, d_head]``: each head's ``W_h^T W_h`` times the squared `write_scale`
    (``None``: the weights are not held here, on the meta device)."""
    mixer = model.mixer(site)
    weight = model.hf_model.get_submodule(mixer.out_proj_path).weight.detach()  # [d_model, n_heads * d_head]
    if weight.is_meta:
        return None
    try:
        scale = write_scale(model, site)
    except GnaValueError:  # something else follows the out-projection: its columns alone
        scale = 1.0
    columns = weight.float().reshape(weight.shape[0], mixer.n_heads, mixer.head_dim)  # [d_model, head, d_head]
    return torch.einsum("mhd,mhe->hde", columns, columns) * scale**2


def _norms(acts: Tensor, gram: Tensor | None) -> Tensor:
    """``[rows, pos, head]``: ``|| W_h a_h ||`` of ``acts`` ``[rows, pos, head, d_head]`` by each head's
    ``gram`` (``None``: ``|| a_h ||``)."""
    acts = acts.float()
    if gram is None:
        return acts.norm(dim=-1)
    squared = torch.einsum("rphd,hde,rphe->rph", acts, gram.to(acts.device), acts)
    return squared.clamp_min(0.0).sqrt()


def by_size(heads: Sequence[Head], sizes: Tensor | None) -> list[Head]:
    """``heads`` largest ``sizes[head.head]`` first (`write_sizes`' row of their layer), ties by
    index; in index order where ``sizes`` is ``None``."""
    if sizes is None:
        return sorted(heads)
    outside = sorted(h for h in heads if not 0 <= h.head < len(sizes))
    if outside:
        raise GnaValueError(f"by_size: heads {outside[:8]}{' ...' if len(outside) > 8 else ''} do not fit {len(sizes)} sizes (a head each)")
    return sorted(heads, key=lambda head: (-float(sizes[head.head]), head))


def ordered_layers(model: GnaModel, task: Task, layers: Sequence[int], *, prime: bool = False) -> dict[int, list[Head]]:
    """Each of ``layers``' heads in group testing's order: `by_size` of `write_sizes` (one
    forward; ``prime``: `write_sizes`')."""
    sizes = write_sizes(model, task, layers, prime=prime)
    return {layer: by_size([Head(layer, h) for h in range(model.heads_per_layer[layer])], sizes.get(layer)) for layer in layers}
