"""Execute every notebook in ``examples/`` from a clean kernel, as CI does (``make notebooks``).

Each notebook must be stored with its outputs stripped, run top to bottom without an
error in a fresh ``python3`` kernel (nbclient, in a temporary folder: files it writes do
not land in the checkout), and print little: at most ``MAX_OUTPUT_BYTES`` of output.
There is no time limit on a cell: a slow machine is not a failure.

Usage: ``python examples/run_notebooks.py [--keep FOLDER] [NOTEBOOK ...]`` (default: every
``*.ipynb``; ``--keep`` writes the executed notebooks, outputs included, into FOLDER).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

EXAMPLES = Path(__file__).resolve().parent
MAX_OUTPUT_BYTES = 20_000
"""Per notebook, text and data of every output together: notebooks stay small to read and to diff."""


def stored_outputs(book: nbformat.NotebookNode) -> int:
    """Code cells stored with outputs or an execution count (they must be stripped)."""
    return sum(1 for cell in book.cells if cell.cell_type == "code" and (cell.outputs or cell.execution_count))


def output_bytes(book: nbformat.NotebookNode) -> int:
    return sum(len(json.dumps(output)) for cell in book.cells if cell.cell_type == "code" for output in cell.outputs)


def run(path: Path, keep: Path | None = None) -> list[str]:
    """Execute one notebook; the problems found (empty: it passed)."""
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    problems = []
    if stored_outputs(book):
        problems.append(f"{stored_outputs(book)} code cell(s) stored with outputs: strip them (Jupyter: Clear All Outputs)")
    with tempfile.TemporaryDirectory(prefix="gna-notebook-") as folder:
        # no limit on a cell, nor (within reason) on the kernel's start on a busy machine
        client = NotebookClient(book, kernel_name="python3", timeout=None, startup_timeout=1800, resources={"metadata": {"path": folder}})
        try:
            client.execute()
        except CellExecutionError as error:  # the failing cell and its traceback
            problems.append(f"a cell failed:\n{error}")
    if keep is not None:  # kept failed or not: the outputs up to a failing cell show what went wrong
        keep.mkdir(parents=True, exist_ok=True)
        nbformat.write(book, keep / path.name)
    if problems and problems[-1].startswith("a cell failed"):
        return problems
    size = output_bytes(book)
    if size > MAX_OUTPUT_BYTES:
        problems.append(f"outputs are {size:,} bytes, more than {MAX_OUTPUT_BYTES:,}: print less")
    errors = [o for cell in book.cells if cell.cell_type == "code" for o in cell.outputs if o.get("name") == "stderr"]
    if errors:
        problems.append("wrote to stderr: " + " | ".join(o["text"].strip()[:200] for o in errors))
    return problems


def main(args: list[str]) -> int:
    keep = None
    if args[:1] == ["--keep"]:
        keep, args = Path(args[1]), args[2:]
    notebooks = [Path(p) for p in args] or sorted(EXAMPLES.glob("*.ipynb"))
    failed = 0
    for path in notebooks:
        start = time.perf_counter()
        problems = run(path, keep)
        kept = f", executed copy in {keep / path.name}" if keep is not None else ""
        print(f"{path.name}: {'ok' if not problems else 'FAILED'} in {time.perf_counter() - start:.0f} s{kept}")
        for problem in problems:
            print(f"  {problem}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
