"""Deep models that compute exactly a bundled toy: discovery at depth, with a known answer.

`deep_toy` builds an ``n_layers``-layer model of the toy's family. The toy's layers sit
at depth (layers ``at``, ``at + 1``, ...; default ``at = n_layers // 2 - 1``, so a
2-layer toy lands at ``L/2 - 1`` and ``L/2``); its embeddings, final norm and unembedding
are the toy's. Every other layer is a randomly initialised block whose output
projections are zero (Llama: attention ``o_proj`` and MLP ``down_proj``; Mamba-2:
``mixer.out_proj``), so it adds exactly zero to the residual stream: the deep model
computes the toy's function, bit for bit, and its G&A heads are the toy's, shifted by
``at`` layers. `benchmarks/discover_scale.py` measures what discovery costs on them.
"""

from __future__ import annotations

from typing import Any

import torch

from .store import toy_path

# Per family: the modules of a block that write into the residual stream (zeroed in filler layers).
WRITERS = {
    "llama": ("self_attn.o_proj", "mlp.down_proj"),
    "mamba2": ("mixer.out_proj",),
}


def deep_toy(name: str, n_layers: int, *, at: int | None = None, backend: str | None = None, seed: int = 0) -> Any:
    """A bundled toy's layers placed at depth in an ``n_layers``-layer model (module docs).

    Args:
        name: a bundled toy of a family in `WRITERS` (``"llama"``, ``"mamba2"``, ...).
        n_layers: layers of the deep model (at least the toy's).
        at: the layer the toy's layer 0 goes to (default ``n_layers // 2 - 1``, at least 0).
        backend: as `gna_interp.load`.
        seed: seed of the filler layers' random weights (they write nothing).

    Returns:
        a `GnaModel` named ``toy-<name>-deep<L>`` with the toy's tokenizer.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models.loading import load, quiet_weight_loading
    from ..models.registry import spec_for

    folder = toy_path(name)
    with quiet_weight_loading(local=True):
        toy = AutoModelForCausalLM.from_pretrained(str(folder))
    family = toy.config.model_type
    if family not in WRITERS:
        raise ValueError(f"deep_toy supports the families {sorted(WRITERS)}; toy {name!r} is a {family!r}")
    depth = int(toy.config.num_hidden_layers)
    at = max(0, n_layers // 2 - 1) if at is None else at
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < depth:
        raise ValueError(f"n_layers={n_layers!r}: expected an int >= the toy's {depth} layers")
    if not 0 <= at <= n_layers - depth:
        raise ValueError(f"at={at!r}: the toy's {depth} layers must fit in 0..{n_layers - 1}; expected 0..{n_layers - depth}")
    settings = toy.config.to_dict()
    settings["num_hidden_layers"] = n_layers
    settings.pop("layer_types", None)  # derived from the layer count where a family has it
    config = type(toy.config).from_dict(settings)
    torch.manual_seed(seed)
    deep = AutoModelForCausalLM.from_config(config)
    layers_path = spec_for(config).layers_path
    state = {}
    prefix = f"{layers_path}."
    for key, value in toy.state_dict().items():
        if key.startswith(prefix):
            index, rest = key[len(prefix) :].split(".", 1)
            key = f"{prefix}{int(index) + at}.{rest}"
        state[key] = value
    missing, unexpected = deep.load_state_dict(state, strict=False)
    if unexpected:
        raise RuntimeError(f"deep_toy: unexpected weights {unexpected[:3]}")
    toy_layers = set(range(at, at + depth))
    with torch.no_grad():
        for layer, block in enumerate(deep.get_submodule(layers_path)):
            if layer in toy_layers:
                continue
            for path in WRITERS[family]:
                for parameter in block.get_submodule(path).parameters():
                    parameter.zero_()
    untouched = [key for key in missing if not (key.startswith(prefix) and int(key[len(prefix) :].split(".", 1)[0]) not in toy_layers)]
    if untouched:
        raise RuntimeError(f"deep_toy: weights the toy should have given are missing: {untouched[:3]}")
    deep.config.name_or_path = f"toy-{name}-deep{n_layers}"
    deep.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = load(deep, tokenizer=tokenizer, backend=backend)
    model.name = f"toy-{name}-deep{n_layers}"
    return model
