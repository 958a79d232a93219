"""The code's shape (issue 51, item 6): no function in gna_interp/ over `MAX_FUNCTION_LINES`
lines (from its ``def`` to its last line, docstring included; nested functions and methods
count on their own) and no module over `MAX_MODULE_LINES` lines, except those named in
`LONG_FUNCTIONS` and `LONG_MODULES`, each with a one-line reason. An exception that is no
longer long fails too, so that the lists cannot go stale.

Read from the source with `ast`, not imported: fast, and nothing runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gna_interp"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500

LONG_FUNCTIONS: dict[str, str] = {}
"""``"<module path under gna_interp/>::<function name>"`` -> why it may be longer than
`MAX_FUNCTION_LINES` for now."""

LONG_MODULES: dict[str, str] = {}
"""``"<module path under gna_interp/>"`` -> why it may be longer than `MAX_MODULE_LINES`."""


def function_lengths(source: str) -> list[tuple[str, int]]:
    """``(name, lines)`` of every function of ``source`` (methods and nested functions too),
    ``lines`` from the ``def`` line to the last line of its body."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def modules() -> dict[str, str]:
    """Module path under gna_interp/ (``"patching/edges.py"``) -> its source."""
    return {path.relative_to(PACKAGE).as_posix(): path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


def long_functions() -> dict[str, int]:
    """``"<module>::<name>"`` -> lines, for every function over `MAX_FUNCTION_LINES` (the
    longest, where a module has two of that name)."""
    found: dict[str, int] = {}
    for module, source in modules().items():
        for name, lines in function_lengths(source):
            if lines > MAX_FUNCTION_LINES:
                key = f"{module}::{name}"
                found[key] = max(lines, found.get(key, 0))
    return found


def long_modules() -> dict[str, int]:
    """Module -> lines, for every module over `MAX_MODULE_LINES`."""
    counts = {module: len(source.splitlines()) for module, source in modules().items()}
    return {module: lines for module, lines in counts.items() if lines > MAX_MODULE_LINES}


def test_the_measure_counts_from_def_to_the_last_line():
    """The count against functions of known length: one line, three with a docstring, a
    method and a nested function each on their own, and one just over the limit."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = (
        "def one(): return 1\n\n"
        'def three():\n    """Doc."""\n    return 3\n\n'
        "class C:\n    def method(self):\n        def inner():\n            return 0\n        return inner()\n\n"
        f"@decorated\ndef long():\n{body}\n"
    )
    assert function_lengths(source) == [("one", 1), ("three", 3), ("long", MAX_FUNCTION_LINES + 1), ("method", 4), ("inner", 2)]


def test_no_function_is_over_the_limit_but_the_named_ones():
    unexpected = {key: lines for key, lines in long_functions().items() if key not in LONG_FUNCTIONS}
    assert not unexpected, (
        f"functions over {MAX_FUNCTION_LINES} lines (docstring included): {unexpected}; split them "
        "(a check, a per-case function, a small dataclass for the state they pass around), or name one in LONG_FUNCTIONS with its reason"
    )


def test_every_named_long_function_is_still_long():
    found = long_functions()
    stale = [key for key in LONG_FUNCTIONS if key not in found]
    assert not stale, f"LONG_FUNCTIONS names {stale}, no longer over {MAX_FUNCTION_LINES} lines (or gone): remove them from the list"


def test_no_module_is_over_the_limit_but_the_named_ones():
    unexpected = {module: lines for module, lines in long_modules().items() if module not in LONG_MODULES}
    assert not unexpected, (
        f"modules over {MAX_MODULE_LINES} lines: {unexpected}; split one by concept into a sibling module "
        "(and add that to docs/architecture.md), or name it in LONG_MODULES with its reason"
    )


def test_every_named_long_module_is_still_long():
    found = long_modules()
    stale = [module for module in LONG_MODULES if module not in found]
    assert not stale, f"LONG_MODULES names {stale}, no longer over {MAX_MODULE_LINES} lines (or gone): remove them from the list"


def test_every_exception_gives_a_one_line_reason():
    for key, reason in {**LONG_FUNCTIONS, **LONG_MODULES}.items():
        assert isinstance(reason, str) and reason.strip() and "\n" not in reason, key
