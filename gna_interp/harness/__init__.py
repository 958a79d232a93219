"""lm-evaluation-harness as the evaluation engine: any lm-eval task under any intervention.

- `lm_eval`: one model, lm-eval tasks, an intervention set -> lm-eval's results dict and
  a tidy DataFrame;
- `lm_eval_table`: the same tasks clean and under each intervention set, as one table;
- `LMEvalModel`: the ``lm_eval.api.model.LM`` behind both, registered with lm-eval as
  ``gna`` (``python -m gna_interp.harness --model gna --model_args pretrained=...``);
- `write_task`: a gna_interp `Task` as a local lm-eval task folder.

lm-eval is the optional ``[eval]`` extra: ``import gna_interp`` never imports it. It is
imported by `LMEvalModel` (``gna_interp.harness.adapter``) and when `lm_eval` /
`lm_eval_table` run.
"""

from typing import Any

from .args import parse_model_args
from .export import write_task
from .run import LMEvalRun, LMEvalTable, describe, lm_eval, lm_eval_table


def __getattr__(name: str) -> Any:
    if name == "LMEvalModel":  # subclasses lm-eval's LM: imported on first use
        from .adapter import LMEvalModel

        return LMEvalModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LMEvalModel", "LMEvalRun", "LMEvalTable", "describe", "lm_eval", "lm_eval_table", "parse_model_args", "write_task"]
