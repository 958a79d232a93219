"""`load()`: a hub id, a local folder or a ``transformers`` model object -> `GnaModel`."""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..core.arch import ArchSpec, LayerKind
from ..core.errors import GnaTypeError, GnaValueError
from ..core.tokenizer_check import tokenizer_error, tokenizer_problem
from ..progress import progress_enabled
from .handle import GnaModel, weights_device
from .hub import NDIF_KEY_HELP, hub_access, ndif_api_key
from .preflight import (
    ModelFilesError,
    check_architecture,
    check_keywords,
    check_loaded_weights,
    check_tokenizer,
    config_file,
    hub_config,
    keyword_error,
    load_folder_tokenizer,
    local_folder,
    looks_like_path,
    read_config_json,
)
from .registry import HYBRID_STUDENT_MODEL_TYPE, spec_for, spec_for_model
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
    check_weights: bool = True,
    arch: ArchSpec | None = None,
    **hf_kwargs: Any,
) -> GnaModel:
    """Load a causal LM for analysis.

    Before any weight is read or downloaded (`gna_interp.models.preflight`): a path that
    looks like a folder must exist and hold ``config.json``; that file (for a hub id, the
    one file downloaded) must name a supported ``model_type``; the tokenizer must load.
    The tokenizer must give back text made of its own vocabulary, and the model must
    embed its ids (`gna_interp.core.tokenizer_check`).

    A model object passed in is put in eval mode (and moved for ``device`` / ``dtype``);
    nothing else of it changes: it still saves with ``save_pretrained`` and computes what
    it did. ``tlens``'s bridge wraps the modules it boots on in place, so it boots on a
    twin sharing every tensor (`module_twin`), which is the handle's ``hf_model``.

    Args:
        model: a HF hub id (``"meta-llama/Llama-3.1-8B-Instruct"``), a local folder with
            ``config.json`` and weights, a ``transformers.PreTrainedModel``, or any
            ``torch.nn.Module`` causal LM with a ``config`` attribute (Cartesia's
            ``LlambaLMHeadModel``; a family the table lacks with ``arch=``), run on nnsight.
        backend: ``"tlens"`` (TransformerLens ``TransformerBridge``) or ``"nnsight"``.
            Default: the family's ``ArchSpec.default_backend``: ``tlens`` for Llama,
            Mistral and Qwen2, ``nnsight`` for SSMs and hybrids (both backends run them,
            with the same numbers); ``nnsight`` for ``remote=True`` and for a model
            holding blocks of another family (loaded inside `gna_interp.swap_layers`;
            ``tlens`` refuses it).
        tokenizer: a HF tokenizer (in memory or loaded, never modified) or a path/id;
            default: loaded from ``model``'s folder or hub id.
        device: where the weights go.
        dtype: the weights' dtype.
        remote: ``True`` runs every trace on NDIF (nnsight only; ``model`` must be a hub
            id, the API key comes from ``NDIF_API_KEY`` or nnsight's config).
            ``"local"`` runs nnsight's local simulation of remote execution.
        check_weights: refuse a checkpoint whose tensors do not match its config (tensors
            missing, which transformers would initialise at random, or unexpected);
            ``False`` loads it with a `WeightsMismatchWarning` listing them.
        arch: the model's family as data (`gna_interp.core.arch.ArchSpec`), for a model
            (object, folder or hub id) whose ``model_type`` the table lacks, or to override
            its row, for this load only; see `gna_interp.register_architecture` and
            docs/describe.md.
        **hf_kwargs: passed to ``from_pretrained``.

    Raises:
        TypeError: a keyword that is neither `load`'s nor ``from_pretrained``'s.
        ModelFilesError: a missing folder, ``config.json`` or tokenizer (also a ``ValueError``).
        ValueError: an unsupported ``model_type``, an invalid ``config.json``, weights that
            do not match the config, a tokenizer that is not the model's (naming its class
            and ``tokenizer=``), or a bad ``backend`` / ``remote``.
    """
    _check_options(model, backend, remote, arch, hf_kwargs)
    if remote is True:
        return _load_remote(model, tokenizer, arch)
    source, access = _preflight(model, hf_kwargs, arch)  # no weights yet; a hub id without network fails here, in seconds
    tokenizer_given = tokenizer is not None
    tokenizer = _tokenizer(tokenizer, model, source, access)
    hf_model, name = _hf_model(model, source, device, dtype, {**hf_kwargs, **access}, check_weights)
    problem = tokenizer_problem(tokenizer, embedding_rows(hf_model))
    if problem is not None:
        raise tokenizer_error(tokenizer, problem, "passed as tokenizer=" if tokenizer_given else "loaded with the model")
    spec = arch if arch is not None else spec_for_model(hf_model)
    return _handle(hf_model, tokenizer, spec, name, backend, remote)


