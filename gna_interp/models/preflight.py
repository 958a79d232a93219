"""Checks `gna_interp.load` makes before any weight is read or downloaded.

Loading a model is slow (a download, or seconds of reading), so everything that can be
known from small files is checked first, in this order:

1. keywords: one close to a `load` parameter (``backnd=``) is a slip, not a keyword for
   ``from_pretrained`` (`check_keywords`);
2. the path: a string that looks like a folder (starts with ``.``, ``/`` or ``~``, holds
   ``\\`` or two ``/``, or starts with a folder that exists here) and does not exist is
   refused, never sent to the hub as an id; a folder needs a ``config.json``
   (`local_folder`);
3. the architecture: ``config.json`` alone (a local file, or the one file downloaded from
   the hub) must name a ``model_type`` in the architecture table (`check_architecture`);
4. the tokenizer: a folder without one is refused, naming the folder and ``tokenizer=``
   (`check_tokenizer`); one that does not give back text of its own vocabulary is read
   as the class its ``tokenizer_config.json`` names, or refused
   (`gna_interp.core.tokenizer_check`).

After the weights load, `gna_interp.load` refuses a tokenizer whose ids the model cannot
embed, and `check_loaded_weights` refuses tensors the checkpoint lacks (which
transformers would initialise at random) or holds in excess.

Nothing here imports torch or transformers: the CLI uses these checks before any heavy
import.
"""

from __future__ import annotations

import difflib
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..core.arch import ArchSpec
from ..core.errors import GnaError, GnaTypeError, GnaValueError
from ..core.tokenizer_check import tokenizer_error, tokenizer_problem
from .registry import DESCRIBE_HELP, UnknownArchitectureError, spec_for

LOAD_PARAMETERS = ("backend", "tokenizer", "device", "dtype", "remote", "check_weights")
"""`gna_interp.load`'s keyword parameters (every other keyword goes to ``from_pretrained``)."""

FROM_PRETRAINED_KEYWORDS = frozenset(
    {
        "attn_implementation",
        "cache_dir",
        "code_revision",
        "config",
        "device_map",
        "force_download",
        "gguf_file",
        "key_mapping",
        "local_files_only",
        "low_cpu_mem_usage",
        "max_memory",
        "offload_folder",
        "proxies",
        "quantization_config",
        "revision",
        "subfolder",
        "token",
        "torch_dtype",
        "tp_plan",
        "trust_remote_code",
        "use_safetensors",
        "variant",
    }
)
"""Common ``from_pretrained`` keywords: never mistaken for a misspelt `load` parameter."""

SHOWN_KEYS = 6
"""How many tensor names a weights error lists (then a count of the rest)."""


class ModelFilesError(GnaError, FileNotFoundError, ValueError):
    """A model path, its ``config.json`` or its tokenizer is missing. A `FileNotFoundError`,
    and a `ValueError` as these errors were before."""


class WeightsMismatchWarning(UserWarning):
    """``check_weights=False`` loaded a checkpoint whose tensors do not match its config."""


# ----- keywords -------------------------------------------------------------------------------


def _parameters() -> str:
    return "model, " + ", ".join(f"{name}=" for name in LOAD_PARAMETERS)


def unknown_keyword(key: str, guess: str | None = None) -> str:
    hint = f" (did you mean {guess}=?)" if guess else ""
    return (
        f"gna.load() got an unexpected keyword argument {key!r}{hint}: its parameters are {_parameters()}; "
        "other keywords go to transformers' from_pretrained and the model's config"
    )


def check_keywords(hf_kwargs: Mapping[str, Any]) -> None:
    """Refuse a keyword close to one of `load`'s own (``backnd=``, ``tokenzier=``).

    Raises:
        TypeError: naming the keyword, its likely intended parameter and `load`'s parameters.
    """
    for key in hf_kwargs:
        if key in FROM_PRETRAINED_KEYWORDS:
            continue
        close = difflib.get_close_matches(key, LOAD_PARAMETERS, n=1, cutoff=0.75)
        if close:
            raise GnaTypeError(unknown_keyword(key, close[0]))


