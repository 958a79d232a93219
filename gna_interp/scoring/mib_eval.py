"""``path="mib"``: MIB's own evaluation of an edge circuit (its ``eap.evaluate.evaluate_graph``
with ``intervention="patching"``), for the Transformers MIB's scheme describes.

One forward of the clean prompts in which every receiver (each head's ``q``, ``k``, ``v``
input, each MLP's input, the logits) reads the residual stream of *this* run, minus the
outputs in this run of its senders outside the circuit, plus those senders' outputs on the
corrupted prompts. A kept edge carries its sender's output as the patched run computes it,
so the circuit's effects chain (``path="direct"`` reads the clean stream instead). A head's
output is its slice of the out-projection (its write, bias apart); ``input`` is the stream
entering block 0; an MLP's output is what it adds. With every edge out the logits are the
corrupted run's; with every edge in, the clean run's.

The blocks must be Llama's shape (the families of MIB's models but GPT-2): ``input_layernorm``
before an attention with ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``, one key and value
head per query head (MIB ungroups grouped-query attention; this does not), then the MLP's
norm and MLP of the architecture table. Anything else raises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from ..core.errors import GnaValueError
from .mib_graph import Scheme

if TYPE_CHECKING:
    from ..models.handle import GnaModel


class _Blocks:
    """The modules of ``model``'s blocks that MIB's evaluation hooks, checked."""

    def __init__(self, model: GnaModel, scheme: Scheme) -> None:
        hf, config = model.hf_model, model.hf_model.config
        if scheme.family is not None or not model.arch.mlp:
            raise GnaValueError(
                f"path='mib' evaluates MIB's own graph (Transformers): {model.arch.family} uses the extension; use path='direct' or 'all'"
            )
        if getattr(config, "num_key_value_heads", config.num_attention_heads) != config.num_attention_heads:
            raise GnaValueError(
                "path='mib': grouped-query attention (MIB ungroups it, giving every query head its own key and value input): not supported"
            )
        self.layers = hf.get_submodule(model.arch.layers_path)
        self.final_norm = hf.get_submodule(model.arch.final_norm_path)
        self.mlp_norm, self.mlp = model.arch.mlp
        self.n_heads, self.d_head = scheme.layers[0][0].n_heads, model.layout.head_dim
        for layer in self.layers:
            for name in (
                "input_layernorm",
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
                self.mlp_norm,
                self.mlp,
            ):
                try:
                    layer.get_submodule(name)
                except AttributeError:
                    raise GnaValueError(
                        f"path='mib' needs Llama-shaped blocks; {model.arch.family}'s has no {name!r}: use path='direct'"
                    ) from None


def mib_metric(model: GnaModel, clean: Any, corrupt: Any, metric: Any, scheme: Scheme, circuits: list[Tensor]) -> tuple[float, list[float]]:
    """``(m(N), [m(C) for each circuit])``: the clean model's metric and, per circuit
    (``[n_edges]`` bool over ``scheme.edges()``), the metric of MIB's patched run."""
    from ..patching.metrics import reduce_metric

    blocks = _Blocks(model, scheme)
    clean_batch, corrupt_batch = model.to_batch(clean), model.to_batch(corrupt)
    if clean_batch.input_ids.shape != corrupt_batch.input_ids.shape:
        raise GnaValueError(
            f"clean {tuple(clean_batch.input_ids.shape)} and corrupt {tuple(corrupt_batch.input_ids.shape)}: expected the same shape"
        )
    senders = {name: i for i, name in enumerate(scheme.senders())}
    receivers = {key: j for j, key in enumerate(scheme.receivers())}
    parent = torch.tensor([senders[p] for p, _, _ in scheme.edges()])
    child = torch.tensor([receivers[(c, q)] for _, c, q in scheme.edges()])
    with torch.no_grad():
        corrupted = _run(model, blocks, corrupt_batch, None)[1]
        full = reduce_metric(metric(_run(model, blocks, clean_batch, None)[0]), metric, clean_batch.n_rows)
        values = []
        for kept in circuits:
            out = torch.zeros(len(senders), len(receivers))
            out[parent[~kept], child[~kept]] = 1.0  # [sender, receiver]: 1 where the edge is outside the circuit
            logits = _run(model, blocks, clean_batch, (corrupted, out))[0]
            values.append(reduce_metric(metric(logits), metric, clean_batch.n_rows))
    return full, values


