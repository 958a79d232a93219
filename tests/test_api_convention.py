"""The one calling convention of the public API (issues 40, item 3, and 53, item 6: one
vocabulary), read from the signatures themselves (`inspect`) so that drift cannot come back
unnoticed:

- every patching / attribution function and both sweeps take ``(model, clean, corrupt,
  metric, *, ...)``, everything after keyword-only;
- the prompts have one name per role: ``clean`` (the prompts measured), ``corrupt`` (the
  counterfactual ones; no public parameter is called ``reference`` or ``source``, but
  `Patch`'s ``source``), ``task`` (a `Task`); no ``probe``, ``inputs`` or ``prompts`` (but
  `GnaModel`'s own methods, which run whatever they are given);
- a function that loops has ``progress`` (never ``show_progress``); one that chunks its
  forwards has ``batch_size`` (rows per forward), and one that stacks copies of the batch
  also ``memory_budget_mb`` (never ``max_rows``);
- which variant: ``how`` (what replaces a head's output), ``kind`` (which heads),
  ``method`` (the estimator), ``rule`` (the integration rule of ``steps``), ``direction``
  (noising or denoising), ``path`` (which paths); each keyword has one meaning, checked
  from its default;
- generic helpers live under their namespace (``gna.attention.entropy``), not at the top;
- curves, interventions and the other entry points take their options keyword-only.

Old names still work for one release, with a warning: `tests/test_vocabulary.py`.
"""

from __future__ import annotations

import inspect

import pytest

import gna_interp as gna

P = inspect.Parameter
POSITIONAL = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)

CLEAN_CORRUPT_METRIC = [
    "ablation_sweep",
    "patching_sweep",
    "attribution_patching",
    "path_patching",
    "path_patching_sweep",
    "edge_attribution",
]
"""Functions of ``(model, clean, corrupt, metric, *, ...)``."""