def keyword_error(error: TypeError, hf_kwargs: Mapping[str, Any]) -> TypeError | None:
    """A clearer error for ``from_pretrained``'s "unexpected keyword argument" about one of
    the caller's keywords (it blames the model class's ``__init__``); ``None`` otherwise."""
    text = str(error)
    if "unexpected keyword argument" not in text:
        return None
    for key in hf_kwargs:
        if f"'{key}'" in text:
            close = difflib.get_close_matches(key, [*LOAD_PARAMETERS, *FROM_PRETRAINED_KEYWORDS], n=1, cutoff=0.6)
            return TypeError(unknown_keyword(key, close[0] if close else None) + f", which take no {key!r} either")
    return None


# ----- paths ----------------------------------------------------------------------------------


def looks_like_path(text: str) -> bool:
    """Whether ``text`` can only be a local path, not a hub id (``owner/name`` or ``name``)."""
    if text.startswith((".", "/", "~")) or "\\" in text or text.endswith("/") or text.count("/") > 1:
        return True
    return "/" in text and Path(text.split("/")[0]).exists()  # it starts with a folder that exists here


def _missing_path(text: str) -> str:
    path = Path(text).expanduser()
    existing = next((parent for parent in path.parents if str(parent) != "." and parent.exists()), None)
    if existing is None:
        where = "no folder of that name"
    else:
        where = f"folder {str(existing)!r} exists but holds no {path.relative_to(existing).parts[0]!r}"
    return f"model path {text!r} does not exist: {where} (expected a local folder with config.json, or a hub id 'owner/name')"


def local_folder(model: str | os.PathLike[str], subfolder: str = "") -> Path | None:
    """The local model folder ``model`` names (``~`` expanded), or ``None`` for a hub id.

    Raises:
        ModelFilesError: ``model`` looks like a path (`looks_like_path`, or a ``PathLike``)
            and does not exist; it is a file; or the folder has no ``config.json``.
    """
    text = os.fspath(model)
    path = Path(text).expanduser()
    if not path.exists():
        if isinstance(model, os.PathLike) or looks_like_path(text):
            raise ModelFilesError(_missing_path(text))
        return None
    if not path.is_dir():
        raise ModelFilesError(f"model path {text!r} is a file: expected a model folder with config.json, or a hub id")
    config_file(path / subfolder)
    return path


def config_file(folder: Path) -> Path:
    """``folder/config.json``.

    Raises:
        ModelFilesError: there is none.
    """
    file = folder / "config.json"
    if not file.is_file():
        raise ModelFilesError(
            f"no config.json in {str(folder)!r}: expected a model folder (config.json and weights, as save_pretrained writes them)"
        )
    return file


