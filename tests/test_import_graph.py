"""The package's own imports: no circles, and every import points down a floor.

Read from the source (every ``import``, at module level, inside functions and under
``TYPE_CHECKING`` alike), not from ``sys.modules``: a lazy import inside a function is
still an arrow. A name taken from a lazy package namespace (``from ..viz import X``)
counts as an import of the module the namespace takes ``X`` from. The floors are those of
``docs/architecture.md``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gna_interp"

# Lowest first. A module may import modules of its own floor (without circles) or of a lower one.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("_lazy", "progress", "cost", "network", "core"),
    ("backends", "tasks"),
    ("models",),
    ("patching", "attention"),
    ("scoring",),
    ("discovery",),
    ("viz", "zoo"),
    ("harness", "commands", "demo", "cli", "_smoke", ""),  # "": the top-level namespace
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def lazy_exports(path: Path) -> dict[str, str]:
    """A package's ``_EXPORTS`` table (name -> ``"module"``, ``"module:attr"`` or ``"name:"``)."""
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "_EXPORTS" and node.value is not None:
            return ast.literal_eval(node.value)
    return {}


def import_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` over gna_interp's own modules."""
    known = modules()
    exports = {name: lazy_exports(path) for name, path in known.items() if path.name == "__init__.py"}

    def through_namespace(package: str, name: str) -> str:
        """The module ``package.name`` really comes from."""
        if f"{package}.{name}" in known:
            return f"{package}.{name}"
        where = exports.get(package, {}).get(name)
        if where is None:
            return package
        module = f"{package}.{where.partition(':')[0]}"
        return through_namespace(*module.rsplit(".", 1)) if module not in known else module

    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name.startswith("gna_interp")}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.startswith("gna_interp"):
                    edges |= {through_namespace(target, alias.name) for alias in node.names}
        edges |= {through_namespace(name, export) for export in exports.get(name, {})}  # what the namespace imports on access
        graph[name] = {edge for edge in edges if edge in known and edge != name}
    return graph


def floor_of(module: str) -> int:
    room = module.split(".")[1] if "." in module else ""
    for level, rooms in enumerate(FLOORS):
        if room in rooms:
            return level
    raise AssertionError(f"{module}: its room {room!r} is on no floor of FLOORS (add it there and to docs/architecture.md)")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_reader_sees_lazy_and_function_level_imports():
    graph = import_graph()
    assert "gna_interp.core.heads" in graph["gna_interp.core.arch"]  # module level
    assert "gna_interp.models.jobs" in graph["gna_interp.scoring.evaluation"]  # inside a function
    assert "gna_interp.models.handle" in graph["gna_interp.discovery.picture"]  # under TYPE_CHECKING
    assert "gna_interp.viz.report" in graph["gna_interp"]  # the lazy namespace's write_report
    assert "gna_interp.core.interventions" in graph["gna_interp.core"]  # a lazy subpackage's table
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_every_import_points_down_a_floor():
    graph = import_graph()
    upward = sorted(
        f"{source} (floor {floor_of(source)}) imports {target} (floor {floor_of(target)})"
        for source, targets in graph.items()
        for target in targets
        if floor_of(target) > floor_of(source)
    )
    assert upward == []


@pytest.mark.parametrize("module", sorted(modules()))
def test_every_module_is_on_a_floor(module):
    floor_of(module)
