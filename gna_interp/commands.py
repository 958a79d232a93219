"""What each ``gna-interp`` subcommand does (the parser lives in `gna_interp.cli`)."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from .core.errors import GnaError, GnaValueError
from .demo import DEMO_MODELS as DEMO_MODELS  # the demo's settings live in `gna_interp.demo`
from .demo import DEMO_PROMPTS as DEMO_PROMPTS
from .demo import DEMO_SEED as DEMO_SEED
from .demo import DEMO_TOY_PROMPTS as DEMO_TOY_PROMPTS
from .demo import demo_prompts, faithfulness_line

DTYPES = ("float32", "float16", "bfloat16")
"""``--dtype`` choices (names of torch dtypes)."""

USER_ERRORS: tuple[type[Exception], ...] = (GnaError, OSError)
"""What the CLI prints as one line: the library's own errors (`GnaError`: every error it
raises on purpose for bad input) and the operating system's (a folder that cannot be
written). Anything else, a plain ``ValueError``, ``TypeError`` or ``KeyError`` included, is
a bug and shows its traceback."""
OPTIONAL_MODULES = ("datasets", "lm_eval", "circuitsvis", "matplotlib", "nnsight")
"""Modules of the optional extras: their absence is a user error, named in one line."""


def missing_extra(error: ImportError) -> bool:
    """Whether ``error`` is an optional extra that is not installed (a user error), rather
    than a broken import (a bug)."""
    top = (error.name or "").split(".")[0]
    return top in OPTIONAL_MODULES or "pip install" in str(error)


def check_device(device: str | None, *, remote: bool = False) -> str | None:
    """``--device`` checked as text (no torch import): cpu, cuda, cuda:N, mps or xpu[:N]."""
    if device is None:
        return None
    if remote:
        raise GnaValueError(f"--device {device!r} with --remote: NDIF places the model on its own GPUs (drop --device)")
    if not re.fullmatch(r"cpu|mps|(cuda|xpu)(:\d+)?", device):
        raise GnaValueError(f"--device {device!r}: expected cpu, cuda, cuda:N (N a GPU's index), mps or xpu")
    return device


def check_device_present(device: str | None) -> None:
    """A CUDA / MPS ``--device`` that this machine has (imports torch: call before loading)."""
    if device is None or device == "cpu":
        return
    import torch

    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            raise GnaValueError(f"--device {device!r}: this machine has {count} CUDA device(s)" + (f" (0..{count - 1})" if count else ""))
    elif device == "mps" and not torch.backends.mps.is_available():
        raise GnaValueError("--device 'mps': MPS is not available on this machine")


def quiet_libraries() -> None:
    """The CLI prints its own progress: silence transformers' info logs and bars (called
    just before a command loads a model: importing transformers takes seconds)."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def model_source(name: str, remote: bool = False) -> str:
    """Where ``--model`` lives: a bundled toy's folder, a local folder, or a hub id."""
    from .models import hub
    from .models.preflight import local_folder
    from .zoo.store import toy_names, toy_path

    if remote and name in toy_names():
        raise GnaValueError(
            f"--remote runs the model on NDIF, which serves hub models: {name!r} is a bundled toy, which runs locally (drop --remote)"
        )
    if remote and hub.ndif_api_key() is None:
        raise GnaValueError(f"--remote needs an NDIF API key: {hub.NDIF_KEY_HELP}")
    if name in toy_names() and not remote:
        return str(toy_path(name))
    if not remote and not Path(name).exists() and ("/" not in name or name.startswith((".", "/", "~"))):
        raise GnaValueError(f"unknown model {name!r}: expected a bundled toy model {toy_names()}, a local folder or a hub id")
    if not remote:
        local_folder(name)  # a folder-like path that does not exist, or a folder without config.json
    return name


