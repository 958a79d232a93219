"""The ``gna-interp`` command."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    """Until the toy-model demo exists, run the offline quickstart on tiny random models."""
    script = Path(__file__).resolve().parent.parent / "examples" / "quickstart.py"
    if script.is_file():
        runpy.run_path(str(script), run_name="__main__")
        return 0
    from . import _smoke

    _smoke.run()
    return 0


def _zoo_list(args: argparse.Namespace) -> int:
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


def _zoo_train(args: argparse.Namespace) -> int:
    import dataclasses

    from .zoo import recipe
    from .zoo.build import build_toy

    chosen = recipe(args.name)
    if args.seed is not None:
        chosen = dataclasses.replace(chosen, seed=args.seed)
    if args.max_steps is not None:
        if args.max_steps < 1:
            raise ValueError(f"--max-steps {args.max_steps}: expected a positive number of steps")
        chosen = dataclasses.replace(chosen, max_steps=args.max_steps)
    out = Path(args.out or f"gna-zoo/{args.name}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is an existing file: expected a folder")
    print(f"training {chosen.name} ({chosen.family}), seed {chosen.seed}, at most {chosen.max_steps} steps, into {out}/")
    card = build_toy(chosen, out, progress=not args.quiet)
    facts = card["ablation"]
    print(
        f"done: {card['steps']} steps in {card['train_seconds']:.0f} s; held-out accuracy {card['held_out_accuracy']:.3f}; "
        f"best single-head ablation {facts['best_single_head']} -> {facts['best_single_head_accuracy']:.3f}"
    )
    print(f"model card: {out / 'README.md'}")
    return 0


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gna-interp", description="Gather-and-Aggregate interpretability for Transformers and SSMs.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser("demo", help="offline demo on tiny models (CPU, no downloads)")
    demo.set_defaults(func=_demo)

    zoo = commands.add_parser("zoo", help="the bundled toy models: list them, or reproduce their training")
    zoo.set_defaults(func=lambda _: _usage(zoo))
    zoo_commands = zoo.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND")
    listing = zoo_commands.add_parser("list", help="bundled toy models and their cards")
    listing.add_argument("--markdown", action="store_true", help="one markdown table (as in the docs)")
    listing.set_defaults(func=_zoo_list)
    train = zoo_commands.add_parser("train", help="train a toy model on CPU from its recipe (deterministic for a seed)")
    train.add_argument("name", help="toy model name: llama, mamba2 or mamba")
    train.add_argument("--out", help="output folder (default: gna-zoo/NAME)")
    train.add_argument("--seed", type=int, help="override the recipe's seed")
    train.add_argument("--max-steps", type=int, help="override the recipe's step limit")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=_zoo_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"gna-interp: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