def read_config_json(file: Path, **json_options: Any) -> dict[str, Any]:
    """``config.json`` as a dict.

    Raises:
        ValueError: the file is not JSON (naming the file, line and column), or not a JSON object.
    """
    try:
        data = json.loads(file.read_text(encoding="utf-8"), **json_options)
    except json.JSONDecodeError as error:
        raise GnaValueError(f"{file} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}") from None
    except UnicodeDecodeError as error:
        raise GnaValueError(f"{file} is not valid JSON: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not isinstance(data, dict):
        raise GnaValueError(f"{file} is not a model config: expected a JSON object, got a JSON {type(data).__name__}")
    return data


def hub_config(name: str, access: Mapping[str, Any], hf_kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """Hub id ``name``'s ``config.json`` (the one file downloaded) and where it came from."""
    from huggingface_hub import hf_hub_download

    options = {key: hf_kwargs[key] for key in ("revision", "subfolder", "token", "cache_dir") if hf_kwargs.get(key) is not None}
    offline = bool(access.get("local_files_only") or hf_kwargs.get("local_files_only"))
    file = hf_hub_download(name, "config.json", local_files_only=offline, **options)
    return read_config_json(Path(file)), f"{name}'s config.json"


def check_architecture(config: Mapping[str, Any], where: str) -> ArchSpec:
    """The architecture table's row for a ``config.json`` read as plain data.

    Raises:
        ValueError: its ``model_type`` is missing or not in the table, naming it, the file
            and the supported model types.
    """
    try:
        return spec_for(SimpleNamespace(model_type=config.get("model_type")))
    except UnknownArchitectureError as error:
        raise GnaValueError(f"{error.what} (read from {where}, before any weights); {DESCRIBE_HELP}") from None


# ----- tokenizer ------------------------------------------------------------------------------


def _missing_tokenizer(folder: str, why: str) -> ModelFilesError:
    return ModelFilesError(
        f"no usable tokenizer in {folder!r} ({why}): save one there (tokenizer.save_pretrained(folder)) "
        "or pass tokenizer= (a tokenizer object, or its folder or hub id)"
    )


def load_folder_tokenizer(folder: str, **options: Any) -> Any:
    """``AutoTokenizer.from_pretrained(folder)`` for a local folder, checked by `check_tokenizer`.

    Raises:
        ModelFilesError: the folder has no tokenizer transformers can build, naming the
            folder and ``tokenizer=``.
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **options)
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _missing_tokenizer(folder, f"transformers: {first.rstrip(': ')}") from error
    check_tokenizer(tokenizer, folder)
    problem = tokenizer_problem(tokenizer)
    if problem is None:
        return tokenizer
    # transformers forces its own class for some model types (qwen2, phi3, jamba...), whatever
    # tokenizer_config.json names: a word-level vocabulary saved there then reads as BPE
    declared = _declared_tokenizer_class(folder)
    if declared and declared.removesuffix("Fast") != type(tokenizer).__name__.removesuffix("Fast"):
        from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

        named = tokenizer_class_from_name(declared)
        if named is not None:
            other = named.from_pretrained(folder, **options)
            if tokenizer_problem(other) is None:
                return other
    names = f", while its tokenizer_config.json names {declared}" if declared else ""
    raise tokenizer_error(tokenizer, problem, f"that AutoTokenizer built from {folder!r}{names}")


def _declared_tokenizer_class(folder: str) -> str | None:
    """The ``tokenizer_class`` the folder's ``tokenizer_config.json`` names, if any."""
    try:
        declared = json.loads((Path(folder) / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    return declared if isinstance(declared, str) else None


def check_tokenizer(tokenizer: Any, where: str) -> None:
    """Refuse a tokenizer that knows only its special tokens: transformers builds one, without
    a word of vocabulary, from a folder that holds no tokenizer files (Mamba-2's GPT-NeoX
    class with ``<|endoftext|>`` and ``<|padding|>`` only)."""
    vocabulary = set(tokenizer.get_vocab())
    if not vocabulary - set(tokenizer.all_special_tokens):
        what = f"{type(tokenizer).__name__} of {len(vocabulary)} special token(s) {sorted(vocabulary)} and no other token"
        raise _missing_tokenizer(where, f"transformers built an empty {what}: the folder holds no vocabulary")


# ----- weights --------------------------------------------------------------------------------


def _listed(keys: Any) -> str:
    names = sorted(keys)
    more = f" and {len(names) - SHOWN_KEYS} more" if len(names) > SHOWN_KEYS else ""
    return f"{len(names)} tensor(s): {', '.join(names[:SHOWN_KEYS])}{more}"


def check_loaded_weights(info: Mapping[str, Any], where: str, strict: bool = True) -> None:
    """Refuse (``strict``) or warn about a checkpoint whose tensors do not match the model
    its config builds: ``from_pretrained``'s loading info lists tensors the checkpoint
    lacks (initialised at random) and tensors it holds that the model has no place for.

    Raises:
        ValueError: ``strict`` and some tensor is missing or unexpected, naming them.
    """
    parts = [
        f"{what} {_listed(info[key])}" for key, what in (("missing_keys", "missing"), ("unexpected_keys", "unexpected")) if info.get(key)
    ]
    if not parts:
        return
    message = f"the weights of {where!r} do not match its config: " + "; ".join(parts)
    if strict:
        raise GnaValueError(message + " (missing tensors would be random; pass check_weights=False to load anyway)")
    warnings.warn(message + " (check_weights=False: missing tensors are random)", WeightsMismatchWarning, stacklevel=3)
