"""`lm_eval` and `lm_eval_table`: any lm-eval task under any intervention, in one call.

Both run lm-eval's own task loading, prompting, few-shot sampling, scoring and
aggregation (`lm_eval.evaluator.evaluate`) on an `LMEvalModel`; lm-eval itself is
imported only when they are called (``pip install "gna-interp[eval]"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import GnaValueError
from ..core.interventions import Ablate, Intervention, MaskAttentionRows, Patch, SkipLayers, Truncate
from ..core.keywords import suggest_keywords
from ..models.handle import check_model

if TYPE_CHECKING:
    import pandas as pd

    from ..models.handle import GnaModel

FEWSHOT_SEED = 1234
"""lm-eval's default few-shot seed (``simple_evaluate``'s ``fewshot_random_seed``)."""
FRAME_COLUMNS = ("task", "metric", "filter", "value", "stderr", "n", "intervention")
_MANAGERS: dict[str, Any] = {}
_BUILT_IN = "built-in"


@dataclass
class LMEvalRun:
    """One lm-eval run: its results dict and the same numbers as a tidy table."""

    results: dict[str, Any]
    """What ``lm_eval.evaluator.evaluate`` returns (``results``, ``groups``, ``configs``,
    ``versions``, ``n-shot``, ``n-samples``; ``samples`` with ``log_samples=True``), plus
    ``config`` (model, interventions, limit, few-shot count)."""
    frame: pd.DataFrame
    """One row per task (and group) and metric: ``task``, ``metric``, ``filter``,
    ``value``, ``stderr`` (NaN where lm-eval gives none), ``n`` (documents scored),
    ``intervention`` (the label)."""
    label: str

    def __repr__(self) -> str:
        return f"LMEvalRun({self.label!r}, {len(self.frame)} rows)\n{self.frame.to_string(index=False)}"


@dataclass
class LMEvalTable:
    """The same tasks clean and under each intervention set (the paper's comparison)."""

    runs: dict[str, LMEvalRun]
    """Label -> its run, clean first."""
    frame: pd.DataFrame
    """Every run's `LMEvalRun.frame`, stacked."""
    metric: str

    @property
    def table(self) -> pd.DataFrame:
        """``[task, label]``: `metric` per task (rows) for each intervention set (columns, in order)."""
        chosen = self.frame[self.frame["metric"] == self.metric]
        wide = chosen.pivot_table(index="task", columns="intervention", values="value", aggfunc="first", sort=False)
        return wide[[label for label in self.runs if label in wide.columns]]

    def __repr__(self) -> str:
        return f"LMEvalTable({self.metric})\n{self.table.to_string()}"


@suggest_keywords
def lm_eval(
    model: GnaModel,
    tasks: str | Sequence[Any],
    interventions: Sequence[Intervention] = (),
    *,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    include_path: str | Path | Sequence[str | Path] | None = None,
    batch_size: int = 16,
    label: str | None = None,
    log_samples: bool = False,
    progress: bool | None = None,
) -> LMEvalRun:
    """Evaluate ``model`` on lm-eval ``tasks`` with ``interventions`` applied.

    Args:
        model: any `GnaModel` (either backend, local or remote); its active
            ``ablated`` / ``intervening`` / `swap_layers` contexts apply too.
        tasks: lm-eval task or group names (``"mmlu"``, ``["arc_easy", "gsm8k"]``),
            task config dicts, or lm-eval ``Task`` objects.
        interventions: see `LMEvalModel` (`Patch` and resample ablation cannot follow
            lm-eval's requests; positions count from the end of each input).
        limit: documents per task (an int) or a fraction of them (below 1).
        num_fewshot: few-shot examples (default: each task's own; lm-eval's rules).
        include_path: folder(s) of task YAMLs of your own. When every task named is
            found there, lm-eval's ~15,000 built-in task files are not indexed.
        batch_size: distinct inputs per forward.
        label: the ``intervention`` column (default: described from the interventions).
        log_samples: keep per-document inputs and scores in ``results["samples"]``.
        progress: tqdm bars (default: lm-eval's).

    Returns:
        an `LMEvalRun`: ``.results`` (lm-eval's dict) and ``.frame`` (task, metric,
        filter, value, stderr, n, intervention).
    """
    require_lm_eval()  # first: a missing extra is named whatever the arguments
    check_model(model, "lm_eval")
    task_list = _task_list(tasks)
    return _run(
        model, task_list, interventions, limit, num_fewshot, task_manager(include_path, task_list), batch_size, label, log_samples, progress
    )


def _run(
    model: GnaModel,
    task_list: list[Any],
    interventions: Sequence[Intervention],
    limit: int | float | None,
    num_fewshot: int | None,
    manager: Any,
    batch_size: int,
    label: str | None,
    log_samples: bool,
    progress: bool | None,
) -> LMEvalRun:
    from lm_eval.evaluator import evaluate

    from .adapter import LMEvalModel

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
        raise GnaValueError(f"limit={limit!r}: expected a positive number of documents (or a fraction below 1), or None")
    if num_fewshot is not None and (isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int) or num_fewshot < 0):
        raise GnaValueError(f"num_fewshot={num_fewshot!r}: expected a non-negative int or None")
    lm = LMEvalModel(model, interventions, batch_size, progress=progress)
    name = label if label is not None else describe([*model.active_interventions, *interventions])
    loaded = manager.load(task_list)
    for task in loaded["tasks"].values():
        _set_fewshot(task, num_fewshot)
    results = evaluate(lm=lm, task_dict=loaded, limit=limit, log_samples=log_samples)
    if results is None:  # pragma: no cover - only for ranks other than 0
        raise RuntimeError("lm-eval returned no results")
    results["config"] = {
        "model": model.name,
        "backend": model.backend_name,
        "interventions": name,
        "limit": limit,
        "num_fewshot": num_fewshot,
        "batch_size": batch_size,
    }
    return LMEvalRun(results=results, frame=results_frame(results, name), label=name)