def load_model(
    name: str, backend: str | None = None, remote: bool = False, device: str | None = None, dtype: str | None = None, arch: Any = None
) -> Any:
    """A bundled toy name (``llama``, ``mamba2``...), a local folder, or a hub id; ``device``,
    ``dtype`` (a name in `DTYPES`) and ``arch`` (an `ArchSpec`, `arch_of`) go to `gna_interp.load`."""
    from .models.loading import load
    from .zoo import load_toy, toy_names

    check_load_options(name, remote, device, dtype)
    toy = name in toy_names() and not remote
    if toy and arch is not None:
        raise GnaValueError(f"--arch with toy {name!r}: a bundled toy's family is in the table (--arch is for a folder or hub id)")
    source = model_source(name, remote)
    check_device_present(device)
    quiet_libraries()
    if toy:
        return load_toy(name, backend=backend, device=device)
    return load(source, backend=backend, remote=bool(remote), device=device, dtype=dtype, arch=arch)


def check_load_options(name: str, remote: bool, device: str | None, dtype: str | None) -> None:
    """``--device`` and ``--dtype`` checked against each other and ``--model`` (no torch import)."""
    from .zoo.store import toy_names

    check_device(device, remote=remote)
    if dtype is not None and dtype not in DTYPES:
        raise GnaValueError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if dtype is not None and remote:
        raise GnaValueError(f"--dtype {dtype} with --remote: NDIF serves the model in its own dtype (drop --dtype)")
    if dtype is not None and name in toy_names() and not remote:
        raise GnaValueError(
            f"--dtype {dtype} with toy {name!r}: the bundled toys are float32 (--dtype is for hub models and local folders)"
        )


def load_model_of(args: argparse.Namespace) -> Any:
    """`load_model` for a command's ``--model``, ``--backend``, ``--remote``, ``--device`` and ``--dtype``."""
    return load_model(args.model, args.backend, args.remote, device=args.device, dtype=args.dtype, arch=arch_of(args))


def arch_of(args: argparse.Namespace) -> Any:
    """The `ArchSpec` of ``--arch`` (`models.registry.import_arch`, once per command), or ``None``."""
    if not getattr(args, "arch", None):
        return None
    if getattr(args, "arch_spec", None) is None:
        from .models.registry import import_arch

        args.arch_spec = import_arch(args.arch, "--arch")
    return args.arch_spec


def checked_heads(texts: list[str], name: str, remote: bool = False, arch: Any = None) -> list[Any]:
    """Parse ``--head`` values and check them against the model's config alone: no
    weights load, and for a local folder (a bundled toy) neither torch nor transformers."""
    from .core.arch import check_head_in
    from .core.heads import Head

    heads = [Head.parse(text) for text in texts]
    for head in heads:
        if heads.count(head) > 1:
            typed = " and ".join(repr(text) for text, parsed in zip(texts, heads, strict=True) if parsed == head)
            raise GnaValueError(f"--head {typed} all name head {head}: name each head once")
    layer_specs = layer_specs_of(model_source(name, remote), arch)
    for head in heads:
        check_head_in(layer_specs, head, name)
    return heads


def layer_specs_from_json(file: Path, arch: Any = None) -> tuple[Any, ...] | None:
    """The head layout from ``config.json`` read as plain data, or ``None`` when the
    architecture table needs a field the file leaves out (its config class fills it in)."""
    from types import SimpleNamespace

    from .models.preflight import read_config_json
    from .models.registry import spec_for

    config = SimpleNamespace(**read_config_json(file, object_hook=_special_floats))  # an error names the file and line
    try:
        return (arch or spec_for(config)).layers_of(config)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError):
        return None


def _special_floats(item: dict[str, Any]) -> Any:
    """transformers writes infinities in config.json as ``{"__float__": "Infinity"}``."""
    return float(item["__float__"]) if item.keys() == {"__float__"} else item


