"""How the package is layered: every module in a part of ``docs/layers.json``, no import that a
"never" rule forbids, no import cycle between folders (the root package and its top-level modules
each a node of their own) nor between parts, no module (Python, or C in
``_csrc``) so long that a reader cannot hold it.

Read from the source: every ``import`` statement counts, those inside functions and those under
``if TYPE_CHECKING:`` included (a renderer typed on an object depends on it), so the check sees
what a lazy import hides at run time.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.implementation_independent

_SPEC = importlib.util.find_spec("stepscope")  # found, not imported: the source is what counts
if _SPEC is None or _SPEC.origin is None:
    raise RuntimeError("stepscope is not importable: install it with `make test`")
PACKAGE_DIR = Path(_SPEC.origin).parent
SOURCE_ROOT = PACKAGE_DIR.parent.parent  # the folder that holds src/
REPO = Path(__file__).resolve().parents[1]
LAYERS_FILE = REPO / "docs" / "layers.json"
DESIGN_LAYERS_FILE = REPO.parent / "shared" / "design" / "layers.json"


def load_layers(path: Path = LAYERS_FILE) -> dict[str, Any]:
    """The parts, arrows and never-rules of a layers file."""
    layers: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return layers


def _imports(tree: ast.AST, module: str) -> Iterator[str]:
    """Absolute names imported anywhere in ``tree`` (``TYPE_CHECKING`` blocks included).

    ``from pkg import name`` yields ``pkg.name``; whether that is a module or an attribute of
    ``pkg`` is decided by :func:`_target_module`.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{module}: relative imports are not used in stepscope")
            if node.module is not None:
                yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_path(module: str) -> Path | None:
    """The source file of a stepscope module, or None when ``module`` names no module; the
    compiled extension's is its stub (``_native.pyi``), so ``from stepscope import _native``
    imports the extension, not the package root."""
    base = PACKAGE_DIR.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py", base.with_suffix(".pyi")):
        if candidate.is_file():
            return candidate
    return None


def _target_module(name: str) -> str:
    """The module an imported name comes from: itself if it is a module, else its parent."""
    while _module_path(name) is None and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def module_imports() -> dict[str, set[str]]:
    """Every stepscope module and the stepscope modules it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found[module] = {
            _target_module(n) for n in _imports(tree, module) if n.split(".")[0] == "stepscope"
        }
    return found


def part_of(path: Path, layers: dict[str, Any]) -> str | None:
    """The part whose ``is`` entry (a file, or a folder ending in /) holds ``path``; the longest
    entry wins."""
    relative = path.relative_to(SOURCE_ROOT).as_posix()
    best: tuple[int, str] | None = None
    for part, spec in layers["parts"].items():
        for entry in spec["is"]:
            hit = relative.startswith(entry) if entry.endswith("/") else relative == entry
            if hit and (best is None or len(entry) > best[0]):
                best = (len(entry), part)
    return None if best is None else best[1]


def module_parts(layers: dict[str, Any]) -> dict[str, str | None]:
    """Every stepscope module and its part."""
    found: dict[str, str | None] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        found[_module_name(path)] = part_of(path, layers)
    return found


def forbidden_imports(layers: dict[str, Any]) -> dict[str, list[str]]:
    """Each module that imports what a never-rule forbids, with the imports and the rule."""
    parts = module_parts(layers)
    never = {(a, b): why for a, b, why in layers["never"]}
    found: dict[str, list[str]] = {}
    for module, imported in module_imports().items():
        source = parts[module]
        for target in sorted(imported):
            rule = never.get((source or "", parts.get(target) or ""))
            if rule is not None:
                found.setdefault(module, []).append(
                    f"{target} ({source} -> {parts[target]}: {rule})"
                )
    return found


ROOT = "__init__"
"""The root package's node in the folder graph (``src/stepscope/__init__.py``, the public face)."""


