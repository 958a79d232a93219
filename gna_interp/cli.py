"""The ``gna-interp`` command: argument parsing; the work is in `gna_interp.commands`.

Every subcommand has ``--help``; bad arguments give a one-line error and exit status 2.
Parsing imports nothing heavy (no torch, no backend): ``--help`` answers at once, and
each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys

from . import commands as cmd
from .progress import progress_enabled, set_progress


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _quiet_parent() -> argparse.ArgumentParser:
    """``--quiet``, shared by every command that draws progress bars (as a parent parser)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--quiet", action="store_true", help="no progress bars (bars are drawn only on a terminal anyway)")
    return parent


def _model_help() -> str:
    """``--model``'s help, naming every bundled toy (read from the zoo's folder names: no torch)."""
    from .zoo.store import toy_names

    return f"a bundled toy model ({', '.join(toy_names())}), a local folder, or a hub id"


def _discover_options(discover: argparse.ArgumentParser) -> None:
    """`gna-interp discover`'s own options (its model and task arguments come from the shared helpers)."""
    discover.add_argument("--out", help="write an offline HTML report into this folder")
    discover.add_argument("--json", action="store_true", help="print the circuit as JSON")
    discover.add_argument(
        "--stability",
        type=int,
        metavar="K",
        help="also re-run the search on K bootstrap samples of the prompts; count how often each head is chosen",
    )
    discover.add_argument(
        "--resamples",
        type=int,
        metavar="K",
        help="also re-run the search on K bootstrap resamples of the prompts: each head's membership frequency, heads under 0.8 marked",
    )
    discover.add_argument(
        "--ablation-kinds",
        nargs="+",
        choices=("mean", "resample"),
        metavar="KIND",
        help="also ablate each role's set by these kinds (mean, resample): which roles hold under which kinds",
    )
    discover.add_argument(
        "--run-dir",
        metavar="DIR",
        help="keep the run in DIR (each finished stage, every accuracy measured): run again to carry on after a crash",
    )


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help=_model_help())
    parser.add_argument("--backend", choices=("tlens", "nnsight"), help="default: tlens for Transformers, nnsight otherwise")
    parser.add_argument("--remote", action="store_true", help="run on NDIF (nnsight; needs NDIF_API_KEY)")
    parser.add_argument("--device", help="where the weights go: cpu, cuda, cuda:N or mps (default: cpu)")
    parser.add_argument(
        "--dtype", choices=cmd.DTYPES, help="the weights' dtype, for a hub model or local folder (default: the model's float32)"
    )
    parser.add_argument("--arch", metavar="MODULE:NAME", help=ARCH_HELP)


ARCH_HELP = (
    "for a family the architecture table lacks: an ArchSpec (docs/describe.md) named NAME in a module (my_arch:QWEN3, "
    "imported from the current folder too) or a file (path/to/my_arch.py:QWEN3), used for this run's load"
)


def _task_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task",
        default="toy",
        metavar="{toy,mmlu,kv,FILE}",
        help="toy_mcq, MMLU, KV retrieval, or a .jsonl / .csv file of multiple-choice prompts (docs/tasks.md) (default: toy)",
    )
    parser.add_argument("--n", type=int, help=f"number of prompts (default {cmd.DEMO_PROMPTS}; MMLU and a file: all)")
    parser.add_argument("--seed", type=int, default=0, help="prompt seed (toy, kv)")
    parser.add_argument("--subjects", nargs="+", help="MMLU subjects")
    parser.add_argument("--mmlu-path", help="local MMLU files (parquet / JSONL / CSV); default: the hub through `datasets`")
    parser.add_argument("--kv-pairs", type=int, default=10, help="KV retrieval dictionary size (default 10)")