@suggest_keywords
def lm_eval_table(
    model: GnaModel,
    tasks: str | Sequence[Any],
    conditions: Mapping[str, Sequence[Intervention]] | Sequence[Sequence[Intervention]],
    *,
    metric: str = "acc",
    clean: bool = True,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    include_path: str | Path | Sequence[str | Path] | None = None,
    batch_size: int = 16,
    progress: bool | None = None,
) -> LMEvalTable:
    """``metric`` per task, clean and under each intervention set, as one table::

        table = gna.lm_eval_table(model, ["mmlu", "arc_easy"], {
            "-Gather": [gna.Ablate(gather)], "-Aggregate": [gna.Ablate(aggregate)],
            "-both": [gna.Ablate([*gather, *aggregate])]})
        table.table          # rows: tasks; columns: clean, -Gather, -Aggregate, -both

    Args:
        conditions: label -> interventions, or a list of intervention lists (labelled
            by `describe`).
        metric: the metric of `LMEvalTable.table` (every metric is in ``.frame``).
        clean: add a ``clean`` run first (no interventions but the model's active ones).
        Others: as `lm_eval`.
    """
    check_model(model, "lm_eval_table")
    if isinstance(conditions, Mapping):
        named = {str(label): list(items) for label, items in conditions.items()}
    else:
        named = {describe(items): list(items) for items in conditions}
        if len(named) != len(conditions):
            raise GnaValueError("two intervention sets get the same label: pass a dict of label -> interventions")
    if clean:
        if "clean" in named:
            raise GnaValueError("the label 'clean' is taken by the clean run: rename that condition, or pass clean=False")
        named = {"clean": [], **named}
    if not named:
        raise GnaValueError("no conditions to run: give intervention sets, or clean=True")
    require_lm_eval()
    task_list = _task_list(tasks)
    manager = task_manager(include_path, task_list)
    runs = {
        label: _run(model, task_list, items, limit, num_fewshot, manager, batch_size, label, False, progress)
        for label, items in named.items()
    }
    import pandas as pd

    frame = pd.concat([run.frame for run in runs.values()], ignore_index=True)
    return LMEvalTable(runs=runs, frame=frame, metric=metric)


