"""How the package is layered: no import cycle between its parts; shared services below formats;
no module so long that a reader cannot hold it.

Read from the source (every ``import`` statement, those inside functions included, but not
those under ``if TYPE_CHECKING:``), so the check sees what a lazy import hides at run time.
A part is a subpackage (``stepscope.trace``) or a top-level module (``stepscope.clock``).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

_SPEC = importlib.util.find_spec("stepscope")  # found, not imported: the source is what counts
assert _SPEC is not None and _SPEC.origin is not None
PACKAGE_DIR = Path(_SPEC.origin).parent


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[str]:
    """Absolute names imported anywhere in ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports are not used in stepscope"
            if node.module is not None:
                yield node.module
                yield from (f"{node.module}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str | None:
    """The part of stepscope a module belongs to (None outside stepscope or for the root)."""
    parts = module.split(".")
    if parts[0] != "stepscope" or len(parts) == 1:
        return None
    name = parts[1]
    if (PACKAGE_DIR / name).is_dir() or (PACKAGE_DIR / f"{name}.py").is_file():
        return name
    return None  # an attribute of the root package (``from stepscope import profile``)


def module_imports() -> dict[str, set[str]]:
    """Every stepscope module and the stepscope modules (or names) it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found[_module_name(path)] = {n for n in _imports(tree) if n.startswith("stepscope.")}
    return found


def part_graph() -> dict[str, set[str]]:
    """Which part imports which other part."""
    graph: dict[str, set[str]] = {}
    for module, imported in module_imports().items():
        source = _part(module)
        if source is None:
            continue  # the root package is the public face: it imports every part
        targets = graph.setdefault(source, set())
        targets.update(t for n in imported if (t := _part(n)) is not None and t != source)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_every_part() -> None:
    graph = part_graph()
    assert {"trace", "profiler", "collectors", "metrics", "events", "jsonenc", "clock"} <= set(
        graph
    )
    assert "trace" in graph["profiler"] and "collectors" in graph["profiler"]


def test_no_import_cycle_between_parts() -> None:
    graph = part_graph()
    found = cycles(graph)
    detail = {" <-> ".join(c): {p: sorted(graph[p] & set(c)) for p in c} for c in found}
    assert found == [], f"import cycles between parts of stepscope: {detail}"


def test_metrics_and_events_import_nothing_from_trace() -> None:
    offenders = {
        module: sorted(
            n for n in imported if n == "stepscope.trace" or n.startswith("stepscope.trace.")
        )
        for module, imported in module_imports().items()
        if module.startswith(("stepscope.metrics", "stepscope.events"))
    }
    assert {m: names for m, names in offenders.items() if names} == {}


def test_the_json_encoder_sits_below_every_format() -> None:
    imported = module_imports()["stepscope.jsonenc"]
    assert {_part(n) for n in imported} <= {"text"}


MAX_MODULE_LINES = 800


def test_no_module_is_over_800_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE_DIR)): n
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these modules (over {MAX_MODULE_LINES} lines): {long}"


def test_the_integrations_sit_beside_the_face() -> None:
    """Only the public face (the root package, lazily) may import ``stepscope.integrations``:
    it uses the profiler, the analysis and the renderers, and nothing below uses it."""
    offenders = {
        module: sorted(n for n in imported if _part(n) == "integrations")
        for module, imported in module_imports().items()
        if _part(module) not in ("integrations", None)
    }
    assert {m: names for m, names in offenders.items() if names} == {}
    graph = part_graph()
    assert {"analysis", "profiler", "report"} <= graph["integrations"]