POSITIONAL_HEADS: dict[str, tuple[str, ...]] = {
    **{name: ("model", "clean", "corrupt", "metric") for name in CLEAN_CORRUPT_METRIC},
    "circuit_score": ("model", "clean", "corrupt", "metric", "ranking"),
    "faithfulness_curve": ("model", "task", "ranking"),
    "edge_faithfulness_curve": ("model", "task", "ranking"),
    "retention_curve": ("model", "task", "ranking"),
    "retrieval_ranking": ("model", "task"),
    "attention_pattern": ("model", "clean", "heads"),
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
"""Functions that run copies (or chunks) of the batch per forward: ``batch_size`` and ``memory_budget_mb``."""

CHUNKS = ["evaluate", "faithfulness_curve", "retention_curve", "lm_eval", "lm_eval_table", "distill"]
"""Functions that chunk their prompts (one copy): ``batch_size`` alone."""

LOOPS = [*STACKS_COPIES, "faithfulness_curve", "edge_faithfulness_curve", "retention_curve", "evaluate", "discover", "lm_eval"]
"""Functions with a loop long enough for a bar: ``progress``."""

CORRUPT_INPUTS = ["faithfulness_curve", "edge_faithfulness_curve", "retention_curve", "Ablate", "KeepOnly"]
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
def test_batched_copies_have_a_batch_size_and_a_memory_budget(name):
    params = signature(name).parameters
    for option in ("batch_size", "memory_budget_mb"):
        assert option in params and params[option].kind is P.KEYWORD_ONLY and params[option].default is None, (name, option)


@pytest.mark.parametrize("name", CHUNKS)
def test_chunked_prompts_have_a_batch_size(name):
    parameter = signature(name).parameters.get("batch_size")
    assert parameter is not None and parameter.kind is P.KEYWORD_ONLY and isinstance(parameter.default, int), name


def test_one_chunking_pair_everywhere():
    """``batch_size`` and ``memory_budget_mb`` and no other spelling; a memory budget comes
    with the ``batch_size`` it estimates and a bar."""
    old = {"max_rows", "show_progress", "batchsize", "chunk_size", "max_batch", "memory_budget", "memory_mb"}
    found = {name: set(sig.parameters) & old for name, sig in public_signatures()}
    assert not {name: names for name, names in found.items() if names}, "expected batch_size / memory_budget_mb / progress"
    for name, sig in public_signatures():
        if "memory_budget_mb" in sig.parameters:
            assert {"batch_size", "progress"} <= set(sig.parameters), name
            assert sig.parameters["batch_size"].kind is P.KEYWORD_ONLY, name
    assert set(STACKS_COPIES) == {name for name, sig in public_signatures() if "memory_budget_mb" in sig.parameters}
    assert set(STACKS_COPIES + CHUNKS) == {name for name, sig in public_signatures() if "batch_size" in sig.parameters}


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


VARIANTS: dict[str, tuple[str, ...]] = {
    "how": ("zero", "mean", "resample", "corrupt"),
    "kind": ("attention", "ssm", "all"),
    "method": ("first_order", "exact_upstream", "exact_receiver"),
    "rule": ("left", "midpoint"),
    "direction": ("denoise", "noise"),
    "path": ("all", "direct", "mib"),
}
"""The keywords that choose a variant, each with its one meaning (its values): ``how``, what
replaces a head's output; ``kind``, which heads; ``method``, the estimator; ``rule``, the
integration rule of ``steps``; ``direction``, which run is patched; ``path``, which paths of a
sender count."""

RESULTS = {"CircuitScore", "EdgeFaithfulnessCurve", "FaithfulnessCurve", "RetentionCurve", "RetrievalRanking", "SweepResult"}
"""Results: their fields record a variant (``SweepResult.kind``: "ablation" or "patching", the sweep)."""

SYNONYMS = ("mode", "strategy", "variant", "style", "ablation", "estimator", "algorithm", "approach", "show_progress", "max_rows")


def variant_parameters() -> list[tuple[str, inspect.Parameter]]:
    """Every public parameter with a string default (results' fields left out)."""
    return [
        (name, p)
        for name, sig in public_signatures()
        if name.split(".")[0] not in RESULTS
        for p in sig.parameters.values()
        if isinstance(p.default, str)
    ]


def test_each_variant_keyword_has_one_meaning():
    """A variant keyword's default is one of its family's values, and a value that belongs to
    one family only is never the default of another keyword (``"all"`` is shared)."""
    owner = {value: key for key, values in VARIANTS.items() for value in values if value != "all"}
    assert len(owner) == sum(len(values) for values in VARIANTS.values()) - 2  # no value in two families but "all"
    checked = set()
    for name, parameter in variant_parameters():
        if parameter.name in VARIANTS:
            assert parameter.default in VARIANTS[parameter.name], (
                f"{name}({parameter.name}={parameter.default!r}): expected one of {VARIANTS[parameter.name]}"
            )
            checked.add(parameter.name)
        elif parameter.default in owner:
            raise AssertionError(f"{name}({parameter.name}={parameter.default!r}): that choice is spelled {owner[parameter.default]}=")
    assert checked == set(VARIANTS)  # every family is in use: the table is not stale


def literal_values(function, parameter: inspect.Parameter) -> set[str]:
    """The strings a parameter's annotation allows (``Literal[...]``, through unions and aliases)."""
    import typing

    annotation = parameter.annotation
    if isinstance(annotation, str):  # postponed (``from __future__ import annotations``)
        annotation = eval(annotation, {**inspect.unwrap(function).__globals__, "GnaModel": gna.GnaModel})
    found, stack = set(), [annotation]
    while stack:
        item = stack.pop()
        if typing.get_origin(item) is typing.Literal:
            found |= {arg for arg in typing.get_args(item) if isinstance(arg, str)}
        else:
            stack += typing.get_args(item)
    return found


def test_each_variant_keywords_annotation_allows_only_its_family():
    """``kind`` of `attention_pattern` names head kinds as ``kind`` does everywhere (not
    ``"softmax"`` / ``"implicit"``, issue 53); ``direction``, ``rule``, ``path`` list theirs."""
    checked = []
    for name in gna.__all__:
        function = getattr(gna, name)
        if not inspect.isfunction(function):
            continue
        for parameter in inspect.signature(function).parameters.values():
            if parameter.name in VARIANTS and (values := literal_values(function, parameter)):
                assert values <= set(VARIANTS[parameter.name]), f"{name}({parameter.name}=): {sorted(values)}"
                checked.append((name, parameter.name))
    assert ("attention_pattern", "kind") in checked and ("patching_sweep", "direction") in checked, checked


def test_no_synonym_for_a_variant_or_an_option():
    offenders = [f"{name}({p})" for name, sig in public_signatures() for p in sig.parameters if p in SYNONYMS]
    assert not offenders, offenders


def test_how_is_the_one_name_of_the_replacement():
    """Every public callable that ablates heads chooses the replacement with ``how``."""
    ablating = ["Ablate", "KeepOnly", "ablation_sweep", "circuit_score", "faithfulness_curve", "retention_curve", "retrieval_ranking"]
    for name in ablating:
        assert signature(name).parameters["how"].kind is P.KEYWORD_ONLY, name
    assert "how" in inspect.signature(gna.GnaModel.ablated).parameters


PROMPT_ROLES = {"clean", "corrupt", "task", "tasks", "data"}
"""The prompts' arguments by role: ``clean`` the prompts measured, ``corrupt`` the
counterfactual ones, ``task`` a `Task` (or several, for `retrieval_ranking`), ``tasks``
lm-eval's task names, ``data`` `distill`'s training text."""

OTHER_PROMPT_NAMES = ("probe", "inputs", "prompts", "texts", "examples", "dataset", "batch", "x")


def test_the_prompts_have_one_name_per_role():
    """No public function takes prompts under another name. `GnaModel`'s own methods (``run``,
    ``logits``, ``cache``, ``to_batch``...) keep ``inputs``/``batch``: they run what they are
    given, with no clean or corrupted role; results' fields are records (`RetrievalRanking.probe`:
    the names of the tasks probed)."""
    offenders = []
    for name, sig in public_signatures():
        if name.startswith("GnaModel.") or name.split(".")[0] in RESULTS:
            continue
        offenders += [f"{name}({p})" for p in sig.parameters if p in OTHER_PROMPT_NAMES]
    assert not offenders, f"expected one of {sorted(PROMPT_ROLES)}: {offenders}"
    for name in ("evaluate", "faithfulness_curve", "retention_curve", "edge_faithfulness_curve", "discover", "retrieval_ranking"):
        assert positional(signature(name))[1] == "task", name
    assert positional(signature("attention_pattern"))[1] == "clean"


def test_the_sweeps_share_one_positional_signature():
    sweeps = sorted(name for name in gna.__all__ if name.endswith("_sweep"))
    assert sweeps == ["ablation_sweep", "patching_sweep", "path_patching_sweep"]
    heads = {name: positional(signature(name)) for name in sweeps}
    assert set(heads.values()) == {("model", "clean", "corrupt", "metric")}, heads


GENERIC = {"entropy": "attention", "mass_on": "attention", "top1_mass": "attention"}
"""Generic helpers -> the namespace they live in (not the top level)."""


def test_generic_helpers_live_under_their_namespace():
    exported = set(gna.__all__) | set(dir(gna))
    assert not (set(GENERIC) | {"evaluation"}) & exported  # nor the evaluation module beside evaluate and Evaluation
    for name, namespace in GENERIC.items():
        module = getattr(gna, namespace)
        assert name in module.__all__ and callable(getattr(module, name)), (namespace, name)
    assert {"evaluate", "Evaluation", "evaluate_many"} <= set(gna.scoring.__all__)
    from gna_interp import _EXPORTS

    short = [name for name, where in _EXPORTS.items() if not where.endswith(":") and name.islower() and "_" not in name]
    assert set(short) <= {"discover", "distill", "evaluate", "hybridize", "load"}, short  # a one-word function is an entry point


def test_the_namespaces_speak_the_same_vocabulary():
    """The subpackages' public functions too (``gna.attention.ssm_inputs``, ``gna.viz.attention_view``...):
    no old keyword, no other name for the prompts, but in `GnaModel`'s own methods and results' fields."""
    old = {"probe", "inputs", "prompts", "texts", "show_progress", "max_rows"}
    offenders = []
    for namespace in ("core", "patching", "scoring", "attention", "discovery", "models", "tasks", "viz", "zoo"):
        module = getattr(gna, namespace)
        for name in module.__all__:
            obj = getattr(module, name)
            if not callable(obj) or name in RESULTS or name == "GnaModel":
                continue
            try:
                parameters = inspect.signature(obj).parameters
            except (TypeError, ValueError):
                continue
            offenders += [f"gna.{namespace}.{name}({p})" for p in parameters if p in old]
    assert not offenders, offenders