def folder_graph(imports: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Which folder or top-level module of stepscope (or the root package, ``__init__``)
    imports which other one."""

    def folder(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else ROOT

    graph: dict[str, set[str]] = {}
    for module, imported in (module_imports() if imports is None else imports).items():
        source = folder(module)
        targets = graph.setdefault(source, set())
        targets.update(t for n in imported if (t := folder(n)) != source)
    return graph


def part_graph(
    layers: dict[str, Any], imports: dict[str, set[str]] | None = None
) -> dict[str, set[str]]:
    """Which part of ``layers`` imports which other one (the root package's modules, the
    package ``__init__`` included, in the parts that name them)."""
    parts = module_parts(layers)
    graph: dict[str, set[str]] = {}
    for module, imported in (module_imports() if imports is None else imports).items():
        source = parts.get(module)
        if source is None:
            continue
        targets = graph.setdefault(source, set())
        targets.update(t for n in imported if (t := parts.get(n)) is not None and t != source)
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


def test_imports_under_type_checking_are_seen() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from stepscope.profiler.summary import KeyAverages\n"
        "def f():\n"
        "    import stepscope.clock\n"
    )
    assert set(_imports(tree, "m")) >= {"stepscope.profiler.summary.KeyAverages", "stepscope.clock"}
    assert _target_module("stepscope.profiler.summary.KeyAverages") == "stepscope.profiler.summary"
    assert _target_module("stepscope.clock") == "stepscope.clock"
    assert _target_module("stepscope.__version__") == "stepscope"


def test_every_module_belongs_to_a_part() -> None:
    layers = load_layers()
    orphans = sorted(m for m, part in module_parts(layers).items() if part is None)
    assert orphans == [], f"name the part of these modules in docs/layers.json: {orphans}"


def test_no_import_breaks_a_never_rule() -> None:
    found = forbidden_imports(load_layers())
    assert found == {}, f"imports that docs/layers.json forbids: {json.dumps(found, indent=1)}"


def test_a_forbidden_import_is_found() -> None:
    layers = load_layers()
    # a copy of the rules in which the face may not import the trace: the face does
    layers["never"] = [*layers["never"], ["Face", "Trace", "test rule"]]
    assert any("test rule" in hit for hits in forbidden_imports(layers).values() for hit in hits)


@pytest.mark.skipif(not DESIGN_LAYERS_FILE.is_file(), reason="the team's design folder is absent")
def test_the_repository_keeps_every_rule_of_the_design() -> None:
    design, ours = load_layers(DESIGN_LAYERS_FILE), load_layers()
    assert {tuple(r[:2]) for r in design["never"]} <= {tuple(r[:2]) for r in ours["never"]}
    for part, spec in design["parts"].items():
        # a module the design places that the package has since deleted needs no place
        existing = {path for path in spec["is"] if (REPO / path).exists()}
        assert existing <= set(ours["parts"][part]["is"]), part


def test_every_import_between_parts_is_an_arrow_of_the_layers_file() -> None:
    """The layers file draws every edge the code has (a new one is drawn, or the import goes)."""
    layers = load_layers()
    arrows = {(a[0], a[1]) for a in layers["arrows"]}
    drawn = {(p, t) for p, ts in part_graph(layers).items() for t in ts if p != t}
    assert drawn - arrows == set()


def test_the_graph_sees_every_folder() -> None:
    graph = folder_graph()
    assert {"trace", "profiler", "collectors", "metrics", "events", "jsonenc", "clock"} <= set(
        graph
    )
    assert "trace" in graph["profiler"] and "collectors" in graph["profiler"]


def test_the_graphs_see_the_root_package() -> None:
    graph = folder_graph()
    # the package root imports the notebook (load_report), and the extension is not the root
    assert "integrations" in graph[ROOT] and ROOT not in graph["_ext"]
    assert {"_ext", "clock"} <= graph["step_times"]
    parts = part_graph(load_layers())
    assert "Integrations" in parts["Face"] and "Face" not in parts["Base"]


def test_a_part_cycle_through_the_root_is_found() -> None:
    layers = load_layers()
    imports = module_imports()
    # the arrow of old: the notebook reading traces through the report command
    imports["stepscope.integrations.notebook"] = {"stepscope.commands.report"}
    assert ["Face", "Integrations"] in cycles(part_graph(layers, imports))
    assert any({"commands", "integrations"} <= set(c) for c in cycles(folder_graph(imports)))


def _cycle_detail(graph: dict[str, set[str]], found: list[list[str]]) -> dict[str, Any]:
    return {" <-> ".join(c): {p: sorted(graph[p] & set(c)) for p in c} for c in found}


def test_no_import_cycle_between_folders() -> None:
    graph = folder_graph()
    found = cycles(graph)
    assert found == [], f"import cycles between folders of stepscope: {_cycle_detail(graph, found)}"


def test_no_import_cycle_between_parts() -> None:
    graph = part_graph(load_layers())
    found = cycles(graph)
    detail = _cycle_detail(graph, found)
    assert found == [], f"import cycles between the parts of docs/layers.json: {detail}"


def test_the_json_encoder_sits_below_every_format() -> None:
    imported = module_imports()["stepscope.jsonenc"]
    assert {m.split(".")[1] for m in imported} <= {"text"}


MAX_MODULE_LINES = 800


def test_no_module_is_over_800_lines() -> None:
    """Python modules and the C extension's sources (``_csrc/*.c``, ``*.h``) alike."""
    sources = sorted([*PACKAGE_DIR.rglob("*.py"), *(PACKAGE_DIR / "_csrc").glob("*.[ch]")])
    assert any(path.suffix == ".c" for path in sources), "no C sources in _csrc beside the package"
    long = {
        str(path.relative_to(PACKAGE_DIR)): n
        for path in sources
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these modules (over {MAX_MODULE_LINES} lines): {long}"
