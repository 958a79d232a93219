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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gna-interp", description="Gather-and-Aggregate interpretability for Transformers and SSMs.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser("demo", help="offline demo on tiny models (CPU, no downloads)")
    demo.set_defaults(func=_demo)
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
