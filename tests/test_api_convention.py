"""The one calling convention of the public API (issue 40, item 3), read from the
signatures themselves (`inspect`) so that drift cannot come back unnoticed:

- every patching / attribution function takes ``(model, clean, corrupt, metric, *, ...)``
  (`ablation_sweep`: ``(model, clean, metric, *, ...)``), everything after keyword-only;
- the corrupted inputs have one name, ``corrupt``: no public parameter is called
  ``reference`` or ``source`` (but `Patch`'s ``source``, the clean run when denoising);
- a function that loops has ``progress``; one that stacks copies of the batch has
  ``max_rows`` and ``memory_budget_mb``;
- curves, interventions and the other entry points take their options keyword-only.
"""

from __future__ import annotations

import inspect

import pytest

import gna_interp as gna

P = inspect.Parameter
POSITIONAL = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)

CLEAN_CORRUPT_METRIC = ["patching_sweep", "attribution_patching", "path_patching", "path_patching_sweep", "edge_attribution"]
"""Functions of ``(model, clean, corrupt, metric, *, ...)``."""

POSITIONAL_HEADS: dict[str, tuple[str, ...]] = {
    "ablation_sweep": ("model", "clean", "metric"),
    **{name: ("model", "clean", "corrupt", "metric") for name in CLEAN_CORRUPT_METRIC},
    "circuit_score": ("model", "clean", "corrupt", "metric", "ranking"),
    "faithfulness_curve": ("model", "task", "ranking"),
    "edge_faithfulness_curve": ("model", "task", "ranking"),
    "retention_curve": ("model", "task", "ranking"),
    "retrieval_ranking": ("model", "probe"),
    "attention_pattern": ("model", "inputs", "heads"),
    "evaluate": ("model", "task", "interventions"),
    "lm_eval": ("model", "tasks", "interventions"),
    "discover": ("model", "task"),
    "to_mib": ("result", "path"),
    "from_mib": ("path", "model"),
    "mib_attribution": ("model", "clean", "corrupt", "metric"),
    "Ablate": ("heads",),
    "KeepOnly": ("heads",),
}
"""Public name -> its positional parameters, exactly; every other parameter is keyword-only."""

STACKS_COPIES = [
    "ablation_sweep",
    "patching_sweep",
    "attribution_patching",
    "path_patching_sweep",
    "edge_attribution",
    "retrieval_ranking",
    "circuit_score",
]
"""Functions that run copies (or chunks) of the batch per forward: ``max_rows`` and ``memory_budget_mb``."""

LOOPS = [*STACKS_COPIES, "faithfulness_curve", "edge_faithfulness_curve", "retention_curve", "evaluate", "discover", "lm_eval"]
"""Functions with a loop long enough for a bar: ``progress``."""

CORRUPT_INPUTS = ["ablation_sweep", "faithfulness_curve", "edge_faithfulness_curve", "retention_curve", "Ablate", "KeepOnly"]
"""Functions (besides `CLEAN_CORRUPT_METRIC`) whose other inputs are called ``corrupt``."""

RESULT_FIELDS = {("SweepResult", "reference"), ("EdgeResult", "reference")}
"""Fields of results, not inputs: the metric of the run the values came from."""

FORBIDDEN = ("reference", "source", "inputs_corrupt", "corrupted")


def signature(name: str) -> inspect.Signature:
    return inspect.signature(getattr(gna, name))


def public_signatures() -> list[tuple[str, inspect.Signature]]:
    """Every exported function and class constructor, and the public methods of exported classes."""
    found = []
    for name in gna.__all__:
        obj = getattr(gna, name)
        if inspect.ismodule(obj) or not callable(obj):
            continue
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(member):
                    found.append((f"{name}.{attr}", inspect.signature(member)))
        try:
            found.append((name, inspect.signature(obj)))
        except (TypeError, ValueError):  # a builtin without a signature
            continue
    return found


def positional(sig: inspect.Signature) -> tuple[str, ...]:
    return tuple(p.name for p in sig.parameters.values() if p.kind in POSITIONAL)


