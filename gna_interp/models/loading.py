"""`load()`: a hub id, a local folder or a ``transformers`` model object -> `GnaModel`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..core.arch import ArchSpec, LayerKind
from ..progress import progress_enabled
from .handle import GnaModel
from .hub import hub_access
from .registry import spec_for
from .swap_block import swapped_in_layers

BACKENDS = ("tlens", "nnsight")


def load(
    model: Any,
    *,
    backend: str | None = None,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    remote: bool | str = False,
    **hf_kwargs: Any,
) -> GnaModel:
    """Load a causal LM for analysis.

    Args:
        model: a HF hub id (``"meta-llama/Llama-3.1-8B-Instruct"``), a local folder with
            ``config.json`` and weights, or a ``transformers.PreTrainedModel``.
        backend: ``"tlens"`` (TransformerLens ``TransformerBridge``) or ``"nnsight"``.
            Default: the family's ``ArchSpec.default_backend``: ``tlens`` for Llama,
            Mistral and Qwen2, ``nnsight`` for SSMs and hybrids (both backends run them,
            with the same numbers); ``nnsight`` for ``remote=True`` and for a model
            holding blocks of another family (loaded inside `gna_interp.swap_layers`;
            ``tlens`` refuses it).
        tokenizer: a HF tokenizer or a path/id; default: loaded from ``model``.
        device: where the weights go.
        dtype: the weights' dtype.
        remote: ``True`` runs every trace on NDIF (nnsight only; ``model`` must be a hub
            id, the API key comes from ``NDIF_API_KEY`` or nnsight's config).
            ``"local"`` runs nnsight's local simulation of remote execution.
        **hf_kwargs: passed to ``from_pretrained``.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {BACKENDS}")
    if remote not in (False, True, "local"):
        raise ValueError(f"remote={remote!r}: expected False, True (NDIF) or 'local' (nnsight's local simulation)")
    if remote and backend == "tlens":
        raise ValueError("remote execution runs through nnsight: use backend='nnsight' (or leave backend unset)")
    if remote is True:
        return _load_remote(model, tokenizer)

    access = _hub_access(model, hf_kwargs)  # a hub id without network fails here, in seconds
    hf_model, name = _hf_model(model, device, dtype, {**hf_kwargs, **access})
    spec = spec_for(hf_model.config)
    foreign = swapped_in_layers(hf_model, spec.layers_path)
    backend = "nnsight" if remote or (foreign and backend is None) else (backend or spec.default_backend)
    _check_backend(spec, backend, foreign)
    tokenizer = _tokenizer(tokenizer, model, name, access)
    hf_model.eval()
    if backend == "tlens":
        return GnaModel(hf_model, tokenizer, spec, _tlens_backend(hf_model, tokenizer, name, spec), name)
    return GnaModel(hf_model, tokenizer, spec, _nnsight_backend(hf_model, tokenizer, spec, remote), name)


def _check_backend(spec: ArchSpec, backend: str, foreign: dict[int, str]) -> None:
    if backend == "tlens" and not spec.tlens:
        what = "hybrid attention / SSM" if spec.layer_kind is LayerKind.HYBRID else spec.layer_kind.value
        raise ValueError(f"backend='tlens' does not support the {spec.family!r} family ({what} layers): use backend='nnsight'")
    if backend == "tlens" and foreign:
        blocks = ", ".join(f"layer {layer}: {donor}" for layer, donor in sorted(foreign.items()))
        raise ValueError(
            f"backend='tlens' cannot wrap this {spec.family} model: it holds swapped-in blocks of another family ({blocks}; "
            "swap_layers), which TransformerLens's bridge does not know: use backend='nnsight'"
        )


def _hub_access(model: Any, hf_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments for a hub id (see `gna_interp.models.hub`);
    none for local folders, model objects, or when the caller chose ``local_files_only``."""
    if not isinstance(model, (str, os.PathLike)) or Path(model).exists() or str(model).startswith((".", "/", "~")):
        return {}
    if hf_kwargs.get("local_files_only"):
        return {}
    return hub_access(str(model), hf_kwargs.get("revision"))


@contextmanager
def quiet_weight_loading(local: bool) -> Iterator[None]:
    """No "Loading weights" bar from transformers for a local folder (the bundled toys
    load in a blink), nor for any model when the library's bars are off
    (`gna_interp.set_progress`); transformers' own setting is restored on exit."""
    from transformers.utils import logging

    quiet = (local or not progress_enabled()) and logging.is_progress_bar_enabled()
    if quiet:
        logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet:
            logging.enable_progress_bar()


def _hf_model(model: Any, device: Any, dtype: Any, hf_kwargs: dict[str, Any]) -> tuple[Any, str]:
    from transformers import AutoModelForCausalLM, PreTrainedModel

    if isinstance(model, PreTrainedModel):
        if device is not None or dtype is not None:
            model = model.to(device=device, dtype=dtype)  # type: ignore[call-arg]
        return model, str(model.config.name_or_path or type(model).__name__)
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a hub id, a local folder or a transformers PreTrainedModel, got {type(model).__name__}")
    path = str(model)
    if Path(path).exists() and not (Path(path) / "config.json").is_file():
        raise ValueError(f"model path {path!r} is not a model folder: expected a folder with config.json")
    if not Path(path).exists() and path.startswith((".", "/", "~")):
        raise ValueError(f"model path {path!r} does not exist (expected a folder with config.json, or a hub id)")
    kwargs = dict(hf_kwargs)
    if dtype is not None:
        kwargs["dtype"] = dtype
    with quiet_weight_loading(local=Path(path).exists()):
        hf_model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if device is not None:
        hf_model = hf_model.to(device)
    return hf_model, path


def _tokenizer(tokenizer: Any, model: Any, name: str, access: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    if tokenizer is None:
        if not isinstance(model, (str, os.PathLike)):
            raise ValueError("a transformers model object needs tokenizer= (a tokenizer object or its path)")
        return AutoTokenizer.from_pretrained(str(model), **access)
    if isinstance(tokenizer, (str, os.PathLike)):
        return AutoTokenizer.from_pretrained(str(tokenizer), **_hub_access(tokenizer, {}))
    return tokenizer


def _tlens_backend(hf_model: Any, tokenizer: Any, name: str, spec: ArchSpec) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    from ..backends.tlens import TLensBackend

    config = hf_model.config
    if not getattr(config, "architectures", None):  # built from a config: TransformerLens picks its adapter by this name
        config.architectures = [type(hf_model).__name__]
    bridge_tokenizer = tokenizer_on_disk(tokenizer)
    kernel = getattr(config, "_attn_implementation", None)  # the bridge switches the config to eager
    bridge = TransformerBridge.boot_transformers(name or spec.family, hf_model=hf_model, tokenizer=bridge_tokenizer)
    return TLensBackend(bridge, spec, spec.resolve(config, int(config.num_hidden_layers)), attn_implementation=kernel)


def tokenizer_on_disk(tokenizer: Any) -> Any:
    """TransformerLens reloads the tokenizer from ``name_or_path`` (and fails on an
    in-memory one): give it a folder that lives as long as the process."""
    from transformers import AutoTokenizer

    if Path(str(getattr(tokenizer, "name_or_path", "") or "")).is_dir():
        return tokenizer
    folder = tempfile.mkdtemp(prefix="gna_tokenizer_")
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def _nnsight_backend(hf_model: Any, tokenizer: Any, spec: ArchSpec, remote: bool | str) -> Any:
    from nnsight.modeling.transformers import TransformersModel

    from ..backends.nnsight import NNsightBackend

    config = hf_model.config
    envoy = TransformersModel(hf_model, tokenizer=tokenizer)
    return NNsightBackend(envoy, spec, spec.resolve(config, int(config.num_hidden_layers)), remote)


def ndif_api_key() -> str | None:
    key = os.environ.get("NDIF_API_KEY")
    if key:
        return key
    try:
        from nnsight import CONFIG

        return getattr(CONFIG.API, "APIKEY", None) or None
    except Exception:  # pragma: no cover - nnsight config unreadable
        return None


def _load_remote(model: Any, tokenizer: Any) -> GnaModel:
    """NDIF: only the model's structure is built here (on the meta device); every
    trace runs on the server. Errors come before any network use."""
    if not isinstance(model, str):
        raise ValueError(
            "remote=True needs a hub id string such as 'meta-llama/Llama-3.1-70B-Instruct'; "
            f"got a local {type(model).__name__} object, which NDIF cannot run (use remote='local' to simulate)"
        )
    if Path(model).exists():
        raise ValueError(f"remote=True needs a hub id, but {model!r} is a local path (use remote='local' to simulate)")
    if ndif_api_key() is None:
        raise ValueError("remote=True needs an NDIF API key: set NDIF_API_KEY or nnsight.CONFIG.set_default_api_key(...)")
    from nnsight.modeling.transformers import TransformersModel

    from ..backends.nnsight import NNsightBackend

    hub_access(model)  # the structure comes from the hub's config: fail fast without network
    envoy = TransformersModel(model, tokenizer=tokenizer) if tokenizer is not None else TransformersModel(model)
    config = envoy.config
    spec = spec_for(config)
    backend = NNsightBackend(envoy, spec, spec.resolve(config, int(config.num_hidden_layers)), True)
    return GnaModel(envoy._module, envoy.tokenizer, spec, backend, model)