def layer_specs_of(source: str, arch: Any = None) -> tuple[Any, ...]:
    """The per-layer head layout of a model from its config alone. A local folder's
    ``config.json`` is read as plain data; a hub id, or a config that leaves out a field
    its class fills in (any missing field raises here), goes through transformers'
    ``AutoConfig`` (which imports torch)."""
    from .models.registry import spec_for

    file = Path(source) / "config.json"
    plain = layer_specs_from_json(file, arch) if file.is_file() else None
    if plain is not None:
        return plain
    from transformers import AutoConfig

    from .models.hub import hub_access

    access = hub_access(source) if not Path(source).exists() else {}
    config = AutoConfig.from_pretrained(source, **access)
    return (arch or spec_for(config)).layers_of(config)


def build_task(args: argparse.Namespace) -> Any:
    """The ``--task`` prompts; ``toy`` with a bundled toy, or a folder written by ``zoo
    train``, is the task that model was trained on (its card's)."""
    from . import tasks
    from .zoo.store import card_of

    if args.n is not None and args.n < 1:
        raise GnaValueError(f"--n {args.n}: expected a positive number of prompts")
    if args.task not in TASKS:
        return task_of_file(args.task, args.n)
    n = args.n or DEMO_PROMPTS
    if args.task == "toy":
        shape = {}
        if not getattr(args, "remote", False):
            with contextlib.suppress(ValueError):  # a toy trained here: the task it was trained on
                shape = card_of(args.model).get("task", {})
        return tasks.toy_mcq(n, seed=args.seed, **shape)
    if args.task == "kv":
        try:
            return tasks.kv_retrieval(args.kv_pairs, n=n, seed=args.seed)
        except ValueError as error:  # the library names its parameter; the user typed the flag
            raise GnaValueError(str(error).replace(f"n_pairs={args.kv_pairs}", f"--kv-pairs {args.kv_pairs}")) from None
    return tasks.mmlu(subjects=args.subjects, n=args.n, path=args.mmlu_path)


TASKS = ("toy", "mmlu", "kv")
"""``--task``'s names; anything else is a file of prompts."""