def require_lm_eval() -> Any:
    """The adapter module (importing it registers ``gna`` with lm-eval), or a clear error."""
    from . import adapter  # raises ImportError naming the [eval] extra when lm-eval is missing

    return adapter


def _task_list(tasks: Any) -> list[Any]:
    task_list = [tasks] if isinstance(tasks, (str, Mapping)) else list(tasks)
    if not task_list:
        raise GnaValueError("tasks is empty: name at least one lm-eval task")
    return task_list


def task_manager(include_path: Any, tasks: Sequence[Any]) -> Any:
    """An lm-eval ``TaskManager``: over ``include_path`` alone when it holds every named
    task, else over lm-eval's built-in tasks too (indexing those ~15,000 files takes
    seconds: the manager of the built-in tasks alone is kept for the process)."""
    from lm_eval.tasks import TaskManager

    paths: tuple[str, ...] = ()
    if include_path is not None:
        items = [include_path] if isinstance(include_path, (str, Path)) else list(include_path)
        for item in items:
            if not Path(item).is_dir():
                raise GnaValueError(f"include_path {str(item)!r} is not a folder of lm-eval task YAMLs")
        paths = tuple(str(Path(item).resolve()) for item in items)
    names = [task for task in tasks if isinstance(task, str)]
    if paths:
        own = TaskManager(include_path=list(paths), include_defaults=False)
        if all(name in own.all_tasks for name in names):
            return own
        return TaskManager(include_path=list(paths))
    if _BUILT_IN not in _MANAGERS:
        _MANAGERS[_BUILT_IN] = TaskManager()
    return _MANAGERS[_BUILT_IN]


def _set_fewshot(task: Any, num_fewshot: int | None) -> None:
    """lm-eval's ``simple_evaluate`` rule: ``num_fewshot`` overrides a task's own count
    unless the task pins 0; with none given, a task without a count gets 0."""
    own = task.get_config("num_fewshot")
    if num_fewshot is not None and own != 0:
        task.set_config(key="num_fewshot", value=num_fewshot)
    elif num_fewshot is None and own is None:
        task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=FEWSHOT_SEED)


def results_frame(results: Mapping[str, Any], label: str) -> pd.DataFrame:
    """lm-eval's ``results["results"]`` as rows (see `LMEvalRun.frame`)."""
    import pandas as pd

    rows = []
    counts = results.get("n-samples", {})
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            metric, filter_name = key.split(",", 1)
            stderr = metrics.get(f"{metric}_stderr,{filter_name}")
            n = counts.get(task, {}).get("effective")
            rows.append(
                {
                    "task": task,
                    "metric": metric,
                    "filter": filter_name,
                    "value": float(value),
                    "stderr": float(stderr) if isinstance(stderr, (int, float)) else math.nan,
                    "n": n,
                    "intervention": label,
                }
            )
    return pd.DataFrame(rows, columns=list(FRAME_COLUMNS))


def describe(interventions: Sequence[Intervention]) -> str:
    """A short label: ``clean``, ``-L16H22,L17H24``, ``skip L3``, ``layers<18``,
    ``mask rows [-1]``, joined by ``" + "``."""
    parts = []
    for item in interventions:
        if isinstance(item, Ablate):
            how = "" if item.how == "zero" else f" ({item.how})"
            where = "" if item.positions is None else f" at {item.positions}"
            parts.append(f"-{','.join(map(str, item.heads))}{how}{where}")
        elif isinstance(item, SkipLayers):
            parts.append(f"skip L{','.join(map(str, item.layers))}")
        elif isinstance(item, Truncate):
            parts.append(f"layers<{item.n_layers}")
        elif isinstance(item, MaskAttentionRows):
            verb = "keep" if item.keep else "mask"
            scope = [f"L{layer}" for layer in item.layers or ()] or [str(head) for head in item.heads or ()]
            where = f" in {','.join(scope)}" if scope else ""
            parts.append(f"{verb} rows {item.positions}{where}")
        elif isinstance(item, Patch):
            parts.append(f"patch {','.join(map(str, item.targets))}")
        else:
            parts.append(repr(item))
    return " + ".join(parts) or "clean"
