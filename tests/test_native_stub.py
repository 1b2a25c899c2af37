"""The type stub ``_native.pyi`` declares exactly what the C extension registers.

mypy checks every call into C against the stub, so a stub that drifts from the C code would
let a wrong call pass: each entry point of the built module is declared in the stub and named
in ``_ext.NativeModule`` (what ``_ext.native()`` returns to the type checker), and ``stubtest``
finds the stub's classes and constants as declared.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import stepscope
from stepscope import _ext

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = [pytest.mark.slow, pytest.mark.native]

STUB = Path(stepscope.__file__).with_name("_native.pyi")
EXT = Path(_ext.__file__)
TYPING_ONLY = {
    "_F",
    "_SpanColumnBytes",
    "_SpanTuple",
    "_TracerStats",
    "_SamplerExport",
    "_SignalStats",
    "_AllocStep",
    "_AllocStats",
}
"""Names the stub declares for the type checker alone (aliases, TypedDicts, a TypeVar)."""


def top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def stub_names() -> set[str]:
    return top_level_names(ast.parse(STUB.read_text())) - TYPING_ONLY


def namespace_names() -> set[str]:
    """The attributes of ``_ext.NativeModule`` (the class under ``if TYPE_CHECKING``)."""
    tree = ast.parse(EXT.read_text())
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "NativeModule"]
    return {
        t.id
        for n in cls.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }


def test_the_stub_and_the_typed_namespace_name_the_same_entry_points() -> None:
    assert namespace_names() == stub_names()
    assert set(_ext.REQUIRED) <= stub_names()


def test_the_stub_declares_every_entry_point_of_the_built_module() -> None:
    mod = _ext.native()
    if mod is None:
        pytest.skip(f"the C extension is not in use: {_ext.load_error}")
    registered = {name for name in vars(mod) if not name.startswith("__")}
    assert registered == stub_names()


def test_stubtest_finds_the_stub_true_to_the_module() -> None:
    if _ext.native() is None:
        pytest.skip(f"the C extension is not in use: {_ext.load_error}")
    pytest.importorskip("mypy.stubtest")
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "stepscope._native"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