@pytest.mark.parametrize("name", sorted(POSITIONAL_HEADS))
def test_positional_part_then_keyword_only(name):
    sig = signature(name)
    assert positional(sig) == POSITIONAL_HEADS[name], f"{name}{sig}: positional part should be {POSITIONAL_HEADS[name]}"
    rest = [p for p in sig.parameters.values() if p.kind not in POSITIONAL]
    assert all(p.kind in (P.KEYWORD_ONLY, P.VAR_KEYWORD) for p in rest), f"{name}{sig}"


def test_model_ablated_takes_heads_then_keywords():
    sig = inspect.signature(gna.GnaModel.ablated)
    assert positional(sig) == ("self", "heads")
    assert [p.name for p in sig.parameters.values() if p.kind is P.KEYWORD_ONLY] == ["how", "corrupt"]


@pytest.mark.parametrize("name", CLEAN_CORRUPT_METRIC + CORRUPT_INPUTS)
def test_the_corrupted_inputs_are_called_corrupt(name):
    assert "corrupt" in signature(name).parameters


def test_no_public_parameter_is_called_reference_or_source():
    offenders = []
    for name, sig in public_signatures():
        for parameter in sig.parameters:
            owner = name.split(".")[0]
            if parameter in FORBIDDEN and (owner, parameter) not in RESULT_FIELDS and (name, parameter) != ("Patch", "source"):
                offenders.append(f"{name}({parameter}=)")
    assert not offenders, f"expected corrupt= (one name for the corrupted inputs): {offenders}"
    assert "source" in signature("Patch").parameters  # the one exception, on purpose


@pytest.mark.parametrize("name", LOOPS)
def test_loops_have_progress(name):
    parameter = signature(name).parameters.get("progress")
    assert parameter is not None and parameter.kind is P.KEYWORD_ONLY, f"{name}: expected a keyword-only progress="


@pytest.mark.parametrize("name", STACKS_COPIES)
def test_batched_copies_have_max_rows_and_a_memory_budget(name):
    params = signature(name).parameters
    for option in ("max_rows", "memory_budget_mb"):
        assert option in params and params[option].kind is P.KEYWORD_ONLY and params[option].default is None, (name, option)


def test_every_function_with_max_rows_follows_the_rules():
    for name, sig in public_signatures():
        if "max_rows" in sig.parameters:
            assert {"memory_budget_mb", "progress"} <= set(sig.parameters), name
            assert sig.parameters["max_rows"].kind is P.KEYWORD_ONLY, name


def test_every_function_with_positional_inputs_follows_the_convention():
    for name, sig in public_signatures():
        head = positional(sig)
        if head[:1] == ("model",) and ("corrupt" in head or ("clean" in head and "metric" in head)):
            expected = POSITIONAL_HEADS.get(name, ("model", "clean", "corrupt", "metric"))
            assert positional(sig) == expected, f"{name}{sig}"


def test_names():
    exported = set(gna.__all__)
    assert {"GnaCircuit", "candidate_logprob", "candidate_logit_diff", "candidate_accuracy", "logit_diff", "target_logprob"} <= exported
    assert not {"GnACircuit", "keep_attention_rows"} & exported
    assert not hasattr(gna.core, "keep_attention_rows")


def test_keep_only_works_with_its_defaults():
    keep = gna.KeepOnly([gna.Head(0, 0)])  # mean over the inputs of the forward it runs in
    assert (keep.how, keep.kind, keep.corrupt) == ("mean", "attention", None)
    with pytest.raises(ValueError, match="needs corrupt="):
        gna.KeepOnly([gna.Head(0, 0)], how="resample")


def test_every_export_is_what_it_names_even_after_every_submodule_is_imported():
    """A name that shares its spelling with a submodule (``models.distill``) must not resolve
    to that submodule once something has imported it (the import system sets the package's
    attribute): ``gna.distill`` is the function, whatever was imported before."""
    import importlib
    import inspect
    import pkgutil

    from gna_interp import _EXPORTS
    from gna_interp._lazy import lazy_attribute

    for info in pkgutil.walk_packages(gna.__path__, "gna_interp."):
        if not info.name.split(".")[-1].startswith("_") and "harness" not in info.name:
            importlib.import_module(info.name)
    for name, where in _EXPORTS.items():
        value = lazy_attribute("gna_interp", _EXPORTS, name)
        assert inspect.ismodule(value) == where.endswith(":"), (name, where, value)