def _run(model: GnaModel, blocks: _Blocks, batch: Any, patch: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """``(logits, outputs)``: one forward of ``batch``; ``outputs`` ``[sender, batch, pos,
    d_model]``, every sender's output in this run. With ``patch = (corrupted outputs, out)``
    each receiver reads the stream plus ``sum_s out[s, r] (corrupted[s] - outputs[s])``."""
    H, dh = blocks.n_heads, blocks.d_head
    outputs: list[Tensor] = []
    handles: list[Any] = []

    def delta(receiver: slice | int) -> Tensor:
        """``[batch, pos, (receivers,) d_model]``: the ablated senders' corrupt - this run."""
        assert patch is not None
        corrupted, out = patch
        diff = corrupted[: len(outputs)] - torch.stack(outputs)
        weights = out[: len(outputs), receiver].to(diff.dtype).to(diff.device)
        return torch.einsum("sbpd,s...->bp...d", diff, weights)

    def on_embed(module: nn.Module, args: tuple[Any, ...]) -> None:
        outputs.append(args[0].detach())

    pending: dict[int, Tensor] = {}  # id(projection) -> its output for this forward

    def on_ports(layer: int, attn: nn.Module) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if patch is None:
                return
            resid, base = args[0], layer * (3 * H + 1)
            for index, proj in enumerate(_projections(attn)):
                start = base + index * H
                x = module.forward(resid[:, :, None, :] + delta(slice(start, start + H)))  # [batch, pos, head, d_model]; .forward: no hooks
                value = torch.einsum("bphd,hed->bphe", x, proj.weight.view(H, dh, -1)).flatten(2)
                pending[id(proj)] = value + proj.bias if proj.bias is not None else value

        return hook

    def on_port(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        return pending.pop(id(module), None)

    def on_heads(module: nn.Module, args: tuple[Any, ...]) -> None:
        z = args[0].view(*args[0].shape[:2], H, dh)
        writes = torch.einsum("bphe,dhe->hbpd", z, cast(Tensor, module.weight).view(-1, H, dh))
        outputs.extend(writes.unbind(0))

    def on_mlp_in(layer: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> Any:
            if patch is not None:
                return (args[0] + delta(layer * (3 * H + 1) + 3 * H), *args[1:])
            return None

        return hook

    def on_mlp_out(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        outputs.append(output.detach())

    def on_logits(module: nn.Module, args: tuple[Any, ...]) -> Any:
        return (args[0] + delta(-1), *args[1:]) if patch is not None else None

    try:
        for layer, block in enumerate(blocks.layers):
            norm, attn = block.get_submodule("input_layernorm"), block.get_submodule("self_attn")
            if layer == 0:
                handles.append(norm.register_forward_pre_hook(on_embed))
            handles.append(norm.register_forward_pre_hook(on_ports(layer, attn)))
            handles += [proj.register_forward_hook(on_port) for proj in _projections(attn)]
            handles.append(attn.get_submodule("o_proj").register_forward_pre_hook(on_heads))
            handles.append(block.get_submodule(blocks.mlp_norm).register_forward_pre_hook(on_mlp_in(layer)))
            handles.append(block.get_submodule(blocks.mlp).register_forward_hook(on_mlp_out))
        handles.append(blocks.final_norm.register_forward_pre_hook(on_logits))
        logits = model.hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    finally:
        for handle in handles:
            handle.remove()
    return logits, torch.stack(outputs)


def _projections(attn: nn.Module) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    """The attention's ``q_proj``, ``k_proj``, ``v_proj``."""
    q, k, v = (cast(nn.Linear, attn.get_submodule(name)) for name in ("q_proj", "k_proj", "v_proj"))
    return q, k, v
