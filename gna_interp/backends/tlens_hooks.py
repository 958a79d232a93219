"""The TransformerLens backend's taps and hook functions (`backends.tlens`): `Tap` (the input
or output of one module of a block), the bridge's hook-point calls across TransformerLens
versions, and the hook functions that read, edit, stash or skip a tapped tensor during one
forward. Each hook function takes the tapped tensor and returns it (edited)."""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch import Tensor, nn

from ..core.errors import SiteNotFiredError
from ..core.plan import Edit, Read, Site, SiteKind, apply_edits

HookFn = Callable[[Tensor], Tensor]
View = tuple[str, tuple[int, ...]]
"""How a site sits in its tap's tensor: ``("all", ())``, ``("heads", (n_heads, d_head))``
or ``("columns", (first, units, width))``."""


@dataclass(frozen=True)
class Tap:
    """The input or output of one module in block ``layer`` (``n_layers``: the final norm).

    ``hook`` is the bridge's hook point on that side of the module when the bridge wraps
    it (its ``hook_in`` / ``hook_out``, or the attention's ``hook_pattern``); empty for a
    raw torch hook on the module. ``item`` picks one item of a tuple output (raw hooks)."""

    layer: int
    path: str
    io: str
    hook: str = ""
    item: int = 0


def _hook_prefix(hook_name: str) -> str:
    """``"blocks.0.attn.hook_pattern"`` -> ``"blocks.0.attn.hook_"``: what every hook point
    of that module (and none of its children) is named."""
    return hook_name.rpartition(".hook_")[0] + ".hook_"


def _in_input_dtype(hf_norm: nn.Module) -> Callable[..., Tensor]:
    def forward(hidden_states: Tensor, **kwargs: Any) -> Tensor:
        return hf_norm(hidden_states).to(hidden_states.dtype)

    return forward


def _check_hook_to_add(bridge: Any, point: Any, name: str, fn: HookFn) -> None:
    """The bridge's own check before a hook is added (it refuses gated-off hook points).
    TransformerLens 4.x takes ``(point, name, hook)``; 3.9 took the name alone."""
    if "hook_point" in _parameter_names(type(bridge).check_hooks_to_add):
        bridge.check_hooks_to_add(point, name, fn)
    else:
        bridge.check_hooks_to_add(name)


def _add_forward_hook(point: Any, fn: HookFn) -> Any:
    """``point.add_hook(fn)``'s handle: TransformerLens 4.x returns it; 3.9 returns None and
    appends it to ``point.fwd_hooks``."""
    handle = point.add_hook(fn, dir="fwd")
    return point.fwd_hooks[-1] if handle is None else handle


