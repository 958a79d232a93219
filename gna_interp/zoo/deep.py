"""Deep (and wide) models that compute a bundled toy: discovery at scale, with a known answer.

`deep_toy` builds an ``n_layers``-layer model of the toy's family. The toy's layers sit
at depth (layers ``at``, ``at + 1``, ...; default ``at = n_layers // 2 - 1``, so a
2-layer toy lands at ``L/2 - 1`` and ``L/2``); its embeddings, final norm and unembedding
are the toy's. Every other layer is a randomly initialised block whose output
projections are zero (Llama: attention ``o_proj`` and MLP ``down_proj``; Mamba-1 and
Mamba-2: ``mixer.out_proj``), so it adds exactly zero to the residual stream: the deep
model computes the toy's function, bit for bit, and its G&A heads are the toy's, shifted
by ``at`` layers. `benchmarks/discover_scale.py` measures what discovery costs on them.

Wide (Mamba-1, ``width=``): every layer has ``width`` channels (each a head), as
Falcon-Mamba-7B's 8,192. In the toy's layers its trained channels sit at `placed_channels`
(spread over the layer, in their order) among *filler* channels; every channel of the
other layers is filler. Filler channels are live: randomly initialised, they run and
write into the residual stream through out-projection columns scaled by ``filler_scale``.
They never feed a trained channel's B, C or dt: Mamba-1's ``x_proj`` reads every channel,
so its columns that read filler channels in the toy's layers are zero (the conv is per
channel). The trained channels therefore see the toy's inputs up to the filler layers'
small writes into the residual stream: the model computes the toy's answers up to a small
perturbation, and attribution on filler channels is small but not zero.
`benchmarks/wide_toy.py` measures the full size (4,096 x 32) and its accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..core.errors import GnaValueError
from ..core.heads import Head
from .store import toy_names, toy_path

# Per family: the modules of a block that write into the residual stream (zeroed in filler layers).
WRITERS = {
    "llama": ("self_attn.o_proj", "mlp.down_proj"),
    "mamba2": ("mixer.out_proj",),
    "mamba": ("mixer.out_proj",),
}

FILLER_SCALE = 0.01
"""Default factor on the filler channels' out-projection columns (of HF's initialisation)."""

# Mamba-1 mixer parameters indexed by channel: (parameter, dimension of the channel index).
_CHANNEL_ROWS = ("conv1d.weight", "conv1d.bias", "dt_proj.weight", "dt_proj.bias", "A_log", "D")


def placed_channels(n_channels: int, width: int, seed: int = 0) -> list[int]:
    """Where a wide `deep_toy` puts the toy's ``n_channels`` trained channels among ``width``:
    a seeded random choice, sorted (toy channel ``c`` goes to the ``c``-th of them)."""
    if isinstance(width, bool) or not isinstance(width, int) or width < n_channels:
        raise GnaValueError(f"width={width!r}: expected an int >= the toy's {n_channels} channels per layer")
    chosen = torch.randperm(width, generator=torch.Generator().manual_seed(seed))[:n_channels]
    return sorted(int(c) for c in chosen)


def deep_head(head: Head | str, at: int, channels: list[int] | None = None) -> Head:
    """Where a toy head lands in a `deep_toy`: layer shifted by ``at``, channel through
    ``channels`` (`placed_channels`; ``None``: not wide, the same index)."""
    head = Head.parse(head) if isinstance(head, str) else head
    return Head(head.layer + at, head.head if channels is None else channels[head.head])


def deep_toy(
    name: str | Path,
    n_layers: int,
    *,
    at: int | None = None,
    width: int | None = None,
    filler_scale: float = FILLER_SCALE,
    backend: str | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> Any:
    """A bundled toy's layers placed at depth in an ``n_layers``-layer model (module docs).

    Args:
        name: a bundled toy of a family in `WRITERS` (``"llama"``, ``"mamba2"``, ...), or
            the folder of a toy trained by ``gna-interp zoo train``.
        n_layers: layers of the deep model (at least the toy's).
        at: the layer the toy's layer 0 goes to (default ``n_layers // 2 - 1``, at least 0).
        width: Mamba-1 toys only: channels per layer (a multiple of the hidden size, at
            least the toy's channels), with live filler channels (module docs); ``None``:
            the toy's width, filler layers writing exactly zero.
        filler_scale: with ``width``, the factor on the filler channels' out-projection
            columns (0 makes the wide model compute the toy exactly).
        backend: as `gna_interp.load`.
        seed: seed of the filler weights (and, with ``width``, of `placed_channels`).
        device: as `gna_interp.load` (built on the CPU, then moved).

    Returns:
        a `GnaModel` named ``toy-<name>-deep<L>`` (``-w<width>`` when wide) with the
        toy's tokenizer; toy head ``LlHc`` is its ``deep_head(LlHc, at, channels)``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models.loading import load, quiet_weight_loading
    from ..models.registry import spec_for

    folder = _toy_folder(name)
    name = folder.name if str(name) not in toy_names() else str(name)
    with quiet_weight_loading(local=True):
        toy = AutoModelForCausalLM.from_pretrained(str(folder))
    family = toy.config.model_type
    if family not in WRITERS:
        raise GnaValueError(f"deep_toy supports the families {sorted(WRITERS)}; toy {name!r} is a {family!r}")
    depth = int(toy.config.num_hidden_layers)
    at = max(0, n_layers // 2 - 1) if at is None else at
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < depth:
        raise GnaValueError(f"n_layers={n_layers!r}: expected an int >= the toy's {depth} layers")
    if not 0 <= at <= n_layers - depth:
        raise GnaValueError(f"at={at!r}: the toy's {depth} layers must fit in 0..{n_layers - 1}; expected 0..{n_layers - depth}")
    settings = toy.config.to_dict()
    settings["num_hidden_layers"] = n_layers
    settings.pop("layer_types", None)  # derived from the layer count where a family has it
    channels = None
    if width is not None:
        channels = _wide_settings(name, toy.config, settings, width, filler_scale, seed)
    config = type(toy.config).from_dict(settings)
    torch.manual_seed(seed)
    deep = AutoModelForCausalLM.from_config(config)
    layers_path = spec_for(config).layers_path
    prefix = f"{layers_path}."
    toy_layers = set(range(at, at + depth))
    if channels is None:
        _load_shifted(deep, toy.state_dict(), prefix, at, toy_layers)
        with torch.no_grad():
            for layer, block in enumerate(deep.get_submodule(layers_path)):
                if layer not in toy_layers:
                    for path in WRITERS[family]:
                        for parameter in block.get_submodule(path).parameters():
                            parameter.zero_()
    else:
        _load_wide(deep, toy, layers_path, at, channels, filler_scale)
    suffix = "" if width is None else f"-w{width}"
    deep.config.name_or_path = f"toy-{name}-deep{n_layers}{suffix}"
    deep.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = load(deep, tokenizer=tokenizer, backend=backend, device=device)
    model.name = f"toy-{name}-deep{n_layers}{suffix}"
    return model


def _toy_folder(name: str | Path) -> Path:
    """A bundled toy's folder, or a trained toy's folder (with ``config.json``)."""
    if str(name) in toy_names():
        return toy_path(str(name))
    folder = Path(name)
    if not (folder / "config.json").is_file():
        raise GnaValueError(f"unknown toy model {str(name)!r}: expected one of {toy_names()} or a folder holding config.json")
    return folder


def _load_shifted(deep: Any, toy_state: dict[str, torch.Tensor], prefix: str, at: int, toy_layers: set[int]) -> None:
    """The toy's weights into ``deep``, its layer ``l`` at ``l + at``."""
    state = {}
    for key, value in toy_state.items():
        if key.startswith(prefix):
            index, rest = key[len(prefix) :].split(".", 1)
            key = f"{prefix}{int(index) + at}.{rest}"
        state[key] = value
    missing, unexpected = deep.load_state_dict(state, strict=False)
    if unexpected:
        raise RuntimeError(f"deep_toy: unexpected weights {unexpected[:3]}")
    untouched = [key for key in missing if not (key.startswith(prefix) and int(key[len(prefix) :].split(".", 1)[0]) not in toy_layers)]
    if untouched:
        raise RuntimeError(f"deep_toy: weights the toy should have given are missing: {untouched[:3]}")


def _wide_settings(name: str, config: Any, settings: dict[str, Any], width: int, filler_scale: float, seed: int) -> list[int]:
    """Check the wide arguments, set the config's width; the toy channels' places."""
    if config.model_type != "mamba":
        raise GnaValueError(f"width={width!r}: wide deep toys are Mamba-1 ('mamba') only; toy {name!r} is a {config.model_type!r}")
    hidden, toy_width = int(config.hidden_size), int(config.intermediate_size)
    channels = placed_channels(toy_width, width, seed)
    if width % hidden:
        raise GnaValueError(f"width={width!r}: expected a multiple of the toy's hidden size {hidden} (Mamba-1's width is expand x hidden)")
    if isinstance(filler_scale, bool) or not isinstance(filler_scale, (int, float)) or not 0 <= filler_scale < float("inf"):
        raise GnaValueError(f"filler_scale={filler_scale!r}: expected a finite number >= 0")
    settings["expand"] = width // hidden
    settings.pop("intermediate_size", None)  # derived from expand
    return channels


@torch.no_grad()
def _load_wide(deep: Any, toy: Any, layers_path: str, at: int, channels: list[int], filler_scale: float) -> None:
    """Embeddings, final norm and unembedding from the toy; the toy's channels into their
    places (`placed_channels`) of layers ``at``...; filler out-projections scaled, and the
    toy layers' ``x_proj`` columns of filler channels zero."""
    toy_layers = list(toy.get_submodule(layers_path))
    blocks = list(deep.get_submodule(layers_path))
    width = int(deep.config.intermediate_size)
    index = torch.tensor(channels)
    target = deep.state_dict()
    for key, value in toy.state_dict().items():  # everything outside the layers
        if not key.startswith(f"{layers_path}."):
            target[key].copy_(value)
    for block in blocks:
        block.mixer.out_proj.weight.mul_(filler_scale)
    for layer, source in enumerate(toy_layers):
        block, mixer, toy_mixer = blocks[layer + at], blocks[layer + at].mixer, source.mixer
        block.norm.weight.copy_(source.norm.weight)
        for path in _CHANNEL_ROWS:
            mixer.get_parameter(path)[index] = toy_mixer.get_parameter(path)
        rows = torch.cat([index, index + width])  # in_proj: x rows, then gate rows
        mixer.in_proj.weight[rows] = toy_mixer.in_proj.weight
        if mixer.in_proj.bias is not None:
            mixer.in_proj.bias[rows] = toy_mixer.in_proj.bias
        mixer.x_proj.weight.zero_()  # B, C and dt read the trained channels alone
        mixer.x_proj.weight[:, index] = toy_mixer.x_proj.weight
        mixer.out_proj.weight[:, index] = toy_mixer.out_proj.weight
        if mixer.out_proj.bias is not None:
            mixer.out_proj.bias.copy_(toy_mixer.out_proj.bias)