def _family_arguments(train: argparse.ArgumentParser) -> None:
    """``zoo train``'s options for a toy of your own family and task (docs/own_family.md)."""
    own = train.add_argument_group("a toy of your own family (gna.zoo.family_recipe) or task")
    own.add_argument("--family", help="train NAME as a new toy of this transformers model_type (e.g. qwen3), 2 layers x 4 heads")
    own.add_argument("--config", metavar="JSON", help="config fields over the 2x4 shape, e.g. '{\"num_hidden_layers\": 3}' (with --family)")
    own.add_argument("--arch", metavar="MODULE:NAME", help="for a family the architecture table lacks: its ArchSpec (the card's checks)")
    own.add_argument("--lr", type=float, help="learning rate (with --family default 3e-3)")
    own.add_argument("--batch-size", type=int, help="prompts per step (with --family default 64)")
    own.add_argument("--options", type=int, help="options per prompt (default 4)")
    own.add_argument("--words-per-option", type=int, help="words per option: the prompt's length (default 2)")
    own.add_argument("--layout", choices=("label_first", "label_last"), help="A. w1 w2 (default) or w1 w2 A")
    own.add_argument("--shuffle-labels", action="store_true", default=None, help="labels in a random order per prompt")
    own.add_argument("--query-last", action="store_true", default=None, help="the Query line after the options")
    own.add_argument("--vary-lengths", action="store_true", default=None, help="options of varied lengths")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gna-interp", description="Gather-and-Aggregate interpretability for Transformers and SSMs.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    quiet = _quiet_parent()
    demo = commands.add_parser(
        "demo", parents=[quiet], help="G&A discovery on the bundled toys (Llama, Mamba-2, Mamba-1, hybrid); writes an offline report"
    )
    demo.add_argument("--out", default="gna-report", help="report folder (default: gna-report)")
    fewer = ", ".join(f"{n} for {name}" for name, n in cmd.DEMO_TOY_PROMPTS.items())
    demo.add_argument("--n", type=int, help=f"prompts per model (default {cmd.DEMO_PROMPTS}; {fewer})")
    demo.set_defaults(func=cmd.demo)

    discover = commands.add_parser("discover", parents=[quiet], help="find the Gather and Aggregate heads of a model on a task")
    _model_arguments(discover)
    _task_arguments(discover)
    _discover_options(discover)
    discover.set_defaults(func=cmd.discover_command)

    ablate = commands.add_parser("ablate", parents=[quiet], help="accuracy on a task before and after ablating heads")
    _model_arguments(ablate)
    ablate.add_argument("--head", action="append", required=True, help="head as L.H (e.g. 16.22); repeat for several")
    ablate.add_argument(
        "--how",
        choices=("zero", "mean", "resample"),
        default="zero",
        help="zero, mean (over the task's tokens) or resample (each head's output on the task's corrupted prompts) ablation",
    )
    _task_arguments(ablate)
    ablate.set_defaults(func=cmd.ablate_command)

    patterns = commands.add_parser(
        "patterns", parents=[quiet], help="attention patterns (softmax or implicit) of heads, as offline HTML or PNG"
    )
    _model_arguments(patterns)
    patterns.add_argument("--head", action="append", required=True, help="head as L.H; repeat for several")
    patterns.add_argument("--prompt", help="the prompt (default: the first prompt of --task)")
    patterns.add_argument("--out", required=True, help="output file: .html (circuitsvis, offline) or .png (heatmap)")
    _task_arguments(patterns)
    patterns.set_defaults(func=cmd.patterns_command)

    zoo = commands.add_parser("zoo", help="the bundled toy models: list them, or reproduce their training")
    zoo.set_defaults(func=lambda _: _usage(zoo))
    zoo_commands = zoo.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND")
    listing = zoo_commands.add_parser("list", help="bundled toy models and their cards")
    listing.add_argument("--markdown", action="store_true", help="one markdown table (as in the docs)")
    listing.set_defaults(func=cmd.zoo_list)
    train = zoo_commands.add_parser(
        "train", parents=[quiet], help="train a toy model from its recipe (deterministic for a seed on a machine)"
    )
    train.add_argument("name", help="a toy model's recipe (its name in `gna-interp zoo list`), or with --family the new toy's name")
    train.add_argument("--out", help="output folder (default: gna-zoo/NAME)")
    train.add_argument("--seed", type=int, help="override the recipe's seed")
    train.add_argument("--max-steps", type=int, help="override the recipe's step limit")
    train.add_argument(
        "--init", help="for a fine-tuning recipe (init_from): the trained folder of the toy it starts from (default: the bundled toy)"
    )
    train.add_argument("--device", help="where to train: cpu or cuda (default: the recipe's, cpu for all but mamba)")
    _family_arguments(train)
    train.set_defaults(func=cmd.zoo_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # Bars only on a terminal: a log or a pipe gets no runs of carriage returns.
    was_enabled = progress_enabled()
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        set_progress(False)
    try:
        return int(args.func(args))
    except cmd.USER_ERRORS as error:  # the library's errors for bad input; a bug shows its traceback
        print(f"gna-interp: error: {error}", file=sys.stderr)
        return 2
    except ImportError as error:
        if not cmd.missing_extra(error):
            raise
        print(f"gna-interp: error: {error}", file=sys.stderr)
        return 2
    finally:
        set_progress(was_enabled)


if __name__ == "__main__":
    sys.exit(main())