def _check_options(model: Any, backend: str | None, remote: bool | str, arch: ArchSpec | None, hf_kwargs: dict[str, Any]) -> None:
    """`load`'s keywords checked, before anything is read."""
    check_keywords(hf_kwargs)
    if arch is not None and not isinstance(arch, ArchSpec):
        raise GnaTypeError(f"arch= expects a gna_interp.ArchSpec (the family as data), got {type(arch).__name__}")
    if backend is not None and backend not in BACKENDS:
        raise GnaValueError(f"unknown backend {backend!r}: expected one of {BACKENDS}")
    if remote not in (False, True, "local"):
        raise GnaValueError(f"remote={remote!r}: expected False, True (NDIF) or 'local' (nnsight's local simulation)")
    if remote and backend == "tlens":
        raise GnaValueError("remote execution runs through nnsight: use backend='nnsight' (or leave backend unset)")


def _handle(hf_model: Any, tokenizer: Any, spec: ArchSpec, name: str, backend: str | None, remote: bool | str) -> GnaModel:
    """The loaded model on its backend (``backend``, or the family's default; nnsight for
    ``remote="local"`` and for a model holding blocks of another family)."""
    foreign = swapped_in_layers(hf_model, spec.layers_path)
    backend = "nnsight" if remote or (foreign and backend is None) else (backend or spec.default_backend)
    _check_backend(spec, backend, foreign)
    from transformers import PreTrainedModel

    if backend == "tlens" and not isinstance(hf_model, PreTrainedModel):
        raise GnaValueError(f"backend='tlens' wraps transformers models only; this {type(hf_model).__name__} runs on backend='nnsight'")
    hf_model.eval()
    if backend == "tlens":  # the bridge rewires the modules it boots on: a twin, so the caller's object keeps its own
        twin = module_twin(hf_model)
        return GnaModel(twin, tokenizer, spec, _tlens_backend(twin, tokenizer, name, spec), name)
    return GnaModel(hf_model, tokenizer, spec, _nnsight_backend(hf_model, tokenizer, spec, remote), name)


def embedding_rows(hf_model: Any) -> int | None:
    """How many token ids the model embeds: its input embedding's rows, else
    ``config.vocab_size``; ``None`` when neither tells."""
    try:
        return int(hf_model.get_input_embeddings().weight.shape[0])
    except (AttributeError, NotImplementedError, TypeError):
        size = getattr(hf_model.config, "vocab_size", None)
        return int(size) if isinstance(size, int) else None


def _check_backend(spec: ArchSpec, backend: str, foreign: dict[int, str]) -> None:
    if backend == "tlens" and not spec.tlens and spec.family.startswith("llamba"):
        raise GnaValueError(
            f"backend='tlens' does not support the {spec.family!r} family (Discrete Mamba-2 SSM layers): TransformerLens's "
            "bridge has no adapter for it: use backend='nnsight'"
        )
    if backend == "tlens" and not spec.tlens:
        what = "hybrid attention / SSM" if spec.layer_kind is LayerKind.HYBRID else spec.layer_kind.value
        raise GnaValueError(f"backend='tlens' does not support the {spec.family!r} family ({what} layers): use backend='nnsight'")
    if backend == "tlens" and foreign:
        blocks = ", ".join(f"layer {layer}: {donor}" for layer, donor in sorted(foreign.items()))
        raise GnaValueError(
            f"backend='tlens' cannot wrap this {spec.family} model: it holds swapped-in blocks of another family ({blocks}; "
            "swap_layers), which TransformerLens's bridge does not know: use backend='nnsight'"
        )


def _preflight(model: Any, hf_kwargs: dict[str, Any], arch: ArchSpec | None = None) -> tuple[str | None, dict[str, Any]]:
    """Checks before any weight (`gna_interp.models.preflight`): the model's source (a local
    folder, or ``None`` for a hub id or a model object) and the ``from_pretrained`` keywords
    a hub id needs (`gna_interp.models.hub`). With ``arch``, the config's ``model_type`` need
    not be in the table (``arch`` describes the family)."""
    if not isinstance(model, (str, os.PathLike)):
        return None, {}
    subfolder = str(hf_kwargs.get("subfolder") or "")
    folder = local_folder(model, subfolder)
    access = {} if folder is not None or hf_kwargs.get("local_files_only") else hub_access(str(model), hf_kwargs.get("revision"))
    config = hf_kwargs.get("config")
    if config is not None and not isinstance(config, (str, os.PathLike)):  # the caller's config object builds the model
        if arch is None:
            spec_for(config)
    elif "gguf_file" not in hf_kwargs:  # a GGUF file holds its own config
        if folder is not None:
            file = config_file(folder / subfolder)
            settings = read_config_json(file)  # an invalid file fails here, arch= or not
            if arch is None:
                check_architecture(settings, str(file))
        elif arch is not None:
            hub_config(str(model), access, hf_kwargs)  # the config exists and is readable
        else:
            spec = check_architecture(*hub_config(str(model), access, hf_kwargs))
            if spec.family.startswith("llamba"):
                raise GnaValueError(
                    f"model={str(model)!r} is a Llamba, which transformers cannot build: load Cartesia's class and pass it, "
                    "gna.load(LlambaLMHeadModel.from_pretrained(...), tokenizer=...) (examples/llamba_8b.py), or a local checkpoint folder"
                )
    return (str(folder) if folder is not None else None), access


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