def task_of_file(text: str, n: int | None) -> Any:
    """``--task FILE``: a JSON-lines or CSV file of multiple-choice prompts (`tasks.task_file`)."""
    import difflib

    from .tasks.records import SUFFIXES, task_file

    if Path(text).suffix.lower() not in SUFFIXES:
        close = difflib.get_close_matches(text, TASKS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise GnaValueError(f"--task {text!r}{hint}: expected toy, mmlu, kv or a {' / '.join(SUFFIXES)} file of prompts (docs/tasks.md)")
    return task_file(text, n)


def check_out_dir(path: str) -> Path:
    """``--out`` as a folder, created now (missing parents too) so that a bad path fails
    before any work rather than after it."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise GnaValueError(f"--out {path!r} is an existing file: expected a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GnaValueError(f"--out {path!r}: cannot create this folder ({error.strerror or error})") from None
    return folder


def check_out_file(path: str, suffixes: tuple[str, ...]) -> Path:
    """``--out`` as a file ending in one of ``suffixes``; its folder is created now."""
    out = Path(path)
    if out.is_dir():
        raise GnaValueError(f"--out {path!r} is a folder: expected a file name ending in {' or '.join(suffixes)}")
    if out.suffix.lower() not in suffixes:
        raise GnaValueError(f"--out {path!r}: expected a file name ending in {' or '.join(suffixes)}")
    check_out_dir(str(out.parent))
    return out


def summary_table(circuits: list[Any], curves: dict[str, Any] | None = None, width: int | None = None) -> str:
    """The demo's summary table (`viz.summary.summary_table`; imported here only when used: the
    CLI's parser imports nothing heavy)."""
    from .viz.summary import SUMMARY_WIDTH
    from .viz.summary import summary_table as table

    return table(circuits, curves, SUMMARY_WIDTH if width is None else width)


def demo(args: argparse.Namespace) -> int:
    """Discovery on the bundled Transformer, SSM (Mamba-2 heads, Mamba-1 channels) and hybrid toy
    models, each toy's summary row as it finishes, then the offline report (`gna_interp.demo`)."""
    from .demo import run_demo
    from .zoo import toy_names

    if args.n is not None and args.n < 1:
        raise GnaValueError(f"--n {args.n}: expected a positive number of prompts")
    out = check_out_dir(args.out)
    quiet_libraries()
    prompts = demo_prompts([name for name in DEMO_MODELS if name in toy_names()], args.n)
    run_demo(prompts, out, progress=not args.quiet, estimate=args.n is None)
    return 0


def faithfulness_of(circuit: Any, model: Any, task: Any, *, progress: bool = True, say: bool = True, sizes: Any = None) -> Any:
    """The report's faithfulness curve of ``circuit`` (`discovery.report_inputs.circuit_faithfulness`:
    mean ablation, ranked by discovery's own head scan), with one line saying what the
    circuit carries alone and what the curve cost (`demo.faithfulness_line`)."""
    from .cost import cost_meter
    from .discovery.report_inputs import circuit_faithfulness

    start = time.perf_counter()
    with cost_meter(model) as cost:
        curve = circuit_faithfulness(circuit, model, task, sizes=sizes, progress=progress)
    if curve is not None and curve.circuit_point is not None and say:
        print(faithfulness_line(circuit, curve, cost.forwards, cost.passes(len(task)), time.perf_counter() - start))
    return curve


def discover_command(args: argparse.Namespace) -> int:
    from .discovery import discover
    from .viz.report import write_report

    if args.stability is not None and args.stability < 1:
        raise GnaValueError(f"--stability {args.stability}: expected a positive number of prompt samples")
    out = check_out_dir(args.out) if args.out else None  # fail before any work
    check_load_options(args.model, args.remote, args.device, args.dtype)
    task = build_task(args)
    model = load_model_of(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        options = {"resamples": args.resamples} if getattr(args, "resamples", None) is not None else {}
        if getattr(args, "ablation_kinds", None):
            options["ablation_kinds"] = tuple(args.ablation_kinds)
        circuit = discover(
            model, task, progress=not args.quiet, stability=args.stability, run_dir=getattr(args, "run_dir", None), **options
        )
    for warning in caught:  # to stderr (stdout may be JSON); the summary repeats the circuit's own notes
        if args.json or str(warning.message) not in circuit.warnings:
            print(f"warning: {warning.message}", file=sys.stderr)
    if args.json:
        print(circuit.to_json())
    else:
        print(circuit.summary())
    if out is not None:
        # A remote model pays per request: there, only the circuit's point and the two ends.
        curve = faithfulness_of(circuit, model, task, progress=not args.quiet, say=not args.json, sizes=[] if args.remote else None)
        faithfulness = {circuit.model: curve} if curve is not None else None
        print(f"report: {write_report([(circuit, model, task)], out, faithfulness=faithfulness)}")
    return 0


def ablate_command(args: argparse.Namespace) -> int:
    heads = checked_heads(args.head, args.model, args.remote, arch_of(args))  # before any weights load or heavy import
    check_load_options(args.model, args.remote, args.device, args.dtype)
    task = build_task(args)

    from .core.interventions import Ablate
    from .scoring.evaluation import evaluate

    # mean: over the task's own tokens; resample: each head's output on the corrupted prompts
    corrupt = task if args.how == "mean" else corrupted_task(task, args.seed) if args.how == "resample" else None
    model = load_model_of(args)
    before = evaluate(model, task)
    after = evaluate(model, task, [Ablate(heads, how=args.how, corrupt=corrupt)])
    names = ", ".join(map(str, heads))
    print(f"{model.name} on {task.name} ({len(task)} prompts, chance {before.chance:.3f})")
    print(f"accuracy clean {before.accuracy:.3f} -> {after.accuracy:.3f} with {names} {args.how}-ablated")
    return 0


def corrupted_task(task: Any, seed: int) -> Any:
    """``task``'s corrupted prompts (same token lengths, another answer) for ``--how resample``."""
    if task.corrupter is None:
        raise GnaValueError(f"--how resample needs corrupted prompts of the same length: task {task.name!r} has no corruption rule")
    return task.corrupted(seed=seed)


def patterns_command(args: argparse.Namespace) -> int:
    out = check_out_file(args.out, (".html", ".png"))  # before any work
    heads = checked_heads(args.head, args.model, args.remote, arch_of(args))
    check_load_options(args.model, args.remote, args.device, args.dtype)

    from .viz import attention_view

    inputs: Any = args.prompt if args.prompt is not None else build_task(args)
    model = load_model_of(args)
    view = attention_view(model, inputs, heads, row=0)
    print(f"wrote {view.save(out)}")
    return 0


def zoo_list(args: argparse.Namespace) -> int:
    from .zoo import toy_card, toy_names
    from .zoo.store import zoo_table_markdown

    if args.markdown:
        print(zoo_table_markdown(), end="")
        return 0
    for name in toy_names():
        card = toy_card(name)
        facts = card["ablation"]
        print(
            f"{name:8s} {card['family']:8s} {card['parameters']:>8,} params  held-out accuracy {card['held_out_accuracy']:.3f}  "
            f"best single head {facts['best_single_head']} -> {facts['best_single_head_accuracy']:.3f}"
        )
    return 0


def zoo_train(args: argparse.Namespace) -> int:
    from .zoo.build import build_toy

    chosen = train_recipe(args)
    arch = arch_of(args)  # before training: a bad --arch fails now, not after it
    out = check_out_dir(args.out or f"gna-zoo/{args.name}")
    quiet_libraries()
    where = args.device or chosen.device
    print(f"training {chosen.name} ({chosen.family}) on {where}, seed {chosen.seed}, at most {chosen.max_steps} steps, into {out}/")
    card = build_toy(chosen, out, init=args.init, progress=not args.quiet, device=args.device, arch=arch)
    facts = card["ablation"]
    print(
        f"done: {card['steps']} steps in {card['train_seconds']:.0f} s; held-out accuracy {card['held_out_accuracy']:.3f}; "
        f"best single-head ablation {facts['best_single_head']} -> {facts['best_single_head_accuracy']:.3f}"
    )
    print(f"model card: {out / 'README.md'}")
    return 0


TRAIN_FLAGS = {
    "seed": "seed",
    "max_steps": "max-steps",
    "lr": "lr",
    "batch_size": "batch-size",
    "n_options": "options",
    "words_per_option": "words-per-option",
    "layout": "layout",
    "shuffle_labels": "shuffle-labels",
    "query_last": "query-last",
    "vary_lengths": "vary-lengths",
}
"""`Recipe` field -> ``zoo train``'s flag that sets it."""


def train_recipe(args: argparse.Namespace) -> Any:
    """``zoo train``'s `Recipe` (`zoo.recipes.recipe_with`): a bundled recipe, or with
    ``--family`` a new toy's (``--config`` over its shape), with the flags given (`TRAIN_FLAGS`)."""
    import json

    from .zoo.recipes import recipe_with

    flags = {field: getattr(args, "options" if field == "n_options" else field, None) for field in TRAIN_FLAGS}
    given: dict[str, Any] = {field: value for field, value in flags.items() if value is not None}
    for field, value in given.items():
        if field in ("max_steps", "batch_size", "n_options", "words_per_option", "lr") and not value > 0:
            raise GnaValueError(f"--{TRAIN_FLAGS[field]} {value}: expected a positive number")
    if args.config is not None and args.family is None:
        raise GnaValueError("--config sets the config of a new toy: give --family too")
    try:
        config = json.loads(args.config) if args.config is not None else None
    except json.JSONDecodeError as error:
        raise GnaValueError(f"--config {args.config!r}: not valid JSON ({error.msg})") from None
    if config is not None and not isinstance(config, dict):
        raise GnaValueError(f"--config {args.config!r}: expected a JSON object of config fields")
    return recipe_with(args.name, args.family, config, **given)