@cache
def _parameter_names(function: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def _remove_handle(point: Any, handle: Any) -> None:
    handle.hook.remove()
    point.fwd_hooks[:] = [kept for kept in point.fwd_hooks if kept is not handle]


def _describe(tap: Tap) -> str:
    where = f"hook {tap.hook!r}" if tap.hook else f"module {tap.path!r}"
    return f"the {tap.io} of layer {tap.layer}'s {where}"


def _select(value: Tensor, read: Read) -> Tensor:
    for dim, index in read.selects:
        value = value.index_select(dim, index.to(value.device))
    return value


# ----- hook functions: each takes the tapped tensor and returns it (edited) ---------------------


Need = Site | Read | str
"""What a hook is for: a site of the plan or a capture, a `Read`, or a phrase (``"the start
residual"``, ``"the skip of block 2"``, ...)."""


def _firing(fn: HookFn, key: tuple[Tap, Need], counts: Counter[tuple[Tap, Need]]) -> Callable[..., Tensor]:
    """``fn`` counting its firings in ``counts[key]``."""

    def hook(act: Tensor, hook: Any = None) -> Tensor:
        counts[key] += 1
        return fn(act)

    return hook


def _check_fired(keys: Iterable[tuple[Tap, Need]], counts: Counter[tuple[Tap, Need]]) -> None:
    """Raise `SiteNotFiredError` for the first hook that fired 0 times in the forward: its
    module was not called, so its site was neither edited nor captured."""
    for tap, need in keys:
        if counts[(tap, need)] == 0:
            if isinstance(need, Site):
                what = need.describe()
            elif isinstance(need, Read):
                what = f"{need.kind.value} read{f' {need.name!r}' if need.name else ''} at layer {need.layer}, mixer {need.mixer}"
            else:
                what = need
            raise SiteNotFiredError(
                f"backend 'tlens': {_describe(tap)} never ran in this forward (module {tap.path!r} fired 0 times): the "
                f"plan's {what} was neither edited nor read. The model computed layer {tap.layer} without calling "
                "that module, as a fused kernel does (one that reads the module's weights): run the model on its "
                "PyTorch path (without the kernel package) to hook it",
                need,
                tap.path,
            )


def _site_hook(site: Site, view: View, edits: list[Edit], keep: bool, captured: dict[Site, Tensor], grad: bool) -> HookFn:
    kind, shape = view

    def hook(act: Tensor) -> Tensor:
        flat = act.reshape(*act.shape[:2], -1)
        if kind == "columns":
            first, units, width = shape
            piece = flat[..., first : first + units * width].reshape(*flat.shape[:2], units, width)
        else:
            piece = flat.reshape(*flat.shape[:2], *shape) if kind == "heads" else act
        piece = apply_edits(piece, edits)
        if grad and site.kind is SiteKind.MLP_IN:  # the block's residual add reads this tensor too: the norm gets its own copy
            piece = piece.clone()
        if keep:
            captured[site] = piece if grad else piece.detach()
        if kind != "columns":
            return piece.reshape(act.shape) if (edits or keep) else act
        if not edits and not grad:
            return act
        flat = flat.clone()
        flat[..., first : first + units * width] = piece.reshape(*flat.shape[:2], units * width)
        return flat.reshape(act.shape)

    return hook


def _start_hook(resid: Tensor) -> HookFn:
    def hook(act: Tensor) -> Tensor:
        return resid.to(act.device, act.dtype)

    return hook


def _last_positions(k: int) -> HookFn:
    """The unembedding's input narrowed to the last ``k`` positions: logits there alone."""

    def hook(act: Tensor) -> Tensor:
        return act[:, -k:]

    return hook


def _stash_hook(layer: int, stash: dict[int, Tensor]) -> HookFn:
    def hook(act: Tensor) -> Tensor:
        stash[layer] = act
        return act

    return hook


def _skip_hook(layer: int, rows: Tensor, stash: dict[int, Tensor]) -> HookFn:
    def hook(act: Tensor) -> Tensor:
        return torch.where(rows.to(act.device).view(-1, 1, 1), stash.pop(layer), act)

    return hook


def _read_hook(read: Read, slot: int, values: list[Tensor], grad: bool) -> HookFn:
    def hook(act: Tensor) -> Tensor:
        if act is None:
            raise RuntimeError(f"layer {read.layer} returned no attention weights: its attention does not compute them (not eager)")
        value = _select(act, read)
        values[slot] = value if grad else value.detach()
        return act

    return hook


# ----- raw torch hooks for modules the bridge does not wrap -----------------------------------


def _enter_block(layer: int, running: list[int]) -> Callable[..., None]:
    def pre(module: nn.Module, args: Any) -> None:
        running[0] = layer

    return pre


def _raw_pre(fns: list[Callable[..., Tensor]], only: int | None, running: list[int]) -> Callable[..., Any]:
    """Edit the module's first input (positional, or ``hidden_states``)."""

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> Any:
        if only is not None and running[0] != only:
            return None
        act = args[0] if args else kwargs["hidden_states"]
        for fn in fns:
            act = fn(act)
        if args:
            return (act, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": act}

    return pre


def _raw_post(fns: list[Callable[..., Tensor]], item: int, only: int | None, running: list[int]) -> Callable[..., Any]:
    """Edit the module's output (item ``item`` of a tuple output)."""

    def post(module: nn.Module, args: Any, output: Any) -> Any:
        if only is not None and running[0] != only:
            return None
        act = output[item] if isinstance(output, tuple) else output
        for fn in fns:
            act = fn(act)
        return (*output[:item], act, *output[item + 1 :]) if isinstance(output, tuple) else act

    return post
