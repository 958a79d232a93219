"""lm-eval's own command line, with the ``gna`` model registered.

lm-eval 0.4 finds models only in its own registry, which nothing outside the process can
extend (no plugin entry points), so ``lm_eval --model gna`` cannot see this package.
This launcher registers ``gna`` and hands the arguments to lm-eval's CLI unchanged::

    gna-lm-eval --model gna --model_args pretrained=PATH,ablate=L16H22 --tasks mmlu
    python -m gna_interp.harness --model gna --model_args pretrained=toy:llama --tasks my_task --include_path tasks/

One flag of its own, ``--no_builtin_tasks``: index only ``--include_path`` rather than
lm-eval's ~15,000 built-in task files too (that indexing takes 10-20 s of CPU on every
run; useful when every task is your own).
"""

from __future__ import annotations

import sys
from typing import Any

NO_BUILTIN_TASKS = "--no_builtin_tasks"


def main(argv: list[str] | None = None) -> int:
    """Run lm-eval's CLI on ``argv`` (default: the process's arguments)."""
    from .run import require_lm_eval

    require_lm_eval()  # registers "gna" with lm-eval; without lm-eval, says which extra to install
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    if NO_BUILTIN_TASKS in args:
        args.remove(NO_BUILTIN_TASKS)
        _index_include_path_only()
    sys.argv = [sys.argv[0], *args]
    cli_evaluate()
    return 0


def _index_include_path_only() -> None:
    """For this process only: lm-eval's CLI builds its ``TaskManager`` over
    ``--include_path`` alone."""
    import lm_eval.tasks

    builtin = lm_eval.tasks.TaskManager

    class IncludePathOnly(builtin):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, include_defaults: bool = False, **kwargs: Any) -> None:
            super().__init__(*args, include_defaults=include_defaults, **kwargs)

    lm_eval.tasks.TaskManager = IncludePathOnly  # type: ignore[misc]