def _hf_model(model: Any, folder: str | None, device: Any, dtype: Any, hf_kwargs: dict[str, Any], strict: bool) -> tuple[Any, str]:
    from transformers import AutoModelForCausalLM, PreTrainedModel

    if isinstance(model, PreTrainedModel):
        if device is not None or dtype is not None:
            model = model.to(device=device, dtype=dtype)  # type: ignore[call-arg]
        return model, str(model.config.name_or_path or type(model).__name__)
    if isinstance(model, torch.nn.Module):  # a causal LM that is not a transformers class (Cartesia's Llamba, a user's own)
        if getattr(model, "config", None) is None:
            raise GnaTypeError(
                f"model: a {type(model).__name__} without a config attribute: gna_interp reads the sizes the ArchSpec names "
                "from model.config (give the module one, e.g. a types.SimpleNamespace)"
            )
        if device is not None or dtype is not None:
            model = model.to(device=device, dtype=dtype)  # type: ignore[arg-type]
        return model, str(getattr(model.config, "name_or_path", "") or type(model).__name__)
    if not isinstance(model, (str, os.PathLike)):
        raise GnaTypeError(
            f"model must be a hub id, a local folder, a transformers PreTrainedModel or a torch.nn.Module, got {type(model).__name__}"
        )
    path = folder if folder is not None and str(model).startswith("~") else os.fspath(model)
    model_type = read_config_json(config_file(Path(folder))).get("model_type") if folder is not None else None
    if model_type == HYBRID_STUDENT_MODEL_TYPE:
        from . import hybrid_student  # noqa: F401  (registers the student's classes with transformers' Auto classes)
    if folder is not None and model_type == "llamba":
        from .llamba import load_llamba_folder  # transformers has no Llamba class: Cartesia's, or the CPU twin

        llamba = load_llamba_folder(folder, dtype=_dtype(dtype))
        return (llamba.to(device) if device is not None else llamba), path
    kwargs = {**hf_kwargs, "output_loading_info": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    try:
        with quiet_weight_loading(local=folder is not None):
            loaded: Any = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        hf_model, info = loaded
    except TypeError as error:  # a keyword nobody takes: transformers blames the model class's __init__
        clearer = keyword_error(error, hf_kwargs)
        if clearer is None:
            raise
        raise clearer from error
    check_loaded_weights(info, path, strict)
    if device is not None:
        hf_model = hf_model.to(device)
    return hf_model, path


def _dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def _tokenizer(tokenizer: Any, model: Any, folder: str | None, access: dict[str, Any]) -> Any:
    """The caller's tokenizer object as it is; otherwise loaded from ``tokenizer`` (a path or
    id) or from the model's folder or hub id, refused when it is missing or empty."""
    from transformers import AutoTokenizer

    if tokenizer is None:
        if not isinstance(model, (str, os.PathLike)):
            raise GnaValueError("a transformers model object needs tokenizer= (a tokenizer object or its path)")
        if folder is not None:
            return load_folder_tokenizer(folder)
        loaded = AutoTokenizer.from_pretrained(str(model), **access)
        check_tokenizer(loaded, str(model))
        return loaded
    if isinstance(tokenizer, (str, os.PathLike)):
        if Path(tokenizer).expanduser().is_dir():
            return load_folder_tokenizer(str(Path(tokenizer).expanduser()))
        if looks_like_path(os.fspath(tokenizer)) or isinstance(tokenizer, os.PathLike):
            raise ModelFilesError(
                f"tokenizer={os.fspath(tokenizer)!r}: no such folder (expected a tokenizer folder, a hub id or a tokenizer)"
            )
        return AutoTokenizer.from_pretrained(str(tokenizer), **hub_access(str(tokenizer)))
    return tokenizer


def _tlens_backend(hf_model: Any, tokenizer: Any, name: str, spec: ArchSpec) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    from ..backends.tlens import TLensBackend

    config = hf_model.config
    if not getattr(config, "architectures", None):  # built from a config: TransformerLens picks its adapter by this name
        config.architectures = [type(hf_model).__name__]
    kernel = getattr(config, "_attn_implementation", None)  # the bridge switches the config to eager
    with tokenizer_copy(tokenizer) as bridge_tokenizer:
        bridge = TransformerBridge.boot_transformers(name or spec.family, hf_model=hf_model, tokenizer=bridge_tokenizer)
    return TLensBackend(bridge, spec, spec.resolve(config, spec.n_layers(config)), attn_implementation=kernel)


def module_twin(module: torch.nn.Module) -> Any:
    """A copy of ``module``'s structure that shares its tensors: new module objects (and a
    new ``config``), the same parameters, buffers and tensor attributes (no weight is
    copied: the twin costs the module objects only). Accelerate's dispatch hooks are
    shared too. TransformerLens's bridge replaces submodules of the model it boots on
    with its wrappers (``_original_component``), which ``save_pretrained`` then refuses
    as shared tensors: booted on the twin, it leaves the caller's object as it was."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for tensor in (*sub._parameters.values(), *sub._buffers.values()):
            if tensor is not None:
                memo[id(tensor)] = tensor
        for value in vars(sub).values():
            if isinstance(value, torch.Tensor):
                memo[id(value)] = value
        hook = getattr(sub, "_hf_hook", None)
        if hook is not None:
            memo[id(hook)] = hook
    return copy.deepcopy(module, memo)


@contextmanager
def tokenizer_copy(tokenizer: Any) -> Iterator[Any]:
    """A private copy of ``tokenizer`` for TransformerLens, loaded from a temporary folder
    that is removed on exit, exceptions included.

    TransformerLens reloads a tokenizer that has a BOS token (and does not add it itself)
    from ``init_kwargs["name_or_path"]``: an in-memory tokenizer
    (``PreTrainedTokenizerFast(tokenizer_object=...)`` with ``bos_token`` set) has no such
    key (``KeyError: 'name_or_path'``). It also sets the EOS, padding and BOS tokens it lacks,
    in place (adding ``<|endoftext|>`` to the vocabulary). The copy has a ``name_or_path``
    (the folder, which the bridge reads only while it boots) and takes those edits: the
    caller's tokenizer, which `GnaModel` uses, is never changed."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="gna_tokenizer_") as folder:
        tokenizer.save_pretrained(folder)
        yield AutoTokenizer.from_pretrained(folder)


def _nnsight_backend(hf_model: Any, tokenizer: Any, spec: ArchSpec, remote: bool | str) -> Any:
    import nnsight
    from nnsight.modeling.transformers import TransformersModel
    from transformers import PreTrainedModel

    from ..backends.nnsight import NNsightBackend

    config = hf_model.config
    if isinstance(hf_model, PreTrainedModel):
        # nnsight wraps the module in a transformers pipeline, which moves it to the GPU when one
        # exists: name the device the weights are on, so the caller's model stays where it is.
        where = {} if getattr(hf_model, "hf_device_map", None) else {"device": weights_device(hf_model)}
        # nnsight sets padding in place: a copy, not the caller's tokenizer
        envoy = TransformersModel(hf_model, tokenizer=copy.deepcopy(tokenizer), **where)
    else:  # any other torch module: nnsight's generic wrapper (GnaModel tokenizes)
        envoy = nnsight.NNsight(hf_model)
    return NNsightBackend(envoy, spec, spec.layers_of(config), remote)


def _load_remote(model: Any, tokenizer: Any, arch: ArchSpec | None = None) -> GnaModel:
    """NDIF: only the model's structure is built here (on the meta device); every
    trace runs on the server. Errors come before any network use."""
    if not isinstance(model, str):
        raise GnaValueError(
            "remote=True needs a hub id string such as 'meta-llama/Llama-3.1-70B-Instruct'; "
            f"got a local {type(model).__name__} object, which NDIF cannot run (use remote='local' to simulate)"
        )
    if Path(model).exists():
        raise GnaValueError(f"remote=True needs a hub id, but {model!r} is a local path (use remote='local' to simulate)")
    if ndif_api_key() is None:
        raise GnaValueError(f"remote=True needs an NDIF API key: {NDIF_KEY_HELP}")
    from nnsight.modeling.transformers import TransformersModel

    from ..backends.nnsight import NNsightBackend

    hub_access(model)  # the structure comes from the hub's config: fail fast without network
    envoy = TransformersModel(model, tokenizer=tokenizer) if tokenizer is not None else TransformersModel(model)
    config = envoy.config
    spec = arch if arch is not None else spec_for(config)
    backend = NNsightBackend(envoy, spec, spec.resolve(config, spec.n_layers(config)), True)
    return GnaModel(envoy._module, envoy.tokenizer, spec, backend, model)
